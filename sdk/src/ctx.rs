//! The per-request context a handler receives: who called, how much time is
//! left, and typed access to other capabilities and to the session context.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_reach_proto::context as ctxpb;
use agent_reach_proto::context::contexts_client::ContextsClient;
use agent_reach_proto::envelope::{ResultEnvelope, Usage};
use agent_reach_proto::Priority;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tonic::transport::Channel;
use tracing::Instrument as _;

use crate::call::{self, now_ms, CallOptions, Inherited, RouterLink};
use crate::error::CallError;
use crate::HandlerError;

/// Clients shared by every request of one agent.
pub(crate) struct Links {
    pub(crate) router: Option<RouterLink>,
    pub(crate) context: Option<ContextsClient<Channel>>,
    pub(crate) token: String,
}

/// What a handler knows about the request it serves. Cheap to clone.
#[derive(Clone)]
pub struct Ctx {
    inner: Arc<Inner>,
}

struct Inner {
    request_id: String,
    session_id: Option<String>,
    context_id: Option<String>,
    source: Option<String>,
    priority: Priority,
    deadline_ms: u64,
    attempt: u32,
    traceparent: Option<String>,
    links: Arc<Links>,
    /// Set on a task's delivery: what [`Ctx::accept_and_report`] reports under.
    task_id: Option<String>,
    /// Set on a preemptible handler's task delivery: the router asked it to pause.
    pause: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The checkpoint a resumed delivery carries.
    checkpoint: Option<serde_json::Value>,
    /// What the handler reported with [`Ctx::report_usage`], answered beside its output.
    usage: Mutex<Option<Usage>>,
    /// The router's assertion for this call (verified) and its claims: the
    /// delegation chain, and what onward calls present upstream.
    assertion: Option<(String, Arc<agent_reach_access::AssertionClaims>)>,
    /// What is left of the chain's budget, this call charged.
    budget: Option<agent_reach_proto::envelope::BudgetLeft>,
    /// A multi-turn task's conversation before this message.
    history: Vec<Turn>,
}

/// One earlier turn of a multi-turn task's conversation (docs/design.md,
/// "Multi-turn tasks"), as the router delivers it with the next message.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Turn {
    /// A message of the caller: its payload.
    User { payload: Value },
    /// The agent asked for more input ([`HandlerError::input_required`]).
    Agent { message: String },
}

/// A child `traceparent`: same trace id, a new span id (W3C Trace Context).
fn child_traceparent(parent: Option<&str>) -> String {
    let span = format!("{:016x}", rand::random::<u64>());
    let trace = parent
        .and_then(|header| header.split('-').nth(1))
        .filter(|trace| trace.len() == 32)
        .map(str::to_string)
        .unwrap_or_else(|| format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>()));
    format!("00-{trace}-{span}-01")
}

