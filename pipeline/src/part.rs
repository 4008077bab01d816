//! One tenant's pipeline, built: its ACL (followed live), its authenticator
//! (serving that tenant only), its snapshot fed by a Watch in that tenant,
//! its limits and quotas, its agent client. The router builds one per
//! tenant and puts its doors in front of it.

use std::path::Path;
use std::sync::Arc;

use agent_reach_access::{AclHandle, Assertions, AuthConfig, Authenticator};
use agent_reach_serving::tls::ClientFiles;
use agent_reach_tenancy::Quotas;
use anyhow::Context as _;

use crate::call::identify::{Identify, Sessions};
use crate::metrics::Metrics;
use crate::service::RouterService;
use crate::snapshot::SnapshotHandle;
use crate::tuning::Tuning;
use crate::watch::{self, RegistryCredential};
use crate::{admission, forward, limits};

pub use crate::forward::AgentTls;

/// What every tenant's pipeline is built from.
pub struct PartConfig {
    pub tuning: Tuning,
    pub auth: AuthConfig,
    /// Registry URLs, watched one at a time in this order (failover).
    pub registry: Vec<String>,
    pub registry_tls: ClientFiles,
    pub registry_credential: RegistryCredential,
    pub assertions: Arc<Assertions>,
    pub agent_tls: AgentTls,
    /// Console sessions (an operator's sealed token), accepted by the operator routes.
    pub sessions: Option<Arc<dyn Sessions>>,
    /// Selection policies plugged into the router (`plugin:NAME`).
    pub plugins: crate::select::plugin::Plugins,
}

impl RouterService {
    /// `tenant`'s pipeline: its policy from `acl`, bounded by `quotas` when
    /// it is a tenant map's, its series in `metrics`. Starts the registry
    /// watch that feeds its snapshot (it stops once the service is dropped).
    pub fn start(
        config: &PartConfig,
        tenant: &str,
        (acl, quotas): (&Path, Option<&Quotas>),
        metrics: Metrics,
    ) -> anyhow::Result<Arc<Self>> {
        let acl =
            AclHandle::load_and_watch(acl, &metrics.registry).with_context(|| format!("tenant `{tenant}`'s ACL"))?;
        let auth = Authenticator::load(&config.auth)
            .map_err(anyhow::Error::msg)?
            .serving(tenant);
        let mut identify = Identify::new(Arc::new(auth));
        if let Some(sessions) = &config.sessions {
            identify = identify.with_sessions(sessions.clone());
        }
        let snapshot = Arc::new(SnapshotHandle::new());
        tokio::spawn(watch::run(
            config.registry.clone(),
            config.registry_tls.clone(),
            config.registry_credential.clone(),
            tenant.to_string(),
            snapshot.clone(),
            metrics.clone(),
        ));
        let limiter = limits::Limiter::new(&metrics.registry).context("registering metrics")?;
        let mut admission = admission::Admission::new(acl, limiter, &config.tuning, config.assertions.clone())
            .with_grants(snapshot.grants().clone());
        if let Some(quotas) = quotas {
            admission = admission.with_quota(tenant, quotas);
        }
        let service = Arc::new(
            RouterService::new(
                config.tuning.clone(),
                snapshot,
                admission,
                identify,
                config.assertions.clone(),
                forward::Forwarder::new(config.tuning.pool_idle_per_instance, config.agent_tls.clone()),
                metrics,
            )
            .with_plugins(config.plugins.clone()),
        );
        service.learn_from_outcomes();
        Ok(service)
    }
}
