//! Where the trail (`agent_reach_trail`) keeps a tenant's records: beside
//! the tasks, under `{prefix}:{tenant}`, one hash tag per chain (a router
//! replica's) so that a chain and its indexes are one slot of a Redis
//! Cluster while chains spread over the shards (`{C}`: the chain's tag):
//! - `trail:{C}:records` — stream: one entry per record, id `{ms}-{seq}`,
//!   fields `r` (the body) and `h` (its hash); trimmed to the retention.
//! - `trail:{C}:heads` — stream: one entry per segment, id `{ms}-{segment}`, field `j` (the signed head).
//! - `trail:{C}:ix:{request|session|run}:{id}` — list of the record ids an
//!   index names, expiring with the retention.
//! - `trail:{C}:inputs:{capability}` — list of the newest record ids holding
//!   their input (at most [`INPUTS_KEPT`]), what replays sample.
//! - `trail:chains` — sorted set: chains by their last write (ms).
//!
//! A batch is two round trips: the chain's records, heads and indexes in one
//! script (one slot; see [`TRAIL_APPEND`]), then the chains set.

use std::collections::HashMap;
use std::time::Duration;

use agent_reach_trail::{Batch, ChainInfo, Index, Stored, StoredHead, TrailStore};
use async_trait::async_trait;
use redis::Value as RedisValue;

use super::record::entry_fields;
use super::TaskStore;

/// Record ids kept per capability for replays to sample.
pub const INPUTS_KEPT: isize = 10_000;

/// A batch in one script (one command and one answer, instead of three a
/// record: the pipeline's encoding and replies were half of the trail's
/// cost in the router, `router-bench --trail`'s profile). Idempotent: a
/// batch written before (a retry after a lost answer) finds its records
/// there and writes nothing twice.
const TRAIL_APPEND: &str = r#"
-- KEYS: 1 records stream, 2 heads stream, 3.. index lists (request, session, run, inputs)
-- ARGV: 1 retention s, 2 oldest ms (MINID), 3 head id, 4 head JWS, 5 records n, 6 inputs kept,
--       then per record: id, body, hash; then per index list: kind ('i' index, 'n' inputs),
--       count, and the positions (0-based) of its records
local n = tonumber(ARGV[5])
local base = 7
local function order(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms) or 0, tonumber(seq) or 0
end
local last_ms, last_seq = -1, -1
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #top > 0 then last_ms, last_seq = order(top[1][1]) end
local function fresh(id)
  local ms, seq = order(id)
  return ms > last_ms or (ms == last_ms and seq > last_seq)
end
local written = 0
for r = 0, n - 1 do
  local at = base + r * 3
  if fresh(ARGV[at]) then
    if written == 0 then
      redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[2], ARGV[at], 'r', ARGV[at + 1], 'h', ARGV[at + 2])
    else
      redis.call('XADD', KEYS[1], ARGV[at], 'r', ARGV[at + 1], 'h', ARGV[at + 2])
    end
    written = written + 1
  end
end
if written == 0 and n > 0 then return 0 end
local heads = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local head_ms, head_seq = order(ARGV[3])
local newer = true
if #heads > 0 then
  local ms, seq = order(heads[1][1])
  newer = head_ms > ms or (head_ms == ms and head_seq > seq)
end
if newer then redis.call('XADD', KEYS[2], 'MINID', '~', ARGV[2], ARGV[3], 'j', ARGV[4]) end
local a = base + n * 3
for k = 3, #KEYS do
  local kind, count = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  local ids = {}
  for j = 1, count do
    local id = ARGV[base + tonumber(ARGV[a + j - 1]) * 3]
    if fresh(id) then ids[#ids + 1] = id end
  end
  a = a + count
  if #ids > 0 then
    redis.call('RPUSH', KEYS[k], unpack(ids))
    if kind == 'n' then redis.call('LTRIM', KEYS[k], -tonumber(ARGV[6]), -1) end
    redis.call('EXPIRE', KEYS[k], ARGV[1])
  end
end
return written
"#;

fn trail_append() -> &'static redis::Script {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| redis::Script::new(TRAIL_APPEND))
}

impl TaskStore {
    fn chain_tag(router: &str) -> String {
        format!("tr-{router}")
    }

