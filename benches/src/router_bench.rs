//! Router benchmark (issue 3, acceptance point 11): three real HTTP agents
//! with weights 3:2:1, called (a) directly, (b) through the router with
//! authentication, ACL and schema validation on, and (c) through HAProxy with
//! the same weights, by wrk at 32 connections and at 1 connection.
//!
//! ```sh
//! cargo run --release -p agent-reach-benches --bin router-bench
//! ```
//!
//! Starts a real etcd (testkit); the registry and the router run as child
//! processes (this binary re-executed), the agents in this process, HAProxy
//! and wrk from the distribution's packages (`scripts/setup.sh`). Prints
//! req/s and p50/p99 per target and the verdict against the target: router
//! req/s ≥ HAProxy's, and the router's added p50 at 1 connection ≤ HAProxy's.
//! Each target is measured in `--rounds` interleaved rounds (default 3, 5 with
//! `--tracing` or `--trail`) and judged on its median round.
//!
//! `--tracing` (issue 7, acceptance point 5) adds two routers in the same run,
//! set up as the `agent-reach router` binary sets itself up (logs at `info`):
//! one with tracing disabled (no OTLP endpoint) and one exporting spans over
//! OTLP to an in-process receiver at 10 % sampling. Verdicts: disabled costs
//! nothing measurable against the bare router; enabled keeps ≥ 90 % of the
//! disabled router's req/s.
//! `ROUTER_BENCH_SAMPLING=1.0` (any ratio) replaces the 10 %, to see what one
//! sampled request costs.
//!
//! `--tls` (issue 20) puts the agents behind TLS (certificates from a CA made
//! for the run): the router verifies them against that CA
//! (`--agent-ca-file`), HAProxy reaches the same agents with `ssl verify
//! required` and the same CA, and the router still signs an assertion per
//! call. Same verdicts.
//!
//! `--policy POLICY` (issue 38): the same router also measured with every
//! call naming `target_policy: POLICY` (e.g. `adaptive`, `p2c_ewma`,
//! `plugin:cheapest`), round by round beside the default policy; verdict:
//! its req/s at least 0.95× the default's (the ratio is printed).
//!
//! `--trail` (issue 37): two more routers on one Redis (the slow path on in
//! both), the trail off and on (payloads off: the bench's acl.yaml names
//! none), measured round by round beside the others, the two in turns of
//! 2-s windows within a round (off first in odd rounds, on first in even
//! ones; each round's ratio printed); verdict:
//! the trail's req/s at least 0.95× the other's (the ratio of the medians is
//! printed, and the records the trail wrote and dropped).
//!
//! `--chains` (issue 39): the same router also measured with every call made
//! within a delegation chain that carries a budget: the caller (`bench_agent`)
//! presents an upstream assertion signed with the router's key (the chain
//! `bench_caller > bench_agent`, a budget claim), the router verifies it,
//! checks its owner in the snapshot, applies a `subjects:` rule and charges
//! the chain's ledger, and each forwarded assertion carries the chain. Round
//! by round beside the plain calls; verdict: ≥ 0.95× their req/s.
//!
//! `--smoke` (CI, with or without `--tls`, `--tracing`, `--policy`, `--trail` and `--chains`): the same stack,
//! every target at every connection count, one round of 1 s without
//! warm-ups; the numbers without a verdict.

#[path = "support.rs"]
mod support;
#[path = "router_bench/trail.rs"]
mod trail;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use clap::Parser;
use serde_json::json;
use support::{
    answers_ok, cpu_seconds, free_addr, register, spawn_router, start_json_agent, start_json_agent_tls, start_registry,
    token, wait_for, ChildGuard, Files, Instance, RouterOptions, Run, Threads, Wrk, WrkOutput, BENCH_TELEMETRY,
    REGISTRY, ROUTER,
};

const CAPABILITY: &str = "bench.echo";
const CALLER: &str = "bench_caller";

