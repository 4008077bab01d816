//! `router-bench --trail` (issue 37, acceptance "Load"): two routers on one
//! Redis, the slow path on in both, the trail off and on (payloads off: the
//! bench's acl.yaml names none); the verdict compares their req/s, same run.

use std::collections::HashMap;
use std::time::Duration;

use super::support::{self, answers_ok, spawn_router, Files, RouterOptions, Run, Service};
use super::WrkResult;

pub const TRAIL_OFF: &str = "router trail off";
pub const TRAIL_ON: &str = "router trail on";

/// The length of one window of the two routers' turns ([`alternate`]):
/// short, so that a round samples each router in many placements of its
/// threads on the cores (at one connection a window's req/s depends on
/// where the scheduler put wrk, the router's thread and the agent's, and
/// 2-s windows left rounds 10 % apart).
pub const WINDOW_S: u64 = 1;

/// Whether `name` is one of the trail's two routers.
pub fn is_trail(name: &str) -> bool {
    name == TRAIL_OFF || name == TRAIL_ON
}

/// Measures `count` targets in turns, windows of [`WINDOW_S`] each (a
/// round's `duration_s` in all for each target), so that every drift of
/// the box over the round falls on all of them alike: one result per
/// target, its req/s over all its windows, its CPU per request weighted
/// by each window's requests, its p50 and p99 the median of its windows'.
/// `measure(index, seconds)` measures target `index` once.
pub fn alternate(
    duration_s: u64,
    count: usize,
    mut measure: impl FnMut(usize, u64) -> anyhow::Result<WrkResult>,
) -> anyhow::Result<Vec<WrkResult>> {
    let window_s = WINDOW_S.min(duration_s.max(1));
    let windows = (duration_s / window_s).max(1);
    let mut measured: Vec<Vec<WrkResult>> = (0..count).map(|_| Vec::new()).collect();
    for _ in 0..windows {
        for (index, results) in measured.iter_mut().enumerate() {
            results.push(measure(index, window_s)?);
        }
    }
    Ok(measured.iter().map(|results| combined(results, window_s)).collect())
}

/// One target's windows as one result.
fn combined(windows: &[WrkResult], window_s: u64) -> WrkResult {
    let requests: Vec<f64> = windows
        .iter()
        .map(|window| window.requests_per_s * window_s as f64)
        .collect();
    let total: f64 = requests.iter().sum();
    // A per-request figure over all windows: each window's weighted by its requests.
    let weighted = |values: Vec<f64>| {
        values
            .iter()
            .zip(&requests)
            .map(|(value, requests)| value * requests)
            .sum::<f64>()
            / total
    };
    let median_of = |value: fn(&WrkResult) -> f64| support::median(&mut windows.iter().map(value).collect::<Vec<_>>());
    let mut errors: Vec<&str> = windows.iter().map(|window| window.errors.as_str()).collect();
    errors.dedup();
    WrkResult {
        requests_per_s: total / (windows.len() as u64 * window_s) as f64,
        p50_us: median_of(|window| window.p50_us),
        p99_us: median_of(|window| window.p99_us),
        errors: errors.join("; "),
        cpu_per_request_us: windows
            .iter()
            .map(|window| window.cpu_per_request_us)
            .collect::<Option<Vec<f64>>>()
            .map(weighted),
        agents_cpu_per_request_us: weighted(windows.iter().map(|window| window.agents_cpu_per_request_us).collect()),
    }
}

