//! Streaming and protocol benchmark (issue 24): the router's streamed invoke
//! against nginx proxying the same server-sent-events agent with buffering
//! off, and A2A `SendMessage` against `/v1/invoke` on the same agent.
//!
//! ```sh
//! cargo run --release -p agent-reach-benches --bin protocols-bench
//! ```
//!
//! Starts a real etcd (testkit); the registry and the router run as child
//! processes (this binary re-executed), the agents in this process, nginx
//! wrk and h2load from the distribution's packages (`scripts/setup.sh`). Targets,
//! each judged on its median of `--rounds` interleaved rounds:
//! - time to first event at one stream (sequential streams, the three
//!   targets taking turns stream by stream for 3 × `--duration-s`): p50
//!   directly, through the router and through nginx; the router's added p50
//!   (minus the direct one) must be ≤ nginx's;
//! - events/s at `--streams` (32) concurrent streams, each stream
//!   `--events` (100) events the agent writes as fast as it can, a stream
//!   counted once it ended with every event: the router's must be ≥ nginx's;
//! - wrk at 32 connections: A2A `SendMessage` (JSON-RPC, a DataPart) and
//!   the same message over the REST binding (`POST …/v1/message:send`), and
//!   h2load keeping 32 calls in flight (4 connections of 8 streams, h2c, as a
//!   gRPC client multiplexes its channel; `--h2-streams`) sending it over the gRPC
//!   binding (`lf.a2a.v1.A2AService/SendMessage`), must each reach ≥ 0.9 ×
//!   the req/s of `/v1/invoke` on the same JSON agent, each side's rate the
//!   mean of three windows taken in turn with the others'. A control, no
//!   verdict: `/v1/invoke` over h2c by h2load, the gRPC side's client.
//!
//! `--smoke` (CI): the same stack and every measurement against every
//! target, one round of 1 s without warm-ups on 4 streams of 10 events and 4
//! wrk connections; the numbers without a verdict.

#[path = "support.rs"]
mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use http_body_util::BodyExt;
use serde_json::json;
use support::{
    answers_ok, connect, free_addr, median, nodelay, on_own_runtime, quantile, register, spawn_router,
    start_json_agent, start_registry, token, wait_for, Files, Instance, RouterOptions, Run, Sender, TerminatedGuard,
    Threads, Wrk, REGISTRY, ROUTER,
};

const STREAMING: &str = "bench.tokens";
const JSON_CAPABILITY: &str = "bench.echo";
const CALLER: &str = "bench_caller";
/// Alternating wrk windows of each side per round (A2A against `/v1/invoke`).
const WRK_WINDOWS: u64 = 3;

#[derive(Debug, Clone, Parser)]
#[command(
    about = "Streamed invoke vs nginx (SSE, buffering off); A2A SendMessage (JSON-RPC, REST, gRPC) vs /v1/invoke."
)]
struct Args {
    /// Seconds each measurement lasts.
    #[arg(long, default_value_t = 6)]
    duration_s: u64,
    /// Interleaved rounds; each target is judged on its median round.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Concurrent streams of the events/s measurement.
    #[arg(long, default_value_t = 32)]
    streams: usize,
    /// Events per stream.
    #[arg(long, default_value_t = 100)]
    events: usize,
    /// Request threads of the router (`--threads`) and nginx's worker processes alike (0: one per core).
    #[arg(long, default_value_t = 0)]
    proxy_threads: usize,
    /// wrk connections of the A2A-vs-invoke measurement (calls in flight).
    #[arg(long, default_value_t = 32)]
    connections: u32,
    /// Concurrent streams h2load keeps on each HTTP/2 connection (gRPC and
    /// its h2c control): `--connections` / this many connections, so as many
    /// calls in flight as wrk keeps. gRPC clients multiplex a channel's calls
    /// on one connection; 1 measures HTTP/2 as if it were HTTP/1.1.
    #[arg(long, default_value_t = 8)]
    h2_streams: u32,
    /// Run only these measurements (for profiling one of them; a verdict
    /// needs all three, the default).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Measure::FirstEvent, Measure::Events, Measure::A2a])]
    only: Vec<Measure>,
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
    "--streams=4",
    "--events=10",
    "--connections=4",
];

