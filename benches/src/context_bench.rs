//! Context service benchmark (issue 4, acceptance point 8): get and patch
//! throughput through the service against raw `redis-benchmark` HSET/HGETALL
//! on the same Redis, in the same run, with the same number of clients.
//!
//! ```sh
//! cargo run --release -p agent-reach-benches --bin context-bench
//! ```
//!
//! Starts a real Redis (testkit) and the context service in this process
//! (authentication on, HS256), creates one context per client, then for a
//! fixed time each of the 32 clients loops GET (every field) and, in a second
//! phase, PATCH (one field, which runs the full Lua write script), over HTTP
//! and over gRPC. Prints ops/s for each, the raw Redis numbers, and each ratio
//! against the 50 % target.

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_access::AuthConfig;
use agent_reach_context::config::{Settings, StoreChoice};
use agent_reach_context::store::Namespace;
use agent_reach_context::ContextConfig;
use agent_reach_proto::context as pb;
use agent_reach_proto::context::contexts_client::ContextsClient;
use anyhow::{bail, Context};
use clap::Parser;
use tonic::transport::Channel;

const SECRET: &str = "bench-secret-bench-secret-bench-secret-000000";
const ACL: &str = "version: 1\ncontext:\n  - agent: bench\n    read: [\"*\"]\n    write: [\"*\"]\n";

#[derive(Debug, Parser)]
#[command(about = "Context benchmark: get/patch through the service vs raw redis-benchmark HSET/HGETALL.")]
struct Args {
    /// Concurrent clients (service and redis-benchmark alike).
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Seconds per measured phase through the service.
    #[arg(long, default_value_t = 8)]
    duration_s: u64,
    /// Fields per context (each a short JSON string).
    #[arg(long, default_value_t = 8)]
    fields: usize,
    /// Requests per redis-benchmark run.
    #[arg(long, default_value_t = 200_000)]
    redis_requests: u64,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Get,
    Patch,
}

