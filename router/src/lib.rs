//! The router as deployed (DESIGN §3): its flags ([`config`]), one part per
//! tenant ([`parts`]): a call pipeline (`agent_reach_pipeline`) with every
//! door in front of it ([`app`]: the pipeline's own `/v1/invoke` and
//! broadcast, the slow path `agent_reach_tasks`, A2A `agent_reach_a2a`, MCP
//! `agent_reach_mcp`, the console `agent_reach_console`), the front door's
//! hot routes ([`front`]), the OAuth protected resource metadata and the
//! 401 challenge ([`protected_resource`]) and the OpenAPI description of it
//! all ([`openapi`]). This file is the crate's front: build, serve, run.
//!
//! Architecture invariant: the request path never calls the registry, etcd or
//! Redis, takes no global lock and never compiles a schema.

mod app;
mod config;
mod front;
mod openapi;
mod parts;
mod protected_resource;

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;

pub use agent_reach_access::{AssertionSettings, SigningKey};
pub use agent_reach_pipeline::policy::{Plugins, SelectionPolicy};
pub use agent_reach_pipeline::{RegistryCredential, Tuning};
pub use agent_reach_tasks::{Switch, TagLimit, TaskArgs, TasksSettings, TrailConfig, TrailOtlp};
pub use agent_reach_trail::TrailSettings;
pub use config::{RouterArgs, Settings};

use agent_reach_pipeline::RouterService;

/// A built router: the fast path and, with `--redis`, the slow path beside
/// it, for one tenant or, with a tenant map, for each tenant of the map
/// ([`tenancy`]). Cheap to clone; the background work (the registry watches,
/// the task workers) stops once every clone and every server using it is gone.
#[derive(Clone)]
pub struct Router {
    parts: Arc<parts::TenantParts>,
    /// The process's own series when the tenants' parts have their own (a tenant map).
    process_metrics: Option<prometheus::Registry>,
    tls: Option<agent_reach_serving::tls::ServerTls>,
}

impl Router {
    /// The whole API as one axum router (tests drive it in-process).
    pub fn app(&self) -> axum::Router {
        match &self.process_metrics {
            None => {
                let registry = self.parts.home().service.metrics().registry.clone();
                parts::single_routes(self.parts.clone(), registry)
            }
            Some(process) => parts::routes(self.parts.clone(), process.clone()),
        }
    }

    /// The front door serving this router: its hot route and every other route.
    fn door(&self) -> agent_reach_serving::front::Door<front::Invoke> {
        let home = self.parts.home();
        let hot = match &self.process_metrics {
            None => front::Invoke::One(home.clone()),
            Some(_) => front::Invoke::Tenants(self.parts.clone()),
        };
        front::door(self.app(), hot, home.service.tuning().max_body_bytes, self.tls.clone())
    }

    /// The home tenant's service (the only one without a tenant map).
    fn service(&self) -> Arc<RouterService> {
        self.parts.home().service.clone()
    }

    /// The instances the router can currently route to, by id (tests and diagnostics).
    pub fn routed_agent_ids(&self) -> Vec<String> {
        self.service().routed_agent_ids()
    }

    /// `capability`'s traffic split as the snapshot applies it: `(version,
    /// weight)` of the versions it can draw from, highest first (tests and diagnostics).
    pub fn routed_split(&self, capability: &str) -> Option<Vec<(String, u32)>> {
        self.service().routed_split(capability)
    }

    /// An instance's static weight in the snapshot (tests and diagnostics).
    pub fn routed_weight(&self, agent_id: &str) -> Option<u32> {
        self.service().routed_weight(agent_id)
    }

    /// The tenants served, by name (tests and diagnostics).
    pub fn tenants(&self) -> Vec<String> {
        self.parts
            .all()
            .into_iter()
            .map(|(tenant, _)| tenant.to_string())
            .collect()
    }
}

