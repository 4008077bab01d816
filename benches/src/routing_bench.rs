//! Routing simulation (issue 38): four selection policies, the same
//! scripted agents, the same run.
//!
//! ```sh
//! cargo run --release -p agent-reach-benches --bin routing-bench
//! ```
//!
//! Starts a real etcd (testkit), the registry and the router as child
//! processes (this binary re-executed; the router with
//! `--routing-history-bucket-ms`, time compressed: by default an "hour" of
//! the outcome history is 3 s, a "day" 72 s), and simulated agents on
//! loopback in this process. Three scripts, each a capability of three
//! instances (the scripted one and two plain ones, 5 ms per call, weight 1),
//! each run once per policy (`weighted_round_robin`, `least_connections`,
//! `p2c_ewma`, `adaptive`; twelve capabilities, each with its own agents, so
//! the policies never share an instance), every capability called open-loop
//! at `--rate` calls a second for the whole run:
//!
//! - **window**: the scripted instance answers 503 to 30 % of its calls during
//!   a recurring window, two "hours" every "day" (from the third hour of the
//!   run on); everything else is fine. Measured: failed first attempts in
//!   each day's window. Target: on the last day (the window seen twice
//!   before), `adaptive` has at most half of `weighted_round_robin`'s.
//! - **slow**: the scripted instance takes 50 ms, 10× the others. Target:
//!   `p2c_ewma`'s p99 below `weighted_round_robin`'s.
//! - **recover**: the scripted instance degrades (half its calls 503, five
//!   times slower) for six "hours", then recovers. Measured, from the
//!   agents' own counts of first attempts per second: how long after the
//!   recovery its share of first attempts (over a 3 s window) is back to
//!   80 % of its fair share, a third. Target: every policy within 30 s.
//!
//! Printed per script and policy: calls, success rate, p50/p99 latency (the
//! caller's), wasted attempts (failed attempts per 100 calls) and failed
//! first attempts; then each target's verdict. Last, what one loopback round
//! trip costs (the least an out-of-process policy would add to every pick;
//! `docs/design.md` §3.4.1).
//!
//! `--smoke` (CI): buckets of 400 ms and one day, no verdict.

#[path = "support.rs"]
mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use clap::Parser;
use serde_json::{json, Value};
use support::{
    answers_ok, caller_acl, quantile, register, spawn_router, start_registry, token, Files, Instance, RouterOptions,
    Run, Threads, REGISTRY, ROUTER,
};

const CALLER: &str = "bench_caller";
const POLICIES: [&str; 4] = ["weighted_round_robin", "least_connections", "p2c_ewma", "adaptive"];
/// The instances of each capability; the first is the scripted one.
const INSTANCES: usize = 3;
/// Every instance's own latency.
const BASE: Duration = Duration::from_millis(5);
/// The window: this many buckets after the run's first, two buckets long, every day.
const WINDOW_AT: u64 = 3;
const WINDOW_LEN: u64 = 2;
/// The degradation: from this bucket after the first, this many buckets long.
const DEGRADE_AT: u64 = 6;
const DEGRADE_LEN: u64 = 6;
/// The share window of the recovery measurement (seconds).
const SHARE_WINDOW_S: usize = 3;

#[derive(Debug, Clone, Parser)]
#[command(
    about = "Routing simulation: four policies against scripted agents (a recurring failure window, a slow instance, a degradation then recovery)."
)]
struct Args {
    /// The outcome history's bucket (the router's --routing-history-bucket-ms): one "hour".
    #[arg(long, default_value_t = 3000)]
    bucket_ms: u64,
    /// "Days" of 24 buckets to run; the window is judged on the last one (at least 3 for a verdict).
    #[arg(long, default_value_t = 3)]
    days: u64,
    /// Calls a second to each of the twelve capabilities.
    #[arg(long, default_value_t = 40)]
    rate: u32,
    /// Seconds the run goes on after the degraded instance recovered (and the bound its share must be back within).
    #[arg(long, default_value_t = 30)]
    recovery_s: u64,
    /// A smoke run (CI): tiny buckets, one day, no verdict.
    #[arg(long)]
    smoke: bool,
}

