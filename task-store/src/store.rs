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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_reach_stores::slot::{crc16, key_slot, spread_tag};
use redis::aio::ConnectionManager;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{AsyncCommands, Script, Value as RedisValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::{Accepted, Callback, Priority, State, Task, Transition};

const GROUP: &str = "workers";

/// How many task ids a caller's index keeps (its newest): bounds the index of
/// a caller that submits without end.
pub const CALLER_INDEX_MAX: usize = 1000;

/// Lanes per tenant: one hex digit of a task id. Part of the key layout.
pub const LANES: usize = 16;

/// How long an ended task's follow-ups may wait for the router that ended it
/// before any router's worker applies them.
pub const FOLLOWUP_GRACE: Duration = Duration::from_secs(5);

/// How long a router that took over follow-ups holds them before another may.
const FOLLOWUP_LEASE_MS: u64 = 30_000;

/// How often a worker looks for follow-ups a dead router left.
const FOLLOWUP_SWEEP_EVERY_MS: u64 = 1_000;

/// How long a worker plans its claims on the lanes' backlog counts it read
/// last (less what it claimed since, plus what its own router queued)
/// before reading them again: a busy worker claims every few milliseconds,
/// and 16 reads per claim cost Redis more than the claims. A task another
/// router queued meanwhile waits at most this long.
const BACKLOG_VIEW_FOR: Duration = Duration::from_millis(20);

/// The lanes' backlog counts (`capability|priority` → waiting), in lane order.
type Backlogs = Vec<HashMap<String, i64>>;

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

/// The lanes' hash tags (without braces), computed once.
fn lane_tags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| (0..LANES).map(|lane| spread_tag("q", lane, LANES)).collect())
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
    /// Deliver to this instance only (a broadcast child).
    pub target_agent: Option<String>,
    /// The broadcast parent this task reports to.
    pub parent: Option<String>,
    /// For a broadcast parent: the instances its children target.
    pub children: Vec<String>,
    /// Store without queueing: a broadcast parent, ended by its children.
    pub hold: bool,
}

/// The immutable part of a task, stored once.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Spec {
    task_id: String,
    request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    session_id: Option<String>,
    caller: String,
    capability: String,
    priority: Priority,
    envelope: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    callback: Option<Callback>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target_agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    children: Vec<String>,
    created_at_ms: u64,
}

/// What a submission's store step needs beyond the spec.
struct StoreStep<'a> {
    request_key: &'a str,
    /// The backlog field, `capability|priority`.
    field: &'a str,
    /// Stored without queueing (a broadcast parent).
    hold: bool,
    bound: Option<u64>,
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

/// The task store's scripts, loaded once.
struct Scripts {
    submit: Script,
    transition: Script,
    finish: Script,
    claim: Script,
    reclaim: Script,
    running: Script,
    prepare: Script,
    lease_due: Script,
    extend: Script,
    accept: Script,
    replay: Script,
    set_callback: Script,
    release_request: Script,
    index: Script,
    publish: Script,
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
    /// Where the next callback claim starts (lanes in turn).
    next_callback_lane: AtomicUsize,
    /// When this store last looked for follow-ups a dead router left.
    last_followup_sweep_ms: AtomicU64,
    /// The backlog counts claims are planned on, and when they were read.
    backlog_view: std::sync::Mutex<Option<(std::time::Instant, Backlogs)>>,
}

/// Where the store connects.
enum Link {
    /// One server (`redis://`, `rediss://`).
    Direct(redis::Client),
    /// The primary the Sentinels name; `url` holds the credentials and database.
    Sentinel {
        primary: std::sync::Arc<agent_reach_stores::Primary>,
        url: agent_reach_stores::RedisUrl,
    },
    /// A Redis Cluster (`redis+cluster://`): the client follows its slots.
    Cluster(Box<redis::cluster::ClusterClient>),
}

/// One connection of either kind; both are multiplexed and cheap to clone.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, RedisValue> {
        match self {
            Connection::Single(connection) => connection.req_packed_command(cmd),
            Connection::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<RedisValue>> {
        match self {
            Connection::Single(connection) => connection.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(connection) => connection.get_db(),
            Connection::Cluster(connection) => connection.get_db(),
        }
    }
}

impl Connection {
    /// `WAIT replicas timeout` on the node holding `key`, after a write to it
    /// on this connection: how many replicas have the write.
    async fn wait_for(&mut self, key: &str, wait: agent_reach_stores::Wait) -> redis::RedisResult<i64> {
        let mut command = redis::cmd("WAIT");
        command.arg(wait.replicas).arg(wait.timeout_ms());
        match self {
            Connection::Single(connection) => command.query_async(connection).await,
            Connection::Cluster(connection) => {
                // The shard the write went to, not every primary (the crate's default for WAIT).
                let route = Route::new(key_slot(key.as_bytes()), SlotAddr::Master);
                let reached = connection
                    .route_command(
                        command,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await?;
                Ok(redis::from_redis_value(reached)?)
            }
        }
    }
}

/// A client for `url`'s server, or for `address` (the Sentinels' primary),
/// over TLS when the URL says so (verification always on).
fn client_for(
    url: &agent_reach_stores::RedisUrl,
    address: Option<&agent_reach_stores::HostPort>,
    tls: &agent_reach_stores::TlsFiles,
) -> Result<redis::Client, String> {
    let node = match (address, &url.nodes) {
        (Some(address), _) => address.clone(),
        (None, agent_reach_stores::Nodes::Direct(node)) => node.clone(),
        (None, _) => return Err("a Sentinel or cluster URL needs a node's address".to_string()),
    };
    let mut settings = redis::RedisConnectionInfo::default().set_db(url.db);
    if let Some(username) = &url.username {
        settings = settings.set_username(username);
    }
    if let Some(password) = &url.password {
        settings = settings.set_password(password);
    }
    let info = redis::IntoConnectionInfo::into_connection_info(node_address(&node, url.tls))
        .map_err(|error| format!("Redis {node}: {error}"))?
        .set_redis_settings(settings);
    let client = if url.tls {
        redis::Client::build_with_tls(info, tls.redis_certificates())
    } else {
        redis::Client::open(info)
    };
    client.map_err(|error| format!("Redis {node}: {}", agent_reach_stores::error_chain(&error)))
}

fn node_address(node: &agent_reach_stores::HostPort, tls: bool) -> redis::ConnectionAddr {
    if tls {
        redis::ConnectionAddr::TcpTls {
            host: node.host.clone(),
            port: node.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        redis::ConnectionAddr::Tcp(node.host.clone(), node.port)
    }
}

/// A cluster client for `url`'s seeds: TLS to every node when the URL says
/// so, the URL's credentials on every node, retries short enough that a
/// redirection or a `TRYAGAIN` costs milliseconds, not the crate's default
/// second and more.
fn cluster_client_for(
    url: &agent_reach_stores::RedisUrl,
    seeds: &[agent_reach_stores::HostPort],
    tls: &agent_reach_stores::TlsFiles,
) -> Result<redis::cluster::ClusterClient, String> {
    let infos = seeds
        .iter()
        .map(|node| redis::IntoConnectionInfo::into_connection_info(node_address(node, url.tls)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("Redis Cluster seeds: {error}"))?;
    let mut builder = redis::cluster::ClusterClientBuilder::new(infos)
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .overall_response_timeout(Some(Duration::from_secs(5)))
        .retries(12)
        .min_retry_wait(10)
        .max_retry_wait(250);
    if let Some(username) = &url.username {
        builder = builder.username(username);
    }
    if let Some(password) = &url.password {
        builder = builder.password(password);
    }
    if url.tls {
        builder = builder
            .tls(redis::cluster::TlsMode::Secure)
            .certs(tls.redis_certificates());
    }
    builder
        .build()
        .map_err(|error| format!("Redis Cluster: {}", agent_reach_stores::error_chain(&error)))
}

const SUBMIT: &str = r#"
-- Stores and queues a task in its lane, unless it is stored already (the
-- request id was claimed for it before, by this submission or an earlier one).
-- On one server (ARGV[9] '1') it also claims the request id itself and adds
-- the task to its caller's index, every key being on that server: the whole
-- submission is this one script.
-- KEYS: 1 task hash, 2 queue, 3 the lane's queue set, 4 the lane's backlog,
--       on one server only: 5 the idempotency key, 6 the caller's index, then
--       the other lanes' backlogs (the bound then counts every lane at once)
-- ARGV: 1 task id, 2 spec JSON, 3 now ms, 4 backlog field (capability|priority),
--       5 queue it ('1'/'0': a held broadcast parent is stored only), 6 group,
--       7 the tenant's backlog bound ('0': none): refused with {2, waiting} at or over it,
--       8 tasks waiting in lanes not counted here (a cluster's other shards, read just before),
--       9 '1': one server (claim here; another task holding the request id: {3, its id}),
--       10 retention s, 11 index size
local others = 5
if ARGV[9] == '1' then
  others = 7
  local holder = redis.call('GET', KEYS[5])
  if holder and holder ~= ARGV[1] then return {3, holder} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, ARGV[1]} end
if ARGV[7] ~= '0' and ARGV[5] == '1' then
  local waiting = tonumber(ARGV[8])
  for _, count in ipairs(redis.call('HVALS', KEYS[4])) do waiting = waiting + tonumber(count) end
  for k = others, #KEYS do
    for _, count in ipairs(redis.call('HVALS', KEYS[k])) do waiting = waiting + tonumber(count) end
  end
  if waiting >= tonumber(ARGV[7]) then return {2, tostring(waiting)} end
end
if ARGV[9] == '1' then
  redis.call('SET', KEYS[5], ARGV[1], 'EX', ARGV[10])
  redis.call('ZADD', KEYS[6], ARGV[3], ARGV[1])
  redis.call('ZREMRANGEBYRANK', KEYS[6], 0, -1 - tonumber(ARGV[11]))
  redis.call('EXPIRE', KEYS[6], ARGV[10])
end
redis.call('HSET', KEYS[1], 'spec', ARGV[2], 'state', 'pending', 'attempts', 0, 'updated_at_ms', ARGV[3],
  'transitions', '{"state":"pending","at_ms":' .. ARGV[3] .. '}\n')
if ARGV[5] == '1' then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[6], '0', 'MKSTREAM')
    redis.call('SADD', KEYS[3], KEYS[2])
  end
  redis.call('HSET', KEYS[1], 'backlog', ARGV[4])
  redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
  redis.call('XADD', KEYS[2], '*', 'task_id', ARGV[1])
end
return {1, ARGV[1]}
"#;

const RELEASE_REQUEST: &str = r#"
-- Frees a request id claimed for a task that was then refused (backlog
-- bound), unless another task holds it by now.
-- KEYS: 1 idempotency key; ARGV: 1 task id
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#;

const INDEX: &str = r#"
-- Adds a task to its caller's index, keeping the newest.
-- KEYS: 1 the caller's index; ARGV: 1 task id, 2 created ms, 3 index size, 4 retention s
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -1 - tonumber(ARGV[3]))
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"#;

const LEASE_DUE: &str = r#"
-- Takes members that are due and pushes their due time out by a lease, so
-- one router handles each; if it dies, the lease runs out and another does.
-- (Callbacks due, and follow-ups a router left.)
-- KEYS: 1 schedule; ARGV: 1 due at or before (ms), 2 lease until ms, 3 limit
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
for _, id in ipairs(due) do redis.call('ZADD', KEYS[1], 'XX', ARGV[2], id) end
return due
"#;

const TRANSITION: &str = r#"
-- KEYS: 1 task hash, 2 backlog hash
-- ARGV: 1 new state, 2 now ms, 3 attempts increment, 4.. allowed predecessor states
-- In the new state already: done (this move run again, after a connection
-- that failed once it was sent).
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
if current == ARGV[1] then return {'ok', current} end
local allowed = false
for i = 4, #ARGV do if current == ARGV[i] then allowed = true end end
if not allowed then return {'refused', current} end
if current == 'pending' then
  local field = redis.call('HGET', KEYS[1], 'backlog')
  if field then redis.call('HINCRBY', KEYS[2], field, -1) end
end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'updated_at_ms', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'attempts', ARGV[3])
redis.call('HSET', KEYS[1], 'transitions',
  (redis.call('HGET', KEYS[1], 'transitions') or '') .. '{"state":"' .. ARGV[1] .. '","at_ms":' .. ARGV[2] .. '}\n')
