//! Chaos run (issue 23, point 7): real processes under steady load, one fault
//! at a time, and one table of what each fault cost.
//!
//! ```sh
//! scripts/chaos.sh            # every fault (about 4 minutes)
//! scripts/chaos.sh --smoke    # five faults, short phases (CI, scripts/test.sh)
//! ```
//!
//! The stack is what a production deployment runs, each part its own process
//! on loopback: a 3-member etcd cluster, a Redis primary with a replica and
//! three Sentinels (AOF `everysec`), two registries on the etcd cluster, two
//! routers (both registries, the slow path on Sentinel with `WAIT 1` and a
//! local task buffer, a shared assertion key; for the two Redis Cluster faults
//! a second stack whose routers use a three-shard Redis Cluster) and SDK agents (this binary's
//! `agent` subcommand, verifying the routers' assertions). For agent-partition
//! one agent runs in a network namespace the run creates, the registries and
//! routers listen on its veth's host address, and the partition sets the
//! namespace's link down (without root or `ip`: the agent is frozen with
//! SIGSTOP instead; the table's note says which). The driver sends
//! synchronous calls and task submissions at a steady rate, spread over both
//! routers (a connection refused moves to the other router, as a load
//! balancer would; a call already sent is never resent), injects one fault,
//! repairs it, and then waits, with a bound, until every accepted task is
//! finished. Per fault it counts calls sent, answered and failed (by code),
//! tasks accepted and rejected (by code), tasks **lost** (accepted, and not
//! finished, or unknown under the id the router gave, when the bound ran
//! out), tasks executed more than once, and the recovery time (from the
//! fault to the last failed call or refused submission). It exits non-zero
//! when anything was lost. docs/chaos.md holds a run and what each column means.

/// mimalloc, as in the `agent-reach` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_reach_sdk::{Agent, Ctx, Handler, HandlerError};
use agent_reach_testkit::{free_port, http_ok, wait_until, EtcdCluster, RedisCluster, RedisSentinels};
use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use futures::StreamExt;
use serde_json::{json, Value};

const SECRET: &str = "chaos-run-secret-chaos-run-secret-0123456789";
const CALLER: &str = "chaos";
const AGENT_NAME: &str = "chaos_agent";
const CAPABILITY: &str = "chaos.work";
const ACL: &str = "version: 1\npermissions:\n  - caller: chaos\n    allow: [chaos.*]\nproviders:\n  - agent: chaos_agent\n    provides: [chaos.*]\n";
/// The agents' lease TTL: short, so a frozen agent's lease runs out within the fault.
const AGENT_TTL_S: u32 = 3;
/// The agent agent-partition cuts off (the one in the namespace); agent-kill takes agent 0.
const PARTITIONED: usize = 1;
/// How long a part may take to come back (start, rejoin, fail over).
const RECOVERY_BOUND: Duration = Duration::from_secs(60);
/// How long accepted tasks may take to finish once the load has stopped.
const SETTLE_BOUND: Duration = Duration::from_secs(180);

#[derive(Debug, Parser)]
#[command(about = "Chaos run: real processes under steady load, one fault at a time; prints what each cost.")]
#[command(args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Internal>,
    /// Five faults (agent, registry, etcd leader, Redis primary, Redis outage) with short phases: the CI smoke.
    #[arg(long)]
    smoke: bool,
    /// Only these faults (comma separated names from the table), in this order.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Synchronous calls per second (spread over both routers).
    #[arg(long, default_value_t = 100)]
    call_rate: u32,
    /// Task submissions per second (spread over both routers).
    #[arg(long, default_value_t = 40)]
    task_rate: u32,
    /// Agent processes.
    #[arg(long, default_value_t = 4)]
    agents: usize,
    /// Seconds of steady load before the fault and again after its repair (smoke: 2).
    #[arg(long)]
    steady_s: Option<u64>,
    /// Tasks submitted to one router just before it is killed.
    #[arg(long, default_value_t = 1000)]
    router_burst: usize,
    /// Where the processes' logs go (default: a temporary directory, removed at the end).
    #[arg(long)]
    logs: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Internal {
    /// (internal) One SDK agent process, started by the driver.
    #[command(hide = true)]
    Agent(AgentArgs),
}

#[derive(Debug, clap::Args)]
struct AgentArgs {
    #[arg(long)]
    id: String,
    /// Registry URLs, comma separated.
    #[arg(long)]
    registry: String,
    /// The routers' JWKS file (their shared assertion key).
    #[arg(long)]
    keys: PathBuf,
    /// Appends one line per task execution (the task id): duplicates are counted from it.
    #[arg(long)]
    executions: PathBuf,
    /// Where the agent listens (the routers call the bound address).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

// === Faults ===

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    AgentKill,
    AgentPartition,
    RouterKill,
    RegistryKill,
    EtcdFollower,
    EtcdLeader,
    RedisPrimary,
    RedisReplica,
    RedisOutage,
    ClusterPrimaryKill,
    ClusterReshard,
}

