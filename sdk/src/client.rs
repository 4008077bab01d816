//! A caller for programs that are not agents: invoke capabilities through the
//! router, submit durable tasks (with signed callbacks), follow, wait for and
//! cancel them, and read a session's results (DESIGN §3.2, §3.10). Every
//! failure is a [`CallError`] carrying the router's stable code.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agent_reach_proto::envelope::ResultEnvelope;
use agent_reach_proto::Priority;
use futures::Stream;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use agent_reach_proto::context::contexts_client::ContextsClient;

use crate::call::{self, CallOptions, Inherited, RouterLink};
use crate::ctx::{ContextHandle, ContextTier, Links};
use crate::error::CallError;

/// Calls the router as the caller its token names.
///
/// ```no_run
/// # async fn example() -> Result<(), agent_reach_sdk::CallError> {
/// use agent_reach_sdk::{CallOptions, Callback, Client};
/// use serde_json::{json, Value};
///
/// let client = Client::new("http://router:7500", std::env::var("AGENT_REACH_TOKEN").unwrap_or_default())?;
/// let status: Value = client
///     .invoke_with("order.query", json!({"order_id": "SO-2024001"}), &CallOptions::new().version("^1.2"))
///     .await?;
///
/// // Slow work: answered once stored, the outcome POSTed (signed) to the callback.
/// let options = CallOptions::new().session_id("s-1");
/// let callback = Callback::new("https://me.example/hook");
/// let task = client.submit_task("report.build", json!({"month": "2026-11"}), &options, Some(&callback)).await?;
/// let done = client.wait_task(&task.task_id, std::time::Duration::from_secs(300)).await?;
/// let report: Value = done.output()?;
/// let missed = client.session_results("s-1", None, None).await?; // what finished while away
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    link: RouterLink,
    timeout: Duration,
    /// The context service, once [`Client::context_service`] named one.
    contexts: Option<Arc<Links>>,
    context_url: Option<String>,
    /// The only CAs trusted for `https://` (`None`: the system's roots).
    ca_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Client {
    // Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("router", &self.link.router).finish()
    }
}

/// Where a task's result is POSTed when it ends, signed with the router's
/// default secret or the one `secret_ref` names (DESIGN §3.10.5; check it with
/// [`verify_callback`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Callback {
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
}

impl Callback {
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_string(),
            secret_ref: None,
        }
    }

    /// Sign with the router's secret of this name (`--callback-secret NAME=PATH`).
    pub fn secret_ref(mut self, name: &str) -> Self {
        self.secret_ref = Some(name.to_string());
        self
    }
}

/// A task's state (DESIGN §3.10.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Pending,
    Running,
    Retrying,
    Succeeded,
    Failed,
    Canceled,
    /// Paused for higher-priority work; queued again to resume from its checkpoint (DESIGN §9).
    Paused,
}

impl TaskStatus {
    /// `succeeded`, `failed` and `canceled` are final.
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Succeeded | TaskStatus::Failed | TaskStatus::Canceled)
    }
}

/// The answer to a submission: stored (`202`), or, for a repeated request id,
/// the task already stored (`duplicate`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TaskAccepted {
    pub task_id: String,
    pub status: TaskStatus,
    #[serde(default)]
    pub duplicate: bool,
}

/// One state a task went through.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Transition {
    pub status: TaskStatus,
    /// Epoch milliseconds.
    pub at: u64,
}

/// A task as the router reports it (`GET /v1/tasks/{task_id}`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TaskView {
    pub task_id: String,
    pub request_id: String,
    #[serde(default)]
    pub session_id: Option<String>,
    pub capability: String,
    pub priority: Priority,
    pub status: TaskStatus,
    /// Deliveries so far.
    pub attempts: u32,
    pub created_at: u64,
    pub updated_at: u64,
    #[serde(default)]
    pub transitions: Vec<Transition>,
    /// The result envelope, once the task ended.
    #[serde(default)]
    pub result: Option<ResultEnvelope>,
}

