//! The trail's read API (DESIGN §9, issue 37), for `operators` and
//! `auditors`: a collaboration's records by request, session or run
//! (`GET /v1/trail`, also as a tree of hops), and a chain's records and
//! signed heads as stored, for `agent-reach trail verify` to check on its
//! own side. Every read is this tenant's own store: another tenant's trail
//! is not reachable from here.

use std::sync::Arc;

use agent_reach_pipeline::answer::refused;
use agent_reach_pipeline::call::identify::Identified;
use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_trail::{Index, Record, TrailStore};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::ConsoleState;

/// Records one `GET /v1/trail` answers at most (the rest by `cursor`).
const MAX_LIMIT: usize = 1000;
/// Records an index is read for at most: one collaboration, however long.
const MAX_RECORDS: usize = 10_000;

fn invalid_query(message: String) -> RouterError {
    RouterError::new(Code::InvalidQuery, format!("invalid query: {message}"))
}

/// The store and the reader's right to it: a trail reader of this tenant.
fn reader(
    state: &ConsoleState,
    identified: &Identified,
    headers: &HeaderMap,
) -> Result<Arc<dyn TrailStore>, RouterError> {
    let (caller, _) = identified.operator(headers)?;
    state.service.admission().authorize_trail_reader(&caller)?;
    match state.tasks.as_ref().and_then(|tasks| tasks.trail_store()) {
        Some(store) => Ok(store),
        None => Err(RouterError::new(
            Code::TrailDisabled,
            "this router keeps no trail: start it with --redis (and --trail on, the default)",
        )),
    }
}

