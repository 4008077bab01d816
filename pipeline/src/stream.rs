//! Streamed invoke (DESIGN §8, "Streaming"): a call admitted like any other
//! ([`crate::admission`]), forwarded with `Accept: text/event-stream`, whose
//! answer reaches the caller event by event as the agent writes it.
//!
//! [`open`] runs the attempt loop up to the agent's answer head: until then a
//! failure is an ordinary one (retried elsewhere by the [`crate::retry`]
//! rules, or answered as the failed result envelope). Once the agent answers
//! 2xx the call is committed: [`EventStream`] yields the agent's events as
//! they complete, and its end (`Ok` with the summary, or the error that cut
//! it short); nothing is retried once a byte may have reached the caller. The
//! deadline bounds the whole stream. Dropping the stream (the caller went
//! away) drops the agent's connection, which cancels its request.
//!
//! The front doors render the events: `/v1/invoke` relays them unchanged
//! ([`relay`]), the A2A adapter wraps them in its own stream responses.
//!
//! Streams take their connections from the forwarder's pool
//! ([`crate::forward`], the same TLS rules as every attempt) and hold one for
//! their whole life; it goes back only when the agent's answer was read to
//! its end, never after an error, the deadline or a caller that left.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use agent_reach_serving::front::Answer;
use agent_reach_serving::{HeaderLookup, RequestBody};
use bytes::Bytes;
use serde_json::{json, Value};

use crate::call::attempts::{self, Answered, Exchange, Outbound, Sent, Targets};
use crate::call::identify::Identified;
use crate::call::{prelude, Call, Door};
use crate::error::{Code, RouterError};
use crate::forward::{AgentBody, AttemptResult, Opened};
use crate::health::OwnedInflight;
use crate::limits::Permit;
use crate::metrics::{CapabilityMetrics, StreamChildren};
use crate::outcome::Failure;
use crate::recent::{Finished, RecentCalls, Tried};
use crate::service::RouterService;
use crate::trail::{Ending, TrailHook};
use agent_reach_serving::sse::{self, EventSplitter};
use agent_reach_trail::Entry;

/// What one step moves of the agent's bytes before the first event.
const FIRST_READ_BYTES: usize = 256;

/// At most how many of the agent's bytes one step decodes: before the first
/// event a little at a time (it goes out before the chunks behind it are
/// decoded), then all there are.
fn most_moved(first: bool) -> usize {
    if first {
        FIRST_READ_BYTES
    } else {
        usize::MAX
    }
}

/// The stream's end, if what [`AgentBody::read_into`] answered is one: the
/// body ended (inside an event, or between them) or the connection broke.
/// `None`: bytes were moved, read on.
fn ended<T>(read: Result<bool, String>, splitter: &EventSplitter, summary: &Summary) -> Option<Item<T>> {
    match read {
        Ok(true) => None,
        Ok(false) if splitter.pending() > 0 => Some(Item::End(Err(interrupted(
            summary,
            "the agent ended its answer inside an event".to_string(),
        )))),
        Ok(false) => Some(Item::End(Ok(summary.clone()))),
        Err(why) => Some(Item::End(Err(interrupted(
            summary,
            format!("the connection broke: {why}"),
        )))),
    }
}

/// What is known of a committed stream, for its end (`event: result`).
#[derive(Debug, Clone)]
pub struct Summary {
    pub capability: String,
    pub capability_version: String,
    pub agent_id: String,
    pub attempts: u32,
    /// Events relayed so far.
    pub events: u64,
}

/// One step of a committed stream.
pub enum Item<T = sse::Event> {
    /// An event of the agent's, whole (or, from [`EventStream::next_run`],
    /// a run of them).
    Event(T),
    /// The stream ended: the agent finished, or the error that cut it short
    /// (the deadline, the agent's `event: error`, a broken connection).
    End(Result<Summary, RouterError>),
}

