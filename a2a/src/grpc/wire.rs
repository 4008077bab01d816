//! The gRPC binding's messages (`a2a.proto`, `lf.a2a.v1`) to and from the
//! ProtoJSON the JSON-RPC and REST bindings read and write (spec §5.5:
//! camelCase names, enums by name, `Timestamp` as RFC 3339, `Value` as JSON),
//! so that one reading serves the three bindings.

use agent_reach_proto::a2a as pb;
use prost_types::value::Kind;
use serde_json::{json, Map, Value};

use agent_reach_tasks::{parse_rfc3339, rfc3339};

// === To ProtoJSON (requests) ===

/// A protobuf `Value` as JSON (a whole number as an integer, as it was sent in JSON).
pub(crate) fn json_of(value: &prost_types::Value) -> Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(flag)) => Value::Bool(*flag),
        Some(Kind::NumberValue(number)) => {
            if number.fract() == 0.0 && number.abs() < 9_007_199_254_740_992.0 {
                json!(*number as i64)
            } else {
                serde_json::Number::from_f64(*number).map_or(Value::Null, Value::Number)
            }
        }
        Some(Kind::StringValue(text)) => Value::String(text.clone()),
        Some(Kind::StructValue(object)) => object_of(object),
        Some(Kind::ListValue(list)) => Value::Array(list.values.iter().map(json_of).collect()),
    }
}

fn object_of(object: &prost_types::Struct) -> Value {
    Value::Object(
        object
            .fields
            .iter()
            .map(|(key, value)| (key.clone(), json_of(value)))
            .collect(),
    )
}

/// `fields` without the proto3 defaults (empty strings, `None`), as ProtoJSON leaves them out.
fn present(fields: Vec<(&str, Option<Value>)>) -> Value {
    Value::Object(
        fields
            .into_iter()
            .filter_map(|(name, value)| match value {
                None | Some(Value::Null) => None,
                Some(Value::String(text)) if text.is_empty() => None,
                Some(Value::Array(items)) if items.is_empty() => None,
                Some(value) => Some((name.to_string(), value)),
            })
            .collect(),
    )
}

fn text(text: &str) -> Option<Value> {
    Some(Value::String(text.to_string()))
}

fn part_json(part: &pb::Part) -> Value {
    use pb::part::Content;
    let mut value = present(vec![
        ("metadata", part.metadata.as_ref().map(object_of)),
        ("filename", text(&part.filename)),
        ("mediaType", text(&part.media_type)),
    ]);
    let (name, content) = match &part.content {
        Some(Content::Text(text)) => ("text", Value::String(text.clone())),
        Some(Content::Raw(bytes)) => {
            use base64::Engine as _;
            (
                "raw",
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
            )
        }
        Some(Content::Url(url)) => ("url", Value::String(url.clone())),
        Some(Content::Data(data)) => ("data", json_of(data)),
        None => return value,
    };
    value[name] = content;
    value
}

/// An enum's ProtoJSON name, or its number when this build does not know it.
fn enum_name(name: Option<&str>, number: i32) -> Value {
    name.map_or_else(|| json!(number), |name| json!(name))
}

pub(crate) fn message_json(message: &pb::Message) -> Value {
    let role = pb::Role::try_from(message.role).ok().map(|role| role.as_str_name());
    let mut value = present(vec![
        ("messageId", text(&message.message_id)),
        ("contextId", text(&message.context_id)),
        ("taskId", text(&message.task_id)),
        ("metadata", message.metadata.as_ref().map(object_of)),
        ("extensions", Some(json!(message.extensions))),
        ("referenceTaskIds", Some(json!(message.reference_task_ids))),
    ]);
    // ROLE_UNSPECIFIED is absent (the reading says what is missing).
    if message.role != 0 {
        value["role"] = enum_name(role, message.role);
    }
    value["parts"] = Value::Array(message.parts.iter().map(part_json).collect());
    value
}

pub(crate) fn push_config_json(config: &pb::TaskPushNotificationConfig) -> Value {
    present(vec![
        ("id", text(&config.id)),
        ("taskId", text(&config.task_id)),
        ("url", text(&config.url)),
        ("token", text(&config.token)),
        (
            "authentication",
            config.authentication.as_ref().map(|authentication| {
                present(vec![
                    ("scheme", text(&authentication.scheme)),
                    ("credentials", text(&authentication.credentials)),
                ])
            }),
        ),
    ])
}

