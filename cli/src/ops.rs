//! Operator commands against running services: tables for people, `--json`
//! for scripts.

use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

pub use crate::connection::Connection;
use crate::connection::{print_json, text};

#[derive(Debug, clap::Subcommand)]
pub enum AgentsCommand {
    /// List registered instances.
    Ls,
    /// Show one instance.
    Show { agent_id: String },
    /// Change a live instance's weight without re-registering it (operators;
    /// the agent's next registration sets its own weight again).
    Weight {
        agent_id: String,
        /// The new weight, 1..=1000.
        weight: u32,
    },
    /// Drain a live instance (operators): its status becomes `draining`, routers
    /// send it no new call, and it leaves when it stops or deregisters.
    Drain { agent_id: String },
}

#[derive(Debug, clap::Subcommand)]
pub enum CapabilitiesCommand {
    /// List capabilities with versions and instance counts.
    Ls,
    /// Routable instances of one capability (best matching version).
    Show {
        name: String,
        /// Semver requirement, e.g. ^1.2.
        #[arg(long)]
        version: Option<String>,
    },
    /// Split unpinned calls between versions (operators): `split NAME
    /// 2.0.0=5 1.4.2=95`; `--clear` removes the split; neither shows it.
    Split {
        name: String,
        /// VERSION=WEIGHT pairs (relative integer weights, 0..=10000).
        #[arg(conflicts_with = "clear")]
        shares: Vec<String>,
        /// Remove the split: unpinned calls go to the highest routable version again.
        #[arg(long)]
        clear: bool,
    },
    /// The policy a capability's calls use when they name none (operators):
    /// `policy NAME adaptive`; `--clear` removes it; neither shows it.
    Policy {
        name: String,
        /// weighted_round_robin, least_connections, consistent_hash, p2c_ewma, adaptive or plugin:NAME.
        #[arg(conflicts_with = "clear")]
        policy: Option<String>,
        /// Remove it: the capability's calls use each router's default again.
        #[arg(long)]
        clear: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct InvokeArgs {
    /// Capability to call, e.g. order.query.
    pub capability: String,
    /// The payload, as JSON.
    #[arg(long, default_value = "{}")]
    pub data: String,
    /// Semver requirement for the capability.
    #[arg(long)]
    pub version: Option<String>,
    #[arg(long)]
    pub session_id: Option<String>,
    #[arg(long)]
    pub context_id: Option<String>,
    #[arg(long)]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, clap::Args)]
pub struct HealthcheckArgs {
    /// The service's health URL, e.g. http://127.0.0.1:7500/healthz.
    #[arg(env = "AGENT_REACH_HEALTHCHECK_URL")]
    pub url: String,
    /// Give up after this many milliseconds (a hung service is unhealthy).
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
}

pub async fn agents(connection: &Connection, command: AgentsCommand) -> anyhow::Result<()> {
    match command {
        AgentsCommand::Ls => {
            let list = connection.get(format!("{}/v1/agents", connection.registry)).await?;
            if connection.json {
                return print_json(&list);
            }
            outln!(
                "{:<24} {:<16} {:<11} {:>6}  {:<32} capabilities",
                "AGENT_ID",
                "NAME",
                "STATUS",
                "WEIGHT",
                "ENDPOINT"
            );
            for agent in list["agents"].as_array().into_iter().flatten() {
                let capabilities: Vec<String> = agent["capabilities"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|capability| format!("{}@{}", text(&capability["name"]), text(&capability["version"])))
                    .collect();
                outln!(
                    "{:<24} {:<16} {:<11} {:>6}  {:<32} {}",
                    text(&agent["agent_id"]),
                    text(&agent["name"]),
                    text(&agent["status"]),
                    text(&agent["weight"]),
                    text(&agent["endpoint"]),
                    capabilities.join(", ")
                );
            }
            Ok(())
        }
        AgentsCommand::Show { agent_id } => {
            let agent = connection
                .get(format!("{}/v1/agents/{agent_id}", connection.registry))
                .await?;
            print_json(&agent)
        }
        AgentsCommand::Weight { agent_id, weight } => crate::canary::weight(connection, &agent_id, weight).await,
        AgentsCommand::Drain { agent_id } => crate::canary::drain(connection, &agent_id).await,
    }
}

pub async fn capabilities(connection: &Connection, command: CapabilitiesCommand) -> anyhow::Result<()> {
    match command {
        CapabilitiesCommand::Ls => {
            let list = connection
                .get(format!("{}/v1/capabilities", connection.registry))
                .await?;
            if connection.json {
                return print_json(&list);
            }
            outln!("{:<28} {:>9} {:>9}  versions", "CAPABILITY", "INSTANCES", "ROUTABLE");
            for capability in list["capabilities"].as_array().into_iter().flatten() {
                let versions: Vec<String> = capability["versions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(text)
                    .collect();
                outln!(
                    "{:<28} {:>9} {:>9}  {}",
                    text(&capability["name"]),
                    text(&capability["instances"]),
                    text(&capability["routable_instances"]),
                    versions.join(", ")
                );
            }
            Ok(())
        }
        CapabilitiesCommand::Show { name, version } => {
            let query = version
                .map(|version| format!("?version={}", urlencode(&version)))
                .unwrap_or_default();
            let resolved = connection
                .get(format!("{}/v1/capabilities/{name}{query}", connection.registry))
                .await?;
            if connection.json {
                return print_json(&resolved);
            }
            outln!(
                "{} {}  (available: {})",
                name,
                text(&resolved["version"]),
                resolved["available_versions"]
            );
            outln!("{:<24} {:<11} {:>6}  ENDPOINT", "AGENT_ID", "STATUS", "WEIGHT");
            for instance in resolved["instances"].as_array().into_iter().flatten() {
                outln!(
                    "{:<24} {:<11} {:>6}  {}",
                    text(&instance["agent_id"]),
                    text(&instance["status"]),
                    text(&instance["weight"]),
                    text(&instance["endpoint"])
                );
            }
            Ok(())
        }
        CapabilitiesCommand::Split { name, shares, clear } => {
            crate::canary::split(connection, &name, &shares, clear).await
        }
        CapabilitiesCommand::Policy { name, policy, clear } => {
            crate::canary::policy(connection, &name, policy.as_deref(), clear).await
        }
    }
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-' | b'_' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

pub async fn invoke(connection: &Connection, args: InvokeArgs) -> anyhow::Result<()> {
    let payload: Value = serde_json::from_str(&args.data).context("--data is not valid JSON")?;
    let mut envelope = serde_json::json!({ "capability": args.capability, "payload": payload });
    for (field, value) in [
        ("capability_version", args.version.map(Value::from)),
        ("session_id", args.session_id.map(Value::from)),
        ("context_id", args.context_id.map(Value::from)),
        ("timeout_ms", args.timeout_ms.map(Value::from)),
    ] {
        if let Some(value) = value {
            envelope[field] = value;
        }
    }
    let url = format!("{}/v1/invoke", connection.router);
    let response = reqwest::Client::new()
        .post(&url)
        .bearer_auth(connection.token()?)
        .json(&envelope)
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?;
    let result: Value = response.json().await.context("the router answered without JSON")?;
    if connection.json {
        print_json(&result)?;
    } else if result["status"] == "succeeded" {
        outln!(
            "succeeded: {} {} on {} ({} attempt(s), {} ms)",
            text(&result["capability"]),
            text(&result["capability_version"]),
            text(&result["agent_id"]),
            text(&result["attempts"]),
            text(&result["duration_ms"])
        );
        outln!("{}", serde_json::to_string_pretty(&result["output"])?);
    } else {
        outln!(
            "failed: {} — {}",
            text(&result["error"]["code"]),
            text(&result["error"]["message"])
        );
    }
    if result["status"] != "succeeded" {
        anyhow::bail!("the call failed");
    }
    Ok(())
}

/// `GET url`: success on 2xx, otherwise an error naming the status (exit 1).
/// Container images run this as their health check, so it needs no shell.
pub async fn healthcheck(args: &HealthcheckArgs) -> anyhow::Result<()> {
    if !(args.url.starts_with("http://") || args.url.starts_with("https://")) {
        anyhow::bail!("URL `{}` must start with http:// or https://", args.url);
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(args.timeout_ms.max(1)))
        .build()
        .context("building the HTTP client")?;
    let response = client
        .get(&args.url)
        .send()
        .await
        .with_context(|| format!("cannot reach {} within {} ms", args.url, args.timeout_ms))?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        let body: String = body.chars().take(200).collect();
        anyhow::bail!("{} answered {status}: {body}", args.url);
    }
    outln!("healthy: {} answered {status}", args.url);
    Ok(())
}
