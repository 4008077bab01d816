//! The context service (DESIGN §4): per-session shared state in Redis, versioned,
//! with tiered TTLs, an idle sweeper and field-level read/write whitelists.
//!
//! - [`store`]: the store trait, its Redis and embedded implementations.
//! - `service`: create / get / patch / close and the access rule, transport-free.
//! - `validate`: request checks with stable codes; `error`: the one error type.
//! - `http` and `grpc`: the two faces of one port; [`app`] joins them.
//! - `config`: flags into `config::Settings`; `metrics`: `agent_reach_context_*`.
//! - `tenants`: many tenants in one process (`--tenant-map`), one part each.
//!
//! The crate's front is small: [`build`], [`app`], [`serve`], [`run`], the
//! flags ([`ContextArgs`]) and settings ([`Settings`], [`ContextConfig`]),
//! the multi-tenant [`Tenants`] ([`build_tenants`], [`serve_tenants`]), and
//! the [`store`] seam (with its [`model`]) the contract suite holds every
//! store to.

mod config;
mod error;
mod front;
mod grpc;
mod http;
mod metrics;
pub mod model;
mod service;
pub mod store;
mod tenants;
mod validate;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use agent_reach_access::{AclHandle, Authenticator};
use agent_reach_proto::context::contexts_server::ContextsServer;
use agent_reach_tenancy::TenantMapHandle;
use anyhow::Context;
use tonic::server::NamedService;

pub use config::{ContextArgs, Settings, StoreChoice};
pub use service::{ContextConfig, ContextService};
pub use tenants::Tenants;

/// The whole API on one router: HTTP/JSON routes plus the gRPC service
/// (requests with `content-type: application/grpc` arrive on its path).
pub fn app(service: Arc<ContextService>) -> axum::Router {
    let limit = service.config().max_body_bytes;
    let grpc = ContextsServer::new(grpc::GrpcContext::new(service.clone()))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(usize::MAX);
    let path = format!(
        "/{}/{{*rest}}",
        <ContextsServer<grpc::GrpcContext> as NamedService>::NAME
    );
    http::routes(service).route_service(&path, grpc)
}

/// Builds the store, policy, authenticator and service from validated settings,
/// and starts this replica's idle sweeper (it stops when the service is dropped).
pub async fn build(settings: &Settings) -> anyhow::Result<Arc<ContextService>> {
    let metrics = metrics::Metrics::new().context("registering metrics")?;
    let policy = settings.service.policy;
    let store: Arc<dyn store::ContextStore> = match &settings.store {
        StoreChoice::Redis {
            link,
            namespace,
            timeout,
        } => Arc::new(store::RedisStore::new(link, namespace, policy, *timeout).map_err(anyhow::Error::msg)?),
        StoreChoice::Embedded => {
            tracing::warn!(
                message = "Context service uses the EMBEDDED in-memory store: contexts are lost on exit \
                           and not shared with other replicas. Development only."
            );
            Arc::new(store::MemoryStore::new(policy))
        }
    };
    // Without a tenant map, one tenant per context service (its keys'
    // `{tenant}`); tokens of other tenants are refused.
    let tenant = match &settings.store {
        StoreChoice::Redis { namespace, .. } => namespace.tenant.as_str(),
        StoreChoice::Embedded => agent_reach_access::token::DEFAULT_TENANT,
    };
    start(settings, store, &settings.acl, tenant, metrics).await
}

/// The service for `tenant` on `store` under the policy at `acl`, its sweeper started.
async fn start(
    settings: &Settings,
    store: Arc<dyn store::ContextStore>,
    acl: &Path,
    tenant: &str,
    metrics: metrics::Metrics,
) -> anyhow::Result<Arc<ContextService>> {
    let acl = AclHandle::load_and_watch(acl, &metrics.registry)?;
    let auth = Authenticator::load(&settings.auth)
        .map_err(anyhow::Error::msg)?
        .serving(tenant);
    let service = ContextService::new(store, acl, auth, settings.service.clone(), metrics);
    if let Err(error) = service.store().ping().await {
        // Not fatal: requests answer 503 until Redis is reachable, then recover.
        tracing::warn!(message = "Context store not reachable at start-up; serving 503 until it is.", tenant, %error);
    }
    service.spawn_sweeper();
    Ok(service)
}

/// Every tenant of `map`, each on its placement (DESIGN §8 "Tenants"; see
/// [`Tenants`]); `settings` names the home tenant (`--tenant`, its store's
/// namespace) and the shared `--redis`.
pub async fn build_tenants(settings: &Settings, map: TenantMapHandle) -> anyhow::Result<Arc<Tenants>> {
    Tenants::build(settings, map).await
}

/// Runs the context service until `shutdown` resolves: one tenant, or with
/// `--tenant-map` every tenant the map names.
pub async fn run(args: ContextArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let settings = args
        .validate()
        .map_err(|problems| anyhow::anyhow!("invalid context configuration:\n  - {}", problems.join("\n  - ")))?;
    let tls = agent_reach_serving::tls::listener(settings.listener_tls.as_ref()).context("the listener's TLS")?;
    let door = match &args.tenant_map {
        None => front::door(build(&settings).await?, tls),
        Some(path) => {
            let map = TenantMapHandle::load_and_watch(path).map_err(anyhow::Error::msg)?;
            front::tenants_door(build_tenants(&settings, map).await?, tls)
        }
    };
    let threads = agent_reach_serving::serve::thread_count(settings.threads);
    tracing::info!(
        message = "Context service listening.",
        address = %settings.listen,
        threads,
        tls = door.tls.is_some()
    );
    // One single-threaded runtime per thread: each request and its Redis call
    // (on that thread's own connection) stay on one thread.
    door.per_core("context", settings.listen, threads, shutdown).await
}

/// Serves `service` on an already bound listener (tests bind port 0).
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: Arc<ContextService>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_tls(listener, service, None, shutdown).await
}

/// [`serve`], with TLS when `tls` is given (`h2` by ALPN for gRPC clients).
/// The front door sets TCP_NODELAY on every connection: a gRPC answer is
/// several HTTP/2 frames, and delaying the last one behind the client's
/// delayed ACK costs ~40 ms per call.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    service: Arc<ContextService>,
    tls: Option<agent_reach_serving::tls::ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    front::door(service, tls)
        .serve(listener, shutdown)
        .await
        .context("context server failed")
}

/// Serves every tenant of `tenants` on an already bound listener (tests bind
/// port 0), with TLS when `tls` is given.
pub async fn serve_tenants(
    listener: tokio::net::TcpListener,
    tenants: Arc<Tenants>,
    tls: Option<agent_reach_serving::tls::ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    front::tenants_door(tenants, tls)
        .serve(listener, shutdown)
        .await
        .context("context server failed")
}
