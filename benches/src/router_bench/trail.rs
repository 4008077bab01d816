//! `router-bench --trail` (issue 37, acceptance "Load"): two routers on one
//! Redis, the slow path on in both, the trail off and on (payloads off: the
//! bench's acl.yaml names none); the verdict compares their req/s, same run.

use std::collections::HashMap;
use std::time::Duration;

use super::support::{self, answers_ok, spawn_router, Files, RouterOptions, Run, Service};
use super::WrkResult;

pub const TRAIL_OFF: &str = "router trail off";
pub const TRAIL_ON: &str = "router trail on";

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

/// Each round's trail-on req/s over its trail-off req/s (the two ran back
/// to back, so a pair shares the box's phase): how the ratio spreads.
pub fn round_by_round(rounds: &HashMap<(String, u32), Vec<WrkResult>>, connections: &[u32]) {
    for &connections in connections {
        let get = |name: &str| rounds.get(&(name.to_string(), connections));
        if let (Some(off), Some(on)) = (get(TRAIL_OFF), get(TRAIL_ON)) {
            let ratios: Vec<f64> = off
                .iter()
                .zip(on)
                .map(|(off, on)| on.requests_per_s / off.requests_per_s)
                .collect();
            let listed: Vec<String> = ratios.iter().map(|ratio| format!("{ratio:.3}")).collect();
            println!(
                "{connections:>2} conn, round by round: trail on / off {} (median {:.3}x)",
                listed.join(" "),
                support::median(&mut ratios.clone())
            );
        }
    }
}

/// The trail's verdict: its router's req/s against the other's (≥ 0.95×), and what it recorded.
pub async fn verdict(
    results: &HashMap<(String, u32), WrkResult>,
    connections: &[u32],
    run: &Run,
    client: &reqwest::Client,
    trailed: &str,
) {
    for &connections in connections {
        let get = |name: &str| results.get(&(name.to_string(), connections));
        if let (Some(off), Some(on)) = (get(TRAIL_OFF), get(TRAIL_ON)) {
            let ratio = on.requests_per_s / off.requests_per_s;
            println!(
                "{connections:>2} conn: trail on {:.0} req/s vs trail off {:.0} req/s: {ratio:.3}x{}",
                on.requests_per_s,
                off.requests_per_s,
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
        "trail: {} records written, {} dropped, {} segments",
        series("agent_reach_trail_records_total "),
        series("agent_reach_trail_dropped_total "),
        series("agent_reach_trail_segments_total ")
    );
}
