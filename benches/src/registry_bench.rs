//! Registry benchmark (issue 2): N agents registered and heartbeating through
//! one registry on one etcd on this machine.
//!
//! ```sh
//! cargo run --release -p agent-reach-benches --bin registry-bench -- --agents 10000
//! ```
//!
//! Starts a real etcd (testkit) and the registry as a child process (this
//! binary re-executed), so registry and etcd CPU are measured apart from the
//! load generator. Prints registration rate, sustained heartbeat rate, CPU of
//! each, Resolve p50/p99, lost leases, and the verdict against the target
//! (10,000 live agents, registry CPU below one core, no lease lost).
//!
//! `--smoke` (CI): the same registry and etcd, 200 agents on 10
//! capabilities with 3 s leases, heartbeating for 3 s; the numbers without
//! a verdict.

#[path = "support.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_proto::registry as pb;
use agent_reach_proto::registry::registry_client::RegistryClient;
use anyhow::Context;
use clap::Parser;
use futures::StreamExt;
use support::{cpu_seconds, start_registry, Files, Run, Threads, REGISTRY};
use tokio::sync::mpsc;
use tonic::transport::Channel;

#[derive(Debug, Parser)]
#[command(about = "Registry benchmark: N agents registered and heartbeating through one registry on one etcd.")]
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
    /// gRPC keep-alive streams the agents' heartbeats are spread over.
    #[arg(long, default_value_t = 8)]
    streams: usize,
    /// Distinct capabilities (agents are spread over them).
    #[arg(long, default_value_t = 100)]
    capabilities: usize,
    /// Resolve calls per second during the heartbeat phase.
    #[arg(long, default_value_t = 200)]
    resolve_rate: u64,
    /// A smoke run (CI): every stack and comparison of the bench for a few
    /// seconds on tiny sizes (the flags it adds are printed first), no warm-ups;
    /// prints the numbers, no verdict.
    #[arg(long)]
    smoke: bool,
}

/// The smoke run's sizes: `--smoke` runs the bench with these flags.
const SMOKE: &[&str] = &["--agents=200", "--ttl-s=3", "--duration-s=3", "--capabilities=10"];

struct CpuMeter {
    pid: u32,
    start_cpu: f64,
    start: Instant,
}

impl CpuMeter {
    fn start(pid: u32) -> anyhow::Result<Self> {
        Ok(Self {
            pid,
            start_cpu: cpu_seconds(pid)?,
            start: Instant::now(),
        })
    }

