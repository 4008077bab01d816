//! Admission: the one gate every front door passes a call through before it
//! is routed (`/v1/invoke`, streamed or not, `/v1/broadcast`, the task
//! worker, A2A and MCP): the caller may call the capability (ACL), the
//! capability and a version matching the requirement exist in the snapshot,
//! the payload matches that version's compiled input schema, and the deadline
//! (the envelope's, else its timeout, else the capability's, else the
//! router's) has not passed; and the caller and its tenant are within their
//! limits and quotas ([`crate::limits`]). Nothing here touches a store or
//! compiles a schema.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_access::acl::Limit;
use agent_reach_access::{Acl, AclHandle, Caller, Delegation};
use agent_reach_proto::envelope::{BudgetLeft, InvokeRequest};
use agent_reach_tenancy::Quotas;
use serde_json::{json, Value};

use crate::breaker::BreakerConfig;
use crate::call::{Call, Entry};
use crate::delegation::{check_depth, delegation_of, groups_of, Budgets, ChainRules, Ledger};
use crate::error::{Code, RouterError};
use crate::grants::GrantsHandle;
use crate::limits::{Limiter, Permit};
use crate::outcome::Failure;
use crate::schema;
use crate::select::{self, Routable, SelectionLimits};
use crate::snapshot::{Capability, Snapshot, VersionGroup};
use crate::tuning::Tuning;

/// The policy half of the router: who may call what, how much, which
/// instances can take a call (for the choice of version), and the default deadline.
pub struct Admission {
    acl: AclHandle,
    /// Approved access requests, applied on top of `acl` (DESIGN §2.11).
    grants: Arc<GrantsHandle>,
    limiter: Limiter,
    /// The tenant's quotas, when the router serves a tenant map (DESIGN §8).
    quota: Option<TenantQuota>,
    breaker: BreakerConfig,
    max_inflight: u32,
    default_timeout: Duration,
    /// Checks the upstream assertions agents present when they call onwards.
    assertions: Arc<agent_reach_access::Assertions>,
    chains: ChainRules,
    /// Every chain's budget this part holds.
    budgets: Budgets,
    /// Whether a chained call's names are kept for the trail (set once the
    /// trail is on; a sampled span takes them too). Built only then: most
    /// chained calls on a router without a trail need none.
    name_chains: std::sync::atomic::AtomicBool,
}

/// One tenant's quotas on this router: its bucket and places in flight
/// (shared by all its callers) and its task backlog bound. Changed in place
/// when the tenant map's quotas change.
pub struct TenantQuota {
    tenant: Arc<str>,
    /// Rate and concurrency; `None`: neither bounded.
    limit: arc_swap::ArcSwapOption<Limit>,
    /// Tasks waiting at most; 0: unbounded.
    backlog: std::sync::atomic::AtomicU64,
    limiter: Limiter,
}

impl TenantQuota {
    /// Applies `quotas` (new buckets start full when the rate or concurrency changed).
    pub fn set(&self, quotas: &Quotas) {
        let limit = (quotas.rate_per_s.is_some() || quotas.concurrency.is_some()).then(|| Limit {
            rate_per_s: quotas.rate_per_s,
            burst: quotas.rate_per_s.map_or(1, |rate| quotas.burst_for(rate)),
            concurrency: quotas.concurrency,
        });
        self.limit.store(limit.map(Arc::new));
        self.backlog
            .store(quotas.task_backlog.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }

    /// The task backlog bound, if any.
    pub fn task_backlog(&self) -> Option<u64> {
        Some(self.backlog.load(std::sync::atomic::Ordering::Relaxed)).filter(|bound| *bound > 0)
    }

    /// A synchronous call: a token and a place of the tenant's.
    fn admit_call(&self) -> Result<Permit, RouterError> {
        let limit = self.limit.load();
        self.limiter.admit_call(&self.tenant, limit.as_deref())
    }
}

/// A call the router accepted: what it routes to and until when.
pub struct Admitted<'s> {
    pub capability: &'s Capability,
    /// The version the call goes to.
    pub group: &'s Arc<VersionGroup>,
    /// The absolute deadline, epoch milliseconds (forwarded to the agent).
    pub deadline_ms: u64,
    /// The same deadline on the monotonic clock.
    pub deadline: Instant,
    /// The caller's place in flight (a call's; a delivery's is held by the worker).
    pub permit: Permit,
    /// Who the call acts for, its depth, its budget (the next hop's assertion carries it).
    pub delegation: Delegation,
    /// The chain's budget ledger and what was left once this call was charged, when it has one.
    pub budget: Option<(Arc<Ledger>, BudgetLeft)>,
}