#[derive(Debug, Clone, Parser)]
#[command(about = "Router benchmark: direct agent vs router vs HAProxy, wrk at 32 and 1 connections.")]
struct Args {
    /// Seconds each wrk run lasts.
    #[arg(long, default_value_t = 6)]
    duration_s: u64,
    /// Rounds: every target is measured this many times, the rounds interleaved,
    /// and judged on its median round (a single run on a shared 2-core box
    /// swings by ±5 %, enough to flip a verdict). Default 3, or 5 with
    /// `--tracing` or `--trail`, whose verdicts compare two routers within a
    /// few per cent.
    #[arg(long)]
    rounds: Option<u32>,
    /// wrk threads.
    #[arg(long, default_value_t = 1)]
    wrk_threads: u32,
    /// Request threads of each proxy: the router's `--threads` and HAProxy's
    /// `nbthread` alike, so neither gets more threads than the other (0: one
    /// per core).
    #[arg(long, default_value_t = 0)]
    router_threads: usize,
    /// Connection counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "32,1")]
    connections: Vec<u32>,
    /// Also measure routers with tracing disabled and with OTLP export at 10 % sampling.
    #[arg(long)]
    tracing: bool,
    /// Agents behind TLS, verified by the router and by HAProxy alike.
    #[arg(long)]
    tls: bool,
    /// Also measure the router with every call naming this `target_policy`
    /// (`adaptive`, `p2c_ewma`, `plugin:cheapest`, ...) against the default policy.
    #[arg(long, value_name = "POLICY")]
    policy: Option<String>,
    /// Also measure two routers on one Redis, the trail off and on (payloads off), and print the ratio.
    #[arg(long)]
    trail: bool,
    /// Also measure the router with every call made within a delegation chain
    /// carrying a budget (an upstream assertion) against plain calls.
    #[arg(long)]
    chains: bool,
    /// A smoke run (CI): every stack and comparison of the bench for a few
    /// seconds on tiny sizes (the flags it adds are printed first), no warm-ups;
    /// prints the numbers, no verdict.
    #[arg(long)]
    smoke: bool,
}

/// The smoke run's sizes: `--smoke` runs the bench with these flags.
const SMOKE: &[&str] = &["--duration-s=1", "--rounds=1"];

// === Agents ===

async fn start_agent(tls: Option<&agent_reach_testkit::pki::CertFiles>) -> anyhow::Result<SocketAddr> {
    match tls {
        None => start_json_agent().await,
        Some(cert) => start_json_agent_tls(cert).await,
    }
}

// === wrk ===

#[derive(Debug, Clone)]
struct WrkResult {
    requests_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    errors: String,
    /// CPU seconds the proxy spent per request (µs), for proxies.
    cpu_per_request_us: Option<f64>,
    /// CPU seconds this process (the three agents, and the span receiver of
    /// `--tracing`) spent per request (µs).
    agents_cpu_per_request_us: f64,
}

fn print_row(name: &str, connections: u32, round: &str, result: &WrkResult) {
    let cpu = result
        .cpu_per_request_us
        .map_or_else(|| "-".to_string(), |us| format!("{us:.1}us"));
    println!(
        "{:<16} {:>6} {:>6} {:>12.0} {:>8.0}us {:>8.0}us {:>14} {:>10.1}us  {}",
        name,
        connections,
        round,
        result.requests_per_s,
        result.p50_us,
        result.p99_us,
        cpu,
        result.agents_cpu_per_request_us,
        result.errors
    );
}

fn run_wrk(script: &Path, url: &str, connections: u32, duration_s: u64, args: &Args) -> anyhow::Result<WrkResult> {
    let output: WrkOutput = Wrk {
        script,
        url,
        threads: args.wrk_threads,
        connections,
        duration_s,
    }
    .run()?;
    Ok(WrkResult {
        requests_per_s: output.requests_per_s,
        p50_us: output.p50_us,
        p99_us: output.p99_us,
        errors: output.errors,
        cpu_per_request_us: None,
        agents_cpu_per_request_us: 0.0,
    })
}

// === HAProxy ===

fn start_haproxy(
    files: &Files,
    listen: SocketAddr,
    agents: &[(SocketAddr, u32)],
    threads: usize,
    ca: Option<&Path>,
) -> anyhow::Result<ChildGuard> {
    // With TLS, HAProxy verifies the agents as the router does: the chain and the name.
    let ssl = ca.map_or(String::new(), |ca| {
        format!(" ssl verify required ca-file {} verifyhost localhost", ca.display())
    });
    let mut servers = String::new();
    for (index, (addr, weight)) in agents.iter().enumerate() {
        servers.push_str(&format!("    server a{index} {addr} weight {weight}{ssl}\n"));
    }
    let config = format!(
        "global\n    maxconn 4000\n    nbthread {threads}\n\ndefaults\n    mode http\n    option http-keep-alive\n    \
         timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\nfrontend fe\n    bind {listen}\n    \
         default_backend be\n\nbackend be\n    balance roundrobin\n    http-reuse always\n{servers}"
    );
    let path = files.write_file("haproxy.cfg", &config)?;
    let child = support::spawn_program(
        "haproxy",
        "haproxy",
        &["-f".into(), support::path_arg(&path), "-db".into()],
    )?;
    Ok(ChildGuard(child))
}

