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
}

/// The example scenario's capabilities (what `dev` and `demo` wait for).
pub(crate) const CAPABILITIES: [&str; 4] = ["intent.parse", "order.query", "shipping.rules", "reply.write"];

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
    outln!("Starting registry, router, context service and 6 example agents (embedded stores) ...");
    let stack = Stack::start(StackOptions {
        registry_listen: any_port,
        router_listen: any_port,
        context_listen: any_port,
        etcd: Vec::new(),
        redis: None,
        acl: None,
        agents: agent_reach_examples::scenario_instances(),
    })
    .await?;
    let outcome = scenario(&stack, &args).await;
    stack.shutdown().await;
    outcome
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