impl Ctx {
    #[allow(clippy::too_many_arguments)] // built in one place from the envelope
    pub(crate) fn new(
        request_id: String,
        session_id: Option<String>,
        context_id: Option<String>,
        source: Option<String>,
        priority: Priority,
        deadline_ms: u64,
        attempt: u32,
        traceparent: Option<String>,
        links: Arc<Links>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                request_id,
                session_id,
                context_id,
                source,
                priority,
                deadline_ms,
                attempt,
                traceparent,
                links,
                task_id: None,
                pause: None,
                checkpoint: None,
                history: Vec::new(),
                usage: Mutex::new(None),
                assertion: None,
                budget: None,
            }),
        }
    }

    /// This context with the router's verified assertion (`token`, `claims`)
    /// and the envelope's budget.
    pub(crate) fn with_delegation(
        mut self,
        assertion: Option<(String, Arc<agent_reach_access::AssertionClaims>)>,
        budget: Option<agent_reach_proto::envelope::BudgetLeft>,
    ) -> Self {
        // Called right after `new`, before the context is shared.
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.assertion = assertion;
            inner.budget = budget;
        }
        self
    }

    fn delegation(&self) -> Option<(agent_reach_access::Delegation, &str)> {
        let (_, claims) = self.inner.assertion.as_ref()?;
        Some((
            agent_reach_access::Delegation {
                act: claims.act.clone(),
                depth: claims.depth.unwrap_or(1),
                budget: None,
                groups: claims.groups.clone(),
            },
            claims.sub.as_str(),
        ))
    }

    /// The delegation chain this call belongs to, as the router vouches for
    /// it: the original subject first, then each agent it passed through, the
    /// immediate caller last (`["user", "intent_parser", "order_query"]`).
    /// Empty when the router sent no assertion (`insecure` development mode).
    pub fn chain(&self) -> Vec<String> {
        self.delegation()
            .map(|(delegation, caller)| delegation.names(caller))
            .unwrap_or_default()
    }

    /// On whose behalf this call is made: the chain's original subject (the
    /// caller itself for a direct call).
    pub fn on_behalf_of(&self) -> Option<String> {
        self.delegation()
            .map(|(delegation, caller)| delegation.original_subject(caller).to_string())
    }

    /// What is left of the chain's budget (this call charged), when the call
    /// carries one; calls this handler makes spend from it.
    pub fn budget(&self) -> Option<agent_reach_proto::envelope::BudgetLeft> {
        self.inner.budget
    }

    /// This context for a task's delivery (`task_id` and, for a multi-turn
    /// task's next message, `history`, from the envelope; a history this SDK
    /// cannot read is left out, and logged).
    pub(crate) fn for_task(mut self, task_id: Option<String>, history: Option<Value>) -> Self {
        let history = match history.map(serde_json::from_value::<Vec<Turn>>) {
            None => Vec::new(),
            Some(Ok(history)) => history,
            Some(Err(error)) => {
                tracing::warn!(message = "The delivery's history is not one this SDK reads; left out.", %error);
                Vec::new()
            }
        };
        // Called right after `new`, before the context is shared.
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.task_id = task_id;
            inner.history = history;
        }
        self
    }

    /// This context for a delivery that may be asked to pause (`pause`), or
    /// that resumes from `checkpoint`.
    pub(crate) fn resumable(
        mut self,
        pause: Option<Arc<std::sync::atomic::AtomicBool>>,
        checkpoint: Option<serde_json::Value>,
    ) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.pause = pause;
            inner.checkpoint = checkpoint;
        }
        self
    }

    /// Whether the router asked this delivery to pause (DESIGN §9,
    /// preemption): higher-priority work waits for this agent's room. A
    /// [`preemptible`](crate::Handler::preemptible) handler looks at its
    /// checkpoints and returns [`HandlerError::paused`] with what it needs to
    /// resume. Always `false` for a handler not declared preemptible, and
    /// for a call that is not a task's delivery.
    pub fn pause_requested(&self) -> bool {
        self.inner
            .pause
            .as_ref()
            .is_some_and(|pause| pause.load(std::sync::atomic::Ordering::Acquire))
    }

    /// The checkpoint this delivery resumes from: what the handler returned
    /// with [`HandlerError::paused`] when its task was paused; `None` for a first delivery.
    pub fn checkpoint(&self) -> Option<&serde_json::Value> {
        self.inner.checkpoint.as_ref()
    }

    /// A multi-turn task's conversation before this message, oldest first:
    /// the caller's earlier messages and what this agent asked each time it
    /// answered [`HandlerError::input_required`]. Empty for a first message.
    ///
    /// ```
    /// use agent_reach_sdk::{handler, Ctx, HandlerError, Turn};
    ///
    /// #[handler(capability = "shirt.order", version = "1.0.0")]
    /// async fn order(ctx: Ctx, size: Option<String>) -> Result<String, HandlerError> {
    ///     let earlier = ctx.history().iter().filter(|turn| matches!(turn, Turn::User { .. })).count();
    ///     match size {
    ///         Some(size) => Ok(format!("ordered size {size} after {earlier} earlier message(s)")),
    ///         None => Err(HandlerError::input_required("Which size: S, M or L?")),
    ///     }
    /// }
    /// ```
    pub fn history(&self) -> &[Turn] {
        &self.inner.history
    }

    /// Reports what serving this call cost (DESIGN §3.5 `usage`): model
    /// tokens, the model and an abstract cost. Sent beside the output in the
    /// answer, it appears on the router's span (`gen_ai.usage.input_tokens`,
    /// `gen_ai.usage.output_tokens`, `gen_ai.request.model`), on this
    /// agent's `invoke_agent` span and in `agent_reach_model_tokens_total`.
    /// Several reports add up (the later model name wins). Not sent with a
    /// streamed answer or a task's later report.
    ///
    /// ```
    /// use agent_reach_sdk::{handler, Ctx, HandlerError, Usage};
    ///
    /// #[handler(capability = "text.summarize", version = "1.0.0")]
    /// async fn summarize(ctx: Ctx, text: String) -> Result<String, HandlerError> {
    ///     let summary: String = text.chars().take(100).collect();
    ///     ctx.report_usage(Usage::tokens("summarizer-small", 120, 24));
    ///     Ok(summary)
    /// }
    /// ```
    pub fn report_usage(&self, usage: Usage) {
        let mut reported = self.inner.usage.lock().unwrap_or_else(PoisonError::into_inner);
        match reported.as_mut() {
            Some(total) => total.add(usage),
            None => *reported = Some(usage),
        }
    }

    /// What the handler reported so far ([`Ctx::report_usage`]).
    pub(crate) fn usage(&self) -> Option<Usage> {
        self.inner.usage.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The task this delivery belongs to (`POST /v1/tasks`); `None` for a synchronous call.
    pub fn task_id(&self) -> Option<&str> {
        self.inner.task_id.as_deref()
    }

    /// Long work: on a task's delivery, answers `202 Accepted` at once (the
    /// router releases the connection) and runs `work` in the background,
    /// then reports its outcome with `POST /v1/tasks/{task_id}/result` as
    /// this agent (retried until the deadline while the router is
    /// unreachable). A synchronous call has no task to report to: `work`
    /// simply runs and its output is the answer, so one handler serves both.
    /// Return what it returns. Background work is not counted against
    /// `max_concurrency` and is abandoned at the deadline (the router fails
    /// the task then).
    ///
    /// ```
    /// use agent_reach_sdk::{handler, Ctx, HandlerError};
    ///
    /// #[handler(capability = "report.build", version = "1.0.0")]
    /// async fn build(ctx: Ctx, month: String) -> Result<String, HandlerError> {
    ///     ctx.accept_and_report(async move {
    ///         // ... minutes of work ...
    ///         Ok(format!("report for {month}"))
    ///     })
    ///     .await
    /// }
    /// ```
    pub async fn accept_and_report<O, F>(&self, work: F) -> Result<O, HandlerError>
    where
        O: Serialize + Send + 'static,
        F: Future<Output = Result<O, HandlerError>> + Send + 'static,
    {
        let (Some(task_id), Some(router)) = (self.task_id(), self.inner.links.router.as_ref()) else {
            return work.await;
        };
        let report = crate::report::Report {
            http: router.http.clone(),
            url: router.url(&format!("/v1/tasks/{task_id}/result")),
            token: router.token.clone(),
            deadline_ms: self.inner.deadline_ms,
        };
        let remaining = self.remaining();
        tokio::spawn(
            async move {
                let outcome = match tokio::time::timeout(remaining, work).await {
                    Ok(outcome) => outcome,
                    // Nothing to report: the router fails the task at this same deadline.
                    Err(_) => return,
                };
                report.send(outcome).await;
            }
            .instrument(tracing::Span::current()),
        );
        Err(HandlerError::accepted())
    }

    /// The idempotency key of this request.
    pub fn request_id(&self) -> &str {
        &self.inner.request_id
    }

    pub fn session_id(&self) -> Option<&str> {
        self.inner.session_id.as_deref()
    }

    pub fn context_id(&self) -> Option<&str> {
        self.inner.context_id.as_deref()
    }

    /// The verified caller, as the router authenticated it.
    pub fn source(&self) -> Option<&str> {
        self.inner.source.as_deref()
    }

    /// How urgent the caller said this request is; calls onwards carry it.
    pub fn priority(&self) -> Priority {
        self.inner.priority
    }

    /// Which delivery attempt this is (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// The absolute deadline in epoch milliseconds.
    pub fn deadline_ms(&self) -> u64 {
        self.inner.deadline_ms
    }

    /// Time left before the deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        Duration::from_millis(self.inner.deadline_ms.saturating_sub(now_ms()))
    }

    /// The W3C trace context of this request, if the router sent one.
    pub fn traceparent(&self) -> Option<&str> {
        self.inner.traceparent.as_deref()
    }

    /// Calls another capability through the router, carrying this request's
    /// session, context, priority, remaining deadline and trace context.
    ///
    /// ```
    /// use agent_reach_sdk::{handler, Ctx, HandlerError};
    /// use serde_json::{json, Value};
    ///
    /// #[handler(capability = "order.summary", version = "1.0.0")]
    /// async fn summary(ctx: Ctx, order_id: String) -> Result<Value, HandlerError> {
    ///     // A failed call becomes this handler's error, with the callee's code.
    ///     let status: Value = ctx.call("order.query", json!({ "order_id": order_id })).await?;
    ///     Ok(json!({ "status": status["status"] }))
    /// }
    /// ```
    pub async fn call<O: DeserializeOwned>(&self, capability: &str, input: impl Serialize) -> Result<O, CallError> {
        self.call_with(capability, input, &CallOptions::default()).await
    }

    /// [`Ctx::call`] with a version requirement, policy, priority or timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use agent_reach_sdk::{handler, CallOptions, Ctx, HandlerError, TargetPolicy};
    /// use serde_json::{json, Value};
    ///
    /// #[handler(capability = "order.summary", version = "1.0.0")]
    /// async fn summary(ctx: Ctx, order_id: String) -> Result<Value, HandlerError> {
    ///     let options = CallOptions::new()
    ///         .version("^1.2")
    ///         .policy(TargetPolicy::LeastConnections)
    ///         .timeout(Duration::from_millis(800)); // never past this request's own deadline
    ///     let status: Value = ctx.call_with("order.query", json!({ "order_id": order_id }), &options).await?;
    ///     Ok(json!({ "status": status["status"] }))
    /// }
    /// ```
    pub async fn call_with<O: DeserializeOwned>(
        &self,
        capability: &str,
        input: impl Serialize,
        options: &CallOptions,
    ) -> Result<O, CallError> {
        let envelope = self.call_envelope_with(capability, input, options).await?;
        call::output_as(capability, envelope.output)
    }

    /// Like [`Ctx::call`], returning the whole result envelope (agent, attempts, latency).
    pub async fn call_envelope(&self, capability: &str, input: impl Serialize) -> Result<ResultEnvelope, CallError> {
        self.call_envelope_with(capability, input, &CallOptions::default())
            .await
    }

    /// Like [`Ctx::call_with`], returning the whole result envelope.
    pub async fn call_envelope_with(
        &self,
        capability: &str,
        input: impl Serialize,
        options: &CallOptions,
    ) -> Result<ResultEnvelope, CallError> {
        let router = self
            .inner
            .links
            .router
            .as_ref()
            .ok_or_else(|| CallError::new("NO_ROUTER", "this agent was built without a router URL"))?;
        let payload =
            serde_json::to_value(input).map_err(|error| CallError::new("INVALID_INPUT", error.to_string()))?;
        let inherited = Inherited {
            session_id: self.session_id(),
            context_id: self.context_id(),
            priority: Some(self.inner.priority),
            deadline_ms: Some(self.inner.deadline_ms),
        };
        let request = call::envelope(capability, payload, options, &inherited);
        // The current span (the handler's, or one the handler opened) is the
        // router span's parent; without OpenTelemetry, a child id of our own.
        let traceparent = agent_reach_telemetry::propagation::traceparent(&tracing::Span::current())
            .unwrap_or_else(|| child_traceparent(self.traceparent()));
        let within = call::answer_within(request.deadline, Duration::from_secs(60));
        let upstream = self
            .inner
            .assertion
            .as_ref()
            .map(|(token, _)| (token.as_str(), self.inner.request_id.as_str()));
        router.invoke(&request, Some(&traceparent), upstream, within).await
    }

    /// The session context named by this request's `context_id`.
    ///
    /// ```
    /// use agent_reach_sdk::{handler, Ctx, HandlerError};
    ///
    /// #[handler(capability = "intent.parse", version = "1.0.0")]
    /// async fn parse(ctx: Ctx, text: String) -> Result<String, HandlerError> {
    ///     let intent = if text.contains("ship") { "ask_ship_today" } else { "unknown" };
    ///     // Only fields this agent's `write` whitelist allows; atomic.
    ///     let version = ctx.context().patch().set("intent", intent).send().await?;
    ///     // Only fields this agent's `read` whitelist allows come back.
    ///     let seen = ctx.context().get(&["intent"]).await?;
    ///     assert!(seen.version >= version);
    ///     Ok(intent.to_string())
    /// }
    /// ```
    pub fn context(&self) -> ContextHandle {
        ContextHandle {
            links: self.inner.links.clone(),
            context_id: self.inner.context_id.clone(),
        }
    }
}