return {'ok', current}
"#;

const FINISH: &str = r#"
-- Records a terminal outcome, acknowledges the queue entry, schedules the
-- callback, starts the retention clock and, for a task of a session, notes
-- the session result beyond the lane as a follow-up, all at once.
-- KEYS: 1 task hash, 2 queue, 3 backlog hash, 4 callback schedule, 5 follow-ups,
--       6 (one server only) the idempotency key, its retention started again here
-- ARGV: 1 terminal state, 2 now ms, 3 result JSON, 4 queue entry id ('' = none),
--       5 group, 6 retention s, 7 task id, 8 has callback ('1'/'0'),
--       9 reporting agent ('' = not an agent's report), 10 the report's fingerprint,
--       11 has a session ('1'/'0'), 12 one server ('1'/'0'), 13.. allowed predecessors
-- An agent's report is taken only from the agent that answered the delivery 202,
-- once: the same report again is 'repeat', another one 'conflict'.
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
local entry = ARGV[4]
if ARGV[9] ~= '' then
  local accepted = redis.call('HGET', KEYS[1], 'accepted_agent')
  if not accepted then return {'not_accepted', current} end
  if accepted ~= ARGV[9] then return {'wrong_agent', current, accepted} end
  local previous = redis.call('HGET', KEYS[1], 'report')
  if previous then
    if previous == ARGV[10] then return {'repeat', current} end
    return {'conflict', current}
  end
  entry = redis.call('HGET', KEYS[1], 'entry_id') or ''
end
local allowed = false
for i = 13, #ARGV do if current == ARGV[i] then allowed = true end end
if not allowed then
  if entry ~= '' then redis.call('XACK', KEYS[2], ARGV[5], entry) end
  -- A worker's very outcome for its entry, recorded already (the script run
  -- again after a connection that failed once it was sent): done. (A cancel
  -- of an ended task stays refused.)
  if ARGV[9] == '' and ARGV[4] ~= '' and current == ARGV[1]
    and redis.call('HGET', KEYS[1], 'result') == ARGV[3] then
    return {'ok', current}
  end
  if ARGV[9] ~= '' then return {'conflict', current} end
  return {'refused', current}
end
if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'report', ARGV[10]) end
-- A callback set or deleted after submission (the `callback` field) replaces the spec's.
local has_callback = ARGV[8] == '1'
local replaced = redis.call('HGET', KEYS[1], 'callback')
if replaced then has_callback = replaced ~= 'null' and ARGV[1] ~= 'canceled' end
if has_callback then redis.call('ZADD', KEYS[4], ARGV[2], ARGV[7]) end
if current == 'pending' then
  local field = redis.call('HGET', KEYS[1], 'backlog')
  if field then redis.call('HINCRBY', KEYS[3], field, -1) end
end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'updated_at_ms', ARGV[2], 'result', ARGV[3])
redis.call('HSET', KEYS[1], 'transitions',
  (redis.call('HGET', KEYS[1], 'transitions') or '') .. '{"state":"' .. ARGV[1] .. '","at_ms":' .. ARGV[2] .. '}\n')
redis.call('EXPIRE', KEYS[1], ARGV[6])
if ARGV[12] == '1' then redis.call('EXPIRE', KEYS[6], ARGV[6]) end
if entry ~= '' then redis.call('XACK', KEYS[2], ARGV[5], entry) end
if ARGV[11] == '1' then redis.call('ZADD', KEYS[5], ARGV[2], ARGV[7]) end
return {'ok', current}
"#;

const PUBLISH: &str = r#"
-- Appends an ended task to its session's results, once.
-- KEYS: 1 session results stream, 2 the task ids in it; ARGV: 1 task id, 2 state, 3 retention s
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then
  redis.call('XADD', KEYS[1], '*', 'task_id', ARGV[1], 'state', ARGV[2])
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
"#;

/// Shared by the claim and reclaim scripts: an entry's task, loaded; an entry
/// whose task ended (canceled) or expired is acknowledged and skipped.
const TAKE: &str = r#"
local function take(out, queue, entries)
  local taken = 0
  for _, entry in ipairs(entries) do
    if type(entry) ~= 'table' then break end
    local id, fields = entry[1], entry[2]
    local task_id
    if type(fields) == 'table' then
      for f = 1, #fields, 2 do if fields[f] == 'task_id' then task_id = fields[f + 1] end end
    end
    local record = {}
    if task_id then record = redis.call('HGETALL', ARGV[3] .. task_id) end
    local state
    for f = 1, #record, 2 do if record[f] == 'state' then state = record[f + 1] end end
    if state == nil or string.find(ARGV[4], ' ' .. state .. ' ', 1, true) then
      redis.call('XACK', queue, ARGV[1], id)
    else
      out[#out + 1] = {queue, id, record}
      taken = taken + 1
    end
  end
  return taken
end
"#;

/// KEYS: 1 the lane's queue set (the lane's slot)
/// ARGV: 1 group, 2 consumer, 3 task key prefix, 4 terminal states (' a b c '), then (queue, count) pairs.
/// Entries of ended tasks do not count: reading goes on past them.
const CLAIM: &str = r#"
local out = {}
for i = 5, #ARGV, 2 do
  local queue, wanted = ARGV[i], tonumber(ARGV[i + 1])
  while wanted > 0 do
    local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', wanted, 'STREAMS', queue, '>')
    if not reply or #reply[1][2] == 0 then break end
    wanted = wanted - take(out, queue, reply[1][2])
  end
end
return out
"#;

/// KEYS: 1 the lane's queue set
/// ARGV: 1 group, 2 consumer, 3 task key prefix, 4 terminal states, 5 min idle ms, 6 count
const RECLAIM: &str = r#"
local out = {}
for _, queue in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local left = tonumber(ARGV[6]) - #out
  if left <= 0 then break end
  local reply = redis.call('XAUTOCLAIM', queue, ARGV[1], ARGV[2], ARGV[5], '0-0', 'COUNT', left)
  take(out, queue, reply[2])
end
return out
"#;

/// Claimed-not-acknowledged entries per queue of a lane.
/// KEYS: 1 the lane's queue set; ARGV: 1 group
const RUNNING: &str = r#"
local out = {}
for _, queue in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local summary = redis.call('XPENDING', queue, ARGV[1])
  out[#out + 1] = {queue, summary[1]}
end
return out
"#;

/// Recreates the consumer group of every queue of a lane (a Redis that lost them).
/// KEYS: 1 the lane's queue set; ARGV: 1 group
const PREPARE: &str = r#"
for _, queue in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local created = redis.pcall('XGROUP', 'CREATE', queue, ARGV[1], '0', 'MKSTREAM')
  if type(created) == 'table' and created.err and not string.find(created.err, 'BUSYGROUP', 1, true) then
    return redis.error_reply(created.err)
  end
end
return 1
"#;

const EXTEND: &str = r#"
-- Refreshes a running delivery's claim (its idle time) so no router reclaims
-- it, only while this worker still holds the entry.
-- KEYS: 1 queue; ARGV: 1 group, 2 consumer, 3 entry id
local held = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])
if #held == 0 then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 1
"#;