/// Two routers on a fresh Redis, the slow path on in both, the trail off
/// and on: the same load's cost of recording every call (payloads off).
pub async fn start(
    files: &Files,
    registry: &str,
    threads: usize,
    args: &[String],
    invoke: &impl Fn(&str) -> reqwest::RequestBuilder,
) -> anyhow::Result<(agent_reach_testkit::Redis, Vec<(&'static str, String, Service)>)> {
    let redis = agent_reach_testkit::Redis::start();
    let callback_secret = files.write_file("callback.secret", support::SECRET)?;
    let mut routers = Vec::new();
    for (name, trail) in [(TRAIL_OFF, "off"), (TRAIL_ON, "on")] {
        let mut flags = args.to_vec();
        flags.extend([
            "--redis".to_string(),
            redis.url(),
            "--callback-secret-file".into(),
            support::path_arg(&callback_secret),
            "--trail".into(),
            trail.into(),
        ]);
        let options = RouterOptions {
            threads,
            args: &flags,
            env: &[],
        };
        let mut router = spawn_router(files, registry, options)?;
        let url = format!("{}/v1/invoke", router.url);
        router
            .wait_until(name, Duration::from_secs(20), async || answers_ok(invoke(&url)).await)
            .await?;
        routers.push((name, url, router));
    }
    Ok((redis, routers))
}

/// Each round's trail-on req/s over its trail-off req/s (the two took
/// turns within the round, so a pair shares the box's phase): how the
/// ratio spreads, and its median per connection count, the verdict's figure.
pub fn round_by_round(rounds: &HashMap<(String, u32), Vec<WrkResult>>, connections: &[u32]) -> HashMap<u32, f64> {
    let mut medians = HashMap::new();
    for &connections in connections {
        let get = |name: &str| rounds.get(&(name.to_string(), connections));
        if let (Some(off), Some(on)) = (get(TRAIL_OFF), get(TRAIL_ON)) {
            let ratios: Vec<f64> = off
                .iter()
                .zip(on)
                .map(|(off, on)| on.requests_per_s / off.requests_per_s)
                .collect();
            if ratios.is_empty() {
                continue;
            }
            let listed: Vec<String> = ratios.iter().map(|ratio| format!("{ratio:.3}")).collect();
            let median = support::median(&mut ratios.clone());
            println!(
                "{connections:>2} conn, round by round: trail on / off {} (median {median:.3}x)",
                listed.join(" ")
            );
            medians.insert(connections, median);
        }
    }
    medians
}

/// The trail's verdict: the median of the rounds' ratios ([`round_by_round`]:
/// each round's pair measured in turns, so each ratio compares the two
/// routers at the same moment of the box) ≥ 0.95×, beside each router's
/// median round, and what the trail recorded.
pub async fn verdict(
    results: &HashMap<(String, u32), WrkResult>,
    paired: &HashMap<u32, f64>,
    connections: &[u32],
    run: &Run,
    client: &reqwest::Client,
    trailed: &str,
    redis: &agent_reach_testkit::Redis,
) {
    for &connections in connections {
        let get = |name: &str| results.get(&(name.to_string(), connections));
        if let (Some(off), Some(on), Some(&ratio)) = (get(TRAIL_OFF), get(TRAIL_ON), paired.get(&connections)) {
            println!(
                "{connections:>2} conn: trail on {:.0} req/s vs trail off {:.0} req/s (median rounds, {:.3}x); \
                 rounds' median ratio {ratio:.3}x{}",
                on.requests_per_s,
                off.requests_per_s,
                on.requests_per_s / off.requests_per_s,
                run.verdict(ratio >= 0.95, (" -> MET (>= 0.95x)", " -> NOT MET (< 0.95x)"))
            );
            if let (Some(on_cpu), Some(off_cpu)) = (on.cpu_per_request_us, off.cpu_per_request_us) {
                println!(
                    "{connections:>2} conn: router CPU per request: trail off {off_cpu:.1}us, on {on_cpu:.1}us ({:+.2}us)",
                    on_cpu - off_cpu
                );
            }
        }
    }
    // Dropped records would flatter the ratio: say how many there were.
    let metrics = match client.get(format!("{trailed}/metrics")).send().await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(error) => format!("unreadable: {error}"),
    };
    let series = |name: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
            .map_or_else(|| "?".to_string(), |value| format!("{value:.0}"))
    };
    println!(
        "trail: {} records written, {} dropped, {} segments ({} sealed at the calls' priority, the idle thread starved)",
        series("agent_reach_trail_records_total "),
        series("agent_reach_trail_dropped_total "),
        series("agent_reach_trail_segments_total "),
        series("agent_reach_trail_sealed_starved_total ")
    );
    // What the records take in Redis (the segments' stream: every record
    // of the run, nothing trimmed within the retention).
    let records = series("agent_reach_trail_records_total ").parse::<f64>().unwrap_or(0.0);
    match segments_bytes(redis) {
        Ok(bytes) if records > 0.0 => println!(
            "trail: its segments hold {:.1} MB of Redis memory, {:.0} bytes a record",
            bytes as f64 / 1e6,
            bytes as f64 / records
        ),
        Ok(_) => {}
        Err(error) => println!("trail: the segments' memory in Redis is unreadable: {error}"),
    }
}

