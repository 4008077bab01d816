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
//!
//! `--smoke` (CI): the same stack and loads, scaled down (A's quota 100/s,
//! A offering 200/s, B 50/s), one round of 1 s each without warm-up; the
//! numbers without a verdict.

#[path = "support.rs"]
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Parser;
use http_body_util::BodyExt;
use serde_json::json;
use support::{
    answers_ok, connect, median, on_own_runtime, quantile, register, spawn_router, start_json_agent, start_registry,
    tenant_token, Files, Instance, RouterOptions, Run, Threads, REGISTRY, ROUTER,
};

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
    /// A smoke run (CI): every stack and comparison of the bench for a few
    /// seconds on tiny sizes (the flags it adds are printed first), no warm-ups;
    /// prints the numbers, no verdict.
    #[arg(long)]
    smoke: bool,
}

/// The smoke run's sizes: `--smoke` runs the bench with these flags.
const SMOKE: &[&str] = &[
    "--duration-s=1",
    "--rounds=1",
    "--a-quota=100",
    "--a-connections=4",
    "--b-rate=50",
    "--b-connections=2",
];

fn main() -> anyhow::Result<()> {
    support::main(&[REGISTRY, ROUTER], SMOKE, Threads::Two, bench)
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
async fn open_loop_alone(load: &Load, duration: Duration) -> anyhow::Result<Outcome> {
    let load = load.clone();
    on_own_runtime(async move { open_loop(&load, duration).await }).await
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

// === The run ===

async fn bench(args: Args, run: Run) -> anyhow::Result<()> {
    let a_rate = args.a_rate.unwrap_or(args.a_quota * 2.0);
    let etcd = agent_reach_testkit::Etcd::start();
    let files = Files::write(&support::caller_acl(CALLER, "\"bench.*\""))?;
    let map = files.write_file(
        "tenants.yaml",
        &format!(
            "version: 1\ntenants:\n  default: {{}}\n  team-a:\n    quotas: {{rate_per_s: {}}}\n  team-b: {{}}\n",
            args.a_quota
        ),
    )?;
    let tenant_map = ["--tenant-map".to_string(), support::path_arg(&map)];

    let registry = start_registry(&files, &etcd.endpoint(), &tenant_map).await?;
    let client = reqwest::Client::new();
    let token_of = |name: &str, tenant: &str| tenant_token(name, Some(tenant));
    for tenant in ["team-a", "team-b"] {
        let agent = agent_alone()?;
        let instance = Instance {
            id: "bench_json-0",
            name: "bench_agent",
            endpoint: format!("http://{agent}/invoke"),
            capability: CAPABILITY,
            weight: 1,
        };
        register(&client, &registry.url, &token_of("bench_agent", tenant)?, instance).await?;
    }

    let options = RouterOptions {
        threads: args.threads,
        args: &tenant_map,
        ..RouterOptions::default()
    };
    let mut router = spawn_router(&files, &registry.url, options)?;
    let router_addr = router.addr;
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
    let router_invoke = format!("{}/v1/invoke", router.url);
    router
        .wait_until(
            "router with both tenants' agents",
            Duration::from_secs(30),
            async || {
                let mut ready = true;
                for load in [&a, &b] {
                    let request = client
                        .post(&router_invoke)
                        .header("authorization", &load.authorization)
                        .header("content-type", "application/json")
                        .body(load.body.clone());
                    ready &= answers_ok(request).await;
                }
                ready
            },
        )
        .await?;
    // Warm-up: connections, pools, caches.
    if let Some(warm_up) = run.warm_up(Duration::from_secs(2)) {
        open_loop_alone(&b, warm_up).await?;
    }

    let duration = Duration::from_secs(args.duration_s);
    run.announce("tenants-bench");
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
        let alone = open_loop_alone(&b, duration).await?;
        let (flooded, flood) = tokio::join!(open_loop_alone(&b, duration), open_loop_alone(&a, duration));
        let (flooded, flood) = (flooded?, flood?);
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
        "median p99: B alone {alone:.0} µs, B with A flooding {flood:.0} µs ({:+.1} %){}",
        (ratio - 1.0) * 100.0,
        run.verdict(ratio <= 1.10, (": met (within 10 %)", ": NOT met (over 10 %)"))
    );
    Ok(())
}