const ACCEPT: &str = r#"
-- The agent answered the delivery 202: it reports later. Records who may report,
-- until when, and the queue entry the report acknowledges.
-- KEYS: 1 task hash; ARGV: 1 accepted JSON, 2 agent name, 3 queue entry id
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
if current ~= 'running' then return {'refused', current} end
redis.call('HSET', KEYS[1], 'accepted', ARGV[1], 'accepted_agent', ARGV[2], 'entry_id', ARGV[3])
return {'ok', current}
"#;

const SET_CALLBACK: &str = r#"
-- Sets (JSON) or deletes ('null') a task's callback while the task has not ended.
-- KEYS: 1 task hash; ARGV: 1 callback JSON or 'null', 2.. the states it may be set in
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
local allowed = false
for i = 2, #ARGV do if current == ARGV[i] then allowed = true end end
if not allowed then return {'refused', current} end
redis.call('HSET', KEYS[1], 'callback', ARGV[1])
return {'ok', current}
"#;

const REPLAY: &str = r#"
-- Schedules a dead-lettered callback again from its first attempt: due now,
-- its attempt count reset (the dead letter is removed after this).
-- KEYS: 1 task hash, 2 callback schedule; ARGV: 1 task id, 2 now ms
if redis.call('EXISTS', KEYS[1]) == 0 then return 'expired' end
redis.call('HSET', KEYS[1], 'callback_attempts', 0)
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 'ok'
"#;

fn state_args(next: State) -> Vec<&'static str> {
    State::predecessors(next).into_iter().map(State::as_str).collect()
}

/// The terminal states, space-separated and padded, for the scripts' `take`.
fn terminal_states() -> String {
    let words: Vec<&str> = State::ALL
        .into_iter()
        .filter(|state| state.is_terminal())
        .map(State::as_str)
        .collect();
    format!(" {} ", words.join(" "))
}

impl TaskStore {
    /// Connects lazily; calls fail with `Unavailable` while Redis is down and
    /// succeed again once it is back. `url` is any DESIGN §7.8 form:
    /// `redis://`, `rediss://`, `redis+sentinel://`, `rediss+sentinel://`,
    /// `redis+cluster://` or `rediss+cluster://`.
    pub fn new(url: &str, config: &StoreConfig) -> Result<Self, String> {
        let parsed = agent_reach_stores::RedisUrl::parse(url)?;
        let link = match &parsed.nodes {
            agent_reach_stores::Nodes::Direct(_) => Link::Direct(client_for(&parsed, None, &config.tls)?),
            agent_reach_stores::Nodes::Cluster { seeds } => {
                Link::Cluster(Box::new(cluster_client_for(&parsed, seeds, &config.tls)?))
            }
            agent_reach_stores::Nodes::Sentinel { .. } => {
                let sentinels = agent_reach_stores::Sentinels::from_url(&parsed, &config.tls)
                    .ok_or_else(|| format!("`{parsed}` names no Sentinel"))?;
                let primary = agent_reach_stores::Primary::new(sentinels, Duration::from_secs(2));
                // Follows failovers in the background; requests never ask the Sentinels.
                if tokio::runtime::Handle::try_current().is_ok() {
                    primary.follow();
                }
                Link::Sentinel { primary, url: parsed }
            }
        };
        Ok(Self {
            link,
            connection: std::sync::Mutex::new(None),
            wait: config.wait,
            namespace: format!("{}:{}", config.prefix, config.tenant),
            tenant: config.tenant.clone(),
            retention_s: config.retention.as_secs().max(1),
            tls: config.tls.clone(),
            scripts: Scripts {
                submit: Script::new(SUBMIT),
                transition: Script::new(TRANSITION),
                finish: Script::new(FINISH),
                claim: Script::new(&format!("{TAKE}{CLAIM}")),
                reclaim: Script::new(&format!("{TAKE}{RECLAIM}")),
                running: Script::new(RUNNING),
                prepare: Script::new(PREPARE),
                lease_due: Script::new(LEASE_DUE),
                extend: Script::new(EXTEND),
                accept: Script::new(ACCEPT),
                replay: Script::new(REPLAY),
                set_callback: Script::new(SET_CALLBACK),
                release_request: Script::new(RELEASE_REQUEST),
                index: Script::new(INDEX),
                publish: Script::new(PUBLISH),
            },
            next_callback_lane: AtomicUsize::new(0),
            last_followup_sweep_ms: AtomicU64::new(0),
            backlog_view: std::sync::Mutex::new(None),
        })
    }

    fn is_cluster(&self) -> bool {
        matches!(self.link, Link::Cluster(_))
    }

    /// The connection: the one open, unless the Sentinels have named another
    /// primary since it was opened (one atomic load). A cluster connection
    /// follows the cluster's slots and failovers by itself.
    async fn connection(&self) -> Result<Connection, TaskStoreError> {
        let wanted = match &self.link {
            Link::Direct(_) | Link::Cluster(_) => 0,
            Link::Sentinel { primary, .. } => primary.generation(),
        };
        if let Some((generation, connection)) = self
            .connection
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_ref()
        {
            if *generation == wanted {
                return Ok(connection.clone());
            }
        }
        let (generation, client) = match &self.link {
            Link::Cluster(client) => {
                let connection = Connection::Cluster(client.get_async_connection().await.map_err(unavailable)?);
                *self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Some((0, connection.clone()));
                return Ok(connection);
            }
            Link::Direct(client) => (0, client.clone()),
            Link::Sentinel { primary, url } => {
                let (address, generation) = primary.current().await.map_err(TaskStoreError::Unavailable)?;
                (
                    generation,
                    client_for(url, Some(&address), &self.tls).map_err(TaskStoreError::Unavailable)?,
                )
            }
        };
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2);
        let mut connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(unavailable)?;
        if let Link::Sentinel { primary, .. } = &self.link {
            // A Sentinel's answer can lag a failover: never write to a replica.
            let role: Vec<RedisValue> = redis::cmd("ROLE")
                .query_async(&mut connection)
                .await
                .map_err(unavailable)?;
            let role = match role.first() {
                Some(RedisValue::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                Some(RedisValue::SimpleString(text)) => text.clone(),
                _ => "server with an unreadable ROLE".to_string(),
            };
            if role != "master" {
                let _ = primary.refresh().await;
                return Err(TaskStoreError::Unavailable(format!(
                    "refusing a Redis that is a {role} now, not the primary of `{}`",
                    primary.service()
                )));
            }
        }
        let connection = Connection::Single(connection);
        *self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Some((generation, connection.clone()));
        Ok(connection)
    }

    /// The tenant whose tasks this store holds: deliveries are made on behalf
    /// of callers of this tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// A fresh task id in `capability`'s lane: a capability's tasks, queues
    /// and callbacks then share one slot of a Redis Cluster, and different
    /// capabilities spread over its shards. `t_` and 24 hex digits as
    /// [`new_task_id`]'s, the first one the lane.
    pub fn task_id_for(&self, capability: &str) -> String {
        format!(
            "t_{:x}{:015x}{:08x}",
            self.lane_for(capability),
            rand::random::<u64>() >> 4,
            rand::random::<u32>()
        )
    }

    /// The lane of `capability`'s tasks (of this tenant).
    fn lane_for(&self, capability: &str) -> usize {
        let mut name = Vec::with_capacity(self.tenant.len() + 1 + capability.len());
        name.extend_from_slice(self.tenant.as_bytes());
        name.push(b'/');
        name.extend_from_slice(capability.as_bytes());
        usize::from(crc16(&name)) % LANES
    }

    // === Keys ===

    fn lane_key(&self, kind: &str, lane: usize) -> String {
        format!("{}:{kind}:{{{}}}", self.namespace, lane_tags()[lane % LANES])
    }

    /// What every task key of `lane` starts with (the scripts load tasks by id).
    fn task_prefix(&self, lane: usize) -> String {
        format!("{}:", self.lane_key("task", lane))
    }

    fn task_key(&self, task_id: &str) -> String {
        format!("{}{task_id}", self.task_prefix(lane_of(task_id)))
    }

    fn queue_key(&self, lane: usize, capability: &str, priority: Priority) -> String {
        format!("{}:{capability}:{}", self.lane_key("queue", lane), priority.as_str())
    }

    /// The queue a task's entry is in (its lane, capability and priority).
    fn queue_of(&self, task: &Task) -> String {
        self.queue_key(lane_of(&task.task_id), &task.capability, task.priority)
    }

    fn queues_key(&self, lane: usize) -> String {
        self.lane_key("queues", lane)
    }

    fn backlog_key(&self, lane: usize) -> String {
        self.lane_key("backlog", lane)
    }

    fn callbacks_key(&self, lane: usize) -> String {
        self.lane_key("callbacks", lane)
    }

    fn followups_key(&self, lane: usize) -> String {
        self.lane_key("followups", lane)
    }

    fn caller_index_key(&self, caller: &str) -> String {
        format!("{}:tasks_of:{caller}", self.namespace)
    }

    fn alias_key(&self, task_id: &str) -> String {
        format!("{}:task_alias:{task_id}", self.namespace)
    }

