//! The Redis store (DESIGN §4).
//!
//! Layout, per tenant under a configurable prefix:
//! - `{prefix}:{tenant}:ctx:{context_id}`: one hash per context. User fields hold
//!   JSON text under their own names; the reserved entries start with `_` (which
//!   no field name can): `_version`, `_tier`, `_owner`, `_bytes` (running total of
//!   name and value bytes, so limits need no full read), `_expires` (epoch ms at
//!   which the TTL ends, so a read needs no PTTL). The hash carries the tier's
//!   TTL, refreshed by every write.
//! - `{prefix}:{tenant}:deadlines`: a sorted set, member = context id, score = the
//!   epoch ms at which the context dies if nobody touches it: `now + min(idle
//!   timeout, remaining TTL)` after a write, `now + idle timeout` after a read.
//!   Every read and write moves it; the sweeper deletes what is past it. This is
//!   the last-access tracking.
//!
//! Every write (create, patch, close) and the sweep is one Lua script, so it is
//! atomic and one round trip, with time from Redis (`TIME`) so replicas with
//! skewed clocks agree. Reads are one pipeline of plain commands (see `get`); their
//! deadline uses the service's clock, so clock skew shifts an idle deadline by at
//! most the skew.
//!
//! Connections are `ConnectionManager`s (they reconnect by themselves after
//! Redis restarts), one per serving thread, created lazily on that thread so
//! the service starts and answers 503 while Redis is down. A request on a
//! per-core worker runtime talks to Redis through a connection driven by that
//! same thread: no cross-thread wake-ups on the hot path. Every call is bounded
//! by a timeout.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};
use tokio::sync::OnceCell;

use super::{ContextStore, StoreError};
use crate::model::{CloseAs, NewContext, Patch, Selection, Snapshot, StorePolicy, SweepReport, Tier, Written};

/// Reserved hash entries (not user fields).
const RESERVED: [&str; 5] = ["_version", "_tier", "_owner", "_bytes", "_expires"];
/// The reserved entries a read returns (`_bytes` is for writes only).
const READ_RESERVED: [&str; 4] = ["_version", "_tier", "_owner", "_expires"];
/// Index entries removed per sweep script call (keeps each script short).
const SWEEP_BATCH: usize = 500;

