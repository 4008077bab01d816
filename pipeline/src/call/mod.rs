//! The call pipeline every door shares. A request is identified once
//! ([`identify`]); a door that takes an envelope reads it through the one
//! [`prelude`] (body limit, strict parse, the request-id rule, the trace);
//! a protocol door (A2A, MCP) builds its envelope with
//! `crate::envelope::call` and its [`Call`] with [`Call::begin`]. The call is
//! then admitted once (`crate::admission`) and its attempts run through the
//! one loop ([`attempts`]), whether its answer is read whole or streamed.

pub(crate) mod attempts;
pub mod identify;
pub mod prelude;

use agent_reach_access::Caller;
use agent_reach_serving::HeaderLookup;
use agent_reach_telemetry::spans::{self, Head, KeyValue};

use crate::answer::Known;
use crate::clock;
use crate::envelope::CheckedRequest;
use crate::trace::{HexId, TraceContext};

/// `gen_ai.provider.name` of the router's spans: the GenAI conventions'
/// custom value for a system that is not a model vendor.
pub const GEN_AI_PROVIDER: &str = "agent_reach";

/// How a call enters the router, which decides how its caller's limits apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// A caller's own request (invoke, broadcast): it spends a token and takes
    /// a place in flight, or is refused 429 `RATE_LIMITED`.
    Call,
    /// A task's delivery: its submission spent the token, and the worker holds
    /// its place in flight ([`crate::admission::Admission::enter_delivery`]).
    Delivery,
}

/// A call on its way in: who asked, through which entry, what, under which
/// ids and trace, and when it arrived (its deadline counts from then).
pub struct Call {
    pub caller: Caller,
    pub entry: Entry,
    pub checked: CheckedRequest,
    /// The request id when the envelope names none (made once, inline).
    fresh_id: HexId<{ agent_reach_trail::request_id::LEN }>,
    pub trace: TraceContext,
    pub received: clock::Now,
    /// The door it came through (`Door::as_str`), or `delivery` for a task's delivery.
    pub door: &'static str,
    /// The call the caller (an agent) serves while it makes this one, when it says so.
    pub upstream: Option<crate::delegation::Upstream>,
    /// The delegation chain, once admission has checked it (names, original
    /// subject first; set only for a chained call): the trail records it.
    pub chain: std::sync::OnceLock<Vec<String>>,
}

/// Which door a call came through: the name of its request span and a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// `POST /v1/invoke`, answered whole.
    Invoke,
    /// `POST /v1/invoke` asking for events.
    Stream,
    /// `POST /v1/broadcast`.
    Broadcast,
    /// `POST /v1/tasks` (the submission; its delivery is a call of its own).
    Tasks,
    /// An A2A message.
    A2a,
    /// An MCP tool call.
    Mcp,
}

impl Door {
    pub fn as_str(self) -> &'static str {
        match self {
            Door::Invoke => "invoke",
            Door::Stream => "stream",
            Door::Broadcast => "broadcast",
            Door::Tasks => "tasks",
            Door::A2a => "a2a",
            Door::Mcp => "mcp",
        }
    }

    /// The GenAI conventions' operation its request span stands for: an MCP
    /// `tools/call` executes a tool, every other door invokes an agent.
    fn gen_ai_operation(self) -> &'static str {
        match self {
            Door::Mcp => "execute_tool",
            _ => "invoke_agent",
        }
    }

    /// Whether its calls get a request span of their own: the ones answered
    /// now (a task's submission is traced at its delivery, a broadcast by
    /// its members' attempts under the caller's trace).
    fn is_traced(self) -> bool {
        matches!(self, Door::Invoke | Door::Stream | Door::A2a | Door::Mcp)
    }
}