/// The bench's three measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Measure {
    /// Time to first event over sequential streams.
    FirstEvent,
    /// Events/s over concurrent streams.
    Events,
    /// A2A `SendMessage` (JSON-RPC, REST, gRPC) against `/v1/invoke` (wrk, h2load).
    A2a,
}

// === Agents ===

/// The streaming agent: `events` events, each written as its own body chunk
/// as fast as the connection takes them, the first one at once.
async fn start_streaming_agent(events: usize) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let handler = move |body: axum::body::Bytes| async move {
        let _ = body.len();
        let chunks = futures::stream::iter((0..events).map(|index| {
            Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(format!(
                "data: {{\"token\":\"tok{index}\",\"index\":{index}}}\n\n"
            )))
        }));
        (
            [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
            axum::body::Body::from_stream(chunks),
        )
    };
    let app = axum::Router::new().route("/invoke", axum::routing::post(handler));
    tokio::spawn(async move { axum::serve(nodelay(listener), app).await });
    Ok(addr)
}

// === nginx ===

/// nginx as the issue sets it: a reverse proxy to the SSE agent with
/// buffering off, keep-alive to the agent, as many workers as the router has threads.
fn start_nginx(dir: &Path, listen: SocketAddr, agent: SocketAddr, workers: usize) -> anyhow::Result<TerminatedGuard> {
    let root = dir.join("nginx");
    std::fs::create_dir_all(root.join("logs"))?;
    let config = format!(
        "daemon off;\nworker_processes {workers};\npid {root}/nginx.pid;\nerror_log {root}/logs/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 10000000;\n  keepalive_timeout 300s;\n  client_body_temp_path {root}/body;\n  proxy_temp_path {root}/proxy;\n  \
         fastcgi_temp_path {root}/fastcgi;\n  uwsgi_temp_path {root}/uwsgi;\n  scgi_temp_path {root}/scgi;\n  \
         upstream agent {{ server {agent}; keepalive 128; keepalive_requests 10000000; keepalive_timeout 300s; }}\n  \
         server {{\n    listen {listen};\n    location / {{\n      proxy_pass http://agent;\n      \
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n      \
         proxy_cache off;\n    }}\n  }}\n}}\n",
        root = root.display()
    );
    let path = root.join("nginx.conf");
    std::fs::write(&path, config)?;
    let flags = [
        "-p".to_string(),
        support::path_arg(&root),
        "-e".into(),
        support::path_arg(&root.join("logs/error.log")),
        "-c".into(),
        support::path_arg(&path),
    ];
    Ok(TerminatedGuard(support::spawn_program("nginx", "nginx", &flags)?))
}

// === The SSE client ===

/// One stream target: where to POST, and with which headers and body.
#[derive(Clone)]
struct Target {
    name: &'static str,
    addr: SocketAddr,
    path: &'static str,
    token: Option<String>,
    body: bytes::Bytes,
    /// Events the caller sees beyond the agent's (the router's `event: result`).
    extra_events: usize,
}

/// Opens one stream and reads it to the end: the time to its first complete
/// event and the events it carried (event delimiters counted across chunks).
async fn one_stream(sender: &mut Sender, target: &Target) -> anyhow::Result<(Duration, usize)> {
    sender.ready().await?;
    let mut request = http::Request::post(target.path)
        .header(http::header::HOST, "bench")
        .header(http::header::ACCEPT, "text/event-stream")
        .header(http::header::CONTENT_TYPE, "application/json");
    if let Some(token) = &target.token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let started = Instant::now();
    let response = sender
        .send_request(request.body(http_body_util::Full::new(target.body.clone()))?)
        .await?;
    if !response.status().is_success() {
        bail!("{} answered {}", target.name, response.status());
    }
    let mut body = response.into_body();
    let (mut events, mut first, mut last) = (0usize, None, 0u8);
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let Some(data) = frame.data_ref() else { continue };
        for &byte in data.iter() {
            if byte == b'\n' && last == b'\n' {
                events += 1;
                first.get_or_insert_with(|| started.elapsed());
            }
            last = byte;
        }
    }
    let first = first.context("a stream without events")?;
    Ok((first, events.saturating_sub(target.extra_events)))
}

