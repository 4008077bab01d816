//! The Redis store (DESIGN §4, §4.7): one server, Sentinel's primary or a
//! Redis Cluster, one key layout for all three.
//!
//! Every context is in one of [`BUCKETS`] buckets (CRC16 of its id); a
//! bucket's keys carry its hash tag (`{c…}`, slots spaced evenly over the
//! cluster's slot space: [`agent_reach_stores::slot::spread_tag`]), so a
//! context's hash and its bucket's deadline set are one slot of a Redis
//! Cluster, every script and read pipeline of a context goes to one node,
//! and the contexts spread over the shards. Per tenant under a configurable
//! prefix (`{B}` a bucket's tag):
//! - `{prefix}:{tenant}:ctx:{B}:{context_id}`: one hash per context. User fields hold
//!   JSON text under their own names; the reserved entries start with `_` (which
//!   no field name can): `_version`, `_tier`, `_owner`, `_bytes` (running total of
//!   name and value bytes, so limits need no full read), `_expires` (epoch ms at
//!   which the TTL ends, so a read needs no PTTL). The hash carries the tier's
//!   TTL, refreshed by every write.
//! - `{prefix}:{tenant}:deadlines:{B}`: a sorted set per bucket, member = context id, score = the
//!   epoch ms at which the context dies if nobody touches it: `now + min(idle
//!   timeout, remaining TTL)` after a write, `now + idle timeout` after a read.
//!   Every read and write moves it; the sweeper deletes what is past it. This is
//!   the last-access tracking.
//!
//! Every write (create, patch, close) and each bucket's sweep is one Lua
//! script, so it is atomic and one round trip. Create and the sweep take time from Redis
//! (`TIME`); the hot paths, reads (one pipeline of plain commands, see `get`) and
//! patches, use the service's clock, so clock skew between replicas shifts an
//! idle deadline or a reported expiry by at most the skew (TTLs themselves are
//! relative, `PEXPIRE`, and exact).
//!
//! Connections are [`resp::Connection`]s, one per serving thread, opened
//! lazily on that thread (so the service starts and answers 503 while Redis is
//! down) and reopened on the next request after one breaks (so it recovers by
//! itself when Redis is back). A request on a per-core worker runtime talks to
//! Redis through a connection driven by that same thread: no cross-thread
//! wake-ups on the hot path. Every call is bounded by the connection's reply
//! timeout (see `resp`). On a cluster each serving thread keeps such a
//! connection per node, and `cluster` routes each request to its slot's node,
//! following `MOVED`, `ASK` and failovers within the same bound.
//!
//! With `WAIT` (`--redis-wait-replicas`), each write's script is followed by
//! `WAIT` in the same pipeline, on the same connection: a write is
//! acknowledged only once that many replicas of its shard have it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_reach_stores::slot::{crc16, key_slot, spread_tag};

use super::cluster::Cluster;
use super::resp::{self, Args, Pipeline, Reply};
use super::{ContextStore, StoreError};
use crate::model::{CloseAs, NewContext, Patch, Selection, Snapshot, StorePolicy, SweepReport, Tier, Written};

/// Reserved hash entries (not user fields).
const RESERVED: [&str; 5] = ["_version", "_tier", "_owner", "_bytes", "_expires"];
/// The reserved entries a read returns (`_bytes` is for writes only).
const READ_RESERVED: [&str; 4] = ["_version", "_tier", "_owner", "_expires"];
/// Index entries removed per sweep script call (keeps each script short).
const SWEEP_BATCH: usize = 500;
/// Buckets per tenant (a context's is CRC16 of its id, modulo this). Part of
/// the key layout: every bucket is one slot of a cluster.
pub const BUCKETS: usize = 256;

/// The buckets' hash tags (without braces) and their slots, computed once.
fn buckets() -> &'static [(String, u16)] {
    static BUCKET_TAGS: OnceLock<Vec<(String, u16)>> = OnceLock::new();
    BUCKET_TAGS.get_or_init(|| {
        (0..BUCKETS)
            .map(|bucket| {
                let tag = spread_tag("c", bucket, BUCKETS);
                let slot = key_slot(tag.as_bytes());
                (tag, slot)
            })
            .collect()
    })
}

/// The bucket of a context id.
pub fn bucket_of(context_id: &str) -> usize {
    usize::from(crc16(context_id.as_bytes())) % BUCKETS
}

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

/// KEYS: ctx, deadlines. ARGV: id, tier, owner, ttl_ms, idle deadline after a write (ms),
/// max_fields, max_bytes, name, value, ...
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
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[1])
return {'ok', 1, now + ttl}
";

