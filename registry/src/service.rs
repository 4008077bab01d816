//! The registry's operations, independent of transport: HTTP and gRPC
//! handlers authenticate, convert their wire types, and call these.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_reach_access::{AclHandle, Authenticator, Caller};
use agent_reach_errors::ErrorCode as _;
use agent_reach_proto::http::RegisterRequest;

use crate::catalog::{decode, Catalog, Entry, Resolution};
use crate::error::{self, Code, RegistryError};
use crate::metrics::Metrics;
use crate::model::{inflight_worth_writing, Instance, Keys, Status};
use crate::store::{Condition, Put, Store, StoreError};
use crate::validate::{self, SchemaBounds, TtlBounds};

/// How long a write waits for this registry's catalog to reflect it before
/// answering (read-your-writes); the write itself is already durable.
pub(crate) const CATALOG_WAIT: Duration = Duration::from_secs(2);
/// Attempts at a conditional write that lost a race.
pub(crate) const WRITE_ATTEMPTS: usize = 3;

#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// The tenant served; with `tenant_map`, the home tenant (DESIGN §8).
    pub tenant: String,
    /// Serve every tenant this map names, one part each (`build` reads it;
    /// a part's own config has none).
    pub tenant_map: Option<std::path::PathBuf>,
    pub ttl: TtlBounds,
    /// How large and deep a registration's schemas may be.
    pub schema: SchemaBounds,
    /// Largest accepted HTTP body, in bytes.
    pub max_body_bytes: usize,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            tenant: "default".to_string(),
            tenant_map: None,
            ttl: TtlBounds::default(),
            schema: SchemaBounds::default(),
            max_body_bytes: 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub agent_id: String,
    pub lease_id: i64,
    pub ttl_s: u32,
    pub heartbeat_interval_s: u32,
}

/// One heartbeat, as either transport received it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat<'a> {
    pub agent_id: &'a str,
    pub lease_id: i64,
    /// `None`: unchanged.
    pub status: Option<Status>,
    /// Requests in flight now (`None`: not reported).
    pub inflight: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatAck {
    pub agent_id: String,
    pub lease_id: i64,
    pub ttl_s: u32,
    pub status: Status,
}

pub struct RegistryService {
    store: Arc<dyn Store>,
    catalog: Arc<Catalog>,
    keys: Keys,
    acl: AclHandle,
    auth: Authenticator,
    config: RegistryConfig,
    metrics: Metrics,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}