/// The agent's answer body as a stream of events.
enum Source {
    /// The agent answers server-sent events.
    /// (Dropping the body closes its connection: the agent's request is cancelled.)
    Events { body: AgentBody, splitter: EventSplitter },
    /// The agent answered JSON: its output is the one event.
    Whole(Option<Bytes>),
}

/// A committed stream: its events, then its end. Holds the caller's place in
/// flight and the instance's until dropped.
pub struct EventStream {
    source: Source,
    summary: Summary,
    /// The deadline's one timer (and so the deadline), registered by the
    /// first attempt and dropped with the stream (no timer set and cleared
    /// per read).
    expiry: Pin<Box<tokio::time::Sleep>>,
    received: Instant,
    first_event: FirstEvent,
    ended: bool,
    /// Events relayed and not yet added to the events counter.
    uncounted: u64,
    metrics: Arc<StreamChildren>,
    capability_metrics: CapabilityMetrics,
    /// What the recent-calls ring records of the call once the stream ends,
    /// with the call's trace (its request span ends with the stream).
    record: Record,
    /// The instance's place in flight while its answer streams (none for a whole answer).
    _inflight: Option<OwnedInflight>,
    _permit: Permit,
}

/// A streamed call as the recent-calls ring records it when its stream
/// ends (a stream outlives the request that opened it, so it is owned).
struct Record {
    recent: Arc<RecentCalls>,
    request_id: String,
    caller: Option<Arc<str>>,
    session_id: Option<String>,
    trace: crate::trace::TraceContext,
    started_ms: u64,
    tried: Tried,
    /// The trail's entry, begun when the stream opened, and where it goes.
    trail: Option<(Arc<TrailHook>, Entry<'static>)>,
}

impl Record {
    fn of(service: &RouterService, call: Call, tried: Tried) -> Self {
        let trail = service.trail().map(|hook| {
            let payloads = service.admission().records_payloads(&call.checked.request.capability);
            (hook.clone(), hook.begin(&call, payloads).into_owned())
        });
        Self {
            trail,
            recent: service.recent().clone(),
            request_id: call.request_id().to_string(),
            caller: match &call.caller {
                agent_reach_access::Caller::Agent { name, .. } => Some(name.clone()),
                agent_reach_access::Caller::Unauthenticated => None,
            },
            session_id: call.checked.request.session_id,
            trace: call.trace,
            started_ms: call.received.epoch_ms,
            tried,
        }
    }

    /// Records the stream's end (`error`: how it failed), once.
    fn finish(&mut self, summary: &Summary, received: Instant, error: Option<&RouterError>) {
        if let (Some(span), Some(error)) = (&self.trace.span, error) {
            span.fail(error.code.as_str());
        }
        if let Some(error) = error {
            tracing::info!(
                message = "Invocation failed.",
                trace_id = %self.trace.trace_id, request_id = %self.request_id,
                session_id = self.session_id.as_deref().unwrap_or(""),
                capability = %summary.capability,
                code = error.code.as_str(), error = %error.message, events = summary.events
            );
        }
        let duration_us = u64::try_from(received.elapsed().as_micros()).unwrap_or(u64::MAX);
        if let Some((hook, entry)) = self.trail.take() {
            // A stream's output is its events, relayed and not kept: the entry holds no output.
            let ending = Ending {
                version: Some(&summary.capability_version),
                error,
                success: None,
                duration_us,
            };
            let mut entry = crate::trail::finish(&hook, entry, &ending, &self.tried);
            entry.output = None;
            hook.recorder.offer(entry);
        }
        self.recent.record(
            &Finished {
                request_id: &self.request_id,
                task_id: None,
                capability: &summary.capability,
                version: Some(&summary.capability_version),
                caller: self.caller.as_deref(),
                session_id: self.session_id.as_deref(),
                trace_id: &self.trace.trace_id,
                entry: "call",
                started_ms: self.started_ms,
                duration_us,
                error: error.map(|error| (error.code.as_str(), error.message.as_str())),
            },
            std::mem::take(&mut self.tried),
        );
    }
}

/// Where a stream is with its first event, for the time-to-first-event
/// histogram.
#[derive(Clone, Copy)]
enum FirstEvent {
    /// Nothing relayed yet.
    Awaited,
    /// Handed out at this time, observed at the next step: after the event
    /// was written, not on the way to it.
    Unobserved(Instant),
    Observed,
}

impl EventStream {
    fn committed(
        service: &RouterService,
        (source, summary): (Source, Summary),
        (expiry, received): (Pin<Box<tokio::time::Sleep>>, Instant),
        capability_metrics: CapabilityMetrics,
        (inflight, permit): (Option<OwnedInflight>, Permit),
        record: Record,
    ) -> Self {
        Self {
            metrics: capability_metrics.streams(&service.metrics().streams, &summary.capability),
            source,
            summary,
            expiry,
            received,
            first_event: FirstEvent::Awaited,
            ended: false,
            uncounted: 0,
            capability_metrics,
            record,
            _inflight: inflight,
            _permit: permit,
        }
    }

