//! `agent-reach demo`: runs "Can my order ship today?" end to end on an
//! in-process stack (embedded stores, free ports) and prints every hop and
//! the answer. The README's first command.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use agent_reach_examples::Chain;
use anyhow::Context;
use serde_json::{json, Value};

use agent_reach_examples::stack::{Stack, StackOptions};

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// The customer's question.
    #[arg(long, default_value = "Can my order SO-2024001 ship today?")]
    question: String,
    /// The asking user.
    #[arg(long, default_value = "u_123")]
    user: String,
    /// Extra questions to send afterwards, to show how order.query calls
    /// spread over its three instances (weights 3:2:1).
    #[arg(long, default_value_t = 60)]
    spread: usize,
    /// Redis for the workflow part (the router's slow path runs workflows). Without it
    /// the demo starts a throwaway `redis-server` when one is installed, else skips it.
    #[arg(long, env = "AGENT_REACH_REDIS", value_name = "URL")]
    redis: Option<String>,
}

/// The example scenario's capabilities (what `dev` and `demo` wait for).
pub(crate) const CAPABILITIES: [&str; 4] = ["intent.parse", "order.query", "shipping.rules", "reply.write"];

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
    let throwaway = match &args.redis {
        Some(_) => None,
        None => ThrowawayRedis::start().await,
    };
    let redis = args
        .redis
        .clone()
        .or_else(|| throwaway.as_ref().map(ThrowawayRedis::url));
    outln!(
        "Starting registry, router, context service and 6 example agents ({}) ...",
        if redis.is_some() {
            "embedded registry store, Redis"
        } else {
            "embedded stores"
        }
    );
    let stack = Stack::start(StackOptions {
        registry_listen: any_port,
        router_listen: any_port,
        context_listen: any_port,
        etcd: Vec::new(),
        redis: redis.clone(),
        acl: None,
        agents: agent_reach_examples::scenario_instances(),
    })
    .await?;
    let mut outcome = scenario(&stack, &args).await;
    if outcome.is_ok() {
        outcome = match &redis {
            Some(_) => workflow(&stack, &args).await,
            None => {
                outln!();
                outln!("(The same chain as a workflow needs Redis: pass --redis URL, or install redis-server.)");
                Ok(())
            }
        };
    }
    stack.shutdown().await;
    drop(throwaway);
    outcome
}