impl TaskView {
    /// The task's output as `O`; a task that failed or was canceled is its
    /// error (the code of its result, e.g. `CANCELED`), one not ended yet is
    /// `TASK_NOT_DONE`.
    pub fn output<O: DeserializeOwned>(&self) -> Result<O, CallError> {
        let result = self.result.as_ref().ok_or_else(|| {
            CallError::new(
                "TASK_NOT_DONE",
                format!("task `{}` is {:?}, without a result yet", self.task_id, self.status),
            )
        })?;
        if let Some(error) = &result.error {
            return Err(CallError {
                code: error.code.clone(),
                message: error.message.clone(),
                retryable: error.retryable,
                status: None,
                details: error.details.clone(),
            });
        }
        call::output_as(&self.capability, result.output.clone())
    }
}

/// One `event: state` of `GET /v1/tasks/{task_id}/events`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TaskEvent {
    pub task_id: String,
    pub status: TaskStatus,
    pub at: u64,
    /// On the last (terminal) event: the result envelope.
    #[serde(default)]
    pub result: Option<ResultEnvelope>,
}

/// A finished task of a session (`GET /v1/sessions/{id}/results`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SessionResult {
    /// Pass as `after` to read only what came later.
    pub cursor: String,
    pub task_id: String,
    pub status: TaskStatus,
    #[serde(default)]
    pub result: Option<ResultEnvelope>,
}

/// One page of a session's results, in order.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SessionResults {
    pub session_id: String,
    pub results: Vec<SessionResult>,
    /// The `after` of the next page (`None` when the session has none yet).
    #[serde(default)]
    pub next_after: Option<String>,
}

/// What `POST /v1/tasks` takes: the invoke envelope plus `callback`.
#[derive(Serialize)]
struct TaskSubmission<'a> {
    #[serde(flatten)]
    envelope: agent_reach_proto::envelope::InvokeRequest,
    #[serde(skip_serializing_if = "Option::is_none")]
    callback: Option<&'a Callback>,
}