pub(crate) fn send_json(request: &pb::SendMessageRequest) -> Value {
    let configuration = request.configuration.as_ref().map(|configuration| {
        let mut value = present(vec![
            ("acceptedOutputModes", Some(json!(configuration.accepted_output_modes))),
            (
                "taskPushNotificationConfig",
                configuration
                    .task_push_notification_config
                    .as_ref()
                    .map(push_config_json),
            ),
            (
                "historyLength",
                configuration.history_length.map(|length| json!(length)),
            ),
        ]);
        if configuration.return_immediately {
            value["returnImmediately"] = json!(true);
        }
        value
    });
    present(vec![
        ("message", request.message.as_ref().map(message_json)),
        ("configuration", configuration),
        ("metadata", request.metadata.as_ref().map(object_of)),
    ])
}

pub(crate) fn get_task_json(request: &pb::GetTaskRequest) -> Value {
    present(vec![
        ("id", text(&request.id)),
        ("historyLength", request.history_length.map(|length| json!(length))),
    ])
}

pub(crate) fn list_tasks_json(request: &pb::ListTasksRequest) -> Value {
    let status = (request.status != 0).then(|| {
        enum_name(
            pb::TaskState::try_from(request.status)
                .ok()
                .map(|state| state.as_str_name()),
            request.status,
        )
    });
    let after = request.status_timestamp_after.as_ref().map(|at| {
        let ms = at.seconds.saturating_mul(1000) + i64::from(at.nanos / 1_000_000);
        json!(rfc3339(u64::try_from(ms).unwrap_or(0)))
    });
    present(vec![
        ("contextId", text(&request.context_id)),
        ("status", status),
        ("pageSize", request.page_size.map(|size| json!(size))),
        ("pageToken", text(&request.page_token)),
        ("historyLength", request.history_length.map(|length| json!(length))),
        ("statusTimestampAfter", after),
        (
            "includeArtifacts",
            request.include_artifacts.map(|include| json!(include)),
        ),
    ])
}

pub(crate) fn id_json(id: &str) -> Value {
    present(vec![("id", text(id))])
}

pub(crate) fn config_named_json(task_id: &str, id: &str) -> Value {
    present(vec![("taskId", text(task_id)), ("id", text(id))])
}

pub(crate) fn list_configs_json(request: &pb::ListTaskPushNotificationConfigsRequest) -> Value {
    present(vec![
        ("taskId", text(&request.task_id)),
        ("pageSize", (request.page_size != 0).then(|| json!(request.page_size))),
        ("pageToken", text(&request.page_token)),
    ])
}

// === From ProtoJSON (answers) ===

/// JSON as a protobuf `Value`.
pub(crate) fn value_of(value: &Value) -> prost_types::Value {
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(flag) => Kind::BoolValue(*flag),
        Value::Number(number) => Kind::NumberValue(number.as_f64().unwrap_or(0.0)),
        Value::String(text) => Kind::StringValue(text.clone()),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(value_of).collect(),
        }),
        Value::Object(object) => Kind::StructValue(struct_of(object)),
    };
    prost_types::Value { kind: Some(kind) }
}

pub(crate) fn struct_of(object: &Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: object
            .iter()
            .map(|(key, value)| (key.clone(), value_of(value)))
            .collect(),
    }
}

fn string(value: &Value, name: &str) -> String {
    value.get(name).and_then(Value::as_str).unwrap_or_default().to_string()
}

