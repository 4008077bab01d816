//! Durable tasks on Redis.
//!
//! Layout under `{prefix}:{tenant}`:
//! - `task:{id}` — hash: `spec` (immutable JSON: envelope, caller, callback …),
//!   `state`, `attempts`, `updated_at_ms`, `transitions` (JSON lines), `result`.
//! - `task_req:{caller}:{request_id}` — the idempotency key → task id.
//! - `task_alias:{id}` — string, kept for the retention: a task id a router
//!   gave out from its local buffer for a `request_id` that Redis already
//!   had, naming the task that holds it ([`TaskStore::alias`]).
//! - `queue:{priority}` — a stream per priority, consumer group `workers`.
//!   An entry is acknowledged only by the script that records the task's
//!   outcome, so a worker that dies mid-task leaves it pending for another
//!   worker to reclaim; nothing is acknowledged on receipt.
//! - `results:{session_id}` — finished tasks of a session, in order, for callers
//!   that reconnect (`GET /v1/sessions/{id}/results?after=CURSOR`).
//! - `dead_letters` — callbacks that could not be delivered, with their result;
//!   listed, read and replayed by operators (`GET /v1/dead-letters`).
//! - `tasks_of:{caller}` — sorted set: a caller's newest task ids by creation
//!   time (at most [`CALLER_INDEX_MAX`]), for A2A's `ListTasks`.
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
//! Every multi-key change is one Lua script; the allowed predecessor states
//! come from [`State::predecessors`], the one transition table.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script, Value as RedisValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::{Accepted, Callback, Priority, State, Task, Transition};

const GROUP: &str = "workers";

/// How many task ids a caller's index keeps (its newest): bounds the index of
/// a caller that submits without end.
pub const CALLER_INDEX_MAX: usize = 1000;

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
    TaskStoreError::Unavailable(error.to_string())
}

/// A fresh task id (`t_` and 96 random bits in hex).
pub fn new_task_id() -> String {
    format!("t_{:016x}{:08x}", rand::random::<u64>(), rand::random::<u32>())
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
    /// Acknowledge a submission only once this many replicas have it (`WAIT`).
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
    connection: std::sync::Mutex<Option<(u64, ConnectionManager)>>,
    wait: Option<agent_reach_stores::Wait>,
    namespace: String,
    /// The tenant whose tasks these are (the second part of `namespace`).
    tenant: String,
    retention_s: u64,
    submit: Script,
    transition: Script,
    finish: Script,
    claim_callbacks: Script,
    tls: agent_reach_stores::TlsFiles,
    extend: Script,
    accept: Script,
    replay: Script,
    set_callback: Script,
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
        (None, agent_reach_stores::Nodes::Sentinel { .. }) => {
            return Err("a Sentinel URL needs the primary's address".to_string())
        }
    };
    let addr = if url.tls {
        redis::ConnectionAddr::TcpTls {
            host: node.host.clone(),
            port: node.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        redis::ConnectionAddr::Tcp(node.host.clone(), node.port)
    };
    let mut settings = redis::RedisConnectionInfo::default().set_db(url.db);
    if let Some(username) = &url.username {
        settings = settings.set_username(username);
    }
    if let Some(password) = &url.password {
        settings = settings.set_password(password);
    }
    let info = redis::IntoConnectionInfo::into_connection_info(addr)
        .map_err(|error| format!("Redis {node}: {error}"))?
        .set_redis_settings(settings);
    let client = if url.tls {
        redis::Client::build_with_tls(info, tls.redis_certificates())
    } else {
        redis::Client::open(info)
    };
    client.map_err(|error| format!("Redis {node}: {}", agent_reach_stores::error_chain(&error)))
}

const SUBMIT: &str = r#"
-- KEYS: 1 idempotency key, 2 task hash, 3 queue, 4 backlog hash, 5 the caller's index
-- ARGV: 1 task id, 2 spec JSON, 3 retention s, 4 now ms, 5 backlog field (capability|priority),
--       6 queue it ('1'/'0': a held broadcast parent is stored only), 7 index size,
--       8 the tenant's backlog bound ('0': none): refused with {2, waiting} at or over it
local existing = redis.call('GET', KEYS[1])
if existing then return {0, existing} end
if ARGV[8] ~= '0' and ARGV[6] == '1' then
  local waiting = 0
  for _, count in ipairs(redis.call('HVALS', KEYS[4])) do waiting = waiting + tonumber(count) end
  if waiting >= tonumber(ARGV[8]) then return {2, tostring(waiting)} end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