/// A call admission refused: the failure to answer, and the capability when
/// it was resolved (its metrics count the refusal).
pub struct Refused<'s> {
    /// Boxed to keep `admit`'s result small on the admitted path.
    pub failure: Box<Failure>,
    pub capability: Option<&'s Capability>,
}

impl Admission {
    pub fn new(
        acl: AclHandle,
        limiter: Limiter,
        tuning: &Tuning,
        assertions: Arc<agent_reach_access::Assertions>,
    ) -> Self {
        Self {
            acl,
            grants: Arc::default(),
            limiter,
            quota: None,
            breaker: BreakerConfig {
                failures: tuning.breaker_failures,
                open_for: tuning.breaker_open,
            },
            max_inflight: tuning.max_inflight_per_instance,
            default_timeout: tuning.default_timeout,
            assertions,
            chains: tuning.chains,
            budgets: Budgets::default(),
            name_chains: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Allows, beside the file, what a live grant of `grants` allows.
    pub fn with_grants(mut self, grants: Arc<GrantsHandle>) -> Self {
        self.grants = grants;
        self
    }

    /// The grants applied on top of the file (operators' view).
    pub fn grants(&self) -> &GrantsHandle {
        &self.grants
    }

    /// The policy in force (operators' view).
    pub fn acl(&self) -> &AclHandle {
        &self.acl
    }

    /// Bounds `tenant`'s calls by `quotas` (a router serving a tenant map).
    pub fn with_quota(mut self, tenant: &str, quotas: &Quotas) -> Self {
        let quota = TenantQuota {
            tenant: tenant.into(),
            limit: arc_swap::ArcSwapOption::empty(),
            backlog: std::sync::atomic::AtomicU64::new(0),
            limiter: Limiter::for_tenants(&self.limiter),
        };
        quota.set(quotas);
        self.quota = Some(quota);
        self
    }

    /// The callers' limiter and the tenant's (what the quota exchange shares).
    pub(crate) fn limiters(&self) -> Vec<&Limiter> {
        std::iter::once(&self.limiter)
            .chain(self.quota.as_ref().map(|quota| &quota.limiter))
            .collect()
    }

    /// The tenant's quotas, when it has a tenant map's entry.
    pub fn quota(&self) -> Option<&TenantQuota> {
        self.quota.as_ref()
    }

    /// What tells whether an instance can take a request (selection and broadcast use it too).
    pub fn limits(&self) -> SelectionLimits<'_> {
        SelectionLimits {
            breaker: &self.breaker,
            max_inflight: self.max_inflight,
        }
    }

    /// A task submission by `caller`: spends one of its tokens (429 `RATE_LIMITED` when none is left).
    pub fn limit_submission(&self, caller: &Caller) -> Result<(), RouterError> {
        if let Some(quota) = &self.quota {
            let limit = quota.limit.load();
            quota.limiter.admit_submission(&quota.tenant, limit.as_deref())?;
        }
        let Caller::Agent { name, .. } = caller else {
            return Ok(());
        };
        let acl = self.acl.current();
        if !acl.has_limits() {
            return Ok(());
        }
        self.limiter.admit_submission(name, acl.limit_for(name))
    }

    /// A task delivery on behalf of `caller`: waits for a place among its calls in flight.
    pub async fn enter_delivery(&self, caller: &Caller) -> Permit {
        let tenant = match &self.quota {
            Some(quota) => {
                let limit = quota.limit.load_full();
                quota.limiter.enter_delivery(&quota.tenant, limit.as_deref()).await
            }
            None => Permit::unlimited(),
        };
        let Caller::Agent { name, .. } = caller else {
            return Permit::unlimited().with_tenant(tenant);
        };
        let limit = {
            let acl = self.acl.current();
            acl.limit_for(name).copied()
        };
        self.limiter
            .enter_delivery(name, limit.as_ref())
            .await
            .with_tenant(tenant)
    }

    /// May `caller` call `capability` under the current `acl.yaml` or a live
    /// access grant? The one place that decides it. An unauthenticated
    /// caller exists only when authentication is switched off, and then the
    /// ACL is not enforced.
    pub fn authorize(&self, caller: &Caller, capability: &str) -> Result<(), RouterError> {
        self.authorize_with(&self.acl.current(), caller, capability)
    }

    /// [`Admission::authorize`] of a call made on the caller's own behalf (no chain).
    fn authorize_with(&self, acl: &Acl, caller: &Caller, capability: &str) -> Result<(), RouterError> {
        self.authorize_in(acl, caller, capability, &Delegation::direct(groups_of(caller)))
    }

    /// May `caller` call `capability` within `delegation` (`via:` and `subjects:` apply)?
    fn authorize_in(
        &self,
        acl: &Acl,
        caller: &Caller,
        capability: &str,
        delegation: &Delegation,
    ) -> Result<(), RouterError> {
        let Caller::Agent { name, .. } = caller else {
            return Ok(());
        };
        // A grant is looked up (and the clock read) only when the file says no.
        // Grants name no chain: they allow the caller whatever chain it serves.
        if acl.may_call_in(name, capability, delegation)
            || self.grants.load().allows(name, capability, crate::clock::epoch_ms())
        {
            return Ok(());
        }
        let mut details = json!({ "caller": &**name, "capability": capability });
        let message = if delegation.depth > 1 {
            details["chain"] = json!(delegation.names(name));
            format!(
                "caller `{name}` may not call `{capability}` on behalf of `{}` through this chain \
                 (acl.yaml permissions, their via: and subjects:)",
                delegation.original_subject(name)
            )
        } else {
            format!(
                "caller `{name}` may not call `{capability}` (acl.yaml permissions; ask with \
                 `agent-reach access request --capability {capability}`)"
            )
        };
        Err(RouterError::new(Code::Forbidden, message).with_details(details))
    }

    /// Does the trail record `capability`'s payloads (`trail.payloads` in `acl.yaml`)?
    pub fn records_payloads(&self, capability: &str) -> bool {
        self.acl.current().records_payloads(capability)
    }

    /// Keeps chained calls' names from now on (the trail records them).
    pub(crate) fn name_chains(&self) {
        self.name_chains.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// May `caller` read and replay this tenant's trail (`operators` and `auditors`)?
    pub fn authorize_trail_reader(&self, caller: &Caller) -> Result<(), RouterError> {
        let Caller::Agent { name, .. } = caller else {
            return Ok(());
        };
        if self.acl.current().may_read_trail(name) {
            return Ok(());
        }
        Err(RouterError::new(
            Code::Forbidden,
            format!("caller `{name}` may not read the trail (add it to `auditors:` or `operators:` in acl.yaml)"),
        )
        .with_details(json!({ "caller": &**name, "reason": "not_an_auditor" })))
    }

    /// May `caller` use the operator API (`operators:` in `acl.yaml`, DESIGN §8)?
    pub fn authorize_operator(&self, caller: &Caller) -> Result<(), RouterError> {
        let Caller::Agent { name, .. } = caller else {
            return Ok(());
        };
        if self.acl.current().is_operator(name) {
            return Ok(());
        }
        Err(RouterError::new(
            Code::Forbidden,
            format!("caller `{name}` is not an operator (add it to `operators:` in acl.yaml)"),
        )
        .with_details(json!({ "caller": &**name, "reason": "not_an_operator" })))
    }

    /// Admits `call` against `snapshot`, for a call that goes to one
    /// instance (invoke, streamed or not, a task's delivery, A2A, MCP): ACL,
    /// quotas, capability, version, schema, deadline. An unpinned call follows
    /// the capability's traffic split ([`resolve`]); every call to one instance
    /// is admitted here.
    pub fn admit<'s>(&self, call: &Call, snapshot: &'s Snapshot) -> Result<Admitted<'s>, Refused<'s>> {
        let limits = self.limits();
        let requirement = call.checked.version_req.as_ref();
        self.admit_with(call, snapshot, |capability| resolve(capability, requirement, &limits))
    }

    /// [`Admission::admit`] for a broadcast, which reaches every instance of
    /// one version: the split does not apply (it divides calls, and a
    /// broadcast is one call to all); the version is the highest that can
    /// take the call ([`resolve_version`]).
    pub fn admit_broadcast<'s>(&self, call: &Call, snapshot: &'s Snapshot) -> Result<Admitted<'s>, Refused<'s>> {
        let limits = self.limits();
        let requirement = call.checked.version_req.as_ref();
        self.admit_with(call, snapshot, |capability| {
            resolve_version(capability, requirement, &limits)
        })
    }