    /// Whether the agent answered one JSON output rather than events (its
    /// output is then the one event's data, not an item of a stream).
    pub fn is_whole(&self) -> bool {
        matches!(self.source, Source::Whole(_))
    }

    /// The next event, or the end; `None` after the end.
    pub async fn next(&mut self) -> Option<Item> {
        self.step().await
    }

    /// [`EventStream::next`], but every plain event already read comes at
    /// once, as one [`sse::Run`] (a relay then copies them once, not one by one).
    pub async fn next_run(&mut self) -> Option<Item<sse::Run>> {
        self.step().await
    }

    async fn step<C: Cutting>(&mut self) -> Option<Item<C>> {
        if self.ended {
            return None;
        }
        self.observe_first_event();
        // An event already read needs no deadline timer (one per event was
        // most of its cost), nor do the bytes read and not yet decoded (the
        // first event's usually came with the answer's head).
        let first = matches!(self.first_event, FirstEvent::Awaited);
        let ready = match &mut self.source {
            Source::Events { body, splitter } => ready(body, splitter, &self.summary, first),
            Source::Whole(_) => None,
        };
        let item = match ready {
            Some(item) => Some(item),
            None => {
                let pulled = pull::<C>(
                    &mut self.source,
                    &self.summary,
                    (self.expiry.deadline().into_std(), first),
                    &self.metrics.events,
                    &mut self.uncounted,
                );
                tokio::select! {
                    biased;
                    item = pulled => Some(item),
                    () = self.expiry.as_mut() => None,
                }
            }
        };
        let item = item.unwrap_or_else(|| deadline_passed(&self.summary));
        let events = match &item {
            Item::Event(piece) => piece.events(),
            Item::End(result) => {
                self.ended = true;
                count_events(&self.metrics.events, &mut self.uncounted);
                self.metrics.duration.observe(self.received.elapsed().as_secs_f64());
                self.capability_metrics
                    .record(result.as_ref().map(|_| ()).map_err(|error| error.code));
                self.record.finish(&self.summary, self.received, result.as_ref().err());
                0
            }
        };
        if events > 0 {
            self.summary.events += events;
            // Counted once per read of the agent's, not per event: one
            // shared counter's atomic add per event was measurable.
            self.uncounted += events;
            if first {
                self.first_event = FirstEvent::Unobserved(Instant::now());
            }
        }
        Some(item)
    }

