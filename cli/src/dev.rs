//! `agent-reach dev`: the whole system in one process (see [`crate::stack`]),
//! printing URLs, a token and a ready-to-paste `curl`.

use std::fmt::Write as _;
use std::future::Future;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent_reach_examples::stack::{Stack, StackOptions};

#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// Registry address (port 0 picks a free port).
    #[arg(long, env = "AGENT_REACH_DEV_REGISTRY_LISTEN", default_value = "127.0.0.1:7400")]
    pub registry_listen: SocketAddr,
    /// Router address.
    #[arg(long, env = "AGENT_REACH_DEV_ROUTER_LISTEN", default_value = "127.0.0.1:7500")]
    pub router_listen: SocketAddr,
    /// Context service address.
    #[arg(long, env = "AGENT_REACH_DEV_CONTEXT_LISTEN", default_value = "127.0.0.1:7600")]
    pub context_listen: SocketAddr,
    /// Use this etcd instead of the embedded registry store.
    #[arg(long, env = "AGENT_REACH_ETCD", value_delimiter = ',', value_name = "URL,...")]
    pub etcd: Vec<String>,
    /// Use this Redis instead of the embedded context store.
    #[arg(long, env = "AGENT_REACH_REDIS", value_name = "URL")]
    pub redis: Option<String>,
    /// Access policy (default: the example's policy, examples/acl.yaml).
    #[arg(long, env = "AGENT_REACH_ACL")]
    pub acl: Option<PathBuf>,
    /// Do not start the example agents.
    #[arg(long)]
    pub no_agents: bool,
}

pub async fn run(args: DevArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let stack = Stack::start(StackOptions {
        registry_listen: args.registry_listen,
        router_listen: args.router_listen,
        context_listen: args.context_listen,
        etcd: args.etcd.clone(),
        redis: args.redis.clone(),
        acl: args.acl.clone(),
        agents: if args.no_agents {
            Vec::new()
        } else {
            agent_reach_examples::scenario_instances()
        },
    })
    .await?;
    // The banner's commands must work the moment they are printed: wait until
    // the router's snapshot has every example capability (it follows the registry
    // through its watch, a moment after the agents register).
    if !args.no_agents {
        if let Err(error) = stack
            .wait_until_routable(&crate::demo::CAPABILITIES, Duration::from_secs(15))
            .await
        {
            tracing::warn!(message = "The example agents are not routable yet; calls may fail until they are.", %error);
        }
    }
    let token = stack.token("demo_user", Duration::from_secs(86_400))?;
    let stores = match (args.etcd.is_empty(), args.redis.is_none()) {
        (true, true) => "embedded stores",
        (false, false) => "etcd and Redis",
        (false, true) => "etcd, embedded context store",
        (true, false) => "embedded registry store, Redis",
    };
    // One write, and a closed stdout (`agent-reach dev | head`, a test that read
    // what it needed) does not stop the stack: `println!` would panic on EPIPE.
    let mut banner = String::new();
    let _ = writeln!(banner, "Agent-Reach dev is running ({stores}, authentication on).");
    let _ = writeln!(banner);
    let _ = writeln!(banner, "  registry   {}   (gRPC and HTTP/JSON)", stack.registry);
    let _ = writeln!(banner, "  router     {}", stack.router);
    let _ = writeln!(banner, "  context    {}", stack.context);
    let _ = writeln!(banner, "  acl        {}", stack.acl.display());
    let _ = writeln!(banner, "  secret     {}", stack.secret_file.display());
    for agent in &stack.agents {
        let _ = writeln!(
            banner,
            "  agent      {:<18} http://{}",
            agent.agent_id(),
            agent.local_addr()
        );
    }
    let _ = writeln!(banner);
    let _ = writeln!(banner, "A token for caller `demo_user` (24 h):");
    let _ = writeln!(banner, "  export TOKEN={token}");
    let _ = writeln!(
        banner,
        "More tokens: cargo run -p agent-reach-cli -- token issue --name NAME --secret-file {}",
        stack.secret_file.display()
    );
    let _ = writeln!(banner);
    let _ = writeln!(
        banner,
        "Ask the example agents whether an order ships today (a context first, then the call):"
    );
    let _ = writeln!(
        banner,
        "  CTX=$(curl -s -X POST {}/v1/contexts -H \"Authorization: Bearer $TOKEN\" -H 'content-type: application/json' -d '{{}}' | sed 's/.*\"context_id\":\"\\([^\"]*\\)\".*/\\1/')",
        stack.context
    );
    let _ = writeln!(
        banner,
        "  curl -s {}/v1/invoke -H \"Authorization: Bearer $TOKEN\" -H 'content-type: application/json' \\\n    -d '{{\"capability\":\"intent.parse\",\"context_id\":\"'$CTX'\",\"payload\":{{\"user_id\":\"u_123\",\"text\":\"Can my order SO-2024001 ship today?\"}}}}'",
        stack.router
    );
    let _ = writeln!(
        banner,
        "  curl -s {}/v1/capabilities -H \"Authorization: Bearer $TOKEN\"",
        stack.registry
    );
    let _ = writeln!(banner);
    let _ = writeln!(banner, "Ctrl-C stops everything.");
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(banner.as_bytes()).and_then(|()| stdout.flush());
    drop(stdout);
    shutdown.await;
    stack.shutdown().await;
    Ok(())
}
