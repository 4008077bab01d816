//! A2A's gRPC binding (spec §10): `lf.a2a.v1.A2AService` from the spec's
//! `a2a.proto`, served on the router's own listener (gRPC is HTTP/2: h2c
//! with prior knowledge, or h2 by ALPN under TLS; `content-type:
//! application/grpc` on the service's path). The agent a request is for is
//! its `tenant` field (spec §4.4.6: the card's GRPC interface names the
//! capability there; empty: `--a2a-root-capability`'s).
//!
//! Each method is the JSON-RPC request of the same operation, answered by the
//! one reading ([`One::answer`]: the same admission, calls and task store as
//! JSON-RPC and REST), its request and answer translated at this edge
//! ([`wire`]); streams are the same `StreamResponse`s the REST binding
//! streams. Errors are gRPC statuses with spec §5.4's codes (the names the
//! REST binding gives, [`rest_error`]) and the same `google.rpc.ErrorInfo`
//! in `grpc-status-details-bin`.

use std::pin::Pin;

use agent_reach_proto::a2a as pb;
use agent_reach_proto::a2a::a2a_service_server::{A2aService, A2aServiceServer};
use prost::Message as _;
use tonic::{Request, Response, Status};

use super::*;

mod wire;

/// The service's routes: its path on the router's listener.
pub(crate) fn routes(api: TaskApi) -> axum::Router {
    let limit = api.service().tuning().max_body_bytes;
    let grpc = A2aServiceServer::new(Grpc { api })
        .max_decoding_message_size(limit)
        .max_encoding_message_size(usize::MAX);
    let path = format!(
        "/{}/{{*rest}}",
        <A2aServiceServer<Grpc> as tonic::server::NamedService>::NAME
    );
    axum::Router::new().route_service(&path, grpc)
}

pub(crate) struct Grpc {
    api: TaskApi,
}

/// A streamed answer: each `StreamResponse` as it comes, or the status ending it.
type Events = Pin<Box<dyn futures::Stream<Item = Result<pb::StreamResponse, Status>> + Send>>;

/// One request's caller, its agent and its headers (the request's metadata).
struct Called {
    identified: Identified,
    capability: String,
    headers: HeaderMap,
}

impl Grpc {
    /// Who calls which agent: the identity the router's layer put on the
    /// request, the agent its `tenant` names, the A2A version it speaks.
    fn called<T>(&self, request: &Request<T>, tenant: &str) -> Result<Called, Status> {
        let identified = request.extensions().get::<Identified>().cloned().ok_or_else(|| {
            Status::internal("this route is not behind the router's authentication layer (a bug: report it)")
        })?;
        self.called_by(identified, request.metadata().clone().into_headers(), tenant)
    }

    /// [`Grpc::called`] of a request `identified`, with `headers`.
    fn called_by(&self, identified: Identified, headers: HeaderMap, tenant: &str) -> Result<Called, Status> {
        match headers.value("a2a-version").map(<[u8]>::trim_ascii) {
            None | Some(b"") | Some(b"1.0") | Some(b"1.0.0") => {}
            Some(other) => {
                let other = String::from_utf8_lossy(other);
                return Err(status_of(
                    StatusCode::OK,
                    &rpc_error(
                        &Value::Null,
                        VERSION_NOT_SUPPORTED,
                        &format!("A2A-Version `{other}` is not supported on the gRPC binding; it speaks 1.0"),
                        None,
                    ),
                ));
            }
        }
        let capability =
            match (tenant, &self.api.service().tuning().a2a_root_capability) {
                ("", Some(root)) => root.clone(),
                ("", None) => return Err(invalid_argument(
                    "`tenant` names the agent (the capability) a request is for: the card's GRPC interface gives it",
                )),
                (tenant, _) => tenant.to_string(),
            };
        Ok(Called {
            identified,
            capability,
            headers,
        })
    }