/// The header an agent presents its upstream assertion in (docs/design.md §3.15).
const UPSTREAM_HEADER: &str = "agent-reach-upstream";

/// An upstream assertion as the router gives it to `bench_agent-up` (an
/// instance of `bench_agent` registered for `bench.upstream`, never called):
/// `bench_caller`'s call, signed with the run's key, carrying a budget no
/// run spends (`--chains`).
async fn upstream_assertion(
    files: &Files,
    client: &reqwest::Client,
    registry: &str,
    agent: SocketAddr,
    scheme: &str,
) -> anyhow::Result<String> {
    let instance = Instance {
        id: "bench_agent-up",
        name: "bench_agent",
        endpoint: format!("{scheme}://{agent}/invoke"),
        capability: "bench.upstream",
        weight: 1,
    };
    register(client, registry, &token("bench_agent")?, instance).await?;
    let key = agent_reach_access::AssertionKey::from_pkcs8_pem(&std::fs::read(&files.assertion_key)?)
        .map_err(anyhow::Error::msg)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let claims = agent_reach_access::AssertionClaims {
        iss: agent_reach_access::assertion::DEFAULT_ISSUER.to_string(),
        sub: CALLER.to_string(),
        aud: "bench_agent-up".to_string(),
        cap: "bench.upstream".to_string(),
        tenant: "default".to_string(),
        iat: now,
        exp: now + 86_400,
        budget: Some(agent_reach_access::BudgetClaim {
            id: "bench-chain".to_string(),
            calls_left: Some(i64::MAX / 2),
            cost_left: None,
        }),
        ..Default::default()
    };
    key.sign(&claims).map_err(anyhow::Error::msg)
}

fn main() -> anyhow::Result<()> {
    support::main(&[REGISTRY, ROUTER], SMOKE, Threads::Two, bench)
}