#[derive(Debug, Clone, Copy)]
enum Transport {
    Http,
    Grpc,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let redis = agent_reach_testkit::Redis::start();
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET)?;
    let acl = dir.path().join("acl.yaml");
    std::fs::write(&acl, ACL)?;
    let settings = Settings {
        listen: "127.0.0.1:0".parse()?,
        store: StoreChoice::Redis {
            url: redis.url(),
            namespace: Namespace {
                prefix: "bench".into(),
                tenant: "default".into(),
            },
            timeout: Duration::from_secs(2),
        },
        acl,
        auth: AuthConfig::Hs256SecretFile(secret),
        service: ContextConfig::default(),
    };
    let service = agent_reach_context::build(&settings).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(agent_reach_context::serve(listener, service, std::future::pending()));
    let token = agent_reach_access::token::issue_hs256("bench", SECRET.as_bytes(), Duration::from_secs(3600))
        .map_err(anyhow::Error::msg)?;

    println!(
        "context-bench: {} clients, {} fields per context, {} s per phase, Redis {}",
        args.clients,
        args.fields,
        args.duration_s,
        redis.url()
    );
    let base = format!("http://{addr}");
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.clients)
        .build()?;
    let fields: String = (0..args.fields)
        .map(|index| format!("\"f{index}\":\"value-{index}-0123456789\""))
        .collect::<Vec<_>>()
        .join(",");
    for client in 0..args.clients {
        let response = http
            .post(format!("{base}/v1/contexts"))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(format!("{{\"context_id\":\"bench-{client}\",\"fields\":{{{fields}}}}}"))
            .send()
            .await?;
        if response.status() != 201 {
            bail!("create failed: {} {}", response.status(), response.text().await?);
        }
    }
    let channels: Vec<Channel> = {
        let mut channels = Vec::new();
        // A few HTTP/2 connections, as a real SDK pool would hold.
        for _ in 0..4 {
            channels.push(Channel::from_shared(base.clone())?.connect().await?);
        }
        channels
    };

    let duration = Duration::from_secs(args.duration_s);
    let mut results = Vec::new();
    for op in [Op::Get, Op::Patch] {
        for transport in [Transport::Http, Transport::Grpc] {
            let rate = phase(op, transport, &args, duration, &base, &http, &channels, &token).await?;
            println!("  service {op:?} over {transport:?}: {rate:.0} ops/s");
            results.push((op, transport, rate));
        }
    }

    let port = redis.port().to_string();
    let raw = |command: &[&str]| -> anyhow::Result<f64> {
        let output = Command::new(agent_reach_testkit::find_binary("redis-benchmark", "redis-tools"))
            .args(["-h", "127.0.0.1", "-p", &port, "-c", &args.clients.to_string()])
            .args(["-n", &args.redis_requests.to_string(), "--csv"])
            .args(command)
            .output()
            .context("running redis-benchmark")?;
        let text = String::from_utf8_lossy(&output.stdout);
        // CSV: "test","rps",...; the data line is the last one.
        let line = text.lines().last().unwrap_or_default();
        line.split(',')
            .nth(1)
            .map(|field| field.trim_matches('"'))
            .and_then(|field| field.parse().ok())
            .with_context(|| format!("cannot read redis-benchmark output: {text}"))
    };
    let field_args: Vec<String> = (0..args.fields)
        .flat_map(|index| [format!("f{index}"), format!("\"value-{index}-0123456789\"")])
        .collect();
    let mut hset = vec!["HSET", "bench:raw"];
    hset.extend(field_args.iter().map(String::as_str).take(2));
    let hset_rps = raw(&hset)?;
    let mut fill = vec!["HSET", "bench:raw"];
    fill.extend(field_args.iter().map(String::as_str));
    Command::new(agent_reach_testkit::find_binary("redis-cli", "redis-tools"))
        .args(["-p", &port])
        .args(&fill)
        .output()?;
    let hgetall_rps = raw(&["HGETALL", "bench:raw"])?;
    println!("  raw redis-benchmark HGETALL: {hgetall_rps:.0} ops/s");
    println!("  raw redis-benchmark HSET (one field): {hset_rps:.0} ops/s");
    println!();
    for (op, transport, rate) in results {
        let (raw_name, raw_rps) = match op {
            Op::Get => ("HGETALL", hgetall_rps),
            Op::Patch => ("HSET", hset_rps),
        };
        let ratio = 100.0 * rate / raw_rps;
        let verdict = if ratio >= 50.0 { "meets" } else { "MISSES" };
        println!("  {op:?} over {transport:?}: {ratio:.0} % of raw {raw_name} ({verdict} the 50 % target)");
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn phase(
    op: Op,
    transport: Transport,
    args: &Args,
    duration: Duration,
    base: &str,
    http: &reqwest::Client,
    channels: &[Channel],
    token: &str,
) -> anyhow::Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for client in 0..args.clients {
        let id = format!("bench-{client}");
        let done = done.clone();
        let errors = errors.clone();
        let http = http.clone();
        let url = format!("{base}/v1/contexts/{id}");
        let bearer = format!("Bearer {token}");
        let metadata: tonic::metadata::MetadataValue<tonic::metadata::Ascii> = bearer.parse()?;
        let mut grpc = ContextsClient::new(channels[client % channels.len()].clone());
        tasks.push(tokio::spawn(async move {
            let mut counter = 0u64;
            while Instant::now() < deadline {
                counter += 1;
                let ok = match (op, transport) {
                    (Op::Get, Transport::Http) => http
                        .get(&url)
                        .header("authorization", &bearer)
                        .send()
                        .await
                        .is_ok_and(|response| response.status() == 200),
                    (Op::Patch, Transport::Http) => http
                        .patch(&url)
                        .header("authorization", &bearer)
                        .header("content-type", "application/json")
                        .body(format!("{{\"set\":{{\"f0\":{counter}}}}}"))
                        .send()
                        .await
                        .is_ok_and(|response| response.status() == 200),
                    (Op::Get, Transport::Grpc) => {
                        let mut request = tonic::Request::new(pb::GetRequest {
                            context_id: id.clone(),
                            fields: vec![],
                        });
                        request.metadata_mut().insert("authorization", metadata.clone());
                        grpc.get(request).await.is_ok()
                    }
                    (Op::Patch, Transport::Grpc) => {
                        let mut request = tonic::Request::new(pb::PatchRequest {
                            context_id: id.clone(),
                            set_json: HashMap::from([("f0".to_string(), counter.to_string())]),
                            delete: vec![],
                            if_version: None,
                        });
                        request.metadata_mut().insert("authorization", metadata.clone());
                        grpc.patch(request).await.is_ok()
                    }
                };
                if ok {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    let failed = errors.load(Ordering::Relaxed);
    if failed > 0 {
        bail!("{failed} {op:?} requests over {transport:?} failed");
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}
