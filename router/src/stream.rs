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

use agent_reach_access::Caller;
use agent_reach_serving::front::Answer;
use bytes::Bytes;
use serde_json::{json, Value};

use crate::admission::{Admitted, Entry, Refused};
use crate::clock;
use crate::envelope::CheckedRequest;
use crate::error::{Code, RouterError};
use crate::forward::{AgentBody, AttemptResult, ForwardHeaders, Opened};
use crate::health::{Observation, OwnedInflight};
use crate::json::Forwarded;
use crate::limits::Permit;
use crate::metrics::{CapabilityMetrics, StreamChildren};
use crate::outcome::{attempts_details, classify, exhausted, no_instance, Failure, LastFailure, Outcome};
use crate::retry;
use crate::schema;
use crate::select;
use crate::service::{log_transition, RouterService};
use crate::snapshot::{Instance, VersionGroup};
use crate::sse::{self, EventSplitter};
use crate::trace::TraceContext;

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
    /// The instance's place in flight while its answer streams (none for a whole answer).
    _inflight: Option<OwnedInflight>,
    _permit: Permit,
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
        source: Source,
        summary: Summary,
        (expiry, received): (Pin<Box<tokio::time::Sleep>>, Instant),
        capability_metrics: CapabilityMetrics,
        (inflight, permit): (Option<OwnedInflight>, Permit),
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

/// One attempt: POSTs `body` to `instance` asking for events, until its
/// answer's head: the events' body, or anything else as the forwarder reports it.
async fn attempt(
    service: &RouterService,
    instance: &Instance,
    body: &[u8],
    traceparent: &[u8],
    authorization: &str,
    started: Instant,
) -> Opened {
    let headers = ForwardHeaders {
        traceparent,
        authorization: authorization.as_bytes(),
    };
    service
        .forwarder()
        .open_stream(&instance.uri, body, &headers, started)
        .await
}