async fn bench(args: Args, run: Run) -> anyhow::Result<()> {
    let etcd = agent_reach_testkit::Etcd::start();
    // `support::caller_acl`, and `bench_agent` calling onwards only on behalf of `bench_caller` (`--chains`).
    let acl = format!(
        "version: 1\npermissions:\n  - caller: {CALLER}\n    allow: [{CAPABILITY}]\n  - caller: bench_agent\n    \
         allow: [{CAPABILITY}]\n    subjects: [{CALLER}]\nproviders:\n  - agent: bench_agent\n    provides: [\"bench.*\"]\n"
    );
    let files = Files::write(&acl)?;
    let registry = start_registry(&files, &etcd.endpoint(), &[]).await?;
    let client = reqwest::Client::new();

    let pki = args.tls.then(|| agent_reach_testkit::pki::Pki::new("router-bench"));
    let agent_cert = pki.as_ref().map(|pki| pki.server("bench_agent"));
    let scheme = if args.tls { "https" } else { "http" };
    let agent_token = token("bench_agent")?;
    let mut agents = Vec::new();
    for (index, weight) in [3u32, 2, 1].into_iter().enumerate() {
        let addr = start_agent(agent_cert.as_ref()).await?;
        let instance = Instance {
            id: &format!("bench_agent-{index}"),
            name: "bench_agent",
            endpoint: format!("{scheme}://{addr}/invoke"),
            capability: CAPABILITY,
            weight,
        };
        register(&client, &registry.url, &agent_token, instance).await?;
        agents.push((addr, weight));
    }
    let agent_ca: Vec<String> = match &pki {
        Some(pki) => vec!["--agent-ca-file".into(), support::path_arg(&pki.ca_file)],
        None => Vec::new(),
    };
    let router_options = || RouterOptions {
        threads: args.router_threads,
        args: &agent_ca,
        env: &[],
    };

    let mut router = spawn_router(&files, &registry.url, router_options())?;
    let token = token(CALLER)?;
    let envelope = json!({ "capability": CAPABILITY, "payload": { "order_id": "SO-2024001" } }).to_string();
    let invoke = |url: &str| client.post(url).bearer_auth(&token).body(envelope.clone());
    let router_url = format!("{}/v1/invoke", router.url);
    router
        .wait_until("router with all three agents", Duration::from_secs(20), async || {
            answers_ok(invoke(&router_url)).await
        })
        .await?;

    let haproxy_addr = free_addr();
    let proxy_threads = match args.router_threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        threads => threads,
    };
    let haproxy = start_haproxy(
        &files,
        haproxy_addr,
        &agents,
        proxy_threads,
        pki.as_ref().map(|pki| pki.ca_file.as_path()),
    )?;
    let haproxy_url = format!("http://{haproxy_addr}/invoke");
    wait_for("haproxy", Duration::from_secs(10), async || {
        answers_ok(client.post(&haproxy_url).body(envelope.clone())).await
    })
    .await?;

    // `--tracing`: the same router, logging as the binary does, without and with OTLP export.
    let mut tracing_routers = Vec::new();
    let mut span_sink = None;
    if args.tracing {
        let sink = tracing_sink::start().await?;
        for (name, otlp) in [
            ("router untraced", None),
            ("router otel 10%", Some(sink.endpoint.clone())),
        ] {
            let mut env = vec![(BENCH_TELEMETRY, "1".to_string())];
            if let Some(endpoint) = otlp {
                env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint));
                env.push(("OTEL_TRACES_SAMPLER", "parentbased_traceidratio".to_string()));
                // The issue's 10 %; other ratios (e.g. 1.0) show what one sampled request costs.
                let ratio = std::env::var("ROUTER_BENCH_SAMPLING").unwrap_or_else(|_| "0.1".to_string());
                env.push(("OTEL_TRACES_SAMPLER_ARG", ratio));
            }
            let mut traced = spawn_router(
                &files,
                &registry.url,
                RouterOptions {
                    env: &env,
                    ..router_options()
                },
            )?;
            let url = format!("{}/v1/invoke", traced.url);
            traced
                .wait_until(name, Duration::from_secs(20), async || answers_ok(invoke(&url)).await)
                .await?;
            tracing_routers.push((name, url, traced));
        }
        span_sink = Some(sink);
    }

    // `--trail`: a Redis, and two routers on it with the trail off and on.
    let (trail_redis, trail_routers) = match args.trail {
        true => {
            let (redis, routers) = trail::start(&files, &registry.url, args.router_threads, &agent_ca, &invoke).await?;
            (Some(redis), routers)
        }
        false => (None, Vec::new()),
    };

    let script = support::wrk_post_script(&files, "post.lua", &envelope, &token)?;
    // `--policy`: the same router, every call naming the policy.
    let policy_target = args.policy.as_ref().map(|policy| format!("router {policy}"));
    let policy_script = match &args.policy {
        Some(policy) => {
            let named =
                json!({ "capability": CAPABILITY, "target_policy": policy, "payload": { "order_id": "SO-2024001" } })
                    .to_string();
            let check = named.clone();
            router
                .wait_until(&format!("router with {policy}"), Duration::from_secs(20), async || {
                    answers_ok(client.post(&router_url).bearer_auth(&token).body(check.clone())).await
                })
                .await?;
            Some(support::wrk_post_script(&files, "policy.lua", &named, &token)?)
        }
        None => None,
    };
    // `--chains`: the same router, every call made by `bench_agent` within a chain carrying a budget.
    let chains_target = args.chains.then_some("router chains");
    let chains_script = match chains_target {
        Some(name) => {
            let upstream = upstream_assertion(&files, &client, &registry.url, agents[0].0, scheme).await?;
            let agent_token = support::token("bench_agent")?;
            let check = envelope.clone();
            router
                .wait_until(name, Duration::from_secs(20), async || {
                    let call = client
                        .post(&router_url)
                        .bearer_auth(&agent_token)
                        .header(UPSTREAM_HEADER, &upstream)
                        .body(check.clone());
                    answers_ok(call).await
                })
                .await?;
            let script = files.write_file(
                "chains.lua",
                &format!(
                    "wrk.method = \"POST\"\nwrk.body = '{envelope}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\n\
                     wrk.headers[\"Authorization\"] = \"Bearer {agent_token}\"\nwrk.headers[\"{UPSTREAM_HEADER}\"] = \"{upstream}\"\n"
                ),
            )?;
            Some(script)
        }
        None => None,
    };
    let mut targets = vec![
        ("direct agent", format!("{scheme}://{}/invoke", agents[0].0), None),
        ("router", router_url.clone(), Some(router.pid())),
    ];
    if let Some(name) = &policy_target {
        targets.push((name.as_str(), router_url.clone(), Some(router.pid())));
    }
    if let Some(name) = chains_target {
        targets.push((name, router_url.clone(), Some(router.pid())));
    }
    targets.push(("haproxy", haproxy_url.clone(), Some(haproxy.pid())));
    for (name, url, traced) in &tracing_routers {
        targets.push((name, url.clone(), Some(traced.pid())));
    }
    for (name, url, router) in &trail_routers {
        targets.push((name, url.clone(), Some(router.pid())));
    }
    run.announce("router-bench");
    println!(
        "router-bench: 3 agents (weights 3:2:1), wrk {} thread(s), {} s per run, {} cores",
        args.wrk_threads,
        args.duration_s,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    println!("router: authentication (HS256), ACL and schema validation on, an assertion signed per call");
    if args.tls {
        println!("agents behind TLS: the router and HAProxy both verify them (chain and name) against the run's CA\n");
    } else {
        println!("agents over plain HTTP\n");
    }
    println!(
        "{:<16} {:>6} {:>6} {:>12} {:>10} {:>10} {:>14} {:>12}  errors",
        "target", "conns", "round", "req/s", "p50", "p99", "proxy CPU/req", "agents CPU/req"
    );
    let round_count = args
        .rounds
        .unwrap_or(if args.tracing || args.trail { 5 } else { 3 })
        .max(1);
    let cpu = |pid: u32| cpu_seconds(pid).unwrap_or(f64::NAN);
    // Every round of every target, then each target's median round.
    let mut rounds: std::collections::HashMap<(String, u32), Vec<WrkResult>> = std::collections::HashMap::new();
    for &connections in &args.connections {
        for round in 1..=round_count {
            // One measurement of a target: wrk for `seconds`, with the CPU its
            // process (and this one, the agents) spent over it.
            let measure = |name: &str, url: &str, pid: Option<&u32>, seconds: u64| -> anyhow::Result<WrkResult> {
                // The policy target is the same router, with its own script.
                let script = match (&policy_target, &policy_script, &chains_script) {
                    (Some(target), Some(policy), _) if target == name => policy,
                    (_, _, Some(chains)) if chains_target == Some(name) => chains,
                    _ => &script,
                };
                let cpu_before = pid.map(|pid| cpu(*pid));
                let agents_before = cpu(std::process::id());
                let mut result = run_wrk(script, url, connections, seconds, &args)?;
                let requests = result.requests_per_s * seconds as f64;
                result.agents_cpu_per_request_us = (cpu(std::process::id()) - agents_before) * 1e6 / requests;
                if let (Some(pid), Some(before)) = (pid, cpu_before) {
                    result.cpu_per_request_us = Some((cpu(*pid) - before) * 1e6 / requests);
                }
                Ok(result)
            };
            let warm_up = |name: &str, url: &str| {
                // A short warm-up fills connection pools.
                if let Some(seconds) = run.warm_up(Duration::from_secs(2)) {
                    let _ = measure(name, url, None, seconds.as_secs());
                }
            };
            // The trail's two routers take turns, off first in odd rounds, on
            // first in even ones: neither always follows the other, so a
            // drift of the box across a round is not charged to one of them.
            let mut pair: Vec<_> = targets.iter().filter(|(name, _, _)| trail::is_trail(name)).collect();
            if round % 2 == 0 {
                pair.reverse();
            }
            for (name, url, pid) in &targets {
                if trail::is_trail(name) {
                    // Both are measured together (`trail::alternate`), in
                    // the trail-off router's place among the targets.
                    if *name != trail::TRAIL_OFF {
                        continue;
                    }
                    for (name, url, _) in &pair {
                        warm_up(name, url);
                    }
                    let results = trail::alternate(args.duration_s, pair.len(), |index, seconds| {
                        let (name, url, pid) = pair[index];
                        measure(name, url, pid.as_ref(), seconds)
                    })?;
                    for ((name, _, _), result) in pair.iter().zip(results) {
                        print_row(name, connections, &round.to_string(), &result);
                        rounds.entry((name.to_string(), connections)).or_default().push(result);
                    }
                    continue;
                }
                warm_up(name, url);
                let result = measure(name, url, pid.as_ref(), args.duration_s)?;
                print_row(name, connections, &round.to_string(), &result);
                rounds.entry((name.to_string(), connections)).or_default().push(result);
            }
        }
    }
    // Each round ran the router and HAProxy back to back, so a pair shares the
    // box's phase: how often the router was ahead says more than one median
    // when the two are close.
    println!();
    for &connections in &args.connections {
        let get = |name: &str| rounds.get(&(name.to_string(), connections));
        if let (Some(router), Some(haproxy)) = (get("router"), get("haproxy")) {
            let pairs: Vec<_> = router.iter().zip(haproxy).collect();
            let ahead = pairs
                .iter()
                .filter(|(router, haproxy)| router.requests_per_s >= haproxy.requests_per_s)
                .count();
            let leaner = pairs
                .iter()
                .filter(|(router, haproxy)| {
                    matches!((router.cpu_per_request_us, haproxy.cpu_per_request_us), (Some(r), Some(h)) if r < h)
                })
                .count();
            let mut ratios: Vec<f64> = pairs
                .iter()
                .map(|(router, haproxy)| router.requests_per_s / haproxy.requests_per_s - 1.0)
                .collect();
            ratios.sort_by(f64::total_cmp);
            println!(
                "{connections:>2} conn, round by round: router req/s >= haproxy's in {ahead} of {} (median {:+.1} %), \
                 less CPU per request in {leaner}",
                pairs.len(),
                ratios[ratios.len() / 2] * 100.0,
            );
        }
    }
    let paired = trail::round_by_round(&rounds, &args.connections);
    let mut results = std::collections::HashMap::new();
    println!("\nmedian of {round_count} round(s):");
    for &connections in &args.connections {
        for (name, _, _) in &targets {
            if let Some(runs) = rounds.get_mut(&(name.to_string(), connections)) {
                runs.sort_by(|a, b| a.requests_per_s.total_cmp(&b.requests_per_s));
                let median = runs[runs.len() / 2].clone();
                print_row(name, connections, "median", &median);
                results.insert((name.to_string(), connections), median);
            }
        }
    }
    println!();
    for &connections in &args.connections {
        let get = |name: &str| results.get(&(name.to_string(), connections));
        if let (Some(direct), Some(router), Some(haproxy)) = (get("direct agent"), get("router"), get("haproxy")) {
            let throughput_ok = router.requests_per_s >= haproxy.requests_per_s;
            println!(
                "{connections:>2} conn: router {:.0} req/s vs haproxy {:.0} req/s ({:+.1} %){}",
                router.requests_per_s,
                haproxy.requests_per_s,
                (router.requests_per_s / haproxy.requests_per_s - 1.0) * 100.0,
                run.verdict(throughput_ok, (" -> MET", " -> NOT MET"))
            );
            let router_added = router.p50_us - direct.p50_us;
            let haproxy_added = haproxy.p50_us - direct.p50_us;
            println!(
                "{connections:>2} conn: added p50: router {router_added:.0}us vs haproxy {haproxy_added:.0}us{}",
                run.verdict(router_added <= haproxy_added, (" -> MET", " -> NOT MET"))
            );
        }
    }
    if let Some(target) = &policy_target {
        for &connections in &args.connections {
            let get = |name: &str| results.get(&(name.to_string(), connections));
            if let (Some(default), Some(named)) = (get("router"), get(target)) {
                let ratio = named.requests_per_s / default.requests_per_s;
                println!(
                    "{connections:>2} conn: {target} {:.0} req/s vs the default policy {:.0} req/s: {ratio:.3}x{}",
                    named.requests_per_s,
                    default.requests_per_s,
                    run.verdict(ratio >= 0.95, (" -> MET (>= 0.95x)", " -> NOT MET (< 0.95x)"))
                );
                if let (Some(named_cpu), Some(default_cpu)) = (named.cpu_per_request_us, default.cpu_per_request_us) {
                    println!(
                        "{connections:>2} conn: router CPU per request: default {default_cpu:.1}us, {target} {named_cpu:.1}us ({:+.2}us)",
                        named_cpu - default_cpu
                    );
                }
            }
        }
    }
    if let Some(target) = chains_target {
        for &connections in &args.connections {
            let get = |name: &str| results.get(&(name.to_string(), connections));
            if let (Some(plain), Some(chained)) = (get("router"), get(target)) {
                let ratio = chained.requests_per_s / plain.requests_per_s;
                println!(
                    "{connections:>2} conn: {target} {:.0} req/s vs plain calls {:.0} req/s: {ratio:.3}x{}",
                    chained.requests_per_s,
                    plain.requests_per_s,
                    run.verdict(ratio >= 0.95, (" -> MET (>= 0.95x)", " -> NOT MET (< 0.95x)"))
                );
                if let (Some(chained_cpu), Some(plain_cpu)) = (chained.cpu_per_request_us, plain.cpu_per_request_us) {
                    println!(
                        "{connections:>2} conn: router CPU per request: plain {plain_cpu:.1}us, chains {chained_cpu:.1}us ({:+.2}us)",
                        chained_cpu - plain_cpu
                    );
                }
            }
        }
    }
    for &connections in &args.connections {
        let get = |name: &str| results.get(&(name.to_string(), connections));
        if let (Some(bare), Some(untraced), Some(traced)) =
            (get("router"), get("router untraced"), get("router otel 10%"))
        {
            let disabled = untraced.requests_per_s / bare.requests_per_s - 1.0;
            let enabled = traced.requests_per_s / untraced.requests_per_s - 1.0;
            println!(
                "{connections:>2} conn: tracing disabled {:.0} req/s vs bare router {:.0} req/s ({:+.1} %){}",
                untraced.requests_per_s,
                bare.requests_per_s,
                disabled * 100.0,
                // wrk run-to-run noise on a shared machine is a few per cent.
                run.verdict(disabled >= -0.03, (" -> MET (within noise)", " -> NOT MET"))
            );
            println!(
                "{connections:>2} conn: tracing at 10 % {:.0} req/s vs disabled {:.0} req/s ({:+.1} %){}",
                traced.requests_per_s,
                untraced.requests_per_s,
                enabled * 100.0,
                run.verdict(enabled >= -0.10, (" -> MET", " -> NOT MET"))
            );
            // Less noisy than req/s on a shared box: what tracing adds to the router's own CPU.
            if let (Some(bare_cpu), Some(untraced_cpu), Some(traced_cpu)) = (
                bare.cpu_per_request_us,
                untraced.cpu_per_request_us,
                traced.cpu_per_request_us,
            ) {
                println!(
                    "{connections:>2} conn: router CPU per request: bare {bare_cpu:.1}us, tracing disabled {untraced_cpu:.1}us, \
                     10 % sampling {traced_cpu:.1}us ({:+.1}us, {:+.1} %)",
                    traced_cpu - untraced_cpu,
                    (traced_cpu / untraced_cpu - 1.0) * 100.0
                );
            }
        }
    }
    if let Some(sink) = &span_sink {
        println!("OTLP receiver got {} spans", sink.spans());
    }
    if let (Some((_, _, trailed)), Some(redis)) = (trail_routers.get(1), &trail_redis) {
        trail::verdict(&results, &paired, &args.connections, &run, &client, &trailed.url, redis).await;
    }
    drop(trail_redis);
    drop(etcd);
    Ok(())
}