/// The write path, so it is lean: one HMGET of the reserved entries and every
/// touched field, one HSET; HLEN only when fields are added; `_bytes` written
/// only when it changed; time from the service (see the module notes). The
/// store's policy (TTLs, idle timeout, limits) is written into the script text
/// when the store is made ([`bake_policy`]), so a call carries only what
/// changes: every argument costs Redis a Lua string and every number it
/// writes a `%.17g` conversion. The common patch, one field set and none
/// deleted, has a script of its own without loops or tables ([`PATCH_ONE`]).
/// Measured alone with redis-benchmark (time inside `EVALSHA`): 10.6 µs at
/// first; 6.8 µs with refreshes coalesced and a straight one-field path; 5.4
/// µs with the policy baked in and `_bytes` left alone when unchanged.
///
/// TTL refresh is coalesced (`StorePolicy::refresh_granularity`, baked in per
/// tier): a write less than a hundredth of the TTL (at most 1 s) after the
/// last refresh leaves `_expires`, the key's TTL and the idle deadline as they
/// are, so a burst of writes to one context costs one PEXPIRE and one ZADD,
/// not one each. The deadline kept is never more than the granularity earlier
/// than the one the skipped ZADD would have written (the last refresh wrote
/// it, and reads only move it later).
///
/// KEYS: ctx, deadlines. ARGV: id, if_version ('' = none), now_ms, name, value.
const PATCH_ONE: [&str; 3] = [
    r"
local key, name, value = KEYS[1], ARGV[4], ARGV[5]
local current = redis.call('HMGET', key, '_version', '_tier', '_bytes', '_expires', name)
local version = current[1]
if not version then return {'not_found'} end
version = tonumber(version)
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= version then return {'conflict', version} end
local kept_bytes = tonumber(current[3])
local old = current[5]
local bytes
if old then
  bytes = kept_bytes + #value - #old
else
  bytes = kept_bytes + #name + #value
  local count = redis.call('HLEN', key) - 4
  if count > $MAX_FIELDS then return {'too_many_fields', count} end
end
",
    PATCH_DECIDE,
    r"
if fresh then
  if bytes == kept_bytes then
    redis.call('HSET', key, name, value, '_version', version)
  else
    redis.call('HSET', key, name, value, '_version', version, '_bytes', bytes)
  end
  return {'ok', version, kept}
end
redis.call('HSET', key, name, value, '_version', version, '_bytes', bytes, '_expires', expires)
redis.call('PEXPIRE', key, ttl)
redis.call('ZADD', KEYS[2], now + idle, ARGV[1])
return {'ok', version, expires}
",
];

/// Both patch scripts, once `current` holds `_version`, `_tier`, `_bytes` and
/// `_expires`, `version` the current version and `bytes` the new total: the
/// size limit, the tier's times, whether the last refresh still holds, the
/// new version.
const PATCH_DECIDE: &str = r"
if bytes > $MAX_BYTES then return {'too_large', bytes} end
local ttl, granularity, idle = $DEFAULT_TTL, $DEFAULT_GRANULARITY, $DEFAULT_IDLE
if current[2] == 'one_shot' then ttl, granularity, idle = $ONE_SHOT_TTL, $ONE_SHOT_GRANULARITY, $ONE_SHOT_IDLE end
local now = tonumber(ARGV[3])
local expires = now + ttl
local kept = tonumber(current[4])
local fresh = kept and expires - kept < granularity and kept - expires < granularity
version = version + 1
";

