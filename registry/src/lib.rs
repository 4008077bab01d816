//! The registry (DESIGN §2): agents register capabilities under an etcd lease,
//! keep it alive with heartbeats, and routers watch the result.
//!
//! - [`store`]: the etcd-shaped store trait, its etcd and embedded implementations.
//! - `catalog`: the in-memory view every read is served from, fed by a store watch.
//! - `service`: register / heartbeat / deregister / resolve, transport-free.
//! - `operator`: traffic splits and live weights (the operator API), transport-free.
//! - `access`: access requests, their approval by `owners:`, and grants, transport-free.
//! - `validate`: registration checks with stable codes; `error`: the one error type.
//! - `http` and `grpc`: the two faces of one port; [`app`] joins them.
//! - `tenants`: one part (a service) per tenant of the tenant map, each
//!   request dispatched to its token's tenant's part ([`Registry`]).
//!
//! The crate's front is small: [`build`], [`app`], [`serve`], [`run`], the
//! flags ([`RegistryArgs`]) and settings ([`Settings`], [`RegistryConfig`]),
//! and the [`store`] seam the contract suite holds every store to.

mod access;
mod catalog;
mod config;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod grpc;
mod http;
mod metrics;
mod model;
mod operator;
mod service;
pub mod store;
mod tenants;
mod validate;

use std::future::Future;
use std::sync::Arc;

use agent_reach_proto::registry::registry_server::RegistryServer;
use anyhow::Context;
use tonic::server::NamedService;

pub use config::{RegistryArgs, Settings, StoreChoice};
pub use service::{Heartbeat, RegistryConfig, RegistryService};
pub use tenants::Registry;
pub use validate::{SchemaBounds, TtlBounds};

/// One tenant's API on one router: HTTP/JSON routes plus the gRPC service
/// (requests with `content-type: application/grpc` arrive on its path).
pub fn app(service: Arc<RegistryService>) -> axum::Router {
    let limit = service.config().max_body_bytes;
    let grpc = RegistryServer::new(grpc::GrpcRegistry::new(service.clone()))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(usize::MAX);
    let path = format!(
        "/{}/{{*rest}}",
        <RegistryServer<grpc::GrpcRegistry> as NamedService>::NAME
    );
    http::routes(service).route_service(&path, grpc)
}

/// Connects the store, then builds every tenant's part from validated
/// settings: the home tenant alone, or each one of `--tenant-map`, all on
/// the one store client.
pub async fn build(settings: &Settings) -> anyhow::Result<Registry> {
    let store: Arc<dyn store::Store> = match &settings.store {
        config::StoreChoice::Etcd(endpoints) => {
            Arc::new(store::EtcdStore::connect(endpoints).map_err(anyhow::Error::msg)?)
        }
        config::StoreChoice::EtcdTls { endpoints, tls } => {
            let tls = store::etcd::EtcdTls::from_files(tls);
            Arc::new(store::EtcdStore::connect_with(endpoints, &tls).map_err(anyhow::Error::msg)?)
        }
        config::StoreChoice::Embedded => {
            tracing::warn!(
                message = "Registry uses the EMBEDDED in-memory store: registrations are lost on exit \
                           and not shared with other registries. Development only."
            );
            Arc::new(store::MemoryStore::new())
        }
    };
    Registry::build(
        store,
        settings.auth.clone(),
        settings.acl.clone(),
        settings.service.clone(),
    )
}

/// Runs the registry until `shutdown` resolves.
pub async fn run(args: RegistryArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let settings = args
        .validate()
        .map_err(|problems| anyhow::anyhow!("invalid registry configuration:\n  - {}", problems.join("\n  - ")))?;
    let registry = build(&settings).await?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let tls = agent_reach_serving::tls::listener(settings.listener_tls.as_ref()).context("the listener's TLS")?;
    tracing::info!(message = "Registry listening.", address = %settings.listen, tls = tls.is_some());
    serve_tls(listener, registry, tls, shutdown).await
}

/// Serves `registry` on an already bound listener (tests bind port 0).
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Registry,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_tls(listener, registry, None, shutdown).await
}

/// [`serve`], with TLS when `tls` is given (`h2` by ALPN for gRPC clients).
/// The edge's front door sets TCP_NODELAY on every connection: a gRPC answer
/// is several HTTP/2 frames, and holding the last one behind the peer's
/// delayed ACK costs ~40 ms per call.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    registry: Registry,
    tls: Option<agent_reach_serving::tls::ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let door = agent_reach_serving::front::Door {
        hot: agent_reach_serving::front::NoHotRoutes,
        body_limit: registry.max_body_bytes(),
        app: registry.app(),
        tls,
    };
    door.serve(listener, shutdown).await.context("registry server failed")
}
