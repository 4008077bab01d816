//! Many tenants in one context service (DESIGN §8 "Tenants"): with
//! `--tenant-map`, every tenant the map names gets its own *part*, the
//! service [`crate::build`] makes for one tenant: its store (on the entry's
//! `redis`, else the shared `--redis`, under `{prefix}:{tenant}` either way),
//! its sweeper, its ACL (the entry's `acl`, else `--acl`), an authenticator
//! serving that tenant only, and its metrics in a registry that labels every
//! series with `tenant`.
//!
//! Each request goes to the part its bearer token's `tenant` claim names
//! ([`agent_reach_serving::tenants`]): HTTP and gRPC through
//! [`agent_reach_tenancy::dispatch_with`], the front door's hot routes
//! through [`Parts::for_authorization`] (see `front`). `/metrics` and
//! `/readyz` are the process's: every part's series, ready when every part's
//! store answers.
//!
//! The map is followed: a tenant added gets a part, a removed one's part is
//! dropped (its sweeper and ACL watch stop with it), a changed `redis` or
//! `acl` rebuilds that tenant's part; the table is swapped at once, and
//! requests in flight finish on the part they picked.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use agent_reach_tenancy::{dispatch_with, metrics_registry, render_metrics, Parts};
use agent_reach_tenancy::{TenantEntry, TenantMap, TenantMapHandle};
use anyhow::Context;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::config::{Settings, StoreChoice};
use crate::metrics::Metrics;
use crate::service::ContextService;
use crate::store::{ContextStore, Namespace, RedisStore};

/// Every tenant's part, and the map they follow.
pub struct Tenants {
    parts: Arc<Parts<Part>>,
    /// Kept so the map's reload loop runs as long as these parts serve.
    _map: TenantMapHandle,
}

impl std::fmt::Debug for Tenants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let served: Vec<_> = self.parts.all().into_iter().map(|(name, _)| name).collect();
        f.debug_struct("Tenants").field("served", &served).finish()
    }
}

/// One tenant's service, and its routes (HTTP and gRPC, [`crate::app`]) for
/// everything but the front door's hot routes.
#[derive(Clone)]
pub(crate) struct Part {
    pub(crate) service: Arc<ContextService>,
    routes: axum::Router,
}

impl Part {
    fn new(service: Arc<ContextService>) -> Self {
        Self {
            routes: crate::app(service.clone()),
            service,
        }
    }
}

// === Tenants ===

impl Tenants {
    /// One part per tenant of `map`'s current map (start-up fails if one
    /// cannot be built), following its edits from now on. `settings` gives the
    /// home tenant (its store's namespace), the shared store and everything
    /// the parts share.
    pub async fn build(settings: &Settings, map: TenantMapHandle) -> anyhow::Result<Arc<Self>> {
        let StoreChoice::Redis { namespace, .. } = &settings.store else {
            anyhow::bail!("--tenant-map needs --redis: the embedded store serves one tenant (development only)");
        };
        let home = namespace.tenant.clone();
        // Subscribed before reading, so an edit landing meanwhile is still seen.
        let mut changes = map.subscribe();
        let current = changes.borrow_and_update().clone();
        let mut parts = Vec::with_capacity(current.len());
        for (tenant, entry) in current.tenants() {
            let service = build_part(settings, tenant, entry)
                .await
                .with_context(|| format!("building tenant `{tenant}`'s part ({})", entry.placement()))?;
            parts.push((tenant.to_string(), Part::new(service)));
        }
        let parts = Parts::new(&home, parts)
            .map_err(anyhow::Error::msg)?
            .with_tenant_claim(settings.auth.tenant_claim());
        let placements: Vec<String> = current
            .tenants()
            .map(|(name, entry)| format!("{name} ({})", entry.placement()))
            .collect();
        tracing::info!(
            message = "Context service serves the tenant map.",
            home = %home,
            tenants = %placements.join(", ")
        );
        let tenants = Arc::new(Self {
            parts: Arc::new(parts),
            _map: map,
        });
        let built = current
            .tenants()
            .map(|(name, entry)| (name.to_string(), entry.clone()))
            .collect();
        tokio::spawn(follow(Arc::downgrade(&tenants), settings.clone(), built, changes));
        Ok(tenants)
    }

    /// `tenant`'s part, if served.
    pub fn get(&self, tenant: &str) -> Option<Arc<ContextService>> {
        self.parts.get(tenant).map(|part| part.service)
    }

    /// The tenants served now, by name.
    pub fn served(&self) -> Vec<String> {
        self.parts.all().into_iter().map(|(name, _)| name.to_string()).collect()
    }

    pub(crate) fn parts(&self) -> Arc<Parts<Part>> {
        self.parts.clone()
    }

    /// Largest request body (the parts share their settings).
    pub(crate) fn max_body_bytes(&self) -> usize {
        self.parts.home().service.config().max_body_bytes
    }

    /// The whole API: the process's `/metrics` and `/readyz`, every other
    /// route (gRPC included) in the part of the request's tenant.
    pub fn app(self: &Arc<Self>) -> axum::Router {
        axum::Router::new()
            .route("/metrics", get(metrics).fallback(crate::http::method_not_allowed))
            .route("/readyz", get(readyz).fallback(crate::http::method_not_allowed))
            .with_state(self.clone())
            .merge(dispatch_with(self.parts.clone(), |part| part.routes.clone()))
    }

