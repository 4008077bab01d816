//! MCP tasks, backed by the router's durable tasks (`--redis`): a tool call
//! that becomes a task is the slow path's task (`agent_reach_tasks`), so its
//! id is the same through MCP, A2A (`GetTask` at `/a2a/{capability}`) and
//! `/v1/tasks/{id}`, and its state, the agent's question and its result
//! reach whichever protocol asks.
//!
//! Two flavours, by revision:
//! - 2026-07-28, the Tasks extension (`io.modelcontextprotocol/tasks`,
//!   advertised in `server/discover`): the server decides; a `tools/call`
//!   from a client that declares the extension becomes a task when its
//!   deadline is more than [`LONG_CALL`] away (the capability's `timeout_ms`,
//!   else the router's default), answered `resultType: "task"`; then
//!   `tasks/get` (the result inlined once completed; a tool error is a
//!   completed task with `isError`, as the call would have answered),
//!   `tasks/update` (an `inputResponses` entry `accept`ed continues a task
//!   that asked for input, its `content` the next message; `decline` or
//!   `cancel` cancels it) and `tasks/cancel`. A client that did not declare
//!   the extension gets `-32021` for these.
//! - 2025-11-25, the tasks utility (capability `tasks`, tools listed with
//!   `execution.taskSupport: "optional"`): a `tools/call` with `params.task`
//!   becomes a task; `tasks/get`, `tasks/result` (waits until the task ends),
//!   `tasks/list` (the caller's tasks) and `tasks/cancel`.
//!
//! An unknown task, or one of another caller, is `-32602` (the spec's).

use std::time::Duration;

use agent_reach_task_store::{State, Task};
use agent_reach_tasks::{rfc3339, Owned};

use super::*;

/// The Tasks extension's identifier (2026-07-28).
pub(crate) const EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// MissingRequiredClientCapability (2026-07-28).
const MISSING_CAPABILITY: i64 = -32021;

/// A tool call whose deadline is further away than this becomes a task for
/// a client that takes tasks (2026-07-28): it may outlast an HTTP exchange.
pub(crate) const LONG_CALL: Duration = Duration::from_secs(10);

/// How often a client is asked to poll a task.
const POLL_INTERVAL_MS: u64 = 1000;

/// The longest `tasks/result` waits for a task to end (2025-11-25).
const RESULT_WAIT: Duration = Duration::from_secs(300);

/// How many tasks a `tasks/list` page holds.
const LIST_PAGE: usize = 50;

/// Which tasks a request speaks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// 2025-11-25's tasks utility.
    Utility,
    /// 2026-07-28's Tasks extension.
    Extension,
}

impl Flavor {
    /// The flavour of `era`, when it has tasks.
    pub(crate) fn of(era: Era) -> Option<Self> {
        match era {
            Era::Modern => Some(Self::Extension),
            Era::Legacy("2025-11-25") => Some(Self::Utility),
            Era::Legacy(_) => None,
        }
    }
}

/// Whether a 2026-07-28 request's client declares the Tasks extension.
fn declares_extension(params: &Value) -> bool {
    params
        .pointer("/_meta/io.modelcontextprotocol~1clientCapabilities/extensions")
        .and_then(|extensions| extensions.get(EXTENSION))
        .is_some()
}

type Answered = Result<Value, (i64, String)>;

fn invalid(message: impl Into<String>) -> (i64, String) {
    (INVALID_PARAMS, message.into())
}