    /// Admits a call to a workflow (DESIGN §9): the ACL's `permissions` for
    /// the workflow's name, the caller's and tenant's limits as any call's,
    /// the input against the workflow's compiled input schema, the deadline
    /// (the envelope's, else its timeout, else the router's). Returns the
    /// absolute deadline and the call's place in flight.
    pub fn admit_workflow(
        &self,
        call: &Call,
        workflow: &agent_reach_workflows::Workflow,
    ) -> Result<(u64, Permit), RouterError> {
        let (caller, entry, request, now) = (&call.caller, call.entry, &call.checked.request, call.received);
        let permit = {
            let acl = self.acl.current();
            self.authorize_with(&acl, caller, &request.capability)?;
            let tenant = match (&self.quota, entry) {
                (Some(quota), Entry::Call) => quota.admit_call()?,
                _ => Permit::unlimited(),
            };
            match (caller, entry) {
                (Caller::Agent { name, .. }, Entry::Call) if acl.has_limits() => {
                    self.limiter.admit_call(name, acl.limit_for(name))?.with_tenant(tenant)
                }
                _ => Permit::unlimited().with_tenant(tenant),
            }
        };
        schema::check_value(
            &workflow.input_validator,
            &request.payload,
            Code::SchemaMismatch,
            &format!("the input schema of workflow {} {}", workflow.name, workflow.version),
        )?;
        let deadline_ms = request.deadline.unwrap_or_else(|| {
            let budget = request
                .timeout_ms
                .map(Duration::from_millis)
                .unwrap_or(self.default_timeout);
            now.epoch_ms
                .saturating_add(u64::try_from(budget.as_millis()).unwrap_or(u64::MAX))
        });
        if deadline_ms <= now.epoch_ms {
            return Err(RouterError::new(
                Code::DeadlineExceeded,
                "the deadline had passed before the call started",
            )
            .with_details(json!({ "deadline": deadline_ms })));
        }
        Ok((deadline_ms, permit))
    }

