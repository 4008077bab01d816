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
//!
//! Here: the store's state and shared helpers. Beside it: `layout` (the
//! buckets and the keys above), `scripts` (the Lua scripts and their
//! answers), `connection` (the store made, connections, pipelines, script
//! calls with `WAIT`) and `operations` (the
//! [`ContextStore`](super::ContextStore) operations).

use std::sync::Arc;
use std::time::Duration;

use self::scripts::Scripts;
use super::cluster::Cluster;
use super::resp::{self, Reply};
use super::StoreError;
use crate::model::StorePolicy;

pub use self::layout::{bucket_of, Namespace, BUCKETS};

mod connection;
mod layout;
mod operations;
mod scripts;
#[cfg(test)]
mod tests;

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

fn text(reply: Reply) -> Result<String, StoreError> {
    reply.into_text().map_err(StoreError::Corrupt)
}
