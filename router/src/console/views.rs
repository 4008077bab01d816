//! The console's reads, for operators: this router's routing view
//! (`GET /v1/routing/instances`, `GET /v1/routing/capabilities`), its recent
//! calls (`GET /v1/requests`, `GET /v1/requests/{request_id}`) and the slow
//! path (`GET /v1/backlog`). Each reads the snapshot, the recent-calls ring
//! or the task store when asked; nothing here runs on the request path.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{operator, ConsoleState};
use crate::answer::refused;
use crate::clock;
use crate::error::{Code, RouterError};
use crate::pipeline::identify::Identified;
use crate::recent::Call;
use crate::select;

/// The window of the capabilities' statistics.
const WINDOW_MS: u64 = 5 * 60 * 1000;

fn invalid_query(rejection: axum::extract::rejection::QueryRejection) -> RouterError {
    RouterError::new(Code::InvalidQuery, format!("invalid query: {}", rejection.body_text()))
}

/// `GET /v1/routing/instances`: every instance in this router's snapshot,
/// by capability and version, with its live state.
pub async fn instances(State(state): State<ConsoleState>, identified: Identified, headers: HeaderMap) -> Response {
    if let Err(error) = operator(state.service.admission(), &identified, &headers) {
        return refused(error);
    }
    let service = &state.service;
    let handle = service.snapshot();
    let staleness = handle.staleness();
    let snapshot = handle.load();
    let scores = snapshot.instance_scores(staleness, service.tuning().max_staleness);
    let limits = service.limits();
    let mut rows = Vec::new();
    let mut names: Vec<&String> = snapshot.capabilities.keys().collect();
    names.sort();
    for name in names {
        let Some(capability) = snapshot.capabilities.get(name) else {
            continue;
        };
        for group in &capability.versions {
            for instance in &group.instances {
                let state = &instance.state;
                let health = scores.get(instance.agent_id.as_str()).map_or(0, |(score, _)| *score);
                rows.push(json!({
                    "agent_id": instance.agent_id,
                    "name": instance.name,
                    "endpoint": instance.endpoint,
                    "capability": name,
                    "version": group.version_text,
                    "status": instance.status.as_str(),
                    "weight": instance.weight,
                    "health": health,
                    "breaker": state.breaker.state().as_str(),
                    "routable": select::routable(instance, &limits).is_some(),
                    "inflight": state.inflight(),
                    "reported_inflight": state.reported_inflight(),
                }));
            }
        }
    }
    Json(json!({
        "snapshot": {
            "revision": snapshot.revision,
            "synced": handle.is_synced(),
            "registry_connected": handle.is_connected(),
            // While connected, every instance listed renewed its lease within its TTL.
            "staleness_ms": u64::try_from(staleness.as_millis()).unwrap_or(u64::MAX),
        },
        "instances": rows,
    }))
    .into_response()
}

/// Calls, failures and latency percentiles of calls within the window.
#[derive(Default)]
struct Stats {
    calls: u64,
    failures: u64,
    durations_us: Vec<u64>,
}

impl Stats {
    fn view(mut self) -> Value {
        self.durations_us.sort_unstable();
        let percentile = |p: f64| -> Value {
            if self.durations_us.is_empty() {
                return Value::Null;
            }
            let rank = ((self.durations_us.len() as f64) * p).ceil() as usize;
            let index = rank.clamp(1, self.durations_us.len()) - 1;
            self.durations_us
                .get(index)
                .map_or(Value::Null, |us| json!(*us as f64 / 1000.0))
        };
        json!({
            "calls": self.calls,
            "failures": self.failures,
            "failure_rate": if self.calls == 0 { 0.0 } else { self.failures as f64 / self.calls as f64 },
            "p50_ms": percentile(0.5),
            "p90_ms": percentile(0.9),
            "p99_ms": percentile(0.99),
        })
    }
}

