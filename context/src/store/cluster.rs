//! Redis Cluster for the context store (`redis+cluster://`, DESIGN §4.7):
//! the slot map, a [`resp::Connection`] per node and serving thread, and
//! the redirections.
//!
//! Every request the store makes is one slot by design (a context's hash and
//! its bucket's deadline set share a hash tag), so a request goes to one node
//! whole, as one pipeline:
//!
//! - the node is the slot's owner in the slot map, learnt with `CLUSTER
//!   SLOTS` from any node that answers (the map's nodes, then the URL's
//!   seeds; each asked for at most 500 ms), at the first request and again
//!   after any `MOVED`, a connection that failed, or `CLUSTERDOWN` (at most
//!   one refresh at a time; a refresh within the last 50 ms counts);
//! - `MOVED slot host:port`: the request goes again to that node at once (the
//!   map follows in the background);
//! - `ASK slot host:port` (a slot migrating): again to that node, each
//!   command preceded by `ASKING`, the map left as it is;
//! - `TRYAGAIN` (a multi-key request while its slot's keys are split by a
//!   migration), `CLUSTERDOWN` and a connection that could not be made (a
//!   primary lost, its replica not promoted yet): again after 10, 20, 40 …
//!   ms (at most 100 ms) until the store's timeout, then the last answer or
//!   failure stands (the service answers 503).
//!
//! Commands are resent only when the node did not run them: a redirection or
//! `TRYAGAIN` (the command was not executed), or a connection that failed
//! before they were written ([`resp::NOT_SENT`]: it could not be made). A
//! connection that failed after they were written answers at once, as on
//! one server ("may or may not have been applied"), the map refreshed for
//! the next request. A primary's loss is seen first as a failed connection
//! (refused at once, or the reply timeout of a hung host); once the cluster
//! has promoted a replica, the refreshed map names it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use agent_reach_stores::slot::SLOTS;
use agent_reach_stores::HostPort;
use arc_swap::ArcSwap;

use super::resp::{self, Args, Pipeline, Reply};

/// Which node serves each slot.
#[derive(Debug, Default)]
struct SlotMap {
    /// Per slot, an index into `nodes`; `UNKNOWN` while no node serves it.
    owners: Vec<u16>,
    nodes: Vec<HostPort>,
}

const UNKNOWN: u16 = u16::MAX;

impl SlotMap {
    fn owner(&self, slot: u16) -> Option<&HostPort> {
        let index = *self.owners.get(usize::from(slot))?;
        self.nodes.get(usize::from(index))
    }
}

/// One cluster: where discovery starts, how to connect, the current map.
pub struct Cluster {
    id: usize,
    /// Dropped with the cluster; thread-local connections holding a `Weak` to it are then stale.
    alive: Arc<()>,
    seeds: Vec<HostPort>,
    /// Credentials, TLS and timeouts of every node connection; the address is each node's.
    template: resp::Target,
    map: ArcSwap<SlotMap>,
    /// Held while a refresh runs; the time of the last one.
    refreshing: tokio::sync::Mutex<Option<Instant>>,
    /// Bound on one request, redirections and retries included.
    timeout: Duration,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("seeds", &self.seeds)
            .field("nodes", &self.map.load().nodes)
            .finish()
    }
}

static NEXT_CLUSTER_ID: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's connection per cluster and node.
    static NODE_CONNECTIONS: RefCell<Vec<NodeSlot>> = const { RefCell::new(Vec::new()) };
}

/// A thread's connection to one node of one cluster.
type NodeSlot = (usize, Weak<()>, HostPort, resp::Connection);

/// What a reply asks of the request.
#[derive(Debug, PartialEq, Eq)]
enum Redirect {
    Moved(HostPort),
    Ask(HostPort),
    /// Try the same node again shortly (`TRYAGAIN`).
    Again,
    /// The cluster cannot serve the slot now (`CLUSTERDOWN`): refresh, then again.
    Down,
}