/// Every path of the OpenAPI description with its method (tests compare it with the routes).
pub fn openapi_paths() -> &'static [(&'static str, &'static str)] {
    static ALL: std::sync::OnceLock<Vec<(&'static str, &'static str)>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        openapi::PATHS
            .iter()
            .chain(agent_reach_console::openapi::PATHS.iter())
            .chain(agent_reach_runs::openapi::PATHS.iter())
            .copied()
            .collect()
    })
}

/// Builds the policy, authenticator and service (one per tenant with a
/// tenant map), starts the registry watch that feeds each snapshot and, with
/// `--redis`, each slow path's worker and callback sender.
pub async fn build(settings: &Settings) -> anyhow::Result<Router> {
    if matches!(settings.auth, agent_reach_access::AuthConfig::InsecureNoAuth) {
        tracing::warn!(
            message = "Router runs WITHOUT authentication (--insecure-no-auth): every caller is trusted \
                       and the ACL is not enforced. Development only."
        );
    }
    let tls = agent_reach_serving::tls::listener(settings.listener_tls.as_ref()).context("the listener's TLS")?;
    // An agent CA file that cannot be read is a start-up error; no system roots only
    // matter once an https:// agent is called (plain http:// agents need none).
    let agent_tls = match agent_reach_serving::tls::client_config(&settings.agent_tls, &[b"http/1.1"]) {
        Ok(config) => Ok(Arc::new(config)),
        Err(error) if settings.agent_tls.ca.is_none() && settings.agent_tls.identity.is_none() => Err(format!(
            "https:// agents cannot be verified: {error} (pass --agent-ca-file)"
        )),
        Err(error) => return Err(anyhow::Error::new(error).context("TLS to agents")),
    };
    // The registry's TLS files are checked now, so a typo fails the start, not every reconnect.
    for registry in &settings.registry {
        agent_reach_serving::tls::grpc_endpoint(registry, &settings.registry_tls).context("the registry's address")?;
    }
    // Without a map the one tenant's series are the process's, unlabelled, as before tenants.
    let tenancy = match &settings.tenant_map {
        Some(path) => {
            Tenancy::Map(agent_reach_tenancy::TenantMapHandle::load_and_watch(path).map_err(anyhow::Error::msg)?)
        }
        None => Tenancy::One(agent_reach_pipeline::metrics::Metrics::new().context("registering metrics")?),
    };
    let process_registry = match &tenancy {
        Tenancy::One(metrics) => metrics.registry.clone(),
        Tenancy::Map(_) => prometheus::Registry::new(),
    };
    let assertions = agent_reach_access::Assertions::load(settings.assertion.clone(), &process_registry)
        .map_err(anyhow::Error::msg)?;
    assertions.watch();
    let shared = Arc::new(parts::Shared {
        settings: settings.clone(),
        pipeline: agent_reach_pipeline::PartConfig {
            tuning: Tuning {
                serves_tls: settings.listener_tls.is_some(),
                ..settings.tuning.clone()
            },
            auth: settings.auth.clone(),
            registry: settings.registry.clone(),
            registry_tls: settings.registry_tls.clone(),
            registry_credential: settings.registry_credential.clone(),
            sessions: Some(Arc::new(agent_reach_console::Sessions::new(assertions.clone()))),
            plugins: settings.plugins.clone(),
            assertions,
            agent_tls,
        },
        console: Arc::new(agent_reach_console::Console::new(
            &settings.registry,
            &settings.registry_tls,
            tls.is_some(),
        )),
        from_map: matches!(tenancy, Tenancy::Map(_)),
    });
    let (parts, process_metrics) = match tenancy {
        Tenancy::One(metrics) => {
            let part = shared.part(&settings.tenant, &agent_reach_tenancy::TenantEntry::default(), metrics)?;
            (Arc::new(parts::TenantParts::single(&settings.tenant, part)), None)
        }
        Tenancy::Map(map) => {
            let parts = shared.parts_of(&map.current())?;
            let parts = Arc::new(
                parts::TenantParts::new(&settings.tenant, parts)
                    .map_err(anyhow::Error::msg)?
                    .with_tenant_claim(settings.auth.tenant_claim()),
            );
            tokio::spawn(parts::follow(map, Arc::downgrade(&parts), shared));
            (parts, Some(process_registry))
        }
    };
    Ok(Router {
        parts,
        process_metrics,
        tls,
    })
}

