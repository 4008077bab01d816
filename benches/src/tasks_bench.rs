//! Slow-path benchmark (issue 6): sustained submit-to-completion rate of
//! durable tasks.
//!
//! ```sh
//! cargo run --release -p agent-reach-benches --bin tasks-bench -- --tasks 20000
//! ```
//!
//! One process runs a registry (embedded store), a router with the slow path
//! on a real Redis (testkit), and two SDK agents; the load generator submits
//! tasks over HTTP and waits until the router has finished them all. Prints
//! the submit rate, the end-to-end rate and the verdict against the target
//! (≥ 5,000 tasks/s end to end on this machine).

/// mimalloc, as in the `agent-reach` binary: under load glibc malloc (with its arena
/// locks) took 15-20 % of the router's and context service's CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_access::AuthConfig;
use agent_reach_sdk::{Agent, Ctx, Handler, HandlerError};
use anyhow::{bail, Context};
use clap::Parser;
use futures::StreamExt;
use serde_json::{json, Value};

const SECRET: &str = "tasks-bench-secret-tasks-bench-secret-0123";
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
}

async fn serve_on_free_port<F, Fut>(serve: F) -> anyhow::Result<SocketAddr>
where
    F: FnOnce(tokio::net::TcpListener) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(listener));
    Ok(addr)
}

fn finished(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| line.starts_with("agent_reach_tasks_finished_total{"))
        .filter_map(|line| line.rsplit_once(' ').and_then(|(_, value)| value.parse::<f64>().ok()))
        .sum::<f64>() as u64
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let redis = agent_reach_testkit::Redis::start();
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET)?;
    let acl = dir.path().join("acl.yaml");
    std::fs::write(&acl, ACL)?;
    let any: SocketAddr = "127.0.0.1:0".parse()?;

    let registry = agent_reach_registry::build(&agent_reach_registry::Settings {
        listen: any,
        store: agent_reach_registry::StoreChoice::Embedded,
        acl: acl.clone(),
        auth: AuthConfig::Hs256SecretFile(secret.clone()),
        service: agent_reach_registry::RegistryConfig::default(),
        listener_tls: None,
    })
    .await?;
    let registry_addr = serve_on_free_port(|listener| async move {
        let _ = agent_reach_registry::serve(listener, registry, std::future::pending()).await;
    })
    .await?;
    let registry_url = format!("http://{registry_addr}");

    let mut settings =
        agent_reach_router::Settings::new(any, registry_url.clone(), AuthConfig::Hs256SecretFile(secret), acl);
    let mut callbacks = agent_reach_task_store::CallbackConfig::new(SECRET.as_bytes().to_vec());
    callbacks.allow_private_targets = true;
    settings.tasks = Some(agent_reach_router::TasksSettings {
        redis: redis.url(),
        store: agent_reach_task_store::StoreConfig::default(),
        callbacks,
        workers: args.workers,
        reclaim_after: Duration::from_secs(120),
        max_task_attempts: 3,
        tag_limits: Vec::new(),
    });
    let router = agent_reach_router::build(&settings).await?;
    let router_addr = serve_on_free_port(|listener| async move {
        let _ = agent_reach_router::serve(listener, router, std::future::pending()).await;
    })
    .await?;
    let router_url = format!("http://{router_addr}");

    let token = |name: &str| {
        agent_reach_access::token::issue_hs256(name, SECRET.as_bytes(), Duration::from_secs(3600))
            .map_err(anyhow::Error::msg)
    };
    let mut agents = Vec::new();
    for index in 0..2 {
        let echo = Handler::new("bench.echo", "1.0.0", |_ctx: Ctx, input: Value| async move {
            Ok::<_, HandlerError>(input)
        });
        let agent = Agent::builder("bench_agent", &format!("bench-{index}"))
            .registry(&registry_url)
            // The router's assertion keys (its JWKS): agents serve only calls it vouched for.
            .router(&router_url)
            .token(token("bench_agent")?)
            .max_concurrency(1024)
            .handler(echo)
            .start()
            .await?;
        agent.mark_ready();
        agents.push(agent);
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let caller = token("bench")?;
    // Wait until the router can route to both agents.
    let ready_by = Instant::now() + Duration::from_secs(30);
    loop {
        let probe: Value = client
            .post(format!("{router_url}/v1/broadcast"))
            .bearer_auth(&caller)
            .json(&json!({"capability": "bench.echo", "payload": {}}))
            .send()
            .await?
            .json()
            .await?;
        if probe["outcomes"].as_array().is_some_and(|outcomes| outcomes.len() == 2) {
            break;
        }
        if Instant::now() > ready_by {
            bail!("the router never saw both agents: {probe}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    println!(
        "tasks-bench: {} tasks, {} concurrent submitters, {} router workers, Redis {}",
        args.tasks,
        args.concurrency,
        args.workers,
        redis.url()
    );
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
    let metrics = client.get(&metrics_url).send().await?.text().await?;
    let succeeded = metrics
        .lines()
        .find_map(|line| line.strip_prefix("agent_reach_tasks_finished_total{outcome=\"succeeded\"} "))
        .unwrap_or("0")
        .to_string();
    let rate = args.tasks as f64 / total.as_secs_f64();
    println!(
        "  submitted          {:>8.0} tasks/s ({:.1} s, each stored durably before its 202)",
        args.tasks as f64 / submit_time.as_secs_f64(),
        submit_time.as_secs_f64()
    );
    println!(
        "  end to end         {rate:>8.0} tasks/s ({:.1} s for all {} to finish; {succeeded} succeeded)",
        total.as_secs_f64(),
        args.tasks
    );
    println!();
    println!(
        "target: >= 5,000 tasks/s end to end: {}",
        if rate >= 5000.0 { "MET" } else { "NOT MET" }
    );
    for agent in agents {
        agent.shutdown().await;
    }
    drop(redis);
    let _ = dir.close().context("removing the temp dir");
    Ok(())
}
