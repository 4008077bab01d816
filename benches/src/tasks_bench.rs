//! Slow-path benchmark (issues 6 and 35): sustained submit-to-completion
//! rate of durable tasks, on one Redis and, in the same run, on Redis Clusters.
//!
//! ```sh
//! cargo run --release -p agent-reach-benches --bin tasks-bench -- --tasks 20000
//! # the same on one Redis, then a 3-shard and a 1-shard Redis Cluster:
//! cargo run --release -p agent-reach-benches --bin tasks-bench -- --tasks 60000 --cluster-shards 3,1
//! ```
//!
//! One process runs a registry (embedded store), a router with the slow path
//! on a real Redis (testkit), and two SDK agents; the load generator submits
//! tasks over HTTP and waits until the router has finished them all. Prints
//! the submit rate, the end-to-end rate, Redis' CPU per task and the verdict
//! against the target (≥ 5,000 tasks/s end to end on this machine, on one
//! Redis). `--cluster-shards` runs the same stack again on each Redis
//! Cluster listed (that many primaries, no replicas and no persistence, like
//! the single Redis), one after the other, and prints them side by side.
//!
//! `--smoke` (CI): the same stacks (one Redis, then a 3-shard cluster), 200
//! tasks from 8 submitters through 16 router workers; the numbers without a
//! verdict.

#[path = "support.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use futures::StreamExt;
use serde_json::json;
use support::{token, EchoStack, Run, Threads};

const ACL: &str = "version: 1\npermissions:\n  - caller: bench\n    allow: [bench.*]\nproviders:\n  - agent: bench_agent\n    provides: [bench.*]\n";

#[derive(Debug, Parser)]
#[command(about = "Durable task throughput: submit over HTTP, deliver through the router, record in Redis.")]
struct Args {
    /// Tasks to submit.
    #[arg(long, default_value_t = 20_000)]
    tasks: usize,
    /// Concurrent submissions.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Deliveries the router runs at once.
    #[arg(long, default_value_t = 128)]
    workers: usize,
    /// Also run on a Redis Cluster of each of these shard counts (comma-separated), after one Redis.
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    cluster_shards: Vec<usize>,
    /// A smoke run (CI): every stack and comparison of the bench for a few
    /// seconds on tiny sizes (the flags it adds are printed first), no warm-ups;
    /// prints the numbers, no verdict.
    #[arg(long)]
    smoke: bool,
}

/// The smoke run's sizes: `--smoke` runs the bench with these flags.
const SMOKE: &[&str] = &["--tasks=200", "--concurrency=8", "--workers=16", "--cluster-shards=3"];

fn finished(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| line.starts_with("agent_reach_tasks_finished_total{"))
        .filter_map(|line| line.rsplit_once(' ').and_then(|(_, value)| value.parse::<f64>().ok()))
        .sum::<f64>() as u64
}

fn main() -> anyhow::Result<()> {
    support::main(&[], SMOKE, Threads::PerCore, bench)
}

/// The Redis a run keeps its tasks in: killed on drop.
enum Store {
    Single(agent_reach_testkit::Redis),
    Cluster(agent_reach_testkit::RedisCluster),
}

impl Store {
    fn start(shards: Option<usize>) -> Self {
        match shards {
            None => Self::Single(agent_reach_testkit::Redis::start()),
            Some(primaries) => Self::Cluster(agent_reach_testkit::RedisCluster::start_shaped(
                agent_reach_testkit::ClusterShape {
                    primaries,
                    replicas: 0,
                    append_only: false,
                },
            )),
        }
    }

    fn url(&self) -> String {
        match self {
            Self::Single(redis) => redis.url(),
            Self::Cluster(cluster) => cluster.url(),
        }
    }

    fn pids(&self) -> Vec<u32> {
        match self {
            Self::Single(redis) => redis.pid().into_iter().collect(),
            Self::Cluster(cluster) => cluster.pids(),
        }
    }

    fn name(&self) -> String {
        match self {
            Self::Single(_) => "one Redis".to_string(),
            Self::Cluster(cluster) => format!("Redis Cluster, {} shard(s)", cluster.pids().len()),
        }
    }
}

/// What one run measured.
struct Measured {
    store: String,
    submitted_per_s: f64,
    end_to_end_per_s: f64,
    /// CPU time of every Redis node together, per task.
    redis_cpu_per_task: Duration,
    /// The busiest node's share of that time (1.0 on one Redis).
    busiest_node_share: f64,
}