/// Admits `checked` and runs the attempt loop until an agent commits to an
/// answer: the stream of its events, or the failure (with what is known for
/// the failed result envelope). `received` is the request's clock reading.
pub async fn open(
    service: &RouterService,
    caller: &Caller,
    checked: &CheckedRequest,
    request_id: &str,
    trace: &TraceContext,
    received: clock::Now,
) -> Result<EventStream, Failure> {
    let snapshot = service.snapshot().load_full();
    let admitted = match service.admission().admit(
        caller,
        Entry::Call,
        &checked.request,
        checked.version_req.as_ref(),
        &snapshot,
        received,
    ) {
        Ok(admitted) => admitted,
        Err(Refused { failure, capability }) => {
            match capability {
                Some(capability) => capability.metrics.record(Err(failure.error.code)),
                None => service.metrics().record_rejected(failure.error.code),
            }
            return Err(*failure);
        }
    };
    let Admitted {
        capability,
        group,
        deadline_ms,
        deadline,
        permit,
    } = admitted;
    let group: Arc<VersionGroup> = group.clone();
    let capability_metrics = capability.metrics.clone();
    let fail = |error: RouterError, agent_id: Option<String>, attempts: u32| {
        capability_metrics.record(Err(error.code));
        Failure {
            error,
            capability_version: Some(group.version_text.clone()),
            agent_id,
            attempts,
        }
    };
    service.budget().deposit();
    let mut envelope = Forwarded::new(
        &checked.request,
        request_id,
        (&capability.name, &group.version_text),
        caller,
        deadline_ms,
        0,
    );
    let traceparent = trace.forward_header();
    let limits = service.limits();
    let mut tried: smallvec::SmallVec<[usize; 10]> = smallvec::SmallVec::new();
    let mut failures: Vec<LastFailure> = Vec::new();
    // The deadline's timer, for every attempt and then the stream's reads.
    let mut expiry = Box::pin(tokio::time::sleep_until(deadline.into()));
    loop {
        let attempt_number = tried.len() as u32 + 1;
        let picked = select::pick(
            &group,
            checked.policy,
            checked.request.session_id.as_deref(),
            &tried,
            &limits,
        )
        .map(|(index, _)| index);
        let Some(index) = picked else {
            return Err(if failures.is_empty() {
                fail(no_instance(capability, &group), None, 0)
            } else {
                fail(
                    exhausted(&failures),
                    failures.last().map(|failure| failure.agent_id.clone()),
                    attempt_number - 1,
                )
            });
        };
        tried.push(index);
        let instance = group.instances[index].clone();
        envelope.attempt = attempt_number;
        let authorization = match service
            .assertions()
            .header(
                caller,
                &instance.agent_id,
                &capability.name,
                deadline_ms,
                received.epoch_ms,
            )
            .map_err(crate::service::assertion_failed)
        {
            Ok(header) => header,
            Err(error) => return Err(fail(error, Some(instance.agent_id.clone()), attempt_number - 1)),
        };
        let body = match envelope.to_vec() {
            Ok(body) => body,
            Err(error) => {
                return Err(fail(
                    RouterError::new(Code::InvalidEnvelope, format!("payload cannot be forwarded: {error}")),
                    None,
                    attempt_number - 1,
                ))
            }
        };
        let inflight = instance.state.start_owned();
        let started = Instant::now();
        // A timeout within a budget shorter than the instance ever needs is the caller's, not its fault.
        let fair = instance.state.fair_budget(deadline.saturating_duration_since(started));
        let attempted = tokio::select! {
            biased;
            attempted = attempt(service, &instance, &body, &traceparent, &authorization, started) => attempted,
            () = expiry.as_mut() => Opened::Other(AttemptResult::TimedOut),
        };
        let elapsed = started.elapsed();
        let agent_id = instance.agent_id.clone();
        let result = match attempted {
            Opened::Events(body) => {
                let transition = instance.state.observe(Observation::Healthy(elapsed), service.breaker());
                log_transition(transition, &agent_id, trace, request_id);
                let source = Source::Events {
                    body,
                    splitter: EventSplitter::default(),
                };
                let summary = Summary {
                    capability: capability.name.clone(),
                    capability_version: group.version_text.clone(),
                    agent_id,
                    attempts: attempt_number,
                    events: 0,
                };
                return Ok(EventStream::committed(
                    service,
                    source,
                    summary,
                    (expiry, received.instant),
                    capability_metrics.clone(),
                    (Some(inflight), permit),
                ));
            }
            Opened::Other(result) => result,
        };
        drop(inflight);
        capability.metrics.forward_seconds.observe(elapsed.as_secs_f64());
        let (observation, outcome) = classify(result, elapsed, fair);
        log_transition(
            instance.state.observe(observation, service.breaker()),
            &agent_id,
            trace,
            request_id,
        );
        let reason = match outcome {
            Outcome::Done(output) => {
                if let Err(error) = schema::check_output(&group, output.as_deref(), &agent_id) {
                    instance.state.count_output_mismatch();
                    return Err(fail(error, Some(agent_id), attempt_number));
                }
                let data = Bytes::from(output.as_deref().map_or("null", |raw| raw.get()).to_string());
                let summary = Summary {
                    capability: capability.name.clone(),
                    capability_version: group.version_text.clone(),
                    agent_id,
                    attempts: attempt_number,
                    events: 0,
                };
                // The whole answer is in: the instance's place is free again.
                return Ok(EventStream::committed(
                    service,
                    Source::Whole(Some(data)),
                    summary,
                    (expiry, received.instant),
                    capability_metrics.clone(),
                    (None, permit),
                ));
            }
            // A 202 answers only a task's delivery, and a stream is never one.
            Outcome::Accepted => {
                return Err(fail(
                    crate::outcome::accepted_without_task(),
                    Some(agent_id),
                    attempt_number,
                ))
            }
            Outcome::Fatal(error) => return Err(fail(error, Some(agent_id), attempt_number)),
            Outcome::Retryable(reason, detail) => {
                failures.push(LastFailure {
                    reason,
                    agent_id: agent_id.clone(),
                    detail,
                });
                reason
            }
        };
        if attempt_number >= service.tuning().max_attempts {
            return Err(fail(exhausted(&failures), Some(agent_id), attempt_number));
        }
        let pause = retry::backoff(attempt_number);
        if Instant::now() + pause >= deadline {
            return Err(fail(
                RouterError::new(
                    Code::DeadlineExceeded,
                    format!(
                        "no time left to retry after {attempt_number} attempt(s); last: {}",
                        reason.as_str()
                    ),
                )
                .with_details(attempts_details(&failures)),
                Some(agent_id),
                attempt_number,
            ));
        }
        if !service.budget().try_withdraw() {
            service.metrics().retry_budget_exhausted.inc();
            let mut error = exhausted(&failures);
            error.message = format!(
                "retry budget exhausted (retries are capped to protect agents); {}",
                error.message
            );
            return Err(fail(error, Some(agent_id), attempt_number));
        }
        service.metrics().retries.with_label_values(&[reason.as_str()]).inc();
        tokio::time::sleep(pause).await;
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

/// `POST /v1/invoke` with `Accept: text/event-stream`: authenticated, parsed
/// and checked as `/v1/invoke` is (every refusal the same failed result
/// envelope with its status), then [`open`]ed and [`relay`]ed. Failures before
/// the agent committed are ordinary error envelopes; after, `event: error`.
pub async fn answer(
    service: &RouterService,
    headers: &impl agent_reach_serving::HeaderLookup,
    body: agent_reach_serving::RequestBody,
) -> Answer {
    use crate::answer::{failed_answer as failed, Known};
    let received = clock::Now::read();
    let mut known = Known::fresh(received.instant);
    let caller = match service.authenticate_at(headers, received.epoch_ms) {
        Ok(caller) => caller,
        Err(error) => return failed(known, error.into()),
    };
    let read = match body {
        agent_reach_serving::RequestBody::Unread(body) => {
            crate::envelope::read_body(headers, body, service.tuning().max_body_bytes).await
        }
        agent_reach_serving::RequestBody::Read(bytes) => Ok(bytes),
    };
    let checked = match read {
        Ok(bytes) => crate::envelope::parse(&bytes).and_then(|request| {
            if let Some(id) = request
                .request_id
                .clone()
                .filter(|id| !id.is_empty() && id.len() <= 128)
            {
                known.request_id = id;
            }
            known.capability = Some(request.capability.clone());
            crate::envelope::check(request)
        }),
        Err(error) => Err(error),
    };
    let checked = match checked {
        Ok(checked) => checked,
        Err(error) => {
            service.metrics().record_rejected(error.code);
            return failed(known, error.into());
        }
    };
    // The seeds' `trace_id` is honoured when no `traceparent` came, as on the JSON path.
    let trace = match (headers.value("traceparent"), checked.request.trace_id.as_deref()) {
        (None, Some(trace_id)) => TraceContext::from_caller_trace_id(trace_id),
        (header, _) => TraceContext::from_header(header),
    };
    let request_id = known.request_id.clone();
    match open(service, &caller, &checked, &request_id, &trace, received).await {
        Ok(stream) => Answer::Stream {
            headers: EVENTS_HEADERS,
            body: relay(stream, request_id, received.instant),
        },
        Err(failure) => {
            tracing::info!(
                message = "Streamed invocation failed before the agent answered.",
                trace_id = %trace.trace_id, request_id = %request_id,
                session_id = checked.request.session_id.as_deref().unwrap_or(""),
                capability = %checked.request.capability,
                code = failure.error.code.as_str(), error = %failure.error.message,
            );
            failed(known, failure)
        }
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