impl Cluster {
    /// `template` holds everything but the address (its `host`/`port` and
    /// `primary` are ignored); `timeout` bounds each request.
    pub fn new(seeds: Vec<HostPort>, template: resp::Target, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            id: NEXT_CLUSTER_ID.fetch_add(1, Ordering::Relaxed),
            alive: Arc::new(()),
            seeds,
            template,
            map: ArcSwap::from_pointee(SlotMap::default()),
            refreshing: tokio::sync::Mutex::new(None),
            timeout,
        })
    }

    /// Sends `commands` (all of one slot, `slot`) to the node serving it and
    /// returns their replies, following redirections (see the module notes).
    /// `Err`: no node could be reached within the timeout.
    pub async fn send(self: &Arc<Self>, slot: u16, commands: &[&Args]) -> Result<Vec<Reply>, String> {
        let deadline = Instant::now() + self.timeout;
        let mut node = match self.owner(slot) {
            Some(node) => node,
            None => {
                self.refresh().await?;
                self.owner(slot)
                    .ok_or_else(|| format!("no node of the Redis Cluster serves slot {slot}"))?
            }
        };
        let mut asking = false;
        let mut pause = Duration::from_millis(10);
        loop {
            let sent = self.connection(&node).send(pipeline(commands, asking)).await;
            let replies = match sent {
                Ok(replies) if asking => replies.into_iter().skip(1).step_by(2).collect(),
                Ok(replies) => replies,
                Err(why) => {
                    // Written, then the connection failed: the commands may have
                    // run, so they are not sent again (503, as on one server).
                    if !why.starts_with(resp::NOT_SENT) || Instant::now() + pause >= deadline {
                        self.refresh_soon();
                        return Err(format!("Redis Cluster node {node}: {why}"));
                    }
                    // Never written (the node is gone): once the cluster has
                    // promoted a replica, a refreshed map names it.
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                    if let Err(error) = self.refresh().await {
                        tracing::warn!(message = "Redis Cluster slot map refresh failed.", %error);
                    }
                    node = self.owner(slot).unwrap_or(node);
                    asking = false;
                    continue;
                }
            };
            let Some(redirect) = replies.iter().find_map(redirect) else {
                return Ok(replies);
            };
            match redirect {
                Redirect::Moved(to) => {
                    node = to;
                    asking = false;
                    self.refresh_soon();
                }
                Redirect::Ask(to) => {
                    node = to;
                    asking = true;
                }
                Redirect::Again | Redirect::Down => {
                    if Instant::now() + pause >= deadline {
                        // The caller maps the answer (`TRYAGAIN`, `CLUSTERDOWN`) to "unavailable".
                        return Ok(replies);
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                    if redirect == Redirect::Down {
                        if let Err(error) = self.refresh().await {
                            tracing::warn!(message = "Redis Cluster slot map refresh failed.", %error);
                        }
                        node = self.owner(slot).unwrap_or(node);
                        asking = false;
                    }
                }
            }
            if Instant::now() >= deadline {
                return Ok(replies);
            }
        }
    }

    /// The primaries the map names (none before the first request).
    pub fn primaries(&self) -> Vec<HostPort> {
        let map = self.map.load();
        let mut nodes: Vec<HostPort> = map
            .owners
            .iter()
            .filter(|index| **index != UNKNOWN)
            .filter_map(|index| map.nodes.get(usize::from(*index)).cloned())
            .collect();
        nodes.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
        nodes.dedup();
        nodes
    }

    /// Learns the map if none is known yet; `Err` when no node answers.
    pub async fn ensure_map(self: &Arc<Self>) -> Result<(), String> {
        if self.map.load().nodes.is_empty() {
            self.refresh().await?;
        }
        Ok(())
    }

    /// Sends `commands` to `node` as they are (no slot, no redirection): `PING`.
    pub async fn send_to(&self, node: &HostPort, commands: &[&Args]) -> Result<Vec<Reply>, String> {
        self.connection(node).send(pipeline(commands, false)).await
    }

    fn owner(&self, slot: u16) -> Option<HostPort> {
        self.map.load().owner(slot).cloned()
    }

    /// This thread's connection to `node` (a new one when there is none yet
    /// or the last one broke).
    fn connection(&self, node: &HostPort) -> resp::Connection {
        NODE_CONNECTIONS.with(|connections| {
            let mut connections = connections.borrow_mut();
            if let Some(at) = connections
                .iter()
                .position(|(id, _, address, _)| *id == self.id && address == node)
            {
                if !connections[at].3.is_closed() {
                    return connections[at].3.clone();
                }
                connections.swap_remove(at);
            }
            connections.retain(|(_, alive, _, _)| alive.strong_count() > 0);
            let mut target = self.template.clone();
            target.host = node.host.clone();
            target.port = node.port;
            target.primary = None;
            let connection = resp::Connection::open(target);
            connections.push((self.id, Arc::downgrade(&self.alive), node.clone(), connection.clone()));
            connection
        })
    }

    /// Refreshes the map in the background (after a `MOVED`).
    fn refresh_soon(self: &Arc<Self>) {
        let cluster = self.clone();
        tokio::spawn(async move {
            if let Err(error) = cluster.refresh().await {
                tracing::warn!(message = "Redis Cluster slot map refresh failed.", %error);
            }
        });
    }

    /// Asks the map's nodes, then the seeds, for `CLUSTER SLOTS` until one
    /// answers; one refresh at a time, and none within 50 ms of the last.
    async fn refresh(&self) -> Result<(), String> {
        let mut last = self.refreshing.lock().await;
        if last.is_some_and(|at| at.elapsed() < Duration::from_millis(50)) {
            return Ok(());
        }
        let mut candidates = self.primaries();
        candidates.extend(self.map.load().nodes.iter().cloned());
        candidates.extend(self.seeds.iter().cloned());
        let mut failures = Vec::new();
        let mut asked = Vec::new();
        for node in candidates {
            if asked.contains(&node) {
                continue;
            }
            asked.push(node.clone());
            let mut slots = Args::new();
            slots.arg("CLUSTER").arg("SLOTS");
            // A hung node must not hold the refresh (and every request behind it) for long.
            let bound = self.timeout.min(Duration::from_millis(500));
            let connection = self.connection(&node);
            let answer = match tokio::time::timeout(bound, connection.send(pipeline(&[&slots], false))).await {
                Ok(Ok(mut replies)) => replies.pop().ok_or_else(|| "no reply".to_string()),
                Ok(Err(why)) => Err(why),
                Err(_) => Err(format!("no answer within {} ms", bound.as_millis())),
            };
            match answer.and_then(|reply| parse_slots(reply, &node)) {
                Ok(map) => {
                    let before = self.map.load();
                    if !before.nodes.is_empty() && before.owners != map.owners {
                        tracing::info!(message = "Redis Cluster slot map changed.", nodes = map.nodes.len());
                    }
                    self.map.store(Arc::new(map));
                    *last = Some(Instant::now());
                    return Ok(());
                }
                Err(why) => failures.push(format!("{node}: {why}")),
            }
        }
        *last = Some(Instant::now());
        Err(format!(
            "no Redis Cluster node answered CLUSTER SLOTS ({})",
            failures.join("; ")
        ))
    }
}

