//! `agent-reach dev`: every service in one process on embedded stores, with a
//! freshly generated HS256 secret, so a newcomer sees the system with nothing
//! installed. Authentication stays ON: the command prints a token to use.
//!
//! Today this runs the registry; the router, context service and example
//! agents join as they are built.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent_reach_access::AuthConfig;
use agent_reach_registry::config::{Settings, StoreChoice};
use agent_reach_registry::RegistryConfig;
use anyhow::Context;
use rand::RngCore;

/// The example policy, used when no acl.yaml is in the working directory.
const EXAMPLE_ACL: &str = include_str!("../../acl.yaml");

#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// Registry address (port 0 picks a free port).
    #[arg(long, env = "AGENT_REACH_DEV_REGISTRY_LISTEN", default_value = "127.0.0.1:7400")]
    registry_listen: SocketAddr,
    /// Use this etcd instead of the embedded registry store.
    #[arg(long, env = "AGENT_REACH_ETCD", value_delimiter = ',', value_name = "URL,...")]
    etcd: Vec<String>,
    /// Access policy. Default: ./acl.yaml if present, else the built-in example policy.
    #[arg(long, env = "AGENT_REACH_ACL")]
    acl: Option<PathBuf>,
}

pub async fn run(args: DevArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let workdir = tempfile::Builder::new()
        .prefix("agent-reach-dev-")
        .tempdir()
        .context("creating a temp dir for the dev secret")?;
    let mut secret = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut secret);
    let secret_hex: String = secret.iter().map(|byte| format!("{byte:02x}")).collect();
    let secret_file = workdir.path().join("hs256.secret");
    std::fs::write(&secret_file, &secret_hex).context("writing the dev secret")?;

    let acl = match &args.acl {
        Some(path) => path.clone(),
        None if std::path::Path::new("acl.yaml").exists() => PathBuf::from("acl.yaml"),
        None => {
            let path = workdir.path().join("acl.yaml");
            std::fs::write(&path, EXAMPLE_ACL).context("writing the example ACL")?;
            path
        }
    };
    let store = if args.etcd.is_empty() {
        StoreChoice::Embedded
    } else {
        StoreChoice::Etcd(args.etcd.clone())
    };
    let settings = Settings {
        listen: args.registry_listen,
        store,
        acl: acl.clone(),
        auth: AuthConfig::Hs256SecretFile(secret_file.clone()),
        service: RegistryConfig::default(),
    };
    let registry = agent_reach_registry::build(&settings).await?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {} (pass --registry-listen)", settings.listen))?;
    let registry_addr = listener.local_addr()?;

    let token =
        agent_reach_access::token::issue_hs256("order_query", secret_hex.as_bytes(), Duration::from_secs(86_400))
            .map_err(anyhow::Error::msg)?;
    println!("Agent-Reach dev is running (embedded stores, authentication on).");
    println!();
    println!("  registry   http://{registry_addr}   (gRPC and HTTP/JSON)");
    println!("  acl        {}", acl.display());
    println!("  secret     {}", secret_file.display());
    println!();
    println!("A token for agent `order_query` (24 h):");
    println!("  export TOKEN={token}");
    println!(
        "More tokens: agent-reach token issue --name NAME --secret-file {}",
        secret_file.display()
    );
    println!();
    println!("Register an instance and list capabilities:");
    println!(
        "  curl -s -X POST http://{registry_addr}/v1/agents -H \"Authorization: Bearer $TOKEN\" -H 'content-type: application/json' \\\n    -d '{{\"agent_id\":\"order_query-1\",\"name\":\"order_query\",\"endpoint\":\"http://127.0.0.1:9101/invoke\",\"status\":\"ready\",\"capabilities\":[{{\"name\":\"order.query\",\"version\":\"1.2.0\"}}]}}'"
    );
    println!("  curl -s http://{registry_addr}/v1/capabilities/order.query -H \"Authorization: Bearer $TOKEN\"");
    println!();
    println!("Ctrl-C stops everything.");

    agent_reach_registry::serve(listener, registry, shutdown).await?;
    drop(workdir);
    Ok(())
}