    /// Applies a new map: parts kept, built, rebuilt or dropped; then one swap.
    async fn apply(&self, settings: &Settings, map: &TenantMap, built: &mut BTreeMap<String, TenantEntry>) {
        let home = self.parts.home_name();
        if !map.contains(&home) {
            tracing::error!(
                message = "Tenant map edit drops the home tenant (--tenant); keeping every part as it is.",
                home = %home
            );
            return;
        }
        let mut parts = Vec::with_capacity(map.len());
        let mut next_built = BTreeMap::new();
        for (tenant, entry) in map.tenants() {
            let old = self.parts.get(tenant).zip(built.get(tenant));
            if let Some((part, old_entry)) = &old {
                if old_entry.same_placement(entry) {
                    parts.push((tenant.to_string(), part.clone()));
                    next_built.insert(tenant.to_string(), entry.clone());
                    continue;
                }
            }
            match build_part(settings, tenant, entry).await {
                Ok(service) => {
                    let action = if old.is_some() { "rebuilt" } else { "added" };
                    tracing::info!(message = "Tenant part ready.", tenant, action, placement = %entry.placement());
                    parts.push((tenant.to_string(), Part::new(service)));
                    next_built.insert(tenant.to_string(), entry.clone());
                }
                Err(error) => match old {
                    Some((part, old_entry)) => {
                        tracing::error!(
                            message = "Tenant part cannot be rebuilt; it keeps its last good placement and policy.",
                            tenant,
                            error = %format!("{error:#}")
                        );
                        parts.push((tenant.to_string(), part));
                        next_built.insert(tenant.to_string(), old_entry.clone());
                    }
                    None => tracing::error!(
                        message = "Tenant part cannot be built; the tenant is not served until a later edit fixes it.",
                        tenant,
                        error = %format!("{error:#}")
                    ),
                },
            }
        }
        for tenant in built.keys().filter(|tenant| !map.contains(tenant)) {
            tracing::info!(message = "Tenant removed from the map; its part is dropped.", tenant = %tenant);
        }
        // The home tenant is in `map`, and its part is kept when it cannot be rebuilt.
        if let Err(why) = self.parts.replace(parts) {
            tracing::error!(message = "Tenant parts not swapped.", error = %why);
            return;
        }
        *built = next_built;
    }
}

/// Follows `changes` until the parts are dropped (or the map's handle is).
async fn follow(
    tenants: Weak<Tenants>,
    settings: Settings,
    mut built: BTreeMap<String, TenantEntry>,
    mut changes: tokio::sync::watch::Receiver<Arc<TenantMap>>,
) {
    while changes.changed().await.is_ok() {
        let map = changes.borrow_and_update().clone();
        let Some(tenants) = tenants.upgrade() else { return };
        tenants.apply(&settings, &map, &mut built).await;
    }
}

/// `tenant`'s part: the service [`crate::build`] makes, on the entry's placement and policy.
async fn build_part(settings: &Settings, tenant: &str, entry: &TenantEntry) -> anyhow::Result<Arc<ContextService>> {
    let StoreChoice::Redis {
        link,
        namespace,
        timeout,
    } = &settings.store
    else {
        anyhow::bail!("--tenant-map needs --redis: the embedded store serves one tenant (development only)");
    };
    let namespace = Namespace {
        prefix: namespace.prefix.clone(),
        tenant: tenant.to_string(),
    };
    // Its own Redis is trusted as the shared one is (the same --redis-ca-file
    // and client identity).
    let link = match &entry.redis {
        Some(url) => agent_reach_stores::RedisLink::parse(url)
            .map_err(anyhow::Error::msg)?
            .with_tls(link.tls.clone())
            .with_wait(link.wait),
        None => (**link).clone(),
    };
    let store: Arc<dyn ContextStore> =
        Arc::new(RedisStore::new(&link, &namespace, settings.service.policy, *timeout).map_err(anyhow::Error::msg)?);
    let metrics = Metrics::in_registry(metrics_registry(tenant)).context("registering metrics")?;
    let acl = entry.acl.as_deref().unwrap_or(&settings.acl);
    crate::start(settings, store, acl, tenant, metrics).await
}

// === The process's routes ===

async fn metrics(State(tenants): State<Arc<Tenants>>) -> Response {
    let parts = tenants.parts.all();
    let text = render_metrics(parts.iter().map(|(_, part)| &part.service.metrics().registry));
    ([(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// Ready when every part's store answers (asked at once, each bounded by `--redis-timeout`).
async fn readyz(State(tenants): State<Arc<Tenants>>) -> Response {
    let mut pings = tokio::task::JoinSet::new();
    for (tenant, part) in tenants.parts.all() {
        pings.spawn(async move { (tenant, part.service.store().ping().await) });
    }
    let mut down = Vec::new();
    while let Some(answer) = pings.join_next().await {
        match answer {
            Ok((_, Ok(()))) => {}
            Ok((tenant, Err(error))) => down.push(format!("tenant `{tenant}`: {error}")),
            Err(error) => down.push(format!("a readiness check failed: {error}")),
        }
    }
    if down.is_empty() {
        return (StatusCode::OK, "ready\n").into_response();
    }
    down.sort();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("context store unreachable: {}\n", down.join("; ")),
    )
        .into_response()
}