// === Session context ===

/// Reads and patches one session context through the context service.
pub struct ContextHandle {
    links: Arc<Links>,
    context_id: Option<String>,
}

/// The fields a reader may see, and the context's version.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextSnapshot {
    pub version: u64,
    pub fields: BTreeMap<String, Value>,
}

impl std::fmt::Debug for ContextHandle {
    // Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextHandle")
            .field("context_id", &self.context_id)
            .finish()
    }
}

/// How long a new context lives after its last write (DESIGN §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContextTier {
    /// The context service's `--default-ttl` (30 min).
    #[default]
    Default,
    /// `--one-shot-ttl` (5 min): one request's worth of shared state.
    OneShot,
}

impl ContextTier {
    fn as_str(self) -> &'static str {
        match self {
            ContextTier::Default => "default",
            ContextTier::OneShot => "one_shot",
        }
    }
}

impl ContextHandle {
    pub(crate) fn new(links: Arc<Links>, context_id: Option<String>) -> Self {
        Self { links, context_id }
    }

    /// Creates a context with `fields` (each must match the caller's `write`
    /// whitelist) and returns its handle; the service generates the id.
    pub(crate) async fn create(
        links: Arc<Links>,
        tier: ContextTier,
        fields: BTreeMap<String, String>,
    ) -> Result<Self, CallError> {
        let mut handle = Self::new(links, None);
        let mut client = handle.client()?;
        let request = handle.authed(ctxpb::CreateRequest {
            context_id: String::new(),
            tier: tier.as_str().to_string(),
            fields_json: fields.into_iter().collect(),
        })?;
        let created = client.create(request).await.map_err(status_error)?.into_inner();
        handle.context_id = Some(created.context_id);
        Ok(handle)
    }

