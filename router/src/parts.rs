//! One router, many tenants (DESIGN §8 "Tenants"). With `--tenant-map`, each
//! tenant the map names has a [`Part`] of its own: a snapshot fed by a Watch
//! authenticated in that tenant, its ACL (the entry's file, else `--acl`),
//! its quotas, its slow path on its placement (the entry's Redis, else
//! `--redis`), its recent calls, its series (labelled `tenant`). Requests
//! reach their tenant's part by the token's claim
//! ([`agent_reach_tenancy::parts`]); the part verifies the token and serves its
//! tenant only. What every part shares: the assertion keys, the agent TLS
//! settings, the console's registry relay.
//!
//! The map is followed: a tenant added is built, one removed dropped (its
//! Watch and task worker stop with it), a changed placement or ACL file
//! rebuilds the part, changed quotas apply in place.
//!
//! The process answers `/metrics` (every part's series in one exposition),
//! `/readyz` (every part's snapshot) and `GET /v1/tenants` itself; a router
//! without a map is its one part, plus `GET /v1/tenants` listing it.

use std::sync::{Arc, Weak};

use agent_reach_console::Console;
use agent_reach_pipeline::answer::{method_not_allowed, refused};
use agent_reach_pipeline::call::identify::Identified;
use agent_reach_pipeline::metrics::Metrics;
use agent_reach_pipeline::{PartConfig, RouterService};
use agent_reach_tasks::TaskService;
use agent_reach_tenancy::Parts;
use agent_reach_tenancy::{TenantEntry, TenantMapHandle};
use anyhow::Context as _;
use arc_swap::ArcSwap;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{json, Value};

use crate::config::Settings;

/// One tenant's router.
pub(crate) struct Part {
    pub(crate) service: Arc<RouterService>,
    pub(crate) tasks: Option<Arc<TaskService>>,
    pub(crate) app: axum::Router,
    /// How its hot routes' 401s say how to authenticate (its axum routes' layer does the same).
    pub(crate) challenge: crate::protected_resource::Challenge,
    /// The map's entry it serves (placement and policy file fixed; quotas updated in place).
    entry: ArcSwap<TenantEntry>,
}

pub(crate) type TenantParts = Parts<Arc<Part>>;

/// What every tenant's part is built from.
pub(crate) struct Shared {
    pub(crate) settings: Settings,
    /// What every tenant's pipeline is built from.
    pub(crate) pipeline: PartConfig,
    pub(crate) console: Arc<Console>,
    /// Whether the parts come from a tenant map (their quotas then apply).
    pub(crate) from_map: bool,
}

impl Shared {
    /// `tenant`'s part, its series in `metrics`: its pipeline, its slow path
    /// on its placement, and every door in front of them.
    pub(crate) fn part(&self, tenant: &str, entry: &TenantEntry, metrics: Metrics) -> anyhow::Result<Arc<Part>> {
        let settings = &self.settings;
        let acl = entry.acl.as_ref().unwrap_or(&settings.acl);
        let quotas = self.from_map.then_some(&entry.quotas);
        let tasks = match &settings.tasks {
            Some(tasks) => {
                // The slow path's keys are the tenant's (`{prefix}:{tenant}:…`), on its placement.
                let mut tasks = tasks.clone();
                tasks.store.tenant = tenant.to_string();
                if let Some(redis) = &entry.redis {
                    tasks.redis = redis.clone();
                }
                Some(Arc::new(TaskService::new(&tasks, &metrics.registry).map_err(
                    |why| anyhow::anyhow!("tenant `{tenant}`'s slow path: {why}"),
                )?))
            }
            None => None,
        };
        let service = RouterService::start(&self.pipeline, tenant, (acl, quotas), metrics)?;
        if let Some(tasks) = &tasks {
            tasks.start(&service);
        }
        let app = crate::app::routes(service.clone(), tasks.clone(), self.console.clone());
        Ok(Arc::new(Part {
            challenge: crate::protected_resource::Challenge::of(&service),
            service,
            tasks,
            app,
            entry: ArcSwap::from_pointee(entry.clone()),
        }))
    }

    /// A part for a tenant of the map, its series labelled with its name.
    fn labelled_part(&self, tenant: &str, entry: &TenantEntry) -> anyhow::Result<Arc<Part>> {
        let metrics =
            Metrics::in_registry(agent_reach_tenancy::metrics_registry(tenant)).context("registering metrics")?;
        self.part(tenant, entry, metrics)
    }

    /// Every tenant of the map's part.
    pub(crate) fn parts_of(&self, map: &agent_reach_tenancy::TenantMap) -> anyhow::Result<Vec<(String, Arc<Part>)>> {
        map.tenants()
            .map(|(tenant, entry)| Ok((tenant.to_string(), self.labelled_part(tenant, entry)?)))
            .collect()
    }
}

/// Follows the tenant map's edits until the router is gone.
pub(crate) async fn follow(map: TenantMapHandle, parts: Weak<TenantParts>, shared: Arc<Shared>) {
    let mut changes = map.subscribe();
    while changes.changed().await.is_ok() {
        let Some(parts) = parts.upgrade() else {
            return;
        };
        let map = changes.borrow_and_update().clone();
        let mut next = Vec::new();
        for (tenant, entry) in map.tenants() {
            match parts.get(tenant) {
                Some(part) if part.entry.load().same_placement(entry) => {
                    if let Some(quota) = part.service.admission().quota() {
                        quota.set(&entry.quotas);
                    }
                    part.entry.store(Arc::new(entry.clone()));
                    next.push((tenant.to_string(), part));
                }
                existing => match shared.labelled_part(tenant, entry) {
                    Ok(part) => {
                        tracing::info!(message = "Tenant served.", tenant, placement = %entry.placement());
                        next.push((tenant.to_string(), part));
                    }
                    Err(error) => {
                        tracing::error!(
                            message = "Tenant's part could not be built; keeping what it had.",
                            tenant,
                            error = %format!("{error:#}")
                        );
                        if let Some(part) = existing {
                            next.push((tenant.to_string(), part));
                        }
                    }
                },
            }
        }
        let removed: Vec<_> = parts
            .all()
            .into_iter()
            .filter(|(tenant, _)| !map.contains(tenant))
            .map(|(tenant, _)| tenant)
            .collect();
        match parts.replace(next) {
            Ok(()) => {
                for tenant in removed {
                    tracing::info!(message = "Tenant no longer served.", tenant = %tenant);
                }
            }
            Err(why) => tracing::error!(message = "Tenant map edit not applied.", problem = %why),
        }
    }
}