    fn request_key(&self, caller: &str, request_id: &str) -> String {
        format!("{}:task_req:{caller}:{request_id}", self.namespace)
    }

    /// A session's results stream and its set of task ids: one slot, the
    /// session's own tag (any id, even one holding braces, gives a valid tag).
    fn results_keys(&self, session_id: &str) -> (String, String) {
        let tag = format!("s{:04x}", crc16(session_id.as_bytes()));
        (
            format!("{}:results:{{{tag}}}:{session_id}", self.namespace),
            format!("{}:results_seen:{{{tag}}}:{session_id}", self.namespace),
        )
    }

    fn dead_letter_key(&self) -> String {
        format!("{}:dead_letters", self.namespace)
    }

    /// Recreates the consumer group of every queue the lanes list (a Redis
    /// that lost them); the groups are otherwise made with each queue, by
    /// its first submission. Idempotent.
    pub async fn prepare(&self) -> Result<(), TaskStoreError> {
        let connection = self.connection().await?;
        let prepared = (0..LANES).map(|lane| {
            let mut connection = connection.clone();
            async move {
                self.scripts
                    .prepare
                    .key(self.queues_key(lane))
                    .arg(GROUP)
                    .invoke_async::<i64>(&mut connection)
                    .await
                    .map_err(unavailable)
            }
        });
        for outcome in futures::future::join_all(prepared).await {
            outcome?;
        }
        Ok(())
    }

    /// Stores the task and queues it; a repeated request id from the same
    /// caller returns the existing task instead.
    pub async fn submit(&self, task: NewTask) -> Result<Submitted, TaskStoreError> {
        let task_id = self.task_id_for(&task.capability);
        self.submit_with_id(task, &task_id).await
    }

    /// [`TaskStore::submit`] under a task id chosen by the caller (the
    /// router's local buffer gives ids out before Redis has the task).
    pub async fn submit_with_id(&self, task: NewTask, task_id: &str) -> Result<Submitted, TaskStoreError> {
        self.submit_within(task, task_id, None).await
    }

    /// [`TaskStore::submit_with_id`], refused with [`TaskStoreError::BacklogFull`]
    /// when `backlog_bound` tasks or more wait already (a tenant's quota). On
    /// one server the count and the submission are one script, so a flood
    /// cannot overshoot it; on a cluster the other lanes' waiting tasks are
    /// counted just before, so concurrent submissions may overshoot it by as
    /// many as are in flight at once.
    pub async fn submit_within(
        &self,
        task: NewTask,
        task_id: &str,
        backlog_bound: Option<u64>,
    ) -> Result<Submitted, TaskStoreError> {
        let spec = Spec {
            task_id: task_id.to_string(),
            request_id: task.request_id.clone(),
            session_id: task.session_id,
            caller: task.caller.clone(),
            capability: task.capability,
            priority: task.priority,
            envelope: task.envelope,
            callback: task.callback,
            target_agent: task.target_agent,
            parent: task.parent,
            children: task.children,
            created_at_ms: now_ms(),
        };
        let connection = self.connection().await?;
        let request_key = self.request_key(&task.caller, &task.request_id);
        let field = format!("{}|{}", spec.capability, spec.priority.as_str());
        let step = StoreStep {
            request_key: &request_key,
            field: &field,
            hold: task.hold,
            bound: backlog_bound,
        };
        let (own, id, (code, answer)) = if self.is_cluster() {
            self.submit_in_two_steps(&connection, &spec, &step).await?
        } else {
            self.submit_at_once(&connection, &spec, &step).await?
        };
        let lane = lane_of(&id);
        let task_key = self.task_key(&id);
        if code == 2 {
            // (One server: refused before anything was written.)
            if own && self.is_cluster() {
                // Refused: the request id is free again, as if never submitted
                // (two keys, two slots: each alone).
                let release = async {
                    let mut connection = connection.clone();
                    self.scripts
                        .release_request
                        .key(&request_key)
                        .arg(&id)
                        .invoke_async::<i64>(&mut connection)
                        .await
                };
                let unlist = async {
                    let mut connection = connection.clone();
                    connection
                        .zrem::<_, _, i64>(self.caller_index_key(&task.caller), &id)
                        .await
                };
                let (released, unlisted) = tokio::join!(release, unlist);
                if let Err(error) = released.and(unlisted) {
                    tracing::warn!(message = "Cannot free a refused submission's request id.", %error, task_id = %id);
                }
            }
            return Err(TaskStoreError::BacklogFull {
                waiting: answer.parse().unwrap_or(0),
                bound: backlog_bound.unwrap_or(0),
            });
        }
        if code == 1 && !task.hold {
            self.note_queued(lane, &field);
        }
        if let Some(wait) = self.wait {
            self.wait_replicated(&connection, &request_key, &task_key, wait).await?;
        }
        // Own: the request id names this submission's task id, stored now or by
        // an earlier attempt of this same submission (a retried write, the
        // buffer's replay): for its caller, the one creation.
        Ok(if own {
            Submitted::Created(id)
        } else {
            Submitted::Existing(id)
        })
    }

    /// A cluster's submission: `SET … NX GET` claims the request id (for a
    /// bound, the other lanes' waiting tasks are counted meanwhile), then
    /// the task it names is stored in its lane beside the caller's index.
    /// Returns (whether this submission claimed it, the task id, the store
    /// step's answer).
    async fn submit_in_two_steps(
        &self,
        connection: &Connection,
        spec: &Spec,
        step: &StoreStep<'_>,
    ) -> Result<(bool, String, (i64, String)), TaskStoreError> {
        let claim = async {
            let mut connection = connection.clone();
            self.claim_request(step.request_key, &spec.task_id)
                .query_async::<Option<String>>(&mut connection)
                .await
                .map_err(unavailable)
        };
        let waiting = async {
            match step.bound {
                Some(_) => self.waiting_per_lane().await.map(Some),
                None => Ok(None),
            }
        };
        let (holder, waiting) = tokio::join!(claim, waiting);
        let (holder, waiting) = (holder?, waiting?);
        let own = holder.as_deref().is_none_or(|holder| holder == spec.task_id);
        let id = holder.unwrap_or_else(|| spec.task_id.clone());
        let lane = lane_of(&id);
        let elsewhere: i64 = waiting.map_or(0, |counts| {
            counts
                .iter()
                .enumerate()
                .filter(|(other, _)| *other != lane)
                .map(|(_, count)| *count)
                .sum()
        });
        let store = async {
            let mut connection = connection.clone();
            let spec_json = self.spec_json(spec, &id)?;
            self.store_invocation(&id, &spec_json, spec, step, elsewhere, false)
                .invoke_async::<(i64, String)>(&mut connection)
                .await
                .map_err(unavailable)
        };
        // The caller's index, beside it, for a task this submission created.
        let index = async {
            if !own {
                return Ok(());
            }
            let mut connection = connection.clone();
            self.index_invocation(spec, &id)
                .invoke_async::<i64>(&mut connection)
                .await
                .map(drop)
                .map_err(unavailable)
        };
        let (stored, indexed) = tokio::join!(store, index);
        let stored = stored?;
        indexed?;
        Ok((own, id, stored))
    }

    /// One server's submission: one script claims the request id, stores
    /// and queues the task and indexes it; when another task holds the
    /// request id, the same script for that task follows (a repeat; or the
    /// completion of a submission cut between a cluster's steps).
    async fn submit_at_once(
        &self,
        connection: &Connection,
        spec: &Spec,
        step: &StoreStep<'_>,
    ) -> Result<(bool, String, (i64, String)), TaskStoreError> {
        let mut connection = connection.clone();
        let spec_json = self.spec_json(spec, &spec.task_id)?;
        let (code, answer) = self
            .store_invocation(&spec.task_id, &spec_json, spec, step, 0, true)
            .invoke_async::<(i64, String)>(&mut connection)
            .await
            .map_err(unavailable)?;
        if code != 3 {
            return Ok((true, spec.task_id.clone(), (code, answer)));
        }
        let holder = answer;
        let spec_json = self.spec_json(spec, &holder)?;
        let stored = self
            .store_invocation(&holder, &spec_json, spec, step, 0, true)
            .invoke_async::<(i64, String)>(&mut connection)
            .await
            .map_err(unavailable)?;
        if stored.0 == 3 {
            // The request id changed hands again meanwhile (it expired and was taken):
            // answered as a store outage, so the caller submits again.
            return Err(TaskStoreError::Unavailable(format!(
                "request `{}` moved between tasks while it was submitted; submit it again",
                spec.request_id
            )));
        }
        Ok((false, holder, stored))
    }

    /// `SET <request key> <task id> NX GET EX <retention>`: claims the request
    /// id for the task, or names the task that holds it.
    fn claim_request(&self, request_key: &str, task_id: &str) -> redis::Cmd {
        let mut claim = redis::cmd("SET");
        claim
            .arg(request_key)
            .arg(task_id)
            .arg("NX")
            .arg("GET")
            .arg("EX")
            .arg(self.retention_s);
        claim
    }

    /// The spec as stored for task `id`.
    fn spec_json(&self, spec: &Spec, id: &str) -> Result<String, TaskStoreError> {
        let mut spec = spec.clone();
        id.clone_into(&mut spec.task_id);
        serde_json::to_string(&spec).map_err(|error| TaskStoreError::Corrupt(error.to_string()))
    }

