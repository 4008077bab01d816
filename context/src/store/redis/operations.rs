//! The [`ContextStore`] operations on Redis: create, read, patch, close, the
//! sweep of idle contexts, the live count, ping.

use std::time::{SystemTime, UNIX_EPOCH};

use super::connection::{checked, single, Acknowledged};
use super::{bucket_of, millis, text, unavailable, RedisStore, BUCKETS};
use crate::model::{CloseAs, NewContext, Patch, Selection, Snapshot, SweepReport, Tier, Written};
use crate::store::resp::{Args, Reply};
use crate::store::{ContextStore, StoreError};

/// Reserved hash entries (not user fields).
const RESERVED: [&str; 5] = ["_version", "_tier", "_owner", "_bytes", "_expires"];

/// The reserved entries a read returns (`_bytes` is for writes only).
const READ_RESERVED: [&str; 4] = ["_version", "_tier", "_owner", "_expires"];

/// Index entries removed per sweep script call (keeps each script short).
const SWEEP_BATCH: usize = 500;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
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