/// The process's own routes, then each request to its tenant's part.
pub(crate) fn routes(parts: Arc<TenantParts>, process: prometheus::Registry) -> axum::Router {
    fn app_of(part: &Arc<Part>) -> axum::Router {
        part.app.clone()
    }
    let state = Process {
        parts: parts.clone(),
        registry: process,
    };
    axum::Router::new()
        .route("/metrics", get(metrics).fallback(method_not_allowed))
        .route("/readyz", get(readyz).fallback(method_not_allowed))
        .route(
            "/v1/tenants",
            get(list)
                .fallback(method_not_allowed)
                .layer(axum::middleware::from_fn_with_state(state.clone(), identified_at_home)),
        )
        .with_state(state)
        .merge(agent_reach_tenancy::dispatch_with(parts, app_of))
}

/// A router of one tenant: its part's routes, and `GET /v1/tenants` listing it.
pub(crate) fn single_routes(parts: Arc<TenantParts>, process: prometheus::Registry) -> axum::Router {
    let home = parts.home();
    let state = Process {
        parts,
        registry: process,
    };
    axum::Router::new()
        .route(
            "/v1/tenants",
            get(list)
                .fallback(method_not_allowed)
                .layer(axum::middleware::from_fn_with_state(state.clone(), identified_at_home)),
        )
        .with_state(state)
        .merge(home.app.clone())
}

#[derive(Clone)]
struct Process {
    parts: Arc<TenantParts>,
    /// The process's own series (assertion keys).
    registry: prometheus::Registry,
}

async fn metrics(State(process): State<Process>) -> Response {
    let parts = process.parts.all();
    for (_, part) in &parts {
        agent_reach_pipeline::http::refresh_gauges(&part.service);
    }
    let registries =
        std::iter::once(&process.registry).chain(parts.iter().map(|(_, part)| &part.service.metrics().registry));
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        agent_reach_tenancy::render_metrics(registries),
    )
        .into_response()
}

/// Ready when every tenant's snapshot is.
async fn readyz(State(process): State<Process>) -> Response {
    let parts = process.parts.all();
    let mut lines = Vec::new();
    for (tenant, part) in &parts {
        match agent_reach_pipeline::http::readiness(&part.service) {
            Ok(text) => lines.push(format!("{tenant}: {text}")),
            Err(why) => {
                return (StatusCode::SERVICE_UNAVAILABLE, format!("tenant `{tenant}`: {why}\n")).into_response();
            }
        }
    }
    (
        StatusCode::OK,
        format!("ready ({} tenants)\n{}\n", parts.len(), lines.join("\n")),
    )
        .into_response()
}

/// The process's own operator route is identified by the home tenant's part
/// (the one way in, as every part's routes are).
async fn identified_at_home(
    State(process): State<Process>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let home = process.parts.home();
    home.service.identify().request(request, next).await
}

/// `GET /v1/tenants`: each tenant served, its placement, quotas and usage,
/// for the home tenant's operators.
async fn list(State(process): State<Process>, identified: Identified, headers: HeaderMap) -> Response {
    let home = process.parts.home();
    if let Err(error) = agent_reach_pipeline::call::identify::operator(home.service.admission(), &identified, &headers)
    {
        return refused(error);
    }
    let mut tenants = Vec::new();
    for (tenant, part) in process.parts.all() {
        tenants.push(describe(&tenant, &part).await);
    }
    axum::Json(json!({ "home": &*process.parts.home_name(), "tenants": tenants })).into_response()
}

async fn describe(tenant: &str, part: &Part) -> Value {
    let entry = part.entry.load();
    let quotas = &entry.quotas;
    let families = part.service.metrics().registry.gather();
    let total = |name: &str| -> u64 {
        families
            .iter()
            .filter(|family| family.get_name() == name)
            .flat_map(|family| family.get_metric())
            .map(|metric| metric.get_counter().get_value() as u64)
            .sum()
    };
    let (in_flight, instances) = part.service.load_summary();
    let task_backlog = match &part.tasks {
        Some(tasks) => match tasks.backlog_total().await {
            Ok(count) => json!(count),
            Err(why) => json!({ "unavailable": why }),
        },
        None => Value::Null,
    };
    json!({
        "name": tenant,
        "placement": entry.placement(),
        "acl": entry.acl.as_ref().map(|path| path.display().to_string()),
        "quotas": {
            "rate_per_s": quotas.rate_per_s,
            "burst": quotas.rate_per_s.map(|rate| quotas.burst_for(rate)),
            "concurrency": quotas.concurrency,
            "task_backlog": quotas.task_backlog,
        },
        "usage": {
            "instances": instances,
            "in_flight": in_flight,
            "requests_total": total("agent_reach_router_requests_total"),
            "rate_limited_total": total("agent_reach_router_rate_limited_total"),
            "task_backlog": task_backlog,
        },
    })
}
