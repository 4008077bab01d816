//! Noisy-neighbour benchmark (issue 25): one registry and one router serving
//! a tenant map; tenant A floods at twice its quota while tenant B runs a
//! steady load. B's p99 with A flooding must stay within 10 % of B's p99
//! alone, in the same run.
//!
//! ```sh
//! cargo run --release -p agent-reach-benches --bin tenants-bench
//! ```
//!
//! Starts a real etcd (testkit); the registry and the router run as child
//! processes (this binary re-executed) with the same `--tenant-map`: `team-a`
//! with a quota of `--a-quota` requests/s, `team-b` without one. Each tenant
//! has its own JSON agent, registered with its own token under the same agent
//! name and capability. Loads are open-loop (requests sent on a schedule; a
//! request sent late because the previous answer on its connection came back
//! after it was due is measured from when it was due, so a stalled router is
//! not hidden by a client that waited): B at `--b-rate` over
//! `--b-connections` connections; A at `--a-rate` (default twice its quota)
//! over `--a-connections`. Per `--rounds` interleaved rounds: B alone for
//! `--duration-s`, then B with A flooding for as long. Verdict on the median
//! round's p99s: flood ≤ 1.10 × alone.

/// mimalloc, as in the `agent-reach` binary (see router-bench).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "support.rs"]
mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use http_body_util::BodyExt;
use serde_json::json;
use support::{free_addr, median, quantile, register, spawn_self, start_json_agent, wait_for};

const SECRET: &str = "bench-secret-bench-secret-bench-secret-000000";
const SERVE_REGISTRY: &str = "__serve-registry";
const SERVE_ROUTER: &str = "__serve-router";
const CAPABILITY: &str = "bench.echo";
const CALLER: &str = "bench_caller";

#[derive(Debug, Clone, Parser)]
#[command(about = "Tenant A floods at twice its quota; tenant B's p99 must stay within 10 % of its p99 alone.")]
struct Args {
    /// Seconds each measurement lasts.
    #[arg(long, default_value_t = 8)]
    duration_s: u64,
    /// Interleaved rounds (B alone, then B with A flooding); judged on the median round.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Tenant A's quota, requests/s (the tenant map's `rate_per_s`).
    #[arg(long, default_value_t = 1000.0)]
    a_quota: f64,
    /// Tenant A's offered load, requests/s (default: twice its quota).
    #[arg(long)]
    a_rate: Option<f64>,
    #[arg(long, default_value_t = 32)]
    a_connections: usize,
    /// Tenant B's steady load, requests/s.
    #[arg(long, default_value_t = 500.0)]
    b_rate: f64,
    #[arg(long, default_value_t = 16)]
    b_connections: usize,
    /// The router's request threads (`--threads`; 0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

#[derive(Debug, Parser)]
struct ServeRegistry {
    #[command(flatten)]
    registry: agent_reach_registry::RegistryArgs,
}

#[derive(Debug, Parser)]
struct ServeRouter {
    #[command(flatten)]
    router: agent_reach_router::RouterArgs,
}

fn main() -> anyhow::Result<()> {
    let mut argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(SERVE_REGISTRY) {
        argv.remove(1);
        let serve = ServeRegistry::parse_from(argv);
        let runtime = tokio::runtime::Runtime::new()?;
        return runtime.block_on(agent_reach_registry::run(serve.registry, std::future::pending()));
    }
    if argv.get(1).map(String::as_str) == Some(SERVE_ROUTER) {
        argv.remove(1);
        let serve = ServeRouter::parse_from(argv);
        let runtime = tokio::runtime::Runtime::new()?;
        return runtime.block_on(agent_reach_router::run(serve.router, std::future::pending()));
    }
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench(args))
}

// === Open-loop load ===

/// One tenant's load: who, how fast, over how many connections.
#[derive(Clone)]
struct Load {
    addr: SocketAddr,
    authorization: String,
    body: bytes::Bytes,
    rate: f64,
    connections: usize,
}

#[derive(Default)]
struct Outcome {
    /// Latencies of the answered-200 calls, from when each was due.
    latencies: Vec<Duration>,
    ok: u64,
    limited: u64,
    other: u64,
}

