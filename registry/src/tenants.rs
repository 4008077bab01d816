//! Many tenants in one registry (DESIGN §8 "Tenants"): one *part* per tenant
//! of the tenant map, each a [`RegistryService`] with its own keys
//! (`/agent-reach/v1/{tenant}/`), catalog, ACL, authenticator (serving that
//! tenant only) and `tenant`-labelled metrics, all on one store client; every
//! request goes to its token's tenant's part (`edge::tenants::dispatch_with`).
//!
//! Without a map the registry serves its `--tenant` alone, exactly as before:
//! one part, no dispatch, unlabelled series.
//!
//! The map is followed live: a tenant added gets a part, a removed one's part
//! is retired (its catalog stops following etcd, its `Watch` and `KeepAlive`
//! streams end), and a changed `acl` rebuilds the part. An edit whose parts
//! cannot all be built (an ACL file unreadable or invalid), or that drops the
//! home tenant, is refused whole: the parts in force stay, and the next edit
//! of the map is tried afresh. A rebuilt part's old self is not retired: its
//! open streams finish on it, and its catalog stops with the last of them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use agent_reach_access::{AclHandle, AuthConfig, Authenticator};
use agent_reach_tenancy::{dispatch_with, metrics_registry, render_metrics, Parts};
use agent_reach_tenancy::{TenantEntry, TenantMap, TenantMapHandle};
use anyhow::Context as _;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::error::Code;
use crate::metrics::Metrics;
use crate::service::{RegistryConfig, RegistryService};
use crate::store::Store;

/// The registry as served: every tenant's part, and the tenant map they follow.
/// Cloning shares it.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

struct Inner {
    parts: Arc<Parts<Part>>,
    kit: PartKit,
    /// `None`: no `--tenant-map`, the home tenant alone.
    tenancy: Option<Tenancy>,
}

/// What a registry with a tenant map has besides its parts.
struct Tenancy {
    map: TenantMapHandle,
    /// The process's own series (no `tenant` label).
    metrics: prometheus::Registry,
    tenants: prometheus::IntGauge,
    reloads: prometheus::IntCounterVec,
    /// The map's refused file edits already counted in `reloads`.
    file_rejections_counted: AtomicU64,
}

/// One tenant's part: its service and the routes over it. Dispatch clones
/// it per request, hence one `Arc`.
#[derive(Clone)]
struct Part(Arc<PartInner>);

struct PartInner {
    service: Arc<RegistryService>,
    routes: axum::Router,
    /// The entry's `acl` it was built with: a change rebuilds the part (the
    /// registry has no Redis, so an entry's `redis` and quotas do not matter here).
    acl: Option<PathBuf>,
}

impl Part {
    fn routes(&self) -> axum::Router {
        self.0.routes.clone()
    }
}

/// What every part is built from.
struct PartKit {
    store: Arc<dyn Store>,
    auth: AuthConfig,
    /// `--acl`: the policy of tenants whose entry names none.
    acl: PathBuf,
    /// The settings every part shares (its `tenant` is the home tenant).
    config: RegistryConfig,
}

/// Whether a part's series carry its `tenant` label.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Labels {
    /// A process serving one tenant: its series as they always were.
    None,
    /// A process serving a tenant map.
    Tenant,
}

// === PartKit ===

impl PartKit {
    fn build(&self, tenant: &str, entry: &TenantEntry, labels: Labels) -> anyhow::Result<Part> {
        let registry = match labels {
            Labels::None => prometheus::Registry::new(),
            Labels::Tenant => metrics_registry(tenant),
        };
        let metrics = Metrics::in_registry(registry).context("registering metrics")?;
        let acl_path = entry.acl.as_deref().unwrap_or(&self.acl);
        let acl = AclHandle::load_and_watch(acl_path, &metrics.registry)?;
        // Its own authenticator: it refuses every other tenant's tokens (`other_tenant`).
        let auth = Authenticator::load(&self.auth)
            .map_err(anyhow::Error::msg)?
            .serving(tenant);
        let config = RegistryConfig {
            tenant: tenant.to_string(),
            tenant_map: None,
            ..self.config.clone()
        };
        let service = RegistryService::new(self.store.clone(), acl, auth, config, metrics);
        Ok(Part(Arc::new(PartInner {
            routes: crate::app(service.clone()),
            service,
            acl: entry.acl.clone(),
        })))
    }
}

// === Registry ===

