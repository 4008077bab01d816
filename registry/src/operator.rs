//! The operator API (DESIGN §2.9): a capability's traffic split between
//! versions for unpinned callers, its default selection policy (DESIGN §9),
//! and a live instance's weight, all changed without any agent
//! re-registering; and an operator's drain of an instance. Transport-free like `service`; the HTTP
//! handlers call these. Also the operators' one read that goes to the store
//! rather than the catalog: every live instance's last heartbeat, from its lease.
//!
//! Who may: callers listed under `operators` in `acl.yaml` (DESIGN §8); a
//! weight also by the agent itself (its token's `sub` is its `name`), as
//! heartbeats are.

use std::collections::BTreeMap;
use std::sync::Arc;

use agent_reach_access::Caller;
use agent_reach_proto::http::{PolicyRequest, SplitRequest};
use agent_reach_proto::Status;

use crate::catalog::Entry;
use crate::error::{Code, RegistryError};
use crate::model::{Instance, Policy, Split};
use crate::service::{now_ms, RegistryService, CATALOG_WAIT, WRITE_ATTEMPTS};
use crate::store::{Condition, LeaseTtl, Put, StoreError};
use crate::validate::{self, MAX_WEIGHT};

/// Largest weight of one version in a split (relative weights: basis points fit).
pub const MAX_SPLIT_WEIGHT: u64 = 10_000;
/// Versions one split may name.
pub const MAX_SPLIT_VERSIONS: usize = 64;

/// Lease reads in flight at once for [`RegistryService::heartbeats`]: a
/// thousand instances are read in well under a second, and an operator's
/// page never crowds out the agents' own renewals.
const LEASE_READS_IN_FLIGHT: usize = 16;

/// An instance's last heartbeat, as its lease in the store tells it.
pub struct HeartbeatAge {
    pub agent_id: String,
    pub lease_id: i64,
    pub lease: LeaseTtl,
}

/// A policy after its write: what the store holds and the write's revision.
pub struct PolicyWritten {
    pub policy: Policy,
    pub revision: i64,
}

/// The policy's HTTP form.
pub fn policy_to_wire(policy: &Policy, revision: Option<i64>) -> agent_reach_proto::http::CapabilityPolicy {
    agent_reach_proto::http::CapabilityPolicy {
        capability: policy.capability.clone(),
        policy: policy.policy.clone(),
        updated_at_ms: policy.updated_at_ms,
        updated_by: policy.updated_by.clone(),
        revision,
    }
}

/// A split after its write: what the store holds and the write's revision.
pub struct SplitWritten {
    pub split: Split,
    pub revision: i64,
}

/// May `caller` use the operator API? `Some(name)` to record who did;
/// `None` when authentication is off (everything is trusted then).
fn operator(service: &RegistryService, caller: &Caller, action: &str) -> Result<Option<String>, RegistryError> {
    match caller {
        Caller::Unauthenticated => Ok(None),
        Caller::Agent { name, .. } if service.acl().current().is_operator(name) => Ok(Some(name.to_string())),
        Caller::Agent { name, .. } => Err(RegistryError::new(
            Code::Forbidden,
            format!("`{name}` may not {action}: only callers listed under `operators` in acl.yaml may"),
        )),
    }
}

fn capability_name(name: &str) -> Result<(), RegistryError> {
    agent_reach_access::acl::check_dotted(name).map_err(|why| {
        RegistryError::field(
            Code::InvalidCapabilityName,
            "name",
            format!("capability name `{name}`: {why}"),
        )
    })
}