    fn trail_key(&self, router: &str, what: &str) -> String {
        format!("{}:trail:{{{}}}:{what}", self.namespace, Self::chain_tag(router))
    }

    fn chains_key(&self) -> String {
        format!("{}:trail:chains", self.namespace)
    }

    /// The stored records of `router`'s chain with these stream ids, in order.
    async fn records_by_id(&self, router: &str, ids: &[String]) -> Result<Vec<Stored>, String> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut connection = self.connection().await.map_err(|error| error.to_string())?;
        let key = self.trail_key(router, "records");
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("XRANGE").arg(&key).arg(id).arg(id);
        }
        let answers: Vec<RedisValue> = pipe
            .query_async(&mut connection)
            .await
            .map_err(|error| format!("reading the trail: {error}"))?;
        Ok(answers.iter().flat_map(stored).collect())
    }
}

/// The records of an XRANGE answer.
fn stored(answer: &RedisValue) -> Vec<Stored> {
    entry_fields(answer)
        .into_iter()
        .map(|(id, mut fields)| Stored {
            id,
            body: fields.remove("r").unwrap_or_default(),
            hash: fields.remove("h").unwrap_or_default(),
        })
        .collect()
}

/// A stream id's order: its milliseconds, then its sequence number.
fn stream_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

/// The stream range after `after` (exclusive), or from the start.
fn start_after(after: Option<&str>) -> String {
    after.map_or_else(|| "-".to_string(), |after| format!("({after}"))
}

#[async_trait]
impl TrailStore for TaskStore {
    async fn append(&self, batch: &Batch, retention: Duration) -> Result<(), String> {
        let mut connection = self.connection().await.map_err(|error| error.to_string())?;
        let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
        let retention_s = retention.as_secs().max(1);
        let oldest = batch.at_ms.saturating_sub(retention_ms);
        // The index keys (each once per batch, however many records it
        // names), and per key the positions of its records in the batch.
        let mut keys: Vec<(String, bool, Vec<usize>)> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        let mut add = |key: String, inputs: bool, position: usize| match at.get(&key) {
            Some(&index) => keys[index].2.push(position),
            None => {
                at.insert(key.clone(), keys.len());
                keys.push((key, inputs, vec![position]));
            }
        };
        for (position, sealed) in batch.records.iter().enumerate() {
            add(
                self.trail_key(&batch.router, &format!("ix:request:{}", sealed.request_id)),
                false,
                position,
            );
            if let Some(session) = &sealed.session_id {
                add(
                    self.trail_key(&batch.router, &format!("ix:session:{session}")),
                    false,
                    position,
                );
            }
            if let Some(run) = &sealed.run_id {
                add(self.trail_key(&batch.router, &format!("ix:run:{run}")), false, position);
            }
            if sealed.has_input {
                add(
                    self.trail_key(&batch.router, &format!("inputs:{}", sealed.capability)),
                    true,
                    position,
                );
            }
        }
        let mut invocation = trail_append().prepare_invoke();
        invocation
            .key(self.trail_key(&batch.router, "records"))
            .key(self.trail_key(&batch.router, "heads"));
        for (key, _, _) in &keys {
            invocation.key(key);
        }
        invocation
            .arg(retention_s)
            .arg(oldest)
            .arg(&batch.head.id)
            .arg(&batch.head.jws)
            .arg(batch.records.len())
            .arg(INPUTS_KEPT);
        for sealed in &batch.records {
            invocation
                .arg(&sealed.stored.id)
                .arg(&sealed.stored.body)
                .arg(&sealed.stored.hash);
        }
        for (_, inputs, positions) in &keys {
            invocation.arg(if *inputs { "n" } else { "i" }).arg(positions.len());
            for position in positions {
                invocation.arg(*position);
            }
        }
        let _: i64 = invocation
            .invoke_async(&mut connection)
            .await
            .map_err(|error| format!("writing the trail: {error}"))?;
        // Another slot on a cluster: its own command.
        let _: () = redis::pipe()
            .cmd("ZADD")
            .arg(self.chains_key())
            .arg(batch.at_ms)
            .arg(&batch.router)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(self.chains_key())
            .arg("-inf")
            .arg(format!("({oldest}"))
            .ignore()
            .query_async(&mut connection)
            .await
            .map_err(|error| format!("writing the trail's chains: {error}"))?;
        Ok(())
    }