impl Registry {
    /// Builds every part on `store`: `config.tenant`'s alone, or, with
    /// `config.tenant_map`, each tenant of the map (loaded now, followed from
    /// now on), `config.tenant` being the home tenant.
    pub(crate) fn build(
        store: Arc<dyn Store>,
        auth: AuthConfig,
        acl: PathBuf,
        config: RegistryConfig,
    ) -> anyhow::Result<Self> {
        let home = config.tenant.clone();
        let map_path = config.tenant_map.clone();
        let kit = PartKit {
            store,
            auth,
            acl,
            config,
        };
        let Some(map_path) = map_path else {
            let part = kit.build(&home, &TenantEntry::default(), Labels::None)?;
            return Ok(Self {
                inner: Arc::new(Inner {
                    parts: Arc::new(Parts::single(&home, part)),
                    kit,
                    tenancy: None,
                }),
            });
        };
        let map = TenantMapHandle::load_and_watch(&map_path).map_err(anyhow::Error::msg)?;
        let current = map.current();
        let mut parts = Vec::new();
        for (tenant, entry) in current.tenants() {
            let part = kit
                .build(tenant, entry, Labels::Tenant)
                .with_context(|| format!("tenant `{tenant}` of {}", map_path.display()))?;
            parts.push((tenant.to_string(), part));
        }
        let parts = Parts::new(&home, parts)
            .map_err(anyhow::Error::msg)?
            .with_tenant_claim(kit.auth.tenant_claim());
        let tenancy = Tenancy::new(map).context("registering metrics")?;
        tenancy.tenants.set(i64::try_from(parts.len()).unwrap_or(i64::MAX));
        let changes = tenancy.map.subscribe();
        let inner = Arc::new(Inner {
            parts: Arc::new(parts),
            kit,
            tenancy: Some(tenancy),
        });
        tokio::spawn(follow_the_map(Arc::downgrade(&inner), changes));
        tracing::info!(
            message = "Registry serves a tenant map.",
            path = %map_path.display(),
            tenants = %current.tenants().map(|(name, _)| name).collect::<Vec<_>>().join(","),
            home = %home
        );
        Ok(Self { inner })
    }

    /// The routes of the whole registry: with a tenant map, `/readyz` and
    /// `/metrics` for the process and every other request dispatched to its
    /// tenant's part; without one, the home part's routes as they are.
    pub fn app(&self) -> axum::Router {
        if self.inner.tenancy.is_none() {
            return self.inner.parts.home().0.routes.clone();
        }
        axum::Router::new()
            .route("/readyz", get(readyz).fallback(method_not_allowed))
            .route("/metrics", get(metrics).fallback(method_not_allowed))
            .with_state(self.inner.clone())
            .fallback_service(dispatch_with(self.inner.parts.clone(), Part::routes))
    }

    /// The home tenant's service (`--tenant`).
    pub fn home(&self) -> Arc<RegistryService> {
        self.inner.parts.home().0.service.clone()
    }

    /// `tenant`'s service, if it is served now.
    pub fn service(&self, tenant: &str) -> Option<Arc<RegistryService>> {
        self.inner.parts.get(tenant).map(|part| part.0.service.clone())
    }