    /// The operation `method` with `params`, answered by the one reading.
    async fn answer(&self, called: Called, method: &str, params: Value) -> Answer {
        let caller = match called.identified.caller {
            Ok(caller) => caller,
            Err(error) => return failed(&Value::Null, &error).into(),
        };
        let request = json!({ "jsonrpc": "2.0", "id": 0, "method": method, "params": params });
        let one = One {
            api: &self.api,
            caller: &caller,
            capability: &called.capability,
            headers: &called.headers,
            received: called.identified.received,
            legacy_allowed: false,
            // Streams of bare `StreamResponse`s, as on the REST binding.
            rest: true,
        };
        one.answer(&request, false)
            .await
            .unwrap_or_else(|| json_reply(StatusCode::NO_CONTENT, Value::Null))
    }

    /// A unary method's result, or its error as a status.
    async fn unary(&self, called: Called, method: &str, params: Value) -> Result<Value, Status> {
        let (status, reply) = read(self.answer(called, method, params).await).await;
        match reply.get("result") {
            Some(result) if reply.get("error").is_none() => Ok(result.clone()),
            _ => Err(status_of(status, &reply)),
        }
    }

    /// A streaming method's events, or its error (before the stream opened) as a status.
    async fn streamed(&self, called: Called, method: &str, params: Value) -> Result<Response<Events>, Status> {
        let answer = self.answer(called, method, params).await;
        let response = match answer {
            Answer::Response(response)
                if response
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream")) =>
            {
                response
            }
            Answer::Stream { body, .. } => http::Response::new(body),
            other => {
                let (status, reply) = read(other).await;
                return Err(status_of(status, &reply));
            }
        };
        use futures::StreamExt as _;
        let events = response.into_body().into_data_stream().filter_map(|frame| async move {
            let frame = match frame {
                Ok(frame) => frame,
                Err(error) => return Some(Err(Status::internal(format!("the stream broke: {error}")))),
            };
            let data = sse_data(&frame)?;
            Some(match serde_json::from_str::<Value>(&data) {
                // The REST binding's error event: the stream ends with its status.
                Ok(value) if value.get("error").is_some() => Err(status_of_rest(&value)),
                Ok(value) => Ok(wire::stream_response(&value)),
                Err(error) => Err(Status::internal(format!("an event is not JSON: {error}"))),
            })
        });
        Ok(Response::new(Box::pin(events) as Events))
    }
}

impl Grpc {
    /// `SendMessage`: its common call read as it is ([`Grpc::plain_send`]),
    /// any other by the one reading.
    async fn send(&self, called: Called, request: &pb::SendMessageRequest) -> Result<pb::SendMessageResponse, Status> {
        if let Some(answered) = self.plain_send(&called, request).await {
            return answered;
        }
        let params = wire::send_json(request);
        // Boxed: the one reading's future (every method's) is four times
        // the common call's, which would otherwise carry it.
        Box::pin(self.unary(called, "SendMessage", params))
            .await
            .map(|value| wire::send_response(&value))
    }