const SMOKE: &[&str] = &["--bucket-ms=400", "--days=1", "--rate=15", "--recovery-s=4"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scenario {
    Window,
    Slow,
    Recover,
}

impl Scenario {
    const ALL: [Scenario; 3] = [Scenario::Window, Scenario::Slow, Scenario::Recover];

    fn name(self) -> &'static str {
        match self {
            Scenario::Window => "window",
            Scenario::Slow => "slow",
            Scenario::Recover => "recover",
        }
    }
}

// === Simulated agents ===

/// When the scripts act: set once every agent is routable (nothing
/// scripted before), by the clock every router and agent shares (epoch ms).
struct Timeline {
    bucket_ms: u64,
    start_ms: AtomicU64,
    /// The window's hours of the day (24: none yet).
    window: [AtomicU64; 2],
    degraded_from: AtomicU64,
    degraded_to: AtomicU64,
}

/// What one instance does.
struct Script {
    scenario: Option<Scenario>,
    timeline: Arc<Timeline>,
    calls: AtomicU64,
    /// First attempts per second since the start.
    first_attempts: Mutex<Vec<u32>>,
}

impl Script {
    /// Whether the call numbered `n` fails at `now_ms`, and how long it takes.
    fn decide(&self, n: u64, now_ms: u64) -> (bool, Duration) {
        // A Weyl sequence: exactly the rate, spread evenly, no long runs of failures.
        let draw = (n as f64 * 0.618_033_988_749_895).fract();
        let timeline = &self.timeline;
        let hour = (now_ms / timeline.bucket_ms) % 24;
        let in_window = timeline.window.iter().any(|at| at.load(Ordering::Relaxed) == hour);
        let degraded = (timeline.degraded_from.load(Ordering::Relaxed)..timeline.degraded_to.load(Ordering::Relaxed))
            .contains(&now_ms);
        match self.scenario {
            Some(Scenario::Window) if in_window => (draw < 0.3, BASE),
            Some(Scenario::Slow) => (false, BASE * 10),
            Some(Scenario::Recover) if degraded => (draw < 0.5, BASE * 5),
            _ => (false, BASE),
        }
    }
}

async fn agent(State(script): State<Arc<Script>>, body: axum::body::Bytes) -> Response {
    let envelope: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let now = epoch_ms();
    let start_ms = script.timeline.start_ms.load(Ordering::Relaxed);
    if envelope["attempt"] == 1 && now >= start_ms {
        let second = (now - start_ms / 1000 * 1000) as usize / 1000;
        let mut counts = script
            .first_attempts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if counts.len() <= second {
            counts.resize(second + 1, 0);
        }
        counts[second] += 1;
    }
    let n = script.calls.fetch_add(1, Ordering::Relaxed);
    let (fails, latency) = script.decide(n, now);
    tokio::time::sleep(latency).await;
    let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
    if fails {
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            json,
            r#"{"error":{"code":"UNAVAILABLE","message":"scripted failure"}}"#,
        )
            .into_response()
    } else {
        (json, r#"{"output":{"status":"paid"}}"#).into_response()
    }
}

async fn start_agent(script: Arc<Script>) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new()
        .route("/invoke", axum::routing::post(agent))
        .with_state(script);
    tokio::spawn(async move { axum::serve(support::nodelay(listener), app).await });
    Ok(addr)
}

fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

// === Calls ===

/// One call as the caller saw it.
#[derive(Debug, Clone, Copy)]
struct Call {
    at_ms: u64,
    latency: Duration,
    ok: bool,
    attempts: u32,
}

impl Call {
    fn failed_first_attempt(&self) -> bool {
        !self.ok || self.attempts > 1
    }

    fn wasted_attempts(&self) -> u32 {
        if self.ok {
            self.attempts.saturating_sub(1)
        } else {
            self.attempts
        }
    }
}