/// `commands` as one pipeline, each preceded by `ASKING` when `asking`.
fn pipeline(commands: &[&Args], asking: bool) -> Pipeline {
    let size: usize = commands.iter().map(|command| command.encoded_len() + 16).sum();
    let mut pipeline = Pipeline::with_capacity(size + if asking { 24 * commands.len() } else { 0 });
    for command in commands {
        if asking {
            pipeline.command(Args::with_capacity(16).arg("ASKING"));
        }
        pipeline.command(command);
    }
    pipeline
}

/// A redirection or retry a reply asks for.
fn redirect(reply: &Reply) -> Option<Redirect> {
    let Reply::Error(message) = reply else {
        return None;
    };
    let mut words = message.split(' ');
    match words.next()? {
        "MOVED" => words.nth(1).and_then(parse_address).map(Redirect::Moved),
        "ASK" => words.nth(1).and_then(parse_address).map(Redirect::Ask),
        "TRYAGAIN" => Some(Redirect::Again),
        "CLUSTERDOWN" => Some(Redirect::Down),
        _ => None,
    }
}

/// `host:port` (an IPv6 host without brackets, as Redis writes it).
fn parse_address(text: &str) -> Option<HostPort> {
    let (host, port) = text.rsplit_once(':')?;
    Some(HostPort {
        host: host.trim_start_matches('[').trim_end_matches(']').to_string(),
        port: port.parse().ok()?,
    })
}

