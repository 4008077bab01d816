//! Talking to Redis: the store made, this thread's connection (or, on a
//! cluster, the bucket's node), pipelines, scripts run with `WAIT`, error replies.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::layout::buckets;
use super::scripts::{Answer, Script, Scripts};
use super::{unavailable, Namespace, RedisStore, BUCKETS};
use crate::model::StorePolicy;
use crate::store::cluster::Cluster;
use crate::store::resp::{self, Args, Pipeline, Reply};
use crate::store::StoreError;

/// Distinguishes stores sharing a thread (several services in one test process).
static NEXT_STORE_ID: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's connection per store ([`Slot`]).
    /// Entries of dropped stores are pruned when a new entry is added.
    pub(super) static CONNECTIONS: RefCell<Vec<Slot>> = const { RefCell::new(Vec::new()) };
}

/// A thread's connection for one store: the store's id and liveness, the
/// Sentinel generation the connection was opened under (0 without), the connection.
type Slot = (usize, Weak<()>, u64, resp::Connection);

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
    pub(super) async fn send(&self, bucket: usize, commands: &[&Args]) -> Result<Vec<Reply>, StoreError> {
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
    pub(super) async fn run(
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
pub(super) enum Acknowledged {
    /// An acknowledged write (create, patch, close): `WAIT` when the store has it.
    Replicated,
    /// A sweep or a count: as soon as the primary ran it.
    Applied,
}

fn no_reply() -> StoreError {
    StoreError::Corrupt("Redis sent no reply".to_string())
}

/// The one reply of a one-command pipeline.
pub(super) fn single(replies: Vec<Reply>) -> Result<Reply, StoreError> {
    replies.into_iter().next().ok_or_else(no_reply)
}

/// An error reply as a store error: a Redis that cannot serve right now
/// (loading, failing over, a read-only replica, a busy script) is "unavailable"
/// and the caller should retry; any other error means a bug or a hand-edited key.
pub(super) fn checked(reply: Reply) -> Result<Reply, StoreError> {
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