impl Client {
    /// A client of the router at `router` (`http://` or `https://`), calling
    /// as the `sub` of `token` (a JWT).
    pub fn new(router: &str, token: impl Into<String>) -> Result<Self, CallError> {
        let token = token.into();
        let mut problems = Vec::new();
        match reqwest::Url::parse(router) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {}
            _ => problems.push(format!(
                "the router URL `{router}` is not an http:// or https:// URL with a host"
            )),
        }
        if token.trim().is_empty() {
            problems.push("no token: pass a JWT whose sub is the caller's name".to_string());
        }
        if !problems.is_empty() {
            return Err(CallError::new("INVALID_CLIENT_CONFIG", problems.join("; ")));
        }
        Ok(Self {
            link: RouterLink {
                http: reqwest::Client::new(),
                router: router.trim_end_matches('/').to_string(),
                token,
            },
            timeout: Duration::from_secs(60),
            contexts: None,
            context_url: None,
            ca_file: None,
        })
    }

    /// Trusts only the CAs in `path` (PEM) for an `https://` router and
    /// context service, instead of the system's roots (as
    /// [`AgentBuilder::ca_file`](crate::AgentBuilder::ca_file)).
    pub fn ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Result<Self, CallError> {
        let path = path.into();
        self.link.http = crate::call::http_client(Some(&path))
            .map_err(|error| CallError::new("INVALID_CLIENT_CONFIG", error.to_string()))?;
        self.ca_file = Some(path);
        match self.context_url.take() {
            Some(url) => self.context_service(&url),
            None => Ok(self),
        }
    }

    /// The context service (gRPC, e.g. `http://context:7600`), for
    /// [`Client::create_context`] and [`Client::context`]; connected on first use.
    pub fn context_service(mut self, url: &str) -> Result<Self, CallError> {
        let trust = agent_reach_serving::tls::ClientFiles {
            ca: self.ca_file.clone(),
            identity: None,
        };
        let channel = agent_reach_serving::tls::grpc_endpoint(url, &trust)
            .map_err(|error| {
                CallError::new(
                    "INVALID_CLIENT_CONFIG",
                    format!("the context service URL `{url}` is unusable: {error}"),
                )
            })?
            .connect_timeout(Duration::from_secs(2))
            .connect_lazy();
        self.context_url = Some(url.to_string());
        self.contexts = Some(Arc::new(Links {
            router: None,
            context: Some(ContextsClient::new(channel)),
            token: self.link.token.clone(),
        }));
        Ok(self)
    }

    fn context_links(&self) -> Arc<Links> {
        // Without a context service, a handle whose every call says so (NO_CONTEXT_SERVICE).
        self.contexts.clone().unwrap_or_else(|| {
            Arc::new(Links {
                router: None,
                context: None,
                token: String::new(),
            })
        })
    }

    /// Creates a session context with `fields` (each within the caller's
    /// `write` whitelist, DESIGN §4.3); pass its [`id`](ContextHandle::id) as
    /// [`CallOptions::context_id`] so the agents of the conversation share it,
    /// and [`close`](ContextHandle::close) it when the conversation ends.
    ///
    /// ```no_run
    /// # async fn example(client: agent_reach_sdk::Client) -> Result<(), agent_reach_sdk::CallError> {
    /// use agent_reach_sdk::{CallOptions, ContextTier};
    /// use serde_json::{json, Value};
    /// let context = client.create_context(ContextTier::Default, [("user_id", json!("ada"))]).await?;
    /// let options = CallOptions::new().context_id(context.id().unwrap_or_default());
    /// let answer: Value = client.invoke_with("intent.parse", json!({"text": "ship today?"}), &options).await?;
    /// context.close().await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_context<'a>(
        &self,
        tier: ContextTier,
        fields: impl IntoIterator<Item = (&'a str, Value)>,
    ) -> Result<ContextHandle, CallError> {
        let fields: BTreeMap<String, String> = fields
            .into_iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        ContextHandle::create(self.context_links(), tier, fields).await
    }

    /// The context `context_id`: read, patch or close it.
    pub fn context(&self, context_id: &str) -> ContextHandle {
        ContextHandle::new(self.context_links(), Some(context_id.to_string()))
    }

    /// How long a call without a timeout of its own waits for the router's
    /// answer (default 60 s; the router's own default deadline is 30 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Calls `capability` and decodes its output as `O`.
    pub async fn invoke<O: DeserializeOwned>(&self, capability: &str, input: impl Serialize) -> Result<O, CallError> {
        self.invoke_with(capability, input, &CallOptions::default()).await
    }

    /// [`Client::invoke`] with a version requirement, policy, priority,
    /// timeout, session, context or request id.
    pub async fn invoke_with<O: DeserializeOwned>(
        &self,
        capability: &str,
        input: impl Serialize,
        options: &CallOptions,
    ) -> Result<O, CallError> {
        let envelope = self.invoke_envelope(capability, input, options).await?;
        call::output_as(capability, envelope.output)
    }

    /// The whole result envelope of a call (agent, version, attempts, latency).
    pub async fn invoke_envelope(
        &self,
        capability: &str,
        input: impl Serialize,
        options: &CallOptions,
    ) -> Result<ResultEnvelope, CallError> {
        let request = call::envelope(capability, to_payload(input)?, options, &Inherited::default());
        let within = call::answer_within(request.deadline, self.timeout);
        self.link.invoke(&request, None, None, within).await
    }

    // === Tasks ===

    /// Submits a durable task: answered once stored, delivered by whichever
    /// router is alive, its result kept for the session and, with a
    /// `callback`, POSTed there signed. A repeated request id (`options`)
    /// returns the task already stored.
    pub async fn submit_task(
        &self,
        capability: &str,
        input: impl Serialize,
        options: &CallOptions,
        callback: Option<&Callback>,
    ) -> Result<TaskAccepted, CallError> {
        let submission = TaskSubmission {
            envelope: call::envelope(capability, to_payload(input)?, options, &Inherited::default()),
            callback,
        };
        let response = self
            .link
            .http
            .post(self.link.url("/v1/tasks"))
            .bearer_auth(&self.link.token)
            .timeout(self.timeout)
            .json(&submission)
            .send()
            .await
            .map_err(|error| self.link.unreachable(&error))?;
        call::read_json(response).await
    }

    /// The task now (`TASK_NOT_FOUND` for another caller's).
    pub async fn task(&self, task_id: &str) -> Result<TaskView, CallError> {
        self.get(&format!("/v1/tasks/{}", segment(task_id)), &[]).await
    }

    /// Cancels a task that has not ended (`TASK_CONFLICT` once it has); a
    /// running one's outcome is dropped when it arrives.
    pub async fn cancel_task(&self, task_id: &str) -> Result<TaskView, CallError> {
        let response = self
            .link
            .http
            .post(self.link.url(&format!("/v1/tasks/{}/cancel", segment(task_id))))
            .bearer_auth(&self.link.token)
            .timeout(self.timeout)
            .send()
            .await
            .map_err(|error| self.link.unreachable(&error))?;
        call::read_json(response).await
    }

    /// The states the task enters, as the router sends them (server-sent
    /// events); the stream ends after the terminal one, which carries the result.
    ///
    /// ```no_run
    /// # async fn example(client: agent_reach_sdk::Client) -> Result<(), agent_reach_sdk::CallError> {
    /// use futures::StreamExt;
    /// let mut events = std::pin::pin!(client.task_events("t_0123456789abcdef01234567").await?);
    /// while let Some(event) = events.next().await {
    ///     let event = event?;
    ///     println!("{:?} at {}", event.status, event.at);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn task_events(
        &self,
        task_id: &str,
    ) -> Result<impl Stream<Item = Result<TaskEvent, CallError>> + Send + 'static, CallError> {
        let response = self
            .link
            .http
            .get(self.link.url(&format!("/v1/tasks/{}/events", segment(task_id))))
            .bearer_auth(&self.link.token)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|error| self.link.unreachable(&error))?;
        if !response.status().is_success() {
            return Err(call::read_json::<Value>(response)
                .await
                .err()
                .unwrap_or_else(|| CallError::new("INVALID_RESULT", "the router refused the event stream")));
        }
        Ok(events(response))
    }

    /// Waits (at most `timeout`, else `DEADLINE_EXCEEDED`) until the task ends,
    /// following its events, and returns it then.
    pub async fn wait_task(&self, task_id: &str, timeout: Duration) -> Result<TaskView, CallError> {
        use futures::StreamExt;
        let follow = async {
            let mut events = std::pin::pin!(self.task_events(task_id).await?);
            while let Some(event) = events.next().await {
                if event?.status.is_terminal() {
                    break;
                }
            }
            // Ended (or the stream broke off): the task as it is now.
            self.task(task_id).await
        };
        let view = tokio::time::timeout(timeout, follow).await.map_err(|_| {
            CallError::new(
                "DEADLINE_EXCEEDED",
                format!("task `{task_id}` did not end within {} ms", timeout.as_millis()),
            )
            .retryable()
        })??;
        if view.status.is_terminal() {
            Ok(view)
        } else {
            Err(CallError::new(
                "TASK_NOT_DONE",
                format!(
                    "the event stream of task `{task_id}` ended while it was {:?}",
                    view.status
                ),
            )
            .retryable())
        }
    }

    /// The caller's finished tasks of `session_id`, in order, after the cursor
    /// `after` (from the start when `None`); at most `limit` (default 100).
    pub async fn session_results(
        &self,
        session_id: &str,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<SessionResults, CallError> {
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(after) = after {
            query.push(("after", after.to_string()));
        }
        if let Some(limit) = limit {
            query.push(("limit", limit.to_string()));
        }
        self.get(&format!("/v1/sessions/{}/results", segment(session_id)), &query)
            .await
    }

    async fn get<T: DeserializeOwned>(&self, path: &str, query: &[(&str, String)]) -> Result<T, CallError> {
        let response = self
            .link
            .http
            .get(self.link.url(path))
            .query(query)
            .bearer_auth(&self.link.token)
            .timeout(self.timeout)
            .send()
            .await
            .map_err(|error| self.link.unreachable(&error))?;
        call::read_json(response).await
    }
}