    /// Admission with `choose` picking the version among the capability's.
    fn admit_with<'s>(
        &self,
        call: &Call,
        snapshot: &'s Snapshot,
        choose: impl FnOnce(&'s Capability) -> Result<&'s Arc<VersionGroup>, RouterError>,
    ) -> Result<Admitted<'s>, Refused<'s>> {
        let (caller, entry, request, now) = (&call.caller, call.entry, &call.checked.request, call.received);
        let refused = |error: RouterError, capability| Refused {
            failure: Box::new(error.into()),
            capability,
        };
        // Who the call acts for: the chain of the call the caller serves, when it presents one.
        let mut delegation = delegation_of(
            caller,
            call.upstream.as_ref(),
            snapshot,
            &self.assertions,
            &self.chains,
            now.epoch_ms,
        )
        .map_err(|error| refused(error, None))?;
        let naming = call.trace.span.is_some() || self.name_chains.load(std::sync::atomic::Ordering::Relaxed);
        if delegation.depth > 1 && naming {
            let names = delegation.names(caller.name().unwrap_or(""));
            if let Some(span) = &call.trace.span {
                span.set(agent_reach_telemetry::spans::KeyValue::new(
                    "agent_reach.chain",
                    names.join(" > "),
                ));
                span.set(agent_reach_telemetry::spans::KeyValue::new(
                    "agent_reach.on_behalf_of",
                    names.first().cloned().unwrap_or_default(),
                ));
                span.set(agent_reach_telemetry::spans::KeyValue::new(
                    "agent_reach.depth",
                    i64::from(delegation.depth),
                ));
            }
            let _ = call.chain.set(names);
        }
        let permit = {
            // One policy load for the ACL and the limits.
            let acl = self.acl.current();
            // A replay of a recorded call (`replay_of`) is a trail reader's right,
            // beside `permissions` (`agent-reach trail replay`, DESIGN §9).
            let replaying =
                request.replay_of.is_some() && matches!(caller, Caller::Agent { name, .. } if acl.may_read_trail(name));
            if !replaying {
                self.authorize_in(&acl, caller, &request.capability, &delegation)
                    .map_err(|error| refused(error, None))?;
            }
            if delegation.depth > 1 {
                let max_depth = acl.max_depth_for(&request.capability).unwrap_or(self.chains.max_depth);
                check_depth(&delegation, max_depth, caller, &request.capability)
                    .map_err(|error| refused(error, None))?;
            }
            // The tenant's quota first: a tenant over it is refused whoever calls.
            let tenant = match (&self.quota, entry) {
                (Some(quota), Entry::Call) => quota.admit_call().map_err(|error| refused(error, None))?,
                _ => Permit::unlimited(),
            };
            match (caller, entry) {
                (Caller::Agent { name, .. }, Entry::Call) if acl.has_limits() => self
                    .limiter
                    .admit_call(name, acl.limit_for(name))
                    .map_err(|error| refused(error, None))?
                    .with_tenant(tenant),
                _ => Permit::unlimited().with_tenant(tenant),
            }
        };
        let capability = resolve_capability(snapshot, &request.capability).map_err(|error| refused(error, None))?;
        let group = choose(capability).map_err(|error| refused(error, Some(capability)))?;
        let in_version = |error: RouterError| Refused {
            failure: Box::new(Failure {
                capability_version: Some(group.version_text.clone()),
                ..error.into()
            }),
            capability: Some(capability),
        };
        schema::check_input(group, &request.payload).map_err(in_version)?;
        let deadline_ms = self.deadline_ms(request, group, now.epoch_ms);
        if deadline_ms <= now.epoch_ms {
            return Err(in_version(
                RouterError::new(
                    Code::DeadlineExceeded,
                    "the deadline had passed before the call started",
                )
                .with_details(json!({ "deadline": deadline_ms })),
            ));
        }
        // Last, once the call is otherwise admitted: a refused call spends nothing.
        let budget = self
            .budgets
            .charge(&mut delegation, request.budget.as_ref())
            .map_err(in_version)?;
        group.selections.inc();
        Ok(Admitted {
            capability,
            group,
            deadline_ms,
            deadline: now.instant_for(deadline_ms),
            permit,
            delegation,
            budget,
        })
    }