/// Checks a split body: 1..=64 versions, each valid semver, each weight an
/// integer in 0..=10000, at least one above 0. Versions need not be
/// registered yet (a split may be set before the canary is deployed).
pub fn split_weights(request: SplitRequest) -> Result<BTreeMap<semver::Version, u32>, RegistryError> {
    if request.weights.is_empty() {
        return Err(RegistryError::field(
            Code::InvalidSplit,
            "weights",
            "a split needs at least one version, e.g. {\"weights\": {\"2.0.0\": 5, \"1.4.2\": 95}}",
        ));
    }
    if request.weights.len() > MAX_SPLIT_VERSIONS {
        return Err(RegistryError::field(
            Code::InvalidSplit,
            "weights",
            format!(
                "a split names at most {MAX_SPLIT_VERSIONS} versions, this one {}",
                request.weights.len()
            ),
        ));
    }
    let mut weights = BTreeMap::new();
    for (text, value) in request.weights {
        let field = format!("weights.{text}");
        let version = semver::Version::parse(&text).map_err(|error| {
            RegistryError::field(
                Code::InvalidVersion,
                field.clone(),
                format!("`{text}` is not a semver version (e.g. 2.0.0): {error}"),
            )
        })?;
        let weight = value
            .as_u64()
            .filter(|weight| *weight <= MAX_SPLIT_WEIGHT)
            .and_then(|weight| u32::try_from(weight).ok())
            .ok_or_else(|| {
                RegistryError::field(
                    Code::InvalidSplit,
                    field.clone(),
                    format!("the weight of `{text}` must be an integer in 0..={MAX_SPLIT_WEIGHT}, not {value}"),
                )
            })?;
        if weights.insert(version, weight).is_some() {
            return Err(RegistryError::field(
                Code::InvalidSplit,
                field,
                format!("version `{text}` is listed twice"),
            ));
        }
    }
    if weights.values().all(|weight| *weight == 0) {
        return Err(RegistryError::field(
            Code::InvalidSplit,
            "weights",
            "at least one version needs a weight above 0 (to stop splitting, clear the split)",
        ));
    }
    Ok(weights)
}

/// The split's HTTP form.
pub fn split_to_wire(split: &Split, revision: Option<i64>) -> agent_reach_proto::http::CapabilitySplit {
    agent_reach_proto::http::CapabilitySplit {
        capability: split.capability.clone(),
        weights: split
            .weights
            .iter()
            .map(|(version, weight)| (version.to_string(), *weight))
            .collect(),
        updated_at_ms: split.updated_at_ms,
        updated_by: split.updated_by.clone(),
        revision,
    }
}

impl RegistryService {
    // === Traffic split ===

    /// Sets (or replaces) `name`'s split. The last write wins: a split is one
    /// operator decision, not a merge of several.
    #[tracing::instrument(skip_all, fields(capability = %name))]
    pub async fn set_split(
        &self,
        caller: &Caller,
        name: &str,
        request: SplitRequest,
    ) -> Result<SplitWritten, RegistryError> {
        let updated_by = operator(self, caller, "set a traffic split")?;
        capability_name(name)?;
        let weights = split_weights(request)?;
        let split = Split {
            capability: name.to_string(),
            weights,
            updated_at_ms: now_ms(),
            updated_by,
        };
        let value = serde_json::to_vec(&split)
            .map_err(|error| RegistryError::new(Code::Internal, format!("cannot encode the split: {error}")))?;
        // No lease: a split outlives every instance it names.
        let put = Put {
            key: self.keys().split(name),
            value,
            lease: 0,
        };
        let revision = self.store().txn(Vec::new(), vec![put], Vec::new()).await?;
        self.catalog().wait_for(revision, CATALOG_WAIT).await;
        let weights: Vec<String> = split
            .weights
            .iter()
            .map(|(version, weight)| format!("{version}={weight}"))
            .collect();
        tracing::info!(message = "Traffic split set.", weights = %weights.join(" "), revision);
        Ok(SplitWritten { split, revision })
    }

    /// Removes `name`'s split; unpinned calls go to the highest routable
    /// version again. Removing a split that is not there succeeds (the goal is reached).
    #[tracing::instrument(skip_all, fields(capability = %name))]
    pub async fn clear_split(&self, caller: &Caller, name: &str) -> Result<(), RegistryError> {
        operator(self, caller, "clear a traffic split")?;
        capability_name(name)?;
        let revision = self
            .store()
            .txn(Vec::new(), Vec::new(), vec![self.keys().split(name)])
            .await?;
        self.catalog().wait_for(revision, CATALOG_WAIT).await;
        tracing::info!(message = "Traffic split cleared.", revision);
        Ok(())
    }

    /// `name`'s split (any valid token may read it).
    pub fn split(&self, name: &str) -> Result<Arc<Split>, RegistryError> {
        capability_name(name)?;
        self.catalog().split(name).ok_or_else(|| {
            RegistryError::field(
                Code::SplitNotFound,
                "name",
                format!("capability `{name}` has no traffic split: unpinned calls go to its highest routable version"),
            )
        })
    }

    // === Default policy ===

