//! Workflow runs benchmark (issue 36): what a declared workflow costs over
//! the durable tasks it is made of.
//!
//! ```sh
//! cargo run --release -p agent-reach-benches --bin workflows-bench
//! ```
//!
//! One process runs a registry (embedded store), a router with the slow path
//! on a real Redis (testkit), and two SDK echo agents; on that one stack, in
//! each of `--rounds` (3) rounds, the first three measurements one after the
//! other (the verdict is on the median round's 3-step tasks' worth: a
//! round's measurements share the box's state, which drifts between rounds
//! by more than the gaps measured), then the fourth once:
//!
//! 1. tasks/s end to end, as tasks-bench measures it (tasks submitted over
//!    HTTP, waited for on the router's `agent_reach_tasks_finished_total`);
//! 2. runs/s end to end of a 3-step linear workflow (`a → b → c`), runs
//!    started over `POST /v1/workflows/{name}/runs` and waited for on
//!    `agent_reach_runs_ended_total`; its cost in tasks is tasks/s ÷ runs/s
//!    (target: a 3-step run costs ≤ 4 tasks' worth);
//! 3. the same for a 1→10→1 fan-out (`split`, ten `fan` items, `join`:
//!    12 steps), no target;
//! 4. the latency a step adds: one caller, one call at a time, the 3-step
//!    workflow invoked synchronously (`POST /v1/invoke`, answered when the
//!    run ends) against the same three calls made by hand one after the
//!    other through `/v1/invoke`; per step added = (run − chain) / 3 at p50
//!    and at p99.
//!
//! `--smoke` (CI): the same stack and measurements on tiny sizes, the
//! numbers without a verdict.

#[path = "support.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use futures::StreamExt;
use serde_json::{json, Value};
use support::{quantile, token, wait_for, EchoStack, Run, Threads};

const ACL: &str = "version: 1\npermissions:\n  - caller: bench\n    allow: [bench.*]\nproviders:\n  - agent: bench_agent\n    provides: [bench.*]\n";

const LINEAR: &str = "bench.linear3";
const FAN: &str = "bench.fan10";

#[derive(Debug, Parser)]
#[command(about = "Workflow runs/s (3-step linear, 1→10→1 fan-out) against tasks/s, and the latency a step adds.")]
struct Args {
    /// Tasks of the tasks/s baseline.
    #[arg(long, default_value_t = 20_000)]
    tasks: usize,
    /// Runs of the 3-step linear workflow.
    #[arg(long, default_value_t = 5_000)]
    runs: usize,
    /// Runs of the 1→10→1 fan-out workflow.
    #[arg(long, default_value_t = 1_000)]
    fan_runs: usize,
    /// Sequential calls of the latency measurement (each way).
    #[arg(long, default_value_t = 2_000)]
    latency_calls: usize,
    /// Concurrent submissions (tasks and runs).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Deliveries the router runs at once.
    #[arg(long, default_value_t = 128)]
    workers: usize,
    /// Rounds of the three throughput measurements, one after the other in
    /// each round (so a round's tasks and runs share the box's state); the
    /// verdict is on the median round's tasks' worth.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// A smoke run (CI): every measurement of the bench on tiny sizes (the
    /// flags it adds are printed first), no warm-ups; prints the numbers, no
    /// verdict.
    #[arg(long)]
    smoke: bool,
}

/// The smoke run's sizes: `--smoke` runs the bench with these flags.
const SMOKE: &[&str] = &[
    "--tasks=200",
    "--runs=60",
    "--fan-runs=10",
    "--latency-calls=20",
    "--concurrency=8",
    "--workers=16",
    "--rounds=1",
];

fn main() -> anyhow::Result<()> {
    support::main(&[], SMOKE, Threads::PerCore, bench)
}

/// The sum of a counter's series whose labels contain `labels`.
fn counter(metrics: &str, name: &str, labels: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(labels))
        .filter_map(|line| line.rsplit_once(' ').and_then(|(_, value)| value.parse::<f64>().ok()))
        .sum::<f64>() as u64
}