    /// `SendMessage`'s common call (one DataPart, no configuration, no task
    /// named, the sender's fields as a client sends them) read from the
    /// request's message and answered with the agent's output, with no JSON
    /// reading between: `None` for any other request (and for a refusal
    /// before the call), which the one reading answers.
    async fn plain_send(
        &self,
        called: &Called,
        request: &pb::SendMessageRequest,
    ) -> Option<Result<pb::SendMessageResponse, Status>> {
        let caller = called.identified.caller.as_ref().ok()?;
        let message = request.message.as_ref()?;
        let plain = request.configuration.is_none()
            && !message.message_id.is_empty()
            && message.role == pb::Role::User as i32
            && message.task_id.is_empty()
            && message.parts.len() == 1;
        let data = match message.parts.first().and_then(|part| part.content.as_ref()) {
            Some(pb::part::Content::Data(data)) if plain => data,
            _ => return None,
        };
        let service = self.api.service();
        let context_id = Some(message.context_id.as_str()).filter(|id| !id.is_empty());
        let call = plain_call(
            service,
            caller,
            &called.capability,
            wire::json_of(data),
            Some(Cow::Borrowed(message.message_id.as_str())),
            context_id.map(Cow::Borrowed),
        )
        .ok()?;
        let call = Call::begin(
            Door::A2a,
            caller.clone(),
            call.checked,
            &called.headers,
            called.identified.received,
        );
        let success = match service.invoke(&call).await {
            Ok(success) => success,
            Err(failure) => {
                return Some(match input_required(&failure.error) {
                    Some(question) => {
                        // Boxed: a rare answer, whose future would otherwise swell every call's.
                        let task = Box::pin(paused_task(
                            &self.api,
                            caller,
                            &call.checked.request,
                            None,
                            question,
                            Wire::V1,
                        ))
                        .await;
                        Ok(wire::send_response(&json!({ "task": task })))
                    }
                    None => {
                        let (status, reply) = read(failed(&Value::Null, &failure.error).into()).await;
                        Err(status_of(status, &reply))
                    }
                });
            }
        };
        let output = match success.output_value() {
            Ok(output) => output,
            Err(error) => {
                let (status, reply) = read(failed(&Value::Null, &error).into()).await;
                return Some(Err(status_of(status, &reply)));
            }
        };
        // The JSON-RPC answer's metadata, built as a `Struct` at once.
        let text = |text: &str| prost_types::Value {
            kind: Some(prost_types::value::Kind::StringValue(text.to_string())),
        };
        let metadata = prost_types::Struct {
            fields: std::collections::BTreeMap::from([
                ("agent_id".to_string(), text(&success.agent_id)),
                ("capability_version".to_string(), text(&success.capability_version)),
                (
                    "attempts".to_string(),
                    prost_types::Value {
                        kind: Some(prost_types::value::Kind::NumberValue(f64::from(success.attempts))),
                    },
                ),
                ("request_id".to_string(), text(call.request_id())),
            ]),
        };
        let answer = pb::Message {
            message_id: trace::new_request_id(),
            context_id: call.checked.request.session_id.clone().unwrap_or_default(),
            role: pb::Role::Agent as i32,
            parts: vec![pb::Part {
                content: Some(pb::part::Content::Data(wire::value_of(&output))),
                ..Default::default()
            }],
            metadata: Some(metadata),
            ..Default::default()
        };
        Some(Ok(pb::SendMessageResponse {
            payload: Some(pb::send_message_response::Payload::Message(answer)),
        }))
    }
}