    /// Sets (or replaces) `name`'s default selection policy: what its calls
    /// that name no `target_policy` use (DESIGN §9). Any `target_policy`
    /// word is accepted, `plugin:NAME` included: which plugins exist is each
    /// router's business (a router without that plugin uses its default and
    /// says so in its log).
    #[tracing::instrument(skip_all, fields(capability = %name))]
    pub async fn set_policy(
        &self,
        caller: &Caller,
        name: &str,
        request: PolicyRequest,
    ) -> Result<PolicyWritten, RegistryError> {
        let updated_by = operator(self, caller, "set a capability's policy")?;
        capability_name(name)?;
        let policy = agent_reach_proto::envelope::TargetPolicy::parse(request.policy.trim())
            .map_err(|why| RegistryError::field(Code::InvalidPolicy, "policy", why))?;
        let policy = Policy {
            capability: name.to_string(),
            policy: policy.to_string(),
            updated_at_ms: now_ms(),
            updated_by,
        };
        let value = serde_json::to_vec(&policy)
            .map_err(|error| RegistryError::new(Code::Internal, format!("cannot encode the policy: {error}")))?;
        // No lease: a capability's policy outlives every instance offering it.
        let put = Put {
            key: self.keys().policy(name),
            value,
            lease: 0,
        };
        let revision = self.store().txn(Vec::new(), vec![put], Vec::new()).await?;
        self.catalog().wait_for(revision, CATALOG_WAIT).await;
        tracing::info!(message = "Capability policy set.", policy = %policy.policy, revision);
        Ok(PolicyWritten { policy, revision })
    }

    /// Removes `name`'s default policy; its calls use each router's default
    /// again. Removing a policy that is not there succeeds.
    #[tracing::instrument(skip_all, fields(capability = %name))]
    pub async fn clear_policy(&self, caller: &Caller, name: &str) -> Result<(), RegistryError> {
        operator(self, caller, "clear a capability's policy")?;
        capability_name(name)?;
        let revision = self
            .store()
            .txn(Vec::new(), Vec::new(), vec![self.keys().policy(name)])
            .await?;
        self.catalog().wait_for(revision, CATALOG_WAIT).await;
        tracing::info!(message = "Capability policy cleared.", revision);
        Ok(())
    }

    /// `name`'s default policy (any valid token may read it).
    pub fn policy(&self, name: &str) -> Result<Arc<Policy>, RegistryError> {
        capability_name(name)?;
        self.catalog().policy(name).ok_or_else(|| {
            RegistryError::field(
                Code::PolicyNotFound,
                "name",
                format!("capability `{name}` has no policy of its own: its calls use the router's default"),
            )
        })
    }

    // === Heartbeat ages ===

    /// Every live instance's last heartbeat, by `agent_id`. Read from the
    /// store (one lease read per instance, at most [`LEASE_READS_IN_FLIGHT`]
    /// at once), not from this registry's memory: heartbeats go to any
    /// replica, and only the lease has seen them all. An instance whose
    /// lease the store no longer holds (expired, its record about to go) is
    /// left out. Operators only; never on a hot path.
    #[tracing::instrument(skip_all)]
    pub async fn heartbeats(&self, caller: &Caller) -> Result<Vec<HeartbeatAge>, RegistryError> {
        use futures::{StreamExt as _, TryStreamExt as _};

        operator(self, caller, "read the instances' heartbeats")?;
        let (instances, _) = self.catalog().list();
        let store = self.store();
        let mut ages: Vec<HeartbeatAge> = futures::stream::iter(instances)
            .map(|instance| async move {
                let lease = store.lease_ttl(instance.lease_id).await?;
                Ok::<_, StoreError>(lease.map(|lease| HeartbeatAge {
                    agent_id: instance.agent_id.clone(),
                    lease_id: instance.lease_id,
                    lease,
                }))
            })
            .buffer_unordered(LEASE_READS_IN_FLIGHT)
            .try_filter_map(|age| async move { Ok(age) })
            .try_collect()
            .await?;
        ages.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
        Ok(ages)
    }

    // === Live weight ===