    /// The absolute deadline: the envelope's, else its timeout, else the capability's, else ours.
    fn deadline_ms(&self, request: &InvokeRequest, group: &VersionGroup, now_epoch_ms: u64) -> u64 {
        request.deadline.unwrap_or_else(|| {
            let budget = request
                .timeout_ms
                .map(Duration::from_millis)
                .or(group.timeout)
                .unwrap_or(self.default_timeout);
            now_epoch_ms.saturating_add(u64::try_from(budget.as_millis()).unwrap_or(u64::MAX))
        })
    }
}

pub(crate) fn resolve_capability<'a>(snapshot: &'a Snapshot, name: &str) -> Result<&'a Capability, RouterError> {
    snapshot.capabilities.get(name).ok_or_else(|| {
        RouterError::new(Code::CapabilityNotFound, format!("no agent offers capability `{name}`"))
            .with_details(json!({ "capability": name }))
    })
}

/// The version a call to one instance goes to: drawn from the capability's
/// split when the call names no version and a version of the split can take
/// it, else [`resolve_version`]'s highest version that can.
pub(crate) fn resolve<'a>(
    capability: &'a Capability,
    requirement: Option<&semver::VersionReq>,
    limits: &SelectionLimits<'_>,
) -> Result<&'a Arc<VersionGroup>, RouterError> {
    if requirement.is_none() {
        let can_take = |index: usize| {
            capability.versions.get(index).is_some_and(|group| {
                group
                    .instances
                    .iter()
                    .any(|instance| select::routable(instance, limits) == Some(Routable::Yes))
            })
        };
        if let Some(group) = capability
            .split
            .as_ref()
            .and_then(|split| split.choose(can_take))
            .and_then(|index| capability.versions.get(index))
        {
            return Ok(group);
        }
    }
    resolve_version(capability, requirement, limits)
}