impl Call {
    /// A caller's call through `door`, arrived at `received`: its trace
    /// continues the caller's `traceparent` (else the seeds' `trace_id` in
    /// the envelope, else a fresh one), and its request span starts here
    /// when the configured sampler keeps it. With tracing off, or for a
    /// request left out of the sample, no span is built at all.
    pub fn begin(
        door: Door,
        caller: Caller,
        checked: CheckedRequest,
        headers: &impl HeaderLookup,
        received: clock::Now,
    ) -> Self {
        let fresh_id = HexId::request(received.epoch_ms);
        let header = headers.value("traceparent");
        let mut incoming = header.and_then(|value| std::str::from_utf8(value).ok());
        let mut trace = TraceContext::from_header(header);
        // The seeds' `trace_id`, honoured when no `traceparent` came.
        let named;
        if let (None, Some(trace_id)) = (incoming, checked.request.trace_id.as_deref()) {
            trace = TraceContext::from_caller_trace_id(trace_id);
            named = trace.as_incoming();
            incoming = Some(&named);
        }
        let mut call = Self {
            caller,
            entry: Entry::Call,
            checked,
            fresh_id,
            trace,
            received,
            door: door.as_str(),
            upstream: crate::delegation::Upstream::from_headers(headers),
            chain: std::sync::OnceLock::new(),
        };
        if door.is_traced() {
            call.start_span(door, incoming);
        }
        call
    }

    /// A task's delivery on behalf of `caller`: admitted as a delivery, its
    /// trace the one its envelope names (its attempts' spans go under the
    /// `tracing` span the delivery runs in).
    pub fn delivery(caller: Caller, checked: CheckedRequest) -> Self {
        let trace = match checked.request.trace_id.as_deref() {
            Some(trace_id) => TraceContext::from_caller_trace_id(trace_id),
            None => TraceContext::from_header(None),
        };
        let received = clock::Now::read();
        Self {
            fresh_id: HexId::request(received.epoch_ms),
            caller,
            entry: Entry::Delivery,
            checked,
            trace,
            received,
            door: "delivery",
            upstream: None,
            chain: std::sync::OnceLock::new(),
        }
    }

    /// The request id: the caller's (checked: 1-128 printable characters) or a fresh one.
    pub fn request_id(&self) -> &str {
        self.checked
            .request
            .request_id
            .as_deref()
            .unwrap_or(self.fresh_id.as_str())
    }

    /// What the failed result envelope of this call says of it.
    pub fn known(&self) -> Known {
        Known {
            request_id: self.request_id().to_string(),
            capability: Some(self.checked.request.capability.clone()),
            started: self.received.instant,
        }
    }

    /// The request span, named and attributed as the OpenTelemetry GenAI
    /// conventions say (`invoke_agent {capability}`; an MCP tool call is
    /// `execute_tool {capability}`), with the router's own attributes beside.
    fn start_span(&mut self, door: Door, incoming: Option<&str>) {
        let capability = &self.checked.request.capability;
        let operation = door.gen_ai_operation();
        let head = spans::start_request(operation, incoming, &self.trace.trace_id, || {
            let subject = match door {
                Door::Mcp => "gen_ai.tool.name",
                _ => "gen_ai.agent.name",
            };
            let mut attributes = vec![
                KeyValue::new("gen_ai.operation.name", operation),
                KeyValue::new("gen_ai.provider.name", GEN_AI_PROVIDER),
                KeyValue::new(subject, capability.clone()),
                KeyValue::new("trace_id", self.trace.trace_id.to_string()),
                KeyValue::new("request_id", self.request_id().to_string()),
                KeyValue::new(
                    "session_id",
                    self.checked.request.session_id.clone().unwrap_or_default(),
                ),
                KeyValue::new("capability", self.checked.request.capability.clone()),
                KeyValue::new("caller", self.caller.name().unwrap_or("").to_string()),
                KeyValue::new("door", door.as_str()),
            ];
            if let Some(session_id) = &self.checked.request.session_id {
                attributes.push(KeyValue::new("gen_ai.conversation.id", session_id.clone()));
            }
            attributes
        });
        match head {
            Head::Sampled(span) => {
                span.rename(format!("{operation} {capability}"));
                self.trace.span = Some(span);
            }
            // Spans are exported but this request is not in the sample: the next hop learns so.
            Head::NotSampled => self.trace.sampled = false,
            Head::Off => {}
        }
    }
}