    fn observe_first_event(&mut self) {
        if let FirstEvent::Unobserved(at) = self.first_event {
            self.first_event = FirstEvent::Observed;
            self.metrics
                .first_event
                .observe(at.saturating_duration_since(self.received).as_secs_f64());
        }
    }
}

/// The next event or run (or the stream's end) from the bytes already read,
/// cut or still to decode; `None` when the next needs a read of the agent's
/// connection. `first`: nothing was relayed yet.
fn ready<C: Cutting>(
    body: &mut AgentBody,
    splitter: &mut EventSplitter,
    summary: &Summary,
    first: bool,
) -> Option<Item<C>> {
    loop {
        if let Some(item) = buffered(splitter, summary, first) {
            return Some(item);
        }
        let read = body.read_buffered(splitter.input(), most_moved(first)).transpose()?;
        if let Some(end) = ended(read, splitter, summary) {
            return Some(end);
        }
    }
}

/// The next event or run read from the agent (or the stream's end); the
/// caller bounds it by the deadline. `first`: nothing was relayed yet.
async fn pull<C: Cutting>(
    source: &mut Source,
    summary: &Summary,
    (deadline, first): (Instant, bool),
    events: &prometheus::IntCounter,
    uncounted: &mut u64,
) -> Item<C> {
    match source {
        Source::Whole(output) => match output.take() {
            Some(data) => Item::Event(C::from_event(sse::Event::message(
                String::from_utf8_lossy(&data).into_owned(),
            ))),
            None => Item::End(Ok(summary.clone())),
        },
        // Called when `ready` found nothing left in the bytes already read.
        Source::Events { body, splitter } => loop {
            // An agent whose bytes are always ready would never let the timer fire
            // (the read is polled first): the deadline is checked per read.
            if Instant::now() >= deadline {
                return deadline_passed(summary);
            }
            count_events(events, uncounted);
            let read = body.read_into(splitter.input(), most_moved(first)).await;
            if let Some(end) = ended(read, splitter, summary) {
                return end;
            }
            if let Some(item) = ready(body, splitter, summary, first) {
                return item;
            }
        },
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        self.observe_first_event();
        count_events(&self.metrics.events, &mut self.uncounted);
        // Dropped before its end: the caller went away (or its front door gave up).
        if !self.ended {
            self.metrics.disconnects.inc();
            self.metrics.duration.observe(self.received.elapsed().as_secs_f64());
            let left = RouterError::new(
                Code::StreamInterrupted,
                format!(
                    "the caller went away after {} event(s); the agent's request was cancelled",
                    self.summary.events
                ),
            );
            self.record.finish(&self.summary, self.received, Some(&left));
        }
    }
}

/// Adds the events relayed since the last time to the counter.
fn count_events(counter: &prometheus::IntCounter, uncounted: &mut u64) {
    if *uncounted > 0 {
        counter.inc_by(*uncounted);
        *uncounted = 0;
    }
}

fn deadline_passed<T>(summary: &Summary) -> Item<T> {
    Item::End(Err(RouterError::new(
        Code::DeadlineExceeded,
        format!(
            "the deadline passed after {} event(s); the agent's request was cancelled",
            summary.events
        ),
    )))
}

/// What a stream's events are read as: one [`sse::Event`] at a time, or
/// [`sse::Run`]s of them.
trait Cutting: Sized {
    /// The next piece ready in `splitter`: one of these, or an event that
    /// is checked on its own (`Err`: every event, or one that is not plain).
    /// `first`: nothing was relayed yet (the first event goes alone, so the
    /// caller gets it before the ones behind it are cut).
    fn cut(splitter: &mut EventSplitter, first: bool) -> Result<Option<Result<Self, sse::Event>>, sse::TooLarge>;
    /// An event that passed the checks, as one of these.
    fn from_event(event: sse::Event) -> Self;
    /// The events it holds.
    fn events(&self) -> u64;
}

impl Cutting for sse::Event {
    fn cut(splitter: &mut EventSplitter, _first: bool) -> Result<Option<Result<Self, sse::Event>>, sse::TooLarge> {
        Ok(splitter.next_event()?.map(Err))
    }

    fn from_event(event: sse::Event) -> Self {
        event
    }

    fn events(&self) -> u64 {
        1
    }
}

impl Cutting for sse::Run {
    fn cut(splitter: &mut EventSplitter, first: bool) -> Result<Option<Result<Self, sse::Event>>, sse::TooLarge> {
        if first {
            return Ok(splitter.next_event()?.map(Err));
        }
        Ok(splitter.next_cut()?.map(|cut| match cut {
            sse::Cut::Run(run) => Ok(run),
            sse::Cut::One(event) => Err(event),
        }))
    }

