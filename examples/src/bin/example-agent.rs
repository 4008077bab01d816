//! Runs one example agent as its own process against running services:
//!
//! ```sh
//! example-agent --agent order_query --agent-id order_query-1 --weight 3 \
//!     --registry http://127.0.0.1:7400 --router http://127.0.0.1:7500 \
//!     --context http://127.0.0.1:7600 --token "$(agent-reach token issue --name order_query --secret-file S)"
//! ```
//!
//! In a container, listen on all interfaces and register the name other
//! containers reach it by (`--listen 0.0.0.0:9101 --endpoint
//! http://order-query-1:9101`), and read the token from a mounted file
//! (`--token-file`); `deploy/compose/docker-compose.yml` does this.

use std::net::SocketAddr;
use std::path::PathBuf;

use agent_reach_examples::{start_instance_at, InstanceSpec, Placement, Services, AGENT_NAMES};
use anyhow::Context;
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
    /// Address the agent serves on (port 0 picks a free port).
    #[arg(long, env = "AGENT_REACH_AGENT_LISTEN", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Externally reachable base URL the router forwards to, e.g.
    /// http://order-query-1:9101 (default: the bound address, right only when
    /// the router runs on the same host).
    #[arg(long, env = "AGENT_REACH_AGENT_ENDPOINT", value_name = "URL")]
    endpoint: Option<String>,
    #[arg(long, env = "AGENT_REACH_REGISTRY", default_value = "http://127.0.0.1:7400")]
    registry: String,
    #[arg(long, env = "AGENT_REACH_ROUTER", default_value = "http://127.0.0.1:7500")]
    router: String,
    #[arg(long, env = "AGENT_REACH_CONTEXT", default_value = "http://127.0.0.1:7600")]
    context: String,
    /// JWT whose `sub` is the agent name.
    #[arg(
        long,
        env = "AGENT_REACH_TOKEN",
        hide_env_values = true,
        required_unless_present = "token_file",
        conflicts_with = "token_file"
    )]
    token: Option<String>,
    /// File holding that JWT (a mounted secret).
    #[arg(long, env = "AGENT_REACH_TOKEN_FILE", value_name = "PATH")]
    token_file: Option<PathBuf>,
}

impl Args {
    fn token(&self) -> anyhow::Result<String> {
        match (&self.token, &self.token_file) {
            (Some(token), _) => Ok(token.clone()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read --token-file {}", path.display()))?;
                let token = text.trim();
                if token.is_empty() {
                    anyhow::bail!("--token-file {} is empty", path.display());
                }
                Ok(token.to_string())
            }
            // clap enforces one of the two (`required_unless_present`).
            (None, None) => anyhow::bail!("no token: pass --token JWT or --token-file PATH"),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let args = Args::parse();
    let Some(name) = AGENT_NAMES.iter().find(|name| **name == args.agent) else {
        anyhow::bail!("unknown agent `{}`; one of {}", args.agent, AGENT_NAMES.join(", "));
    };
    if let Some(endpoint) = &args.endpoint {
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            anyhow::bail!("--endpoint `{endpoint}` must start with http:// or https://");
        }
    }
    let token = args.token()?;
    let spec = InstanceSpec {
        name,
        agent_id: args.agent_id.clone().unwrap_or_else(|| format!("{name}-1")),
        weight: args.weight,
    };
    let services = Services {
        registry: args.registry,
        router: args.router,
        context: args.context,
    };
    let placement = Placement {
        listen: args.listen,
        endpoint: args.endpoint,
    };
    let agent = start_instance_at(&spec, &services, token, &placement).await?;
    eprintln!("{} serving on {}", spec.agent_id, agent.local_addr());
    agent.run_until_signal().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("example-agent").chain(args.iter().copied()))
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Args::command().debug_assert();
    }

    #[test]
    fn a_token_or_a_token_file_but_not_both() {
        // The environment of the test run must not decide these cases.
        for name in ["AGENT_REACH_TOKEN", "AGENT_REACH_TOKEN_FILE"] {
            assert!(std::env::var_os(name).is_none(), "unset {name} to run this test");
        }
        assert!(parse(&["--agent", "order_query"]).is_err(), "no token at all");
        assert!(parse(&["--agent", "order_query", "--token", "t", "--token-file", "f"]).is_err());
        let args = parse(&["--agent", "order_query", "--token", "t"]).unwrap();
        assert_eq!(args.token().unwrap(), "t");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "header.claims.signature\n").unwrap();
        let args = parse(&["--agent", "order_query", "--token-file", file.to_str().unwrap()]).unwrap();
        assert_eq!(
            args.token().unwrap(),
            "header.claims.signature",
            "trailing newline dropped"
        );
        std::fs::write(&file, "\n").unwrap();
        assert!(args.token().unwrap_err().to_string().contains("is empty"));
        let missing = parse(&["--agent", "order_query", "--token-file", "/nonexistent/token"]).unwrap();
        assert!(missing.token().unwrap_err().to_string().contains("cannot read"));
    }

    #[test]
    fn listen_and_endpoint_for_containers() {
        let args = parse(&[
            "--agent",
            "order_query",
            "--token",
            "t",
            "--listen",
            "0.0.0.0:9101",
            "--endpoint",
            "http://order-query-1:9101",
        ])
        .unwrap();
        assert_eq!(args.listen, "0.0.0.0:9101".parse::<SocketAddr>().unwrap());
        assert_eq!(args.endpoint.as_deref(), Some("http://order-query-1:9101"));
        assert!(parse(&["--agent", "order_query", "--token", "t", "--listen", "nowhere"]).is_err());
    }

    /// The Compose file runs the example agents with these flags: they must parse.
    #[test]
    fn compose_commands_parse() {
        for name in ["AGENT_REACH_TOKEN", "AGENT_REACH_TOKEN_FILE"] {
            assert!(std::env::var_os(name).is_none(), "unset {name} to run this test");
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/compose/docker-compose.yml");
        let mut file: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        file.apply_merge().unwrap();
        let mut agents = Vec::new();
        for (name, service) in file["services"].as_mapping().unwrap() {
            if service["build"]["target"].as_str() != Some("example-agent") {
                continue;
            }
            let command: Vec<&str> = service["command"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|arg| arg.as_str().unwrap())
                .collect();
            let args = parse(&command).unwrap_or_else(|error| panic!("{path} service {name:?}: {error}"));
            assert!(AGENT_NAMES.contains(&args.agent.as_str()), "{name:?}: unknown agent");
            assert!(args.token_file.is_some() && args.endpoint.is_some(), "{name:?}");
            agents.push(args.agent);
        }
        agents.sort();
        assert_eq!(
            agents,
            [
                "intent_parser",
                "order_query",
                "order_query",
                "order_query",
                "reply_writer",
                "shipping_rules"
            ],
            "the scenario's instances"
        );
    }
}
