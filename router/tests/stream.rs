//! Streamed invoke (DESIGN §8, "Streaming") against a real etcd, registry and
//! real streaming HTTP agents: events reach the caller one by one while the
//! agent still holds its answer open (ordering, not timing, proves it: the
//! second event exists only after the test releases the agent), the result
//! or error ends the stream, a caller that goes away cancels the agent's
//! request, the deadline bounds the whole stream, and https:// agents stream
//! over verified TLS.

use crate::support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

/// One server-sent event as the caller sees it.
#[derive(Debug)]
struct Event {
    name: String,
    data: String,
}

impl Event {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|error| panic!("event data is not JSON ({error}): {self:?}"))
    }
}

/// Reads a streamed answer event by event.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

impl Events {
    /// The next whole event, waiting at most 10 s for it; `None` at the end of the answer.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let raw: String = self.buffer.drain(..end + 2).collect();
                let mut name = "message".to_string();
                let mut data = Vec::new();
                for line in raw.lines() {
                    if let Some(value) = line.strip_prefix("event: ") {
                        name = value.to_string();
                    } else if let Some(value) = line.strip_prefix("data: ") {
                        data.push(value.to_string());
                    }
                }
                return Some(Event {
                    name,
                    data: data.join("\n"),
                });
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.response.chunk())
                .await
                .expect("an event within 10 s")
                .expect("the stream reads");
            match chunk {
                Some(bytes) => self.buffer.push_str(std::str::from_utf8(&bytes).expect("utf-8 events")),
                None => {
                    assert!(
                        self.buffer.trim().is_empty(),
                        "stream ended inside an event: {:?}",
                        self.buffer
                    );
                    return None;
                }
            }
        }
    }
}

/// POSTs `envelope` as `CALLER` asking for events; the response, not yet read.
async fn stream(cluster: &Cluster, envelope: Value) -> reqwest::Response {
    cluster
        .client
        .post(cluster.url("/v1/invoke"))
        .bearer_auth(token(CALLER))
        .header("accept", "text/event-stream")
        .json(&envelope)
        .send()
        .await
        .expect("streamed invoke")
}

fn content_type(response: &reqwest::Response) -> Option<&str> {
    response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
}

async fn open_events(cluster: &Cluster, envelope: Value) -> Events {
    let response = stream(cluster, envelope).await;
    assert_eq!(response.status(), 200);
    assert_eq!(content_type(&response), Some("text/event-stream"));
    Events {
        response,
        buffer: String::new(),
    }
}

fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_arrive_one_by_one_while_the_agent_holds_its_answer_then_the_result() {
    let cluster = Cluster::start().await;
    let agent = cluster.agent(AgentSpec::new("sa-1", 1, Behaviour::StreamHeld));
    cluster.wait_for_instances(&["sa-1"]).await;

    let mut events = open_events(&cluster, order("SO-1")).await;
    // The first event is here while the agent is still parked before its second:
    // the router relays, it does not buffer.
    let first = events.next().await.expect("first event");
    assert_eq!((first.name.as_str(), first.json()), ("token", json!({ "n": 1 })));
    assert_eq!(
        agent.seen.streams_finished.load(Ordering::SeqCst),
        0,
        "agent still streaming"
    );
    assert_eq!(
        agent.seen.last_accept.lock().unwrap().as_deref(),
        Some("text/event-stream")
    );
    agent.release.notify_one();
    let second = events.next().await.expect("second event");
    assert_eq!((second.name.as_str(), second.json()), ("token", json!({ "n": 2 })));
    let result = events.next().await.expect("result event");
    assert_eq!(result.name, "result", "{result:?}");
    let result = result.json();
    assert_eq!(result["status"], "succeeded");
    assert_eq!(result["agent_id"], "sa-1");
    assert_eq!(result["capability"], CAPABILITY);
    assert_eq!(result["capability_version"], "1.0.0");
    assert_eq!(result["attempts"], 1);
    assert_eq!(result["events"], 2);
    assert!(result.get("output").is_none(), "the events were the output: {result}");
    assert!(events.next().await.is_none(), "nothing after the result");

    let metrics = cluster.metrics().await;
    let label = format!("{{capability=\"{CAPABILITY}\"}}");
    assert_eq!(
        metric(&metrics, &format!("agent_reach_router_stream_events_total{label}")),
        2.0
    );
    assert_eq!(
        metric(
            &metrics,
            &format!("agent_reach_router_stream_first_event_seconds_count{label}")
        ),
        1.0
    );
    assert_eq!(
        metric(
            &metrics,
            &format!("agent_reach_router_stream_duration_seconds_count{label}")
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_goes_away_cancels_the_agents_request() {
    let cluster = Cluster::start().await;
    let agent = cluster.agent(AgentSpec::new("sc-1", 1, Behaviour::StreamHeld));
    cluster.wait_for_instances(&["sc-1"]).await;

    let mut events = open_events(&cluster, order("SO-2")).await;
    assert_eq!(events.next().await.expect("first event").name, "token");
    drop(events);
    let seen = agent.seen.clone();
    let cancelled = eventually(Duration::from_secs(10), || {
        let seen = seen.clone();
        async move { seen.streams_cancelled.load(Ordering::SeqCst) == 1 }
    })
    .await;
    assert!(cancelled, "the agent's answer was not cancelled when the caller left");
    assert_eq!(agent.seen.streams_finished.load(Ordering::SeqCst), 0);
    let metrics_have_it = eventually(Duration::from_secs(10), || async {
        let metrics = cluster.metrics().await;
        metric(&metrics, "agent_reach_router_stream_disconnects_total") == 1.0
    })
    .await;
    assert!(metrics_have_it, "disconnect not counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_after_the_first_event_arrive_as_error_events_and_are_not_retried() {
    let cluster = Cluster::start().await;
    let failing = cluster.agent(AgentSpec::new("se-1", 1, Behaviour::StreamThenError));
    cluster.wait_for_instances(&["se-1"]).await;

    // The agent's own `event: error`: relayed as the router's error event, with its code.
    let mut events = open_events(&cluster, order("SO-3")).await;
    assert_eq!(events.next().await.expect("first event").json(), json!({ "n": 1 }));
    let error = events.next().await.expect("error event");
    assert_eq!(error.name, "error", "{error:?}");
    let error = error.json();
    assert_eq!(error["code"], "AGENT_ERROR", "{error}");
    assert_eq!(error["message"], "the model gave up");
    assert_eq!(error["details"]["agent_code"], "MODEL_OVERLOADED");
    assert_eq!(error["details"]["agent_id"], "se-1");
    assert_eq!(error["details"]["events"], 1);
    assert!(events.next().await.is_none());
    assert_eq!(failing.hits(), 1, "not retried once an event was relayed");

    // A connection cut inside the answer: STREAM_INTERRUPTED, not retried on
    // the other instance (unpinned calls go to the highest version, 2.0.0).
    let mut spec = AgentSpec::new("sb-1", 1, Behaviour::StreamThenBreak);
    spec.version = "2.0.0".to_string();
    let breaking = cluster.agent(spec);
    cluster.wait_for_instances(&["sb-1", "se-1"]).await;
    let mut events = open_events(&cluster, order("SO-4")).await;
    assert_eq!(events.next().await.expect("first event").name, "token");
    breaking.release.notify_one();
    let error = events.next().await.expect("error event");
    assert_eq!(error.name, "error");
    let error = error.json();
    assert_eq!(error["code"], "STREAM_INTERRUPTED", "{error}");
    assert_eq!(error["details"]["agent_id"], "sb-1");
    assert_eq!(error["details"]["events"], 1);
    assert_eq!(error["retryable"], true, "the caller may call again: {error}");
    assert!(events.next().await.is_none());
    assert_eq!(
        (failing.hits(), breaking.hits()),
        (1, 1),
        "no retry after the first event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_bounds_the_whole_stream() {
    let cluster = Cluster::start().await;
    let agent = cluster.agent(AgentSpec::new("sd-1", 1, Behaviour::StreamHeld));
    cluster.wait_for_instances(&["sd-1"]).await;

    let mut envelope = order("SO-5");
    envelope["timeout_ms"] = json!(500);
    let mut events = open_events(&cluster, envelope).await;
    assert_eq!(events.next().await.expect("first event").name, "token");
    // Never released: the deadline ends it.
    let error = events.next().await.expect("error event");
    assert_eq!(error.name, "error", "{error:?}");
    assert_eq!(error.json()["code"], "DEADLINE_EXCEEDED");
    assert!(events.next().await.is_none());
    let seen = agent.seen.clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let seen = seen.clone();
            async move { seen.streams_cancelled.load(Ordering::SeqCst) == 1 }
        })
        .await,
        "the agent's request was not cancelled at the deadline"
    );
}

/// The deadline passing before any agent answered (one instance refusing,
/// the other never answering its head) is the ordinary failed envelope: one
/// timer bounds every attempt, not each its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_passed_before_the_agent_answered_is_an_ordinary_envelope() {
    let cluster = Cluster::start().await;
    let _unavailable = cluster.agent(AgentSpec::new("sh-1", 1, Behaviour::Unavailable));
    let _hanging = cluster.agent(AgentSpec::new("sh-2", 1, Behaviour::Hang));
    cluster.wait_for_instances(&["sh-1", "sh-2"]).await;

    let mut envelope = order("SO-8");
    envelope["timeout_ms"] = json!(400);
    envelope["request_id"] = json!("req-stream-deadline");
    let response = stream(&cluster, envelope).await;
    assert_eq!(response.status(), 504);
    assert_eq!(content_type(&response), Some("application/json"));
    let body: Value = response.json().await.expect("a JSON envelope");
    assert_eq!(body["status"], "failed", "{body}");
    assert_eq!(body["error"]["code"], "DEADLINE_EXCEEDED", "{body}");
    assert_eq!(body["request_id"], "req-stream-deadline", "{body}");
}

/// An agent whose next events are always ready (it never pauses) cannot
/// outrun the deadline: the router checks it per read, not only while waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_pauses_cannot_outrun_the_deadline() {
    let cluster = Cluster::start().await;
    let agent = cluster.agent(AgentSpec::new("sf-1", 1, Behaviour::StreamFlood));
    cluster.wait_for_instances(&["sf-1"]).await;

    let mut envelope = order("SO-6");
    envelope["timeout_ms"] = json!(300);
    let mut events = open_events(&cluster, envelope).await;
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        let mut last = None;
        while let Some(event) = events.next().await {
            last = Some(event);
        }
        last
    })
    .await
    .expect("the stream outlived its deadline by far");
    let last = read.expect("events before the end");
    assert_eq!(last.name, "error", "{last:?}");
    assert_eq!(last.json()["code"], "DEADLINE_EXCEEDED", "{last:?}");
    let seen = agent.seen.clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let seen = seen.clone();
            async move { seen.streams_cancelled.load(Ordering::SeqCst) == 1 }
        })
        .await,
        "the agent's request was not cancelled at the deadline"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_before_the_first_event_are_ordinary_envelopes_and_json_answers_become_one_event() {
    let cluster = Cluster::start().await;

    // Refused before any agent: the failed result envelope with its status.
    let response = stream(&cluster, json!({ "capability": "no.such", "payload": {} })).await;
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "CAPABILITY_NOT_FOUND");
    let response = cluster
        .client
        .post(cluster.url("/v1/invoke"))
        .header("accept", "text/event-stream")
        .json(&order("SO-6"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);

    // An instance that fails before answering is retried elsewhere (no byte reached the caller yet).
    let unavailable = cluster.agent(AgentSpec::new("su-1", 1, Behaviour::Unavailable));
    let echo = cluster.agent(AgentSpec::new("sj-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["sj-1", "su-1"]).await;
    let response = stream(&cluster, json!({ "capability": CAPABILITY, "payload": { "count": 0 } })).await;
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "SCHEMA_MISMATCH", "{body}");
    for n in 0..2 {
        let mut events = open_events(&cluster, order(&format!("SO-7-{n}"))).await;
        // A JSON answer to a streaming request: one `message` event with its output.
        let message = events.next().await.expect("message event");
        assert_eq!(message.name, "message");
        assert_eq!(message.json()["echo"]["order_id"], format!("SO-7-{n}"));
        let result = events.next().await.expect("result event");
        assert_eq!(result.name, "result");
        let result = result.json();
        assert_eq!(result["agent_id"], "sj-1");
        assert_eq!(result["events"], 1);
        assert!(events.next().await.is_none());
    }
    assert!(unavailable.hits() >= 1, "the unavailable instance was tried");
    assert_eq!(echo.hits(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_agents_stream_over_verified_tls() {
    let pki = agent_reach_testkit::pki::Pki::new("stream-agents");
    let cluster = Cluster::start().await;
    let mut spec = AgentSpec::new("st-1", 1, Behaviour::StreamHeld);
    spec.tls = Some(AgentTls {
        cert: pki.server("st-1"),
        client_ca: None,
    });
    let agent = cluster.agent(spec);
    let (router, addr) = cluster
        .another_router(|settings| settings.agent_tls.ca = Some(pki.ca_file.clone()))
        .await;
    let routed = eventually(Duration::from_secs(20), || {
        let router = router.clone();
        async move { router.routed_agent_ids().iter().any(|id| id == "st-1") }
    })
    .await;
    assert!(routed, "st-1 never reached the router's snapshot");
    let response = cluster
        .client
        .post(format!("http://{addr}/v1/invoke"))
        .bearer_auth(token(CALLER))
        .header("accept", "text/event-stream")
        .json(&order("SO-TLS"))
        .send()
        .await
        .expect("streamed invoke");
    assert_eq!(response.status(), 200);
    let mut events = Events {
        response,
        buffer: String::new(),
    };
    assert_eq!(events.next().await.expect("first event").json(), json!({ "n": 1 }));
    agent.release.notify_one();
    assert_eq!(events.next().await.expect("second event").json(), json!({ "n": 2 }));
    let result = events.next().await.expect("result");
    assert_eq!(result.name, "result", "{result:?}");
    assert_eq!(result.json()["agent_id"], "st-1");
}
