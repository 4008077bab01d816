//! Registry benchmark (issues 2 and 35): N agents registered and
//! heartbeating through the registry on etcd, on this machine.
//!
//! ```sh
//! # 10,000 agents through one registry on one etcd:
//! cargo run --release -p agent-reach-benches --bin registry-bench -- --agents 10000
//! # 100,000 agents on a 3-member etcd, two registries, a router watching, 10 minutes:
//! cargo run --release -p agent-reach-benches --bin registry-bench -- \
//!     --agents 100000 --etcd-members 3 --registries 2 --with-router --ttl-s 60 --duration-s 600
//! ```
//!
//! Starts real etcd (one member, or three: testkit) and the registries as
//! child processes (this binary re-executed), so each one's CPU and memory
//! are measured apart from the load generator. The agents register through
//! the registries in turn and heartbeat over gRPC `KeepAlive` streams spread
//! over them. With `--with-router` a router watches from the start (its CPU
//! while 100k registrations stream in is the snapshot's rebuild cost), and
//! once every agent is registered a second router is started: the time until
//! its `/readyz` (the whole snapshot received and built) is measured, and a
//! call through it reaches a real agent registered beside the simulated ones.
//! Prints registration rate, sustained heartbeat rate, CPU of each process
//! (and per 10,000 agents), etcd's raft proposals and lease renewals per
//! agent, Resolve p50/p99, memory, lost leases, and the verdict.
//!
//! `--smoke` (CI): the whole stack (three etcd members, two registries, the
//! routers), 200 agents on 10 capabilities with 3 s leases, heartbeating for
//! 3 s; the numbers without a verdict.

#[path = "support.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_proto::registry as pb;
use agent_reach_proto::registry::registry_client::RegistryClient;
use anyhow::{bail, Context};
use clap::Parser;
use futures::StreamExt;
use support::{cpu_seconds, start_registry, Files, Run, Service, Threads, REGISTRY, ROUTER};
use tokio::sync::mpsc;
use tonic::transport::Channel;

#[derive(Debug, Parser)]
#[command(about = "Registry benchmark: N agents registered and heartbeating through the registries on etcd.")]
struct Args {
    /// Number of agent instances.
    #[arg(long, default_value_t = 10_000)]
    agents: usize,
    /// Lease TTL of each agent; heartbeats go every TTL/3.
    #[arg(long, default_value_t = 15)]
    ttl_s: u32,
    /// How long to sustain heartbeats after registration.
    #[arg(long, default_value_t = 45)]
    duration_s: u64,
    /// Concurrent registrations.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// gRPC keep-alive streams the agents' heartbeats are spread over (in
    /// turn over the registries).
    #[arg(long, default_value_t = 8)]
    streams: usize,
    /// Distinct capabilities (agents are spread over them).
    #[arg(long, default_value_t = 100)]
    capabilities: usize,
    /// Resolve calls per second during the heartbeat phase.
    #[arg(long, default_value_t = 200)]
    resolve_rate: u64,
    /// etcd members: 1, or 3 (a cluster, as production runs).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    etcd_members: u8,
    /// Registry replicas on the same etcd; agents are spread over them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=8))]
    registries: u8,
    /// A router watches from the start, and a second one is started once
    /// every agent is registered (its time to a full snapshot is measured).
    #[arg(long)]
    with_router: bool,
    /// A smoke run (CI): every stack and comparison of the bench for a few
    /// seconds on tiny sizes (the flags it adds are printed first), no warm-ups;
    /// prints the numbers, no verdict.
    #[arg(long)]
    smoke: bool,
}

/// The smoke run's sizes: `--smoke` runs the bench with these flags.
const SMOKE: &[&str] = &[
    "--agents=200",
    "--ttl-s=3",
    "--duration-s=3",
    "--capabilities=10",
    "--etcd-members=3",
    "--registries=2",
    "--with-router",
];

/// The capability of the one real agent registered beside the simulated ones.
const ECHO: &str = "bench.echo";

// === Processes measured ===

/// CPU time of a set of processes over a phase.
struct CpuMeter {
    pids: Vec<u32>,
    start_cpu: f64,
    start: Instant,
}

impl CpuMeter {
    fn start(pids: &[u32]) -> anyhow::Result<Self> {
        Ok(Self {
            pids: pids.to_vec(),
            start_cpu: total_cpu(pids)?,
            start: Instant::now(),
        })
    }