impl Fault {
    const ALL: [Fault; 11] = [
        Fault::AgentKill,
        Fault::AgentPartition,
        Fault::RouterKill,
        Fault::RegistryKill,
        Fault::EtcdFollower,
        Fault::EtcdLeader,
        Fault::RedisPrimary,
        Fault::RedisReplica,
        Fault::RedisOutage,
        Fault::ClusterPrimaryKill,
        Fault::ClusterReshard,
    ];
    const SMOKE: [Fault; 5] = [
        Fault::AgentKill,
        Fault::RegistryKill,
        Fault::EtcdLeader,
        Fault::RedisPrimary,
        Fault::RedisOutage,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::AgentKill => "agent-kill",
            Fault::AgentPartition => "agent-partition",
            Fault::RouterKill => "router-kill",
            Fault::RegistryKill => "registry-kill",
            Fault::EtcdFollower => "etcd-follower",
            Fault::EtcdLeader => "etcd-leader",
            Fault::RedisPrimary => "redis-primary",
            Fault::RedisReplica => "redis-replica",
            Fault::RedisOutage => "redis-outage",
            Fault::ClusterPrimaryKill => "cluster-primary-kill",
            Fault::ClusterReshard => "cluster-reshard",
        }
    }

    /// What the fault does; `partition` says how agent-partition cuts the agent off.
    fn describe(self, burst: usize, partition: &str) -> String {
        match self {
            Fault::AgentKill => "kill -9 of one agent, restarted after 2 s".to_string(),
            Fault::AgentPartition => format!("one agent cut off 8 s, {partition}; its lease expires"),
            Fault::RouterKill => {
                format!("kill -9 of one router right after {burst} task submissions, restarted after 2 s")
            }
            Fault::RegistryKill => "kill -9 of one of two registries, restarted after 5 s".to_string(),
            Fault::EtcdFollower => "kill -9 of an etcd follower, restarted after 5 s".to_string(),
            Fault::EtcdLeader => "kill -9 of the etcd leader, restarted after 5 s".to_string(),
            Fault::RedisPrimary => {
                "kill -9 of the Redis primary, Sentinel failover, old primary back as replica".to_string()
            }
            Fault::RedisReplica => "kill -9 of the Redis replica (WAIT 1 falls short), restarted after 5 s".to_string(),
            Fault::RedisOutage => "Redis unreachable 10 s (primary and replica frozen)".to_string(),
            Fault::ClusterPrimaryKill => {
                "Redis Cluster: kill -9 of the primary serving the load's task lane, its replica promoted, restarted after 5 s"
                    .to_string()
            }
            Fault::ClusterReshard => {
                "Redis Cluster: the load's task lane (its slot) moved to another primary under load, 10 keys per MIGRATE"
                    .to_string()
            }
        }
    }

    /// Whether the fault needs the task store on a Redis Cluster (the run
    /// then starts a second stack whose routers use one).
    fn on_cluster(self) -> bool {
        matches!(self, Fault::ClusterPrimaryKill | Fault::ClusterReshard)
    }

    fn parse(name: &str) -> anyhow::Result<Self> {
        Self::ALL
            .into_iter()
            .find(|fault| fault.name() == name)
            .with_context(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|fault| fault.name()).collect();
                format!("unknown fault `{name}`; the faults are {}", names.join(", "))
            })
    }
}

// === Processes ===