    fn from_event(event: sse::Event) -> Self {
        sse::Run {
            raw: event.raw,
            events: 1,
        }
    }

    fn events(&self) -> u64 {
        self.events
    }
}

/// The next event or run (or the end it signals) among the bytes already read.
fn buffered<C: Cutting>(splitter: &mut EventSplitter, summary: &Summary, first: bool) -> Option<Item<C>> {
    loop {
        return match C::cut(splitter, first) {
            Ok(Some(Ok(piece))) => Some(Item::Event(piece)),
            Ok(Some(Err(event))) if event.name == "error" => Some(Item::End(Err(agent_error_event(&event, summary)))),
            // Comments and keep-alives are the agent's business, not the caller's.
            Ok(Some(Err(event))) if event.is_comment_only() => continue,
            Ok(Some(Err(event))) => Some(Item::Event(C::from_event(event))),
            Ok(None) => None,
            Err(sse::TooLarge) => Some(Item::End(Err(interrupted(
                summary,
                format!("an event of the agent's exceeds {} bytes", sse::MAX_EVENT_BYTES),
            )))),
        };
    }
}

/// `event: error` from the agent: its own failure after events were relayed.
fn agent_error_event(event: &sse::Event, summary: &Summary) -> RouterError {
    let data = event.data();
    let body: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
    let error = body.get("error").unwrap_or(&body);
    let agent_code = error.get("code").and_then(Value::as_str).unwrap_or("");
    let message = error.get("message").and_then(Value::as_str).map_or_else(
        || format!("the agent ended its stream with an error: {data}"),
        str::to_string,
    );
    RouterError::new(Code::AgentError, message).with_details(json!({
        "agent_code": agent_code, "agent_id": summary.agent_id, "events": summary.events,
    }))
}

fn interrupted(summary: &Summary, why: String) -> RouterError {
    RouterError::new(
        Code::StreamInterrupted,
        format!(
            "the stream from `{}` ended abnormally after {} event(s): {why}; not retried (part of the answer was delivered)",
            summary.agent_id, summary.events
        ),
    )
    .with_details(json!({ "agent_id": summary.agent_id, "events": summary.events }))
}

/// Streamed answers: each attempt asks for events and stops at the answer's
/// head, every attempt and then the stream's reads bounded by the deadline's
/// one timer.
struct Events {
    expiry: Pin<Box<tokio::time::Sleep>>,
}

impl Exchange for Events {
    type Committed = (AgentBody, OwnedInflight);