    /// Average cores used since `start`.
    fn cores(&self) -> anyhow::Result<f64> {
        Ok((cpu_seconds(self.pid)? - self.start_cpu) / self.start.elapsed().as_secs_f64())
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

fn main() -> anyhow::Result<()> {
    support::main(&[REGISTRY], SMOKE, Threads::PerCore, bench)
}

async fn bench(args: Args, run: Run) -> anyhow::Result<()> {
    let files = Files::write("version: 1\nproviders:\n  - agent: bench_agent\n    provides: [bench.*]\n")?;
    run.announce("registry-bench");
    println!("starting etcd and the registry ...");
    let etcd = agent_reach_testkit::Etcd::start();
    let etcd_pid = etcd.pid().context("etcd pid")?;
    // A child process, so its CPU and etcd's are measured apart from the load generator's.
    let registry = start_registry(&files, &etcd.endpoint(), &[]).await?;
    let registry_pid = registry.pid();
    let base = registry.url.clone();
    let token = support::token("bench_agent")?;
    let channel = Channel::from_shared(base.clone())?.connect().await?;
    let client = RegistryClient::new(channel);

    // === Phase 1: registration ===
    println!(
        "registering {} agents ({} concurrent) ...",
        args.agents, args.concurrency
    );
    let registry_cpu = CpuMeter::start(registry_pid)?;
    let etcd_cpu = CpuMeter::start(etcd_pid)?;
    let started = Instant::now();
    let leases: Vec<(String, i64)> = futures::stream::iter(0..args.agents)
        .map(|index| {
            let mut client = client.clone();
            let token = token.clone();
            let capabilities = args.capabilities;
            let ttl_s = args.ttl_s;
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
                let answer = client.register(authed(request, &token)?).await?.into_inner();
                anyhow::Ok((agent_id, answer.lease_id))
            }
        })
        .buffer_unordered(args.concurrency)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let registration_time = started.elapsed();
    let registration_rate = args.agents as f64 / registration_time.as_secs_f64();
    let registration_registry_cpu = registry_cpu.cores()?;
    let registration_etcd_cpu = etcd_cpu.cores()?;

    // === Phase 2: sustained heartbeats + resolves ===
    let interval = Duration::from_secs(u64::from(args.ttl_s.max(3) / 3));
    println!(
        "heartbeating every {:?} over {} streams for {} s, resolving at {}/s ...",
        interval, args.streams, args.duration_s, args.resolve_rate
    );
    let ok = Arc::new(AtomicU64::new(0));
    let expired = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let registry_cpu = CpuMeter::start(registry_pid)?;
    let etcd_cpu = CpuMeter::start(etcd_pid)?;
    let phase_end = Instant::now() + Duration::from_secs(args.duration_s);
    let mut tasks = Vec::new();
    let per_stream = leases.len().div_ceil(args.streams.max(1));
    for chunk in leases.chunks(per_stream.max(1)) {
        let chunk = chunk.to_vec();
        let mut client = client.clone();
        let token = token.clone();
        let (ok, expired, failed) = (ok.clone(), expired.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            let (sender, receiver) = mpsc::channel(4096);
            let mut answers = client
                .keep_alive(authed(tokio_stream::wrappers::ReceiverStream::new(receiver), &token)?)
                .await?
                .into_inner();
            let reader = tokio::spawn(async move {
                while let Some(Ok(answer)) = answers.next().await {
                    match answer.error {
                        None => ok.fetch_add(1, Ordering::Relaxed),
                        Some(error) if error.code == "LEASE_EXPIRED" => expired.fetch_add(1, Ordering::Relaxed),
                        Some(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            });
            // Spread this stream's agents evenly over the heartbeat interval.
            let gap = interval / u32::try_from(chunk.len().max(1))?;
            let mut ticker = tokio::time::interval(gap);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            'outer: loop {
                for (agent_id, lease_id) in &chunk {
                    ticker.tick().await;
                    if Instant::now() >= phase_end {
                        break 'outer;
                    }
                    let heartbeat = pb::KeepAliveRequest {
                        agent_id: agent_id.clone(),
                        lease_id: *lease_id,
                        ..Default::default()
                    };
                    if sender.send(heartbeat).await.is_err() {
                        break 'outer;
                    }
                }
            }
            drop(sender);
            let _ = tokio::time::timeout(Duration::from_secs(10), reader).await;
            anyhow::Ok(())
        }));
    }
    let resolver = {
        let mut client = client.clone();
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
    for task in tasks {
        task.await??;
    }
    let latencies = resolver.await??;
    let heartbeat_registry_cpu = registry_cpu.cores()?;
    let heartbeat_etcd_cpu = etcd_cpu.cores()?;
    let heartbeat_rate = ok.load(Ordering::Relaxed) as f64 / args.duration_s as f64;

    let mut client = client.clone();
    // Every page of the listing (one answer would outgrow a gRPC message).
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
        live += page.agents.len();
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let lost = args.agents.saturating_sub(live);
    let expired = expired.load(Ordering::Relaxed);

    println!();
    println!(
        "registry bench: {} agents, ttl {} s, 1 registry, 1 etcd, {} cores",
        args.agents,
        args.ttl_s,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("  registration       {registration_rate:>10.0} /s   ({:.1} s)   registry CPU {registration_registry_cpu:.2} cores   etcd CPU {registration_etcd_cpu:.2} cores", registration_time.as_secs_f64());
    println!(
        "  heartbeats         {heartbeat_rate:>10.0} /s   (expected {:.0} /s)   registry CPU {heartbeat_registry_cpu:.2} cores   etcd CPU {heartbeat_etcd_cpu:.2} cores",
        args.agents as f64 / interval.as_secs_f64()
    );
    println!(
        "  heartbeat errors   {} lease expired, {} other",
        expired,
        failed.load(Ordering::Relaxed)
    );
    println!(
        "  resolve            p50 {:?}   p99 {:?}   ({} calls)",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.len()
    );
    println!("  live agents        {live} of {} ({lost} lost)", args.agents);
    println!();
    let cpu_ok = heartbeat_registry_cpu < 1.0;
    let leases_ok = lost == 0 && expired == 0;
    // The verdict, in a judged run only.
    if run.is_judged() {
        println!(
            "target: {} live agents with registry CPU below one core and no lease lost: {} (CPU {}, leases {})",
            args.agents,
            if cpu_ok && leases_ok { "MET" } else { "NOT MET" },
            if cpu_ok { "ok" } else { "over" },
            if leases_ok { "ok" } else { "lost" }
        );
    }
    Ok(())
}
