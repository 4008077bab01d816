//! The Rust SDK's conformance agent (`sdk/contract/README.md`): what every
//! SDK's agent serves, for the one contract driver (`sdk/contract/driver.py`,
//! run by `examples/tests/contract.rs`). Configured by the environment the
//! driver sets: `AGENT_REACH_REGISTRY`, `AGENT_REACH_ROUTER`,
//! `AGENT_REACH_TOKEN`, `AGENT_REACH_LISTEN`, `AGENT_REACH_ENDPOINT`,
//! `CONTRACT_AGENT_ID`, `CONTRACT_UNAVAILABLE`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use agent_reach_sdk::{handler, Agent, Ctx, Handler, HandlerError};
use anyhow::Context;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

static RUNS: AtomicU64 = AtomicU64::new(0);
static UNAVAILABLE: AtomicBool = AtomicBool::new(false);
static AGENT_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();

#[derive(Deserialize, Serialize, JsonSchema)]
struct Text {
    text: String,
}

#[derive(Serialize, JsonSchema)]
struct Echoed {
    text: String,
    runs: u64,
}

#[derive(Deserialize, JsonSchema)]
struct Sleep {
    ms: u64,
}

#[derive(Serialize, JsonSchema)]
struct Slept {
    slept: u64,
}

#[derive(Deserialize, JsonSchema)]
struct Count {
    n: u64,
}

#[derive(Serialize, JsonSchema)]
struct Item {
    i: u64,
}

#[derive(Deserialize, JsonSchema)]
struct Nothing {}

#[derive(Serialize, JsonSchema)]
struct Served {
    agent_id: String,
}

#[handler(capability = "test.contract.echo", version = "1.0.0")]
async fn echo(_ctx: Ctx, input: Text) -> Result<Echoed, HandlerError> {
    let runs = RUNS.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(Echoed { text: input.text, runs })
}

#[handler(capability = "test.contract.slow", version = "1.0.0")]
async fn slow(_ctx: Ctx, input: Sleep) -> Result<Slept, HandlerError> {
    tokio::time::sleep(Duration::from_millis(input.ms)).await;
    Ok(Slept { slept: input.ms })
}

#[handler(capability = "test.contract.flaky", version = "1.0.0")]
async fn flaky(_ctx: Ctx, _input: Nothing) -> Result<Served, HandlerError> {
    if UNAVAILABLE.load(Ordering::Relaxed) {
        return Err(HandlerError::unavailable("this instance is not taking work"));
    }
    Ok(Served {
        agent_id: AGENT_ID.get().cloned().unwrap_or_default(),
    })
}

fn count(_ctx: Ctx, input: Count) -> impl futures::Stream<Item = Result<Item, HandlerError>> {
    futures::stream::iter((0..input.n).map(|i| Ok(Item { i })))
}

#[handler(capability = "test.contract.task", version = "1.0.0")]
async fn task(ctx: Ctx, input: Text) -> Result<Text, HandlerError> {
    ctx.accept_and_report(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(Text {
            text: input.text.to_uppercase(),
        })
    })
    .await
}

fn env(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let agent_id = env("CONTRACT_AGENT_ID")?;
    UNAVAILABLE.store(
        std::env::var("CONTRACT_UNAVAILABLE").is_ok_and(|value| value == "1"),
        Ordering::Relaxed,
    );
    let _ = AGENT_ID.set(agent_id.clone());
    let listen: SocketAddr = env("AGENT_REACH_LISTEN")?
        .parse()
        .context("AGENT_REACH_LISTEN is not HOST:PORT")?;
    let agent = Agent::builder("contract_agent", &agent_id)
        .registry(&env("AGENT_REACH_REGISTRY")?)
        .router(&env("AGENT_REACH_ROUTER")?)
        .token(env("AGENT_REACH_TOKEN")?)
        .listen(listen)
        .endpoint(&env("AGENT_REACH_ENDPOINT")?)
        .ttl_s(3)
        .handler(echo)
        .handler(slow)
        .handler(flaky)
        .handler(Handler::streaming("test.contract.count", "1.0.0", count))
        .handler(task)
        .start()
        .await?;
    agent.mark_ready();
    agent.run_until_signal().await;
    Ok(())
}