async fn bench(args: Args, run: Run) -> anyhow::Result<()> {
    run.announce("tasks-bench");
    let mut runs = vec![measure(&args, Store::start(None)).await?];
    for shards in &args.cluster_shards {
        if *shards == 0 {
            bail!("--cluster-shards takes shard counts of 1 or more");
        }
        runs.push(measure(&args, Store::start(Some(*shards))).await?);
    }
    println!();
    println!("| store | submitted/s | end to end/s | Redis CPU per task | busiest node's share |");
    println!("|---|---|---|---|---|");
    for measured in &runs {
        println!(
            "| {} | {:.0} | {:.0} | {:.1} µs | {:.0} % |",
            measured.store,
            measured.submitted_per_s,
            measured.end_to_end_per_s,
            measured.redis_cpu_per_task.as_secs_f64() * 1e6,
            measured.busiest_node_share * 100.0
        );
    }
    // The verdict, in a judged run only (the target is one Redis').
    if run.is_judged() {
        println!();
        println!(
            "target: >= 5,000 tasks/s end to end on one Redis: {}",
            if runs[0].end_to_end_per_s >= 5000.0 {
                "MET"
            } else {
                "NOT MET"
            }
        );
    }
    Ok(())
}

async fn measure(args: &Args, store: Store) -> anyhow::Result<Measured> {
    let echo = EchoStack::start(ACL, store.url(), args.workers).await?;
    let router_url = echo.router.clone();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let caller = token("bench")?;
    echo.wait_for_agents(&client, &caller).await?;

    println!();
    println!(
        "tasks-bench: {} tasks, {} concurrent submitters, {} router workers, {} at {}",
        args.tasks,
        args.concurrency,
        args.workers,
        store.name(),
        store.url()
    );
    let redis_pids = store.pids();
    let redis_cpu_before = redis_pids
        .iter()
        .map(|pid| support::cpu_seconds(*pid))
        .collect::<anyhow::Result<Vec<f64>>>()?;
    let started = Instant::now();
    let caller = Arc::new(caller);
    let submitted = futures::stream::iter(0..args.tasks)
        .map(|index| {
            let (client, url, caller) = (client.clone(), router_url.clone(), caller.clone());
            async move {
                let response = client
                    .post(format!("{url}/v1/tasks"))
                    .bearer_auth(caller.as_str())
                    .json(
                        &json!({"capability": "bench.echo", "request_id": format!("bench-{index}"),
                                  "payload": {"n": index}}),
                    )
                    .send()
                    .await?;
                if response.status() != 202 {
                    bail!("submission answered {}: {}", response.status(), response.text().await?);
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency)
        .collect::<Vec<_>>()
        .await;
    for result in submitted {
        result?;
    }
    let submit_time = started.elapsed();
    let metrics_url = format!("{router_url}/metrics");
    let done_by = Instant::now() + Duration::from_secs(600);
    loop {
        let metrics = client.get(&metrics_url).send().await?.text().await?;
        if finished(&metrics) >= args.tasks as u64 {
            break;
        }
        if Instant::now() > done_by {
            bail!(
                "only {} of {} tasks finished in 10 minutes",
                finished(&metrics),
                args.tasks
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let total = started.elapsed();
    let redis_cpu = redis_pids
        .iter()
        .zip(&redis_cpu_before)
        .map(|(pid, before)| Ok(support::cpu_seconds(*pid)? - before))
        .collect::<anyhow::Result<Vec<f64>>>()?;
    let metrics = client.get(&metrics_url).send().await?.text().await?;
    let succeeded = metrics
        .lines()
        .find_map(|line| line.strip_prefix("agent_reach_tasks_finished_total{outcome=\"succeeded\"} "))
        .unwrap_or("0")
        .to_string();
    let rate = args.tasks as f64 / total.as_secs_f64();
    let submitted_per_s = args.tasks as f64 / submit_time.as_secs_f64();
    let redis_total: f64 = redis_cpu.iter().sum();
    let busiest = redis_cpu.iter().copied().fold(0.0, f64::max);
    println!(
        "  submitted          {submitted_per_s:>8.0} tasks/s ({:.1} s, each stored durably before its 202)",
        submit_time.as_secs_f64()
    );
    println!(
        "  end to end         {rate:>8.0} tasks/s ({:.1} s for all {} to finish; {succeeded} succeeded)",
        total.as_secs_f64(),
        args.tasks
    );
    println!(
        "  Redis CPU          {:.1} µs per task over {} node(s) (per node: {})",
        redis_total * 1e6 / args.tasks as f64,
        redis_cpu.len(),
        redis_cpu
            .iter()
            .map(|seconds| format!("{:.1} s", seconds))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for agent in echo.agents {
        agent.shutdown().await;
    }
    let store_name = store.name();
    drop(store);
    let _ = echo.files.dir.close().context("removing the temp dir");
    Ok(Measured {
        store: store_name,
        submitted_per_s,
        end_to_end_per_s: rate,
        redis_cpu_per_task: Duration::from_secs_f64(redis_total / args.tasks as f64),
        busiest_node_share: if redis_total > 0.0 { busiest / redis_total } else { 0.0 },
    })
}