redis.call('ZADD', KEYS[5], ARGV[4], ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[5], 0, -1 - tonumber(ARGV[7]))
redis.call('EXPIRE', KEYS[5], ARGV[3])
redis.call('HSET', KEYS[2], 'spec', ARGV[2], 'state', 'pending', 'attempts', 0, 'updated_at_ms', ARGV[4],
  'transitions', '{"state":"pending","at_ms":' .. ARGV[4] .. '}\n')
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[2], 'backlog', ARGV[5])
  redis.call('HINCRBY', KEYS[4], ARGV[5], 1)
  redis.call('XADD', KEYS[3], '*', 'task_id', ARGV[1])
end
return {1, ARGV[1]}
"#;

const CLAIM_CALLBACKS: &str = r#"
-- Takes callbacks that are due and pushes their due time out by a lease, so
-- one router delivers each; if it dies, the lease runs out and another does.
-- KEYS: 1 callback schedule; ARGV: 1 now ms, 2 lease until ms, 3 limit
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
for _, id in ipairs(due) do redis.call('ZADD', KEYS[1], 'XX', ARGV[2], id) end
return due
"#;

const TRANSITION: &str = r#"
-- KEYS: 1 task hash, 2 backlog hash
-- ARGV: 1 new state, 2 now ms, 3 attempts increment, 4.. allowed predecessor states
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
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
-- Records a terminal outcome, acknowledges the queue entry, appends to the
-- session's results and starts the retention clock, all at once.
-- KEYS: 1 task hash, 2 queue, 3 session results stream, 4 idempotency key, 5 backlog hash,
--       6 callback schedule (sorted set: task id by due time)
-- ARGV: 1 terminal state, 2 now ms, 3 result JSON, 4 queue entry id ('' = none),
--       5 group, 6 retention s, 7 task id, 8 has session ('1'/'0'), 9 has callback ('1'/'0'),
--       10 reporting agent ('' = not an agent's report), 11 the report's fingerprint,
--       12.. allowed predecessors
-- An agent's report is taken only from the agent that answered the delivery 202,
-- once: the same report again is 'repeat', another one 'conflict'.
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
local entry = ARGV[4]
if ARGV[10] ~= '' then
  local accepted = redis.call('HGET', KEYS[1], 'accepted_agent')
  if not accepted then return {'not_accepted', current} end
  if accepted ~= ARGV[10] then return {'wrong_agent', current, accepted} end
  local previous = redis.call('HGET', KEYS[1], 'report')
  if previous then
    if previous == ARGV[11] then return {'repeat', current} end
    return {'conflict', current}
  end
  entry = redis.call('HGET', KEYS[1], 'entry_id') or ''
end
local allowed = false
for i = 12, #ARGV do if current == ARGV[i] then allowed = true end end
if not allowed then
  if entry ~= '' then redis.call('XACK', KEYS[2], ARGV[5], entry) end
  if ARGV[10] ~= '' then return {'conflict', current} end
  return {'refused', current}
end
if ARGV[10] ~= '' then redis.call('HSET', KEYS[1], 'report', ARGV[11]) end
-- A callback set or deleted after submission (the `callback` field) replaces the spec's.
local has_callback = ARGV[9] == '1'
local replaced = redis.call('HGET', KEYS[1], 'callback')
if replaced then has_callback = replaced ~= 'null' and ARGV[1] ~= 'canceled' end
if has_callback then redis.call('ZADD', KEYS[6], ARGV[2], ARGV[7]) end
if current == 'pending' then
  local field = redis.call('HGET', KEYS[1], 'backlog')
  if field then redis.call('HINCRBY', KEYS[5], field, -1) end
end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'updated_at_ms', ARGV[2], 'result', ARGV[3])
redis.call('HSET', KEYS[1], 'transitions',
  (redis.call('HGET', KEYS[1], 'transitions') or '') .. '{"state":"' .. ARGV[1] .. '","at_ms":' .. ARGV[2] .. '}\n')
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('EXPIRE', KEYS[4], ARGV[6])
if entry ~= '' then redis.call('XACK', KEYS[2], ARGV[5], entry) end
if ARGV[8] == '1' then
  redis.call('XADD', KEYS[3], '*', 'task_id', ARGV[7], 'state', ARGV[1])
  redis.call('EXPIRE', KEYS[3], ARGV[6])