/// Shared by every script: Redis' clock in milliseconds, and variadic calls
/// split so no `unpack` exceeds Lua's stack (1,000 arguments per call; even,
/// so name/value pairs stay together).
const PRELUDE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function each_chunk(command, key, list, into)
  for i = 1, #list, 1000 do
    local answer = redis.call(command, key, unpack(list, i, math.min(i + 999, #list)))
    if into then for k = 1, #answer do into[#into + 1] = answer[k] end end
  end
end
";

/// KEYS: ctx, deadlines. ARGV: id, tier, owner, ttl_ms, idle_ms, max_fields, max_bytes, name, value, ...
const CREATE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
local count = (#ARGV - 7) / 2
if count > tonumber(ARGV[6]) then return {'too_many_fields', count} end
local bytes = 0
local writes = {}
for i = 8, #ARGV, 2 do
  bytes = bytes + #ARGV[i] + #ARGV[i + 1]
  writes[#writes + 1] = ARGV[i]
  writes[#writes + 1] = ARGV[i + 1]
end
if bytes > tonumber(ARGV[7]) then return {'too_large', bytes} end
local ttl = tonumber(ARGV[4])
local reserved = {'_version', 1, '_tier', ARGV[2], '_owner', ARGV[3], '_bytes', bytes, '_expires', now + ttl}
for k = 1, #reserved do writes[#writes + 1] = reserved[k] end
each_chunk('HSET', KEYS[1], writes)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now + math.min(ttl, tonumber(ARGV[5])), ARGV[1])
return {'ok', 1, now + ttl}
";

/// KEYS: ctx, deadlines. ARGV: id, if_version ('' = none), default_ttl_ms, one_shot_ttl_ms,
/// idle_ms, max_fields, max_bytes, set_count, (name, value) * set_count, deleted names...
///
/// Five Redis calls for a patch that adds no field (TIME, one HMGET of the
/// reserved entries and every touched field, one HSET, PEXPIRE, ZADD), plus HLEN
/// when fields are added and HDEL when some are deleted: each `redis.call` costs
/// Redis about as much as a client command, and this script is the write path.
const PATCH: &str = r"
local first_delete = 9 + 2 * tonumber(ARGV[8])
local names = {'_version', '_tier', '_bytes'}
for i = 9, #ARGV do
  if i < first_delete then
    if (i - 9) % 2 == 0 then names[#names + 1] = ARGV[i] end
  else
    names[#names + 1] = ARGV[i]
  end
end
local current = {}
each_chunk('HMGET', KEYS[1], names, current)
if not current[1] then return {'not_found'} end
local version = tonumber(current[1])
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= version then return {'conflict', version} end
local bytes = tonumber(current[3])
local added, removed, at = 0, 0, 4
local writes, deletes = {}, {}
for i = 9, first_delete - 1, 2 do
  local old = current[at]
  at = at + 1
  if old then
    bytes = bytes + #ARGV[i + 1] - #old
  else
    added = added + 1
    bytes = bytes + #ARGV[i] + #ARGV[i + 1]
  end
  writes[#writes + 1] = ARGV[i]
  writes[#writes + 1] = ARGV[i + 1]
end
for i = first_delete, #ARGV do
  local old = current[at]
  at = at + 1
  if old then
    removed = removed + 1
    bytes = bytes - #ARGV[i] - #old
  end
  deletes[#deletes + 1] = ARGV[i]
end
if added > 0 then
  local count = redis.call('HLEN', KEYS[1]) - 5 + added - removed
  if count > tonumber(ARGV[6]) then return {'too_many_fields', count} end
end
if bytes > tonumber(ARGV[7]) then return {'too_large', bytes} end
local ttl = tonumber(ARGV[3])
if current[2] == 'one_shot' then ttl = tonumber(ARGV[4]) end
version = version + 1
local reserved = {'_version', version, '_bytes', bytes, '_expires', now + ttl}
for k = 1, #reserved do writes[#writes + 1] = reserved[k] end
each_chunk('HSET', KEYS[1], writes)
if #deletes > 0 then each_chunk('HDEL', KEYS[1], deletes) end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now + math.min(ttl, tonumber(ARGV[5])), ARGV[1])
return {'ok', version, now + ttl}
";

/// KEYS: ctx, deadlines. ARGV: id, required owner ('' = anyone).
const CLOSE: &str = r"
local owner = redis.call('HGET', KEYS[1], '_owner')
if not owner then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {'not_found'}
end
if ARGV[2] ~= '' and owner ~= ARGV[2] then return {'not_owner'} end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return {'ok'}
";

/// KEYS: deadlines. ARGV: context key prefix, batch size.
/// The scan and the deletions run in one script, so a context touched a moment
/// before is no longer past its deadline and stays; two replicas sweeping at
/// once remove each context exactly once.
const SWEEP: &str = r"
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local idle = 0
for _, id in ipairs(ids) do
  idle = idle + redis.call('DEL', ARGV[1] .. id)
  redis.call('ZREM', KEYS[1], id)
end
return {'ok', #ids, idle}
";

/// KEYS: deadlines.
const LIVE: &str = r"
return {'ok', redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')}
";

/// Where a tenant's keys live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    pub prefix: String,
    pub tenant: String,
}

impl Namespace {
    fn context_prefix(&self) -> String {
        format!("{}:{}:ctx:", self.prefix, self.tenant)
    }

    fn deadlines(&self) -> String {
        format!("{}:{}:deadlines", self.prefix, self.tenant)
    }
}

struct Scripts {
    create: Script,
    patch: Script,
    close: Script,
    sweep: Script,
    live: Script,
}

impl Scripts {
    fn new() -> Self {
        let with_now = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
        Self {
            create: with_now(CREATE),
            patch: with_now(PATCH),
            close: Script::new(CLOSE),
            sweep: with_now(SWEEP),
            live: with_now(LIVE),
        }
    }
}

/// One thread's connection to one store's Redis, made on first use.
type Slot = Arc<OnceCell<ConnectionManager>>;

/// Distinguishes stores sharing a thread (several services in one test process).
static NEXT_STORE_ID: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's connection per store: (store id, the store's liveness, slot).
    /// Entries of dropped stores are pruned when a new entry is added.
    static CONNECTIONS: RefCell<Vec<(usize, Weak<()>, Slot)>> = const { RefCell::new(Vec::new()) };
}

pub struct RedisStore {
    client: redis::Client,
    id: usize,
    /// Dropped with the store; thread-local slots holding a `Weak` to it are then stale.
    alive: Arc<()>,
    timeout: Duration,
    context_prefix: String,
    deadlines: String,
    policy: StorePolicy,
    scripts: Scripts,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("deadlines", &self.deadlines)
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(error.to_string())
}

fn millis(duration: Duration) -> u64 {
    // At least 1 ms: PEXPIRE 0 would delete the key on write.
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The parts of a script's `{status, ...}` answer.
struct Answer {
    status: String,
    rest: Vec<Value>,
}

impl Answer {
    fn parse(value: Value) -> Result<Self, StoreError> {
        let Value::Array(mut items) = value else {
            return Err(StoreError::Corrupt(format!("script answered {value:?}")));
        };
        if items.is_empty() {
            return Err(StoreError::Corrupt("script answered an empty array".to_string()));
        }
        let rest = items.split_off(1);
        let status: String =
            redis::from_redis_value(&items[0]).map_err(|error| StoreError::Corrupt(error.to_string()))?;
        Ok(Self { status, rest })
    }

    fn int(&self, index: usize) -> Result<i64, StoreError> {
        self.rest
            .get(index)
            .ok_or_else(|| StoreError::Corrupt(format!("`{}` answer lacks item {index}", self.status)))
            .and_then(|value| redis::from_redis_value(value).map_err(|error| StoreError::Corrupt(error.to_string())))
    }

    fn unsigned(&self, index: usize) -> Result<usize, StoreError> {
        usize::try_from(self.int(index)?).map_err(|error| StoreError::Corrupt(error.to_string()))
    }

    /// Limit, not-found and conflict answers shared by create and patch.
    fn refusal(&self, policy: &StorePolicy) -> Result<StoreError, StoreError> {
        Ok(match self.status.as_str() {
            "not_found" => StoreError::NotFound,
            "exists" => StoreError::Exists,
            "conflict" => StoreError::VersionConflict {
                current: u64::try_from(self.int(0)?).unwrap_or_default(),
            },
            "too_many_fields" => StoreError::TooManyFields {
                limit: policy.max_fields,
                would_have: self.unsigned(0)?,
            },
            "too_large" => StoreError::TooLarge {
                limit: policy.max_context_bytes,
                would_have: self.unsigned(0)?,
            },
            "not_owner" => StoreError::NotOwner,
            other => return Err(StoreError::Corrupt(format!("unknown script status `{other}`"))),
        })
    }

    fn written(&self, policy: &StorePolicy) -> Result<Written, StoreError> {
        if self.status != "ok" {
            return Err(self.refusal(policy)?);
        }
        Ok(Written {
            version: u64::try_from(self.int(0)?).map_err(|error| StoreError::Corrupt(error.to_string()))?,
            expires_at_ms: self.int(1)?,
        })
    }
}

impl RedisStore {
    /// Checks the URL; connects on first use (and reconnects by itself afterwards).
    pub fn new(url: &str, namespace: &Namespace, policy: StorePolicy, timeout: Duration) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|error| format!("invalid Redis URL `{url}`: {error}"))?;
        Ok(Self {
            client,
            id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            alive: Arc::new(()),
            timeout,
            context_prefix: namespace.context_prefix(),
            deadlines: namespace.deadlines(),
            policy,
            scripts: Scripts::new(),
        })
    }

    fn key(&self, id: &str) -> String {
        format!("{}{id}", self.context_prefix)
    }

    /// This thread's connection slot for this store.
    fn slot(&self) -> Slot {
        CONNECTIONS.with(|connections| {
            let mut connections = connections.borrow_mut();
            if let Some((_, _, slot)) = connections.iter().find(|(id, _, _)| *id == self.id) {
                return slot.clone();
            }
            connections.retain(|(_, alive, _)| alive.strong_count() > 0);
            let slot = Slot::default();
            connections.push((self.id, Arc::downgrade(&self.alive), slot.clone()));
            slot
        })
    }

    async fn connection(&self) -> Result<ConnectionManager, StoreError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout)
            // Reconnection keeps being retried on the next request; a short burst
            // here keeps a request from waiting long on a Redis that is down.
            .set_number_of_retries(2)
            .set_factor(50)
            .set_max_delay(500);
        self.slot()
            .get_or_try_init(|| ConnectionManager::new_with_config(self.client.clone(), config))
            .await
            .cloned()
            .map_err(unavailable)
    }

    /// Runs one script invocation within the call timeout.
    async fn run(&self, invocation: redis::ScriptInvocation<'_>) -> Result<Answer, StoreError> {
        let call = async {
            let mut connection = self.connection().await?;
            let value: Value = invocation.invoke_async(&mut connection).await.map_err(classify)?;
            Answer::parse(value)
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| unavailable(format!("no answer within {} ms", self.timeout.as_millis())))?
    }
}

/// Connection trouble and a Redis that cannot serve writes right now (loading,
/// failing over, a read-only replica) are "unavailable": the caller should retry.
/// Anything else means a bug or a hand-edited key.
fn classify(error: redis::RedisError) -> StoreError {
    let transient = error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || matches!(
            error.kind(),
            redis::ErrorKind::BusyLoadingError
                | redis::ErrorKind::TryAgain
                | redis::ErrorKind::MasterDown
                | redis::ErrorKind::ReadOnly
                | redis::ErrorKind::ClusterDown
        );
    if transient {
        unavailable(error)
    } else {
        StoreError::Corrupt(error.to_string())
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

fn text(value: &Value) -> Result<String, StoreError> {
    redis::from_redis_value(value).map_err(|error| StoreError::Corrupt(error.to_string()))
}

#[async_trait::async_trait]
impl ContextStore for RedisStore {
    async fn create(&self, id: &str, context: &NewContext) -> Result<Written, StoreError> {
        let ttl = self.policy.ttl(context.tier);
        let mut invocation = self.scripts.create.key(self.key(id));
        invocation
            .key(&self.deadlines)
            .arg(id)
            .arg(context.tier.as_str())
            .arg(&context.owner)
            .arg(millis(ttl))
            .arg(millis(self.policy.idle_timeout))
            .arg(self.policy.max_fields)
            .arg(self.policy.max_context_bytes);
        for (name, value) in &context.fields {
            invocation.arg(name).arg(value);
        }
        self.run(invocation).await?.written(&self.policy)
    }

    /// Reads are a plain pipeline, not a script: returning a whole hash through Lua
    /// costs Redis about three times a plain HGETALL, and reads are the hot path.
    /// Each command is atomic on its own; the deadline is `now + idle timeout` on
    /// this service's clock (`XX`: never re-adds a context the sweeper removed).
    /// When the TTL ends first, Redis expires the hash and the sweeper later drops
    /// the index entry as `expired`.
    async fn get(&self, id: &str, selection: &Selection) -> Result<Option<Snapshot>, StoreError> {
        let key = self.key(id);
        let deadline = now_ms().saturating_add(millis(self.policy.idle_timeout) as i64);
        let mut pipe = redis::pipe();
        match selection {
            Selection::All => pipe.cmd("HGETALL").arg(&key),
            Selection::Only(names) => pipe.cmd("HMGET").arg(&key).arg(&READ_RESERVED).arg(names),
        };
        pipe.cmd("ZADD")
            .arg(&self.deadlines)
            .arg("XX")
            .arg(deadline)
            .arg(id)
            .ignore();
        let call = async {
            let mut connection = self.connection().await?;
            pipe.query_async::<(Vec<Value>,)>(&mut connection)
                .await
                .map_err(classify)
        };
        let (data,) = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| unavailable(format!("no answer within {} ms", self.timeout.as_millis())))??;
        if data.is_empty() {
            return Ok(None);
        }
        let pairs: Vec<(String, String)> = match selection {
            Selection::All => data
                .chunks_exact(2)
                .map(|pair| Ok((text(&pair[0])?, text(&pair[1])?)))
                .collect::<Result<_, StoreError>>()?,
            Selection::Only(names) => {
                let requested = READ_RESERVED.iter().copied().chain(names.iter().map(String::as_str));
                requested
                    .zip(&data)
                    .filter(|(_, value)| !matches!(value, Value::Nil))
                    .map(|(name, value)| Ok((name.to_string(), text(value)?)))
                    .collect::<Result<_, StoreError>>()?
            }
        };
        let mut snapshot = Snapshot {
            version: 0,
            tier: Tier::Default,
            owner: String::new(),
            expires_at_ms: 0,
            fields: Default::default(),
        };
        for (name, value) in pairs {
            match name.as_str() {
                "_version" => {
                    snapshot.version = value
                        .parse()
                        .map_err(|_| StoreError::Corrupt(format!("version `{value}`")))?
                }
                "_tier" => {
                    snapshot.tier = Tier::parse(&value).ok_or_else(|| StoreError::Corrupt(format!("tier `{value}`")))?
                }
                "_owner" => snapshot.owner = value,
                "_expires" => {
                    snapshot.expires_at_ms = value
                        .parse()
                        .map_err(|_| StoreError::Corrupt(format!("expiry `{value}`")))?
                }
                _ if RESERVED.contains(&name.as_str()) => {}
                _ => {
                    snapshot.fields.insert(name, value);
                }
            }
        }
        if snapshot.version == 0 {
            // Not a context this service wrote (every write sets `_version`).
            return Ok(None);
        }
        Ok(Some(snapshot))
    }

    async fn patch(&self, id: &str, patch: &Patch) -> Result<Written, StoreError> {
        let mut invocation = self.scripts.patch.key(self.key(id));
        invocation
            .key(&self.deadlines)
            .arg(id)
            .arg(patch.if_version.map(|version| version.to_string()).unwrap_or_default())
            .arg(millis(self.policy.default_ttl))
            .arg(millis(self.policy.one_shot_ttl))
            .arg(millis(self.policy.idle_timeout))
            .arg(self.policy.max_fields)
            .arg(self.policy.max_context_bytes)
            .arg(patch.set.len());
        for (name, value) in &patch.set {
            invocation.arg(name).arg(value);
        }
        for name in &patch.delete {
            invocation.arg(name);
        }
        self.run(invocation).await?.written(&self.policy)
    }

    async fn close(&self, id: &str, who: &CloseAs) -> Result<(), StoreError> {
        let owner = match who {
            CloseAs::Anyone => "",
            CloseAs::Owner(name) => name.as_str(),
        };
        let mut invocation = self.scripts.close.key(self.key(id));
        invocation.key(&self.deadlines).arg(id).arg(owner);
        let answer = self.run(invocation).await?;
        if answer.status == "ok" {
            Ok(())
        } else {
            Err(answer.refusal(&self.policy)?)
        }
    }

    async fn sweep(&self) -> Result<SweepReport, StoreError> {
        let mut report = SweepReport::default();
        loop {
            let mut invocation = self.scripts.sweep.key(&self.deadlines);
            invocation.arg(&self.context_prefix).arg(SWEEP_BATCH);
            let answer = self.run(invocation).await?;
            let scanned = answer.unsigned(0)? as u64;
            let idle = answer.unsigned(1)? as u64;
            report.idle += idle;
            report.expired += scanned - idle.min(scanned);
            if scanned < SWEEP_BATCH as u64 {
                return Ok(report);
            }
        }
    }

    async fn live_contexts(&self) -> Result<u64, StoreError> {
        let answer = self.run(self.scripts.live.key(&self.deadlines)).await?;
        Ok(answer.unsigned(0)? as u64)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let call = async {
            let mut connection = self.connection().await?;
            redis::cmd("PING")
                .query_async::<String>(&mut connection)
                .await
                .map(drop)
                .map_err(unavailable)
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| unavailable(format!("no answer within {} ms", self.timeout.as_millis())))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_answers_map_to_store_errors() {
        let policy = StorePolicy::default();
        let answer = |items: Vec<Value>| Answer::parse(Value::Array(items)).unwrap();
        let conflict = answer(vec![Value::BulkString(b"conflict".to_vec()), Value::Int(7)]);
        assert_eq!(
            conflict.written(&policy),
            Err(StoreError::VersionConflict { current: 7 })
        );
        let too_large = answer(vec![Value::BulkString(b"too_large".to_vec()), Value::Int(300_000)]);
        assert_eq!(
            too_large.written(&policy),
            Err(StoreError::TooLarge {
                limit: policy.max_context_bytes,
                would_have: 300_000
            })
        );
        let ok = answer(vec![
            Value::BulkString(b"ok".to_vec()),
            Value::Int(3),
            Value::Int(1_000),
        ]);
        assert_eq!(
            ok.written(&policy),
            Ok(Written {
                version: 3,
                expires_at_ms: 1_000
            })
        );
        let odd = answer(vec![Value::BulkString(b"surprise".to_vec())]);
        assert!(matches!(odd.written(&policy), Err(StoreError::Corrupt(_))));
        assert!(Answer::parse(Value::Nil).is_err());
    }

    #[test]
    fn transient_redis_errors_are_unavailable() {
        let refused = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(classify(refused), StoreError::Unavailable(_)));
        let read_only = redis::RedisError::from((redis::ErrorKind::ReadOnly, "replica"));
        assert!(matches!(classify(read_only), StoreError::Unavailable(_)));
        let script_bug = redis::RedisError::from((redis::ErrorKind::ResponseError, "ERR user_script:1"));
        assert!(matches!(classify(script_bug), StoreError::Corrupt(_)));
    }

    #[test]
    fn ttls_are_never_zero() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_secs(2)), 2000);
        let namespace = Namespace {
            prefix: "agent-reach".into(),
            tenant: "default".into(),
        };
        assert_eq!(namespace.context_prefix(), "agent-reach:default:ctx:");
        assert_eq!(namespace.deadlines(), "agent-reach:default:deadlines");
    }
}