/// One child process of the run, killable (SIGKILL), freezable (SIGSTOP) and
/// startable again with the same arguments (so on the same port and data).
struct Process {
    what: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Process {
    fn new(what: &str, program: &Path, args: Vec<String>, env: Vec<(String, String)>, log: PathBuf) -> Self {
        Self {
            what: what.to_string(),
            program: program.to_path_buf(),
            args,
            env,
            log,
            child: None,
        }
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open {}", self.log.display()))?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {} ({})", self.what, self.program.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Starts the process and polls `ready` (bounded); the log's tail when it fails.
    fn start(&mut self, ready: impl FnMut() -> bool) -> anyhow::Result<()> {
        self.spawn()?;
        self.wait_ready(ready)
    }

    fn wait_ready(&mut self, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
        let mut exited = false;
        let ok = wait_until(RECOVERY_BOUND, || {
            exited = self
                .child
                .as_mut()
                .is_none_or(|child| child.try_wait().ok().flatten().is_some());
            exited || ready()
        });
        if exited || !ok {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            bail!(
                "{} did not become ready ({}); last log lines:\n{}",
                self.what,
                if exited { "it exited" } else { "bound passed" },
                lines[lines.len().saturating_sub(20)..].join("\n")
            );
        }
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn signal(&self, signal: libc::c_int) -> anyhow::Result<()> {
        let child = self
            .child
            .as_ref()
            .with_context(|| format!("{} is not running", self.what))?;
        let pid = libc::pid_t::try_from(child.id()).context("pid out of range")?;
        // SAFETY: kill(2) with the pid of a child this process spawned and has not reaped.
        if unsafe { libc::kill(pid, signal) } != 0 {
            bail!("cannot signal {}: {}", self.what, std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // SIGKILL ends a stopped (frozen) process too.
        self.kill();
    }
}

/// A registry or router: `agent-reach SERVICE --listen ADDR ...`, ready on `/readyz`.
struct Service {
    addr: SocketAddr,
    process: Process,
}

impl Service {
    fn start(
        binary: &Path,
        ip: std::net::Ipv4Addr,
        kind: &str,
        index: usize,
        args: Vec<String>,
        logs: &Path,
    ) -> anyhow::Result<Self> {
        let addr = SocketAddr::from((ip, free_port()));
        let mut argv = vec![
            "--log-format".to_string(),
            "json".to_string(),
            kind.to_string(),
            "--listen".to_string(),
            addr.to_string(),
        ];
        argv.extend(args);
        let log = logs.join(format!("{kind}-{index}.log"));
        let mut process = Process::new(&format!("{kind} {index}"), binary, argv, Vec::new(), log);
        process.start(|| http_ok(addr, "/readyz"))?;
        Ok(Self { addr, process })
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn restart(&mut self) -> anyhow::Result<()> {
        self.process.kill();
        let addr = self.addr;
        self.process.start(|| http_ok(addr, "/readyz"))
    }
}

// === The partitioned agent's network ===

/// A network namespace this run creates for one agent, reachable only through
/// a veth pair: `10.213.A.B+1/30` on the host end (where the registries and
/// routers listen), `+2` inside (where the agent listens). The partition sets
/// the namespace's end down: the host end loses its carrier and, its neighbour
/// entry for the agent being permanent (no ARP to fail, so no "no route to
/// host"), drops the packets silently; the agent's end has no route out. The
/// heal sets it up again. Removed on drop; a crashed run's leftovers (same
/// prefix, pid no longer a chaos run) are removed when the next run starts.
struct Netns {
    name: String,
    host_if: String,
    agent_if: String,
    host_ip: std::net::Ipv4Addr,
    agent_ip: std::net::Ipv4Addr,
}

/// Every namespace of the run is `agent-reach-chaos-PID`; its host-side veth `archPIDh`.
const NETNS_PREFIX: &str = "agent-reach-chaos-";

/// Runs `ip ARGS`; its stderr in the error.
fn ip(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run `ip {}` (is iproute2 installed?)", args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The host-side veth name of the run with this pid (at most 15 bytes: IFNAMSIZ).
fn host_if(pid: u32) -> String {
    format!("arch{pid}h")
}

/// The host end's and the agent's address: a /30 per pid (16,384 of them in
/// 10.213.0.0/16), so concurrent runs do not collide.
fn veth_addresses(pid: u32) -> (std::net::Ipv4Addr, std::net::Ipv4Addr) {
    let slot = pid % 16_384;
    // Both below 256: slot / 64 < 256, (slot % 64) * 4 + 2 < 256.
    let (third, fourth) = ((slot / 64) as u8, ((slot % 64) * 4) as u8);
    (
        std::net::Ipv4Addr::new(10, 213, third, fourth + 1),
        std::net::Ipv4Addr::new(10, 213, third, fourth + 2),
    )
}

impl Netns {
    /// Creates the namespace and the veth pair, or says why it cannot.
    fn create() -> anyhow::Result<Self> {
        Self::remove_leftovers();
        let pid = std::process::id();
        let (host_ip, agent_ip) = veth_addresses(pid);
        let netns = Self {
            name: format!("{NETNS_PREFIX}{pid}"),
            host_if: host_if(pid),
            agent_if: format!("arch{pid}a"),
            host_ip,
            agent_ip,
        };
        // From here on, drop removes whatever part was made.
        ip(&["netns", "add", &netns.name])?;
        let (name, host, agent) = (netns.name.as_str(), netns.host_if.as_str(), netns.agent_if.as_str());
        ip(&["link", "add", host, "type", "veth", "peer", "name", agent])?;
        ip(&["link", "set", agent, "netns", name])?;
        ip(&["addr", "add", &format!("{}/30", netns.host_ip), "dev", host])?;
        ip(&["link", "set", host, "up"])?;
        ip(&[
            "netns",
            "exec",
            name,
            "ip",
            "addr",
            "add",
            &format!("{}/30", netns.agent_ip),
            "dev",
            agent,
        ])?;
        ip(&["netns", "exec", name, "ip", "link", "set", agent, "up"])?;
        ip(&["netns", "exec", name, "ip", "link", "set", "lo", "up"])?;
        let mac = ip(&["netns", "exec", name, "cat", &format!("/sys/class/net/{agent}/address")])?;
        ip(&[
            "neigh",
            "replace",
            &netns.agent_ip.to_string(),
            "lladdr",
            mac.trim(),
            "dev",
            host,
            "nud",
            "permanent",
        ])?;
        Ok(netns)
    }

    /// Removes the namespaces and veths of earlier runs whose process is gone
    /// (a run killed before its drop), and the processes still inside them.
    fn remove_leftovers() {
        let Ok(list) = ip(&["netns", "list"]) else {
            return;
        };
        for line in list.lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            let Some(Ok(pid)) = name.strip_prefix(NETNS_PREFIX).map(str::parse::<u32>) else {
                continue;
            };
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            // A run in progress (not this one: a crashed run's pid may be ours now).
            if pid != std::process::id() && comm.trim() == "chaos" {
                continue;
            }
            eprintln!("chaos: removing the leftover network namespace {name} of a run that did not finish");
            if let Ok(pids) = ip(&["netns", "pids", name]) {
                for inside in pids.lines().filter_map(|line| line.trim().parse::<libc::pid_t>().ok()) {
                    // SAFETY: kill(2) of a process inside the leftover namespace (an agent of that run).
                    unsafe { libc::kill(inside, libc::SIGKILL) };
                }
            }
            let _ = ip(&["link", "del", &host_if(pid)]);
            let _ = ip(&["netns", "del", name]);
        }
    }

    /// Cuts the agent off (`false`) or heals the link (`true`).
    fn link(&self, up: bool) -> anyhow::Result<()> {
        let state = if up { "up" } else { "down" };
        ip(&[
            "netns",
            "exec",
            &self.name,
            "ip",
            "link",
            "set",
            "dev",
            &self.agent_if,
            state,
        ])
        .map(drop)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting one end deletes the pair, even while a process is still inside.
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

// === The stack ===

/// The routers' task store: a primary with a replica behind Sentinels, or a
/// Redis Cluster (three primaries, a replica each) for the cluster faults.
enum TaskRedis {
    Sentinel(RedisSentinels),
    Cluster(RedisCluster),
}

impl TaskRedis {
    fn url(&self) -> String {
        match self {
            TaskRedis::Sentinel(redis) => redis.url(),
            TaskRedis::Cluster(cluster) => cluster.url(),
        }
    }

    fn sentinels(&mut self) -> anyhow::Result<&mut RedisSentinels> {
        match self {
            TaskRedis::Sentinel(redis) => Ok(redis),
            TaskRedis::Cluster(_) => bail!("this fault needs the Sentinel stack, and this one runs a Redis Cluster"),
        }
    }

    fn cluster(&mut self) -> anyhow::Result<&mut RedisCluster> {
        match self {
            TaskRedis::Cluster(cluster) => Ok(cluster),
            TaskRedis::Sentinel(_) => bail!("this fault needs the Redis Cluster stack, and this one runs Sentinels"),
        }
    }
}

/// The slot of the load's task lane (every task of a capability is in one
/// lane: its queues, its tasks' hashes), read from a task the routers
/// accepted: the cluster faults' target, so they hit the load's keys.
fn load_slot(load: &Load) -> anyhow::Result<u16> {
    let accepted = load
        .tally
        .accepted
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let task_id = accepted
        .last()
        .context("no task accepted yet: the load has no lane to aim at")?;
    let lane = agent_reach_task_store::store::lane_of(task_id);
    Ok(agent_reach_stores::slot::key_slot(
        agent_reach_stores::slot::spread_tag("q", lane, agent_reach_task_store::store::LANES).as_bytes(),
    ))
}

struct Stack {
    logs: PathBuf,
    etcd: EtcdCluster,
    redis: TaskRedis,
    registries: Vec<Service>,
    routers: Vec<Service>,
    agents: Vec<Process>,
    executions: Vec<PathBuf>,
    /// Registry URLs, comma separated, as routers and agents take them.
    registry_urls: String,
    http: reqwest::Client,
    caller_token: Arc<String>,
    /// The partitioned agent's namespace (last: removed after the processes are
    /// gone), or why there is none and agent-partition freezes the agent instead.
    netns: Result<Netns, String>,
}

fn token(name: &str) -> anyhow::Result<String> {
    agent_reach_access::token::issue_hs256(name, SECRET.as_bytes(), Duration::from_secs(6 * 3600))
        .map_err(anyhow::Error::msg)
}

impl Stack {
    async fn start(args: &Args, logs: &Path, netns: Result<Netns, String>, cluster: bool) -> anyhow::Result<Self> {
        // With a namespace, the registries and routers listen on its veth's host
        // address (reachable from the host and from inside), etcd and Redis on loopback.
        let service_ip = netns
            .as_ref()
            .map_or(std::net::Ipv4Addr::LOCALHOST, |netns| netns.host_ip);
        let binary = std::env::current_exe()?
            .parent()
            .context("the chaos binary has no directory")?
            .join("agent-reach");
        if !binary.is_file() {
            bail!(
                "{} is missing: build it beside this binary (scripts/chaos.sh does: cargo build -p agent-reach-cli)",
                binary.display()
            );
        }
        let files = |name: &str, text: &str| -> anyhow::Result<String> {
            let path = logs.join(name);
            std::fs::write(&path, text)?;
            Ok(path.display().to_string())
        };
        let secret = files("hs256.secret", SECRET)?;
        let callback_secret = files("callback.secret", SECRET)?;
        let acl = files("acl.yaml", ACL)?;
        // One assertion key for both routers (and the JWKS file the agents verify with), as
        // a deployment shares it: a restarted router signs with the key the agents know.
        let key = logs.join("assertion.pem");
        // `keys generate` never overwrites a key; a reused --logs directory gets a fresh one.
        let _ = std::fs::remove_file(&key);
        let generated = Command::new(&binary)
            .args(["keys", "generate", "--out"])
            .arg(&key)
            .output()?;
        if !generated.status.success() {
            bail!("keys generate: {}", String::from_utf8_lossy(&generated.stderr));
        }
        let jwks = Command::new(&binary).args(["keys", "jwks"]).arg(&key).output()?;
        if !jwks.status.success() {
            bail!("keys jwks: {}", String::from_utf8_lossy(&jwks.stderr));
        }
        let keys = logs.join("jwks.json");
        std::fs::write(&keys, &jwks.stdout)?;

        let etcd = tokio::task::spawn_blocking(EtcdCluster::start).await?;
        let redis = if cluster {
            TaskRedis::Cluster(tokio::task::spawn_blocking(RedisCluster::start).await?)
        } else {
            TaskRedis::Sentinel(tokio::task::spawn_blocking(RedisSentinels::start).await?)
        };
        let auth = vec!["--acl".to_string(), acl, "--auth-hs256-secret-file".to_string(), secret];
        let mut registries = Vec::new();
        for index in 0..2 {
            let mut registry_args = vec![
                "--etcd".to_string(),
                etcd.endpoints().join(","),
                "--min-ttl-s".to_string(),
                "2".to_string(),
            ];
            registry_args.extend(auth.clone());
            registries.push(Service::start(
                &binary,
                service_ip,
                "registry",
                index,
                registry_args,
                logs,
            )?);
        }
        let registry_urls = registries.iter().map(Service::url).collect::<Vec<_>>().join(",");
        let mut routers = Vec::new();
        for index in 0..2 {
            let buffer = logs.join(format!("task-buffer-{index}"));
            std::fs::create_dir_all(&buffer)?;
            let mut router_args: Vec<String> = [
                "--registry",
                &registry_urls,
                "--redis",
                &redis.url(),
                "--redis-wait-replicas",
                "1",
                "--callback-secret-file",
                &callback_secret,
                "--assertion-key",
                &key.display().to_string(),
                "--task-buffer-dir",
                &buffer.display().to_string(),
                // A killed router's deliveries are taken over after this long.
                "--task-reclaim-after-s",
                "3",
                "--task-workers",
                "64",
            ]
            .map(str::to_string)
            .to_vec();
            router_args.extend(auth.clone());
            routers.push(Service::start(&binary, service_ip, "router", index, router_args, logs)?);
        }
        let me = std::env::current_exe()?;
        let mut stack = Self {
            logs: logs.to_path_buf(),
            etcd,
            redis,
            registries,
            routers,
            agents: Vec::new(),
            executions: Vec::new(),
            registry_urls,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .timeout(Duration::from_secs(30))
                .build()?,
            caller_token: Arc::new(token(CALLER)?),
            netns,
        };
        for index in 0..args.agents {
            let id = format!("agent-{index}");
            let executions = logs.join(format!("{id}.executions"));
            let mut argv = vec![
                "agent".to_string(),
                "--id".to_string(),
                id.clone(),
                "--registry".to_string(),
                stack.registry_urls.clone(),
                "--keys".to_string(),
                keys.display().to_string(),
                "--executions".to_string(),
                executions.display().to_string(),
            ];
            let env = vec![
                ("AGENT_REACH_TOKEN".to_string(), token(AGENT_NAME)?),
                ("RUST_LOG".to_string(), "warn".to_string()),
            ];
            let program = match &stack.netns {
                Ok(netns) if index == PARTITIONED => {
                    argv.extend(["--listen".to_string(), format!("{}:0", netns.agent_ip)]);
                    // `ip netns exec` execs the agent: the child's pid is the agent's.
                    let inside = ["netns", "exec", netns.name.as_str()].map(str::to_string);
                    argv.splice(0..0, inside.into_iter().chain([me.display().to_string()]));
                    PathBuf::from("ip")
                }
                _ => me.clone(),
            };
            let process = Process::new(&id, &program, argv, env, logs.join(format!("{id}.log")));
            stack.agents.push(process);
            stack.executions.push(executions);
            stack.start_agent(index).await?;
        }
        Ok(stack)
    }

    /// Starts agent `index` and waits until both routers route to it.
    async fn start_agent(&mut self, index: usize) -> anyhow::Result<()> {
        self.agents[index].spawn()?;
        self.wait_routable(index).await
    }

    /// Waits (bounded) until a live registry resolves agent `index`: the routers'
    /// snapshots follow the registry's Watch stream within milliseconds.
    async fn wait_routable(&mut self, index: usize) -> anyhow::Result<()> {
        let id = format!("agent-{index}");
        let deadline = Instant::now() + RECOVERY_BOUND;
        loop {
            for registry in &self.registries {
                let answer = self
                    .http
                    .get(format!("{}/v1/capabilities/{CAPABILITY}", registry.url()))
                    .bearer_auth(self.caller_token.as_str())
                    .send()
                    .await;
                if let Ok(answer) = answer {
                    if let Ok(body) = answer.json::<Value>().await {
                        let found = body["instances"].as_array().is_some_and(|instances| {
                            instances.iter().any(|instance| instance["agent_id"] == id.as_str())
                        });
                        if found {
                            return Ok(());
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "{id} was not routable within {RECOVERY_BOUND:?}; see {}",
                    self.logs.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How agent-partition cuts its agent off, for the table's note.
    fn partition_method(&self) -> String {
        match &self.netns {
            Ok(netns) => format!(
                "its network namespace's veth end down (agent at {} in namespace {}: packets dropped \
                 silently both ways)",
                netns.agent_ip, netns.name
            ),
            Err(why) => format!("frozen with SIGSTOP since network namespaces are unavailable ({why})"),
        }
    }

    fn router_urls(&self) -> Arc<Vec<String>> {
        Arc::new(self.routers.iter().map(Service::url).collect())
    }

    /// Task ids executed more than once among `ids`, read from every agent's log.
    fn duplicated(&self, ids: &[String]) -> usize {
        let mut counts: HashMap<String, u32> = HashMap::new();
        for path in &self.executions {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            for line in text.lines() {
                *counts.entry(line.to_string()).or_default() += 1;
            }
        }
        ids.iter()
            .filter(|id| counts.get(*id).is_some_and(|count| *count > 1))
            .count()
    }
}

// === Load ===

/// What one fault's phase counted.
#[derive(Default)]
struct Tally {
    calls_sent: AtomicU64,
    calls_answered: AtomicU64,
    /// Calls with no answer at all (the client's own 30 s bound ran out).
    calls_unanswered: AtomicU64,
    calls_failed: Mutex<BTreeMap<String, u64>>,
    tasks_sent: AtomicU64,
    tasks_rejected: Mutex<BTreeMap<String, u64>>,
    /// Task ids the routers answered 202 (or 200, same request id) with.
    accepted: Mutex<Vec<String>>,
    /// The request id each accepted task was submitted with.
    request_ids: Mutex<HashMap<String, String>>,
    last_failure: Mutex<Option<Instant>>,
}

impl Tally {
    fn failed(map: &Mutex<BTreeMap<String, u64>>, code: String, last: &Mutex<Option<Instant>>) {
        *map.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(code)
            .or_default() += 1;
        *last.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Instant::now());
    }
}

#[derive(Clone)]
struct Load {
    http: reqwest::Client,
    routers: Arc<Vec<String>>,
    token: Arc<String>,
    tally: Arc<Tally>,
}

enum Sent {
    Answer(reqwest::StatusCode, Value),
    /// No answer: the code the table shows (`TRANSPORT`, `CLIENT_TIMEOUT`, `NO_ROUTER`).
    Broken(&'static str),
}

impl Load {
    /// POSTs to router `first` or, when its port refuses the connection (nothing
    /// was sent), to the next one; never resends a request that left.
    async fn post(&self, first: usize, path: &str, body: &Value) -> Sent {
        for step in 0..self.routers.len() {
            let url = &self.routers[(first + step) % self.routers.len()];
            match self
                .http
                .post(format!("{url}{path}"))
                .bearer_auth(self.token.as_str())
                .json(body)
                .send()
                .await
            {
                Ok(answer) => {
                    let status = answer.status();
                    let body = answer.json::<Value>().await.unwrap_or(Value::Null);
                    return Sent::Answer(status, body);
                }
                Err(error) if error.is_connect() => continue,
                Err(error) if error.is_timeout() => return Sent::Broken("CLIENT_TIMEOUT"),
                Err(_) => return Sent::Broken("TRANSPORT"),
            }
        }
        Sent::Broken("NO_ROUTER")
    }

    async fn call(self, n: u64) {
        let tally = &self.tally;
        tally.calls_sent.fetch_add(1, Ordering::Relaxed);
        let body = json!({"capability": CAPABILITY, "timeout_ms": 5000, "payload": {"n": n, "delay_ms": 2}});
        match self.post(n as usize, "/v1/invoke", &body).await {
            Sent::Answer(status, _) if status.is_success() => {
                tally.calls_answered.fetch_add(1, Ordering::Relaxed);
            }
            Sent::Answer(status, body) => {
                Tally::failed(&tally.calls_failed, code_of(status, &body), &tally.last_failure)
            }
            Sent::Broken("CLIENT_TIMEOUT") => {
                tally.calls_unanswered.fetch_add(1, Ordering::Relaxed);
                Tally::failed(&tally.calls_failed, "CLIENT_TIMEOUT".to_string(), &tally.last_failure);
            }
            Sent::Broken(code) => Tally::failed(&tally.calls_failed, code.to_string(), &tally.last_failure),
        }
    }

    async fn submit(self, router: usize, request_id: String) {
        let tally = &self.tally;
        tally.tasks_sent.fetch_add(1, Ordering::Relaxed);
        let body = json!({"capability": CAPABILITY, "request_id": &request_id, "payload": {"delay_ms": 20}});
        match self.post(router, "/v1/tasks", &body).await {
            Sent::Answer(status, body) if status.is_success() => match body["task_id"].as_str() {
                Some(task_id) => {
                    tally
                        .accepted
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .push(task_id.to_string());
                    tally
                        .request_ids
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .insert(task_id.to_string(), request_id);
                }
                None => Tally::failed(&tally.tasks_rejected, "NO_TASK_ID".to_string(), &tally.last_failure),
            },
            Sent::Answer(status, body) => {
                Tally::failed(&tally.tasks_rejected, code_of(status, &body), &tally.last_failure)
            }
            Sent::Broken(code) => Tally::failed(&tally.tasks_rejected, code.to_string(), &tally.last_failure),
        }
    }
}

fn code_of(status: reqwest::StatusCode, body: &Value) -> String {
    body["error"]["code"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("HTTP_{}", status.as_u16()))
}

/// Paces calls and submissions at their rates until `stop`; returns every spawned request.
async fn steady_load(
    load: Load,
    call_rate: u32,
    task_rate: u32,
    phase: &'static str,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut handles = Vec::new();
    let mut calls = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(call_rate.max(1))));
    let mut tasks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(task_rate.max(1))));
    calls.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tasks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut call_n, mut task_n) = (0u64, 0u64);
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = calls.tick() => {
                call_n += 1;
                handles.push(tokio::spawn(load.clone().call(call_n)));
            }
            _ = tasks.tick() => {
                task_n += 1;
                let request_id = format!("{phase}-steady-{task_n}");
                handles.push(tokio::spawn(load.clone().submit(task_n as usize, request_id)));
            }
        }
    }
    handles
}

/// What became of the accepted tasks.
struct Settled {
    /// Not finished (succeeded, failed or canceled) when the bound ran out.
    open: Vec<String>,
    /// Of `open`, those the routers do not know at all (`404`).
    unknown: u64,
    /// Ended failed or canceled, by the task's error code.
    failed: BTreeMap<String, u64>,
}

/// Polls every task in `ids` until each has finished or the bound runs out.
async fn settle(stack: &Stack, ids: &[String]) -> Settled {
    let routers = stack.router_urls();
    let mut open: Vec<String> = ids.to_vec();
    let mut failed: BTreeMap<String, u64> = BTreeMap::new();
    let mut sample_shown = false;
    let deadline = Instant::now() + SETTLE_BOUND;
    loop {
        let views = futures::stream::iter(open.clone())
            .map(|task_id| {
                let (http, routers, token) = (stack.http.clone(), routers.clone(), stack.caller_token.clone());
                async move {
                    for url in routers.iter() {
                        let answer = http
                            .get(format!("{url}/v1/tasks/{task_id}"))
                            .bearer_auth(token.as_str())
                            .send()
                            .await;
                        if let Ok(answer) = answer {
                            let status = answer.status();
                            let body = answer.json::<Value>().await.unwrap_or(Value::Null);
                            return (task_id, status.as_u16(), body);
                        }
                    }
                    (task_id, 0, Value::Null)
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<_>>()
            .await;
        open.clear();
        let mut unknown = 0;
        for (task_id, http_status, body) in views {
            match (http_status, body["status"].as_str()) {
                (200, Some("succeeded")) => {}
                (200, Some(status @ ("failed" | "canceled"))) => {
                    // A task's own error, or (a delivery that failed) the result's; the
                    // driver cancels nothing, so a canceled task shows as such.
                    let code = body["error"]["code"]
                        .as_str()
                        .or_else(|| body["result"]["error"]["code"].as_str())
                        .unwrap_or(if status == "canceled" { "CANCELED" } else { "NO_CODE" });
                    *failed.entry(code.to_string()).or_default() += 1;
                    if !sample_shown {
                        sample_shown = true;
                        eprintln!("chaos: a task that ended failed: {body}");
                    }
                }
                _ => {
                    if http_status == 404 {
                        unknown += 1;
                    }
                    open.push(task_id);
                }
            }
        }
        if open.is_empty() || Instant::now() > deadline {
            return Settled { open, unknown, failed };
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

// === One fault ===

struct Row {
    fault: Fault,
    calls_sent: u64,
    calls_answered: u64,
    calls_failed: BTreeMap<String, u64>,
    calls_unanswered: u64,
    tasks_accepted: usize,
    tasks_rejected: BTreeMap<String, u64>,
    tasks_failed: BTreeMap<String, u64>,
    lost: usize,
    lost_unknown: u64,
    duplicated: usize,
    recovery: Option<Duration>,
    repaired_in: Duration,
}

async fn run_fault(stack: &mut Stack, args: &Args, fault: Fault, steady: Duration) -> anyhow::Result<Row> {
    let tally = Arc::new(Tally::default());
    let load = Load {
        http: stack.http.clone(),
        routers: stack.router_urls(),
        token: stack.caller_token.clone(),
        tally: tally.clone(),
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let pacer = tokio::spawn(steady_load(
        load.clone(),
        args.call_rate,
        args.task_rate,
        fault.name(),
        stopped,
    ));
    tokio::time::sleep(steady).await;
    let injected = Instant::now();
    inject(stack, fault, args, &load).await?;
    let repaired_in = injected.elapsed();
    tokio::time::sleep(steady).await;
    let _ = stop.send(true);
    let handles = pacer.await?;
    for handle in handles {
        handle.await?;
    }
    let accepted = tally
        .accepted
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    let Settled { open, unknown, failed } = settle(stack, &accepted).await;
    let last_failure = *tally
        .last_failure
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let row = Row {
        fault,
        calls_sent: tally.calls_sent.load(Ordering::Relaxed),
        calls_answered: tally.calls_answered.load(Ordering::Relaxed),
        calls_failed: tally
            .calls_failed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone(),
        calls_unanswered: tally.calls_unanswered.load(Ordering::Relaxed),
        tasks_accepted: accepted.len(),
        tasks_rejected: tally
            .tasks_rejected
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone(),
        tasks_failed: failed,
        lost: open.len(),
        lost_unknown: unknown,
        duplicated: stack.duplicated(&accepted),
        recovery: last_failure.map(|at| at.saturating_duration_since(injected)),
        repaired_in,
    };
    if !open.is_empty() {
        // What the routers know under the lost tasks' request ids: a resubmission
        // answers the task stored for it, if any (the diagnosis of a lost id).
        let request_ids = tally
            .request_ids
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        eprintln!("chaos: {}: {} tasks lost", fault.name(), open.len());
        for task_id in open.iter().take(3) {
            let Some(request_id) = request_ids.get(task_id) else {
                continue;
            };
            let body = json!({"capability": CAPABILITY, "request_id": request_id, "payload": {"delay_ms": 20}});
            let answer = match load.post(0, "/v1/tasks", &body).await {
                Sent::Answer(status, body) => format!("{status} {body}"),
                Sent::Broken(code) => code.to_string(),
            };
            eprintln!("chaos:   lost {task_id} (request id {request_id}); resubmitted: {answer}");
        }
    }
    Ok(row)
}

/// Injects `fault` and repairs it; the repair is done (bounded polls) on return.
async fn inject(stack: &mut Stack, fault: Fault, args: &Args, load: &Load) -> anyhow::Result<()> {
    match fault {
        Fault::AgentKill => {
            stack.agents[0].kill();
            tokio::time::sleep(Duration::from_secs(2)).await;
            stack.start_agent(0).await?;
        }
        Fault::AgentPartition => {
            let index = PARTITIONED;
            match &stack.netns {
                Ok(netns) => {
                    netns.link(false)?;
                    tokio::time::sleep(Duration::from_secs(8)).await;
                    netns.link(true)?;
                }
                Err(_) => {
                    stack.agents[index].signal(libc::SIGSTOP)?;
                    tokio::time::sleep(Duration::from_secs(8)).await;
                    stack.agents[index].signal(libc::SIGCONT)?;
                }
            }
            stack.wait_routable(index).await?;
        }
        Fault::RouterKill => {
            // Every submission of the burst answered by router 0 before the kill.
            let submitted = futures::stream::iter(0..args.router_burst)
                .map(|n| load.clone().submit(0, format!("router-kill-burst-{n}")))
                .buffer_unordered(64)
                .collect::<Vec<()>>();
            submitted.await;
            stack.routers[0].process.kill();
            tokio::time::sleep(Duration::from_secs(2)).await;
            stack.routers[0].restart()?;
        }
        Fault::RegistryKill => {
            stack.registries[0].process.kill();
            tokio::time::sleep(Duration::from_secs(5)).await;
            stack.registries[0].restart()?;
        }
        Fault::EtcdFollower | Fault::EtcdLeader => {
            let mut leader = None;
            if !wait_until(RECOVERY_BOUND, || {
                leader = stack.etcd.leader();
                leader.is_some()
            }) {
                bail!("the etcd cluster has no leader");
            }
            let leader = leader.context("no etcd leader")?;
            let victim = if fault == Fault::EtcdLeader {
                leader
            } else {
                (leader + 1) % 3
            };
            stack.etcd.kill(victim);
            tokio::time::sleep(Duration::from_secs(5)).await;
            stack.etcd.restart(victim);
        }
        Fault::RedisPrimary => {
            let redis = stack.redis.sentinels()?;
            let old = redis.primary_port().context("no Redis primary")?;
            redis.kill_server(old);
            let mut new = None;
            if !wait_until(RECOVERY_BOUND, || {
                new = redis.primary_port().filter(|port| *port != old);
                new.is_some_and(|port| redis.role(port).as_deref() == Some("master"))
            }) {
                bail!("the Sentinels did not promote the replica");
            }
            let new = new.context("no new primary")?;
            redis.restart_server_as_replica(old, new);
            let _ = redis.wait_replicated(new, old);
        }
        Fault::RedisReplica => {
            let primary = stack.redis.sentinels()?.primary_port().context("no Redis primary")?;
            let replica = stack
                .redis
                .sentinels()?
                .server_ports()
                .into_iter()
                .find(|port| *port != primary)
                .context("no Redis replica")?;
            stack.redis.sentinels()?.kill_server(replica);
            tokio::time::sleep(Duration::from_secs(5)).await;
            stack.redis.sentinels()?.restart_server_as_replica(replica, primary);
            let _ = stack.redis.sentinels()?.wait_replicated(primary, replica);
        }
        Fault::RedisOutage => {
            let ports = stack.redis.sentinels()?.server_ports();
            for port in ports {
                stack.redis.sentinels()?.freeze_server(port);
            }
            tokio::time::sleep(Duration::from_secs(10)).await;
            for port in ports {
                stack.redis.sentinels()?.thaw_server(port);
            }
        }
        Fault::ClusterPrimaryKill => {
            let slot = load_slot(load)?;
            // Blocking (the cluster's own failover, then its rejoin): in place,
            // the load's tasks go on on the other workers.
            let cluster = stack.redis.cluster()?;
            let killed = tokio::task::block_in_place(|| cluster.kill_primary_of(slot).0);
            tokio::time::sleep(Duration::from_secs(5)).await;
            // It rejoins as a replica of the node that took its slots.
            let cluster = stack.redis.cluster()?;
            tokio::task::block_in_place(|| cluster.restart(killed));
        }
        Fault::ClusterReshard => {
            let slot = load_slot(load)?;
            let cluster = stack.redis.cluster()?;
            let moved = tokio::task::block_in_place(|| {
                let target = cluster
                    .primaries()
                    .into_iter()
                    .find(|port| Some(*port) != cluster.owner_of(slot));
                target.map(|target| cluster.migrate_slot(slot, target, 10))
            });
            let moved = moved.context("the cluster has one primary: nowhere to move the slot")?;
            println!("chaos: cluster-reshard: slot {slot} moved with {moved} keys");
        }
    }
    Ok(())
}

// === The table ===

fn codes(map: &BTreeMap<String, u64>) -> String {
    if map.is_empty() {
        return "0".to_string();
    }
    let total: u64 = map.values().sum();
    let parts: Vec<String> = map.iter().map(|(code, n)| format!("{n} {code}")).collect();
    format!("{total} ({})", parts.join(", "))
}

fn print_table(rows: &[Row], args: &Args, partition: &str) {
    println!();
    println!(
        "| fault | calls sent | answered | failed (code) | no answer | tasks accepted | refused (code) | ended failed | **lost** | duplicated | recovery s | repaired in s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let lost = if row.lost_unknown == 0 {
            row.lost.to_string()
        } else {
            format!("{} ({} not found)", row.lost, row.lost_unknown)
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | **{}** | {} | {} | {:.1} |",
            row.fault.name(),
            row.calls_sent,
            row.calls_answered,
            codes(&row.calls_failed),
            row.calls_unanswered,
            row.tasks_accepted,
            codes(&row.tasks_rejected),
            codes(&row.tasks_failed),
            lost,
            row.duplicated,
            row.recovery
                .map_or("0".to_string(), |at| format!("{:.1}", at.as_secs_f64())),
            row.repaired_in.as_secs_f64(),
        );
    }
    println!();
    for row in rows {
        println!(
            "- {}: {}",
            row.fault.name(),
            row.fault.describe(args.router_burst, partition)
        );
    }
}

// === Entry points ===

async fn agent_main(args: AgentArgs) -> anyhow::Result<()> {
    let token = std::env::var("AGENT_REACH_TOKEN").context("AGENT_REACH_TOKEN is not set")?;
    let executions = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.executions)
        .with_context(|| format!("cannot open {}", args.executions.display()))?;
    let executions = Arc::new(Mutex::new(executions));
    let handler = Handler::new(CAPABILITY, "1.0.0", move |ctx: Ctx, input: Value| {
        // One write(2) per execution, before the work: it survives a kill -9.
        if let Some(task_id) = ctx.task_id() {
            let mut file = executions.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let _ = file.write_all(format!("{task_id}\n").as_bytes());
        }
        async move {
            let delay = input["delay_ms"].as_u64().unwrap_or(0).min(1000);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            Ok::<_, HandlerError>(input)
        }
    });
    let agent = Agent::builder(AGENT_NAME, &args.id)
        .registry(&args.registry)
        .token(token)
        .ttl_s(AGENT_TTL_S)
        .max_concurrency(1024)
        .listen(args.listen)
        .assertion_keys_file(&args.keys)
        .handler(handler)
        .start()
        .await?;
    agent.mark_ready();
    tokio::signal::ctrl_c().await?;
    agent.shutdown().await;
    Ok(())
}

async fn driver(args: Args) -> anyhow::Result<()> {
    let faults: Vec<Fault> = if !args.only.is_empty() {
        args.only
            .iter()
            .map(|name| Fault::parse(name))
            .collect::<anyhow::Result<_>>()?
    } else if args.smoke {
        Fault::SMOKE.to_vec()
    } else {
        Fault::ALL.to_vec()
    };
    if args.agents < 2 {
        bail!("--agents must be at least 2 (a fault takes one away)");
    }
    let steady = Duration::from_secs(args.steady_s.unwrap_or(if args.smoke { 2 } else { 5 }));
    let temp = tempfile::Builder::new().prefix("agent-reach-chaos-").tempdir()?;
    let logs = match &args.logs {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => temp.path().to_path_buf(),
    };
    let started = Instant::now();
    // The namespace only when agent-partition runs (the smoke has none).
    let netns = if faults.contains(&Fault::AgentPartition) {
        Netns::create().map_err(|error| format!("{error:#}"))
    } else {
        Err("not needed: agent-partition is not in this run".to_string())
    };
    match &netns {
        Ok(netns) => println!(
            "chaos: agent-{PARTITIONED} runs in network namespace {} ({}), the registries and routers listen on {}",
            netns.name, netns.agent_ip, netns.host_ip
        ),
        Err(why) if faults.contains(&Fault::AgentPartition) => {
            println!("chaos: no network namespace ({why}); agent-partition freezes agent-{PARTITIONED} with SIGSTOP")
        }
        Err(_) => {}
    }
    // The Sentinel faults on one stack, then the Redis Cluster ones on a
    // second whose routers keep their tasks in a cluster (its own directory).
    let (on_sentinels, on_cluster): (Vec<Fault>, Vec<Fault>) =
        faults.into_iter().partition(|fault| !fault.on_cluster());
    let mut netns = Some(netns);
    let mut rows = Vec::new();
    let mut partition = String::new();
    for (group, cluster) in [(on_sentinels, false), (on_cluster, true)] {
        if group.is_empty() {
            continue;
        }
        let stack_logs = if cluster { logs.join("cluster") } else { logs.clone() };
        std::fs::create_dir_all(&stack_logs)?;
        let netns = netns
            .take()
            .filter(|_| !cluster)
            .unwrap_or_else(|| Err("not needed: agent-partition runs on the Sentinel stack".to_string()));
        let stack_started = Instant::now();
        let mut stack = Stack::start(&args, &stack_logs, netns, cluster).await?;
        println!(
            "chaos: etcd x3, {}, 2 registries, 2 routers, {} agents up in {:.1} s; \
             {} calls/s and {} tasks/s; {} s of steady load around each fault",
            if cluster {
                "a Redis Cluster (3 primaries, a replica each)"
            } else {
                "Redis primary + replica + 3 Sentinels"
            },
            args.agents,
            stack_started.elapsed().as_secs_f64(),
            args.call_rate,
            args.task_rate,
            steady.as_secs()
        );
        for fault in group {
            let row = run_fault(&mut stack, &args, fault, steady).await?;
            println!(
                "chaos: {}: calls {}/{} answered, tasks {} accepted, {} lost",
                fault.name(),
                row.calls_answered,
                row.calls_sent,
                row.tasks_accepted,
                row.lost
            );
            rows.push(row);
        }
        if !cluster {
            partition = stack.partition_method();
        }
    }
    print_table(&rows, &args, &partition);
    let lost: usize = rows.iter().map(|row| row.lost).sum();
    println!(
        "\nchaos: {} faults in {:.0} s; {lost} tasks lost{}",
        rows.len(),
        started.elapsed().as_secs_f64(),
        if args.logs.is_some() {
            format!("; logs in {}", logs.display())
        } else {
            String::new()
        }
    );
    if lost > 0 {
        bail!("{lost} accepted tasks were lost");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Some(Internal::Agent(agent)) => agent_main(agent).await,
        None => driver(args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_parses_from_its_name_and_unknown_names_list_them() {
        for fault in Fault::ALL {
            assert_eq!(Fault::parse(fault.name()).unwrap(), fault);
        }
        let error = Fault::parse("etcd-everything").unwrap_err().to_string();
        assert!(error.contains("unknown fault `etcd-everything`"), "{error}");
        assert!(error.contains("redis-outage"), "{error}");
        assert!(Fault::SMOKE.iter().all(|fault| Fault::ALL.contains(fault)));
    }

    #[test]
    fn each_run_gets_its_own_veth_names_and_slash_30() {
        // Linux's largest pid (2^22): the interface names still fit IFNAMSIZ.
        assert!(host_if(4_194_304).len() <= 15);
        let (host, agent) = veth_addresses(4_194_303);
        assert_eq!(
            (host.octets()[3] & !3, host.octets()[3] & 3, agent.octets()[3] & 3),
            (agent.octets()[3] & !3, 1, 2)
        );
        assert_eq!(veth_addresses(0).0, std::net::Ipv4Addr::new(10, 213, 0, 1));
        assert_ne!(veth_addresses(100).0, veth_addresses(101).0);
        let note = Fault::AgentPartition.describe(1000, "its link down");
        assert!(note.contains("its link down"), "{note}");
    }

    #[test]
    fn code_counts_read_as_a_total_and_its_parts() {
        assert_eq!(codes(&BTreeMap::new()), "0");
        let map = BTreeMap::from([("TRANSPORT".to_string(), 2), ("DEADLINE_EXCEEDED".to_string(), 1)]);
        assert_eq!(codes(&map), "3 (1 DEADLINE_EXCEEDED, 2 TRANSPORT)");
        let body = json!({"error": {"code": "TASK_BUFFER_FULL"}});
        assert_eq!(
            code_of(reqwest::StatusCode::SERVICE_UNAVAILABLE, &body),
            "TASK_BUFFER_FULL"
        );
        assert_eq!(code_of(reqwest::StatusCode::BAD_GATEWAY, &Value::Null), "HTTP_502");
    }
}
