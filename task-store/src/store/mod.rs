//! Durable tasks on Redis: one server, the primary Sentinel names, or a Redis
//! Cluster (DESIGN §3.10.9, §7.8).
//!
//! Every task lives in one of [`LANES`] lanes: the first hex digit of its id.
//! [`TaskStore::task_id_for`] picks it from the tenant and capability, so one
//! capability's tasks share a lane. Each lane's keys carry the lane's hash
//! tag (`{q41}`, `{q63}`, …: [`agent_reach_stores::slot::spread_tag`], slots
//! spaced evenly), so every script touching a task, its queue, the backlog
//! and the callback schedule is one slot of a Redis Cluster, while the lanes
//! spread over the cluster's shards. Under `{prefix}:{tenant}` (`{L}` a lane's tag):
//! - `task:{L}:{id}` — hash: `spec` (immutable JSON: envelope, caller,
//!   callback …), `state`, `attempts`, `updated_at_ms`, `transitions` (JSON
//!   lines), `result`.
//! - `queue:{L}:{capability}:{priority}` — a stream per capability and
//!   priority, consumer group `workers`. An entry is acknowledged only by the
//!   script that records the task's outcome, so a worker that dies mid-task
//!   leaves it pending for another worker to reclaim; nothing is acknowledged
//!   on receipt.
//! - `queues:{L}` — set: the lane's queue streams (what reclaim reads).
//! - `backlog:{L}` — hash: `capability|priority` → tasks waiting (what claims
//!   are planned on, and the backlog metric).
//! - `callbacks:{L}` — sorted set: task id by its next callback's due time.
//! - `run:{L}:{run_id}`, `runs_due:{L}` — a workflow run's record and the
//!   runs due for a look, beside the run's held task (`runs`).
//! - `paused:{L}` — sorted set: paused tasks (DESIGN §9) by when they are
//!   queued again (`pauses`).
//! - `followups:{L}` — sorted set: ended tasks of a session whose session
//!   result is not appended yet, by end time; appended right after the
//!   outcome, and by any router's worker for an entry older than
//!   [`FOLLOWUP_GRACE`] (its router died).
//!
//! Keys found by other names than a task id, each written alone:
//! - `task_req:{caller}:{request_id}` — the idempotency key → task id.
//! - `task_alias:{id}` — string, kept for the retention: a task id a router
//!   gave out from its local buffer for a `request_id` that Redis already
//!   had, naming the task that holds it ([`TaskStore::alias`]).
//! - `tasks_of:{caller}` — sorted set: a caller's newest task ids by creation
//!   time (at most [`CALLER_INDEX_MAX`]), for A2A's `ListTasks`.
//! - `results:{S}:{session_id}` — finished tasks of a session, in order, for
//!   callers that reconnect; `results_seen:{S}:{session_id}` the task ids in
//!   it, so a result is appended once (`{S}`: the session's own tag).
//! - `dead_letters` — callbacks that could not be delivered, with their result.
//!
//! A submission is two steps, each one slot: `SET task_req … NX GET` claims
//! the request id for the task id (or names the task that holds it), then one
//! script in the lane stores and queues that task unless it is there already.
//! A submission that failed between the two is completed by the next one with
//! the same request id (the caller's retry, or the router's buffer replaying
//! it under the same id), so a request id never names two tasks and an
//! acknowledged task is always stored and queued.
//!
//! A task's `callback` field, when present, replaces the spec's callback (A2A
//! sets and deletes push-notification configs after submission; `null`:
//! deleted); the script recording an outcome reads it, so a callback set
//! before the task ends is sent.
//!
//! A delivery the agent answered `202 Accepted` stays `running` with an
//! `accepted` record (who may report, until when) and the queue entry it
//! holds; the agent's report ends it through the same script as any outcome,
//! once (`report`). While a delivery runs its router keeps the entry's claim
//! fresh (`extend_claim`), so only a dead router's entries are reclaimed.
//!
//! Every multi-key change is one Lua script on one slot; the allowed
//! predecessor states come from [`State::predecessors`], the one transition
//! table. A worker's scripts may run twice with the same arguments and
//! answer as the first time (a move to the state a task is in, a worker's
//! outcome it has, a submission of the task that is stored): the cluster
//! client sends a command again when its connection failed after it was
//! sent. A cancel of a task that ended is refused however often it comes.
//!
//! The store's parts, beside this file (which holds the public types, the
//! store's state and the constants): `keys` (the layout above),
//! `connection` (one server, Sentinel or cluster), `scripts` (the Lua
//! scripts), `submission` (and the consumer groups), `lookup` (reading
//! tasks, a session's results), `claims` (claims, reclaim, the running
//! count), `backlog` (the counts claims are planned on), `outcome`
//! (transitions and a task's end), `followups` (what an end leaves beyond
//! its lane), `callbacks` (a callback and its schedule), `dead_letters`,
//! `record` (a task's record and stream entries, read), `quota` (where
//! routers share their limits) and `history` (where they merge their
//! outcome histories); `trail` keeps the trail's records (its own key
//! layout in that file); `parts` runs scripts of one slot as one script
//! (a run's start, first advance and end with its held task).

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_reach_stores::slot::crc16;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use self::backlog::Backlogs;
pub use self::callbacks::schedule_member;
use self::connection::{Connection, Link};
pub use self::history::{HistorySlot, HistoryTotals};
pub use self::quota::{QuotaAsk, QuotaExchange, QuotaLimit, QuotaReport};
pub use self::runs::{
    AfterStep, EntryOrder, FirstAdvance, HeldTask, RunEntry, RunStarted, StepEnd, StoredRun, RECENT_RUNS,
};
use self::scripts::Scripts;
pub use self::turns::MOST_PUSH_CONFIGS;
use crate::model::{Callback, Priority, State, Task};