    /// The context's id (`None` when the request carried none): pass it as
    /// a call's `context_id` so the agents serving it share the context.
    pub fn id(&self) -> Option<&str> {
        self.context_id.as_deref()
    }

    fn client(&self) -> Result<ContextsClient<Channel>, CallError> {
        self.links.context.clone().ok_or_else(|| {
            CallError::new(
                "NO_CONTEXT_SERVICE",
                "built without a context service URL: call .context_service(URL)",
            )
        })
    }

    fn parts(&self) -> Result<(ContextsClient<Channel>, String), CallError> {
        let client = self.client()?;
        let id = self
            .context_id
            .clone()
            .ok_or_else(|| CallError::new("NO_CONTEXT", "this request carries no context_id"))?;
        Ok((client, id))
    }

    fn authed<T>(&self, message: T) -> Result<tonic::Request<T>, CallError> {
        let mut request = tonic::Request::new(message);
        let value = format!("Bearer {}", self.links.token)
            .parse()
            .map_err(|_| CallError::new("INVALID_TOKEN", "the agent's token is not a valid header value"))?;
        request.metadata_mut().insert("authorization", value);
        // W3C trace context in gRPC metadata, so the context service's span joins the trace.
        let traceparent = agent_reach_telemetry::propagation::traceparent(&tracing::Span::current());
        if let Some(value) = traceparent.and_then(|text| text.parse().ok()) {
            request.metadata_mut().insert("traceparent", value);
        }
        Ok(request)
    }