    /// The store step for task `id` in its lane; `one_server`: the whole
    /// submission (claim, store, index) in it, the bound counting every lane.
    fn store_invocation(
        &self,
        id: &str,
        spec_json: &str,
        spec: &Spec,
        step: &StoreStep<'_>,
        elsewhere: i64,
        one_server: bool,
    ) -> redis::ScriptInvocation<'_> {
        let lane = lane_of(id);
        let mut invocation = self.scripts.submit.key(self.task_key(id));
        invocation
            .key(self.queue_key(lane, &spec.capability, spec.priority))
            .key(self.queues_key(lane))
            .key(self.backlog_key(lane));
        if one_server {
            invocation
                .key(step.request_key)
                .key(self.caller_index_key(&spec.caller));
            if step.bound.is_some() {
                for other in (0..LANES).filter(|other| *other != lane) {
                    invocation.key(self.backlog_key(other));
                }
            }
        }
        invocation
            .arg(id)
            .arg(spec_json)
            .arg(spec.created_at_ms)
            .arg(step.field)
            .arg(if step.hold { "0" } else { "1" })
            .arg(GROUP)
            .arg(step.bound.unwrap_or(0))
            .arg(elsewhere.max(0))
            .arg(if one_server { "1" } else { "0" })
            .arg(self.retention_s)
            .arg(CALLER_INDEX_MAX);
        invocation
    }

    /// The caller's index gaining task `id` (a cluster's submission).
    fn index_invocation(&self, spec: &Spec, id: &str) -> redis::ScriptInvocation<'_> {
        let mut invocation = self.scripts.index.key(self.caller_index_key(&spec.caller));
        invocation
            .arg(id)
            .arg(spec.created_at_ms)
            .arg(CALLER_INDEX_MAX)
            .arg(self.retention_s);
        invocation
    }

    /// `WAIT` for a submission's writes: on one server one `WAIT` after the
    /// last covers both; on a cluster each shard written to waits for its own.
    async fn wait_replicated(
        &self,
        connection: &Connection,
        request_key: &str,
        task_key: &str,
        wait: agent_reach_stores::Wait,
    ) -> Result<(), TaskStoreError> {
        let reached = |key: &str| {
            let mut connection = connection.clone();
            let key = key.to_string();
            async move { connection.wait_for(&key, wait).await.map_err(unavailable) }
        };
        let least = if self.is_cluster() {
            let (request, task) = tokio::join!(reached(request_key), reached(task_key));
            request?.min(task?)
        } else {
            reached(task_key).await?
        };
        if least < i64::from(wait.replicas) {
            return Err(TaskStoreError::Unavailable(format!(
                "the task reached {least} of {} replicas within {} ms; it may survive a failover or not: \
                 submit again with the same request_id (it is not created twice)",
                wait.replicas,
                wait.timeout_ms()
            )));
        }
        Ok(())
    }

    /// Tasks waiting per lane (the backlog counts), in lane order.
    async fn waiting_per_lane(&self) -> Result<Vec<i64>, TaskStoreError> {
        Ok(self
            .lane_backlogs()
            .await?
            .into_iter()
            .map(|counts| counts.values().map(|count| (*count).max(0)).sum())
            .collect())
    }

    /// Every lane's backlog hash (`capability|priority` → waiting), in lane order.
    async fn lane_backlogs(&self) -> Result<Backlogs, TaskStoreError> {
        let connection = self.connection().await?;
        let reads = (0..LANES).map(|lane| {
            let mut connection = connection.clone();
            async move {
                connection
                    .hgetall::<_, HashMap<String, i64>>(self.backlog_key(lane))
                    .await
                    .map_err(unavailable)
            }
        });
        futures::future::join_all(reads).await.into_iter().collect()
    }

    /// The task `task_id` names: its own, or the one its alias points to.
    pub async fn get(&self, task_id: &str) -> Result<Task, TaskStoreError> {
        let mut connection = self.connection().await?;
        let mut fields: HashMap<String, String> =
            connection.hgetall(self.task_key(task_id)).await.map_err(unavailable)?;
        if fields.is_empty() {
            // Only on a miss: an id the buffer gave out for a request Redis already had.
            let alias: Option<String> = connection.get(self.alias_key(task_id)).await.map_err(unavailable)?;
            if let Some(target) = alias {
                fields = connection.hgetall(self.task_key(&target)).await.map_err(unavailable)?;
            }
        }
        if fields.is_empty() {
            return Err(TaskStoreError::NotFound(task_id.to_string()));
        }
        assemble(fields)
    }

    /// The ids of `caller`'s tasks, newest first (at most [`CALLER_INDEX_MAX`];
    /// some may have expired since).
    pub async fn caller_tasks(&self, caller: &str) -> Result<Vec<String>, TaskStoreError> {
        let mut connection = self.connection().await?;
        connection
            .zrevrange(self.caller_index_key(caller), 0, -1)
            .await
            .map_err(unavailable)
    }

    /// Records that `from` names the task `to`, for the retention: a router
    /// that accepted a submission into its local buffer while Redis was away
    /// answered it with `from`, and on replay found its `request_id` already
    /// held by `to` (the caller had submitted it before, and that write had
    /// reached Redis). Without the alias, `from` would answer 404 forever.
    pub async fn alias(&self, from: &str, to: &str) -> Result<(), TaskStoreError> {
        let mut connection = self.connection().await?;
        connection
            .set_ex::<_, _, ()>(self.alias_key(from), to, self.retention_s)
            .await
            .map_err(unavailable)
    }

    /// Several tasks at once (their lanes may be on different shards), in
    /// order; `None` for those that are gone.
    pub async fn get_many(&self, task_ids: &[String]) -> Result<Vec<Option<Task>>, TaskStoreError> {
        if task_ids.is_empty() {
            return Ok(Vec::new());
        }
        let connection = self.connection().await?;
        let reads = task_ids.iter().map(|task_id| {
            let mut connection = connection.clone();
            async move {
                connection
                    .hgetall::<_, HashMap<String, String>>(self.task_key(task_id))
                    .await
                    .map_err(unavailable)
            }
        });
        futures::future::join_all(reads)
            .await
            .into_iter()
            .map(|fields| {
                let fields = fields?;
                (!fields.is_empty()).then(|| assemble(fields)).transpose()
            })
            .collect()
    }

    /// Sets (`Some`) or deletes (`None`) the callback of a task that has not
    /// ended; the outcome's callback is sent to the one set last.
    pub async fn set_callback(&self, task_id: &str, callback: Option<&Callback>) -> Result<(), TaskStoreError> {
        let record = match callback {
            Some(callback) => {
                serde_json::to_string(callback).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?
            }
            None => "null".to_string(),
        };
        let open: Vec<&str> = State::ALL
            .into_iter()
            .filter(|state| !state.is_terminal())
            .map(State::as_str)
            .collect();
        let mut connection = self.connection().await?;
        let answer: Vec<String> = self
            .scripts
            .set_callback
            .key(self.task_key(task_id))
            .arg(record)
            .arg(open)
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        match answer.first().map(String::as_str) {
            Some("ok") => Ok(()),
            Some("missing") => Err(TaskStoreError::NotFound(task_id.to_string())),
            Some("refused") => Err(TaskStoreError::Refused {
                current: answer.get(1).cloned().unwrap_or_default(),
                wanted: "given a callback".to_string(),
            }),
            other => Err(TaskStoreError::Corrupt(format!("unexpected script answer {other:?}"))),
        }
    }

    /// Moves a task to `next` if the transition table allows it from its current state.
    pub async fn transition(&self, task_id: &str, next: State) -> Result<State, TaskStoreError> {
        let attempts = if next == State::Running { 1 } else { 0 };
        let mut connection = self.connection().await?;
        let answer: Vec<String> = self
            .scripts
            .transition
            .key(self.task_key(task_id))
            .key(self.backlog_key(lane_of(task_id)))
            .arg(next.as_str())
            .arg(now_ms())
            .arg(attempts)
            .arg(state_args(next))
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        script_answer(answer, task_id, next)
    }

    /// Records a terminal outcome (and acknowledges the queue entry when
    /// given); `report` (agent name, fingerprint) makes it an agent's report.
    /// The idempotency key's retention starts again with it (on a cluster
    /// beside it, the key being in its own slot: a failure there leaves it
    /// the retention from the submission); once the outcome is recorded, a
    /// session's task is appended to its results.
    async fn record_end(
        &self,
        task: &Task,
        state: State,
        result: &Value,
        entry: Option<(&str, &str)>,
        report: Option<(&str, &str)>,
    ) -> Result<Vec<String>, TaskStoreError> {
        let lane = lane_of(&task.task_id);
        let queue_key = self.queue_of(task);
        let (queue, entry_id) = entry.unwrap_or((&queue_key, ""));
        let (reporter, fingerprint) = report.unwrap_or(("", ""));
        let connection = self.connection().await?;
        let one_server = !self.is_cluster();
        let request_key = self.request_key(&task.caller, &task.request_id);
        let record = async {
            let mut connection = connection.clone();
            let mut invocation = self.scripts.finish.key(self.task_key(&task.task_id));
            invocation
                .key(queue)
                .key(self.backlog_key(lane))
                .key(self.callbacks_key(lane))
                .key(self.followups_key(lane));
            if one_server {
                invocation.key(&request_key);
            }
            invocation
                .arg(state.as_str())
                .arg(now_ms())
                .arg(result.to_string())
                .arg(entry_id)
                .arg(GROUP)
                .arg(self.retention_s)
                .arg(&task.task_id)
                // A callback is scheduled with the outcome, durably: any router delivers it.
                .arg(if task.callback.is_some() && state != State::Canceled {
                    "1"
                } else {
                    "0"
                })
                .arg(reporter)
                .arg(fingerprint)
                .arg(if task.session_id.is_some() { "1" } else { "0" })
                .arg(if one_server { "1" } else { "0" })
                .arg(state_args(state))
                .invoke_async::<Vec<String>>(&mut connection)
                .await
                .map_err(unavailable)
        };
        let retain = async {
            if one_server {
                return Ok(());
            }
            self.retain_request(&connection, task).await
        };
        let (answer, retained) = tokio::join!(record, retain);
        let answer = answer?;
        if let Err(error) = retained {
            tracing::warn!(
                message = "An ended task's idempotency key keeps the retention from its submission.",
                task_id = %task.task_id, %error
            );
        }
        if answer.first().map(String::as_str) == Some("ok") && task.session_id.is_some() {
            // The outcome is durable; a worker applies this if it fails here.
            if let Err(error) = self.publish_result(&connection, task, state).await {
                tracing::warn!(
                    message = "An ended task's session result is not appended yet; a worker retries it.",
                    task_id = %task.task_id, %error
                );
            }
        }
        Ok(answer)
    }

    /// Starts the retention of a task's idempotency key again (from its end).
    async fn retain_request(&self, connection: &Connection, task: &Task) -> Result<(), TaskStoreError> {
        let mut connection = connection.clone();
        connection
            .expire::<_, i64>(
                self.request_key(&task.caller, &task.request_id),
                i64::try_from(self.retention_s).unwrap_or(i64::MAX),
            )
            .await
            .map(drop)
            .map_err(unavailable)
    }

    /// Appends an ended task of a session to its results (once), then drops
    /// its follow-up entry.
    async fn publish_result(&self, connection: &Connection, task: &Task, state: State) -> Result<(), TaskStoreError> {
        let mut connection = connection.clone();
        if let Some(session) = task.session_id.as_deref() {
            let (results, seen) = self.results_keys(session);
            self.scripts
                .publish
                .key(results)
                .key(seen)
                .arg(&task.task_id)
                .arg(state.as_str())
                .arg(self.retention_s)
                .invoke_async::<i64>(&mut connection)
                .await
                .map_err(unavailable)?;
        }
        connection
            .zrem::<_, _, i64>(self.followups_key(lane_of(&task.task_id)), &task.task_id)
            .await
            .map(drop)
            .map_err(unavailable)
    }

    /// Applies the follow-ups of tasks whose router ended them more than
    /// [`FOLLOWUP_GRACE`] ago and did not get to it (it died, or Redis
    /// failed it): each is leased to this store for a while, so routers
    /// sweeping at once share the work. At most once a second per store.
    async fn sweep_followups(&self) {
        let now = now_ms();
        let last = self.last_followup_sweep_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < FOLLOWUP_SWEEP_EVERY_MS
            || self
                .last_followup_sweep_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let Ok(connection) = self.connection().await else {
            return;
        };
        let due_before = now.saturating_sub(u64::try_from(FOLLOWUP_GRACE.as_millis()).unwrap_or(u64::MAX));
        let leases = (0..LANES).map(|lane| {
            let mut connection = connection.clone();
            async move {
                self.scripts
                    .lease_due
                    .key(self.followups_key(lane))
                    .arg(due_before)
                    .arg(now + FOLLOWUP_LEASE_MS)
                    .arg(100)
                    .invoke_async::<Vec<String>>(&mut connection)
                    .await
            }
        });
        let due: Vec<String> = futures::future::join_all(leases)
            .await
            .into_iter()
            .filter_map(Result::ok)
            .flatten()
            .collect();
        for task_id in due {
            let outcome = match self.get(&task_id).await {
                Ok(task) if task.state.is_terminal() => {
                    let (retained, published) = tokio::join!(
                        self.retain_request(&connection, &task),
                        self.publish_result(&connection, &task, task.state)
                    );
                    retained.and(published)
                }
                // Expired (or not ended after all): nothing is left to apply.
                Ok(_) | Err(TaskStoreError::NotFound(_)) => {
                    let mut connection = connection.clone();
                    connection
                        .zrem::<_, _, i64>(self.followups_key(lane_of(&task_id)), &task_id)
                        .await
                        .map(drop)
                        .map_err(unavailable)
                }
                Err(error) => Err(error),
            };
            if let Err(error) = outcome {
                tracing::warn!(message = "A left follow-up is not applied yet; retrying later.", %task_id, %error);
            }
        }
    }

    /// A worker's task ended: record it and acknowledge its queue entry.
    /// A task canceled meanwhile stays canceled (`Refused`), and its entry is
    /// acknowledged all the same.
    pub async fn finish(&self, claimed: &Claimed, state: State, result: &Value) -> Result<State, TaskStoreError> {
        let answer = self
            .record_end(
                &claimed.task,
                state,
                result,
                Some((&claimed.queue, &claimed.entry_id)),
                None,
            )
            .await?;
        script_answer(answer, &claimed.task.task_id, state)
    }

    /// Keeps a running delivery's claim fresh so no router reclaims it; `false`
    /// when this worker no longer holds the entry (another took it over).
    pub async fn extend_claim(&self, claimed: &Claimed) -> Result<bool, TaskStoreError> {
        let mut connection = self.connection().await?;
        let held: i64 = self
            .scripts
            .extend
            .key(&claimed.queue)
            .arg(GROUP)
            .arg(&claimed.consumer)
            .arg(&claimed.entry_id)
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        Ok(held == 1)
    }

    /// The agent answered the delivery `202`: records who reports, until when.
    pub async fn accept(&self, claimed: &Claimed, accepted: &Accepted) -> Result<(), TaskStoreError> {
        let record = serde_json::to_string(accepted).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
        let mut connection = self.connection().await?;
        let answer: Vec<String> = self
            .scripts
            .accept
            .key(self.task_key(&claimed.task.task_id))
            .arg(record)
            .arg(&accepted.agent_name)
            .arg(&claimed.entry_id)
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        script_answer(answer, &claimed.task.task_id, State::Running).map(|_| ())
    }

    /// An agent's report (`report`, as it sent it) of an accepted delivery's
    /// outcome (`state`, `result`), by `agent_name` (its token's subject):
    /// ends the task once; the same report again changes nothing.
    pub async fn report(
        &self,
        task: &Task,
        agent_name: &str,
        (state, result): (State, &Value),
        report: &Value,
    ) -> Result<Reported, TaskStoreError> {
        use sha2::Digest as _;
        let task_id = &task.task_id;
        // Compared, not kept: a digest of the report stands for it.
        let fingerprint = hex::encode(sha2::Sha256::digest(report.to_string().as_bytes()));
        let answer = self
            .record_end(task, state, result, None, Some((agent_name, &fingerprint)))
            .await?;
        let current = || answer.get(1).cloned().unwrap_or_default();
        let parsed = || {
            State::parse(&current())
                .ok_or_else(|| TaskStoreError::Corrupt(format!("task {task_id} has an unknown state")))
        };
        match answer.first().map(String::as_str) {
            Some("ok") => Ok(Reported::Recorded(state)),
            Some("repeat") => Ok(Reported::Repeated(parsed()?)),
            Some("missing") => Err(TaskStoreError::NotFound(task_id.to_string())),
            Some("not_accepted") => Err(TaskStoreError::NotAwaitingResult { current: current() }),
            Some("wrong_agent") => Err(TaskStoreError::NotTheAgent {
                expected: answer.get(2).cloned().unwrap_or_default(),
                reporter: agent_name.to_string(),
            }),
            Some("conflict") => Err(TaskStoreError::ResultConflict { current: current() }),
            other => Err(TaskStoreError::Corrupt(format!("unexpected script answer {other:?}"))),
        }
    }

    /// Cancels a task that has not ended; a pending one is never delivered.
    pub async fn cancel(&self, task_id: &str, result: &Value) -> Result<State, TaskStoreError> {
        self.complete(task_id, State::Canceled, result).await
    }

    /// Ends a task that has no queue entry of its own (a broadcast parent).
    pub async fn complete(&self, task_id: &str, state: State, result: &Value) -> Result<State, TaskStoreError> {
        let task = self.get(task_id).await?;
        let answer = self.record_end(&task, state, result, None, None).await?;
        script_answer(answer, task_id, state)
    }

    /// The task a caller submitted under `request_id`, if it is still kept.
    pub async fn find(&self, caller: &str, request_id: &str) -> Result<Option<String>, TaskStoreError> {
        let mut connection = self.connection().await?;
        connection
            .get(self.request_key(caller, request_id))
            .await
            .map_err(unavailable)
    }

    /// Takes up to `count` new entries, high priority first. Every fourth call
    /// looks at the low priority first, so a steady stream of high-priority
    /// work cannot starve it. Within a priority the capabilities with tasks
    /// waiting take turns, one task each. Canceled tasks are acknowledged and
    /// skipped. Also applies follow-ups a dead router left (at most once a second).
    ///
    /// The claim is planned on the lanes' backlog counts (read at once from
    /// every lane, at most [`BACKLOG_VIEW_FOR`] ago, less what this store
    /// claimed since), then each lane with work is asked for its share in one
    /// script: never more than `count` entries are taken.
    pub async fn claim(&self, consumer: &str, count: usize, round: u64) -> Result<Vec<Claimed>, TaskStoreError> {
        self.sweep_followups().await;
        let order = if round % 4 == 3 {
            [Priority::Low, Priority::High, Priority::Normal]
        } else {
            [Priority::High, Priority::Normal, Priority::Low]
        };
        let backlogs = self.backlog_view().await?;
        let mut plan: Vec<Vec<(String, usize)>> = vec![Vec::new(); LANES];
        let mut left = count;
        for priority in order {
            // (lane, capability, waiting) at this priority, in a stable order turned by the round.
            let mut waiting: Vec<(usize, String, usize)> = backlogs
                .iter()
                .enumerate()
                .flat_map(|(lane, counts)| {
                    counts.iter().filter_map(move |(field, waiting)| {
                        let (capability, named) = field.rsplit_once('|')?;
                        (named == priority.as_str() && *waiting > 0)
                            .then(|| (lane, capability.to_string(), usize::try_from(*waiting).unwrap_or(0)))
                    })
                })
                .collect();
            waiting.sort();
            if waiting.is_empty() {
                continue;
            }
            let turn = usize::try_from(round % waiting.len() as u64).unwrap_or(0);
            waiting.rotate_left(turn);
            let mut taken = vec![0usize; waiting.len()];
            while left > 0 {
                let mut progressed = false;
                for (at, (_, _, wanted)) in waiting.iter().enumerate() {
                    if left > 0 && taken[at] < *wanted {
                        taken[at] += 1;
                        left -= 1;
                        progressed = true;
                    }
                }
                if !progressed {
                    break;
                }
            }
            for ((lane, capability, _), taken) in waiting.into_iter().zip(taken) {
                if taken > 0 {
                    plan[lane].push((self.queue_key(lane, &capability, priority), taken));
                }
            }
        }
        self.note_planned(&plan);
        let connection = self.connection().await?;
        let terminal = terminal_states();
        let claims = plan
            .into_iter()
            .enumerate()
            .filter(|(_, queues)| !queues.is_empty())
            .map(|(lane, queues)| {
                let mut connection = connection.clone();
                let terminal = &terminal;
                async move {
                    let mut invocation = self.scripts.claim.key(self.queues_key(lane));
                    invocation
                        .arg(GROUP)
                        .arg(consumer)
                        .arg(self.task_prefix(lane))
                        .arg(terminal);
                    for (queue, taken) in &queues {
                        invocation.arg(queue).arg(*taken);
                    }
                    invocation
                        .invoke_async::<RedisValue>(&mut connection)
                        .await
                        .map_err(unavailable)
                }
            });
        let mut claimed = Vec::new();
        for reply in futures::future::join_all(claims).await {
            claimed.extend(taken_entries(&reply?, consumer)?);
        }
        // High priority first (as planned), whatever lane answered first.
        claimed.sort_by_key(|claimed| order.iter().position(|priority| *priority == claimed.task.priority));
        Ok(claimed)
    }

    /// The backlog counts to plan a claim on: the last ones read, unless
    /// they are older than [`BACKLOG_VIEW_FOR`].
    async fn backlog_view(&self) -> Result<Backlogs, TaskStoreError> {
        if let Some((read, backlogs)) = self
            .backlog_view
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_ref()
        {
            if read.elapsed() < BACKLOG_VIEW_FOR {
                return Ok(backlogs.clone());
            }
        }
        let backlogs = self.lane_backlogs().await?;
        *self
            .backlog_view
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((std::time::Instant::now(), backlogs.clone()));
        Ok(backlogs)
    }

    /// Counts a task this store just queued in the backlog view, so this
    /// router's next claim sees it without reading the backlogs again.
    fn note_queued(&self, lane: usize, field: &str) {
        let mut view = self
            .backlog_view
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(counts) = view.as_mut().and_then(|(_, backlogs)| backlogs.get_mut(lane)) {
            *counts.entry(field.to_string()).or_default() += 1;
        }
    }

    /// Takes what a claim asks for off the backlog view, so the next claim
    /// within the view's life asks for what is left.
    fn note_planned(&self, plan: &[Vec<(String, usize)>]) {
        let mut view = self
            .backlog_view
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some((_, backlogs)) = view.as_mut() else { return };
        for (lane, queues) in plan.iter().enumerate() {
            let Some(counts) = backlogs.get_mut(lane) else { continue };
            let prefix = format!("{}:", self.lane_key("queue", lane));
            for (queue, taken) in queues {
                // `queue:{L}:<capability>:<priority>` counts under `<capability>|<priority>`.
                let Some((capability, priority)) = queue.strip_prefix(&prefix).and_then(|rest| rest.rsplit_once(':'))
                else {
                    continue;
                };
                if let Some(waiting) = counts.get_mut(&format!("{capability}|{priority}")) {
                    *waiting -= i64::try_from(*taken).unwrap_or(i64::MAX);
                }
            }
        }
    }

    /// Takes over entries another worker took more than `min_idle` ago and
    /// never acknowledged (it died): the work is not lost.
    pub async fn reclaim(
        &self,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<Claimed>, TaskStoreError> {
        let connection = self.connection().await?;
        let terminal = terminal_states();
        let mut claimed = Vec::new();
        for lane in 0..LANES {
            let left = count.saturating_sub(claimed.len());
            if left == 0 {
                break;
            }
            let mut connection = connection.clone();
            let reply: RedisValue = self
                .scripts
                .reclaim
                .key(self.queues_key(lane))
                .arg(GROUP)
                .arg(consumer)
                .arg(self.task_prefix(lane))
                .arg(&terminal)
                .arg(u64::try_from(min_idle.as_millis()).unwrap_or(u64::MAX))
                .arg(left)
                .invoke_async(&mut connection)
                .await
                .map_err(unavailable)?;
            claimed.extend(taken_entries(&reply, consumer)?);
        }
        Ok(claimed)
    }

    /// Finished tasks of a session after `after` (exclusive; `None` = from the start).
    pub async fn session_results(
        &self,
        session_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SessionResult>, TaskStoreError> {
        let start = after.map_or_else(|| "-".to_string(), |cursor| format!("({cursor}"));
        let mut connection = self.connection().await?;
        let reply: RedisValue = redis::cmd("XRANGE")
            .arg(self.results_keys(session_id).0)
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(limit.max(1))
            .query_async(&mut connection)
            .await
            .map_err(unavailable)?;
        let entries = entry_fields(&reply);
        let ids: Vec<String> = entries
            .iter()
            .map(|(_, fields)| fields.get("task_id").cloned().unwrap_or_default())
            .collect();
        let tasks = self.get_many(&ids).await?;
        let mut out = Vec::new();
        for ((cursor, fields), (task_id, task)) in entries.into_iter().zip(ids.into_iter().zip(tasks)) {
            let state = fields
                .get("state")
                .and_then(|state| State::parse(state))
                .ok_or_else(|| TaskStoreError::Corrupt(format!("session result {cursor} has no state")))?;
            out.push(SessionResult {
                cursor,
                task_id,
                state,
                result: task.and_then(|task| task.result),
            });
        }
        Ok(out)
    }

    /// Parks an undeliverable callback with its result; nothing is lost.
    pub async fn dead_letter(&self, task: &Task, url: &str, error: &str) -> Result<(), TaskStoreError> {
        let mut connection = self.connection().await?;
        let result = task.result.as_ref().map(Value::to_string).unwrap_or_default();
        let _: String = redis::cmd("XADD")
            .arg(self.dead_letter_key())
            .arg("*")
            .arg("task_id")
            .arg(&task.task_id)
            .arg("url")
            .arg(url)
            .arg("error")
            .arg(error)
            .arg("result")
            .arg(result)
            .query_async(&mut connection)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Tasks waiting to be delivered, as ((capability, priority), count),
    /// summed over the lanes.
    pub async fn backlog(&self) -> Result<Vec<((String, Priority), i64)>, TaskStoreError> {
        let mut totals: HashMap<(String, Priority), i64> = HashMap::new();
        for counts in self.lane_backlogs().await? {
            for (field, count) in counts {
                let Some((capability, priority)) = field.rsplit_once('|') else {
                    continue;
                };
                let Some(priority) = Priority::ALL.into_iter().find(|known| known.as_str() == priority) else {
                    continue;
                };
                *totals.entry((capability.to_string(), priority)).or_default() += count.max(0);
            }
        }
        let mut out: Vec<_> = totals.into_iter().collect();
        out.sort();
        Ok(out)
    }

    /// Callbacks due now (at most `limit`), each leased to the caller until
    /// `lease_until_ms`; the lanes are asked in turn, from a different one each call.
    pub async fn claim_due_callbacks(&self, lease_until_ms: u64, limit: usize) -> Result<Vec<String>, TaskStoreError> {
        let connection = self.connection().await?;
        let first = self.next_callback_lane.fetch_add(1, Ordering::Relaxed);
        let now = now_ms();
        let mut due = Vec::new();
        for offset in 0..LANES {
            let left = limit.max(1).saturating_sub(due.len());
            if left == 0 {
                break;
            }
            let mut connection = connection.clone();
            let lane = (first + offset) % LANES;
            let taken: Vec<String> = self
                .scripts
                .lease_due
                .key(self.callbacks_key(lane))
                .arg(now)
                .arg(lease_until_ms)
                .arg(left)
                .invoke_async(&mut connection)
                .await
                .map_err(unavailable)?;
            due.extend(taken);
        }
        Ok(due)
    }

    /// Counts one more callback attempt for `task_id`; returns the count.
    pub async fn count_callback_attempt(&self, task_id: &str) -> Result<u32, TaskStoreError> {
        let mut connection = self.connection().await?;
        let count: i64 = connection
            .hincr(self.task_key(task_id), "callback_attempts", 1)
            .await
            .map_err(unavailable)?;
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }

    /// Schedules the next callback attempt, or (`None`) drops it: delivered or dead-lettered.
    pub async fn reschedule_callback(&self, task_id: &str, due_ms: Option<u64>) -> Result<(), TaskStoreError> {
        let mut connection = self.connection().await?;
        let schedule = self.callbacks_key(lane_of(task_id));
        match due_ms {
            Some(due) => connection.zadd(schedule, task_id, due).await.map_err(unavailable),
            None => connection.zrem(schedule, task_id).await.map_err(unavailable),
        }
    }

    /// Entries in the dead-letter stream.
    pub async fn dead_letter_count(&self) -> Result<u64, TaskStoreError> {
        let mut connection = self.connection().await?;
        redis::cmd("XLEN")
            .arg(self.dead_letter_key())
            .query_async(&mut connection)
            .await
            .map_err(unavailable)
    }

    /// Tasks claimed by a worker and not yet acknowledged (running or being
    /// retried), per priority: the queues' consumer-group pending counts.
    pub async fn running(&self) -> Result<Vec<(Priority, u64)>, TaskStoreError> {
        let connection = self.connection().await?;
        let counts = (0..LANES).map(|lane| {
            let mut connection = connection.clone();
            async move {
                self.scripts
                    .running
                    .key(self.queues_key(lane))
                    .arg(GROUP)
                    .invoke_async::<Vec<(String, u64)>>(&mut connection)
                    .await
                    .map_err(unavailable)
            }
        });
        let mut totals: Vec<(Priority, u64)> = Priority::ALL.into_iter().map(|priority| (priority, 0)).collect();
        for lane in futures::future::join_all(counts).await {
            for (queue, count) in lane? {
                if let Some((_, total)) = totals
                    .iter_mut()
                    .find(|(priority, _)| queue.ends_with(&format!(":{}", priority.as_str())))
                {
                    *total += count;
                }
            }
        }
        Ok(totals)
    }

    /// Dead-lettered callbacks as (task id, result JSON), oldest first.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<(String, String)>, TaskStoreError> {
        Ok(self
            .list_dead_letters(None, limit)
            .await?
            .into_iter()
            .map(|letter| {
                let result = letter.result.as_ref().map(Value::to_string).unwrap_or_default();
                (letter.task_id, result)
            })
            .collect())
    }

    /// Dead letters after `after` (exclusive; `None`: from the oldest), at most `limit`.
    pub async fn list_dead_letters(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, TaskStoreError> {
        let start = after.map_or_else(|| "-".to_string(), |id| format!("({id}"));
        self.read_dead_letters(&start, "+", limit.max(1)).await
    }

    /// One dead letter by id.
    pub async fn dead_letter_entry(&self, id: &str) -> Result<DeadLetter, TaskStoreError> {
        self.read_dead_letters(id, id, 1)
            .await?
            .pop()
            .ok_or_else(|| TaskStoreError::DeadLetterNotFound(id.to_string()))
    }

    async fn read_dead_letters(&self, start: &str, end: &str, limit: usize) -> Result<Vec<DeadLetter>, TaskStoreError> {
        let mut connection = self.connection().await?;
        let reply: RedisValue = redis::cmd("XRANGE")
            .arg(self.dead_letter_key())
            .arg(start)
            .arg(end)
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut connection)
            .await
            .map_err(unavailable)?;
        Ok(entry_fields(&reply)
            .into_iter()
            .map(|(id, fields)| {
                let field = |name: &str| fields.get(name).cloned().unwrap_or_default();
                DeadLetter {
                    result: fields.get("result").and_then(|text| serde_json::from_str(text).ok()),
                    task_id: field("task_id"),
                    url: field("url"),
                    error: field("error"),
                    id,
                }
            })
            .collect())
    }

    /// Sends a dead letter's callback again, from its first attempt (the
    /// usual schedule follows; a last failure parks a new dead letter).
    /// Returns the task id. A task past its retention cannot be replayed.
    /// The callback is scheduled (in the task's lane) before the dead letter
    /// is removed (in the tenant's stream): a failure between the two leaves
    /// the dead letter to replay again, never a callback lost.
    pub async fn replay_dead_letter(&self, id: &str) -> Result<String, TaskStoreError> {
        let letter = self.dead_letter_entry(id).await?;
        let mut connection = self.connection().await?;
        let answer: String = self
            .scripts
            .replay
            .key(self.task_key(&letter.task_id))
            .key(self.callbacks_key(lane_of(&letter.task_id)))
            .arg(&letter.task_id)
            .arg(now_ms())
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        match answer.as_str() {
            "ok" => {}
            "expired" => return Err(TaskStoreError::NotFound(letter.task_id)),
            other => return Err(TaskStoreError::Corrupt(format!("unexpected script answer {other:?}"))),
        }
        let _: i64 = redis::cmd("XDEL")
            .arg(self.dead_letter_key())
            .arg(id)
            .query_async(&mut connection)
            .await
            .map_err(unavailable)?;
        Ok(letter.task_id)
    }
}

fn script_answer(answer: Vec<String>, task_id: &str, wanted: State) -> Result<State, TaskStoreError> {
    let previous = |text: Option<&String>| {
        text.and_then(|text| State::parse(text))
            .ok_or_else(|| TaskStoreError::Corrupt(format!("task {task_id} has an unknown state")))
    };
    match answer.first().map(String::as_str) {
        Some("ok") => previous(answer.get(1)),
        Some("refused") => Err(TaskStoreError::Refused {
            current: answer.get(1).cloned().unwrap_or_default(),
            wanted: wanted.as_str().to_string(),
        }),
        Some("missing") => Err(TaskStoreError::NotFound(task_id.to_string())),
        other => Err(TaskStoreError::Corrupt(format!("unexpected script answer {other:?}"))),
    }
}

/// The claim and reclaim scripts' answer, `[[queue, entry id, [field, value, …]], …]`.
fn taken_entries(reply: &RedisValue, consumer: &str) -> Result<Vec<Claimed>, TaskStoreError> {
    let RedisValue::Array(entries) = reply else {
        return Ok(Vec::new());
    };
    let mut claimed = Vec::with_capacity(entries.len());
    for entry in entries {
        let RedisValue::Array(parts) = entry else {
            return Err(TaskStoreError::Corrupt("a claimed entry is not an array".to_string()));
        };
        let (Some(queue), Some(entry_id), Some(RedisValue::Array(record))) =
            (parts.first().and_then(text), parts.get(1).and_then(text), parts.get(2))
        else {
            return Err(TaskStoreError::Corrupt("a claimed entry lacks its parts".to_string()));
        };
        let mut fields = HashMap::new();
        for pair in record.chunks(2) {
            if let (Some(name), Some(value)) = (pair.first().and_then(text), pair.get(1).and_then(text)) {
                fields.insert(name, value);
            }
        }
        claimed.push(Claimed {
            task: assemble(fields)?,
            queue,
            entry_id,
            consumer: consumer.to_string(),
        });
    }
    Ok(claimed)
}

fn assemble(fields: HashMap<String, String>) -> Result<Task, TaskStoreError> {
    let corrupt = |what: &str| TaskStoreError::Corrupt(what.to_string());
    let spec: Spec = serde_json::from_str(fields.get("spec").ok_or_else(|| corrupt("no spec"))?)
        .map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
    let state = fields
        .get("state")
        .and_then(|state| State::parse(state))
        .ok_or_else(|| corrupt("unknown state"))?;
    let number = |name: &str| {
        fields
            .get(name)
            .and_then(|value| value.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let transitions = fields
        .get("transitions")
        .map(|lines| {
            lines
                .lines()
                .filter(|line| !line.is_empty())
                .map(serde_json::from_str::<Transition>)
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()
        .map_err(|error| TaskStoreError::Corrupt(error.to_string()))?
        .unwrap_or_default();
    let result = fields
        .get("result")
        .map(|text| serde_json::from_str::<Value>(text))
        .transpose()
        .map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
    let accepted = fields
        .get("accepted")
        .map(|text| serde_json::from_str::<Accepted>(text))
        .transpose()
        .map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
    // Set after submission (`set_callback`): replaces the spec's; `null` deleted it.
    let callback = match fields.get("callback") {
        Some(text) => serde_json::from_str::<Option<Callback>>(text)
            .map_err(|error| TaskStoreError::Corrupt(error.to_string()))?,
        None => spec.callback,
    };
    Ok(Task {
        task_id: spec.task_id,
        request_id: spec.request_id,
        session_id: spec.session_id,
        caller: spec.caller,
        capability: spec.capability,
        priority: spec.priority,
        state,
        envelope: spec.envelope,
        callback,
        target_agent: spec.target_agent,
        parent: spec.parent,
        children: spec.children,
        attempts: u32::try_from(number("attempts")).unwrap_or(u32::MAX),
        created_at_ms: spec.created_at_ms,
        updated_at_ms: number("updated_at_ms"),
        transitions,
        result,
        accepted,
    })
}

// === Stream replies ===

fn text(value: &RedisValue) -> Option<String> {
    match value {
        RedisValue::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        RedisValue::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

/// `[[id, [field, value, ...]], ...]` → (id, fields).
fn entry_fields(entries: &RedisValue) -> Vec<(String, HashMap<String, String>)> {
    let RedisValue::Array(entries) = entries else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|entry| {
            let RedisValue::Array(parts) = entry else { return None };
            let id = text(parts.first()?)?;
            let mut fields = HashMap::new();
            if let Some(RedisValue::Array(pairs)) = parts.get(1) {
                for pair in pairs.chunks(2) {
                    if let (Some(name), Some(value)) = (pair.first().and_then(text), pair.get(1).and_then(text)) {
                        fields.insert(name, value);
                    }
                }
            }
            Some((id, fields))
        })
        .collect()
}