mod backlog;
mod callbacks;
mod claims;
mod connection;
mod dead_letters;
mod followups;
mod history;
mod keys;
mod lookup;
mod outcome;
mod parts;
mod pauses;
mod quota;
mod record;
mod runs;
mod scripts;
mod submission;
mod trail;
mod turns;

const GROUP: &str = "workers";

/// How many task ids a caller's index keeps (its newest): bounds the index of
/// a caller that submits without end.
pub const CALLER_INDEX_MAX: usize = 1000;

/// Lanes per tenant: one hex digit of a task id. Part of the key layout.
pub const LANES: usize = 16;

/// How long an ended task's follow-ups may wait for the router that ended it
/// before any router's worker applies them.
pub const FOLLOWUP_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum TaskStoreError {
    #[error("task store (Redis) unavailable: {0}")]
    Unavailable(String),
    #[error("no task `{0}`")]
    NotFound(String),
    #[error("task is `{current}`; it cannot become `{wanted}`")]
    Refused { current: String, wanted: String },
    #[error("corrupt task record: {0}")]
    Corrupt(String),
    /// A result report for a task no agent answered `202` (yet).
    #[error("task is `{current}` and awaits no reported result")]
    NotAwaitingResult { current: String },
    /// A result report from an agent other than the one the delivery went to.
    #[error("the task was delivered to agent `{expected}`, not `{reporter}`")]
    NotTheAgent { expected: String, reporter: String },
    /// A second, different result report (or one after the task ended otherwise).
    #[error("task is `{current}`; a different result was already recorded or it ended otherwise")]
    ResultConflict { current: String },
    #[error("no dead letter `{0}`")]
    DeadLetterNotFound(String),
    /// A submission refused: `waiting` tasks wait already, at least the bound.
    #[error("{waiting} tasks are waiting, the bound is {bound}")]
    BacklogFull { waiting: u64, bound: u64 },
}

fn unavailable(error: redis::RedisError) -> TaskStoreError {
    TaskStoreError::Unavailable(agent_reach_stores::error_chain(&error))
}

/// A fresh task id (`t_` and 96 random bits in hex); its first digit, its
/// lane, is random too. [`TaskStore::task_id_for`] keeps a capability's tasks
/// in one lane.
pub fn new_task_id() -> String {
    format!("t_{:016x}{:08x}", rand::random::<u64>(), rand::random::<u32>())
}

/// The lane of a task id: its first hex digit; any other id's by CRC16.
pub fn lane_of(task_id: &str) -> usize {
    task_id
        .strip_prefix("t_")
        .and_then(|rest| rest.chars().next())
        .and_then(|digit| digit.to_digit(16))
        .map_or_else(
            || usize::from(crc16(task_id.as_bytes())) % LANES,
            |digit| digit as usize,
        )
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}