    /// Average cores used by all of them together since `start`.
    fn cores(&self) -> anyhow::Result<f64> {
        Ok((total_cpu(&self.pids)? - self.start_cpu) / self.start.elapsed().as_secs_f64())
    }
}

fn total_cpu(pids: &[u32]) -> anyhow::Result<f64> {
    pids.iter().map(|pid| cpu_seconds(*pid)).sum()
}

/// Resident memory of `pid`, in MiB (`VmRSS` of /proc/PID/status).
fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc/PID/status")?;
    Ok(kib / 1024.0)
}

/// One etcd member, or a 3-member cluster: killed on drop.
enum EtcdStack {
    One(agent_reach_testkit::Etcd),
    Three(agent_reach_testkit::EtcdCluster),
}

impl EtcdStack {
    fn start(members: u8) -> anyhow::Result<Self> {
        match members {
            1 => Ok(Self::One(agent_reach_testkit::Etcd::start())),
            3 => Ok(Self::Three(agent_reach_testkit::EtcdCluster::start())),
            other => bail!("--etcd-members takes 1 or 3, not {other}"),
        }
    }

    fn endpoints(&self) -> Vec<String> {
        match self {
            Self::One(etcd) => vec![etcd.endpoint()],
            Self::Three(cluster) => cluster.endpoints(),
        }
    }

    fn pids(&self) -> anyhow::Result<Vec<u32>> {
        match self {
            Self::One(etcd) => Ok(vec![etcd.pid().context("etcd pid")?]),
            Self::Three(cluster) => (0..3)
                .map(|index| cluster.pid(index).context("etcd member pid"))
                .collect(),
        }
    }