/// Any other patch (several fields set, or any deleted); the same rules as
/// [`PATCH_ONE`]. KEYS: ctx, deadlines. ARGV: id, if_version ('' = none),
/// now_ms, set_count, (name, value) * set_count, deleted names...
const PATCH: [&str; 3] = [
    r"
local key = KEYS[1]
local n = #ARGV
local first_delete = 5 + 2 * tonumber(ARGV[4])
local names = {'_version', '_tier', '_bytes', '_expires'}
for i = 5, first_delete - 1, 2 do names[#names + 1] = ARGV[i] end
for i = first_delete, n do names[#names + 1] = ARGV[i] end
local current = {}
for i = 1, #names, 1000 do
  local part = redis.call('HMGET', key, unpack(names, i, math.min(i + 999, #names)))
  for k = 1, #part do current[#current + 1] = part[k] end
end
local version = current[1]
if not version then return {'not_found'} end
version = tonumber(version)
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= version then return {'conflict', version} end
local kept_bytes = tonumber(current[3])
local bytes = kept_bytes
local added, removed, at = 0, 0, 5
for i = 5, first_delete - 1, 2 do
  local old = current[at]
  at = at + 1
  if old then
    bytes = bytes + #ARGV[i + 1] - #old
  else
    added = added + 1
    bytes = bytes + #ARGV[i] + #ARGV[i + 1]
  end
end
for i = first_delete, n do
  local old = current[at]
  at = at + 1
  if old then
    removed = removed + 1
    bytes = bytes - #ARGV[i] - #old
  end
end
if added > 0 then
  local count = redis.call('HLEN', key) - 5 + added - removed
  if count > $MAX_FIELDS then return {'too_many_fields', count} end
end
",
    PATCH_DECIDE,
    r"
if fresh then expires = kept end
local writes = {}
for i = 5, first_delete - 1 do writes[#writes + 1] = ARGV[i] end
for i = 1, #writes, 1000 do redis.call('HSET', key, unpack(writes, i, math.min(i + 999, #writes))) end
if fresh and bytes == kept_bytes then
  redis.call('HSET', key, '_version', version)
else
  redis.call('HSET', key, '_version', version, '_bytes', bytes, '_expires', expires)
end
local deletes = {}
for i = first_delete, n do deletes[#deletes + 1] = ARGV[i] end
for i = 1, #deletes, 1000 do redis.call('HDEL', key, unpack(deletes, i, math.min(i + 999, #deletes))) end
if not fresh then
  redis.call('PEXPIRE', key, ttl)
  redis.call('ZADD', KEYS[2], now + idle, ARGV[1])
end
return {'ok', version, expires}
",
];

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

/// KEYS: the bucket's deadlines. ARGV: the bucket's context key prefix, batch size.
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
    /// The key of context `id`'s hash (DESIGN §4.7).
    pub fn context_key(&self, id: &str) -> String {
        format!("{}{id}", self.context_prefix(bucket_of(id)))
    }

    /// The key of the deadline set context `id` is in (its bucket's).
    pub fn deadlines_key(&self, id: &str) -> String {
        self.deadlines(bucket_of(id))
    }

    /// What the keys of the contexts in `bucket` start with.
    fn context_prefix(&self, bucket: usize) -> String {
        format!(
            "{}:{}:ctx:{{{}}}:",
            self.prefix,
            self.tenant,
            buckets()[bucket % BUCKETS].0
        )
    }

    /// The deadline set of `bucket`.
    fn deadlines(&self, bucket: usize) -> String {
        format!(
            "{}:{}:deadlines:{{{}}}",
            self.prefix,
            self.tenant,
            buckets()[bucket % BUCKETS].0
        )
    }
}

/// A Lua script and its SHA1, run by `EVALSHA` (by `EVAL` when Redis lacks it).
struct Script {
    code: String,
    sha: String,
}

impl Script {
    fn new(code: String) -> Self {
        let sha = redis::Script::new(&code).get_hash().to_string();
        Self { code, sha }
    }
}

struct Scripts {
    create: Script,
    /// One field set, none deleted.
    patch_one: Script,
    patch: Script,
    close: Script,
    sweep: Script,
    live: Script,
}

impl Scripts {
    fn new(policy: &StorePolicy) -> Self {
        let with_now = |body: &str| Script::new(format!("{PRELUDE}{body}"));
        let with_policy = |parts: [&str; 3]| Script::new(bake_policy(&parts.concat(), policy));
        Self {
            create: with_now(CREATE),
            patch_one: with_policy(PATCH_ONE),
            patch: with_policy(PATCH),
            close: Script::new(CLOSE.to_string()),
            sweep: with_now(SWEEP),
            live: with_now(LIVE),
        }
    }
}

/// Writes the store's policy into a patch script's placeholders (whole
/// milliseconds and counts, as Lua integer literals). Replicas with different
/// policies load different scripts (the SHA follows the text); each runs its own.
fn bake_policy(body: &str, policy: &StorePolicy) -> String {
    let per_tier = |tier: Tier| {
        (
            millis(policy.ttl(tier)),
            millis(policy.refresh_granularity(tier)),
            millis(policy.idle_deadline_after_write(tier)),
        )
    };
    let (default_ttl, default_granularity, default_idle) = per_tier(Tier::Default);
    let (one_shot_ttl, one_shot_granularity, one_shot_idle) = per_tier(Tier::OneShot);
    [
        ("$DEFAULT_GRANULARITY", default_granularity.to_string()),
        ("$ONE_SHOT_GRANULARITY", one_shot_granularity.to_string()),
        ("$DEFAULT_IDLE", default_idle.to_string()),
        ("$ONE_SHOT_IDLE", one_shot_idle.to_string()),
        ("$DEFAULT_TTL", default_ttl.to_string()),
        ("$ONE_SHOT_TTL", one_shot_ttl.to_string()),
        ("$MAX_FIELDS", policy.max_fields.to_string()),
        ("$MAX_BYTES", policy.max_context_bytes.to_string()),
    ]
    .iter()
    .fold(body.to_string(), |text, (placeholder, value)| {
        text.replace(placeholder, value)
    })
}

/// Distinguishes stores sharing a thread (several services in one test process).
static NEXT_STORE_ID: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's connection per store ([`Slot`]).
    /// Entries of dropped stores are pruned when a new entry is added.
    static CONNECTIONS: RefCell<Vec<Slot>> = const { RefCell::new(Vec::new()) };
}

/// A thread's connection for one store: the store's id and liveness, the
/// Sentinel generation the connection was opened under (0 without), the connection.
type Slot = (usize, Weak<()>, u64, resp::Connection);

pub struct RedisStore {
    /// One server (or Sentinel's primary): this thread's connection to it.
    target: resp::Target,
    /// A Redis Cluster: the slot map and a connection per node and thread.
    cluster: Option<Arc<Cluster>>,
    id: usize,
    /// Dropped with the store; thread-local slots holding a `Weak` to it are then stale.
    alive: Arc<()>,
    /// Per bucket: its context key prefix, its deadline set.
    context_prefixes: Vec<String>,
    deadlines: Vec<String>,
    /// `WAIT` after each write: acknowledged once this many replicas have it.
    wait: Option<agent_reach_stores::Wait>,
    policy: StorePolicy,
    scripts: Scripts,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("deadlines", &self.deadlines.first())
            .field("cluster", &self.cluster)
            .field("timeout", &self.target.reply_timeout)
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
    rest: Vec<Reply>,
}

impl Answer {
    fn parse(reply: Reply) -> Result<Self, StoreError> {
        let Reply::Array(mut items) = reply else {
            return Err(StoreError::Corrupt(format!("script answered {reply:?}")));
        };
        if items.is_empty() {
            return Err(StoreError::Corrupt("script answered an empty array".to_string()));
        }
        let rest = items.split_off(1);
        let status = text(items.remove(0))?;
        Ok(Self { status, rest })
    }

    fn int(&self, index: usize) -> Result<i64, StoreError> {
        self.rest
            .get(index)
            .ok_or_else(|| StoreError::Corrupt(format!("`{}` answer lacks item {index}", self.status)))
            .and_then(|reply| reply.int().map_err(StoreError::Corrupt))
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
    /// Checks the link; connects on first use (and reconnects by itself afterwards).
    pub fn new(
        link: &agent_reach_stores::RedisLink,
        namespace: &Namespace,
        policy: StorePolicy,
        timeout: Duration,
    ) -> Result<Self, String> {
        let parsed = &link.url;
        let tls = if parsed.tls {
            Some(link.tls.client_config()?)
        } else {
            None
        };
        let (host, port, primary) = match &parsed.nodes {
            agent_reach_stores::Nodes::Direct(node) => (node.host.clone(), node.port, None),
            agent_reach_stores::Nodes::Cluster { .. } => (String::new(), 0, None),
            agent_reach_stores::Nodes::Sentinel { .. } => {
                let sentinels = agent_reach_stores::Sentinels::from_url(parsed, &link.tls)
                    .ok_or_else(|| format!("`{parsed}` names no Sentinel"))?;
                let primary = agent_reach_stores::Primary::new(sentinels, timeout);
                // Follows failovers in the background (one Sentinel question
                // per half second), so requests never ask the Sentinels.
                if tokio::runtime::Handle::try_current().is_ok() {
                    primary.follow();
                }
                (String::new(), 0, Some(primary))
            }
        };
        let target = resp::Target {
            host,
            port,
            primary,
            db: parsed.db,
            username: parsed.username.clone(),
            password: parsed.password.clone(),
            connect_timeout: timeout,
            reply_timeout: timeout,
            tls,
        };
        let cluster = match &parsed.nodes {
            agent_reach_stores::Nodes::Cluster { seeds } => Some(Cluster::new(seeds.clone(), target.clone(), timeout)),
            _ => None,
        };
        Ok(Self {
            target,
            cluster,
            id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            alive: Arc::new(()),
            context_prefixes: (0..BUCKETS).map(|bucket| namespace.context_prefix(bucket)).collect(),
            deadlines: (0..BUCKETS).map(|bucket| namespace.deadlines(bucket)).collect(),
            wait: link.wait,
            scripts: Scripts::new(&policy),
            policy,
        })
    }

    fn key(&self, bucket: usize, id: &str) -> String {
        let prefix = &self.context_prefixes[bucket];
        let mut key = String::with_capacity(prefix.len() + id.len());
        key.push_str(prefix);
        key.push_str(id);
        key
    }

    /// This thread's connection to this store's Redis (a new one when there
    /// is none yet or the last one broke).
    fn connection(&self) -> resp::Connection {
        // One atomic load: a failover the Sentinels announced moves it.
        let generation = self.target.primary.as_ref().map_or(0, |primary| primary.generation());
        CONNECTIONS.with(|connections| {
            let mut connections = connections.borrow_mut();
            if let Some(at) = connections.iter().position(|(id, _, _, _)| *id == self.id) {
                if !connections[at].3.is_closed() && connections[at].2 == generation {
                    return connections[at].3.clone();
                }
                connections.swap_remove(at);
            }
            connections.retain(|(_, alive, _, _)| alive.strong_count() > 0);
            let connection = resp::Connection::open(self.target.clone());
            connections.push((self.id, Arc::downgrade(&self.alive), generation, connection.clone()));
            connection
        })
    }

    /// Sends `commands` (all on `bucket`'s keys) as one pipeline: on this
    /// thread's connection, or on a cluster to the node serving the bucket's
    /// slot. The connection bounds the wait (its reply timeout): when Redis
    /// stops answering it fails what it holds and closes, and the next call
    /// opens a fresh one, so a Redis lost without a reset (a partition, a
    /// hung host) is recovered from when it answers again.
    async fn send(&self, bucket: usize, commands: &[&Args]) -> Result<Vec<Reply>, StoreError> {
        match &self.cluster {
            None => {
                let size: usize = commands.iter().map(|command| 16 + command.encoded_len()).sum();
                let mut pipeline = Pipeline::with_capacity(size);
                for command in commands {
                    pipeline.command(command);
                }
                self.connection().send(pipeline).await.map_err(unavailable)
            }
            Some(cluster) => cluster.send(buckets()[bucket].1, commands).await.map_err(unavailable),
        }
    }

    /// Runs `script` on `bucket`'s keys with `keys_and_args` (the key count
    /// first) within the call timeout: `EVALSHA`, then `EVAL` once if Redis
    /// does not have the script (after a restart or `SCRIPT FLUSH`). A
    /// write (`Acknowledged::Replicated`) is followed by `WAIT` when the store
    /// has it, and an `ok` is kept only once the replicas have the write.
    async fn run(
        &self,
        script: &Script,
        bucket: usize,
        keys_and_args: &Args,
        acknowledged: Acknowledged,
    ) -> Result<Answer, StoreError> {
        let wait = match acknowledged {
            Acknowledged::Replicated => self.wait.map(|wait| {
                let mut command = Args::with_capacity(32);
                command.arg("WAIT").arg(u64::from(wait.replicas)).arg(wait.timeout_ms());
                (wait, command)
            }),
            Acknowledged::Applied => None,
        };
        // Sized up front: the command is copied twice more on its way out.
        let mut by_sha = Args::with_capacity(64 + keys_and_args.encoded_len());
        by_sha.arg("EVALSHA").arg(&script.sha).extend(keys_and_args);
        let mut replies = self.send_with_wait(bucket, &by_sha, &wait).await?.into_iter();
        let mut reply = replies.next().ok_or_else(no_reply)?;
        let mut waited = replies.next();
        if matches!(&reply, Reply::Error(message) if message.starts_with("NOSCRIPT")) {
            let mut by_code = Args::new();
            by_code.arg("EVAL").arg(&script.code).extend(keys_and_args);
            let mut replies = self.send_with_wait(bucket, &by_code, &wait).await?.into_iter();
            reply = replies.next().ok_or_else(no_reply)?;
            waited = replies.next();
        }
        let answer = Answer::parse(checked(reply)?)?;
        if let (Some((wait, _)), "ok") = (&wait, answer.status.as_str()) {
            let reached = waited
                .ok_or_else(no_reply)
                .and_then(|reply| checked(reply)?.int().map_err(StoreError::Corrupt))?;
            if reached < i64::from(wait.replicas) {
                return Err(StoreError::Unavailable(format!(
                    "the write reached {reached} of {} replicas within {} ms; it may or may not survive a \
                     failover: read the context, then write again",
                    wait.replicas,
                    wait.timeout_ms()
                )));
            }
        }
        Ok(answer)
    }
}

impl RedisStore {
    /// `script`, then `WAIT` when there is one, in one pipeline.
    async fn send_with_wait(
        &self,
        bucket: usize,
        script: &Args,
        wait: &Option<(agent_reach_stores::Wait, Args)>,
    ) -> Result<Vec<Reply>, StoreError> {
        match wait {
            Some((_, command)) => self.send(bucket, &[script, command]).await,
            None => self.send(bucket, &[script]).await,
        }
    }
}

/// Whether a script's answer may be given before the replicas have its write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acknowledged {
    /// An acknowledged write (create, patch, close): `WAIT` when the store has it.
    Replicated,
    /// A sweep or a count: as soon as the primary ran it.
    Applied,
}

fn no_reply() -> StoreError {
    StoreError::Corrupt("Redis sent no reply".to_string())
}

/// The one reply of a one-command pipeline.
fn single(replies: Vec<Reply>) -> Result<Reply, StoreError> {
    replies.into_iter().next().ok_or_else(no_reply)
}

/// An error reply as a store error: a Redis that cannot serve right now
/// (loading, failing over, a read-only replica, a busy script) is "unavailable"
/// and the caller should retry; any other error means a bug or a hand-edited key.
fn checked(reply: Reply) -> Result<Reply, StoreError> {
    let Reply::Error(message) = reply else {
        return Ok(reply);
    };
    // MOVED and ASK: redirections still unresolved at the call's timeout (a cluster mid-failover).
    const TRANSIENT: [&str; 8] = [
        "LOADING",
        "TRYAGAIN",
        "MASTERDOWN",
        "READONLY",
        "CLUSTERDOWN",
        "BUSY",
        "MOVED",
        "ASK",
    ];
    if TRANSIENT.iter().any(|prefix| message.starts_with(prefix)) {
        Err(unavailable(message))
    } else {
        Err(StoreError::Corrupt(message))
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

fn text(reply: Reply) -> Result<String, StoreError> {
    reply.into_text().map_err(StoreError::Corrupt)
}

impl RedisStore {
    /// Sweeps one bucket until a batch comes back short.
    async fn sweep_bucket(&self, bucket: usize) -> Result<SweepReport, StoreError> {
        let mut report = SweepReport::default();
        loop {
            let mut invocation = Args::new();
            invocation
                .arg(1usize)
                .arg(&self.deadlines[bucket])
                .arg(&self.context_prefixes[bucket])
                .arg(SWEEP_BATCH);
            let answer = self
                .run(&self.scripts.sweep, bucket, &invocation, Acknowledged::Applied)
                .await?;
            let scanned = answer.unsigned(0)? as u64;
            let idle = answer.unsigned(1)? as u64;
            report.idle += idle;
            report.expired += scanned - idle.min(scanned);
            if scanned < SWEEP_BATCH as u64 {
                return Ok(report);
            }
        }
    }
}

#[async_trait::async_trait]
impl ContextStore for RedisStore {
    async fn create(&self, id: &str, context: &NewContext) -> Result<Written, StoreError> {
        let ttl = self.policy.ttl(context.tier);
        let bucket = bucket_of(id);
        let mut invocation = Args::new();
        invocation
            .arg(2usize)
            .arg(&self.key(bucket, id))
            .arg(&self.deadlines[bucket])
            .arg(id)
            .arg(context.tier.as_str())
            .arg(&context.owner)
            .arg(millis(ttl))
            .arg(millis(self.policy.idle_deadline_after_write(context.tier)))
            .arg(self.policy.max_fields)
            .arg(self.policy.max_context_bytes);
        for (name, value) in &context.fields {
            invocation.arg(name).arg(value);
        }
        self.run(&self.scripts.create, bucket, &invocation, Acknowledged::Replicated)
            .await?
            .written(&self.policy)
    }

    /// Reads are a plain pipeline, not a script: returning a whole hash through Lua
    /// costs Redis about three times a plain HGETALL, and reads are the hot path.
    /// Each command is atomic on its own; the deadline is `now + idle timeout` on
    /// this service's clock (`XX`: never re-adds a context the sweeper removed).
    /// When the TTL ends first, Redis expires the hash and the sweeper later drops
    /// the index entry as `expired`.
    async fn get(&self, id: &str, selection: &Selection) -> Result<Option<Snapshot>, StoreError> {
        let bucket = bucket_of(id);
        let key = self.key(bucket, id);
        let deadline = now_ms().saturating_add(millis(self.policy.idle_timeout) as i64);
        let mut read = Args::new();
        match selection {
            Selection::All => read.arg("HGETALL").arg(&key),
            Selection::Only(names) => {
                read.arg("HMGET").arg(&key);
                for name in READ_RESERVED {
                    read.arg(name);
                }
                for name in names {
                    read.arg(name);
                }
                &mut read
            }
        };
        let mut touch = Args::new();
        touch
            .arg("ZADD")
            .arg(&self.deadlines[bucket])
            .arg("XX")
            .arg(deadline)
            .arg(id);
        let mut replies = self.send(bucket, &[&read, &touch]).await?.into_iter();
        let (Some(data), Some(touched)) = (replies.next(), replies.next()) else {
            return Err(StoreError::Corrupt(
                "Redis answered a read with too few replies".to_string(),
            ));
        };
        checked(touched)?;
        let data = match checked(data)? {
            Reply::Array(data) => data,
            other => return Err(StoreError::Corrupt(format!("a read answered {other:?}"))),
        };
        if data.is_empty() {
            return Ok(None);
        }
        let pairs: Vec<(String, String)> = match selection {
            Selection::All => {
                let mut replies = data.into_iter();
                let mut pairs = Vec::with_capacity(replies.len() / 2);
                while let (Some(name), Some(value)) = (replies.next(), replies.next()) {
                    pairs.push((text(name)?, text(value)?));
                }
                pairs
            }
            Selection::Only(names) => {
                let requested = READ_RESERVED.iter().copied().chain(names.iter().map(String::as_str));
                requested
                    .zip(data)
                    .filter(|(_, value)| !matches!(value, Reply::Nil))
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
        let bucket = bucket_of(id);
        let mut invocation = Args::new();
        invocation
            .arg(2usize)
            .arg(&self.key(bucket, id))
            .arg(&self.deadlines[bucket])
            .arg(id)
            .arg(&patch.if_version.map(|version| version.to_string()).unwrap_or_default())
            .arg(now_ms());
        let only = match patch.set.first_key_value() {
            Some(field) if patch.set.len() == 1 && patch.delete.is_empty() => Some(field),
            _ => None,
        };
        let script = match only {
            Some((name, value)) => {
                invocation.arg(name).arg(value);
                &self.scripts.patch_one
            }
            None => {
                invocation.arg(patch.set.len());
                for (name, value) in &patch.set {
                    invocation.arg(name).arg(value);
                }
                for name in &patch.delete {
                    invocation.arg(name);
                }
                &self.scripts.patch
            }
        };
        self.run(script, bucket, &invocation, Acknowledged::Replicated)
            .await?
            .written(&self.policy)
    }

    async fn close(&self, id: &str, who: &CloseAs) -> Result<(), StoreError> {
        let owner = match who {
            CloseAs::Anyone => "",
            CloseAs::Owner(name) => name.as_str(),
        };
        let bucket = bucket_of(id);
        let mut invocation = Args::new();
        invocation
            .arg(2usize)
            .arg(&self.key(bucket, id))
            .arg(&self.deadlines[bucket])
            .arg(id)
            .arg(owner);
        let answer = self
            .run(&self.scripts.close, bucket, &invocation, Acknowledged::Replicated)
            .await?;
        if answer.status == "ok" {
            Ok(())
        } else {
            Err(answer.refusal(&self.policy)?)
        }
    }

    /// Every bucket at once (on one server the connection sends them in one
    /// write; on a cluster each node gets its buckets'), each bucket's script
    /// again while it finds a full batch.
    async fn sweep(&self) -> Result<SweepReport, StoreError> {
        let sweeps = (0..BUCKETS).map(|bucket| self.sweep_bucket(bucket));
        let mut report = SweepReport::default();
        for swept in futures::future::join_all(sweeps).await {
            let swept = swept?;
            report.idle += swept.idle;
            report.expired += swept.expired;
        }
        Ok(report)
    }

    async fn live_contexts(&self) -> Result<u64, StoreError> {
        let counts = (0..BUCKETS).map(|bucket| async move {
            let mut invocation = Args::new();
            invocation.arg(1usize).arg(&self.deadlines[bucket]);
            let answer = self
                .run(&self.scripts.live, bucket, &invocation, Acknowledged::Applied)
                .await?;
            Ok::<u64, StoreError>(answer.unsigned(0)? as u64)
        });
        let mut live = 0;
        for count in futures::future::join_all(counts).await {
            live += count?;
        }
        Ok(live)
    }

    /// One server: it answers `PING`. A cluster: the slot map is known and
    /// a primary answers (a shard being failed over leaves the others serving).
    async fn ping(&self) -> Result<(), StoreError> {
        let mut ping = Args::new();
        ping.arg("PING");
        let Some(cluster) = &self.cluster else {
            return checked(single(self.send(0, &[&ping]).await?)?).map(drop);
        };
        cluster.ensure_map().await.map_err(unavailable)?;
        let mut failures = Vec::new();
        for node in cluster.primaries() {
            match cluster.send_to(&node, &[&ping]).await.map_err(unavailable) {
                Ok(replies) => match single(replies).and_then(checked) {
                    Ok(_) => return Ok(()),
                    Err(error) => failures.push(format!("{node}: {error}")),
                },
                Err(error) => failures.push(format!("{node}: {error}")),
            }
        }
        Err(StoreError::Unavailable(format!(
            "no Redis Cluster primary answered PING ({})",
            failures.join("; ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_scripts_carry_the_whole_policy() {
        let policy = StorePolicy {
            default_ttl: Duration::from_secs(1800),
            one_shot_ttl: Duration::from_millis(150),
            idle_timeout: Duration::from_secs(600),
            max_fields: 7,
            max_context_bytes: 4096,
        };
        for parts in [PATCH_ONE, PATCH] {
            let text = bake_policy(&parts.concat(), &policy);
            assert!(!text.contains('$'), "a placeholder is left in:\n{text}");
            // Default tier: 30 min, refresh within 1 s (the cap), idle deadline 10 min;
            // one_shot: 150 ms, within 1 ms (a hundredth, in whole ms), its TTL before the idle timeout.
            assert!(text.contains("local ttl, granularity, idle = 1800000, 1000, 600000"));
            assert!(text.contains("ttl, granularity, idle = 150, 1, 150 end"));
            assert!(text.contains("if count > 7 then") && text.contains("if bytes > 4096 then"));
        }
    }

    #[test]
    fn script_answers_map_to_store_errors() {
        let policy = StorePolicy::default();
        let answer = |items: Vec<Reply>| Answer::parse(Reply::Array(items)).unwrap();
        let conflict = answer(vec![Reply::Bulk(b"conflict".to_vec()), Reply::Int(7)]);
        assert_eq!(
            conflict.written(&policy),
            Err(StoreError::VersionConflict { current: 7 })
        );
        let too_large = answer(vec![Reply::Bulk(b"too_large".to_vec()), Reply::Int(300_000)]);
        assert_eq!(
            too_large.written(&policy),
            Err(StoreError::TooLarge {
                limit: policy.max_context_bytes,
                would_have: 300_000
            })
        );
        let ok = answer(vec![Reply::Bulk(b"ok".to_vec()), Reply::Int(3), Reply::Int(1_000)]);
        assert_eq!(
            ok.written(&policy),
            Ok(Written {
                version: 3,
                expires_at_ms: 1_000
            })
        );
        let odd = answer(vec![Reply::Bulk(b"surprise".to_vec())]);
        assert!(matches!(odd.written(&policy), Err(StoreError::Corrupt(_))));
        assert!(Answer::parse(Reply::Nil).is_err());
    }

    #[test]
    fn transient_redis_errors_are_unavailable() {
        let read_only = Reply::Error("READONLY You can't write against a read only replica.".into());
        assert!(matches!(checked(read_only), Err(StoreError::Unavailable(_))));
        let loading = Reply::Error("LOADING Redis is loading the dataset in memory".into());
        assert!(matches!(checked(loading), Err(StoreError::Unavailable(_))));
        let script_bug = Reply::Error("ERR user_script:1: Script attempted to access nonexistent global".into());
        assert!(matches!(checked(script_bug), Err(StoreError::Corrupt(_))));
        assert_eq!(checked(Reply::Int(1)), Ok(Reply::Int(1)));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_that_lets_a_call_time_out_closes_and_is_replaced() {
        // A peer that accepts and never answers: a Redis lost without a reset.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}", silent.local_addr().unwrap());
        let accepted = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let (stream, _) = silent.accept().await.unwrap();
                held.push(stream);
            }
        });
        let namespace = Namespace {
            prefix: "t".into(),
            tenant: "t".into(),
        };
        let store = RedisStore::new(
            &agent_reach_stores::RedisLink::parse(&url).unwrap(),
            &namespace,
            StorePolicy::default(),
            Duration::from_millis(100),
        )
        .unwrap();
        let current = |store: &RedisStore| {
            CONNECTIONS.with(|connections| {
                connections
                    .borrow()
                    .iter()
                    .find(|(id, _, _, _)| *id == store.id)
                    .map(|(_, _, _, connection)| connection.clone())
            })
        };
        let silence = store.ping().await;
        assert!(
            matches!(&silence, Err(StoreError::Unavailable(message)) if message.contains("no answer from Redis within 100 ms")),
            "{silence:?}"
        );
        let first = current(&store).expect("this thread's connection");
        assert!(first.is_closed(), "the silent connection was closed");
        // The next call opens a fresh connection (to the same silent peer here).
        assert!(matches!(store.ping().await, Err(StoreError::Unavailable(_))));
        let second = current(&store).expect("this thread's connection");
        assert!(!second.same_as(&first), "a new connection replaced the silent one");
        accepted.abort();
    }

    #[test]
    fn ttls_are_never_zero() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_secs(2)), 2000);
        let namespace = Namespace {
            prefix: "agent-reach".into(),
            tenant: "default".into(),
        };
        let bucket = bucket_of("c1");
        let tag = &buckets()[bucket].0;
        assert_eq!(
            namespace.context_prefix(bucket),
            format!("agent-reach:default:ctx:{{{tag}}}:")
        );
        assert_eq!(
            namespace.deadlines(bucket),
            format!("agent-reach:default:deadlines:{{{tag}}}")
        );
    }

    #[test]
    fn a_contexts_keys_share_a_slot_and_buckets_spread_over_the_slots() {
        let namespace = Namespace {
            prefix: "agent-reach".into(),
            tenant: "default".into(),
        };
        for id in ["c1", "ctx_0123456789abcdef0123456789abcdef", "a{b}c", "{}"] {
            let bucket = bucket_of(id);
            let hash = format!("{}{id}", namespace.context_prefix(bucket));
            assert_eq!(
                key_slot(hash.as_bytes()),
                key_slot(namespace.deadlines(bucket).as_bytes()),
                "{id}"
            );
            assert_eq!(key_slot(hash.as_bytes()), buckets()[bucket].1);
        }
        // Each bucket its own slot, in its own 64-slot stretch: a cluster's
        // primaries hold buckets in proportion to their slots.
        for (bucket, (_, slot)) in buckets().iter().enumerate() {
            assert_eq!(usize::from(*slot) / 64, bucket);
        }
        // Part of the key layout (DESIGN §4.7): a change here moves every stored context.
        assert_eq!(bucket_of("c1"), 11);
        assert_eq!(
            [&buckets()[0].0, &buckets()[11].0, &buckets()[255].0],
            ["c113", "c10", "c143"]
        );
    }
}