    /// Changes a live instance's weight on its record, under its own lease, so
    /// routers pick it up from the `Watch` and the agent keeps heartbeating as
    /// before. The agent's next registration sets its own weight again. A
    /// weight an operator sets (anyone but the agent itself) is marked
    /// `operator_weight`: adaptive routing never changes it.
    #[tracing::instrument(skip_all, fields(agent_id = %agent_id, weight = weight))]
    pub async fn set_weight(
        &self,
        caller: &Caller,
        agent_id: &str,
        weight: u32,
    ) -> Result<Arc<Instance>, RegistryError> {
        validate::agent_id(agent_id)?;
        if !(1..=MAX_WEIGHT).contains(&weight) {
            return Err(RegistryError::field(
                Code::InvalidWeight,
                "weight",
                format!("weight {weight} is outside 1..={MAX_WEIGHT}"),
            ));
        }
        let not_found = || RegistryError::new(Code::AgentNotFound, format!("no instance `{agent_id}` is registered"));
        let mut entry = self.current_entry(agent_id).await?.ok_or_else(not_found)?;
        let by_operator = self.may_weigh(caller, &entry.instance)?;
        for attempt in 0..WRITE_ATTEMPTS {
            if entry.instance.weight == weight && entry.instance.operator_weight == by_operator {
                return Ok(entry.instance);
            }
            match self.write_weight(&entry, weight, by_operator).await {
                Ok(instance) => {
                    tracing::info!(message = "Instance weight changed.", from = entry.instance.weight);
                    return Ok(instance);
                }
                // A heartbeat's status write (or another operator) won: re-read and retry.
                Err(StoreError::Conflict) if attempt + 1 < WRITE_ATTEMPTS => {
                    entry = self.current_entry_from_store(agent_id).await?.ok_or_else(not_found)?;
                }
                // The lease ended meanwhile: the instance is gone.
                Err(StoreError::LeaseNotFound(_)) => return Err(not_found()),
                Err(error) => return Err(error.into()),
            }
        }
        Err(RegistryError::new(
            Code::Conflict,
            format!("`{agent_id}` kept changing while its weight was written; retry"),
        ))
    }

    /// Drains a live instance for an operator: its status becomes `draining`,
    /// which is final (§2.2), so routers stop sending it new calls while its
    /// calls in flight finish; its heartbeats keep its lease (their status is
    /// refused with INVALID_STATUS_TRANSITION) until it deregisters or stops.
    pub async fn drain(&self, caller: &Caller, agent_id: &str) -> Result<Arc<Instance>, RegistryError> {
        validate::agent_id(agent_id)?;
        let operator = operator(self, caller, "drain an instance")?;
        let not_found = || RegistryError::new(Code::AgentNotFound, format!("no instance `{agent_id}` is registered"));
        let mut entry = self.current_entry(agent_id).await?.ok_or_else(not_found)?;
        for attempt in 0..WRITE_ATTEMPTS {
            if entry.instance.status == Status::Draining {
                return Ok(entry.instance);
            }
            match self
                .write_instance(&entry, |instance| instance.status = Status::Draining)
                .await
            {
                Ok(instance) => {
                    tracing::info!(
                        message = "Instance drained by an operator.",
                        agent_id,
                        operator = operator.as_deref().unwrap_or("")
                    );
                    return Ok(instance);
                }
                Err(StoreError::Conflict) if attempt + 1 < WRITE_ATTEMPTS => {
                    entry = self.current_entry_from_store(agent_id).await?.ok_or_else(not_found)?;
                }
                Err(StoreError::LeaseNotFound(_)) => return Err(not_found()),
                Err(error) => return Err(error.into()),
            }
        }
        Err(RegistryError::new(
            Code::Conflict,
            format!("`{agent_id}` kept changing while it was drained; retry"),
        ))
    }

    /// Operators, and the agent itself: whether the caller is an operator
    /// (without authentication everyone is).
    fn may_weigh(&self, caller: &Caller, instance: &Instance) -> Result<bool, RegistryError> {
        match caller {
            Caller::Agent { name, .. } if **name == *instance.name => Ok(false),
            _ => operator(self, caller, "change an instance's weight").map(|_| true),
        }
    }

    async fn write_weight(&self, entry: &Entry, weight: u32, by_operator: bool) -> Result<Arc<Instance>, StoreError> {
        self.write_instance(entry, |instance| {
            instance.weight = weight;
            instance.operator_weight = by_operator;
        })
        .await
    }

    /// Writes `entry`'s record changed by `change`, if no one wrote it since it was read.
    async fn write_instance(
        &self,
        entry: &Entry,
        change: impl FnOnce(&mut Instance),
    ) -> Result<Arc<Instance>, StoreError> {
        let mut instance = Instance::clone(&entry.instance);
        change(&mut instance);
        let key = self.keys().agent(&instance.agent_id);
        let value = serde_json::to_vec(&instance).map_err(|error| StoreError::Unavailable(error.to_string()))?;
        let revision = self
            .store()
            .txn(
                vec![Condition::ModRevision {
                    key: key.clone(),
                    revision: entry.mod_revision,
                }],
                // The same lease: the record still ends with the agent.
                vec![Put {
                    key,
                    value,
                    lease: instance.lease_id,
                }],
                Vec::new(),
            )
            .await?;
        self.catalog().wait_for(revision, CATALOG_WAIT).await;
        Ok(Arc::new(instance))
    }
}