impl Outcome {
    fn merge(&mut self, other: Outcome) {
        self.latencies.extend(other.latencies);
        self.ok += other.ok;
        self.limited += other.limited;
        self.other += other.other;
    }
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

async fn connect(addr: SocketAddr) -> anyhow::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// `load` for `duration`: each connection sends its share on a fixed
/// schedule, staggered; a request due while the previous one is still out
/// goes as soon as it is back (its wait counts in its latency).
async fn open_loop(load: &Load, duration: Duration) -> anyhow::Result<Outcome> {
    let started = Instant::now() + Duration::from_millis(20);
    let end = started + duration;
    let period = Duration::from_secs_f64(load.connections as f64 / load.rate);
    let mut workers = Vec::new();
    for index in 0..load.connections {
        let load = load.clone();
        let first = started + period.mul_f64(index as f64 / load.connections as f64);
        workers.push(tokio::spawn(async move {
            let mut sender = connect(load.addr).await?;
            let mut outcome = Outcome::default();
            let mut due = first;
            while due < end {
                tokio::time::sleep_until(due.into()).await;
                sender.ready().await?;
                // From when it is sent: the timer wakes up to a millisecond late, which
                // is the client's, not the router's. A schedule that slipped (the last
                // answer came back after this one was due) counts from when it was due.
                let sent = Instant::now();
                let from = if sent.duration_since(due) > period / 2 {
                    due
                } else {
                    sent
                };
                let request = http::Request::post("/v1/invoke")
                    .header(http::header::HOST, "bench")
                    .header(http::header::AUTHORIZATION, &load.authorization)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(http_body_util::Full::new(load.body.clone()))?;
                let response = sender.send_request(request).await?;
                let status = response.status();
                response.into_body().collect().await?;
                match status.as_u16() {
                    200 => {
                        outcome.ok += 1;
                        outcome.latencies.push(from.elapsed());
                    }
                    429 => outcome.limited += 1,
                    _ => outcome.other += 1,
                }
                due += period;
            }
            anyhow::Ok(outcome)
        }));
    }
    let mut total = Outcome::default();
    for worker in workers {
        total.merge(worker.await??);
    }
    total.latencies.sort();
    Ok(total)
}

/// `load` for `duration` on a thread and runtime of its own, so that neither
/// tenant's client (nor the agents) queues behind the other's tasks in this
/// process: what B measures is the router, not its neighbour's load generator.
fn open_loop_alone(load: &Load, duration: Duration) -> std::thread::JoinHandle<anyhow::Result<Outcome>> {
    let load = load.clone();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(open_loop(&load, duration))
    })
}

/// A JSON agent on a thread and runtime of its own (see [`open_loop_alone`]).
fn agent_alone() -> anyhow::Result<SocketAddr> {
    let (sent, addr) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => runtime,
            Err(error) => {
                let _ = sent.send(Err(anyhow::Error::new(error)));
                return;
            }
        };
        runtime.block_on(async move {
            let _ = sent.send(start_json_agent().await);
            std::future::pending::<()>().await
        });
    });
    addr.recv()?
}

fn joined(handle: std::thread::JoinHandle<anyhow::Result<Outcome>>) -> anyhow::Result<Outcome> {
    handle.join().map_err(|_| anyhow::anyhow!("a load thread panicked"))?
}

// === The run ===