/// An OTLP/gRPC trace receiver that counts spans and drops them: the
/// exporting router pays for real export, the bench keeps nothing. It stands
/// for a collector on another machine, so it costs this box as little as it
/// can: an Export request is walked for its span records (resource_spans ->
/// scope_spans -> spans) without decoding them; decoding every span into
/// `ExportTraceServiceRequest` cost the shared box ~0.7 us per routed request
/// at 10 % sampling, charged to the traced router's throughput.
mod tracing_sink {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
    use prost::bytes::{Buf, BufMut};
    use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
    use prost::DecodeError;
    use tonic::codegen::{http, Body, BoxFuture, Service, StdError};

    const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

    pub struct Sink {
        pub endpoint: String,
        count: Arc<AtomicU64>,
    }

    impl Sink {
        pub fn spans(&self) -> u64 {
            self.count.load(Ordering::Relaxed)
        }
    }

    /// An `ExportTraceServiceRequest` read only for how many spans it carries.
    #[derive(Debug, Default)]
    struct SpanCount(u64);

    /// The error for a record longer than what is left of its message.
    // prost 0.14.2 deprecated `DecodeError::new` and gives a hand-written
    // `Message` no other way to build one.
    #[allow(deprecated)]
    fn overrun(what: &'static str) -> DecodeError {
        DecodeError::new(what)
    }