/// What a submission carries; the store adds ids, state and times.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NewTask {
    pub request_id: String,
    pub session_id: Option<String>,
    pub caller: String,
    pub capability: String,
    pub priority: Priority,
    pub envelope: Value,
    pub callback: Option<Callback>,
    /// An A2A push config set with the message that made the task (its
    /// `push:{id}` field, written with the task: notified however soon it ends).
    pub push_config: Option<Callback>,
    /// Deliver to this instance only (a broadcast child).
    pub target_agent: Option<String>,
    /// The broadcast parent this task reports to.
    pub parent: Option<String>,
    /// For a broadcast parent: the instances its children target.
    pub children: Vec<String>,
    /// The workflow run it is a step of (or, held, the run it stands for).
    pub run: Option<String>,
    /// Store without queueing: a broadcast parent, ended by its children; a
    /// workflow run, ended by the run.
    pub hold: bool,
}

/// The answer to a submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    Created(String),
    /// The request id was seen before: this is the existing task.
    Existing(String),
}

impl Submitted {
    pub fn task_id(&self) -> &str {
        match self {
            Submitted::Created(id) | Submitted::Existing(id) => id,
        }
    }
}

/// A queue entry a worker took; acknowledged when its outcome is recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    pub task: Task,
    pub(crate) queue: String,
    pub(crate) entry_id: String,
    /// The worker holding the entry (whose claim `extend_claim` refreshes).
    pub(crate) consumer: String,
}

/// What a result report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reported {
    /// Recorded: the task ended with it.
    Recorded(State),
    /// The same report again: nothing changed.
    Repeated(State),
}

/// One parked callback.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// The stream entry id, `MS-SEQ` (MS: when it was parked).
    pub id: String,
    pub task_id: String,
    /// The A2A push config it was for (`None`: the task's callback).
    pub push_config: Option<String>,
    pub url: String,
    /// Why the last attempt failed.
    pub error: String,
    /// The result envelope the callback carried.
    pub result: Option<Value>,
}

/// One finished task in a session's result stream.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionResult {
    /// Pass as `after` to read only later results.
    pub cursor: String,
    pub task_id: String,
    pub state: State,
    pub result: Option<Value>,
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `{prefix}:{tenant}` starts every key.
    pub prefix: String,
    pub tenant: String,
    /// How long finished tasks, their idempotency keys and session results are kept.
    pub retention: Duration,
    /// CA bundle and client certificate for `rediss://` (the system's roots otherwise).
    pub tls: agent_reach_stores::TlsFiles,
    /// Acknowledge a submission only once this many replicas have it (`WAIT`,
    /// on every shard the submission wrote to).
    pub wait: Option<agent_reach_stores::Wait>,
    /// Where the router keeps submissions while Redis is unreachable (its
    /// `--task-buffer-dir`), and how many at most; `None`: answer 503 instead.
    pub local_buffer: Option<LocalBuffer>,
}

/// The router's local buffer for submissions during a Redis outage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalBuffer {
    pub dir: std::path::PathBuf,
    pub limit: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            prefix: "agent-reach".to_string(),
            tenant: "default".to_string(),
            retention: Duration::from_secs(24 * 3600),
            tls: agent_reach_stores::TlsFiles::default(),
            wait: None,
            local_buffer: None,
        }
    }
}

pub struct TaskStore {
    link: Link,
    /// The connection and the Sentinel generation it was opened under (0 without Sentinels).
    connection: std::sync::Mutex<Option<(u64, Connection)>>,
    wait: Option<agent_reach_stores::Wait>,
    namespace: String,
    /// The tenant whose tasks these are (the second part of `namespace`).
    tenant: String,
    retention_s: u64,
    tls: agent_reach_stores::TlsFiles,
    scripts: Scripts,
    /// The workflow runs' scripts (`runs`).
    run_scripts: runs::RunScripts,
    /// The paused tasks' scripts (`pauses`).
    pause_scripts: pauses::PauseScripts,
    /// Where the next callback claim starts (lanes in turn).
    next_callback_lane: AtomicUsize,
    /// When this store last looked for follow-ups a dead router left.
    last_followup_sweep_ms: AtomicU64,
    /// The backlog counts claims are planned on, and when they were read.
    backlog_view: std::sync::Mutex<Option<(std::time::Instant, Backlogs)>>,
}