/// The stack: a registry, a router on Redis, two echo agents.
struct Stack {
    _redis: agent_reach_testkit::Redis,
    echo: EchoStack,
    client: reqwest::Client,
    caller: Arc<String>,
}

impl Stack {
    async fn start(args: &Args) -> anyhow::Result<Self> {
        let redis = agent_reach_testkit::Redis::start();
        let echo = EchoStack::start(ACL, redis.url(), args.workers).await?;
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(args.concurrency.max(2))
            .build()?;
        let stack = Self {
            _redis: redis,
            echo,
            client,
            caller: Arc::new(token("bench")?),
        };
        stack.echo.wait_for_agents(&stack.client, &stack.caller).await?;
        stack.put_workflows().await?;
        Ok(stack)
    }

    /// Registers both workflows (as the agents' provider, whom the policy
    /// lets provide `bench.*`) and waits until the router has them.
    async fn put_workflows(&self) -> anyhow::Result<()> {
        let linear = json!({
            "version": "1.0.0",
            "input_schema": {"type": "object"},
            "steps": [
                {"id": "a", "capability": "bench.echo", "input": "${input}"},
                {"id": "b", "capability": "bench.echo", "input": "${steps.a.output}"},
                {"id": "c", "capability": "bench.echo", "input": "${steps.b.output}"},
            ],
            "output": "${steps.c.output}",
        });
        let fan = json!({
            "version": "1.0.0",
            "input_schema": {"type": "object", "required": ["items"], "properties": {"items": {"type": "array"}}},
            "steps": [
                {"id": "split", "capability": "bench.echo", "input": "${input}"},
                {"id": "fan", "capability": "bench.echo", "for_each": "${steps.split.output.items}",
                 "max_parallel": 10, "input": {"n": "${item}"}},
                {"id": "join", "capability": "bench.echo", "input": {"parts": "${steps.fan.output}"}},
            ],
            "output": "${steps.join.output}",
        });
        let provider = token("bench_agent")?;
        for (name, definition) in [(LINEAR, linear), (FAN, fan)] {
            let response = self
                .client
                .put(format!("{}/v1/workflows/{name}", self.echo.registry))
                .bearer_auth(&provider)
                .json(&definition)
                .send()
                .await?;
            if !response.status().is_success() {
                bail!(
                    "registering {name} answered {}: {}",
                    response.status(),
                    response.text().await?
                );
            }
            // The router has it once a run with a bad input is refused for
            // its input (422), not for an unknown workflow (404): no run starts.
            wait_for(
                &format!("the router with workflow {name}"),
                Duration::from_secs(30),
                async || {
                    let probe = self
                        .client
                        .post(format!("{}/v1/workflows/{name}/runs", self.echo.router))
                        .bearer_auth(self.caller.as_str())
                        .json(&json!({"payload": "not an object"}))
                        .send()
                        .await;
                    probe.is_ok_and(|probe| probe.status() == 422)
                },
            )
            .await?;
        }
        Ok(())
    }

    async fn metrics(&self) -> anyhow::Result<String> {
        Ok(self
            .client
            .get(format!("{}/metrics", self.echo.router))
            .send()
            .await?
            .text()
            .await?)
    }