    /// Counts the length-delimited records at `path` (field numbers, outermost
    /// first) in `buf`, skipping everything else. (`dyn`: the nesting would
    /// otherwise instantiate this for ever deeper `Take` types.)
    fn count(mut buf: &mut dyn Buf, path: &[u32]) -> Result<u64, DecodeError> {
        let mut found = 0;
        while buf.has_remaining() {
            let (tag, wire_type) = decode_key(&mut buf)?;
            if tag == path[0] && wire_type == WireType::LengthDelimited {
                let len = decode_varint(&mut buf)? as usize;
                if len > buf.remaining() {
                    return Err(overrun("a record runs past its message"));
                }
                let mut record = (&mut *buf).take(len);
                found += match &path[1..] {
                    [] => 1,
                    inner => count(&mut record, inner)?,
                };
                let rest = record.remaining();
                record.advance(rest);
            } else {
                skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
            }
        }
        Ok(found)
    }

    impl prost::Message for SpanCount {
        fn encode_raw(&self, _: &mut impl BufMut) {
            // Only ever decoded (the receiver's request).
        }

        fn merge_field(
            &mut self,
            tag: u32,
            wire_type: WireType,
            buf: &mut impl Buf,
            ctx: DecodeContext,
        ) -> Result<(), DecodeError> {
            // ExportTraceServiceRequest.resource_spans = 1; ResourceSpans.scope_spans = 2; ScopeSpans.spans = 2.
            if tag == 1 && wire_type == WireType::LengthDelimited {
                let len = decode_varint(buf)? as usize;
                if len > buf.remaining() {
                    return Err(overrun("resource_spans runs past the request"));
                }
                let mut resource = buf.take(len);
                self.0 += count(&mut resource, &[2, 2])?;
                let rest = resource.remaining();
                resource.advance(rest);
                Ok(())
            } else {
                skip_field(wire_type, tag, buf, ctx)
            }
        }