/// `CLUSTER SLOTS`: `[[start, end, [host, port, id, …], replicas …], …]`.
/// An empty host means the node asked (`asked`).
fn parse_slots(reply: Reply, asked: &HostPort) -> Result<SlotMap, String> {
    let Reply::Array(ranges) = reply else {
        return Err(match reply {
            Reply::Error(message) => format!("CLUSTER SLOTS failed: {message}"),
            other => format!("CLUSTER SLOTS answered {other:?}"),
        });
    };
    let mut map = SlotMap {
        owners: vec![UNKNOWN; usize::from(SLOTS)],
        nodes: Vec::new(),
    };
    for range in ranges {
        let Reply::Array(parts) = range else {
            return Err("a CLUSTER SLOTS range is not an array".to_string());
        };
        let (Some(Reply::Int(start)), Some(Reply::Int(end)), Some(Reply::Array(primary))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return Err("a CLUSTER SLOTS range lacks its bounds or primary".to_string());
        };
        let host = match primary.first() {
            Some(Reply::Bulk(bytes)) if bytes.is_empty() || bytes == b"?" => asked.host.clone(),
            Some(Reply::Bulk(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            _ => return Err("a CLUSTER SLOTS primary has no host".to_string()),
        };
        let Some(Reply::Int(port)) = primary.get(1) else {
            return Err("a CLUSTER SLOTS primary has no port".to_string());
        };
        let node = HostPort {
            host,
            port: u16::try_from(*port).map_err(|_| format!("port {port} out of range"))?,
        };
        let index = match map.nodes.iter().position(|known| *known == node) {
            Some(index) => index,
            None => {
                map.nodes.push(node);
                map.nodes.len() - 1
            }
        };
        let index = u16::try_from(index).map_err(|_| "too many nodes".to_string())?;
        let (start, end) = (
            usize::try_from(*start).map_err(|_| "a negative slot".to_string())?,
            usize::try_from(*end).map_err(|_| "a negative slot".to_string())?,
        );
        if start > end || end >= usize::from(SLOTS) {
            return Err(format!("slot range {start}-{end} out of bounds"));
        }
        for owner in &mut map.owners[start..=end] {
            *owner = index;
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Reply {
        Reply::Bulk(text.as_bytes().to_vec())
    }

    #[test]
    fn redirections_are_read_from_error_replies() {
        let node = |port| HostPort {
            host: "127.0.0.1".into(),
            port,
        };
        assert_eq!(
            redirect(&Reply::Error("MOVED 3999 127.0.0.1:6381".into())),
            Some(Redirect::Moved(node(6381)))
        );
        assert_eq!(
            redirect(&Reply::Error("ASK 3999 127.0.0.1:6382".into())),
            Some(Redirect::Ask(node(6382)))
        );
        assert_eq!(
            redirect(&Reply::Error(
                "TRYAGAIN Multiple keys request during rehashing of slot".into()
            )),
            Some(Redirect::Again)
        );
        assert_eq!(
            redirect(&Reply::Error("CLUSTERDOWN The cluster is down".into())),
            Some(Redirect::Down)
        );
        assert_eq!(redirect(&Reply::Error("ERR wrong number of arguments".into())), None);
        assert_eq!(redirect(&Reply::Int(1)), None);
        assert_eq!(
            parse_address("::1:7000"),
            Some(HostPort {
                host: "::1".into(),
                port: 7000
            })
        );
    }

    #[test]
    fn the_slot_map_is_read_from_cluster_slots() {
        let asked = HostPort {
            host: "10.0.0.9".into(),
            port: 7000,
        };
        let reply = Reply::Array(vec![
            Reply::Array(vec![
                Reply::Int(0),
                Reply::Int(5460),
                Reply::Array(vec![bulk("10.0.0.1"), Reply::Int(7000), bulk("id-a")]),
                Reply::Array(vec![bulk("10.0.0.4"), Reply::Int(7000), bulk("id-d")]),
            ]),
            Reply::Array(vec![
                Reply::Int(5461),
                Reply::Int(16383),
                Reply::Array(vec![bulk(""), Reply::Int(7001), bulk("id-b")]),
            ]),
        ]);
        let map = parse_slots(reply, &asked).unwrap();
        assert_eq!(map.owner(0).map(ToString::to_string).as_deref(), Some("10.0.0.1:7000"));
        assert_eq!(
            map.owner(5460).map(ToString::to_string).as_deref(),
            Some("10.0.0.1:7000")
        );
        assert_eq!(
            map.owner(5461).map(ToString::to_string).as_deref(),
            Some("10.0.0.9:7001"),
            "an empty host is the node asked"
        );
        assert_eq!(map.nodes.len(), 2);
        assert!(parse_slots(
            Reply::Error("ERR This instance has cluster support disabled".into()),
            &asked
        )
        .unwrap_err()
        .contains("cluster support disabled"));
    }

    #[test]
    fn asking_precedes_every_command() {
        let mut get = Args::new();
        get.arg("HGETALL").arg("k");
        let mut touch = Args::new();
        touch.arg("ZADD").arg("d").arg("XX").arg(1u64).arg("k");
        let plain = pipeline(&[&get, &touch], false);
        let asking = pipeline(&[&get, &touch], true);
        assert_eq!(plain.len(), 2);
        assert_eq!(asking.len(), 4);
    }
}