/// The chain declared as a workflow (examples/workflows/ship-today.yaml):
/// registered as an operator would, called as `demo_user` through
/// `/v1/invoke` like any capability, then shown step by step.
async fn workflow(stack: &Stack, args: &DemoArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let ops = stack.token("ops", Duration::from_secs(600))?;
    let registered = client
        .put(format!("{}/v1/workflows/order.ship_today", stack.registry))
        .bearer_auth(&ops)
        .header("content-type", "application/yaml")
        .body(agent_reach_examples::SHIP_TODAY_WORKFLOW)
        .send()
        .await?;
    if !registered.status().is_success() {
        anyhow::bail!("the workflow was refused: {}", registered.text().await?);
    }
    let token = stack.token("demo_user", Duration::from_secs(600))?;
    // The router learns of it through its registry watch, a moment later.
    let card = format!("{}/a2a/order.ship_today/.well-known/agent-card.json", stack.router);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !client
        .get(&card)
        .bearer_auth(&token)
        .send()
        .await
        .is_ok_and(|response| response.status().is_success())
    {
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("the router did not learn of workflow order.ship_today within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let created: Value = client
        .post(format!("{}/v1/contexts", stack.context))
        .bearer_auth(&token)
        .json(&json!({ "tier": "one_shot" }))
        .send()
        .await?
        .json()
        .await?;
    let envelope: Value = client
        .post(format!("{}/v1/invoke", stack.router))
        .bearer_auth(&token)
        .json(&json!({
            "capability": "order.ship_today",
            "context_id": created["context_id"],
            "timeout_ms": 10_000,
            "payload": { "user_id": args.user, "text": args.question },
        }))
        .send()
        .await?
        .json()
        .await?;
    if envelope["status"] != "succeeded" {
        anyhow::bail!("the workflow's run failed: {}", envelope["error"]);
    }
    let run_id = envelope["agent_id"].as_str().unwrap_or_default();
    let run: Value = client
        .get(format!("{}/v1/runs/{run_id}", stack.router))
        .bearer_auth(&token)
        .send()
        .await?
        .json()
        .await?;
    outln!();
    outln!("The same chain declared as a workflow (examples/workflows/ship-today.yaml), each step a durable task:");
    crate::workflows::print_run(&run);
    outln!();
    outln!("A: {}", crate::connection::text(&envelope["output"]["reply"]));
    Ok(())
}

/// A `redis-server` of the demo's own on a free loopback port, stopped with it.
struct ThrowawayRedis {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl ThrowawayRedis {
    /// Starts one when `redis-server` is installed; `None` otherwise.
    async fn start() -> Option<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let dir = tempfile::tempdir().ok()?;
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let redis = Self { child, port, _dir: dir };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tokio::time::Instant::now() < deadline {
            if redis.answers().await {
                return Some(redis);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    async fn answers(&self) -> bool {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await else {
            return false;
        };
        let mut reply = [0u8; 7];
        stream.write_all(b"PING\r\n").await.is_ok()
            && stream.read_exact(&mut reply).await.is_ok()
            && &reply == b"+PONG\r\n"
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for ThrowawayRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn scenario(stack: &Stack, args: &DemoArgs) -> anyhow::Result<()> {
    stack
        .wait_until_routable(&CAPABILITIES, Duration::from_secs(15))
        .await?;
    let client = reqwest::Client::new();
    let token = stack.token("demo_user", Duration::from_secs(600))?;

    let (answer, envelope, trace_id) = ask(stack, &client, &token, &args.user, &args.question).await?;
    outln!();
    outln!("Q: {}  (user {})", args.question, args.user);
    outln!("trace {trace_id}");
    outln!();
    outln!(
        "  {:<3} {:<15} {:<18} {:>8} {:>9}  trace id",
        "hop",
        "capability",
        "instance",
        "attempts",
        "latency"
    );
    let first = agent_reach_examples::Hop {
        capability: "intent.parse".to_string(),
        agent_id: envelope["agent_id"].as_str().unwrap_or("?").to_string(),
        attempts: envelope["attempts"].as_u64().unwrap_or(0) as u32,
        duration_ms: envelope["duration_ms"].as_u64().unwrap_or(0),
        trace_id: answer.trace_id.clone(),
    };
    for (index, hop) in std::iter::once(&first).chain(answer.trace.iter()).enumerate() {
        outln!(
            "  {:<3} {:<15} {:<18} {:>8} {:>6} ms  {}",
            index + 1,
            hop.capability,
            hop.agent_id,
            hop.attempts,
            hop.duration_ms,
            hop.trace_id
        );
    }
    outln!();
    outln!("A: {}", answer.reply);

    if args.spread > 0 {
        let mut served: BTreeMap<String, usize> = BTreeMap::new();
        for index in 0..args.spread {
            let question = format!("Can my order SO-202400{} ship today?", 1 + index % 3);
            let (answer, _, _) = ask(stack, &client, &token, &args.user, &question).await?;
            if let Some(hop) = answer.trace.iter().find(|hop| hop.capability == "order.query") {
                *served.entry(hop.agent_id.clone()).or_default() += 1;
            }
        }
        outln!();
        outln!("{} more questions; order.query served by (weights 3:2:1):", args.spread);
        for (agent, count) in served {
            outln!("  {agent:<18} {count}");
        }
    }
    Ok(())
}

/// One question: a fresh one-shot context, then the call with a new trace.
async fn ask(
    stack: &Stack,
    client: &reqwest::Client,
    token: &str,
    user: &str,
    question: &str,
) -> anyhow::Result<(Chain, Value, String)> {
    let created: Value = client
        .post(format!("{}/v1/contexts", stack.context))
        .bearer_auth(token)
        .json(&json!({ "tier": "one_shot" }))
        .send()
        .await?
        .json()
        .await?;
    let context_id = created["context_id"]
        .as_str()
        .with_context(|| format!("context service did not create a context: {created}"))?;
    let trace_id = format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>());
    let envelope: Value = client
        .post(format!("{}/v1/invoke", stack.router))
        .bearer_auth(token)
        .header(
            "traceparent",
            format!("00-{trace_id}-{:016x}-01", rand::random::<u64>()),
        )
        .json(&json!({
            "capability": "intent.parse",
            "session_id": format!("session-{user}"),
            "context_id": context_id,
            "timeout_ms": 10_000,
            "payload": { "user_id": user, "text": question },
        }))
        .send()
        .await?
        .json()
        .await?;
    if envelope["status"] != "succeeded" {
        anyhow::bail!("the call failed: {}", envelope["error"]);
    }
    let chain: Chain = serde_json::from_value(envelope["output"].clone()).context("unexpected answer shape")?;
    Ok((chain, envelope, trace_id))
}