end
return {'ok', current}
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
-- Sends a dead-lettered callback again from its first attempt: due now, its
-- attempt count reset, the dead letter removed (a failure parks a new one).
-- KEYS: 1 dead-letter stream, 2 callback schedule, 3 task hash
-- ARGV: 1 dead letter id, 2 task id, 3 now ms
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return 'missing' end
if redis.call('EXISTS', KEYS[3]) == 0 then return 'expired' end
redis.call('HSET', KEYS[3], 'callback_attempts', 0)
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[1])
return 'ok'
"#;

fn state_args(next: State) -> Vec<&'static str> {
    State::predecessors(next).into_iter().map(State::as_str).collect()
}

impl TaskStore {
    /// Connects lazily; calls fail with `Unavailable` while Redis is down and
    /// succeed again once it is back. `url` is `redis://`, `rediss://`,
    /// `redis+sentinel://` or `rediss+sentinel://` (DESIGN §7.8).
    pub fn new(url: &str, config: &StoreConfig) -> Result<Self, String> {
        let parsed = agent_reach_stores::RedisUrl::parse(url)?;
        let link = match agent_reach_stores::Sentinels::from_url(&parsed, &config.tls) {
            Some(sentinels) => {
                let primary = agent_reach_stores::Primary::new(sentinels, Duration::from_secs(2));
                // Follows failovers in the background; requests never ask the Sentinels.
                if tokio::runtime::Handle::try_current().is_ok() {
                    primary.follow();
                }
                Link::Sentinel { primary, url: parsed }
            }
            None => Link::Direct(client_for(&parsed, None, &config.tls)?),
        };
        Ok(Self {
            link,
            connection: std::sync::Mutex::new(None),
            wait: config.wait,
            namespace: format!("{}:{}", config.prefix, config.tenant),
            tenant: config.tenant.clone(),
            retention_s: config.retention.as_secs().max(1),
            submit: Script::new(SUBMIT),
            transition: Script::new(TRANSITION),
            finish: Script::new(FINISH),
            claim_callbacks: Script::new(CLAIM_CALLBACKS),
            tls: config.tls.clone(),
            extend: Script::new(EXTEND),
            accept: Script::new(ACCEPT),
            replay: Script::new(REPLAY),
            set_callback: Script::new(SET_CALLBACK),
        })
    }