    /// Posts `count` bodies (`body(index)`) to `path`, `concurrency` at a
    /// time, each answered 202; then waits until `done(metrics)` reaches
    /// `count` more than it was. Returns the submission and end-to-end times.
    async fn throughput(
        &self,
        path: &str,
        count: usize,
        concurrency: usize,
        body: impl Fn(usize) -> Value,
        done: impl Fn(&str) -> u64,
    ) -> anyhow::Result<(Duration, Duration)> {
        let before = done(&self.metrics().await?);
        let started = Instant::now();
        let url = format!("{}{path}", self.echo.router);
        let submitted = futures::stream::iter((0..count).map(body))
            .map(|body| {
                let (client, url, caller) = (self.client.clone(), url.clone(), self.caller.clone());
                async move {
                    let response = client
                        .post(&url)
                        .bearer_auth(caller.as_str())
                        .json(&body)
                        .send()
                        .await?;
                    if response.status() != 202 {
                        bail!("{url} answered {}: {}", response.status(), response.text().await?);
                    }
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(concurrency)
            .collect::<Vec<_>>()
            .await;
        for result in submitted {
            result?;
        }
        let submit_time = started.elapsed();
        let done_by = Instant::now() + Duration::from_secs(600);
        loop {
            let finished = done(&self.metrics().await?) - before;
            if finished >= count as u64 {
                break;
            }
            if Instant::now() > done_by {
                bail!("only {finished} of {count} finished in 10 minutes ({path})");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok((submit_time, started.elapsed()))
    }

    /// [`Self::throughput`] of `count` runs of `workflow`, each ended.
    async fn runs(
        &self,
        workflow: &str,
        count: usize,
        concurrency: usize,
        body: impl Fn(usize) -> Value,
    ) -> anyhow::Result<(Duration, Duration)> {
        let ended = format!("workflow=\"{workflow}\"");
        self.throughput(
            &format!("/v1/workflows/{workflow}/runs"),
            count,
            concurrency,
            body,
            |metrics| counter(metrics, "agent_reach_runs_ended_total", &ended),
        )
        .await
    }

    /// One synchronous `/v1/invoke` of `capability`: its latency.
    async fn invoke(&self, capability: &str, payload: &Value) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let response = self
            .client
            .post(format!("{}/v1/invoke", self.echo.router))
            .bearer_auth(self.caller.as_str())
            .json(&json!({"capability": capability, "payload": payload}))
            .send()
            .await?;
        if response.status() != 200 {
            bail!(
                "invoking {capability} answered {}: {}",
                response.status(),
                response.text().await?
            );
        }
        response.bytes().await?;
        Ok(started.elapsed())
    }

    async fn shutdown(self) -> anyhow::Result<()> {
        for agent in self.echo.agents {
            agent.shutdown().await;
        }
        self.echo.files.dir.close().context("removing the temp dir")
    }
}

/// One throughput measurement's line.
fn rate_line(what: &str, count: usize, unit: &str, (submit, total): (Duration, Duration)) -> f64 {
    let rate = count as f64 / total.as_secs_f64();
    println!(
        "  {what:<24} {rate:>8.0} {unit}/s end to end ({count} in {:.1} s; submitted at {:.0}/s)",
        total.as_secs_f64(),
        count as f64 / submit.as_secs_f64()
    );
    rate
}

async fn bench(args: Args, run: Run) -> anyhow::Result<()> {
    run.announce("workflows-bench");
    let stack = Stack::start(&args).await?;
    println!(
        "workflows-bench: {} tasks, {} linear runs, {} fan-out runs, {} concurrent submitters, {} router workers; {} sequential calls each way for latency",
        args.tasks, args.runs, args.fan_runs, args.concurrency, args.workers, args.latency_calls
    );
    if let Some(warm_up) = run.warm_up(Duration::from_secs(3)) {
        let until = Instant::now() + warm_up;
        while Instant::now() < until {
            stack
                .throughput(
                    "/v1/tasks",
                    args.concurrency * 4,
                    args.concurrency,
                    |_| json!({"capability": "bench.echo", "payload": {}}),
                    |metrics| counter(metrics, "agent_reach_tasks_finished_total", ""),
                )
                .await?;
        }
    }

    // Each round: tasks, then linear runs, then fan-out runs; a round's
    // ratios compare measurements a few seconds apart (the box drifts by
    // more than the gaps between runs of one build).
    let items: Vec<usize> = (0..10).collect();
    let mut rounds = Vec::with_capacity(args.rounds.max(1));
    for round in 0..args.rounds.max(1) {
        println!("round {}:", round + 1);
        let tasks = stack
            .throughput(
                "/v1/tasks",
                args.tasks,
                args.concurrency,
                |index| json!({"capability": "bench.echo", "request_id": format!("task-{round}-{index}"), "payload": {"n": index}}),
                |metrics| counter(metrics, "agent_reach_tasks_finished_total", ""),
            )
            .await?;
        let tasks_per_s = rate_line("tasks", args.tasks, "tasks", tasks);
        let linear = stack
            .runs(
                LINEAR,
                args.runs,
                args.concurrency,
                |index| json!({"request_id": format!("linear-{round}-{index}"), "payload": {"n": index}}),
            )
            .await?;
        let linear_per_s = rate_line("3-step linear runs", args.runs, "runs", linear);
        let fan = stack
            .runs(
                FAN,
                args.fan_runs,
                args.concurrency,
                |index| json!({"request_id": format!("fan-{round}-{index}"), "payload": {"items": items, "n": index}}),
            )
            .await?;
        let fan_per_s = rate_line("1→10→1 fan-out runs", args.fan_runs, "runs", fan);
        println!(
            "  tasks' worth: 3-step run {:.2}, 1→10→1 run {:.2}",
            tasks_per_s / linear_per_s,
            tasks_per_s / fan_per_s
        );
        rounds.push((tasks_per_s, linear_per_s, fan_per_s));
    }
    // The median round by the 3-step run's tasks' worth (the target's measure).
    rounds.sort_by(|a, b| (a.0 / a.1).total_cmp(&(b.0 / b.1)));
    let (tasks_per_s, linear_per_s, fan_per_s) = rounds[rounds.len() / 2];

    let metrics = stack.metrics().await?;
    let failed = counter(&metrics, "agent_reach_runs_ended_total", "state=\"failed\"")
        + counter(&metrics, "agent_reach_runs_ended_total", "state=\"canceled\"");
    if failed > 0 {
        bail!("{failed} run(s) did not succeed");
    }

    // Latency: one call at a time, the run against the chain by hand.
    let payload = json!({"n": 1});
    let (mut runs, mut chains) = (Vec::new(), Vec::new());
    for _ in 0..args.latency_calls {
        runs.push(stack.invoke(LINEAR, &payload).await?);
        let mut chain = Duration::ZERO;
        for _ in 0..3 {
            chain += stack.invoke("bench.echo", &payload).await?;
        }
        chains.push(chain);
    }
    runs.sort();
    chains.sort();
    let per_step = |q: f64| quantile(&runs, q).saturating_sub(quantile(&chains, q)) / 3;

    let linear_cost = tasks_per_s / linear_per_s;
    let fan_cost = tasks_per_s / fan_per_s;
    println!();
    println!("median of {} round(s), by the 3-step run's tasks' worth:", rounds.len());
    println!("| measured | rate | tasks' worth per run |");
    println!("|---|---|---|");
    println!("| tasks (the baseline) | {tasks_per_s:.0} tasks/s | 1 per task |");
    println!("| 3-step linear runs | {linear_per_s:.0} runs/s | {linear_cost:.2} |");
    println!("| 1→10→1 fan-out runs (12 steps) | {fan_per_s:.0} runs/s | {fan_cost:.2} |");
    println!();
    println!("| sequential calls | p50 | p99 |");
    println!("|---|---|---|");
    let ms = |duration: Duration| duration.as_secs_f64() * 1e3;
    println!(
        "| 3-step run, /v1/invoke | {:.2} ms | {:.2} ms |",
        ms(quantile(&runs, 0.5)),
        ms(quantile(&runs, 0.99))
    );
    println!(
        "| the 3 calls by hand, /v1/invoke | {:.2} ms | {:.2} ms |",
        ms(quantile(&chains, 0.5)),
        ms(quantile(&chains, 0.99))
    );
    println!(
        "| added per step | {:.2} ms | {:.2} ms |",
        ms(per_step(0.5)),
        ms(per_step(0.99))
    );
    if run.is_judged() {
        println!();
        println!(
            "target: a 3-step run costs <= 4 tasks' worth: {:.2}: {}",
            linear_cost,
            run.verdict(linear_cost <= 4.0, ("MET", "NOT MET"))
        );
    }
    stack.shutdown().await
}