/// Redis's memory for every chain's segments (`MEMORY USAGE … SAMPLES 0`,
/// exact), read with `redis-cli`.
fn segments_bytes(redis: &agent_reach_testkit::Redis) -> anyhow::Result<u64> {
    let cli = |args: &[&str]| -> anyhow::Result<String> {
        let port = redis.port().to_string();
        let output = std::process::Command::new("redis-cli")
            .args(["-p", &port])
            .args(args)
            .output()?;
        anyhow::ensure!(
            output.status.success(),
            "redis-cli {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let mut bytes = 0;
    for key in cli(&["--scan", "--pattern", "*trail:*:segments"])?
        .lines()
        .filter(|key| !key.is_empty())
    {
        bytes += cli(&["MEMORY", "USAGE", key, "SAMPLES", "0"])?.trim().parse::<u64>()?;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(requests_per_s: f64, p50_us: f64, cpu_per_request_us: f64) -> WrkResult {
        WrkResult {
            requests_per_s,
            p50_us,
            p99_us: p50_us * 4.0,
            errors: String::new(),
            cpu_per_request_us: Some(cpu_per_request_us),
            agents_cpu_per_request_us: 10.0,
        }
    }

    #[test]
    fn the_routers_take_turns_and_each_windows_add_up() {
        let mut turns = Vec::new();
        // Target 0 gets slower window by window (the box drifting), target 1 is flat.
        let results = alternate(3 * WINDOW_S, 2, |index, seconds| {
            assert_eq!(seconds, WINDOW_S);
            turns.push(index);
            let nth = turns.iter().filter(|&&turn| turn == index).count() as f64;
            Ok(match index {
                0 => window(1000.0 / nth, 100.0 * nth, 10.0 * nth),
                _ => window(500.0, 50.0, 20.0),
            })
        })
        .unwrap();
        assert_eq!(turns, [0, 1, 0, 1, 0, 1], "three windows each, in turns");
        // 1,000, 500 and 333.3 req/s over three windows of equal length.
        assert!((results[0].requests_per_s - (1000.0 + 500.0 + 1000.0 / 3.0) / 3.0).abs() < 1e-9);
        assert_eq!(results[0].p50_us, 200.0, "the median window's p50");
        // CPU per request weighted by each window's requests (in the ratio 1,000 : 500 : 333.3):
        // (10·2000 + 20·1000 + 30·666.7) / 3666.7.
        let cpu = results[0].cpu_per_request_us.unwrap();
        assert!((cpu - 60_000.0 / (11_000.0 / 3.0)).abs() < 1e-9, "{cpu}");
        assert_eq!(results[1].requests_per_s, 500.0);
        assert_eq!(results[1].cpu_per_request_us, Some(20.0));
    }

    #[test]
    fn a_run_shorter_than_a_window_is_one_window() {
        let mut seconds_asked = Vec::new();
        let results = alternate(1, 2, |_, seconds| {
            seconds_asked.push(seconds);
            Ok(window(100.0, 1.0, 1.0))
        })
        .unwrap();
        assert_eq!(seconds_asked, [1, 1]);
        assert_eq!(results.len(), 2);
        assert_eq!(results[0].requests_per_s, 100.0);
    }
}
