//! A Redis Cluster on loopback: three primaries and three replicas (six real
//! `redis-server --cluster-enabled yes` processes, each in its own temp dir,
//! joined by `redis-cli --cluster create … --cluster-replicas 1`), for tests
//! of slot redirections, a shard primary's loss and slot migration; or
//! another [`ClusterShape`] (benches compare one shard with three).
//!
//! Every wait polls the nodes (`CLUSTER INFO`, `CLUSTER NODES`, `ROLE`) until
//! the condition holds or a bound passes; every process is killed with the
//! fixture, pass or fail. A killed primary's replica is promoted by the
//! cluster itself (`cluster-node-timeout` 1500 ms); a restarted node rejoins
//! from its `nodes.conf` as a replica of whoever took its slots. The nodes
//! run with `cluster-require-full-coverage no`, as production should: one
//! shard's loss leaves the others serving.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::redis_ha::{call, command};
use crate::{find_binary, free_port, tail, wait_until, Guard, START_TIMEOUT};

/// Milliseconds a node may be unreachable before the cluster fails it over.
pub const NODE_TIMEOUT_MS: u64 = 1500;

struct ClusterNode {
    port: u16,
    /// The cluster bus port (`cluster-port`), chosen free like `port`.
    bus_port: u16,
    process: Option<Guard>,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub id: String,
    pub port: u16,
    /// `master` or `slave` (the word `CLUSTER NODES` uses).
    pub role: String,
    /// For a replica, the id of its primary.
    pub primary_id: Option<String>,
    /// Marked `fail` or `fail?` by the node asked.
    pub failing: bool,
    /// The slot ranges it serves (primaries), inclusive.
    pub slots: Vec<(u16, u16)>,
}

/// How many primaries, replicas each, and whether nodes keep an append-only file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterShape {
    /// Shards (each a primary serving a share of the 16384 slots), at least 1.
    pub primaries: usize,
    /// Replicas per primary (only with 3 or more primaries: `redis-cli
    /// --cluster create` refuses fewer, and fewer are joined by hand).
    pub replicas: usize,
    /// `appendonly yes` with `appendfsync everysec`, as production runs;
    /// `false`: no persistence, as the testkit's single `Redis`.
    pub append_only: bool,
}

impl ClusterShape {
    /// Three primaries, one replica each, append-only: what tests of failover use.
    pub const TESTS: Self = Self {
        primaries: 3,
        replicas: 1,
        append_only: true,
    };
}