/// The one message of a unary request's body, when the body is exactly one
/// uncompressed gRPC message of at most `limit` bytes that decodes as
/// `SendMessageRequest`; otherwise the body as it came (what was read of
/// it first, then the rest), for tonic to read.
pub(crate) async fn one_message(mut body: Body, limit: usize) -> Result<pb::SendMessageRequest, Body> {
    use http_body_util::BodyExt as _;
    // The DATA frames read, as they came (one, mostly: no copy then).
    let mut chunks: Vec<bytes::Bytes> = Vec::new();
    let mut length = 0;
    // What was read, then `last` (a frame not taken, or the error read), then the rest.
    let replay = |chunks: Vec<bytes::Bytes>,
                  last: Option<Result<http_body::Frame<bytes::Bytes>, axum::Error>>,
                  rest: Option<Body>| {
        let read = chunks.into_iter().map(|chunk| Ok(http_body::Frame::data(chunk)));
        let frames = futures::stream::iter(read.chain(last));
        match rest {
            Some(rest) => Body::new(http_body_util::StreamBody::new(futures::StreamExt::chain(
                frames,
                http_body_util::BodyStream::new(rest),
            ))),
            None => Body::new(http_body_util::StreamBody::new(frames)),
        }
    };
    while let Some(frame) = body.frame().await {
        match frame.map(http_body::Frame::into_data) {
            Ok(Ok(data)) if length + data.len() <= limit + FRAME_HEADER => {
                length += data.len();
                chunks.push(data);
            }
            // Over the limit (tonic's error), or trailers: tonic reads it.
            Ok(Ok(data)) => return Err(replay(chunks, Some(Ok(http_body::Frame::data(data))), Some(body))),
            Ok(Err(frame)) => return Err(replay(chunks, Some(Ok(frame)), Some(body))),
            // The error again, where tonic reads it.
            Err(error) => return Err(replay(chunks, Some(Err(error)), None)),
        }
    }
    let message = match chunks.as_slice() {
        [one] => one.clone(),
        several => several.concat().into(),
    };
    let plain = message.len() >= FRAME_HEADER
        && message[0] == 0
        && u32::from_be_bytes([message[1], message[2], message[3], message[4]]) as usize
            == message.len() - FRAME_HEADER;
    match plain.then(|| pb::SendMessageRequest::decode(&message[FRAME_HEADER..])) {
        Some(Ok(request)) => Ok(request),
        _ => Err(replay(chunks, None, None)),
    }
}

/// A gRPC message's prefix: its compressed flag and its length (4 bytes, big-endian).
const FRAME_HEADER: usize = 5;

/// `SendMessage`'s answer to `request`, as tonic's service answers it.
pub(crate) async fn answer_send(
    api: &TaskApi,
    identified: Identified,
    headers: HeaderMap,
    request: pb::SendMessageRequest,
) -> http::Response<Body> {
    let grpc = Grpc { api: api.clone() };
    let answered = match grpc.called_by(identified, headers, &request.tenant) {
        // Boxed where it is made: the call's future (the pipeline's, a few
        // kilobytes) is then moved once, not once more by every future that
        // awaits it up to the connection's (`protocols-bench`'s profile:
        // those copies were the binding's largest cost).
        Ok(called) => Box::pin(grpc.send(called, &request)).await,
        Err(status) => Err(status),
    };
    match answered {
        Ok(answer) => unary_answer(&answer),
        Err(status) => status.into_http(),
    }
}