    async fn chains(&self) -> Result<Vec<ChainInfo>, String> {
        let mut connection = self.connection().await.map_err(|error| error.to_string())?;
        let chains: Vec<(String, f64)> = redis::cmd("ZREVRANGE")
            .arg(self.chains_key())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut connection)
            .await
            .map_err(|error| format!("reading the trail's chains: {error}"))?;
        Ok(chains
            .into_iter()
            .map(|(router, at)| ChainInfo {
                router,
                last_at_ms: at as u64,
            })
            .collect())
    }

    async fn records_of(&self, index: &Index, limit: usize) -> Result<Vec<Stored>, String> {
        let (kind, value) = index.parts();
        let mut found = Vec::new();
        for chain in self.chains().await? {
            let mut connection = self.connection().await.map_err(|error| error.to_string())?;
            let ids: Vec<String> = redis::cmd("LRANGE")
                .arg(self.trail_key(&chain.router, &format!("ix:{kind}:{value}")))
                .arg(0)
                .arg(isize::try_from(limit).unwrap_or(isize::MAX).saturating_sub(1))
                .query_async(&mut connection)
                .await
                .map_err(|error| format!("reading the trail's index: {error}"))?;
            found.extend(self.records_by_id(&chain.router, &ids).await?);
            if found.len() >= limit {
                found.truncate(limit);
                break;
            }
        }
        Ok(found)
    }

    async fn chain_records(&self, router: &str, after: Option<&str>, limit: usize) -> Result<Vec<Stored>, String> {
        let mut connection = self.connection().await.map_err(|error| error.to_string())?;
        let answer: RedisValue = redis::cmd("XRANGE")
            .arg(self.trail_key(router, "records"))
            .arg(start_after(after))
            .arg("+")
            .arg("COUNT")
            .arg(limit.max(1))
            .query_async(&mut connection)
            .await
            .map_err(|error| format!("reading the trail: {error}"))?;
        Ok(stored(&answer))
    }

    async fn chain_heads(&self, router: &str, after: Option<&str>, limit: usize) -> Result<Vec<StoredHead>, String> {
        let mut connection = self.connection().await.map_err(|error| error.to_string())?;
        let answer: RedisValue = redis::cmd("XRANGE")
            .arg(self.trail_key(router, "heads"))
            .arg(start_after(after))
            .arg("+")
            .arg("COUNT")
            .arg(limit.max(1))
            .query_async(&mut connection)
            .await
            .map_err(|error| format!("reading the trail's heads: {error}"))?;
        Ok(entry_fields(&answer)
            .into_iter()
            .map(|(id, mut fields)| StoredHead {
                id,
                jws: fields.remove("j").unwrap_or_default(),
            })
            .collect())
    }

    async fn chain_records_since(&self, router: &str, since_ms: u64, limit: usize) -> Result<Vec<Stored>, String> {
        let mut connection = self.connection().await.map_err(|error| error.to_string())?;
        let answer: RedisValue = redis::cmd("XREVRANGE")
            .arg(self.trail_key(router, "records"))
            .arg("+")
            .arg(format!("{since_ms}-0"))
            .arg("COUNT")
            .arg(limit.max(1))
            .query_async(&mut connection)
            .await
            .map_err(|error| format!("reading the trail: {error}"))?;
        Ok(stored(&answer))
    }

    async fn recent_with_input(&self, capability: &str, limit: usize) -> Result<Vec<Stored>, String> {
        let mut found = Vec::new();
        for chain in self.chains().await? {
            let mut connection = self.connection().await.map_err(|error| error.to_string())?;
            let ids: Vec<String> = redis::cmd("LRANGE")
                .arg(self.trail_key(&chain.router, &format!("inputs:{capability}")))
                .arg(-isize::try_from(limit).unwrap_or(isize::MAX))
                .arg(-1)
                .query_async(&mut connection)
                .await
                .map_err(|error| format!("reading the trail's inputs: {error}"))?;
            found.extend(self.records_by_id(&chain.router, &ids).await?);
        }
        // Newest first, across chains.
        found.sort_by_key(|stored| std::cmp::Reverse(stream_order(&stored.id)));
        found.truncate(limit);
        Ok(found)
    }
}