fn store_failed(error: String) -> RouterError {
    RouterError::new(
        Code::TaskStoreUnavailable,
        format!("the trail's store did not answer: {error}"),
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrailQuery {
    session_id: Option<String>,
    run_id: Option<String>,
    request_id: Option<String>,
    /// Where the previous page ended (its `next_cursor`).
    cursor: Option<String>,
    limit: Option<usize>,
    /// `tree`: the records as a tree of hops (`tree`) beside the list.
    view: Option<String>,
}

/// `GET /v1/trail?session_id=|run_id=|request_id=`: the records of one
/// collaboration, oldest first, every replica's; `view=tree` adds the tree.
pub async fn records(
    State(state): State<ConsoleState>,
    query: Result<Query<TrailQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let store = reader(&state, &identified, &headers)?;
        let Query(query) = query.map_err(|rejection| invalid_query(rejection.body_text()))?;
        let index = match (query.session_id, query.run_id, query.request_id) {
            (Some(id), None, None) => Index::Session(id),
            (None, Some(id), None) => Index::Run(id),
            (None, None, Some(id)) => Index::Request(id),
            _ => {
                return Err(invalid_query(
                    "give exactly one of `session_id`, `run_id` or `request_id`".to_string(),
                ))
            }
        };
        let (_, id) = index.parts();
        if id.is_empty() || id.len() > 256 {
            return Err(invalid_query("an id is 1..=256 characters".to_string()));
        }
        let tree = match query.view.as_deref() {
            None | Some("list") => false,
            Some("tree") => true,
            Some(other) => return Err(invalid_query(format!("`view` is `{other}`; use `list` or `tree`"))),
        };
        let offset = match query.cursor.as_deref() {
            None => 0,
            Some(cursor) => cursor.parse::<usize>().map_err(|_| {
                invalid_query(format!(
                    "`cursor` is `{cursor}`; pass an earlier answer's `next_cursor`"
                ))
            })?,
        };
        let limit = query.limit.unwrap_or(100).clamp(1, MAX_LIMIT);
        let stored = store.records_of(&index, MAX_RECORDS).await.map_err(store_failed)?;
        let mut records = stored
            .iter()
            .map(Record::read)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| RouterError::new(Code::Internal, error))?;
        records.sort_by(|a, b| (a.at_ms, &a.router, a.seq).cmp(&(b.at_ms, &b.router, b.seq)));
        let total = records.len();
        let page: Vec<Record> = records.iter().skip(offset).take(limit).cloned().collect();
        let next = offset + page.len();
        let mut answer = json!({
            "records": page,
            "next_cursor": (next < total).then(|| next.to_string()),
        });
        if tree {
            answer["tree"] = json!(agent_reach_trail::tree::build(records));
        }
        Ok::<_, RouterError>(Json(answer).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}

/// `GET /v1/trail/chains`: every chain of this tenant (a router replica's), newest first.
pub async fn chains(State(state): State<ConsoleState>, identified: Identified, headers: HeaderMap) -> Response {
    let outcome = async {
        let store = reader(&state, &identified, &headers)?;
        let chains = store.chains().await.map_err(store_failed)?;
        Ok::<_, RouterError>(Json(json!({ "chains": chains })).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainQuery {
    /// The stream id after which to read (an earlier answer's `next_after`).
    after: Option<String>,
    limit: Option<usize>,
}

/// A chain's name: the router id it was made by (`r` and hex digits).
fn chain_name(router: &str) -> Result<&str, RouterError> {
    let valid = !router.is_empty() && router.len() <= 64 && router.bytes().all(|byte| byte.is_ascii_alphanumeric());
    if valid {
        Ok(router)
    } else {
        Err(RouterError::new(
            Code::NotFound,
            format!("no trail chain `{router}`: chains are named as `GET /v1/trail/chains` lists them"),
        ))
    }
}

fn stream_id(after: Option<String>) -> Result<Option<String>, RouterError> {
    match after {
        Some(after) => {
            let valid = after.split_once('-').is_some_and(|(ms, seq)| {
                !ms.is_empty()
                    && !seq.is_empty()
                    && ms.bytes().all(|byte| byte.is_ascii_digit())
                    && seq.bytes().all(|byte| byte.is_ascii_digit())
            });
            if valid {
                Ok(Some(after))
            } else {
                Err(invalid_query(format!(
                    "`after` is `{after}`; pass an earlier answer's `next_after` (e.g. `1700000000000-42`)"
                )))
            }
        }
        None => Ok(None),
    }
}

/// The trail, the page's start and its size.
type ChainPage = (Arc<dyn TrailStore>, Option<String>, usize);

/// What both chain listings read first: the trail (for a reader), the page's
/// start (`after`, checked) and its size (1000 by default, 1..=10,000).
fn chain_page(
    state: &ConsoleState,
    identified: &Identified,
    headers: &HeaderMap,
    query: Result<Query<ChainQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<ChainPage, RouterError> {
    let store = reader(state, identified, headers)?;
    let Query(query) = query.map_err(|rejection| invalid_query(rejection.body_text()))?;
    let after = stream_id(query.after)?;
    let limit = query.limit.unwrap_or(1000).clamp(1, 10_000);
    Ok((store, after, limit))
}

/// `GET /v1/trail/chains/{router}/records?after=&limit=`: the chain's
/// records as stored (body and hash), in order.
pub async fn chain_records(
    State(state): State<ConsoleState>,
    Path(router): Path<String>,
    query: Result<Query<ChainQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let (store, after, limit) = chain_page(&state, &identified, &headers, query)?;
        let records = store
            .chain_records(chain_name(&router)?, after.as_deref(), limit)
            .await
            .map_err(store_failed)?;
        let next_after = records.last().map(|record| record.id.clone()).or(after);
        Ok::<_, RouterError>(Json(json!({ "records": records, "next_after": next_after })).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}

/// `GET /v1/trail/chains/{router}/heads?after=&limit=`: the chain's signed segment heads, in order.
pub async fn chain_heads(
    State(state): State<ConsoleState>,
    Path(router): Path<String>,
    query: Result<Query<ChainQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let (store, after, limit) = chain_page(&state, &identified, &headers, query)?;
        let heads = store
            .chain_heads(chain_name(&router)?, after.as_deref(), limit)
            .await
            .map_err(store_failed)?;
        let next_after = heads.last().map(|head| head.id.clone()).or(after);
        Ok::<_, RouterError>(Json(json!({ "heads": heads, "next_after": next_after })).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputsQuery {
    capability: String,
    limit: Option<usize>,
}

/// `GET /v1/trail/inputs?capability=X&limit=N`: the newest records of `X`
/// that hold their input, newest first (what a canary by replay samples).
pub async fn inputs(
    State(state): State<ConsoleState>,
    query: Result<Query<InputsQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let store = reader(&state, &identified, &headers)?;
        let Query(query) = query.map_err(|rejection| invalid_query(rejection.body_text()))?;
        agent_reach_access::acl::check_dotted(&query.capability)
            .map_err(|why| invalid_query(format!("`capability`: {why}")))?;
        let limit = query.limit.unwrap_or(100).clamp(1, MAX_LIMIT);
        let stored = store
            .recent_with_input(&query.capability, limit)
            .await
            .map_err(store_failed)?;
        let records = stored
            .iter()
            .map(Record::read)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| RouterError::new(Code::Internal, error))?;
        Ok::<_, RouterError>(Json(json!({ "records": records })).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}

/// Records `GET /v1/trail/stats` reads at most by default, over every chain.
const STATS_CAP: usize = 20_000;
/// The longest window the figures cover.
const STATS_WINDOW_MAX_MS: u64 = 24 * 3600 * 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsQuery {
    /// The window's start (epoch ms; default an hour ago, at most a day ago).
    since_ms: Option<u64>,
    /// Buckets of the window (default 12, at most 60).
    buckets: Option<usize>,
    /// Records read at most (default 20,000, at most 100,000).
    limit: Option<usize>,
}

/// `GET /v1/trail/stats?since_ms=&buckets=&limit=`: the installation's
/// calls, failure rate and p50/p90/p99 per capability over the window
/// (default the last hour) and in buckets (default 12), from every router
/// replica's trail records. Reads at most `limit` records, newest first and
/// shared among the chains; `capped` says when some were left unread.
pub async fn stats(
    State(state): State<ConsoleState>,
    query: Result<Query<StatsQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let store = reader(&state, &identified, &headers)?;
        let Query(query) = query.map_err(|rejection| invalid_query(rejection.body_text()))?;
        let now = agent_reach_pipeline::clock::epoch_ms();
        let since_ms = query.since_ms.unwrap_or(now.saturating_sub(3600 * 1000));
        if since_ms >= now || now - since_ms > STATS_WINDOW_MAX_MS {
            return Err(invalid_query(format!(
                "`since_ms` is {since_ms}; give a time within the last 24 h (now is {now})"
            )));
        }
        let buckets = query.buckets.unwrap_or(12);
        if !(1..=60).contains(&buckets) {
            return Err(invalid_query(format!("`buckets` is {buckets}; use 1 to 60")));
        }
        let cap = query.limit.unwrap_or(STATS_CAP).clamp(1, 100_000);
        let chains: Vec<_> = store
            .chains()
            .await
            .map_err(store_failed)?
            .into_iter()
            .filter(|chain| chain.last_at_ms >= since_ms)
            .collect();
        // Each chain its share of the cap, so one busy replica does not hide the others.
        let share = (cap / chains.len().max(1)).max(1);
        let mut records = Vec::new();
        let mut capped = false;
        for chain in &chains {
            let stored = store
                .chain_records_since(&chain.router, since_ms, share)
                .await
                .map_err(store_failed)?;
            capped |= stored.len() >= share;
            for stored in &stored {
                // A record that does not parse is `trail verify`'s business, not the figures'.
                if let Ok(record) = Record::read(stored) {
                    records.push(record);
                }
            }
        }
        let window = agent_reach_trail::stats::Window {
            since_ms,
            until_ms: now,
            buckets,
        };
        let oldest_ms = records.iter().map(|record| record.at_ms).min();
        Ok::<_, RouterError>(
            Json(json!({
                "source": "trail",
                "since_ms": since_ms,
                "until_ms": now,
                "bucket_ms": window.bucket_ms(),
                "routers": chains.len(),
                "records_read": records.len(),
                "capped": capped,
                "oldest_read_ms": if capped { oldest_ms } else { None },
                "capabilities": agent_reach_trail::stats::by_capability(&records, window),
            }))
            .into_response(),
        )
    }
    .await;
    outcome.unwrap_or_else(refused)
}