fn to_payload(input: impl Serialize) -> Result<Value, CallError> {
    serde_json::to_value(input).map_err(|error| CallError::new("INVALID_INPUT", error.to_string()))
}

/// `text` as one URL path segment (task and session ids are plain, but a
/// caller's session id may hold anything).
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~' | b':') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

// === Server-sent events ===

/// The `event: state` events of a response, parsed as they arrive; an
/// `event: error` (the router lost its store) ends the stream with that error.
fn events(response: reqwest::Response) -> impl Stream<Item = Result<TaskEvent, CallError>> + Send + 'static {
    struct Reader {
        response: reqwest::Response,
        buffer: Vec<u8>,
        done: bool,
    }
    let reader = Reader {
        response,
        buffer: Vec::new(),
        done: false,
    };
    futures::stream::unfold(reader, |mut reader| async move {
        loop {
            if reader.done {
                return None;
            }
            if let Some(end) = frame_end(&reader.buffer) {
                let frame: Vec<u8> = reader.buffer.drain(..end).collect();
                match parse_frame(&frame) {
                    Frame::State(event) => {
                        let event = *event;
                        reader.done = event.status.is_terminal();
                        return Some((Ok(event), reader));
                    }
                    Frame::Error(error) => {
                        reader.done = true;
                        return Some((Err(error), reader));
                    }
                    Frame::Other => continue,
                }
            }
            match reader.response.chunk().await {
                Ok(Some(chunk)) => reader.buffer.extend_from_slice(&chunk),
                Ok(None) => return None,
                Err(error) => {
                    reader.done = true;
                    let error = CallError::new("INVALID_RESULT", format!("the task's event stream broke off: {error}"))
                        .retryable();
                    return Some((Err(error), reader));
                }
            }
        }
    })
}