impl RegistryService {
    /// Builds the service and starts syncing its catalog from the store.
    pub fn new(
        store: Arc<dyn Store>,
        acl: AclHandle,
        auth: Authenticator,
        config: RegistryConfig,
        metrics: Metrics,
    ) -> Arc<Self> {
        let keys = Keys::new(&config.tenant);
        let catalog = Catalog::new(keys.clone(), metrics.clone());
        catalog.spawn_sync(store.clone());
        Arc::new(Self {
            store,
            catalog,
            keys,
            acl,
            auth,
            config,
            metrics,
        })
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Its tenant is no longer served (DESIGN §8): the catalog stops following
    /// the store, and open `Watch` and `KeepAlive` streams end. The records in
    /// the store stay; their leases expire unless another registry renews them.
    pub fn retire(&self) {
        self.catalog.stop();
    }

    /// Resolves once [`RegistryService::retire`] was called.
    pub async fn retired(&self) {
        self.catalog.stopped().await;
    }

    /// The live policy (the operator API checks `operators` in it).
    pub(crate) fn acl(&self) -> &AclHandle {
        &self.acl
    }

    pub fn authenticate(&self, header: Option<&http::HeaderValue>) -> Result<Caller, RegistryError> {
        self.auth.verify_header(header).map_err(RegistryError::from)
    }

    /// Only the agent itself (its token's `sub` equals its `name`) may act for it.
    fn authorize_identity(caller: &Caller, name: &str) -> Result<(), RegistryError> {
        match caller {
            Caller::Unauthenticated => Ok(()),
            Caller::Agent { name: sub, .. } if **sub == *name => Ok(()),
            Caller::Agent { name: sub, .. } => Err(RegistryError::field(
                Code::Forbidden,
                "name",
                format!("a token for `{sub}` may not act for agent `{name}`"),
            )),
        }
    }

    // === Register ===

    #[tracing::instrument(skip_all, fields(agent_id = %request.agent_id, name = %request.name))]
    pub async fn register(&self, caller: &Caller, request: RegisterRequest) -> Result<Registered, RegistryError> {
        let outcome = self.try_register(caller, request).await;
        let label = match &outcome {
            Ok(_) => "ok",
            Err(error) if error.code.http_status().is_client_error() => "rejected",
            Err(_) => "error",
        };
        self.metrics.registrations.with_label_values(&[label]).inc();
        outcome
    }

    async fn try_register(&self, caller: &Caller, request: RegisterRequest) -> Result<Registered, RegistryError> {
        let registration = validate::registration(
            request,
            validate::Bounds {
                ttl: self.config.ttl,
                schema: self.config.schema,
            },
        )?;
        Self::authorize_identity(caller, &registration.name)?;
        if let Caller::Agent { name, .. } = caller {
            let acl = self.acl.current();
            for (index, capability) in registration.capabilities.iter().enumerate() {
                if !acl.may_provide(name, &capability.name) {
                    return Err(RegistryError::field(
                        Code::Forbidden,
                        format!("capabilities[{index}].name"),
                        format!(
                            "agent `{name}` may not provide `{}`: no `providers` rule in acl.yaml allows it",
                            capability.name
                        ),
                    ));
                }
            }
        }
        let key = self.keys.agent(&registration.agent_id);
        for _ in 0..WRITE_ATTEMPTS {
            let existing = self.store.get(&key).await?;
            if let Some(previous) = existing.as_ref().and_then(decode) {
                if previous.name != registration.name {
                    return Err(RegistryError::field(
                        Code::AgentIdTaken,
                        "agent_id",
                        format!(
                            "agent_id `{}` is registered by agent `{}`; choose another id",
                            registration.agent_id, previous.name
                        ),
                    ));
                }
            }
            let lease = self.store.grant_lease(i64::from(registration.ttl_s)).await?;
            let instance = Instance {
                agent_id: registration.agent_id.clone(),
                name: registration.name.clone(),
                endpoint: registration.endpoint.clone(),
                protocol: registration.protocol.clone(),
                weight: registration.weight,
                tags: registration.tags.clone(),
                capabilities: registration.capabilities.clone(),
                status: registration.status,
                lease_id: lease,
                ttl_s: registration.ttl_s,
                registered_at_ms: now_ms(),
                inflight: 0,
                operator_weight: false,
            };
            let value = serde_json::to_vec(&instance)
                .map_err(|error| RegistryError::new(Code::Internal, format!("cannot encode the record: {error}")))?;
            let condition = Condition::ModRevision {
                key: key.clone(),
                revision: existing.as_ref().map_or(0, |kv| kv.mod_revision),
            };
            let put = Put {
                key: key.clone(),
                value,
                lease,
            };
            match self.store.txn(vec![condition], vec![put], Vec::new()).await {
                Ok(revision) => {
                    // The record now lives on the new lease; ending the old one
                    // removes nothing else and stops its heartbeats.
                    if let Some(old) = existing.filter(|kv| kv.lease != 0 && kv.lease != lease) {
                        self.revoke_quietly(old.lease).await;
                    }
                    self.catalog.wait_for(revision, CATALOG_WAIT).await;
                    tracing::info!(message = "Instance registered.", lease_id = lease, revision);
                    return Ok(Registered {
                        agent_id: registration.agent_id,
                        lease_id: lease,
                        ttl_s: registration.ttl_s,
                        heartbeat_interval_s: (registration.ttl_s / 3).max(1),
                    });
                }
                Err(error) => {
                    // Nothing may stay behind from a failed registration.
                    self.revoke_quietly(lease).await;
                    if error != StoreError::Conflict {
                        return Err(error.into());
                    }
                }
            }
        }
        Err(RegistryError::new(
            Code::Conflict,
            "the same agent_id is being registered concurrently; retry",
        ))
    }

    async fn revoke_quietly(&self, lease: i64) {
        match self.store.revoke_lease(lease).await {
            Ok(_) | Err(StoreError::LeaseNotFound(_)) => {}
            Err(error) => tracing::warn!(message = "Lease revocation failed; it will expire by itself.", lease, %error),
        }
    }

    /// The catalog's entry, or the store's when this registry's catalog has
    /// not caught up yet (another registry just wrote it).
    pub(crate) async fn current_entry(&self, agent_id: &str) -> Result<Option<Entry>, RegistryError> {
        if let Some(entry) = self.catalog.get(agent_id) {
            return Ok(Some(entry));
        }
        self.current_entry_from_store(agent_id).await
    }

    // === Heartbeat ===

    /// Renews the lease and writes the record only when something routers use
    /// changed: the status, or the reported in-flight count by at least an
    /// eighth ([`inflight_worth_writing`]); both in one write. A heartbeat
    /// without either writes nothing.
    pub async fn heartbeat(&self, caller: &Caller, beat: Heartbeat<'_>) -> Result<HeartbeatAck, RegistryError> {
        let Heartbeat {
            agent_id,
            lease_id,
            status,
            inflight,
        } = beat;
        let mut entry = match self.catalog.get(agent_id) {
            Some(entry) if entry.instance.lease_id == lease_id => entry,
            // Not (yet) in this catalog, or an older lease: ask the store.
            _ => match self.current_entry_from_store(agent_id).await? {
                Some(entry) if entry.instance.lease_id == lease_id => entry,
                _ => return Err(error::lease_expired(agent_id)),
            },
        };
        Self::authorize_identity(caller, &entry.instance.name)?;
        let ttl = match self.store.keep_alive(lease_id).await {
            Ok(ttl) => ttl,
            Err(StoreError::LeaseNotFound(_)) => return Err(error::lease_expired(agent_id)),
            Err(error) => return Err(error.into()),
        };
        let current = entry.instance.status;
        let next = status.unwrap_or(current);
        if next != current && !current.can_become(next) {
            return Err(RegistryError::field(
                Code::InvalidStatusTransition,
                "status",
                format!(
                    "an instance cannot go from `{}` to `{}`",
                    current.as_str(),
                    next.as_str()
                ),
            ));
        }
        let stored_inflight = entry.instance.inflight;
        let inflight = inflight.filter(|reported| inflight_worth_writing(stored_inflight, *reported));
        if next != current || inflight.is_some() {
            for attempt in 0..WRITE_ATTEMPTS {
                match self.write_record(&entry, next, inflight).await {
                    Ok(()) => break,
                    Err(StoreError::Conflict) if attempt + 1 < WRITE_ATTEMPTS => {
                        entry = match self.current_entry_from_store(agent_id).await? {
                            Some(fresh) if fresh.instance.lease_id == lease_id => fresh,
                            _ => return Err(error::lease_expired(agent_id)),
                        };
                    }
                    Err(StoreError::LeaseNotFound(_)) => return Err(error::lease_expired(agent_id)),
                    Err(error) => return Err(error.into()),
                }
            }
            if next != current {
                self.metrics.status_writes.inc();
            } else {
                self.metrics.inflight_writes.inc();
            }
        }
        Ok(HeartbeatAck {
            agent_id: agent_id.to_string(),
            lease_id,
            ttl_s: u32::try_from(ttl).unwrap_or(u32::MAX),
            status: next,
        })
    }

    pub(crate) async fn current_entry_from_store(&self, agent_id: &str) -> Result<Option<Entry>, RegistryError> {
        let Some(kv) = self.store.get(&self.keys.agent(agent_id)).await? else {
            return Ok(None);
        };
        Ok(decode(&kv).map(|instance| Entry {
            instance: Arc::new(instance),
            mod_revision: kv.mod_revision,
        }))
    }

    /// Rewrites the record with `status` (and `inflight` when given), guarded by
    /// the revision it was read at.
    async fn write_record(&self, entry: &Entry, status: Status, inflight: Option<u32>) -> Result<(), StoreError> {
        let mut instance = Instance::clone(&entry.instance);
        instance.status = status;
        if let Some(inflight) = inflight {
            instance.inflight = inflight;
        }
        let key = self.keys.agent(&instance.agent_id);
        let value = serde_json::to_vec(&instance).map_err(|error| StoreError::Unavailable(error.to_string()))?;
        let revision = self
            .store
            .txn(
                vec![Condition::ModRevision {
                    key: key.clone(),
                    revision: entry.mod_revision,
                }],
                vec![Put {
                    key,
                    value,
                    lease: instance.lease_id,
                }],
                Vec::new(),
            )
            .await?;
        self.catalog.wait_for(revision, CATALOG_WAIT).await;
        Ok(())
    }

    // === Deregister ===

    #[tracing::instrument(skip_all, fields(agent_id = %agent_id))]
    pub async fn deregister(&self, caller: &Caller, agent_id: &str) -> Result<(), RegistryError> {
        validate::agent_id(agent_id)?;
        let Some(entry) = self.current_entry(agent_id).await? else {
            return Err(RegistryError::new(
                Code::AgentNotFound,
                format!("no instance `{agent_id}` is registered"),
            ));
        };
        Self::authorize_identity(caller, &entry.instance.name)?;
        self.catalog.expect_removal(agent_id);
        match self.store.revoke_lease(entry.instance.lease_id).await {
            Ok(revision) => {
                self.catalog.wait_for(revision, CATALOG_WAIT).await;
            }
            // Already gone: the goal is reached.
            Err(StoreError::LeaseNotFound(_)) => {}
            Err(error) => return Err(error.into()),
        }
        self.metrics.deregistrations.inc();
        tracing::info!(message = "Instance deregistered.");
        Ok(())
    }

    // === Resolve ===

    /// Routable instances of `name` at the highest version matching
    /// `requirement` (the highest overall when absent or empty).
    pub fn resolve(&self, name: &str, requirement: Option<&str>) -> Result<Resolution, RegistryError> {
        agent_reach_access::acl::check_dotted(name).map_err(|why| {
            RegistryError::field(
                Code::InvalidCapabilityName,
                "name",
                format!("capability name `{name}`: {why}"),
            )
        })?;
        let requirement = match requirement.map(str::trim).filter(|text| !text.is_empty()) {
            None => None,
            Some(text) => Some(semver::VersionReq::parse(text).map_err(|error| {
                RegistryError::field(
                    Code::InvalidVersionReq,
                    "version",
                    format!("`{text}` is not a semver requirement (e.g. ^1.2): {error}"),
                )
            })?),
        };
        let resolution = self.catalog.resolve(name, requirement.as_ref()).ok_or_else(|| {
            RegistryError::field(
                Code::CapabilityNotFound,
                "name",
                format!("no instance offers capability `{name}`"),
            )
        })?;
        if let Some(requirement) = &requirement {
            if !resolution.available.iter().any(|version| requirement.matches(version)) {
                let available: Vec<String> = resolution.available.iter().map(ToString::to_string).collect();
                return Err(RegistryError::field(
                    Code::VersionNotFound,
                    "version",
                    format!(
                        "no version of `{name}` matches `{requirement}`; available: {}",
                        available.join(", ")
                    ),
                )
                .with_details(serde_json::json!({ "available_versions": available })));
            }
        }
        Ok(resolution)
    }
}