        fn encoded_len(&self) -> usize {
            0
        }

        fn clear(&mut self) {
            self.0 = 0;
        }
    }

    #[derive(Clone)]
    struct Counter(Arc<AtomicU64>);

    impl tonic::server::UnaryService<SpanCount> for Counter {
        type Response = ExportTraceServiceResponse;
        type Future = std::future::Ready<Result<tonic::Response<Self::Response>, tonic::Status>>;

        fn call(&mut self, request: tonic::Request<SpanCount>) -> Self::Future {
            self.0.fetch_add(request.get_ref().0, Ordering::Relaxed);
            std::future::ready(Ok(tonic::Response::new(ExportTraceServiceResponse {
                partial_success: None,
            })))
        }
    }

    impl tonic::server::NamedService for Counter {
        const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
    }

    impl<B> Service<http::Request<B>> for Counter
    where
        B: Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = BoxFuture<Self::Response, Self::Error>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<B>) -> Self::Future {
            let counter = self.clone();
            Box::pin(async move {
                if request.uri().path() != EXPORT_PATH {
                    return Ok(tonic::Status::unimplemented(request.uri().path().to_string()).into_http());
                }
                let codec = tonic_prost::ProstCodec::<ExportTraceServiceResponse, SpanCount>::default();
                Ok(tonic::server::Grpc::new(codec).unary(counter, request).await)
            })
        }
    }

    pub async fn start() -> anyhow::Result<Sink> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let count = Arc::new(AtomicU64::new(0));
        let service = Counter(count.clone());
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            if let Err(error) = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
            {
                eprintln!("OTLP receiver stopped: {error}");
            }
        });
        Ok(Sink { endpoint, count })
    }

    #[cfg(test)]
    mod tests {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
        use prost::Message;

        use super::*;

        #[test]
        fn spans_are_counted_without_decoding_them() {
            let span = |name: &str| Span {
                name: name.to_string(),
                trace_id: vec![1; 16],
                span_id: vec![2; 8],
                ..Default::default()
            };
            let scope = |n: usize| ScopeSpans {
                spans: (0..n).map(|i| span(&format!("s{i}"))).collect(),
                schema_url: "x".to_string(),
                ..Default::default()
            };
            let request = ExportTraceServiceRequest {
                resource_spans: vec![
                    ResourceSpans {
                        scope_spans: vec![scope(3), scope(0), scope(2)],
                        schema_url: "r".to_string(),
                        ..Default::default()
                    },
                    ResourceSpans {
                        scope_spans: vec![scope(4)],
                        ..Default::default()
                    },
                ],
            };
            let bytes = request.encode_to_vec();
            assert_eq!(SpanCount::decode(bytes.as_slice()).unwrap().0, 9);
            assert!(
                SpanCount::decode(&bytes[..bytes.len() - 1]).is_err(),
                "a truncated request is an error"
            );
        }
    }
}