impl Request<'_> {
    /// A `tools/call` as a task, when it becomes one (see the module notes):
    /// `Some` of the answer (a `CreateTaskResult`, or the tool error or
    /// JSON-RPC error a refusal is), `None` to answer it as a plain call.
    pub(crate) async fn call_as_task(&self, params: &Value) -> Option<Answered> {
        let flavor = Flavor::of(self.era)?;
        if !self.api.tasks_enabled() {
            return None;
        }
        let service = self.api.service();
        let wanted = match flavor {
            Flavor::Utility => params.get("task").is_some_and(Value::is_object),
            Flavor::Extension => {
                let name = params.get("name").and_then(Value::as_str).unwrap_or_default();
                let deadline = service
                    .offered(name)
                    .map(|offered| offered.timeout.unwrap_or(service.tuning().default_timeout));
                declares_extension(params) && deadline.is_some_and(|deadline| deadline > LONG_CALL)
            }
        };
        if !wanted {
            return None;
        }
        Some(self.create_task(params, flavor).await)
    }

    async fn create_task(&self, params: &Value, flavor: Flavor) -> Answered {
        let prepared = match prepare_call(self.api.service(), self.caller, params)? {
            Ok(prepared) => prepared,
            Err(tool_error) => return Ok(tool_error),
        };
        let request = &prepared.checked.request;
        // The payload is checked now, as a plain call's would be: a mismatch is the caller's answer.
        if let Err(error) = self.api.service().check_payload(&request.capability, &request.payload) {
            return Ok(tool_error(&error, prepared.structured_errors));
        }
        let task_id = match self.api.submit_call(self.caller, &prepared.checked, None).await {
            Ok(task_id) => task_id,
            Err(error) => return Ok(tool_error(&error, prepared.structured_errors)),
        };
        // Created durably before the answer (the extension's MUST): a `tasks/get` finds it.
        let fields = match self.api.owned(self.caller, &task_id).await {
            Ok(Owned::Stored(task)) => self.task_fields(&task, flavor),
            _ => {
                let now = json!(rfc3339(clock::epoch_ms()));
                let mut fields = Map::new();
                fields.insert("taskId".into(), json!(task_id));
                fields.insert("status".into(), json!("working"));
                fields.insert("createdAt".into(), now.clone());
                fields.insert("lastUpdatedAt".into(), now);
                fields
            }
        };
        Ok(match flavor {
            Flavor::Utility => json!({ "task": fields }),
            Flavor::Extension => {
                let mut result = Value::Object(fields);
                result["resultType"] = json!("task");
                result
            }
        })
    }

    /// `tasks/get`, `tasks/update`, `tasks/cancel` (2026-07-28) and
    /// `tasks/get`, `tasks/result`, `tasks/list`, `tasks/cancel` (2025-11-25);
    /// `None` for a method that is not one of this revision's.
    pub(crate) async fn on_task_method(&self, method: &str, params: &Value) -> Option<Answered> {
        let flavor = Flavor::of(self.era)?;
        let known = match flavor {
            Flavor::Extension => matches!(method, "tasks/get" | "tasks/update" | "tasks/cancel"),
            Flavor::Utility => matches!(method, "tasks/get" | "tasks/result" | "tasks/list" | "tasks/cancel"),
        };
        if !known {
            return None;
        }
        if flavor == Flavor::Extension && !declares_extension(params) {
            return Some(Err((
                MISSING_CAPABILITY,
                format!("`{method}` needs the client capability extensions[\"{EXTENSION}\"] in `_meta`"),
            )));
        }
        Some(match method {
            "tasks/list" => self.list(params).await,
            "tasks/get" => self.get(params, flavor).await,
            "tasks/result" => self.result(params).await,
            "tasks/update" => self.update(params).await,
            _ => self.cancel(params, flavor).await,
        })
    }

    /// The caller's task `params.taskId`; any other is `-32602`.
    async fn task(&self, params: &Value) -> Result<Task, (i64, String)> {
        let Some(task_id) = params.get("taskId").and_then(Value::as_str).filter(|id| !id.is_empty()) else {
            return Err(invalid("`taskId` (a task's id) is required"));
        };
        match self.api.owned(self.caller, task_id).await {
            Ok(Owned::Stored(task)) => Ok(*task),
            Ok(Owned::Buffered(_)) => Err((
                INTERNAL_ERROR,
                format!(
                    "task `{task_id}` waits in the router's local buffer while Redis is unreachable; retry shortly"
                ),
            )),
            Err(error) => Err(invalid(format!("Failed to retrieve task: {}", error.message))),
        }
    }

    /// A task's fields in the request's flavour.
    fn task_fields(&self, task: &Task, flavor: Flavor) -> Map<String, Value> {
        let status = match (task.state, flavor) {
            (State::Pending | State::Running | State::Retrying, _) => "working",
            (State::InputRequired, _) => "input_required",
            (State::Succeeded, _) => "completed",
            // A tool error is the result of a call that completed (the extension's rule).
            (State::Failed, Flavor::Extension) => "completed",
            (State::Failed, Flavor::Utility) => "failed",
            (State::Canceled, _) => "cancelled",
        };
        let ttl = self
            .api
            .retention()
            .map(|retention| json!(u64::try_from(retention.as_millis()).unwrap_or(u64::MAX)));
        let (ttl_name, poll_name) = match flavor {
            Flavor::Utility => ("ttl", "pollInterval"),
            Flavor::Extension => ("ttlMs", "pollIntervalMs"),
        };
        let mut fields = Map::new();
        fields.insert("taskId".into(), json!(task.task_id));
        fields.insert("status".into(), json!(status));
        fields.insert("createdAt".into(), json!(rfc3339(task.created_at_ms)));
        fields.insert("lastUpdatedAt".into(), json!(rfc3339(task.updated_at_ms)));
        fields.insert(ttl_name.into(), ttl.unwrap_or(Value::Null));
        if !task.state.is_terminal() {
            fields.insert(poll_name.into(), json!(POLL_INTERVAL_MS));
        }
        let message = match task.state {
            State::Pending => Some("queued for an instance".to_string()),
            State::Running => Some(format!("running (attempt {})", task.attempts.max(1))),
            State::Retrying => Some(format!("retrying after attempt {}", task.attempts)),
            State::InputRequired => task.question().and_then(|question| question.message.clone()),
            State::Failed | State::Canceled => task
                .result
                .as_ref()
                .and_then(|result| result.pointer("/error/message"))
                .and_then(Value::as_str)
                .map(str::to_string),
            State::Succeeded => None,
        };
        if let Some(message) = message {
            fields.insert("statusMessage".into(), json!(message));
        }
        fields
    }

    /// What the tool call would have answered: the output as a tool result,
    /// or the failure as a tool error; `None` while the task has not ended
    /// that way (canceled tasks have no result).
    fn call_result(&self, task: &Task) -> Option<Value> {
        let result = task.result.as_ref()?;
        let offered = self.api.service().offered(&task.capability);
        let schema = |text: Option<&str>| schema_value(text.unwrap_or_default());
        let output_schema = schema(offered.as_ref().map(|offered| offered.described.output_schema.as_str()));
        match task.state {
            State::Succeeded => {
                let wraps_output = output_schema != Value::Bool(true) && !is_object_schema(&output_schema);
                let text = |name: &str| result.get(name).and_then(Value::as_str).unwrap_or_default();
                let meta = (text("agent_id"), text("capability_version"), task.attempts);
                let output = result.get("output").cloned().unwrap_or(Value::Null);
                Some(tool_result(output, wraps_output, &task.request_id, meta))
            }
            State::Failed => {
                let error = result.get("error").cloned().unwrap_or(Value::Null);
                let code = error.get("code").and_then(Value::as_str).unwrap_or("AGENT_ERROR");
                let message = error.get("message").and_then(Value::as_str).unwrap_or_default();
                let failure = RouterError::new(
                    agent_reach_proto::RouterCode::parse(code).unwrap_or(agent_reach_pipeline::error::Code::AgentError),
                    message,
                );
                let mut answered = tool_error(&failure, output_schema == Value::Bool(true));
                // The stored envelope as it was (its details and retryability).
                answered["_meta"]["agent-reach/error"] = error;
                Some(answered)
            }
            _ => None,
        }
    }

    async fn get(&self, params: &Value, flavor: Flavor) -> Answered {
        let task = self.task(params).await?;
        let mut fields = self.task_fields(&task, flavor);
        if flavor == Flavor::Extension {
            if let Some(result) = self.call_result(&task) {
                fields.insert("result".into(), result);
            }
            if let Some(question) = task.question() {
                let requested = self
                    .api
                    .service()
                    .offered(&task.capability)
                    .map(|offered| tool_input_schema(&offered.described.input_schema))
                    .unwrap_or_else(|| json!({ "type": "object" }));
                fields.insert(
                    "inputRequests".into(),
                    json!({ question.message_id.clone(): {
                        "method": "elicitation/create",
                        "params": { "mode": "form", "message": question.message, "requestedSchema": requested },
                    }}),
                );
            }
        }
        Ok(Value::Object(fields))
    }

    /// `tasks/result` (2025-11-25): once the task ended, what the call would
    /// have answered, related to its task.
    async fn result(&self, params: &Value) -> Answered {
        let mut task = self.task(params).await?;
        let until = tokio::time::Instant::now() + RESULT_WAIT;
        while !task.state.is_settled() && tokio::time::Instant::now() < until {
            tokio::time::sleep(agent_reach_tasks::POLL).await;
            task = self.task(params).await?;
        }
        let mut answered =
            match (task.state, self.call_result(&task)) {
                (_, Some(answered)) => answered,
                (State::InputRequired, _) => {
                    return Err(invalid(format!(
                    "task `{}` waits for input (\"{}\"): answer it with tasks/update under MCP 2026-07-28, or with A2A",
                    task.task_id,
                    task.question().and_then(|question| question.message.clone()).unwrap_or_default()
                )))
                }
                (State::Canceled, _) => {
                    return Err(invalid(format!(
                        "task `{}` was cancelled: it has no result",
                        task.task_id
                    )))
                }
                _ => {
                    return Err((
                        INTERNAL_ERROR,
                        format!("task `{}` has not ended yet; poll tasks/get", task.task_id),
                    ))
                }
            };
        answered["_meta"]["io.modelcontextprotocol/related-task"] = json!({ "taskId": task.task_id });
        Ok(answered)
    }

    /// `tasks/list` (2025-11-25): the caller's tasks, newest first, paged by `cursor`.
    async fn list(&self, params: &Value) -> Answered {
        let offset = match params.get("cursor") {
            None | Some(Value::Null) => 0,
            Some(cursor) => cursor
                .as_str()
                .and_then(|cursor| cursor.parse::<usize>().ok())
                .ok_or_else(|| invalid(format!("`cursor` {cursor} is not one this server handed out")))?,
        };
        let tasks = self
            .api
            .list(self.caller)
            .await
            .map_err(|error| (INTERNAL_ERROR, error.message))?;
        let page: Vec<Value> = tasks
            .iter()
            .skip(offset)
            .take(LIST_PAGE)
            .map(|task| Value::Object(self.task_fields(task, Flavor::Utility)))
            .collect();
        let mut listed = json!({ "tasks": page });
        if offset + LIST_PAGE < tasks.len() {
            listed["nextCursor"] = json!((offset + LIST_PAGE).to_string());
        }
        Ok(listed)
    }

    /// `tasks/update` (2026-07-28): an answer to the task's question continues it.
    async fn update(&self, params: &Value) -> Answered {
        let task = self.task(params).await?;
        let Some(responses) = params.get("inputResponses").and_then(Value::as_object) else {
            return Err(invalid(
                "`inputResponses` (an object keyed by inputRequests keys) is required",
            ));
        };
        // Only the outstanding request's key counts; any other is ignored (the spec's rule).
        let Some((key, response)) = task
            .question()
            .and_then(|question| responses.get_key_value(&question.message_id))
        else {
            return Ok(json!({}));
        };
        match response.get("action").and_then(Value::as_str) {
            Some("accept") => {}
            Some("decline" | "cancel") => {
                // Cancelled meanwhile or ended: acknowledged all the same.
                let _ = self.api.cancel(&task).await;
                return Ok(json!({}));
            }
            _ => {
                return Err(invalid(
                    "an input response's `action` is `accept`, `decline` or `cancel`",
                ))
            }
        }
        let content = response.get("content").cloned().unwrap_or_else(|| json!({}));
        let input = self
            .api
            .service()
            .offered(&task.capability)
            .map(|offered| schema_value(&offered.described.input_schema));
        // A tool offered as `{"input": …}` takes its answer so too.
        let payload = match input {
            Some(schema) if schema != Value::Bool(true) && !is_object_schema(&schema) => {
                content.get("input").cloned().unwrap_or(Value::Null)
            }
            _ => content,
        };
        self.api
            .service()
            .check_payload(&task.capability, &payload)
            .map_err(|error| invalid(error.message))?;
        let message_id = format!("{key}.answer");
        match self.api.continue_task(self.caller, &task, &message_id, payload).await {
            Ok(_) => Ok(json!({})),
            Err(error) => Err(invalid(format!("task `{}`: {}", task.task_id, error.message))),
        }
    }

    /// `tasks/cancel`: acknowledged (2026-07-28) or the task cancelled
    /// (2025-11-25, where one that ended is `-32602`).
    async fn cancel(&self, params: &Value, flavor: Flavor) -> Answered {
        let task = self.task(params).await?;
        let canceled = self.api.cancel(&task).await;
        match (flavor, canceled) {
            (Flavor::Extension, _) => Ok(json!({})),
            (Flavor::Utility, Ok(canceled)) => Ok(Value::Object(self.task_fields(&canceled, flavor))),
            (Flavor::Utility, Err(error)) => Err(invalid(format!(
                "task `{}` cannot be cancelled: {}",
                task.task_id, error.message
            ))),
        }
    }
}