/// A unary answer as tonic writes it: `content-type: application/grpc`,
/// the message (uncompressed), then `grpc-status: 0` in trailers.
fn unary_answer(message: &impl prost::Message) -> http::Response<Body> {
    let length = message.encoded_len();
    let Ok(prefix) = u32::try_from(length) else {
        return Status::resource_exhausted(format!(
            "the answer's message is {length} bytes, over gRPC's limit of 4 GiB a message"
        ))
        .into_http();
    };
    let mut data = bytes::BytesMut::with_capacity(FRAME_HEADER + length);
    data.extend_from_slice(&[0]);
    data.extend_from_slice(&prefix.to_be_bytes());
    // Encoding into a buffer with room for it cannot fail.
    let _ = message.encode(&mut data);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let frames = [
        http_body::Frame::data(data.freeze()),
        http_body::Frame::trailers(trailers),
    ];
    let body = http_body_util::StreamBody::new(futures::stream::iter(frames.map(Ok::<_, std::convert::Infallible>)));
    let mut response = http::Response::new(Body::new(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// An SSE event's data (its `data:` lines joined); `None` for one without.
fn sse_data(frame: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(frame).ok()?;
    let lines: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| data.strip_prefix(' ').unwrap_or(data))
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// An answer's HTTP status and its JSON (a JSON-RPC response).
async fn read(answer: Answer) -> (StatusCode, Value) {
    let (status, body) = match answer {
        Answer::Json { status, body } | Answer::Typed { status, body, .. } => (status, bytes::Bytes::from(body)),
        Answer::Response(response) => {
            let status = response.status();
            match axum::body::to_bytes(response.into_body(), usize::MAX).await {
                Ok(body) => (status, body),
                Err(error) => {
                    let reply = rpc_error(
                        &Value::Null,
                        INTERNAL_ERROR,
                        &format!("the answer cannot be read: {error}"),
                        None,
                    );
                    return (StatusCode::INTERNAL_SERVER_ERROR, reply);
                }
            }
        }
        Answer::Stream { .. } => {
            let reply = rpc_error(&Value::Null, INTERNAL_ERROR, "a stream where one answer was due", None);
            return (StatusCode::INTERNAL_SERVER_ERROR, reply);
        }
    };
    let reply = serde_json::from_slice(&body).unwrap_or_else(|error| {
        rpc_error(
            &Value::Null,
            INTERNAL_ERROR,
            &format!("the answer is not JSON: {error}"),
            None,
        )
    });
    (status, reply)
}

fn invalid_argument(message: &str) -> Status {
    status_of(StatusCode::OK, &rpc_error(&Value::Null, INVALID_PARAMS, message, None))
}

/// A JSON-RPC error reply (answered with `status`) as a gRPC status: spec
/// §5.4's code (the one the REST binding names), the message, and the
/// `ErrorInfo` in `google.rpc.Status` details.
fn status_of(status: StatusCode, reply: &Value) -> Status {
    status_of_rest(&rest_error(reply, status).1)
}

/// A `google.rpc.Status` in ProtoJSON (the REST binding's error body) as a gRPC status.
fn status_of_rest(body: &Value) -> Status {
    let error = &body["error"];
    let code = grpc_code(error["status"].as_str().unwrap_or("INTERNAL"));
    let message = error["message"].as_str().unwrap_or_default().to_string();
    let details: Vec<prost_types::Any> = error["details"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|detail| detail["@type"] == ERROR_INFO)
        .map(|detail| {
            let info = pb::rpc::ErrorInfo {
                reason: detail["reason"].as_str().unwrap_or_default().to_string(),
                domain: detail["domain"].as_str().unwrap_or_default().to_string(),
                metadata: detail["metadata"]
                    .as_object()
                    .map(|metadata| {
                        metadata
                            .iter()
                            .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_string())))
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            prost_types::Any {
                type_url: pb::rpc::ERROR_INFO_TYPE.to_string(),
                value: info.encode_to_vec(),
            }
        })
        .collect();
    let rich = pb::rpc::Status {
        code: code as i32,
        message: message.clone(),
        details,
    };
    Status::with_details(code, message, rich.encode_to_vec().into())
}

/// A canonical code's name as tonic's code.
fn grpc_code(name: &str) -> tonic::Code {
    use tonic::Code;
    match name {
        "INVALID_ARGUMENT" => Code::InvalidArgument,
        "FAILED_PRECONDITION" => Code::FailedPrecondition,
        "NOT_FOUND" => Code::NotFound,
        "UNAUTHENTICATED" => Code::Unauthenticated,
        "PERMISSION_DENIED" => Code::PermissionDenied,
        "RESOURCE_EXHAUSTED" => Code::ResourceExhausted,
        "UNIMPLEMENTED" => Code::Unimplemented,
        "UNAVAILABLE" => Code::Unavailable,
        "DEADLINE_EXCEEDED" => Code::DeadlineExceeded,
        "ABORTED" => Code::Aborted,
        _ => Code::Internal,
    }
}

/// A unary result as `T`.
fn ok<T>(result: Result<Value, Status>, convert: impl FnOnce(&Value) -> T) -> Result<Response<T>, Status> {
    result.map(|value| Response::new(convert(&value)))
}

#[tonic::async_trait]
impl A2aService for Grpc {
    async fn send_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Result<Response<pb::SendMessageResponse>, Status> {
        let called = self.called(&request, &request.get_ref().tenant)?;
        self.send(called, request.get_ref()).await.map(Response::new)
    }

    type SendStreamingMessageStream = Events;

    async fn send_streaming_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Result<Response<Events>, Status> {
        let called = self.called(&request, &request.get_ref().tenant)?;
        let params = wire::send_json(request.get_ref());
        self.streamed(called, "SendStreamingMessage", params).await
    }

    async fn get_task(&self, request: Request<pb::GetTaskRequest>) -> Result<Response<pb::Task>, Status> {
        let called = self.called(&request, &request.get_ref().tenant)?;
        let params = wire::get_task_json(request.get_ref());
        ok(self.unary(called, "GetTask", params).await, wire::task)
    }

    async fn list_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        let called = self.called(&request, &request.get_ref().tenant)?;
        let params = wire::list_tasks_json(request.get_ref());
        ok(self.unary(called, "ListTasks", params).await, wire::list_tasks_response)
    }

    async fn cancel_task(&self, request: Request<pb::CancelTaskRequest>) -> Result<Response<pb::Task>, Status> {
        let called = self.called(&request, &request.get_ref().tenant)?;
        let params = wire::id_json(&request.get_ref().id);
        ok(self.unary(called, "CancelTask", params).await, wire::task)
    }

    type SubscribeToTaskStream = Events;

    async fn subscribe_to_task(
        &self,
        request: Request<pb::SubscribeToTaskRequest>,
    ) -> Result<Response<Events>, Status> {
        let called = self.called(&request, &request.get_ref().tenant)?;
        let params = wire::id_json(&request.get_ref().id);
        self.streamed(called, "SubscribeToTask", params).await
    }

    async fn create_task_push_notification_config(
        &self,
        request: Request<pb::TaskPushNotificationConfig>,
    ) -> Result<Response<pb::TaskPushNotificationConfig>, Status> {
        let called = self.called(&request, &request.get_ref().tenant)?;
        let params = wire::push_config_json(request.get_ref());
        ok(
            self.unary(called, "CreateTaskPushNotificationConfig", params).await,
            wire::push_config,
        )
    }

    async fn get_task_push_notification_config(
        &self,
        request: Request<pb::GetTaskPushNotificationConfigRequest>,
    ) -> Result<Response<pb::TaskPushNotificationConfig>, Status> {
        let called = self.called(&request, &request.get_ref().tenant)?;
        let params = wire::config_named_json(&request.get_ref().task_id, &request.get_ref().id);
        ok(
            self.unary(called, "GetTaskPushNotificationConfig", params).await,
            wire::push_config,
        )
    }

    async fn list_task_push_notification_configs(
        &self,
        request: Request<pb::ListTaskPushNotificationConfigsRequest>,
    ) -> Result<Response<pb::ListTaskPushNotificationConfigsResponse>, Status> {
        let called = self.called(&request, &request.get_ref().tenant)?;
        let params = wire::list_configs_json(request.get_ref());
        ok(
            self.unary(called, "ListTaskPushNotificationConfigs", params).await,
            wire::list_configs_response,
        )
    }

    async fn get_extended_agent_card(
        &self,
        request: Request<pb::GetExtendedAgentCardRequest>,
    ) -> Result<Response<pb::AgentCard>, Status> {
        let called = self.called(&request, &request.get_ref().tenant)?;
        // The card declares no extended card: always the spec's error (§3.3.4).
        self.unary(called, "GetExtendedAgentCard", json!({})).await?;
        Err(Status::internal(
            "GetExtendedAgentCard answered a card this agent does not have",
        ))
    }

    async fn delete_task_push_notification_config(
        &self,
        request: Request<pb::DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<Response<()>, Status> {
        let called = self.called(&request, &request.get_ref().tenant)?;
        let params = wire::config_named_json(&request.get_ref().task_id, &request.get_ref().id);
        self.unary(called, "DeleteTaskPushNotificationConfig", params).await?;
        Ok(Response::new(()))
    }
}
