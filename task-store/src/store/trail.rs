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
//! pipeline (one slot), then the chains set.

use std::collections::HashMap;
use std::time::Duration;

use agent_reach_trail::{Batch, ChainInfo, Index, Stored, StoredHead, TrailStore};
use async_trait::async_trait;
use redis::Value as RedisValue;

use super::record::entry_fields;
use super::TaskStore;

/// Record ids kept per capability for replays to sample.
pub const INPUTS_KEPT: isize = 10_000;

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
        let records = self.trail_key(&batch.router, "records");
        let mut pipe = redis::pipe();
        let oldest = batch.at_ms.saturating_sub(retention_ms);
        for (index, sealed) in batch.records.iter().enumerate() {
            let command = pipe.cmd("XADD").arg(&records);
            if index == 0 {
                command.arg("MINID").arg("~").arg(oldest);
            }
            command
                .arg(&sealed.stored.id)
                .arg("r")
                .arg(&sealed.stored.body)
                .arg("h")
                .arg(&sealed.stored.hash)
                .ignore();
        }
        pipe.cmd("XADD")
            .arg(self.trail_key(&batch.router, "heads"))
            .arg("MINID")
            .arg("~")
            .arg(oldest)
            .arg(&batch.head.id)
            .arg("j")
            .arg(&batch.head.jws)
            .ignore();
        // Each index key once per batch, however many of its records it holds.
        let mut indexes: HashMap<String, Vec<&str>> = HashMap::new();
        for sealed in &batch.records {
            let id = sealed.stored.id.as_str();
            let mut add = |kind: &str, value: &str| {
                indexes
                    .entry(self.trail_key(&batch.router, &format!("ix:{kind}:{value}")))
                    .or_default()
                    .push(id)
            };
            add("request", &sealed.request_id);
            if let Some(session) = &sealed.session_id {
                add("session", session);
            }
            if let Some(run) = &sealed.run_id {
                add("run", run);
            }
        }
        for (key, ids) in &indexes {
            pipe.cmd("RPUSH").arg(key).arg(ids).ignore();
            pipe.cmd("EXPIRE").arg(key).arg(retention_s).ignore();
        }
        let mut inputs: HashMap<String, Vec<&str>> = HashMap::new();
        for sealed in batch.records.iter().filter(|sealed| sealed.has_input) {
            inputs
                .entry(self.trail_key(&batch.router, &format!("inputs:{}", sealed.capability)))
                .or_default()
                .push(&sealed.stored.id);
        }
        for (key, ids) in &inputs {
            pipe.cmd("RPUSH").arg(key).arg(ids).ignore();
            pipe.cmd("LTRIM").arg(key).arg(-INPUTS_KEPT).arg(-1).ignore();
            pipe.cmd("EXPIRE").arg(key).arg(retention_s).ignore();
        }
        let _: () = pipe
            .query_async(&mut connection)
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