fn strings(value: &Value, name: &str) -> Vec<String> {
    value
        .get(name)
        .and_then(Value::as_array)
        .map(|items| items.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

fn metadata(value: &Value, name: &str) -> Option<prost_types::Struct> {
    value.get(name).and_then(Value::as_object).map(struct_of)
}

fn timestamp(value: &Value) -> Option<prost_types::Timestamp> {
    let ms = value.as_str().and_then(parse_rfc3339)?;
    Some(prost_types::Timestamp {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from(ms % 1000 * 1_000_000).unwrap_or(0),
    })
}

fn part(value: &Value) -> pb::Part {
    use pb::part::Content;
    let content = if let Some(text) = value.get("text").and_then(Value::as_str) {
        Some(Content::Text(text.to_string()))
    } else if let Some(data) = value.get("data") {
        Some(Content::Data(value_of(data)))
    } else if let Some(url) = value.get("url").and_then(Value::as_str) {
        Some(Content::Url(url.to_string()))
    } else {
        value.get("raw").and_then(Value::as_str).map(|raw| {
            use base64::Engine as _;
            Content::Raw(
                base64::engine::general_purpose::STANDARD
                    .decode(raw)
                    .unwrap_or_default(),
            )
        })
    };
    pb::Part {
        content,
        metadata: metadata(value, "metadata"),
        filename: string(value, "filename"),
        media_type: string(value, "mediaType"),
    }
}

fn parts(value: &Value) -> Vec<pb::Part> {
    value
        .get("parts")
        .and_then(Value::as_array)
        .map(|parts| parts.iter().map(part).collect())
        .unwrap_or_default()
}

fn role(value: &Value) -> i32 {
    match value.get("role") {
        Some(Value::String(name)) => pb::Role::from_str_name(name).map_or(0, |role| role as i32),
        Some(number) => number.as_i64().and_then(|n| i32::try_from(n).ok()).unwrap_or(0),
        None => 0,
    }
}

pub(crate) fn message(value: &Value) -> pb::Message {
    pb::Message {
        message_id: string(value, "messageId"),
        context_id: string(value, "contextId"),
        task_id: string(value, "taskId"),
        role: role(value),
        parts: parts(value),
        metadata: metadata(value, "metadata"),
        extensions: strings(value, "extensions"),
        reference_task_ids: strings(value, "referenceTaskIds"),
    }
}

fn status(value: &Value) -> pb::TaskStatus {
    let state = value
        .get("state")
        .and_then(Value::as_str)
        .and_then(pb::TaskState::from_str_name)
        .map_or(0, |state| state as i32);
    pb::TaskStatus {
        state,
        message: value.get("message").filter(|message| message.is_object()).map(message),
        timestamp: value.get("timestamp").and_then(timestamp),
    }
}

fn artifact(value: &Value) -> pb::Artifact {
    pb::Artifact {
        artifact_id: string(value, "artifactId"),
        name: string(value, "name"),
        description: string(value, "description"),
        parts: parts(value),
        metadata: metadata(value, "metadata"),
        extensions: strings(value, "extensions"),
    }
}

pub(crate) fn task(value: &Value) -> pb::Task {
    let list = |name: &str| value.get(name).and_then(Value::as_array).cloned().unwrap_or_default();
    pb::Task {
        id: string(value, "id"),
        context_id: string(value, "contextId"),
        status: value.get("status").map(status),
        artifacts: list("artifacts").iter().map(artifact).collect(),
        history: list("history").iter().map(message).collect(),
        metadata: metadata(value, "metadata"),
    }
}

/// A `SendMessage` result: `{"task": …}` or `{"message": …}`.
pub(crate) fn send_response(value: &Value) -> pb::SendMessageResponse {
    use pb::send_message_response::Payload;
    let payload = if let Some(task_value) = value.get("task") {
        Some(Payload::Task(task(task_value)))
    } else {
        value.get("message").map(|value| Payload::Message(message(value)))
    };
    pb::SendMessageResponse { payload }
}

/// One event of a stream (a bare `StreamResponse`).
pub(crate) fn stream_response(value: &Value) -> pb::StreamResponse {
    use pb::stream_response::Payload;
    let payload = if let Some(value) = value.get("task") {
        Some(Payload::Task(task(value)))
    } else if let Some(value) = value.get("message") {
        Some(Payload::Message(message(value)))
    } else if let Some(update) = value.get("statusUpdate") {
        Some(Payload::StatusUpdate(pb::TaskStatusUpdateEvent {
            task_id: string(update, "taskId"),
            context_id: string(update, "contextId"),
            status: update.get("status").map(status),
            metadata: metadata(update, "metadata"),
        }))
    } else {
        value.get("artifactUpdate").map(|update| {
            Payload::ArtifactUpdate(pb::TaskArtifactUpdateEvent {
                task_id: string(update, "taskId"),
                context_id: string(update, "contextId"),
                artifact: update.get("artifact").map(artifact),
                append: update.get("append").and_then(Value::as_bool).unwrap_or(false),
                last_chunk: update.get("lastChunk").and_then(Value::as_bool).unwrap_or(false),
                metadata: metadata(update, "metadata"),
            })
        })
    };
    pb::StreamResponse { payload }
}

pub(crate) fn list_tasks_response(value: &Value) -> pb::ListTasksResponse {
    let number = |name: &str| {
        value
            .get(name)
            .and_then(Value::as_i64)
            .and_then(|n| i32::try_from(n).ok())
            .unwrap_or(0)
    };
    pb::ListTasksResponse {
        tasks: value
            .get("tasks")
            .and_then(Value::as_array)
            .map(|tasks| tasks.iter().map(task).collect())
            .unwrap_or_default(),
        next_page_token: string(value, "nextPageToken"),
        page_size: number("pageSize"),
        total_size: number("totalSize"),
    }
}

pub(crate) fn push_config(value: &Value) -> pb::TaskPushNotificationConfig {
    pb::TaskPushNotificationConfig {
        tenant: String::new(),
        id: string(value, "id"),
        task_id: string(value, "taskId"),
        url: string(value, "url"),
        token: string(value, "token"),
        authentication: value
            .get("authentication")
            .filter(|authentication| authentication.is_object())
            .map(|authentication| pb::AuthenticationInfo {
                scheme: string(authentication, "scheme"),
                credentials: String::new(),
            }),
    }
}

pub(crate) fn list_configs_response(value: &Value) -> pb::ListTaskPushNotificationConfigsResponse {
    pb::ListTaskPushNotificationConfigsResponse {
        configs: value
            .get("configs")
            .and_then(Value::as_array)
            .map(|configs| configs.iter().map(push_config).collect())
            .unwrap_or_default(),
        next_page_token: string(value, "nextPageToken"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_through_json() {
        let original = json!({"a": [1, 2.5, "x", null, true], "b": {"c": -3}, "big": 12345678901234i64});
        assert_eq!(json_of(&value_of(&original)), original);
    }

    #[test]
    fn a_task_round_trips_through_its_protojson() {
        let value = json!({
            "id": "t_1", "contextId": "c",
            "status": { "state": "TASK_STATE_INPUT_REQUIRED", "timestamp": "2026-12-01T21:43:21.123Z",
                "message": { "messageId": "q", "role": "ROLE_AGENT", "parts": [{ "text": "Which size?" }],
                    "taskId": "t_1", "contextId": "c" } },
            "artifacts": [{ "artifactId": "t_1-output", "parts": [{ "data": { "ok": true } }] }],
            "history": [{ "messageId": "m", "role": "ROLE_USER", "parts": [{ "data": { "n": 1 } }],
                "taskId": "t_1", "contextId": "c" }],
            "metadata": { "capability": "x.y" },
        });
        let task = task(&value);
        assert_eq!(
            task.status.as_ref().map(|status| status.state),
            Some(pb::TaskState::InputRequired as i32)
        );
        assert_eq!(
            task.status
                .as_ref()
                .and_then(|status| status.timestamp)
                .map(|at| at.nanos),
            Some(123_000_000)
        );
        assert_eq!(message_json(&task.history[0]), value["history"][0]);
        assert_eq!(
            message_json(task.status.as_ref().and_then(|status| status.message.as_ref()).unwrap()),
            value["status"]["message"]
        );
    }

    #[test]
    fn requests_read_as_their_protojson() {
        let request = pb::ListTasksRequest {
            status: pb::TaskState::Working as i32,
            page_size: Some(5),
            status_timestamp_after: Some(prost_types::Timestamp {
                seconds: 1_796_161_401,
                nanos: 0,
            }),
            ..Default::default()
        };
        assert_eq!(
            list_tasks_json(&request),
            json!({"status": "TASK_STATE_WORKING", "pageSize": 5, "statusTimestampAfter": "2026-12-01T21:43:21.000Z"})
        );
        let config = pb::TaskPushNotificationConfig {
            task_id: "t_1".into(),
            url: "https://x/hook".into(),
            authentication: Some(pb::AuthenticationInfo {
                scheme: "Bearer".into(),
                credentials: "secret".into(),
            }),
            ..Default::default()
        };
        assert_eq!(
            push_config_json(&config),
            json!({"taskId": "t_1", "url": "https://x/hook", "authentication": {"scheme": "Bearer", "credentials": "secret"}})
        );
    }
}