/// [`one_stream`], on a new connection if the target closed the kept-alive one
/// (a proxy's limit of requests per connection).
async fn stream_reconnecting(sender: &mut Sender, target: &Target) -> anyhow::Result<(Duration, usize)> {
    if sender.is_closed() {
        *sender = connect(target.addr).await?;
    }
    match one_stream(sender, target).await {
        Err(_) if sender.is_closed() => {
            *sender = connect(target.addr).await?;
            one_stream(sender, target).await
        }
        other => other,
    }
}

/// Times to first event of each target over sequential streams (sorted),
/// one connection per target, the targets taking turns stream by stream (the
/// box's speed drifts over seconds; streams in turn see the same drift), in
/// `targets`' order.
async fn first_event_times(targets: Vec<Target>, duration: Duration) -> anyhow::Result<Vec<Vec<Duration>>> {
    let mut senders = Vec::with_capacity(targets.len());
    for target in &targets {
        senders.push(connect(target.addr).await?);
    }
    let mut times = vec![Vec::new(); targets.len()];
    let until = Instant::now() + duration;
    while Instant::now() < until {
        for ((target, sender), times) in targets.iter().zip(&mut senders).zip(&mut times) {
            times.push(stream_reconnecting(sender, target).await?.0);
        }
    }
    for times in &mut times {
        times.sort();
    }
    Ok(times)
}

/// Events/s over `streams` concurrent streams (each on its own kept-alive
/// connection), counting complete streams only.
async fn events_per_s(target: &Target, streams: usize, events: usize, duration: Duration) -> anyhow::Result<f64> {
    let started = Instant::now();
    let until = started + duration;
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let target = target.clone();
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(target.addr).await?;
            let mut complete = 0usize;
            while Instant::now() < until {
                let (_, seen) = stream_reconnecting(&mut sender, &target).await?;
                if seen < events {
                    bail!("{}: a stream ended after {seen} of {events} events", target.name);
                }
                complete += 1;
            }
            Ok::<_, anyhow::Error>(complete)
        }));
    }
    let mut complete = 0;
    for task in tasks {
        complete += task.await??;
    }
    Ok((complete * events) as f64 / started.elapsed().as_secs_f64())
}

// === wrk, h2load ===

/// A gRPC request body as h2load sends it from a file: the message framed
/// (uncompressed, its length in 4 bytes big-endian).
fn grpc_frame(message: &impl prost::Message) -> Vec<u8> {
    let encoded = message.encode_to_vec();
    let mut framed = Vec::with_capacity(5 + encoded.len());
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(encoded.len()).unwrap_or(u32::MAX).to_be_bytes());
    framed.extend_from_slice(&encoded);
    framed
}