async fn bench(args: Args) -> anyhow::Result<()> {
    let a_rate = args.a_rate.unwrap_or(args.a_quota * 2.0);
    let etcd = agent_reach_testkit::Etcd::start();
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("hs256.secret");
    std::fs::write(&secret, SECRET)?;
    let assertion_key = dir.path().join("assertion.pem");
    std::fs::write(
        &assertion_key,
        agent_reach_access::AssertionKey::generate()
            .map_err(anyhow::Error::msg)?
            .1,
    )?;
    let acl = dir.path().join("acl.yaml");
    std::fs::write(
        &acl,
        format!(
            "version: 1\npermissions:\n  - caller: {CALLER}\n    allow: [\"bench.*\"]\nproviders:\n  - agent: bench_agent\n    provides: [\"bench.*\"]\n"
        ),
    )?;
    let map = dir.path().join("tenants.yaml");
    std::fs::write(
        &map,
        format!(
            "version: 1\ntenants:\n  default: {{}}\n  team-a:\n    quotas: {{rate_per_s: {}}}\n  team-b: {{}}\n",
            args.a_quota
        ),
    )?;
    let path_text = |path: &PathBuf| path.to_string_lossy().to_string();
    let common = |listen: SocketAddr| {
        vec![
            "--listen".to_string(),
            listen.to_string(),
            "--acl".into(),
            path_text(&acl),
            "--auth-hs256-secret-file".into(),
            path_text(&secret),
            "--tenant-map".into(),
            path_text(&map),
        ]
    };

    let registry_addr = free_addr();
    let mut registry_args = common(registry_addr);
    registry_args.extend(["--etcd".to_string(), etcd.endpoint()]);
    let _registry = spawn_self(SERVE_REGISTRY, &registry_args)?;
    let registry = format!("http://{registry_addr}");
    let client = reqwest::Client::new();
    wait_for("registry", Duration::from_secs(20), async || {
        client
            .get(format!("{registry}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await?;

    let token_of = |name: &str, tenant: &str| {
        agent_reach_access::token::issue_hs256_for(name, Some(tenant), SECRET.as_bytes(), Duration::from_secs(86_400))
            .map_err(anyhow::Error::msg)
    };
    for tenant in ["team-a", "team-b"] {
        let agent = agent_alone()?;
        register(
            &client,
            &registry,
            &token_of("bench_agent", tenant)?,
            ("bench_json-0", "bench_agent"),
            format!("http://{agent}/invoke"),
            CAPABILITY,
        )
        .await?;
    }

    let router_addr = free_addr();
    let mut router_args = common(router_addr);
    router_args.extend([
        "--registry".to_string(),
        registry.clone(),
        "--assertion-key".into(),
        path_text(&assertion_key),
        "--threads".into(),
        args.threads.to_string(),
    ]);
    let _router = spawn_self(SERVE_ROUTER, &router_args)?;
    let body: bytes::Bytes = json!({ "capability": CAPABILITY, "payload": { "order_id": "SO-2024001" } })
        .to_string()
        .into();
    let load_of = |tenant: &str, rate: f64, connections: usize| -> anyhow::Result<Load> {
        Ok(Load {
            addr: router_addr,
            authorization: format!("Bearer {}", token_of(CALLER, tenant)?),
            body: body.clone(),
            rate,
            connections,
        })
    };
    let a = load_of("team-a", a_rate, args.a_connections)?;
    let b = load_of("team-b", args.b_rate, args.b_connections)?;
    let router_invoke = format!("http://{router_addr}/v1/invoke");
    wait_for(
        "router with both tenants' agents",
        Duration::from_secs(30),
        async || {
            let mut ready = true;
            for load in [&a, &b] {
                ready &= client
                    .post(&router_invoke)
                    .header("authorization", &load.authorization)
                    .header("content-type", "application/json")
                    .body(load.body.clone())
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
            }
            ready
        },
    )
    .await?;
    // Warm-up: connections, pools, caches.
    joined(open_loop_alone(&b, Duration::from_secs(2)))?;

    let duration = Duration::from_secs(args.duration_s);
    println!(
        "tenants-bench: A quota {} req/s, A offers {a_rate} req/s over {} connections; B steady {} req/s over {} connections; {} s per measurement",
        args.a_quota, args.a_connections, args.b_rate, args.b_connections, args.duration_s
    );
    println!(
        "{:<6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "round", "B alone p50", "B alone p99", "B+A p50", "B+A p99", "A ok/s", "A 429/s"
    );
    let mut alone_p99s = Vec::new();
    let mut flood_p99s = Vec::new();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for round in 1..=args.rounds {
        let alone = joined(open_loop_alone(&b, duration))?;
        let (flooded, flood) = (open_loop_alone(&b, duration), open_loop_alone(&a, duration));
        let (flooded, flood) = (joined(flooded)?, joined(flood)?);
        anyhow::ensure!(
            alone.other == 0 && flooded.other == 0 && alone.limited == 0 && flooded.limited == 0,
            "tenant B had failed calls (alone: {} failed, {} limited; with A: {} failed, {} limited)",
            alone.other,
            alone.limited,
            flooded.other,
            flooded.limited
        );
        let seconds = duration.as_secs_f64();
        println!(
            "{:<6} {:>10.0}µs {:>10.0}µs {:>10.0}µs {:>10.0}µs {:>12.0} {:>12.0}",
            round,
            us(quantile(&alone.latencies, 0.5)),
            us(quantile(&alone.latencies, 0.99)),
            us(quantile(&flooded.latencies, 0.5)),
            us(quantile(&flooded.latencies, 0.99)),
            flood.ok as f64 / seconds,
            flood.limited as f64 / seconds,
        );
        alone_p99s.push(us(quantile(&alone.latencies, 0.99)));
        flood_p99s.push(us(quantile(&flooded.latencies, 0.99)));
    }
    let alone = median(&mut alone_p99s);
    let flood = median(&mut flood_p99s);
    let ratio = flood / alone;
    println!(
        "median p99: B alone {alone:.0} µs, B with A flooding {flood:.0} µs ({:+.1} %): {}",
        (ratio - 1.0) * 100.0,
        if ratio <= 1.10 {
            "met (within 10 %)"
        } else {
            "NOT met (over 10 %)"
        }
    );
    Ok(())
}