/// `GET /v1/routing/capabilities`: every capability's versions, traffic
/// split and, from the recent-calls ring, its calls, failure rate and
/// latency over the last five minutes.
pub async fn capabilities(State(state): State<ConsoleState>, identified: Identified, headers: HeaderMap) -> Response {
    if let Err(error) = operator(state.service.admission(), &identified, &headers) {
        return refused(error);
    }
    let service = &state.service;
    let since = clock::epoch_ms().saturating_sub(WINDOW_MS);
    let mut stats: BTreeMap<String, Stats> = BTreeMap::new();
    let mut oldest = u64::MAX;
    service.recent().each(|call: &Call| {
        if call.started_ms < since || call.request_id.is_empty() {
            return;
        }
        oldest = oldest.min(call.started_ms);
        // Shards are held while this runs: no allocation but a capability's first.
        let entry = match stats.get_mut(call.capability.as_str()) {
            Some(entry) => entry,
            None => stats.entry(call.capability.clone()).or_default(),
        };
        entry.calls += 1;
        entry.failures += u64::from(call.code.is_some());
        entry.durations_us.push(call.duration_us);
    });
    let snapshot = service.snapshot().load();
    let limits = service.limits();
    let mut names: Vec<&String> = snapshot.capabilities.keys().collect();
    names.sort();
    let rows: Vec<Value> = names
        .into_iter()
        .filter_map(|name| {
            let capability = snapshot.capabilities.get(name)?;
            let versions: Vec<Value> = capability
                .versions
                .iter()
                .map(|group| {
                    json!({
                        "version": group.version_text,
                        "instances": group.instances.len(),
                        "routable": group.instances.iter().filter(|instance| select::routable(instance, &limits).is_some()).count(),
                        "description": group.described.description,
                    })
                })
                .collect();
            let split = capability.split.as_ref().map(|split| {
                split
                    .shares()
                    .iter()
                    .filter_map(|(index, weight)| {
                        capability
                            .versions
                            .get(*index)
                            .map(|group| json!({ "version": group.version_text, "weight": weight }))
                    })
                    .collect::<Vec<_>>()
            });
            Some(json!({
                "name": name,
                "versions": versions,
                "split": split,
                "stats": stats.remove(name.as_str()).unwrap_or_default().view(),
            }))
        })
        .collect();
    Json(json!({
        "window_s": WINDOW_MS / 1000,
        // The ring is bounded: under load the window covers less than five minutes.
        "ring_capacity": service.recent().capacity(),
        "oldest_call_ms": if oldest == u64::MAX { Value::Null } else { json!(oldest) },
        "capabilities": rows,
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecentQuery {
    limit: Option<usize>,
    /// `failed`: failed calls only.
    outcome: Option<String>,
    capability: Option<String>,
}

/// `GET /v1/requests?limit=N&outcome=failed&capability=C`: this router's
/// recent calls, newest first.
pub async fn recent(
    State(state): State<ConsoleState>,
    query: Result<Query<RecentQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = (|| {
        operator(state.service.admission(), &identified, &headers)?;
        let Query(query) = query.map_err(invalid_query)?;
        let failed_only = match query.outcome.as_deref() {
            None | Some("any") => false,
            Some("failed") => true,
            Some(other) => {
                return Err(RouterError::new(
                    Code::InvalidQuery,
                    format!("invalid query: `outcome` is `{other}`; use `failed` or `any`"),
                ))
            }
        };
        let limit = query.limit.unwrap_or(50).clamp(1, 1000);
        let mut calls = state.service.recent().find(
            |call| {
                !call.request_id.is_empty()
                    && (!failed_only || call.code.is_some())
                    && query
                        .capability
                        .as_deref()
                        .is_none_or(|wanted| wanted == call.capability)
            },
            Call::view,
        );
        calls.truncate(limit);
        Ok::<_, RouterError>(
            Json(json!({
                "calls": calls.into_iter().map(|(_, view)| view).collect::<Vec<_>>(),
                "ring_capacity": state.service.recent().capacity(),
            }))
            .into_response(),
        )
    })();
    outcome.unwrap_or_else(refused)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestQuery {
    /// The caller that submitted it: finds its task even when the ring holds no call yet.
    caller: Option<String>,
}

/// `GET /v1/requests/{request_id}`: every call with that id this router
/// still holds (a task's deliveries are several), and the task record when
/// the call was a task's.
pub async fn request(
    State(state): State<ConsoleState>,
    Path(request_id): Path<String>,
    query: Result<Query<RequestQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        operator(state.service.admission(), &identified, &headers)?;
        let Query(query) = query.map_err(invalid_query)?;
        if request_id.is_empty() || request_id.len() > 128 {
            return Err(RouterError::field(
                Code::InvalidQuery,
                "request_id",
                "a request id is 1 to 128 characters",
            ));
        }
        let mut task_ids = Vec::new();
        let mut callers: Vec<String> = query.caller.into_iter().collect();
        let calls: Vec<Value> = state
            .service
            .recent()
            .find(|call| call.request_id == request_id, Call::view)
            .into_iter()
            .map(|(_, view)| view)
            .collect();
        for call in &calls {
            if let Some(task_id) = call["task_id"].as_str() {
                if !task_ids.iter().any(|known: &String| known == task_id) {
                    task_ids.push(task_id.to_string());
                }
            }
            if let Some(caller) = call["caller"].as_str() {
                callers.push(caller.to_string());
            }
        }
        let mut task = Value::Null;
        if let Some(tasks) = &state.tasks {
            // A task submitted here but not yet delivered (or delivered by another router) is
            // found by its caller and request id when the ring knows the caller.
            if task_ids.is_empty() {
                for caller in &callers {
                    if let Ok(Some(task_id)) = tasks.store().find(caller, &request_id).await {
                        task_ids.push(task_id);
                        break;
                    }
                }
            }
            if let Some(task_id) = task_ids.first() {
                task = match tasks.store().get(task_id).await {
                    Ok(found) => crate::tasks::task_view(&found),
                    Err(error) => json!({ "task_id": task_id, "error": error.to_string() }),
                };
            }
        }
        if calls.is_empty() && task.is_null() {
            return Err(RouterError::new(
                Code::NotFound,
                format!(
                    "no call with request id `{request_id}` among this router's last {} calls; it may be older, or answered by another router replica",
                    state.service.recent().capacity()
                ),
            )
            .with_details(json!({ "reason": "request_not_found", "request_id": request_id })));
        }
        Ok::<_, RouterError>(Json(json!({ "request_id": request_id, "calls": calls, "task": task })).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}

/// `GET /v1/backlog`: the slow path at a glance: tasks waiting by
/// capability and priority, tasks running (claimed, not yet finished) by
/// priority, and the dead letters' count.
pub async fn backlog(State(state): State<ConsoleState>, identified: Identified, headers: HeaderMap) -> Response {
    let outcome = async {
        operator(state.service.admission(), &identified, &headers)?;
        let Some(tasks) = &state.tasks else {
            return Err(RouterError::new(
                Code::TasksDisabled,
                "this router runs without the slow path (start it with --redis)",
            ));
        };
        let store = tasks.store();
        let unavailable = |error: agent_reach_task_store::TaskStoreError| {
            RouterError::new(Code::TaskStoreUnavailable, format!("the task store: {error}"))
        };
        let waiting = store.backlog().await.map_err(unavailable)?;
        let running = store.running().await.map_err(unavailable)?;
        let dead_letters = store.dead_letter_count().await.map_err(unavailable)?;
        Ok::<_, RouterError>(
            Json(json!({
                "waiting": waiting.iter().map(|((capability, priority), count)| json!({
                    "capability": capability, "priority": priority.as_str(), "count": count
                })).collect::<Vec<_>>(),
                "running": running.iter().map(|(priority, count)| json!({
                    "priority": priority.as_str(), "count": count
                })).collect::<Vec<_>>(),
                "dead_letters": dead_letters,
            }))
            .into_response(),
        )
    }
    .await;
    outcome.unwrap_or_else(refused)
}