/// h2load's req/s for `requests` (`connections` of `streams` concurrent
/// streams each, as many in flight as wrk's connections keep). Every request must end in a
/// 2xx (a gRPC error is a 200 too: the bench checks one call's status first).
/// `grpc`: gRPC's headers, else a JSON body's.
fn h2load_requests_per_s(
    body: &Path,
    url: &str,
    token: &str,
    grpc: bool,
    (connections, streams): (u32, u32),
    duration_s: u64,
) -> anyhow::Result<f64> {
    let headers: &[&str] = if grpc {
        &[
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "-H",
            "a2a-version: 1.0",
        ]
    } else {
        &["-H", "content-type: application/json"]
    };
    let output = std::process::Command::new(agent_reach_testkit::find_binary("h2load", "nghttp2-client"))
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-m{streams}"),
            &format!("-D{duration_s}"),
        ])
        .arg("-d")
        .arg(body)
        .args(headers)
        .args(["-H", &format!("authorization: Bearer {token}")])
        .arg(url)
        .output()
        .context("running h2load (apt-get install nghttp2-client)")?;
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let rate = text
        .lines()
        .find_map(|line| line.strip_prefix("finished in "))
        .and_then(|line| line.split(", ").nth(1))
        .and_then(|rate| rate.strip_suffix(" req/s"))
        .and_then(|rate| rate.trim().parse::<f64>().ok())
        .with_context(|| format!("h2load printed no rate: {text}"))?;
    let failed = text
        .lines()
        .find(|line| line.starts_with("requests:"))
        .is_some_and(|line| !line.contains(" 0 failed, 0 errored, 0 timeout"));
    let non_2xx = text
        .lines()
        .find(|line| line.starts_with("status codes:"))
        .is_some_and(|line| !line.contains(" 0 3xx, 0 4xx, 0 5xx"));
    if failed || non_2xx {
        bail!("h2load saw errors against {url}: {text}");
    }
    Ok(rate)
}

fn wrk_requests_per_s(script: &Path, url: &str, connections: u32, duration_s: u64) -> anyhow::Result<f64> {
    let output = Wrk {
        script,
        url,
        threads: 1,
        connections,
        duration_s,
    }
    .run()?;
    if !output.errors.is_empty() {
        bail!("wrk saw errors against {url}: {}", output.errors);
    }
    Ok(output.requests_per_s)
}

fn main() -> anyhow::Result<()> {
    support::main(&[REGISTRY, ROUTER], SMOKE, Threads::Two, bench)
}