/// One tenant (its series the process's), or a tenant map's.
enum Tenancy {
    One(agent_reach_pipeline::metrics::Metrics),
    Map(agent_reach_tenancy::TenantMapHandle),
}

/// Runs the router until `shutdown` resolves.
pub async fn run(args: RouterArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    run_with_plugins(args, Plugins::new(), shutdown).await
}

/// [`run`] with selection policies plugged in, each named `plugin:NAME` by
/// calls and capabilities (the `agent-reach` binary passes its own,
/// `cli/src/plugins.rs`).
pub async fn run_with_plugins(
    args: RouterArgs,
    plugins: Plugins,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if args.transparent_huge_pages == Switch::Off {
        transparent_huge_pages_off();
    }
    let mut settings = args
        .validate()
        .map_err(|problems| anyhow::anyhow!("invalid router configuration:\n  - {}", problems.join("\n  - ")))?;
    settings.plugins = plugins;
    let router = build(&settings).await?;
    let threads = agent_reach_serving::serve::thread_count(settings.tuning.threads);
    tracing::info!(
        message = "Router listening.", address = %settings.listen, registry = ?settings.registry, threads
    );
    serve_per_core(settings.listen, threads, router, shutdown).await
}

/// Turns transparent huge pages off for this process (Linux; elsewhere
/// nothing): `--transparent-huge-pages off`. Later page faults then fill
/// 4-KiB pages, not 2-MB ones, whatever the allocator asked with
/// `madvise`. A failure leaves them as the system has them; it is
/// reported, not fatal.
fn transparent_huge_pages_off() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no
        // memory of ours; it sets a flag of this process.
        let result = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if result != 0 {
            tracing::warn!(
                message = "Cannot turn transparent huge pages off for the router; they stay as the system has them.",
                error = %std::io::Error::last_os_error()
            );
        }
    }
}

/// Serves on `threads` threads (0: one per core), each a single-threaded
/// runtime with its own `SO_REUSEPORT` listener on `addr` (see
/// [`agent_reach_serving::serve::per_core`]) behind the router's front door
/// ([`front`]): a request, its forwarded call and its answer stay on one
/// thread. Background work (the registry watch, ACL reload, the task
/// worker) stays on the caller's runtime.
pub async fn serve_per_core(
    addr: std::net::SocketAddr,
    threads: usize,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    router.door().per_core("router", addr, threads, shutdown).await
}

/// Serves `router` on an already bound listener, behind the same front door
/// (tests bind port 0).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    router
        .door()
        .serve(listener, shutdown)
        .await
        .context("router server failed")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        router: RouterArgs,
    }

    #[test]
    fn transparent_huge_pages_are_off_unless_asked_for() {
        let flags = |extra: &[&str]| {
            Flags::parse_from([&["router"], extra].concat())
                .router
                .transparent_huge_pages
        };
        assert_eq!(flags(&[]), Switch::Off);
        assert_eq!(flags(&["--transparent-huge-pages", "on"]), Switch::On);
        assert!(Flags::try_parse_from(["router", "--transparent-huge-pages", "maybe"]).is_err());
        transparent_huge_pages_off();
        #[cfg(target_os = "linux")]
        {
            // SAFETY: PR_GET_THP_DISABLE takes plain integers and reads a flag of this process.
            let disabled = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
            assert_eq!(disabled, 1);
        }
    }
}