/// The version a call goes to: the highest matching `requirement` (any,
/// when absent) that has an instance able to take it now (the one definition
/// of routable, [`select::routable`]), else the highest with an overloaded one
/// (a last resort); so a v2 that is still `starting`, draining or
/// breaker-open leaves unpinned calls on a ready v1 instead of failing them.
/// No matching version at all is `VERSION_NOT_FOUND`; matching versions none
/// of whose instances can take the call is `NO_AVAILABLE_INSTANCE`, naming
/// each version and its instances' states.
pub(crate) fn resolve_version<'a>(
    capability: &'a Capability,
    requirement: Option<&semver::VersionReq>,
    limits: &SelectionLimits<'_>,
) -> Result<&'a Arc<VersionGroup>, RouterError> {
    let matching = || {
        capability
            .versions
            .iter()
            .filter(move |group| requirement.is_none_or(|requirement| requirement.matches(&group.version)))
    };
    for wanted in [Routable::Yes, Routable::LastResort] {
        let found = matching().find(|group| {
            group
                .instances
                .iter()
                .any(|instance| select::routable(instance, limits) == Some(wanted))
        });
        if let Some(group) = found {
            return Ok(group);
        }
    }
    let requested = requirement.map(ToString::to_string).unwrap_or_default();
    if matching().next().is_none() {
        let available: Vec<&str> = capability
            .versions
            .iter()
            .map(|group| group.version_text.as_str())
            .collect();
        return Err(RouterError::new(
            Code::VersionNotFound,
            format!(
                "no version of `{}` matches `{requested}`; available: {}",
                capability.name,
                available.join(", ")
            ),
        )
        .with_details(json!({ "capability": capability.name, "requested": requested, "available": available })));
    }
    let versions: Vec<Value> = matching()
        .map(|group| {
            let instances: Vec<Value> = group
                .instances
                .iter()
                .map(|instance| {
                    json!({
                        "agent_id": instance.agent_id,
                        "status": instance.status.as_str(),
                        "breaker": instance.state.breaker.state().as_str(),
                        "inflight": instance.state.inflight(),
                    })
                })
                .collect();
            json!({ "version": group.version_text, "instances": instances })
        })
        .collect();
    let summary: Vec<String> = matching()
        .map(|group| {
            let states: Vec<String> = group
                .instances
                .iter()
                .map(|instance| {
                    format!(
                        "{} {}/{}",
                        instance.agent_id,
                        instance.status.as_str(),
                        instance.state.breaker.state().as_str()
                    )
                })
                .collect();
            format!("{} [{}]", group.version_text, states.join(", "))
        })
        .collect();
    Err(RouterError::new(
        Code::NoAvailableInstance,
        format!(
            "no instance of `{}` can take a request now (none ready or busy with a usable breaker and room; \
             overloaded only as a last resort): {}",
            capability.name,
            summary.join("; ")
        ),
    )
    .with_details(json!({ "capability": capability.name, "requested": requested, "versions": versions })))
}

/// The split's draw as admission applies it (formerly in `split.rs`, which is a leaf).
#[cfg(test)]
mod split_tests {
    use std::time::Duration;

    use agent_reach_proto::registry as pb;

    use super::*;
    use crate::metrics::Metrics;
    use crate::snapshot::SnapshotBuilder;