/// Where the first complete frame (ended by a blank line) ends, separator included.
fn frame_end(buffer: &[u8]) -> Option<usize> {
    let lf = buffer.windows(2).position(|pair| pair == b"\n\n").map(|at| at + 2);
    let crlf = buffer.windows(4).position(|four| four == b"\r\n\r\n").map(|at| at + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

enum Frame {
    State(Box<TaskEvent>),
    Error(CallError),
    /// A comment (keep-alive) or an event kind this SDK does not know.
    Other,
}

fn parse_frame(frame: &[u8]) -> Frame {
    let text = String::from_utf8_lossy(frame);
    let mut kind = "message";
    let mut data = String::new();
    for line in text.lines() {
        if let Some(value) = line.strip_prefix("event:") {
            kind = value.trim();
        } else if let Some(value) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(value.strip_prefix(' ').unwrap_or(value));
        }
    }
    match kind {
        "state" => match serde_json::from_str::<TaskEvent>(&data) {
            Ok(event) => Frame::State(Box::new(event)),
            Err(error) => Frame::Error(CallError::new(
                "INVALID_RESULT",
                format!("unreadable task event `{data}`: {error}"),
            )),
        },
        "error" => Frame::Error(
            CallError::new(
                "TASK_STORE_UNAVAILABLE",
                format!("the router could not follow the task: {data}"),
            )
            .retryable(),
        ),
        _ => Frame::Other,
    }
}

// === Callbacks ===

/// Checks a task callback's `X-Agent-Reach-Signature: t=<unix seconds>,v1=<hex>`
/// (HMAC-SHA256 of `"<t>.<body>"` with `secret`, compared in constant time),
/// refusing timestamps further than `max_age` from `now_s` (replays).
///
/// ```
/// use std::time::Duration;
/// use agent_reach_sdk::verify_callback;
/// let header = "t=1700000000,v1=00";
/// assert!(!verify_callback(b"secret-of-at-least-32-bytes-0123", header, b"{}", Duration::from_secs(300), 1_700_000_000));
/// ```
pub fn verify_callback(secret: &[u8], signature_header: &str, body: &[u8], max_age: Duration, now_s: u64) -> bool {
    use hmac::Mac;
    let mut timestamp = None;
    let mut signature = None;
    for part in signature_header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => timestamp = value.parse::<u64>().ok(),
            Some(("v1", value)) => signature = hex::decode(value).ok(),
            _ => {}
        }
    }
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return false;
    };
    if timestamp.abs_diff(now_s) > max_age.as_secs() {
        return false;
    }
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret) else {
        return false;
    };
    mac.update(format!("{timestamp}.").as_bytes());
    mac.update(body);
    mac.verify_slice(&signature).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_split_and_parsed() {
        let stream =
            b": keep-alive\n\nevent: state\ndata: {\"task_id\":\"t_1\",\"status\":\"running\",\"at\":5}\n\nevent: st";
        let end = frame_end(stream).unwrap();
        assert!(matches!(parse_frame(&stream[..end]), Frame::Other));
        let rest = &stream[end..];
        let end = frame_end(rest).unwrap();
        match parse_frame(&rest[..end]) {
            Frame::State(event) => assert_eq!((event.status, event.at), (TaskStatus::Running, 5)),
            _ => panic!("not a state"),
        }
        assert_eq!(frame_end(&rest[end..]), None, "an unfinished frame waits for more");
        assert!(matches!(parse_frame(b"event: error\ndata: gone\n\n"), Frame::Error(error) if error.retryable));
        assert!(matches!(
            parse_frame(b"event: state\ndata: nonsense\n\n"),
            Frame::Error(_)
        ));
    }

    #[test]
    fn callback_signatures_verify() {
        use hmac::Mac;
        let (secret, body, now) = (b"s".repeat(32), br#"{"status":"succeeded"}"#.to_vec(), 1_700_000_000u64);
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&secret).unwrap();
        mac.update(format!("{now}.").as_bytes());
        mac.update(&body);
        let header = format!("t={now},v1={}", hex::encode(mac.finalize().into_bytes()));
        let window = Duration::from_secs(300);
        assert!(verify_callback(&secret, &header, &body, window, now));
        assert!(!verify_callback(&secret, &header, b"{}", window, now));
        assert!(!verify_callback(&b"x".repeat(32), &header, &body, window, now));
        assert!(
            !verify_callback(&secret, &header, &body, window, now + 3600),
            "a replay"
        );
        assert!(!verify_callback(&secret, "v1=zz", &body, window, now));
    }

    #[test]
    fn ids_become_one_path_segment() {
        assert_eq!(segment("t_0123abc"), "t_0123abc");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn a_client_needs_a_router_url_and_a_token() {
        let error = Client::new("router:7500", " ").unwrap_err();
        assert_eq!(error.code, "INVALID_CLIENT_CONFIG");
        assert!(
            error.message.contains("router:7500") && error.message.contains("no token"),
            "{error}"
        );
        assert!(Client::new("http://127.0.0.1:7500/", "t").is_ok());
    }

    #[test]
    fn an_unreadable_ca_file_is_named() {
        let client = Client::new("https://127.0.0.1:7500", "t").unwrap();
        let error = client.ca_file("/nonexistent/ca.pem").unwrap_err();
        assert_eq!(error.code, "INVALID_CLIENT_CONFIG");
        assert!(error.message.contains("/nonexistent/ca.pem"), "{error}");
    }
}