    /// The tenants served now, by name.
    pub fn tenants(&self) -> Vec<String> {
        self.inner
            .parts
            .all()
            .into_iter()
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// Largest accepted body (HTTP) or message (gRPC), in bytes.
    pub fn max_body_bytes(&self) -> usize {
        self.inner.kit.config.max_body_bytes
    }
}

// === Following the map ===

/// How long a tenant map edit waits for a new part's catalog to be in sync
/// before swapping it in anyway.
const NEW_PART_SYNC: Duration = Duration::from_secs(10);

/// Applies every valid edit of the map until the registry is dropped (the
/// channel closes with its handle).
async fn follow_the_map(inner: Weak<Inner>, mut changes: tokio::sync::watch::Receiver<Arc<TenantMap>>) {
    while changes.changed().await.is_ok() {
        let map = changes.borrow_and_update().clone();
        let Some(inner) = inner.upgrade() else { return };
        inner.apply(&map).await;
    }
}

impl Inner {
    /// Builds the parts `map` needs (reusing unchanged ones), waits (at most
    /// [`NEW_PART_SYNC`]) until each new part's catalog is in sync with the
    /// store, and swaps them in at once, so a rebuilt tenant never answers
    /// from an empty catalog; retires the parts of tenants it no longer names.
    async fn apply(&self, map: &TenantMap) {
        let Some(tenancy) = &self.tenancy else { return };
        let current: BTreeMap<Arc<str>, Part> = self.parts.all().into_iter().collect();
        let mut next = Vec::new();
        let mut problems = Vec::new();
        let mut rebuilt = Vec::new();
        for (tenant, entry) in map.tenants() {
            match current.get(tenant) {
                Some(part) if part.0.acl == entry.acl => next.push((tenant.to_string(), part.clone())),
                previous => match self.kit.build(tenant, entry, Labels::Tenant) {
                    Ok(part) => {
                        if previous.is_some() {
                            rebuilt.push(tenant.to_string());
                        }
                        next.push((tenant.to_string(), part));
                    }
                    Err(error) => problems.push(format!("tenant `{tenant}`: {error:#}")),
                },
            }
        }
        if problems.is_empty() {
            for (tenant, part) in &next {
                let built = !current
                    .get(tenant.as_str())
                    .is_some_and(|old| Arc::ptr_eq(&old.0, &part.0));
                if built && !part.0.service.catalog().synced_within(NEW_PART_SYNC).await {
                    tracing::warn!(
                        message = "A tenant's new catalog is not yet in sync with the store; serving it while it syncs.",
                        %tenant
                    );
                }
            }
        }
        let outcome = if problems.is_empty() {
            self.parts.replace(next)
        } else {
            Err(problems.join("; "))
        };
        if let Err(problems) = outcome {
            // Parts built for the refused edit drop here, and their catalogs stop with them.
            tenancy.reloads.with_label_values(&["error"]).inc();
            tracing::error!(
                message = "Tenant map edit not applied; the tenants served are unchanged.",
                %problems
            );
            return;
        }
        let mut removed = Vec::new();
        for (tenant, part) in &current {
            if !map.contains(tenant) {
                part.0.service.retire();
                removed.push(tenant.to_string());
            }
        }
        tenancy.reloads.with_label_values(&["ok"]).inc();
        tenancy.tenants.set(i64::try_from(map.len()).unwrap_or(i64::MAX));
        let added: Vec<_> = map
            .tenants()
            .map(|(tenant, _)| tenant)
            .filter(|tenant| !current.contains_key(*tenant))
            .collect();
        tracing::info!(
            message = "Tenant map applied.",
            added = %added.join(","),
            removed = %removed.join(","),
            rebuilt = %rebuilt.join(","),
            tenants = map.len()
        );
    }
}

// === Tenancy ===

impl Tenancy {
    fn new(map: TenantMapHandle) -> Result<Self, prometheus::Error> {
        let metrics = prometheus::Registry::new();
        let tenants = prometheus::IntGauge::new(
            "agent_reach_registry_tenants",
            "Tenants this registry serves (the tenant map's).",
        )?;
        let reloads = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "agent_reach_registry_tenant_map_reloads_total",
                "Tenant map edits by outcome (ok: applied; error: refused, the tenants served unchanged).",
            ),
            &["outcome"],
        )?;
        metrics.register(Box::new(tenants.clone()))?;
        metrics.register(Box::new(reloads.clone()))?;
        for outcome in ["ok", "error"] {
            reloads.with_label_values(&[outcome]).inc_by(0);
        }
        Ok(Self {
            map,
            metrics,
            tenants,
            reloads,
            file_rejections_counted: AtomicU64::new(0),
        })
    }

    /// Counts the file edits the map's own reload refused (it keeps only a count).
    fn count_file_rejections(&self) {
        let seen = self.map.rejected_edits();
        let counted = self.file_rejections_counted.swap(seen, Ordering::Relaxed);
        if seen > counted {
            self.reloads.with_label_values(&["error"]).inc_by(seen - counted);
        }
    }
}

// === Process-wide routes ===

async fn method_not_allowed(method: http::Method, uri: http::Uri) -> Response {
    agent_reach_errors::method_not_allowed::<Code>(method, uri).await
}

/// Ready when the store answers within 2 s and every tenant's catalog is in
/// sync with it.
async fn readyz(State(inner): State<Arc<Inner>>) -> Response {
    let store = tokio::time::timeout(Duration::from_secs(2), inner.kit.store.ping()).await;
    match store {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            return (StatusCode::SERVICE_UNAVAILABLE, format!("store unreachable: {error}\n")).into_response()
        }
        Err(_) => return (StatusCode::SERVICE_UNAVAILABLE, "store did not answer within 2 s\n").into_response(),
    }
    let behind: Vec<_> = inner
        .parts
        .all()
        .into_iter()
        .filter(|(_, part)| !part.0.service.catalog().is_synced())
        .map(|(tenant, _)| tenant.to_string())
        .collect();
    if behind.is_empty() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "catalog not yet in sync with the store for tenant(s) {}\n",
                behind.join(", ")
            ),
        )
            .into_response()
    }
}

/// Every tenant's series (labelled) and the process's own, one family per name.
async fn metrics(State(inner): State<Arc<Inner>>) -> Response {
    let parts = inner.parts.all();
    let mut registries: Vec<&prometheus::Registry> = parts
        .iter()
        .map(|(_, part)| &part.0.service.metrics().registry)
        .collect();
    if let Some(tenancy) = &inner.tenancy {
        tenancy.count_file_rejections();
        registries.push(&tenancy.metrics);
    }
    (
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render_metrics(registries),
    )
        .into_response()
}