    fn instance(id: &str, version: &str, status: &str) -> pb::AgentInstance {
        pb::AgentInstance {
            agent_id: id.to_string(),
            name: "a".to_string(),
            endpoint: format!("http://127.0.0.1:1/{id}"),
            protocol: "http".to_string(),
            weight: 1,
            status: status.to_string(),
            capabilities: vec![pb::CapabilityDescriptor {
                name: "order.query".to_string(),
                version: version.to_string(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn split(weights: &[(&str, u32)]) -> pb::CapabilitySplit {
        pb::CapabilitySplit {
            capability: "order.query".to_string(),
            weights: weights
                .iter()
                .map(|(version, weight)| pb::VersionWeight {
                    version: version.to_string(),
                    weight: *weight,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn builder(instances: Vec<pb::AgentInstance>, splits: Vec<pb::CapabilitySplit>) -> SnapshotBuilder {
        let mut builder = SnapshotBuilder::new(Metrics::new().unwrap());
        builder.apply(pb::WatchEvent {
            revision: 1,
            kind: Some(pb::watch_event::Kind::Snapshot(pb::Snapshot {
                instances,
                reset: false,
                splits,
                grants: Vec::new(),
                more: false,
                policies: Vec::new(),
                workflows: Vec::new(),
            })),
        });
        builder
    }

    fn draws(capability: &Capability, calls: usize) -> std::collections::BTreeMap<String, usize> {
        let breaker = BreakerConfig {
            failures: 5,
            open_for: Duration::from_secs(30),
        };
        let limits = SelectionLimits {
            breaker: &breaker,
            max_inflight: 1024,
        };
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..calls {
            let group = resolve(capability, None, &limits).unwrap();
            *counts.entry(group.version_text.clone()).or_insert(0) += 1;
        }
        counts
    }

    #[test]
    fn unpinned_calls_follow_the_weights_and_unroutable_versions_drop_out() {
        let ready = vec![instance("a1", "1.4.2", "ready"), instance("a2", "2.0.0", "ready")];
        let mut builder = builder(ready, vec![split(&[("2.0.0", 5), ("1.4.2", 95), ("9.0.0", 50)])]);
        let snapshot = builder.build();
        let capability = &snapshot.capabilities["order.query"];
        // A version nobody offers takes no part; highest first.
        let shares: Vec<_> = capability
            .split
            .as_ref()
            .unwrap()
            .shares()
            .iter()
            .map(|(index, weight)| (capability.versions[*index].version_text.as_str(), *weight))
            .collect();
        assert_eq!(shares, [("2.0.0", 5), ("1.4.2", 95)]);
        let counts = draws(capability, 20_000);
        let canary = counts.get("2.0.0").copied().unwrap_or(0) as f64;
        // Binomial(20,000, 0.05): mean 1,000, sd ≈ 31; ±6 sd.
        assert!((canary - 1000.0).abs() < 190.0, "{counts:?}");

        // The canary still starting: everything goes to the other version.
        builder.apply(pb::WatchEvent {
            revision: 2,
            kind: Some(pb::watch_event::Kind::Updated(instance("a2", "2.0.0", "starting"))),
        });
        let snapshot = builder.build();
        assert_eq!(
            draws(&snapshot.capabilities["order.query"], 500).get("1.4.2"),
            Some(&500)
        );

        // A split none of whose versions can take the call falls back to the highest that can.
        builder.apply(pb::WatchEvent {
            revision: 3,
            kind: Some(pb::watch_event::Kind::SplitSet(split(&[("2.0.0", 1)]))),
        });
        let snapshot = builder.build();
        assert_eq!(draws(&snapshot.capabilities["order.query"], 50).get("1.4.2"), Some(&50));

        // Cleared: no split in the snapshot.
        builder.apply(pb::WatchEvent {
            revision: 4,
            kind: Some(pb::watch_event::Kind::SplitCleared(pb::SplitCleared {
                capability: "order.query".to_string(),
            })),
        });
        assert!(builder.build().capabilities["order.query"].split.is_none());
    }

    #[test]
    fn zero_weights_and_unknown_versions_leave_no_split() {
        let ready = vec![instance("a1", "1.0.0", "ready")];
        let mut builder = builder(ready, vec![split(&[("1.0.0", 0), ("2.0.0", 7)])]);
        assert!(builder.build().capabilities["order.query"].split.is_none());
    }
}