    async fn attempt(&mut self, outbound: Outbound<'_>) -> Sent<Self::Committed> {
        let instance = outbound.instance;
        // Held while the answer streams: the stream takes it on.
        let inflight = instance.state.start_owned();
        let opening =
            outbound
                .forwarder
                .open_stream(&instance.uri, &outbound.body, &outbound.headers, outbound.started);
        tokio::select! {
            biased;
            opened = opening => match opened {
                Opened::Events(body) => Sent::Committed((body, inflight)),
                Opened::Other(result) => Sent::Answered(result),
            },
            () = self.expiry.as_mut() => Sent::Answered(AttemptResult::TimedOut),
        }
    }
}

impl RouterService {
    /// A call to one instance whose answer streams: admitted as every call
    /// to one instance is (an unpinned call follows the split), its attempts
    /// run by the one loop up to an agent's answer head. Until then a
    /// failure is an ordinary one; once an agent commits, its events follow
    /// ([`EventStream`]), and an agent that answered JSON gives its output as
    /// the one event. The call is recorded when its stream ends.
    pub async fn stream(&self, call: Call) -> Result<EventStream, Failure> {
        let snapshot = self.snapshot().load_full();
        let admitted = match self.admission().admit(&call, &snapshot) {
            Ok(admitted) => admitted,
            Err(refused) if refused.failure.error.code == Code::CapabilityNotFound => {
                return match snapshot.workflows.get(&call.checked.request.capability) {
                    Some(routed) => self.stream_workflow(call, routed.workflow.clone()).await,
                    None => Err(self.refused(&call, refused)),
                };
            }
            Err(refused) => return Err(self.refused(&call, refused)),
        };
        let capability = admitted.capability;
        let capability_metrics = capability.metrics.clone();
        let version = admitted.group.version_text.clone();
        let mut tried = Tried::new();
        // The deadline's timer, for every attempt and then the stream's reads.
        let mut events = Events {
            expiry: Box::pin(tokio::time::sleep_until(admitted.deadline.into())),
        };
        let answered = attempts::run(self.means(), &call, &admitted, Targets::Select, &mut events, &mut tried).await;
        let summary = |agent_id: String, attempts: u32| Summary {
            capability: capability.name.clone(),
            capability_version: version.clone(),
            agent_id,
            attempts,
            events: 0,
        };
        let (source, summary, inflight) = match answered {
            Ok(Answered::Committed {
                committed: (body, inflight),
                agent_id,
                attempts,
            }) => {
                let source = Source::Events {
                    body,
                    splitter: EventSplitter::default(),
                };
                (source, summary(agent_id, attempts), Some(inflight))
            }
            Ok(Answered::Done(success)) => {
                // The whole answer is in: the instance's place is free again.
                let data = Bytes::from(success.output.as_deref().map_or("null", |raw| raw.get()).to_string());
                (
                    Source::Whole(Some(data)),
                    summary(success.agent_id, success.attempts),
                    None,
                )
            }
            Err(failure) => {
                capability_metrics.record(Err(failure.error.code));
                self.failed(&call, &failure);
                let recorded =
                    crate::service::Recorded::of(&call, failure.capability_version.as_deref(), Some(&failure.error));
                self.remember(&recorded, tried);
                return Err(failure);
            }
        };
        let received = call.received.instant;
        let permit = admitted.permit;
        Ok(EventStream::committed(
            self,
            (source, summary),
            (events.expiry, received),
            capability_metrics,
            (inflight, permit),
            Record::of(self, call, tried),
        ))
    }
}

impl RouterService {
    /// A workflow's call asked for events: its run's answer is the one
    /// event, as a capability's JSON answer to a streaming request is.
    async fn stream_workflow(
        &self,
        call: Call,
        workflow: Arc<agent_reach_workflows::Workflow>,
    ) -> Result<EventStream, Failure> {
        let version = workflow.version.to_string();
        let capability_metrics = self.metrics().capability(&workflow.name);
        let success = match self.start_workflow(&call, &workflow).await {
            Ok(success) => success,
            Err(failure) => {
                capability_metrics.record(Err(failure.error.code));
                self.failed(&call, &failure);
                self.remember(
                    &crate::service::Recorded::of(&call, Some(&version), Some(&failure.error)),
                    Tried::new(),
                );
                return Err(failure);
            }
        };
        let data = Bytes::from(success.output.as_deref().map_or("null", |raw| raw.get()).to_string());
        let summary = Summary {
            capability: workflow.name.clone(),
            capability_version: version,
            agent_id: success.agent_id,
            attempts: success.attempts,
            events: 0,
        };
        let expiry = Box::pin(tokio::time::sleep(std::time::Duration::from_secs(3600)));
        let received = call.received.instant;
        Ok(EventStream::committed(
            self,
            (Source::Whole(Some(data)), summary),
            (expiry, received),
            capability_metrics,
            (None, Permit::unlimited()),
            Record::of(self, call, Tried::new()),
        ))
    }
}

/// The `/v1/invoke` rendering of a committed stream: each of the agent's
/// events as it wrote it, then `event: result` (the result envelope without
/// `output`) or `event: error` (`{code, message, retryable, details?}`).
pub fn relay(stream: EventStream, request_id: String, started: Instant) -> axum::body::Body {
    let events = futures::stream::unfold(Some((stream, request_id)), move |state| async move {
        let (mut stream, request_id) = state?;
        match stream.next_run().await? {
            Item::Event(run) => Some((Ok::<_, Infallible>(run.raw), Some((stream, request_id)))),
            Item::End(end) => {
                let last = match end {
                    Ok(summary) => sse::event(
                        "result",
                        &json!({
                            "version": agent_reach_proto::envelope::ENVELOPE_VERSION,
                            "request_id": request_id,
                            "status": "succeeded",
                            "capability": summary.capability,
                            "capability_version": summary.capability_version,
                            "agent_id": summary.agent_id,
                            "attempts": summary.attempts,
                            "events": summary.events,
                            "duration_ms": started.elapsed().as_millis() as u64,
                        })
                        .to_string(),
                    ),
                    Err(error) => sse::event(
                        "error",
                        &serde_json::to_string(&error.envelope_error())
                            .unwrap_or_else(|_| format!("{{\"code\":\"{}\",\"message\":\"\"}}", error.code.as_str())),
                    ),
                };
                // Ended: nothing follows (the stream and the agent's connection are dropped).
                Some((Ok(last), None))
            }
        }
    });
    axum::body::Body::from_stream(events)
}

/// A streamed invoke's headers.
const EVENTS_HEADERS: &[(&str, &str)] = &[
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache"),
    // Proxies in front of the router must not buffer the stream either.
    ("x-accel-buffering", "no"),
];

/// `POST /v1/invoke` with `Accept: text/event-stream`: identified, read and
/// checked by the envelope doors' prelude (every refusal the same failed
/// result envelope with its status), then streamed ([`RouterService::stream`])
/// and [`relay`]ed. Failures before the agent committed are ordinary error
/// envelopes; after, `event: error`.
pub async fn answer(
    service: &RouterService,
    identified: Identified,
    headers: &impl HeaderLookup,
    body: RequestBody,
) -> Answer {
    let call = match prelude::envelope(service, identified, headers, body, Door::Stream).await {
        Ok(envelope) => envelope.call,
        Err(refusal) => return refusal.answer(),
    };
    let known = call.known();
    let (request_id, started) = (known.request_id.clone(), call.received.instant);
    match service.stream(call).await {
        Ok(stream) => Answer::Stream {
            headers: EVENTS_HEADERS,
            body: relay(stream, request_id, started),
        },
        Err(failure) => crate::answer::failed_answer(known, failure),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> Summary {
        Summary {
            capability: "bench.tokens".to_string(),
            capability_version: "1.0.0".to_string(),
            agent_id: "a-1".to_string(),
            attempts: 1,
            events: 0,
        }
    }

    /// Before anything was relayed the first event comes alone, however many
    /// are ready; after it, every plain event ready comes as one run, and
    /// `event: error` ends the stream (the events before it relayed first).
    #[test]
    fn the_first_event_goes_alone_then_runs_then_the_error() {
        let mut splitter = EventSplitter::default();
        splitter.input().extend_from_slice(
            b"data: 1\n\ndata: 2\n\n: ping\n\ndata: 3\n\ndata: 4\n\nevent: error\ndata: {\"code\":\"X\"}\n\n",
        );
        let mut pieces = Vec::new();
        let mut first = true;
        while let Some(item) = buffered::<sse::Run>(&mut splitter, &summary(), first) {
            match item {
                Item::Event(run) => {
                    pieces.push(format!(
                        "{}:{}",
                        run.events,
                        String::from_utf8_lossy(&run.raw).trim_end()
                    ));
                    first = false;
                }
                Item::End(end) => {
                    pieces.push(format!("end {:?}", end.map(|_| ()).map_err(|error| error.code)));
                    break;
                }
            }
        }
        assert_eq!(
            pieces,
            [
                "1:data: 1",
                // The comment ends a run and is dropped.
                "1:data: 2",
                "2:data: 3\n\ndata: 4",
                "end Err(AgentError)",
            ]
        );
    }
}