/// A Redis Cluster of real nodes (three primaries and three replicas unless
/// shaped otherwise). Killed on drop; their directories are removed.
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    shape: ClusterShape,
    binary: PathBuf,
    cli: PathBuf,
    dir: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts six nodes, joins them into a cluster (16384 slots over three
    /// primaries, one replica each) and waits until every node says the
    /// cluster is ok, knows all six and every replica has synced.
    pub fn start() -> Self {
        Self::start_shaped(ClusterShape::TESTS)
    }

    /// Starts a cluster of `shape` (benches compare one shard against three).
    pub fn start_shaped(shape: ClusterShape) -> Self {
        assert!(shape.primaries >= 1, "a Redis Cluster needs at least one primary");
        assert!(
            shape.replicas == 0 || shape.primaries >= 3,
            "replicas are joined only to three or more primaries"
        );
        let binary = find_binary("redis-server", "redis-server");
        let cli = find_binary("redis-cli", "redis-tools");
        let mut last_log = String::new();
        for _ in 0..3 {
            let dir = tempfile::Builder::new()
                .prefix("agent-reach-redis-cluster-")
                .tempdir()
                .unwrap_or_else(|error| panic!("cannot create a temp dir for the Redis Cluster: {error}"));
            let mut cluster = Self {
                nodes: (0..shape.primaries * (1 + shape.replicas))
                    .map(|_| ClusterNode {
                        port: free_port(),
                        bus_port: free_port(),
                        process: None,
                    })
                    .collect(),
                shape,
                binary: binary.clone(),
                cli: cli.clone(),
                dir,
            };
            match cluster.launch() {
                Ok(()) => return cluster,
                Err(log) => last_log = log,
            }
        }
        panic!("the Redis Cluster did not come up; last log lines:\n{last_log}");
    }

    fn launch(&mut self) -> Result<(), String> {
        for index in 0..self.nodes.len() {
            self.spawn(index)?;
        }
        let addresses: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let log = self.dir.path().join("cluster-create.log");
        if self.shape.primaries >= 3 {
            let output = Command::new(&self.cli)
                .arg("--cluster")
                .arg("create")
                .args(&addresses)
                .arg("--cluster-replicas")
                .arg(self.shape.replicas.to_string())
                .arg("--cluster-yes")
                .output()
                .map_err(|error| format!("cannot run redis-cli --cluster create: {error}"))?;
            let _ = std::fs::write(&log, [&output.stdout[..], &output.stderr[..]].concat());
            if !output.status.success() {
                return Err(tail(&log));
            }
        } else {
            self.join_by_hand(&log)?;
        }
        if !self.wait_healthy(START_TIMEOUT) {
            return Err(format!(
                "the cluster never became ok:\n{}\n{}",
                tail(&log),
                self.nodes_view().map(|nodes| format!("{nodes:#?}")).unwrap_or_default()
            ));
        }
        Ok(())
    }

    /// One or two primaries, no replicas (`redis-cli --cluster create`
    /// refuses fewer than three): each takes an even share of the slots,
    /// then they meet.
    fn join_by_hand(&self, log: &Path) -> Result<(), String> {
        let primaries = self.nodes.len() as u32;
        let mut said = String::new();
        for (index, node) in self.nodes.iter().enumerate() {
            let low = 16384 * index as u32 / primaries;
            let high = 16384 * (index as u32 + 1) / primaries - 1;
            let (low, high) = (low.to_string(), high.to_string());
            let answer = call(
                address(node.port),
                &["CLUSTER", "ADDSLOTSRANGE", &low, &high],
                Duration::from_secs(1),
            );
            said.push_str(&format!("{}: ADDSLOTSRANGE {low} {high}: {answer:?}\n", node.port));
            if !answer.is_some_and(|answer| answer.starts_with("+OK")) {
                let _ = std::fs::write(log, &said);
                return Err(said);
            }
        }
        let first = self.nodes[0].port.to_string();
        for node in &self.nodes[1..] {
            let answer = call(
                address(node.port),
                &["CLUSTER", "MEET", "127.0.0.1", &first],
                Duration::from_secs(1),
            );
            said.push_str(&format!("{}: MEET {first}: {answer:?}\n", node.port));
        }
        let _ = std::fs::write(log, &said);
        Ok(())
    }

    /// Every node's process id, in start order (benches read their CPU time).
    pub fn pids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter_map(|node| node.process.as_ref().map(|process| process.child.id()))
            .collect()
    }

    fn spawn(&mut self, index: usize) -> Result<(), String> {
        let ClusterNode { port, bus_port, .. } = self.nodes[index];
        let data = self.dir.path().join(format!("node-{port}"));
        std::fs::create_dir_all(&data).map_err(|error| error.to_string())?;
        let log = self.dir.path().join(format!("node-{port}.log"));
        let mut server = Command::new(&self.binary);
        server
            .arg("--port")
            .arg(port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&data)
            .arg("--cluster-enabled")
            .arg("yes")
            .arg("--cluster-config-file")
            .arg(data.join("nodes.conf"))
            .arg("--cluster-port")
            .arg(bus_port.to_string())
            .arg("--cluster-node-timeout")
            .arg(NODE_TIMEOUT_MS.to_string())
            .arg("--cluster-require-full-coverage")
            .arg("no")
            // Replicas stay with the primary they were given: the tests name them.
            .arg("--cluster-allow-replica-migration")
            .arg("no")
            .arg("--save")
            .arg("");
        if self.shape.append_only {
            server
                .arg("--appendonly")
                .arg("yes")
                .arg("--appendfsync")
                .arg("everysec");
        }
        let mut guard = Guard::spawn(&mut server, &log).map_err(|error| error.to_string())?;
        let addr = address(port);
        let up = wait_until(START_TIMEOUT, || {
            guard.exited().is_some() || command(addr, "PING").is_some_and(|answer| answer.starts_with("+PONG"))
        });
        if guard.exited().is_some() || !up {
            return Err(tail(&log));
        }
        self.nodes[index].process = Some(guard);
        Ok(())
    }

    /// Every running node says `cluster_state:ok` with every slot served,
    /// agrees on which node serves each slot, and every running replica's
    /// link to its primary is up.
    fn healthy(&self) -> bool {
        let running: Vec<u16> = self.running_ports();
        let mut views = Vec::new();
        for &port in &running {
            let Some(info) = command(address(port), "CLUSTER INFO") else {
                return false;
            };
            if !(info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")) {
                return false;
            }
            let Some(nodes) = nodes_of(port) else { return false };
            let mut owners: Vec<(u16, Vec<(u16, u16)>)> = nodes
                .iter()
                .filter(|node| node.role == "master" && !node.slots.is_empty())
                .map(|node| (node.port, node.slots.clone()))
                .collect();
            owners.sort();
            views.push(owners);
            let Some(role) = command(address(port), "ROLE") else {
                return false;
            };
            if role.lines().nth(2).is_some_and(|word| word.trim() == "slave") && !role.contains("connected") {
                return false;
            }
        }
        views.windows(2).all(|pair| pair[0] == pair[1])
    }

    /// Waits until the cluster is healthy (see [`RedisCluster::start`]).
    pub fn wait_healthy(&self, timeout: Duration) -> bool {
        wait_until(timeout, || self.healthy())
    }

    /// `redis+cluster://127.0.0.1:P1,…` naming every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Every node's port, in start order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|node| node.port).collect()
    }

    fn running_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|node| node.process.is_some())
            .map(|node| node.port)
            .collect()
    }

    /// `CLUSTER NODES` as the first running node that answers sees it.
    pub fn nodes_view(&self) -> Option<Vec<NodeView>> {
        self.running_ports().into_iter().find_map(nodes_of)
    }

    /// The ports of the primaries serving slots now.
    pub fn primaries(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .nodes_view()
            .unwrap_or_default()
            .into_iter()
            .filter(|node| node.role == "master" && !node.failing && !node.slots.is_empty())
            .map(|node| node.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The port of the primary serving `slot`, as the cluster says now.
    pub fn owner_of(&self, slot: u16) -> Option<u16> {
        self.nodes_view()?
            .into_iter()
            .find(|node| node.role == "master" && node.slots.iter().any(|(low, high)| (*low..=*high).contains(&slot)))
            .map(|node| node.port)
    }

    /// The replica of the primary on `primary`.
    pub fn replica_of(&self, primary: u16) -> Option<u16> {
        let nodes = self.nodes_view()?;
        let id = nodes.iter().find(|node| node.port == primary)?.id.clone();
        nodes
            .into_iter()
            .find(|node| node.primary_id.as_deref() == Some(id.as_str()))
            .map(|node| node.port)
    }

    /// Kills the node on `port` (SIGKILL), keeping its directory for
    /// [`RedisCluster::restart`].
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|node| node.port == port) {
            if let Some(mut process) = node.process.take() {
                process.kill();
            }
        }
    }

    /// Kills the primary serving `slot` and waits (at most 30 s) until its
    /// replica has taken over the slot and every running node agrees; returns
    /// (the killed port, the promoted port).
    pub fn kill_primary_of(&mut self, slot: u16) -> (u16, u16) {
        let Some(primary) = self.owner_of(slot) else {
            panic!("no primary serves slot {slot}");
        };
        let replica = self.replica_of(primary);
        self.kill(primary);
        let promoted = wait_until(Duration::from_secs(30), || {
            self.owner_of(slot).is_some_and(|owner| owner != primary) && self.healthy()
        });
        let Some(owner) = self.owner_of(slot).filter(|_| promoted) else {
            panic!(
                "no replica took over slot {slot} within 30 s of killing {primary}:\n{:#?}",
                self.nodes_view()
            );
        };
        if let Some(replica) = replica {
            assert_eq!(owner, replica, "the killed primary's own replica took over");
        }
        (primary, owner)
    }

    /// Starts the node on `port` again (its `nodes.conf` kept: it rejoins,
    /// as a replica if its slots moved meanwhile) and waits until the
    /// cluster is healthy.
    pub fn restart(&mut self, port: u16) {
        let Some(index) = self.nodes.iter().position(|node| node.port == port) else {
            panic!("no cluster node on port {port}");
        };
        self.kill(port);
        if let Err(log) = self.spawn(index) {
            panic!("redis-server {port} did not come back; last log lines:\n{log}");
        }
        if !self.wait_healthy(Duration::from_secs(30)) {
            panic!("the cluster was not healthy within 30 s of restarting {port}");
        }
    }

    /// Moves `slot` to the primary on `to`, keys and all, the way
    /// `redis-cli --cluster reshard` does: `CLUSTER SETSLOT … IMPORTING` on
    /// the target, `MIGRATING` on the source, `MIGRATE` of the keys `batch`
    /// at a time (clients meanwhile get `ASK` for the keys already moved),
    /// then `SETSLOT … NODE` on every primary (clients then get `MOVED`).
    /// Blocking: run it on a thread of its own beside the load. Returns how
    /// many keys moved.
    pub fn migrate_slot(&self, slot: u16, to: u16, batch: usize) -> usize {
        let Some(from) = self.owner_of(slot) else {
            panic!("no primary serves slot {slot}");
        };
        if from == to {
            return 0;
        }
        let id = |port: u16| {
            call(address(port), &["CLUSTER", "MYID"], Duration::from_secs(2))
                .and_then(|answer| answer.lines().nth(1).map(str::to_string))
                .unwrap_or_else(|| panic!("node {port} did not say its id"))
        };
        let (from_id, to_id) = (id(from), id(to));
        let slot_text = slot.to_string();
        let ok = |port: u16, args: &[&str]| {
            let answer = call(address(port), args, Duration::from_secs(10));
            if !answer.as_deref().is_some_and(|answer| answer.starts_with("+OK")) {
                panic!("{args:?} on {port} answered {answer:?}");
            }
        };
        ok(to, &["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &from_id]);
        ok(from, &["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &to_id]);
        let count = batch.max(1).to_string();
        let to_port = to.to_string();
        let mut moved = 0;
        loop {
            let keys = call(
                address(from),
                &["CLUSTER", "GETKEYSINSLOT", &slot_text, &count],
                Duration::from_secs(10),
            )
            .map(|answer| bulk_strings(&answer))
            .unwrap_or_else(|| panic!("node {from} did not list the keys of slot {slot}"));
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "10000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            // NOKEY: every key of the batch expired on the way; nothing to move.
            let answer = call(address(from), &args, Duration::from_secs(10));
            if !answer
                .as_deref()
                .is_some_and(|answer| answer.starts_with("+OK") || answer.starts_with("+NOKEY"))
            {
                panic!("MIGRATE of {} keys of slot {slot} answered {answer:?}", keys.len());
            }
            moved += keys.len();
        }
        // The target first, then the source (so nobody sends a client back and
        // forth), then every other primary; gossip tells the replicas.
        let mut owners = vec![to, from];
        owners.extend(self.primaries().into_iter().filter(|port| *port != to && *port != from));
        for port in owners {
            ok(port, &["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id]);
        }
        if !wait_until(Duration::from_secs(30), || {
            self.owner_of(slot) == Some(to) && self.healthy()
        }) {
            panic!("slot {slot} did not settle on {to} within 30 s");
        }
        moved
    }

    /// The number of keys in `slot` on the primary serving it.
    pub fn keys_in_slot(&self, slot: u16) -> usize {
        let Some(owner) = self.owner_of(slot) else { return 0 };
        call(
            address(owner),
            &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()],
            Duration::from_secs(2),
        )
        .and_then(|answer| answer.trim().strip_prefix(':').and_then(|count| count.parse().ok()))
        .unwrap_or(0)
    }

    /// The directory holding the nodes' logs and data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut process) = node.process.take() {
                process.kill();
            }
        }
    }
}

fn address(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// `CLUSTER NODES` of the node on `port`, parsed.
fn nodes_of(port: u16) -> Option<Vec<NodeView>> {
    let answer = call(address(port), &["CLUSTER", "NODES"], Duration::from_secs(1))?;
    // A bulk string: `$LEN`, then one line per node.
    let nodes = answer
        .lines()
        .skip(1)
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let (id, address, flags, primary) = (words.first()?, words.get(1)?, words.get(2)?, words.get(3)?);
            let port = address.split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let role = if flags.contains("master") { "master" } else { "slave" };
            let slots = words
                .iter()
                .skip(8)
                .filter(|word| !word.starts_with('['))
                .filter_map(|range| match range.split_once('-') {
                    Some((low, high)) => Some((low.parse().ok()?, high.parse().ok()?)),
                    None => range.parse().ok().map(|slot| (slot, slot)),
                })
                .collect();
            Some(NodeView {
                id: id.to_string(),
                port,
                role: role.to_string(),
                primary_id: (*primary != "-").then(|| primary.to_string()),
                failing: flags.contains("fail"),
                slots,
            })
        })
        .collect();
    Some(nodes)
}

/// The bulk strings of a flat RESP array (keys without CR or LF).
fn bulk_strings(answer: &str) -> Vec<String> {
    let mut lines = answer.lines();
    let mut out = Vec::new();
    while let Some(line) = lines.next() {
        if line.starts_with('$') {
            if let Some(value) = lines.next() {
                out.push(value.to_string());
            }
        }
    }
    out
}
