//! Runs one example agent as its own process against running services:
//!
//! ```sh
//! example-agent --agent order_query --agent-id order_query-1 --weight 3 \
//!     --registry http://127.0.0.1:7400 --router http://127.0.0.1:7500 \
//!     --context http://127.0.0.1:7600 --token "$(agent-reach token issue --name order_query --secret-file S)"
//! ```

use agent_reach_examples::{start_instance, InstanceSpec, Services, AGENT_NAMES};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "Run one agent of the \"Can my order ship today?\" example.")]
struct Args {
    /// intent_parser | order_query | shipping_rules | reply_writer
    #[arg(long)]
    agent: String,
    /// Unique id of this instance (default: AGENT-1).
    #[arg(long)]
    agent_id: Option<String>,
    #[arg(long, default_value_t = 1)]
    weight: u32,
    #[arg(long, env = "AGENT_REACH_REGISTRY", default_value = "http://127.0.0.1:7400")]
    registry: String,
    #[arg(long, env = "AGENT_REACH_ROUTER", default_value = "http://127.0.0.1:7500")]
    router: String,
    #[arg(long, env = "AGENT_REACH_CONTEXT", default_value = "http://127.0.0.1:7600")]
    context: String,
    /// JWT whose `sub` is the agent name.
    #[arg(long, env = "AGENT_REACH_TOKEN")]
    token: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let args = Args::parse();
    let Some(name) = AGENT_NAMES.iter().find(|name| **name == args.agent) else {
        anyhow::bail!("unknown agent `{}`; one of {}", args.agent, AGENT_NAMES.join(", "));
    };
    let spec = InstanceSpec {
        name,
        agent_id: args.agent_id.unwrap_or_else(|| format!("{name}-1")),
        weight: args.weight,
    };
    let services = Services {
        registry: args.registry,
        router: args.router,
        context: args.context,
    };
    let agent = start_instance(&spec, &services, args.token).await?;
    eprintln!("{} serving on {}", spec.agent_id, agent.local_addr());
    agent.run_until_signal().await;
    Ok(())
}
