//! `agent-reach`: one binary that runs each service and operates them.
//!
//! Every flag can also be set with an `AGENT_REACH_*` environment variable
//! (see `--help` of each subcommand).

/// mimalloc: under load glibc malloc (with its arena
/// locks) took 15-20 % of the router's and context service's CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[macro_use]
mod out;
mod access;
mod canary;
mod cards;
mod connection;
mod console;
mod demo;
mod dev;
#[cfg(test)]
mod manifests;
mod ops;
mod plugins;
mod tasks;
mod tenants;
mod trail;

#[derive(Debug, Parser)]
#[command(name = "agent-reach", version, about = "Make AI agents reachable by capability.")]
struct Cli {
    /// Log format: `text` for people, `json` for log pipelines.
    #[arg(long, env = "AGENT_REACH_LOG_FORMAT", default_value = "text", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

// Parsed once at start-up: the size of the largest variant (the router's
// flags) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the registry: agents register capabilities under etcd leases.
    Registry(agent_reach_registry::RegistryArgs),
    /// Run the router: authenticated, schema-checked, weighted, retrying capability calls.
    Router(agent_reach_router::RouterArgs),
    /// Run the context service: versioned, access-controlled session context in Redis.
    Context(agent_reach_context::ContextArgs),
    /// Run every service and the example agents in one process on embedded stores (development).
    Dev(dev::DevArgs),
    /// Run "Can my order ship today?" end to end and print each hop and the answer.
    Demo(demo::DemoArgs),
    /// Registered agent instances (against a running registry).
    Agents {
        #[command(subcommand)]
        command: ops::AgentsCommand,
        #[command(flatten)]
        connection: ops::Connection,
    },
    /// Registered capabilities (against a running registry).
    Capabilities {
        #[command(subcommand)]
        command: ops::CapabilitiesCommand,
        #[command(flatten)]
        connection: ops::Connection,
    },
    /// Call a capability through a running router.
    Invoke {
        #[command(flatten)]
        args: ops::InvokeArgs,
        #[command(flatten)]
        connection: ops::Connection,
    },
    /// The slow path's dead letters, against a running router (operators).
    Tasks {
        #[command(subcommand)]
        command: tasks::TasksCommand,
        #[command(flatten)]
        connection: ops::Connection,
    },
    /// Print a short-lived sign-in link to a running router's operator console (operators).
    Console {
        #[command(flatten)]
        args: console::ConsoleArgs,
        #[command(flatten)]
        connection: ops::Connection,
    },
    /// A running router's recent calls: look one up by request id, or list them (operators).
    Requests {
        #[command(subcommand)]
        command: console::RequestsCommand,
        #[command(flatten)]
        connection: ops::Connection,
    },
    /// The tenants a running router serves: placement, quotas, usage (operators of its home tenant).
    Tenants {
        #[command(subcommand)]
        command: tenants::TenantsCommand,
        #[command(flatten)]
        connection: ops::Connection,
    },
    /// The trail: show a collaboration as a tree, verify the chains, replay recorded inputs (operators, auditors).
    Trail {
        #[command(subcommand)]
        command: trail::TrailCommand,
        #[command(flatten)]
        connection: ops::Connection,
    },
    /// Access requests: ask to call a capability, approve or deny (owners), revoke, export the grants.
    Access {
        #[command(subcommand)]
        command: access::AccessCommand,
        #[command(flatten)]
        connection: ops::Connection,
    },
    /// A2A agent cards: verify the signature of one (the router signs every card it serves).
    Cards {
        #[command(subcommand)]
        command: cards::CardsCommand,
    },
    /// Check the access policy (the file, and the registry's live grants when a token is given).
    Acl {
        #[command(subcommand)]
        command: AclCommand,
    },
    /// Exit 0 when URL answers 2xx (container health checks: the runtime image has no curl).
    Healthcheck(ops::HealthcheckArgs),
    /// Issue and inspect tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// The router's assertion keys (Ed25519): make one, or print the JWKS agents verify with.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Write a new Ed25519 private key (PKCS#8 PEM, mode 0600) for `router --assertion-key`; prints its key id.
    Generate {
        /// Where to write the key; an existing file is never overwritten.
        #[arg(long)]
        out: PathBuf,
    },
    /// Print the JWKS document publishing the public halves of KEY files (for agents given a keys file).
    Jwks {
        /// Private key files, as the router reads them.
        #[arg(required = true)]
        keys: Vec<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum AclCommand {
    /// May CALLER call CAPABILITY (by acl.yaml, or a live grant)? Exit code 0 when allowed, 1 when denied.
    Check {
        #[command(flatten)]
        args: access::AclCheckArgs,
        /// Print JSON instead of a sentence.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Print an HS256 token whose `sub` is NAME.
    Issue {
        /// The agent (or caller) name the token speaks for.
        #[arg(long)]
        name: String,
        /// The shared HS256 secret file the services verify with.
        #[arg(long, env = "AGENT_REACH_AUTH_HS256_SECRET_FILE")]
        secret_file: PathBuf,
        /// Validity, e.g. 30s, 15m, 24h, 7d.
        #[arg(long, default_value = "24h", value_parser = parse_duration)]
        ttl: Duration,
        /// The tenant the token belongs to (its `tenant` claim); without it, `default`.
        #[arg(long)]
        tenant: Option<String>,
        /// A group the caller belongs to (its `groups` claim; repeatable), for `group:NAME` rules.
        #[arg(long = "group", value_name = "GROUP")]
        groups: Vec<String>,
    },
}

/// Parses `90s`, `15m`, `24h`, `7d` (or plain seconds).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like 30s, 15m, 24h or 7d"))?;
    let seconds = match unit {
        "" | "s" => number,
        "m" => number * 60,
        "h" => number * 3600,
        "d" => number * 86_400,
        _ => return Err(format!("unknown unit `{unit}` in `{text}`; use s, m, h or d")),
    };
    Ok(Duration::from_secs(seconds))
}

/// `default` applies when `RUST_LOG` is unset; `service` names exported spans
/// (`OTEL_SERVICE_NAME` wins). Spans are exported over OTLP when the `OTEL_*`
/// variables ask for it (`agent-reach-telemetry`); the guard flushes them on exit.
fn init_logging(
    format: LogFormat,
    default: &str,
    service: &str,
) -> anyhow::Result<agent_reach_telemetry::TelemetryGuard> {
    agent_reach_telemetry::init(&agent_reach_telemetry::Options {
        format: match format {
            LogFormat::Text => agent_reach_telemetry::LogFormat::Text,
            LogFormat::Json => agent_reach_telemetry::LogFormat::Json,
        },
        default_filter: default.to_string(),
        service_name: service.to_string(),
    })
    .context("setting up logging and tracing")
}

/// Resolves on SIGINT (ctrl-c) or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::warn!(message = "Cannot listen for SIGTERM; only ctrl-c stops the service.", %error);
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!(message = "Shutting down.");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Services log their lifecycle; client commands and the demo keep their output clean.
    let default_level = match cli.command {
        Command::Registry(_) | Command::Router(_) | Command::Context(_) | Command::Dev(_) => "info",
        _ => "warn",
    };
    let service = match cli.command {
        Command::Registry(_) => "agent-reach-registry",
        Command::Router(_) => "agent-reach-router",
        Command::Context(_) => "agent-reach-context",
        _ => "agent-reach",
    };
    let _telemetry = init_logging(cli.log_format, default_level, service)?;
    match cli.command {
        Command::Registry(args) => agent_reach_registry::run(args, shutdown_signal()).await,
        Command::Router(args) => agent_reach_router::run_with_plugins(args, plugins::all()?, shutdown_signal()).await,
        Command::Context(args) => agent_reach_context::run(args, shutdown_signal()).await,
        Command::Dev(args) => dev::run(args, shutdown_signal()).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Agents { command, connection } => ops::agents(&connection, command).await,
        Command::Capabilities { command, connection } => ops::capabilities(&connection, command).await,
        Command::Invoke { args, connection } => ops::invoke(&connection, args).await,
        Command::Tasks { command, connection } => tasks::tasks(&connection, command).await,
        Command::Console { args, connection } => console::console(&connection, args).await,
        Command::Requests { command, connection } => console::requests(&connection, command).await,
        Command::Tenants { command, connection } => tenants::tenants(&connection, command).await,
        Command::Trail { command, connection } => match trail::trail(&connection, command).await {
            Err(error) if error.downcast_ref::<trail::Coded>().is_some() => {
                // A failure with a stable code: printed as such, exit status 2.
                eprintln!("{error}");
                std::process::exit(2);
            }
            other => other,
        },
        Command::Healthcheck(args) => ops::healthcheck(&args).await,
        Command::Acl {
            command: AclCommand::Check { args, json },
        } => access::acl_check(&args, json).await,
        Command::Access { command, connection } => access::access(&connection, command).await,
        Command::Keys { command } => keys(command),
        Command::Cards { command } => match cards::cards(command).await {
            // 1: the card does not verify; 2: it or its keys could not be read.
            0 => Ok(()),
            status => std::process::exit(status),
        },
        Command::Token {
            command:
                TokenCommand::Issue {
                    name,
                    secret_file,
                    ttl,
                    tenant,
                    groups,
                },
        } => {
            let secret = agent_reach_access::token::read_hs256_secret(&secret_file).map_err(anyhow::Error::msg)?;
            let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
            let token = agent_reach_access::token::issue_hs256_groups(&name, tenant.as_deref(), &groups, &secret, ttl)
                .map_err(anyhow::Error::msg)?;
            outln!("{token}");
            Ok(())
        }
    }
    .context("agent-reach failed")
}

fn keys(command: KeysCommand) -> anyhow::Result<()> {
    use agent_reach_access::AssertionKey;
    match command {
        KeysCommand::Generate { out } => {
            let (key, pem) = AssertionKey::generate().map_err(anyhow::Error::msg)?;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt as _;
                options.mode(0o600);
            }
            let mut file = options
                .open(&out)
                .with_context(|| format!("cannot create {} (an existing key is never overwritten)", out.display()))?;
            std::io::Write::write_all(&mut file, pem.as_bytes())
                .with_context(|| format!("writing {}", out.display()))?;
            outln!("{}", key.kid());
            Ok(())
        }
        KeysCommand::Jwks { keys } => {
            let mut loaded = Vec::new();
            for path in &keys {
                let pem = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
                loaded.push(
                    AssertionKey::from_pkcs8_pem(&pem)
                        .map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?,
                );
            }
            outln!("{}", agent_reach_access::assertion::jwks(&loaded));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("3y").is_err());
        assert!(parse_duration("h").is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