/// Calls `capability` with `policy` at `rate` a second until `until`.
async fn load(
    client: reqwest::Client,
    url: String,
    token: String,
    (capability, policy): (String, &'static str),
    rate: u32,
    until: Instant,
) -> Vec<Call> {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let body =
        json!({ "capability": capability, "target_policy": policy, "payload": { "order_id": "SO-1" } }).to_string();
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut running = Vec::new();
    while Instant::now() < until {
        ticker.tick().await;
        let (client, url, token, body, calls) =
            (client.clone(), url.clone(), token.clone(), body.clone(), calls.clone());
        running.push(tokio::spawn(async move {
            let at_ms = epoch_ms();
            let started = Instant::now();
            let answer = client.post(&url).bearer_auth(&token).body(body).send().await;
            let (ok, attempts) = match answer {
                Ok(response) => {
                    let ok = response.status().is_success();
                    let envelope: Value = response.json().await.unwrap_or(Value::Null);
                    (ok, envelope["attempts"].as_u64().unwrap_or(0) as u32)
                }
                Err(_) => (false, 0),
            };
            let call = Call {
                at_ms,
                latency: started.elapsed(),
                ok,
                attempts,
            };
            calls.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(call);
        }));
    }
    for task in running {
        let _ = task.await;
    }
    let calls = calls.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
    calls
}

fn main() -> anyhow::Result<()> {
    support::main(&[REGISTRY, ROUTER], SMOKE, Threads::Two, bench)
}

struct Pair {
    scenario: Scenario,
    policy: &'static str,
    capability: String,
    scripted: Arc<Script>,
    others: Vec<Arc<Script>>,
}

async fn bench(args: Args, run: Run) -> anyhow::Result<()> {
    let bucket_ms = args.bucket_ms.max(100);
    let etcd = agent_reach_testkit::Etcd::start();
    let files = Files::write(&caller_acl(CALLER, "\"bench.*\""))?;
    let registry = start_registry(&files, &etcd.endpoint(), &[]).await?;
    let router_args = vec!["--routing-history-bucket-ms".to_string(), bucket_ms.to_string()];
    let mut router = spawn_router(
        &files,
        &registry.url,
        RouterOptions {
            threads: 0,
            args: &router_args,
            env: &[],
        },
    )?;
    let client = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
    let agent_token = token("bench_agent")?;
    let caller = token(CALLER)?;

    let timeline = Arc::new(Timeline {
        bucket_ms,
        start_ms: AtomicU64::new(u64::MAX),
        window: [AtomicU64::new(24), AtomicU64::new(24)],
        degraded_from: AtomicU64::new(0),
        degraded_to: AtomicU64::new(0),
    });
    let script = |scenario: Option<Scenario>| {
        Arc::new(Script {
            scenario,
            timeline: timeline.clone(),
            calls: AtomicU64::new(0),
            first_attempts: Mutex::new(Vec::new()),
        })
    };

    let mut pairs = Vec::new();
    for scenario in Scenario::ALL {
        for policy in POLICIES {
            let capability = format!("bench.{}.{policy}", scenario.name());
            let scripted = script(Some(scenario));
            let others: Vec<Arc<Script>> = (1..INSTANCES).map(|_| script(None)).collect();
            for (index, instance) in std::iter::once(&scripted).chain(&others).enumerate() {
                let addr = start_agent(instance.clone()).await?;
                let id = format!("{}-{}-{index}", scenario.name(), policy.replace('_', "-"));
                register(
                    &client,
                    &registry.url,
                    &agent_token,
                    Instance {
                        id: &id,
                        name: "bench_agent",
                        endpoint: format!("http://{addr}/invoke"),
                        capability: &capability,
                        weight: 1,
                    },
                )
                .await?;
            }
            pairs.push(Pair {
                scenario,
                policy,
                capability,
                scripted,
                others,
            });
        }
    }
    let invoke_url = format!("{}/v1/invoke", router.url);
    for pair in &pairs {
        let body = json!({ "capability": pair.capability, "payload": { "order_id": "SO-1" } }).to_string();
        router
            .wait_until(&pair.capability, Duration::from_secs(30), async || {
                answers_ok(client.post(&invoke_url).bearer_auth(&caller).body(body.clone())).await
            })
            .await?;
    }
    // The clock: the window and the degradation are set from the run's first bucket.
    let start_ms = epoch_ms();
    let first = start_ms / bucket_ms;
    let degraded = (
        (first + DEGRADE_AT) * bucket_ms,
        (first + DEGRADE_AT + DEGRADE_LEN) * bucket_ms,
    );
    timeline.start_ms.store(start_ms, Ordering::Relaxed);
    timeline.window[0].store((first + WINDOW_AT) % 24, Ordering::Relaxed);
    timeline.window[1].store((first + WINDOW_AT + 1) % 24, Ordering::Relaxed);
    timeline.degraded_from.store(degraded.0, Ordering::Relaxed);
    timeline.degraded_to.store(degraded.1, Ordering::Relaxed);
    let window_end = first + WINDOW_AT + WINDOW_LEN + 24 * (args.days.max(1) - 1);
    let end_bucket = window_end.max(first + DEGRADE_AT + DEGRADE_LEN + (args.recovery_s * 1000).div_ceil(bucket_ms));
    let until = Instant::now() + Duration::from_millis((end_bucket * bucket_ms).saturating_sub(epoch_ms()));

    run.announce("routing-bench");
    println!(
        "routing-bench: buckets of {bucket_ms} ms (a day is {} s), {} day(s), {} calls/s to each of {} capabilities \
         (3 instances each, {} ms per call), {} cores; the run lasts {} s",
        bucket_ms * 24 / 1000,
        args.days,
        args.rate,
        pairs.len(),
        BASE.as_millis(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        until.saturating_duration_since(Instant::now()).as_secs()
    );
    let loads: Vec<_> = pairs
        .iter()
        .map(|pair| {
            tokio::spawn(load(
                client.clone(),
                invoke_url.clone(),
                caller.clone(),
                (pair.capability.clone(), pair.policy),
                args.rate,
                until,
            ))
        })
        .collect();
    let mut results: BTreeMap<(Scenario, &'static str), Vec<Call>> = BTreeMap::new();
    for (pair, calls) in pairs.iter().zip(loads) {
        results.insert((pair.scenario, pair.policy), calls.await?);
    }

    println!(
        "\n{:<8} {:<22} {:>7} {:>9} {:>8} {:>8} {:>14} {:>13}",
        "script", "policy", "calls", "success", "p50", "p99", "wasted/100", "failed first"
    );
    for ((scenario, policy), calls) in &results {
        let mut latencies: Vec<Duration> = calls.iter().map(|call| call.latency).collect();
        latencies.sort();
        let count = calls.len().max(1) as f64;
        let ok = calls.iter().filter(|call| call.ok).count() as f64;
        let wasted: u32 = calls.iter().map(Call::wasted_attempts).sum();
        let failed_first = calls.iter().filter(|call| call.failed_first_attempt()).count();
        println!(
            "{:<8} {:<22} {:>7} {:>8.2}% {:>6.1}ms {:>6.1}ms {:>14.2} {:>13}",
            scenario.name(),
            policy,
            calls.len(),
            ok / count * 100.0,
            quantile(&latencies, 0.5).as_secs_f64() * 1000.0,
            quantile(&latencies, 0.99).as_secs_f64() * 1000.0,
            f64::from(wasted) / count * 100.0,
            failed_first
        );
    }

    // The window, day by day.
    println!("\nwindow script: failed first attempts inside each day's window (calls in it)");
    let in_window = |calls: &[Call], day: u64| {
        let from = (first + WINDOW_AT + 24 * day) * bucket_ms;
        let to = from + WINDOW_LEN * bucket_ms;
        let inside: Vec<&Call> = calls.iter().filter(|call| (from..to).contains(&call.at_ms)).collect();
        (
            inside.iter().filter(|call| call.failed_first_attempt()).count(),
            inside.len(),
        )
    };
    for policy in POLICIES {
        let calls = &results[&(Scenario::Window, policy)];
        let days: Vec<String> = (0..args.days.max(1))
            .map(|day| {
                let (failed, inside) = in_window(calls, day);
                format!("day {}: {failed} ({inside})", day + 1)
            })
            .collect();
        println!("  {policy:<22} {}", days.join("   "));
    }
    let last_day = args.days.max(1) - 1;
    let (static_failed, _) = in_window(&results[&(Scenario::Window, "weighted_round_robin")], last_day);
    let (adaptive_failed, _) = in_window(&results[&(Scenario::Window, "adaptive")], last_day);
    let cut = 1.0 - adaptive_failed as f64 / static_failed.max(1) as f64;
    println!(
        "adaptive vs weighted_round_robin, day {} window (seen {} time(s) before): {adaptive_failed} vs {static_failed} failed first attempts, cut {:.0} %{}",
        last_day + 1,
        last_day,
        cut * 100.0,
        run.verdict(last_day >= 2 && cut >= 0.5, (" -> MET (>= 50 %)", " -> NOT MET (< 50 %, or fewer than 3 days)"))
    );

    // The slow instance.
    let p99 = |policy: &str| {
        let mut latencies: Vec<Duration> = results[&(Scenario::Slow, policy)]
            .iter()
            .map(|call| call.latency)
            .collect();
        latencies.sort();
        quantile(&latencies, 0.99)
    };
    let (p2c, wrr) = (p99("p2c_ewma"), p99("weighted_round_robin"));
    println!(
        "\nslow script: p99 p2c_ewma {:.1} ms vs weighted_round_robin {:.1} ms{}",
        p2c.as_secs_f64() * 1000.0,
        wrr.as_secs_f64() * 1000.0,
        run.verdict(p2c < wrr, (" -> MET (lower)", " -> NOT MET"))
    );

    // The recovery, from the agents' own counts of first attempts.
    // Seconds count from the start's whole second (the agents' bins).
    let recovered_s = (degraded.1.saturating_sub(start_ms / 1000 * 1000) / 1000) as usize;
    println!(
        "\nrecover script: degraded {} s to {} s of the run; share of first attempts back to >= 80 % of a third (over {SHARE_WINDOW_S} s) within:",
        degraded.0.saturating_sub(start_ms / 1000 * 1000) / 1000,
        recovered_s
    );
    let mut all_recovered = true;
    for pair in pairs.iter().filter(|pair| pair.scenario == Scenario::Recover) {
        let counts = |script: &Script| {
            script
                .first_attempts
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone()
        };
        let mine = counts(&pair.scripted);
        let others: Vec<Vec<u32>> = pair.others.iter().map(|script| counts(script)).collect();
        let at = |counts: &[u32], second: usize| u64::from(counts.get(second).copied().unwrap_or(0));
        let seconds = mine.len().max(others.iter().map(Vec::len).max().unwrap_or(0));
        let share_from = |second: usize| {
            let window = second..(second + SHARE_WINDOW_S).min(seconds);
            let own: u64 = window.clone().map(|s| at(&mine, s)).sum();
            let all: u64 = own
                + others
                    .iter()
                    .map(|other| window.clone().map(|s| at(other, s)).sum::<u64>())
                    .sum::<u64>();
            (all > 0).then(|| own as f64 / all as f64)
        };
        let back = (recovered_s..seconds.saturating_sub(SHARE_WINDOW_S))
            .find(|second| share_from(*second).is_some_and(|share| share >= 0.8 / INSTANCES as f64));
        let after: Vec<f64> = (recovered_s..seconds.saturating_sub(SHARE_WINDOW_S))
            .step_by(SHARE_WINDOW_S)
            .filter_map(share_from)
            .collect();
        let mean_after = after.iter().sum::<f64>() / after.len().max(1) as f64;
        let within = back.map(|second| second - recovered_s);
        all_recovered &= within.is_some_and(|seconds| seconds as u64 <= args.recovery_s);
        println!(
            "  {:<22} {:>8}   (its share after the recovery: {:.0} % on average)",
            pair.policy,
            within.map_or_else(|| "never".to_string(), |seconds| format!("{seconds} s")),
            mean_after * 100.0
        );
    }
    println!(
        "no policy starves the recovered instance (back within {} s){}",
        args.recovery_s,
        run.verdict(all_recovered, (" -> MET", " -> NOT MET"))
    );

    loopback_round_trip().await?;
    drop(router);
    drop(etcd);
    Ok(())
}

/// What one loopback TCP round trip of 64 bytes costs here: the least any
/// out-of-process policy would add to every pick.
async fn loopback_round_trip() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let echo = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let mut buffer = [0u8; 64];
        loop {
            if stream.read_exact(&mut buffer).await.is_err() {
                return Ok::<_, std::io::Error>(());
            }
            stream.write_all(&buffer).await?;
        }
    });
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let mut buffer = [7u8; 64];
    let mut times = Vec::with_capacity(20_000);
    for _ in 0..20_000 {
        let started = Instant::now();
        stream.write_all(&buffer).await?;
        stream.read_exact(&mut buffer).await?;
        times.push(started.elapsed());
    }
    drop(stream);
    let _ = echo.await;
    times.sort();
    println!(
        "\nan out-of-process policy: one loopback round trip per pick costs p50 {:.1} us, p99 {:.1} us here \
         (in-process plug-ins: router-bench -- --policy plugin:cheapest)",
        quantile(&times, 0.5).as_secs_f64() * 1e6,
        quantile(&times, 0.99).as_secs_f64() * 1e6
    );
    Ok(())
}