    /// The connection to the primary: the one open, unless the Sentinels
    /// have named another primary since it was opened (one atomic load).
    async fn connection(&self) -> Result<ConnectionManager, TaskStoreError> {
        let wanted = match &self.link {
            Link::Direct(_) => 0,
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
        *self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Some((generation, connection.clone()));
        Ok(connection)
    }

    /// The tenant whose tasks this store holds: deliveries are made on behalf
    /// of callers of this tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    fn task_key(&self, task_id: &str) -> String {
        format!("{}:task:{task_id}", self.namespace)
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

    fn queue_key(&self, priority: Priority) -> String {
        format!("{}:queue:{}", self.namespace, priority.as_str())
    }

    fn results_key(&self, session_id: &str) -> String {
        format!("{}:results:{session_id}", self.namespace)
    }

    fn callbacks_key(&self) -> String {
        format!("{}:callbacks", self.namespace)
    }

    fn backlog_key(&self) -> String {
        format!("{}:backlog", self.namespace)
    }

    fn dead_letter_key(&self) -> String {
        format!("{}:dead_letters", self.namespace)
    }

    /// Creates the consumer groups (idempotent). Call once at start-up.
    pub async fn prepare(&self) -> Result<(), TaskStoreError> {
        let mut connection = self.connection().await?;
        for priority in Priority::ALL {
            let created: redis::RedisResult<()> = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(self.queue_key(priority))
                .arg(GROUP)
                .arg("0")
                .arg("MKSTREAM")
                .query_async(&mut connection)
                .await;
            match created {
                Ok(()) => {}
                Err(error) if error.code() == Some("BUSYGROUP") => {}
                Err(error) => return Err(unavailable(error)),
            }
        }
        Ok(())
    }

    /// Stores the task and queues it, atomically; a repeated request id from
    /// the same caller returns the existing task instead.
    pub async fn submit(&self, task: NewTask) -> Result<Submitted, TaskStoreError> {
        self.submit_with_id(task, &new_task_id()).await
    }

    /// [`TaskStore::submit`] under a task id chosen by the caller (the
    /// router's local buffer gives ids out before Redis has the task).
    pub async fn submit_with_id(&self, task: NewTask, task_id: &str) -> Result<Submitted, TaskStoreError> {
        self.submit_within(task, task_id, None).await
    }

    /// [`TaskStore::submit_with_id`], refused with [`TaskStoreError::BacklogFull`]
    /// when `backlog_bound` tasks or more wait already (a tenant's quota; the
    /// count and the submission are one script, so a flood cannot overshoot it).
    pub async fn submit_within(
        &self,
        task: NewTask,
        task_id: &str,
        backlog_bound: Option<u64>,
    ) -> Result<Submitted, TaskStoreError> {
        let task_id = task_id.to_string();
        let spec = Spec {
            task_id: task_id.clone(),
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
        let spec_json = serde_json::to_string(&spec).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
        let mut connection = self.connection().await?;
        let (created, id): (i64, String) = self
            .submit
            .key(self.request_key(&task.caller, &task.request_id))
            .key(self.task_key(&task_id))
            .key(self.queue_key(task.priority))
            .key(self.backlog_key())
            .key(self.caller_index_key(&task.caller))
            .arg(&task_id)
            .arg(spec_json)
            .arg(self.retention_s)
            .arg(spec.created_at_ms)
            .arg(format!("{}|{}", spec.capability, task.priority.as_str()))
            .arg(if task.hold { "0" } else { "1" })
            .arg(CALLER_INDEX_MAX)
            .arg(backlog_bound.unwrap_or(0))
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        if created == 2 {
            return Err(TaskStoreError::BacklogFull {
                waiting: id.parse().unwrap_or(0),
                bound: backlog_bound.unwrap_or(0),
            });
        }
        if let Some(wait) = self.wait {
            // On the same connection, so it waits for this submission's write.
            let reached: i64 = redis::cmd("WAIT")
                .arg(wait.replicas)
                .arg(wait.timeout_ms())
                .query_async(&mut connection)
                .await
                .map_err(unavailable)?;
            if reached < i64::from(wait.replicas) {
                return Err(TaskStoreError::Unavailable(format!(
                    "the task reached {reached} of {} replicas within {} ms; it may survive a failover or not: \
                     submit again with the same request_id (it is not created twice)",
                    wait.replicas,
                    wait.timeout_ms()
                )));
            }
        }
        Ok(if created == 1 {
            Submitted::Created(id)
        } else {
            Submitted::Existing(id)
        })
    }

    /// The task `task_id` names: its own, or the one its alias points to.
    pub async fn get(&self, task_id: &str) -> Result<Task, TaskStoreError> {
        let mut connection = self.connection().await?;
        let mut fields: std::collections::HashMap<String, String> =
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

    /// Several tasks in one round trip, in order; `None` for those that are gone.
    pub async fn get_many(&self, task_ids: &[String]) -> Result<Vec<Option<Task>>, TaskStoreError> {
        if task_ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for task_id in task_ids {
            pipe.hgetall(self.task_key(task_id));
        }
        let mut connection = self.connection().await?;
        let found: Vec<std::collections::HashMap<String, String>> =
            pipe.query_async(&mut connection).await.map_err(unavailable)?;
        found
            .into_iter()
            .map(|fields| (!fields.is_empty()).then(|| assemble(fields)).transpose())
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
            .transition
            .key(self.task_key(task_id))
            .key(self.backlog_key())
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
    async fn record_end(
        &self,
        task: &Task,
        state: State,
        result: &Value,
        entry: Option<(&str, &str)>,
        report: Option<(&str, &str)>,
    ) -> Result<Vec<String>, TaskStoreError> {
        let queue_key = self.queue_key(task.priority);
        let (queue, entry_id) = entry.unwrap_or((&queue_key, ""));
        let (reporter, fingerprint) = report.unwrap_or(("", ""));
        let session = task.session_id.as_deref();
        let mut connection = self.connection().await?;
        self.finish
            .key(self.task_key(&task.task_id))
            .key(queue)
            .key(self.results_key(session.unwrap_or("-")))
            .key(self.request_key(&task.caller, &task.request_id))
            .key(self.backlog_key())
            .key(self.callbacks_key())
            .arg(state.as_str())
            .arg(now_ms())
            .arg(result.to_string())
            .arg(entry_id)
            .arg(GROUP)
            .arg(self.retention_s)
            .arg(&task.task_id)
            .arg(if session.is_some() { "1" } else { "0" })
            // A callback is scheduled with the outcome, durably: any router delivers it.
            .arg(if task.callback.is_some() && state != State::Canceled {
                "1"
            } else {
                "0"
            })
            .arg(reporter)
            .arg(fingerprint)
            .arg(state_args(state))
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)
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
    /// looks at the low queue first, so a steady stream of high-priority work
    /// cannot starve it. Canceled tasks are acknowledged and skipped.
    pub async fn claim(&self, consumer: &str, count: usize, round: u64) -> Result<Vec<Claimed>, TaskStoreError> {
        let order = if round % 4 == 3 {
            [Priority::Low, Priority::High, Priority::Normal]
        } else {
            [Priority::High, Priority::Normal, Priority::Low]
        };
        let mut connection = self.connection().await?;
        let mut claimed = Vec::new();
        for priority in order {
            let wanted = count.saturating_sub(claimed.len());
            if wanted == 0 {
                break;
            }
            let queue = self.queue_key(priority);
            let reply: RedisValue = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(GROUP)
                .arg(consumer)
                .arg("COUNT")
                .arg(wanted)
                .arg("STREAMS")
                .arg(&queue)
                .arg(">")
                .query_async(&mut connection)
                .await
                .map_err(unavailable)?;
            self.take_all(&mut claimed, consumer, &queue, stream_entries(&reply))
                .await?;
        }
        Ok(claimed)
    }

    /// Takes over entries another worker took more than `min_idle` ago and
    /// never acknowledged (it died): the work is not lost.
    pub async fn reclaim(
        &self,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<Claimed>, TaskStoreError> {
        let mut connection = self.connection().await?;
        let mut claimed = Vec::new();
        for priority in Priority::ALL {
            let queue = self.queue_key(priority);
            let reply: RedisValue = redis::cmd("XAUTOCLAIM")
                .arg(&queue)
                .arg(GROUP)
                .arg(consumer)
                .arg(u64::try_from(min_idle.as_millis()).unwrap_or(u64::MAX))
                .arg("0-0")
                .arg("COUNT")
                .arg(count)
                .query_async(&mut connection)
                .await
                .map_err(unavailable)?;
            // [next-cursor, [[id, [field, value]], ...], deleted-ids]
            if let RedisValue::Array(parts) = &reply {
                if let Some(entries) = parts.get(1) {
                    self.take_all(&mut claimed, consumer, &queue, entry_list(entries))
                        .await?;
                }
            }
        }
        Ok(claimed)
    }

    /// Loads the tasks of queue entries in one round trip; entries whose task
    /// ended (canceled) or expired are acknowledged and skipped.
    async fn take_all(
        &self,
        claimed: &mut Vec<Claimed>,
        consumer: &str,
        queue: &str,
        entries: Vec<(String, String)>,
    ) -> Result<(), TaskStoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (_, task_id) in &entries {
            pipe.hgetall(self.task_key(task_id));
        }
        let mut connection = self.connection().await?;
        let records: Vec<std::collections::HashMap<String, String>> =
            pipe.query_async(&mut connection).await.map_err(unavailable)?;
        for ((entry_id, _), fields) in entries.into_iter().zip(records) {
            let task = if fields.is_empty() {
                None
            } else {
                Some(assemble(fields)?)
            };
            match task {
                Some(task) if !task.state.is_terminal() => claimed.push(Claimed {
                    task,
                    queue: queue.to_string(),
                    entry_id,
                    consumer: consumer.to_string(),
                }),
                // Canceled (or finished) meanwhile, or expired: nothing to deliver.
                _ => self.ack(queue, &entry_id).await?,
            }
        }
        Ok(())
    }

    async fn ack(&self, queue: &str, entry_id: &str) -> Result<(), TaskStoreError> {
        let mut connection = self.connection().await?;
        let _: i64 = redis::cmd("XACK")
            .arg(queue)
            .arg(GROUP)
            .arg(entry_id)
            .query_async(&mut connection)
            .await
            .map_err(unavailable)?;
        Ok(())
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
            .arg(self.results_key(session_id))
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(limit.max(1))
            .query_async(&mut connection)
            .await
            .map_err(unavailable)?;
        let mut out = Vec::new();
        for (cursor, fields) in entry_fields(&reply) {
            let task_id = fields.get("task_id").cloned().unwrap_or_default();
            let state = fields
                .get("state")
                .and_then(|state| State::parse(state))
                .ok_or_else(|| TaskStoreError::Corrupt(format!("session result {cursor} has no state")))?;
            let result = match self.get(&task_id).await {
                Ok(task) => task.result,
                Err(TaskStoreError::NotFound(_)) => None,
                Err(error) => return Err(error),
            };
            out.push(SessionResult {
                cursor,
                task_id,
                state,
                result,
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

    /// Tasks waiting to be delivered, as ((capability, priority), count).
    pub async fn backlog(&self) -> Result<Vec<((String, Priority), i64)>, TaskStoreError> {
        let mut connection = self.connection().await?;
        let counts: std::collections::HashMap<String, i64> =
            connection.hgetall(self.backlog_key()).await.map_err(unavailable)?;
        let mut out = Vec::new();
        for (field, count) in counts {
            let Some((capability, priority)) = field.rsplit_once('|') else {
                continue;
            };
            let Some(priority) = Priority::ALL.into_iter().find(|known| known.as_str() == priority) else {
                continue;
            };
            out.push(((capability.to_string(), priority), count.max(0)));
        }
        out.sort();
        Ok(out)
    }

    /// Callbacks due now (at most `limit`), each leased to the caller until `lease_until_ms`.
    pub async fn claim_due_callbacks(&self, lease_until_ms: u64, limit: usize) -> Result<Vec<String>, TaskStoreError> {
        let mut connection = self.connection().await?;
        self.claim_callbacks
            .key(self.callbacks_key())
            .arg(now_ms())
            .arg(lease_until_ms)
            .arg(limit.max(1))
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)
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
        match due_ms {
            Some(due) => connection
                .zadd(self.callbacks_key(), task_id, due)
                .await
                .map_err(unavailable),
            None => connection
                .zrem(self.callbacks_key(), task_id)
                .await
                .map_err(unavailable),
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
    /// retried), per priority: each queue's consumer-group pending count.
    pub async fn running(&self) -> Result<Vec<(Priority, u64)>, TaskStoreError> {
        let mut connection = self.connection().await?;
        let mut out = Vec::new();
        for priority in Priority::ALL {
            // XPENDING's summary form: [count, first id, last id, consumers].
            let summary: (u64, RedisValue, RedisValue, RedisValue) = redis::cmd("XPENDING")
                .arg(self.queue_key(priority))
                .arg(GROUP)
                .query_async(&mut connection)
                .await
                .map_err(unavailable)?;
            out.push((priority, summary.0));
        }
        Ok(out)
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
    pub async fn replay_dead_letter(&self, id: &str) -> Result<String, TaskStoreError> {
        let letter = self.dead_letter_entry(id).await?;
        let mut connection = self.connection().await?;
        let answer: String = self
            .replay
            .key(self.dead_letter_key())
            .key(self.callbacks_key())
            .key(self.task_key(&letter.task_id))
            .arg(id)
            .arg(&letter.task_id)
            .arg(now_ms())
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        match answer.as_str() {
            "ok" => Ok(letter.task_id),
            "missing" => Err(TaskStoreError::DeadLetterNotFound(id.to_string())),
            "expired" => Err(TaskStoreError::NotFound(letter.task_id)),
            other => Err(TaskStoreError::Corrupt(format!("unexpected script answer {other:?}"))),
        }
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

fn assemble(fields: std::collections::HashMap<String, String>) -> Result<Task, TaskStoreError> {
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
fn entry_fields(entries: &RedisValue) -> Vec<(String, std::collections::HashMap<String, String>)> {
    let RedisValue::Array(entries) = entries else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|entry| {
            let RedisValue::Array(parts) = entry else { return None };
            let id = text(parts.first()?)?;
            let mut fields = std::collections::HashMap::new();
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

/// Entries of one stream as (id, task id).
fn entry_list(entries: &RedisValue) -> Vec<(String, String)> {
    entry_fields(entries)
        .into_iter()
        .filter_map(|(id, fields)| fields.get("task_id").cloned().map(|task_id| (id, task_id)))
        .collect()
}

/// An XREADGROUP reply `[[stream, entries]]` (or nil) → (id, task id).
fn stream_entries(reply: &RedisValue) -> Vec<(String, String)> {
    let RedisValue::Array(streams) = reply else {
        return Vec::new();
    };
    streams
        .iter()
        .flat_map(|stream| match stream {
            RedisValue::Array(parts) => parts.get(1).map(entry_list).unwrap_or_default(),
            _ => Vec::new(),
        })
        .collect()
}