async fn bench(args: Args, run: Run) -> anyhow::Result<()> {
    let etcd = agent_reach_testkit::Etcd::start();
    let files = Files::write(&support::caller_acl(CALLER, "\"bench.*\""))?;
    let registry = start_registry(&files, &etcd.endpoint(), &[]).await?;
    let client = reqwest::Client::new();

    let agent_token = token("bench_agent")?;
    let sse_agent = start_streaming_agent(args.events).await?;
    let json_agent = start_json_agent().await?;
    for (id, addr, capability) in [
        ("bench_sse-0", sse_agent, STREAMING),
        ("bench_json-0", json_agent, JSON_CAPABILITY),
    ] {
        let instance = Instance {
            id,
            name: "bench_agent",
            endpoint: format!("http://{addr}/invoke"),
            capability,
            weight: 1,
        };
        register(&client, &registry.url, &agent_token, instance).await?;
    }

    let mut router_process = spawn_router(
        &files,
        &registry.url,
        RouterOptions {
            threads: args.proxy_threads,
            ..RouterOptions::default()
        },
    )?;
    let router_addr = router_process.addr;
    let token = token(CALLER)?;
    let invoke_body = json!({ "capability": JSON_CAPABILITY, "payload": { "order_id": "SO-2024001" } }).to_string();
    let router_invoke = format!("{}/v1/invoke", router_process.url);
    router_process
        .wait_until("router with both agents", Duration::from_secs(20), async || {
            let stream = json!({ "capability": STREAMING, "payload": { "order_id": "SO-1" } }).to_string();
            let mut ready = true;
            for (body, accept) in [(invoke_body.clone(), "application/json"), (stream, "text/event-stream")] {
                let request = client
                    .post(&router_invoke)
                    .bearer_auth(&token)
                    .header("accept", accept)
                    .body(body);
                ready &= answers_ok(request).await;
            }
            ready
        })
        .await?;

    let workers = match args.proxy_threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        threads => threads,
    };
    let nginx_addr = free_addr();
    let _nginx = start_nginx(files.path(), nginx_addr, sse_agent, workers)?;
    wait_for("nginx", Duration::from_secs(10), async || {
        answers_ok(client.post(format!("http://{nginx_addr}/invoke")).body("{}")).await
    })
    .await?;

    let stream_envelope =
        bytes::Bytes::from(json!({ "capability": STREAMING, "payload": { "order_id": "SO-2024001" } }).to_string());
    let targets = vec![
        Target {
            name: "direct agent",
            addr: sse_agent,
            path: "/invoke",
            token: None,
            body: stream_envelope.clone(),
            extra_events: 0,
        },
        Target {
            name: "router",
            addr: router_addr,
            path: "/v1/invoke",
            token: Some(token.clone()),
            body: stream_envelope.clone(),
            extra_events: 1,
        },
        Target {
            name: "nginx",
            addr: nginx_addr,
            path: "/invoke",
            token: None,
            body: stream_envelope,
            extra_events: 0,
        },
    ];
    let send_body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": { "message": { "messageId": "m-1", "role": "ROLE_USER", "parts": [{ "data": { "order_id": "SO-2024001" } }] } }
    })
    .to_string();
    let a2a_url = format!("{}/a2a/{JSON_CAPABILITY}", router_process.url);
    let check = client
        .post(&a2a_url)
        .bearer_auth(&token)
        .header("a2a-version", "1.0")
        .body(send_body.clone())
        .send()
        .await?
        .text()
        .await?;
    if !check.contains("\"result\"") {
        bail!("A2A SendMessage failed: {check}");
    }
    // The same message over the REST binding (the request's params as the body).
    let rest_body = json!({
        "message": { "messageId": "m-1", "role": "ROLE_USER", "parts": [{ "data": { "order_id": "SO-2024001" } }] }
    })
    .to_string();
    let rest_url = format!("{}/a2a/{JSON_CAPABILITY}/v1/message:send", router_process.url);
    let rest_check = client
        .post(&rest_url)
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(rest_body.clone())
        .send()
        .await?
        .text()
        .await?;
    if !rest_check.contains("\"message\"") {
        bail!("REST message:send failed: {rest_check}");
    }
    // The same message over the gRPC binding (the agent is the request's `tenant`).
    let grpc_request = agent_reach_proto::a2a::SendMessageRequest {
        tenant: JSON_CAPABILITY.to_string(),
        message: Some(agent_reach_proto::a2a::Message {
            message_id: "m-1".to_string(),
            role: agent_reach_proto::a2a::Role::User as i32,
            parts: vec![agent_reach_proto::a2a::Part {
                content: Some(agent_reach_proto::a2a::part::Content::Data(prost_types::Value {
                    kind: Some(prost_types::value::Kind::StructValue(prost_types::Struct {
                        fields: [(
                            "order_id".to_string(),
                            prost_types::Value {
                                kind: Some(prost_types::value::Kind::StringValue("SO-2024001".to_string())),
                            },
                        )]
                        .into(),
                    })),
                })),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let grpc_url = format!("{}/lf.a2a.v1.A2AService/SendMessage", router_process.url);
    {
        let channel = tonic::transport::Endpoint::from_shared(router_process.url.clone())?
            .connect()
            .await?;
        let mut grpc_client = agent_reach_proto::a2a::a2a_service_client::A2aServiceClient::new(channel);
        let mut request = tonic::Request::new(grpc_request.clone());
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse()?);
        let answered = grpc_client
            .send_message(request)
            .await
            .context("gRPC SendMessage failed")?;
        if answered.into_inner().payload.is_none() {
            bail!("gRPC SendMessage answered nothing");
        }
    }
    let grpc_body = files.write_bytes("grpc.bin", &grpc_frame(&grpc_request))?;
    let invoke_script = support::wrk_post_script(&files, "invoke.lua", &invoke_body, &token)?;
    // `/v1/invoke` as h2load sends it (h2c): the same client as gRPC's, a control.
    let invoke_file = files.write_bytes("invoke.json", invoke_body.as_bytes())?;
    let a2a_script = support::wrk_post_script(&files, "a2a.lua", &send_body, &token)?;
    let rest_script = support::wrk_post_script(&files, "rest.lua", &rest_body, &token)?;

    let duration = Duration::from_secs(args.duration_s);
    run.announce("protocols-bench");
    println!(
        "protocols-bench: {} s per measurement, {} round(s), {} streams of {} events, {} cores, proxies with {workers} thread(s)",
        args.duration_s,
        args.rounds,
        args.streams,
        args.events,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    println!("router: authentication (HS256), ACL and schema validation on, an assertion signed per call; nginx: proxy_buffering off\n");
    println!(
        "{:<14} {:>6} {:>26} {:>10} {:>14}",
        "target", "round", "first event p50 (p25-p75)", "streams", "events/s"
    );
    let mut first: std::collections::HashMap<&str, Vec<f64>> = Default::default();
    let mut rates: std::collections::HashMap<&str, Vec<f64>> = Default::default();
    let (mut invoke_rates, mut a2a_rates, mut rest_rates, mut grpc_rates, mut invoke_h2_rates) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let measuring = |measure| args.only.contains(&measure);
    let h2_streams = args.h2_streams.clamp(1, args.connections.max(1));
    let h2 = (args.connections.div_ceil(h2_streams), h2_streams);
    for round in 1..=args.rounds {
        // The first events, all targets in turn (as long in all as the three
        // measured one after the other would be).
        let mut firsts = vec![None; targets.len()];
        if measuring(Measure::FirstEvent) {
            if let Some(warm_up) = run.warm_up(Duration::from_secs(1)) {
                let _ = on_own_runtime(first_event_times(targets.clone(), warm_up)).await?;
            }
            let times = on_own_runtime(first_event_times(targets.clone(), duration * targets.len() as u32)).await?;
            firsts = times.into_iter().map(Some).collect();
        }
        for (target, times) in targets.iter().zip(firsts) {
            let mut rate = None;
            if measuring(Measure::Events) {
                // A short warm-up opens connections and fills pools.
                if let Some(warm_up) = run.warm_up(Duration::from_secs(1)) {
                    let _ = events_per_s(target, args.streams, args.events, warm_up).await?;
                }
                rate = Some(events_per_s(target, args.streams, args.events, duration).await?);
            }
            let micros = |q| {
                times
                    .as_ref()
                    .map_or(0.0, |times: &Vec<Duration>| quantile(times, q).as_secs_f64() * 1e6)
            };
            let first_event = format!("{:.0}us ({:.0}-{:.0})", micros(0.5), micros(0.25), micros(0.75));
            println!(
                "{:<14} {round:>6} {first_event:>26} {:>10} {:>14.0}",
                target.name,
                times.as_ref().map_or(0, Vec::len),
                rate.unwrap_or(0.0)
            );
            if times.is_some() {
                first.entry(target.name).or_default().push(micros(0.5));
            }
            if let Some(rate) = rate {
                rates.entry(target.name).or_default().push(rate);
            }
        }
        if !measuring(Measure::A2a) {
            continue;
        }
        // Alternating windows (the box's speed drifts over seconds; a
        // window of each, in turn, sees the same drift).
        if let Some(warm_up) = run.warm_up(Duration::from_secs(1)) {
            let _ = wrk_requests_per_s(&invoke_script, &router_invoke, args.connections, warm_up.as_secs());
            let _ = wrk_requests_per_s(&a2a_script, &a2a_url, args.connections, warm_up.as_secs());
            let _ = wrk_requests_per_s(&rest_script, &rest_url, args.connections, warm_up.as_secs());
            let _ = h2load_requests_per_s(&grpc_body, &grpc_url, &token, true, h2, warm_up.as_secs());
            let _ = h2load_requests_per_s(&invoke_file, &router_invoke, &token, false, h2, warm_up.as_secs());
        }
        let windows = WRK_WINDOWS.min(args.duration_s.max(1));
        let window_s = (args.duration_s / windows).max(1);
        let (mut invoke, mut a2a, mut rest, mut grpc, mut invoke_h2) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for _ in 0..windows {
            invoke += wrk_requests_per_s(&invoke_script, &router_invoke, args.connections, window_s)? / windows as f64;
            a2a += wrk_requests_per_s(&a2a_script, &a2a_url, args.connections, window_s)? / windows as f64;
            rest += wrk_requests_per_s(&rest_script, &rest_url, args.connections, window_s)? / windows as f64;
            grpc += h2load_requests_per_s(&grpc_body, &grpc_url, &token, true, h2, window_s)? / windows as f64;
            invoke_h2 +=
                h2load_requests_per_s(&invoke_file, &router_invoke, &token, false, h2, window_s)? / windows as f64;
        }
        println!(
            "{:<14} {round:>6} /v1/invoke {invoke:.0} req/s, A2A SendMessage {a2a:.0} req/s ({:.2}x), REST message:send {rest:.0} req/s ({:.2}x), gRPC SendMessage {grpc:.0} req/s ({:.2}x; h2load's /v1/invoke over h2c {invoke_h2:.0} req/s, gRPC {:.2}x of it), {} conns (h2: {} of {} streams)",
            "router",
            a2a / invoke,
            rest / invoke,
            grpc / invoke,
            grpc / invoke_h2,
            args.connections,
            h2.0,
            h2.1
        );
        invoke_h2_rates.push(invoke_h2);
        invoke_rates.push(invoke);
        a2a_rates.push(a2a);
        rest_rates.push(rest);
        grpc_rates.push(grpc);
    }
    println!("\nmedian of {} round(s):", args.rounds);
    let mut p50 = |name: &str| median(first.get_mut(name).map_or(&mut [][..], Vec::as_mut_slice));
    let (direct, router, nginx) = (p50("direct agent"), p50("router"), p50("nginx"));
    let (router_added, nginx_added) = (router - direct, nginx - direct);
    if measuring(Measure::FirstEvent) {
        println!(
        "time to first event p50: direct {direct:.0}us, router {router:.0}us (+{router_added:.0}us), nginx {nginx:.0}us (+{nginx_added:.0}us){}",
        run.verdict(router_added <= nginx_added, (" -> MET", " -> NOT MET"))
        );
    }
    let mut rate = |name: &str| median(rates.get_mut(name).map_or(&mut [][..], Vec::as_mut_slice));
    let (direct_rate, router_rate, nginx_rate) = (rate("direct agent"), rate("router"), rate("nginx"));
    if measuring(Measure::Events) {
        println!(
        "events/s at {} streams: direct {direct_rate:.0}, router {router_rate:.0}, nginx {nginx_rate:.0} ({:+.1} %){}",
        args.streams,
        (router_rate / nginx_rate - 1.0) * 100.0,
        run.verdict(router_rate >= nginx_rate, (" -> MET", " -> NOT MET"))
        );
    }
    let (invoke, a2a, rest, grpc, invoke_h2) = (
        median(&mut invoke_rates),
        median(&mut a2a_rates),
        median(&mut rest_rates),
        median(&mut grpc_rates),
        median(&mut invoke_h2_rates),
    );
    if measuring(Measure::A2a) {
        println!(
            "A2A SendMessage {a2a:.0} req/s vs /v1/invoke {invoke:.0} req/s at {} conns ({:.2}x){}",
            args.connections,
            a2a / invoke,
            run.verdict(a2a >= 0.9 * invoke, (" -> MET", " -> NOT MET"))
        );
        println!(
            "A2A REST message:send {rest:.0} req/s vs /v1/invoke {invoke:.0} req/s at {} conns ({:.2}x){}",
            args.connections,
            rest / invoke,
            run.verdict(rest >= 0.9 * invoke, (" -> MET", " -> NOT MET"))
        );
        println!(
            "A2A gRPC SendMessage {grpc:.0} req/s vs /v1/invoke {invoke:.0} req/s at {} conns ({:.2}x){}",
            args.connections,
            grpc / invoke,
            run.verdict(grpc >= 0.9 * invoke, (" -> MET", " -> NOT MET"))
        );
        println!(
            "  control: /v1/invoke over h2c by h2load (gRPC's client) {invoke_h2:.0} req/s; gRPC SendMessage {:.2}x of it",
            grpc / invoke_h2
        );
    }
    drop(etcd);
    Ok(())
}