    /// Reads `fields` (all the reader may see when empty).
    pub async fn get(&self, fields: &[&str]) -> Result<ContextSnapshot, CallError> {
        let (mut client, context_id) = self.parts()?;
        let request = self.authed(ctxpb::GetRequest {
            context_id,
            fields: fields.iter().map(|field| field.to_string()).collect(),
        })?;
        let answer = client.get(request).await.map_err(status_error)?.into_inner();
        let mut out = BTreeMap::new();
        for (name, json) in answer.fields_json {
            let value = serde_json::from_str(&json)
                .map_err(|error| CallError::new("INVALID_CONTEXT_VALUE", format!("field `{name}`: {error}")))?;
            out.insert(name, value);
        }
        Ok(ContextSnapshot {
            version: answer.version,
            fields: out,
        })
    }

    /// Closes (deletes) the context at once, for every agent of the session
    /// (DESIGN §4.2): its creator, or an agent with `write: ["*"]`, may
    /// (`FORBIDDEN` otherwise); `CONTEXT_NOT_FOUND` when it is already gone.
    ///
    /// ```
    /// use agent_reach_sdk::{handler, Ctx, HandlerError};
    ///
    /// #[handler(capability = "reply.write", version = "1.0.0")]
    /// async fn reply(ctx: Ctx, text: String) -> Result<String, HandlerError> {
    ///     // The last agent of the conversation: nobody needs its context any more.
    ///     ctx.context().close().await?;
    ///     Ok(text)
    /// }
    /// ```
    pub async fn close(&self) -> Result<(), CallError> {
        let (mut client, context_id) = self.parts()?;
        let request = self.authed(ctxpb::CloseRequest { context_id })?;
        client.close(request).await.map_err(status_error)?;
        Ok(())
    }