    /// etcd's own counters, summed over the members: raft proposals
    /// committed (the leader's count: every member commits the same ones)
    /// and lease renewals (each served by the leader).
    async fn counters(&self, http: &reqwest::Client) -> anyhow::Result<EtcdCounters> {
        let mut counters = EtcdCounters::default();
        for endpoint in self.endpoints() {
            let text = http.get(format!("{endpoint}/metrics")).send().await?.text().await?;
            let read = |name: &str| -> f64 {
                text.lines()
                    .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                    .and_then(|value| value.trim().parse().ok())
                    .unwrap_or(0.0)
            };
            counters.proposals = counters.proposals.max(read("etcd_server_proposals_committed_total"));
            counters.renewals += read("etcd_debugging_lease_renewed_total");
        }
        Ok(counters)
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct EtcdCounters {
    proposals: f64,
    renewals: f64,
}

impl EtcdCounters {
    /// Per second over `elapsed`, since `before`.
    fn rates_since(self, before: Self, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64().max(f64::EPSILON);
        Self {
            proposals: (self.proposals - before.proposals) / seconds,
            renewals: (self.renewals - before.renewals) / seconds,
        }
    }
}

fn authed<T>(message: T, token: &str) -> anyhow::Result<tonic::Request<T>> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse()?);
    Ok(request)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

/// The router's `agent_reach_router_snapshot_instances`.
async fn snapshot_instances(http: &reqwest::Client, router: &str) -> anyhow::Result<u64> {
    let text = http.get(format!("{router}/metrics")).send().await?.text().await?;
    text.lines()
        .find_map(|line| line.strip_prefix("agent_reach_router_snapshot_instances "))
        .and_then(|value| value.trim().parse().ok())
        .context("the router's /metrics has no agent_reach_router_snapshot_instances")
}

fn main() -> anyhow::Result<()> {
    support::main(&[REGISTRY, ROUTER], SMOKE, Threads::PerCore, bench)
}

/// A router on the registries, signing assertions with the run's key.
fn spawn_router(files: &Files, registries: &[Service]) -> anyhow::Result<Service> {
    let urls = registries
        .iter()
        .map(|registry| registry.url.clone())
        .collect::<Vec<_>>()
        .join(",");
    support::spawn_router(files, &urls, support::RouterOptions::default())
}

async fn bench(args: Args, run: Run) -> anyhow::Result<()> {
    let files = Files::write(&support::caller_acl("bench_caller", ECHO))?;
    run.announce("registry-bench");
    println!(
        "starting etcd ({} member(s)) and {} registry(ies) ...",
        args.etcd_members, args.registries
    );
    let etcd = EtcdStack::start(args.etcd_members)?;
    let etcd_pids = etcd.pids()?;
    let etcd_urls = etcd.endpoints().join(",");
    let mut registries = Vec::new();
    for _ in 0..args.registries {
        // Child processes, so their CPU and etcd's are measured apart from the load generator's.
        registries.push(start_registry(&files, &etcd_urls, &[]).await?);
    }
    let registry_pids: Vec<u32> = registries.iter().map(Service::pid).collect();
    let http = reqwest::Client::new();
    let token = support::token("bench_agent")?;
    let mut clients = Vec::new();
    for registry in &registries {
        let channel = Channel::from_shared(registry.url.clone())?.connect().await?;
        clients.push(RegistryClient::new(channel).max_decoding_message_size(64 * 1024 * 1024));
    }
    let mut watching = match args.with_router {
        true => {
            let mut router = spawn_router(&files, &registries)?;
            router.wait_ready("watching router", Duration::from_secs(30)).await?;
            Some(router)
        }
        false => None,
    };
    let router_pids: Vec<u32> = watching.iter().map(Service::pid).collect();
    // The one real agent: a call through the new router must reach it.
    let echo = support::start_json_agent().await?;
    support::register(
        &http,
        &registries[0].url,
        &token,
        support::Instance {
            id: "bench-echo",
            name: "bench_agent",
            endpoint: format!("http://{echo}/invoke"),
            capability: ECHO,
            weight: 1,
        },
    )
    .await?;

    // === Heartbeats: each agent's from the moment it is registered ===
    let interval = Duration::from_secs(u64::from(args.ttl_s.max(3) / 3));
    let counts = Arc::new(Counts::default());
    // When the heartbeat phase ends: set once every agent is registered.
    let (end_at, ends) = tokio::sync::watch::channel(None::<Instant>);
    let mut streams = Vec::new();
    let mut beaters = Vec::new();
    for stream in 0..args.streams.max(1) {
        let (agents, registered) = mpsc::unbounded_channel();
        streams.push(agents);
        let client = clients[stream % clients.len()].clone();
        beaters.push(tokio::spawn(heartbeat_stream(
            client,
            token.clone(),
            interval,
            registered,
            ends.clone(),
            counts.clone(),
        )));
    }

    // === Phase 1: registration ===
    println!(
        "registering {} agents ({} concurrent), each heartbeating every {:?} from its registration ...",
        args.agents, args.concurrency, interval
    );
    let registry_cpu = CpuMeter::start(&registry_pids)?;
    let etcd_cpu = CpuMeter::start(&etcd_pids)?;
    let router_cpu = CpuMeter::start(&router_pids)?;
    let started = Instant::now();
    let retries = Arc::new(AtomicU64::new(0));
    futures::stream::iter(0..args.agents)
        .map(|index| {
            let mut client = clients[index % clients.len()].clone();
            let token = token.clone();
            let capabilities = args.capabilities;
            let ttl_s = args.ttl_s;
            let beats = streams[index % streams.len()].clone();
            let retries = retries.clone();
            async move {
                let agent_id = format!("bench-{index:06}");
                let request = pb::RegisterRequest {
                    agent_id: agent_id.clone(),
                    name: "bench_agent".into(),
                    endpoint: format!("http://127.0.0.1:{}/invoke", 20_000 + index % 10_000),
                    weight: 1 + (index % 3) as u32,
                    ttl_s,
                    status: "ready".into(),
                    capabilities: vec![pb::CapabilityDescriptor {
                        name: format!("bench.cap_{}", index % capabilities),
                        version: "1.0.0".into(),
                        input_schema_json: r#"{"type":"object","properties":{"id":{"type":"string"}}}"#.into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                };
                // An agent registers again after a failure, as the SDKs do; each retry is counted.
                let mut tries = 0;
                let answer = loop {
                    match client.register(authed(request.clone(), &token)?).await {
                        Ok(answer) => break answer.into_inner(),
                        Err(status) if tries < 5 => {
                            tries += 1;
                            retries.fetch_add(1, Ordering::Relaxed);
                            if tries == 1 {
                                eprintln!("registration of {agent_id} failed, retrying: {status}");
                            }
                            tokio::time::sleep(Duration::from_millis(200 * tries)).await;
                        }
                        Err(status) => return Err(status.into()),
                    }
                };
                beats
                    .send((agent_id, answer.lease_id))
                    .map_err(|_| anyhow::anyhow!("a heartbeat stream ended during registration"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>, _>>()?;
    drop(streams);
    let registration_time = started.elapsed();
    let registration_rate = args.agents as f64 / registration_time.as_secs_f64();
    let registration_registry_cpu = registry_cpu.cores()?;
    let registration_etcd_cpu = etcd_cpu.cores()?;
    let registration_router_cpu = router_cpu.cores()?;
    // The watching router takes every registration in (bounded: its rebuilds may trail the writes).
    let all = args.agents as u64 + 1;
    if let Some(router) = watching.as_mut() {
        let url = router.url.clone();
        let mut held = 0;
        let waited = router
            .wait_until(
                "the watching router's snapshot holding every agent",
                Duration::from_secs(300),
                async || {
                    held = snapshot_instances(&http, &url).await.unwrap_or(held);
                    held >= all
                },
            )
            .await;
        if let Err(error) = waited {
            bail!("{error} (it held {held} of {all} instances)");
        }
    }
    let watched_after = started.elapsed();

    // === Phase 2: sustained heartbeats + resolves (+ a new router) ===
    println!(
        "every agent registered; heartbeating over {} streams for {} s, resolving at {}/s ...",
        args.streams, args.duration_s, args.resolve_rate
    );
    let registry_cpu = CpuMeter::start(&registry_pids)?;
    let etcd_cpu = CpuMeter::start(&etcd_pids)?;
    let router_cpu = CpuMeter::start(&router_pids)?;
    let etcd_before = etcd.counters(&http).await?;
    let beats_before = counts.ok.load(Ordering::Relaxed);
    let phase_start = Instant::now();
    let phase_end = phase_start + Duration::from_secs(args.duration_s);
    end_at.send_replace(Some(phase_end));
    let resolver = {
        let mut client = clients[0].clone();
        let token = token.clone();
        let rate = args.resolve_rate.max(1);
        let capabilities = args.capabilities;
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut ticker = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
            let mut index = 0usize;
            while Instant::now() < phase_end {
                ticker.tick().await;
                index += 1;
                let request = pb::ResolveCapabilityRequest {
                    name: format!("bench.cap_{}", index % capabilities),
                    version_req: "^1".into(),
                };
                let started = Instant::now();
                client.resolve_capability(authed(request, &token)?).await?;
                latencies.push(started.elapsed());
            }
            latencies.sort();
            anyhow::Ok(latencies)
        })
    };
    // A router started now, beside every registered agent, under the heartbeat load.
    let new_router = match args.with_router {
        true => Some(start_new_router(&files, &registries, &http, all).await?),
        false => None,
    };
    for beater in beaters {
        beater.await??;
    }
    let latencies = resolver.await??;
    let heartbeat_registry_cpu = registry_cpu.cores()?;
    let heartbeat_etcd_cpu = etcd_cpu.cores()?;
    let heartbeat_router_cpu = router_cpu.cores()?;
    let etcd_rates = etcd
        .counters(&http)
        .await?
        .rates_since(etcd_before, phase_start.elapsed());
    let heartbeat_rate = (counts.ok.load(Ordering::Relaxed) - beats_before) as f64 / args.duration_s as f64;

    // Every page of the listing (one answer would outgrow a gRPC message).
    let mut client = clients[clients.len() - 1].clone();
    let mut live = 0;
    let mut page_token = String::new();
    loop {
        let page = client
            .list_agents(authed(
                pb::ListAgentsRequest {
                    page_size: 5000,
                    page_token,
                },
                &token,
            )?)
            .await?
            .into_inner();
        live += page
            .agents
            .iter()
            .filter(|agent| agent.agent_id != "bench-echo")
            .count();
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let lost = args.agents.saturating_sub(live);
    let expired = counts.expired.load(Ordering::Relaxed);

    // === Report ===
    let per_10k = |cores: f64| cores * 10_000.0 / args.agents.max(1) as f64;
    println!();
    println!(
        "registry bench: {} agents, ttl {} s, {} registry(ies), {} etcd member(s){}, {} cores",
        args.agents,
        args.ttl_s,
        args.registries,
        args.etcd_members,
        if args.with_router { ", a router watching" } else { "" },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("  registration       {registration_rate:>10.0} /s   ({:.1} s)   registries CPU {registration_registry_cpu:.2} cores   etcd CPU {registration_etcd_cpu:.2} cores   {} retried", registration_time.as_secs_f64(), retries.load(Ordering::Relaxed));
    if args.with_router {
        println!(
            "  watching router    every agent in its snapshot {:.1} s after the first registration   CPU {registration_router_cpu:.2} cores while they registered",
            watched_after.as_secs_f64()
        );
    }
    println!(
        "  heartbeats         {heartbeat_rate:>10.0} /s   (expected {:.0} /s)   registries CPU {heartbeat_registry_cpu:.2} cores   etcd CPU {heartbeat_etcd_cpu:.2} cores",
        args.agents as f64 / interval.as_secs_f64()
    );
    println!(
        "  per 10,000 agents  registries {:.3} cores   etcd {:.3} cores{}",
        per_10k(heartbeat_registry_cpu),
        per_10k(heartbeat_etcd_cpu),
        if args.with_router {
            format!("   watching router {:.3} cores", per_10k(heartbeat_router_cpu))
        } else {
            String::new()
        }
    );
    println!(
        "  etcd per agent     {:.5} raft proposals/s   {:.4} lease renewals/s   ({:.0} proposals/s, {:.0} renewals/s in all)",
        etcd_rates.proposals / args.agents.max(1) as f64,
        etcd_rates.renewals / args.agents.max(1) as f64,
        etcd_rates.proposals,
        etcd_rates.renewals
    );
    println!(
        "  heartbeat errors   {} lease expired, {} other, {} stream(s) opened again",
        expired,
        counts.failed.load(Ordering::Relaxed),
        counts.reopened.load(Ordering::Relaxed)
    );
    println!(
        "  resolve            p50 {:?}   p99 {:?}   ({} calls)",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.len()
    );
    if let Some(new) = &new_router {
        println!(
            "  new router         ready (whole snapshot, {} instances) {:.2} s after it started; a call through it answered {}",
            new.instances,
            new.ready_after.as_secs_f64(),
            new.call_status
        );
    }
    let mut memory = Vec::new();
    for (index, pid) in registry_pids.iter().enumerate() {
        memory.push(format!("registry {} {:.0} MiB", index + 1, rss_mib(*pid)?));
    }
    if let Some(router) = &watching {
        memory.push(format!("watching router {:.0} MiB", rss_mib(router.pid())?));
    }
    if let Some(new) = &new_router {
        memory.push(format!("new router {:.0} MiB", rss_mib(new.router.pid())?));
    }
    for (index, pid) in etcd_pids.iter().enumerate() {
        memory.push(format!("etcd {} {:.0} MiB", index + 1, rss_mib(*pid)?));
    }
    println!("  memory (RSS)       {}", memory.join(", "));
    println!("  live agents        {live} of {} ({lost} lost)", args.agents);
    println!();
    let cpu_ok = heartbeat_registry_cpu / f64::from(args.registries) < 1.0;
    let leases_ok = lost == 0 && expired == 0;
    let router_ok = new_router
        .as_ref()
        .is_none_or(|new| new.ready_after <= Duration::from_secs(5) && new.instances >= all && new.call_status == 200);
    // The verdict, in a judged run only.
    if run.is_judged() {
        println!(
            "target: {} live agents, each registry below one core, no lease lost{}: {} (CPU {}, leases {}{})",
            args.agents,
            if args.with_router {
                ", a new router's full snapshot in <= 5 s"
            } else {
                ""
            },
            if cpu_ok && leases_ok && router_ok {
                "MET"
            } else {
                "NOT MET"
            },
            if cpu_ok { "ok" } else { "over" },
            if leases_ok { "ok" } else { "lost" },
            match (args.with_router, router_ok) {
                (false, _) => "",
                (true, true) => ", new router ok",
                (true, false) => ", new router late or short",
            }
        );
    }
    drop(watching);
    Ok(())
}

/// A router started beside every registered agent.
struct NewRouter {
    router: Service,
    /// From its start until `/readyz` (the whole snapshot received and built).
    ready_after: Duration,
    instances: u64,
    /// The status of one call through it to the real agent.
    call_status: u16,
}

async fn start_new_router(
    files: &Files,
    registries: &[Service],
    http: &reqwest::Client,
    all: u64,
) -> anyhow::Result<NewRouter> {
    let started = Instant::now();
    let mut router = spawn_router(files, registries)?;
    router.wait_ready("new router", Duration::from_secs(120)).await?;
    let ready_after = started.elapsed();
    let instances = snapshot_instances(http, &router.url).await?;
    if instances < all {
        println!("  (the new router was ready holding {instances} of {all} instances)");
    }
    let caller = support::token("bench_caller")?;
    let call_status = http
        .post(format!("{}/v1/invoke", router.url))
        .bearer_auth(&caller)
        .json(&serde_json::json!({ "capability": ECHO, "payload": { "order_id": "SO-1" } }))
        .send()
        .await?
        .status()
        .as_u16();
    Ok(NewRouter {
        router,
        ready_after,
        instances,
        call_status,
    })
}

/// Heartbeat answers over the whole run.
#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    expired: AtomicU64,
    failed: AtomicU64,
    /// Keep-alive streams opened again after they broke.
    reopened: AtomicU64,
}

/// One gRPC `KeepAlive` stream: each agent handed to it is renewed every
/// `interval` from its registration (agents come in registration order, so
/// a queue in due order is enough), until the heartbeat phase ends. A stream
/// that breaks is opened again (as an SDK does), and counted.
async fn heartbeat_stream(
    client: RegistryClient<Channel>,
    token: String,
    interval: Duration,
    mut registered: mpsc::UnboundedReceiver<(String, i64)>,
    mut ends: tokio::sync::watch::Receiver<Option<Instant>>,
    counts: Arc<Counts>,
) -> anyhow::Result<()> {
    let (mut sender, mut reader) = open_keep_alive(client.clone(), &token, counts.clone()).await?;
    let mut due: std::collections::VecDeque<(Instant, String, i64)> = std::collections::VecDeque::new();
    let mut open = true;
    loop {
        let end = *ends.borrow();
        if end.is_some_and(|end| Instant::now() >= end) {
            break;
        }
        let next = due.front().map(|(at, _, _)| *at);
        tokio::select! {
            agent = registered.recv(), if open => match agent {
                Some((agent_id, lease_id)) => due.push_back((Instant::now() + interval, agent_id, lease_id)),
                None => open = false,
            },
            _ = tokio::time::sleep_until(next.unwrap_or_else(|| Instant::now() + interval).into()), if next.is_some() => {
                if let Some((at, agent_id, lease_id)) = due.pop_front() {
                    let heartbeat = pb::KeepAliveRequest {
                        agent_id: agent_id.clone(),
                        lease_id,
                        ..Default::default()
                    };
                    if let Err(failed) = sender.send(heartbeat).await {
                        counts.reopened.fetch_add(1, Ordering::Relaxed);
                        eprintln!("a keep-alive stream broke; opening it again");
                        (sender, reader) = open_keep_alive(client.clone(), &token, counts.clone()).await?;
                        sender.send(failed.0).await.map_err(|_| anyhow::anyhow!("a new keep-alive stream refused a heartbeat"))?;
                    }
                    due.push_back((at + interval, agent_id, lease_id));
                }
            }
            changed = ends.changed() => if changed.is_err() { break },
        }
    }
    drop(sender);
    let _ = tokio::time::timeout(Duration::from_secs(10), reader).await;
    Ok(())
}

/// A `KeepAlive` stream: where heartbeats go, and the task counting its answers.
async fn open_keep_alive(
    mut client: RegistryClient<Channel>,
    token: &str,
    counts: Arc<Counts>,
) -> anyhow::Result<(mpsc::Sender<pb::KeepAliveRequest>, tokio::task::JoinHandle<()>)> {
    let mut tries = 0;
    let (sender, mut answers) = loop {
        let (sender, receiver) = mpsc::channel(4096);
        let opened = client
            .keep_alive(authed(tokio_stream::wrappers::ReceiverStream::new(receiver), token)?)
            .await;
        match opened {
            Ok(answers) => break (sender, answers.into_inner()),
            Err(status) if tries < 5 => {
                tries += 1;
                eprintln!("cannot open a keep-alive stream, retrying: {status}");
                tokio::time::sleep(Duration::from_millis(200 * tries)).await;
            }
            Err(status) => return Err(status.into()),
        }
    };
    let reader = tokio::spawn(async move {
        while let Some(Ok(answer)) = answers.next().await {
            match answer.error {
                None => counts.ok.fetch_add(1, Ordering::Relaxed),
                Some(error) if error.code == "LEASE_EXPIRED" => counts.expired.fetch_add(1, Ordering::Relaxed),
                Some(_) => counts.failed.fetch_add(1, Ordering::Relaxed),
            };
        }
    });
    Ok((sender, reader))
}