    /// Starts a patch: set and delete fields, optionally only if the version still matches.
    pub fn patch(&self) -> ContextPatch<'_> {
        ContextPatch {
            handle: self,
            set: BTreeMap::new(),
            delete: Vec::new(),
            if_version: None,
        }
    }
}

/// A pending context patch; [`ContextPatch::send`] applies it atomically.
pub struct ContextPatch<'a> {
    handle: &'a ContextHandle,
    set: BTreeMap<String, String>,
    delete: Vec<String>,
    if_version: Option<u64>,
}

impl ContextPatch<'_> {
    pub fn set(mut self, field: &str, value: impl Serialize) -> Self {
        let json = serde_json::to_string(&value).unwrap_or_else(|_| "null".to_string());
        self.set.insert(field.to_string(), json);
        self
    }

    pub fn delete(mut self, field: &str) -> Self {
        self.delete.push(field.to_string());
        self
    }

    /// Apply only if the context is still at `version` (else `VERSION_CONFLICT`).
    pub fn if_version(mut self, version: u64) -> Self {
        self.if_version = Some(version);
        self
    }

    /// Applies the patch; returns the new version.
    pub async fn send(self) -> Result<u64, CallError> {
        let (mut client, context_id) = self.handle.parts()?;
        let request = self.handle.authed(ctxpb::PatchRequest {
            context_id,
            set_json: self.set.into_iter().collect(),
            delete: self.delete,
            if_version: self.if_version,
        })?;
        Ok(client.patch(request).await.map_err(status_error)?.into_inner().version)
    }
}

fn status_error(status: tonic::Status) -> CallError {
    let code = status
        .metadata()
        .get("x-agent-reach-code")
        .and_then(|value| value.to_str().ok())
        .map_or_else(|| format!("{:?}", status.code()).to_uppercase(), str::to_string);
    CallError {
        retryable: matches!(status.code(), tonic::Code::Unavailable),
        code,
        message: status.message().to_string(),
        status: None,
        details: None,
    }
}
