//! Access requests and grants (DESIGN §2.11, §9): a caller asks to call a
//! capability `acl.yaml` does not let it call; an approver that the file's
//! `owners:` names for the capability approves or denies; an approval
//! writes a grant that every router applies on top of the file until it is
//! revoked or expires. Transport-free like `service`; the HTTP handlers
//! call these.
//!
//! Requests live under `.../access-requests/{id}` without a lease (kept,
//! decided or not: the record of who asked and who decided); grants under
//! `.../grants/{id}`, on a lease of their `ttl_s` when they expire, in the
//! catalog (the `Watch` publishes them). Listings of requests read the
//! store: they are rare, and any replica answers the same at once.

use std::sync::Arc;

use agent_reach_access::Caller;
use agent_reach_proto::http::{self as wire, AccessRequestBody};
use serde_json::json;

use crate::catalog::decode_grant;
use crate::error::{Code, RegistryError};
use crate::model::{AccessRequest, AccessStatus, Grant};
use crate::service::{now_ms, RegistryService, CATALOG_WAIT, WRITE_ATTEMPTS};
use crate::store::{Condition, KeyValue, Put, StoreError};

/// The longest grant a request may ask for: a year (longer belongs in `acl.yaml`).
pub const MAX_GRANT_TTL_S: u64 = 365 * 24 * 3600;
/// The longest `reason` or `note`, in bytes.
pub const MAX_TEXT_BYTES: usize = 1000;

/// An approver's answer to a pending request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Deny,
}

/// What `GET /v1/grants` keeps: `caller` and `capability` filters.
#[derive(Debug, Default, Clone)]
pub struct GrantFilter {
    pub caller: Option<String>,
    pub capability: Option<String>,
}

/// A request's status as read now: `approved` whose grant expired reads `expired`.
pub fn status_now(request: &AccessRequest, now_ms: u64) -> &'static str {
    match (request.status, request.expires_at_ms) {
        (AccessStatus::Approved, Some(expires)) if expires <= now_ms => "expired",
        (status, _) => status.as_str(),
    }
}

/// The request's HTTP form; `approvers` named while it is pending.
pub fn request_to_wire(request: &AccessRequest, approvers: Vec<String>, now_ms: u64) -> wire::AccessRequest {
    wire::AccessRequest {
        id: request.id.clone(),
        status: status_now(request, now_ms).to_string(),
        caller: request.caller.clone(),
        capability: request.capability.clone(),
        reason: request.reason.clone(),
        ttl_s: request.ttl_s,
        requested_by: request.requested_by.clone(),
        requested_at_ms: request.requested_at_ms,
        approvers,
        decided_by: request.decided_by.clone(),
        decided_at_ms: request.decided_at_ms,
        note: request.note.clone(),
        grant_id: request.grant_id.clone(),
        expires_at_ms: request.expires_at_ms,
        revoked_by: request.revoked_by.clone(),
        revoked_at_ms: request.revoked_at_ms,
    }
}

pub fn grant_to_wire(grant: &Grant) -> wire::Grant {
    wire::Grant {
        id: grant.id.clone(),
        caller: grant.caller.clone(),
        capability: grant.capability.clone(),
        request_id: grant.request_id.clone(),
        granted_by: grant.granted_by.clone(),
        granted_at_ms: grant.granted_at_ms,
        expires_at_ms: grant.expires_at_ms,
    }
}

/// `ar-` or `gr-` and 16 hex digits (64 random bits: ids are not guessable in practice).
fn new_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

fn request_not_found(id: &str) -> RegistryError {
    RegistryError::new(
        Code::AccessRequestNotFound,
        format!("no access request `{id}` in this tenant (`agent-reach access ls` lists them)"),
    )
}

fn grant_not_found(id: &str) -> RegistryError {
    RegistryError::new(
        Code::GrantNotFound,
        format!("no live grant `{id}` in this tenant (revoked, expired, or never granted)"),
    )
}

/// A non-empty text of at most [`MAX_TEXT_BYTES`].
fn text(field: &str, value: &str, required: bool) -> Result<(), RegistryError> {
    if required && value.trim().is_empty() {
        return Err(RegistryError::field(
            Code::InvalidAccessRequest,
            field,
            format!("`{field}` must say why (it is shown to the approvers)"),
        ));
    }
    if value.len() > MAX_TEXT_BYTES {
        return Err(RegistryError::field(
            Code::InvalidAccessRequest,
            field,
            format!("`{field}` is {} bytes; at most {MAX_TEXT_BYTES}", value.len()),
        ));
    }
    Ok(())
}

fn decode_request(kv: &KeyValue) -> Option<AccessRequest> {
    match serde_json::from_slice::<AccessRequest>(&kv.value) {
        Ok(request) => Some(request),
        Err(error) => {
            tracing::warn!(message = "Skipping undecodable access request.", key = %kv.key, %error);
            None
        }
    }
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, RegistryError> {
    serde_json::to_vec(value).map_err(|error| RegistryError::new(Code::Internal, format!("cannot encode: {error}")))
}

impl RegistryService {
    /// The token's subject; `None` when authentication is off.
    fn subject(caller: &Caller) -> Option<&str> {
        match caller {
            Caller::Agent { name, .. } => Some(name),
            Caller::Unauthenticated => None,
        }
    }

    /// May `caller` see `request`: operators, its caller and filer, and the
    /// approvers of its capability (everyone without authentication).
    fn may_see(&self, caller: &Caller, request_caller: &str, filer: Option<&str>, capability: &str) -> bool {
        let Some(name) = Self::subject(caller) else {
            return true;
        };
        let acl = self.acl().current();
        acl.is_operator(name) || name == request_caller || filer == Some(name) || acl.is_approver(name, capability)
    }

    /// A live grant of `caller` for `capability`, if any.
    fn live_grant(&self, caller: &str, capability: &str, now_ms: u64) -> Option<Arc<Grant>> {
        self.catalog()
            .grants()
            .into_iter()
            .find(|grant| grant.caller == caller && grant.capability == capability && grant.is_live(now_ms))
    }

    // === File a request ===

    /// Files a pending request, or answers the pending one already filed for
    /// the same caller and capability (`false`: nothing new was written), so
    /// an agent asking at every start-up files it once.
    #[tracing::instrument(skip_all, fields(capability = %body.capability))]
    pub async fn request_access(
        &self,
        caller: &Caller,
        body: AccessRequestBody,
    ) -> Result<(wire::AccessRequest, bool), RegistryError> {
        let subject = Self::subject(caller);
        let target = match (body.caller.as_deref(), subject) {
            (Some(named), _) => named.to_string(),
            (None, Some(subject)) => subject.to_string(),
            (None, None) => {
                return Err(RegistryError::field(
                    Code::MissingField,
                    "caller",
                    "without authentication, name the `caller` who asks",
                ))
            }
        };
        agent_reach_access::acl::check_agent_name(&target)
            .map_err(|why| RegistryError::field(Code::InvalidName, "caller", format!("caller `{target}`: {why}")))?;
        if let Some(subject) = subject.filter(|subject| *subject != target) {
            if !self.acl().current().is_operator(subject) {
                return Err(RegistryError::field(
                    Code::Forbidden,
                    "caller",
                    format!("`{subject}` may ask only for itself, not for `{target}` (operators may ask for anyone)"),
                ));
            }
        }
        agent_reach_access::acl::check_dotted(&body.capability).map_err(|why| {
            RegistryError::field(
                Code::InvalidCapabilityName,
                "capability",
                format!("capability name `{}`: {why}", body.capability),
            )
        })?;
        text("reason", &body.reason, true)?;
        if let Some(ttl_s) = body.ttl_s.filter(|ttl_s| !(1..=MAX_GRANT_TTL_S).contains(ttl_s)) {
            return Err(RegistryError::field(
                Code::InvalidTtl,
                "ttl_s",
                format!("ttl_s {ttl_s} is outside 1..={MAX_GRANT_TTL_S} (a year); omit it for a grant until revoked"),
            ));
        }
        let capability = body.capability;
        if !self.catalog().offers(&capability) {
            return Err(RegistryError::field(
                Code::CapabilityNotFound,
                "capability",
                format!("no instance offers capability `{capability}`: ask for a capability that is registered"),
            ));
        }
        let now = now_ms();
        let approvers: Vec<String> = {
            let acl = self.acl().current();
            if acl.may_call(&target, &capability) {
                return Err(RegistryError::field(
                    Code::AlreadyAllowed,
                    "capability",
                    format!("`{target}` may already call `{capability}` (acl.yaml permissions)"),
                )
                .with_details(json!({ "caller": target, "capability": capability, "by": "acl" })));
            }
            acl.approvers_of(&capability).into_iter().map(str::to_string).collect()
        };
        if let Some(grant) = self.live_grant(&target, &capability, now) {
            return Err(RegistryError::field(
                Code::AlreadyAllowed,
                "capability",
                format!("`{target}` may already call `{capability}` (grant `{}`)", grant.id),
            )
            .with_details(json!({ "caller": target, "capability": capability, "by": "grant", "grant_id": grant.id })));
        }
        if approvers.is_empty() {
            return Err(RegistryError::field(
                Code::NoOwner,
                "capability",
                format!(
                    "no `owners:` entry in acl.yaml names an approver for `{capability}`, so no one could decide; \
                     ask the file's owners to add one, or to add a `permissions` rule"
                ),
            ));
        }
        let (requests, _) = self.store().list(self.keys().access_requests()).await?;
        if let Some(pending) = requests.iter().filter_map(decode_request).find(|request| {
            request.status == AccessStatus::Pending && request.caller == target && request.capability == capability
        }) {
            return Ok((request_to_wire(&pending, approvers, now), false));
        }
        let request = AccessRequest {
            id: new_id("ar"),
            caller: target,
            capability,
            reason: body.reason,
            ttl_s: body.ttl_s,
            status: AccessStatus::Pending,
            requested_by: subject.map(str::to_string),
            requested_at_ms: now,
            decided_by: None,
            decided_at_ms: None,
            note: None,
            grant_id: None,
            expires_at_ms: None,
            revoked_by: None,
            revoked_at_ms: None,
        };
        let key = self.keys().access_request(&request.id);
        let put = Put {
            key: key.clone(),
            value: encode(&request)?,
            lease: 0,
        };
        // A fresh id: the condition only guards against a (64-bit) collision.
        let absent = Condition::ModRevision { key, revision: 0 };
        self.store().txn(vec![absent], vec![put], Vec::new()).await?;
        self.metrics().access_decisions.with_label_values(&["requested"]).inc();
        tracing::info!(
            message = "Access requested.",
            id = %request.id,
            caller = %request.caller,
            requested_by = request.requested_by.as_deref().unwrap_or(""),
            approvers = %approvers.join(","),
            reason = %request.reason,
        );
        Ok((request_to_wire(&request, approvers, now), true))
    }

    // === Read requests ===

    /// The requests `caller` may see (§2.11), oldest first, only those of
    /// `status` when given (`pending`, `approved`, `denied`, `revoked`, `expired`).
    pub async fn access_requests(
        &self,
        caller: &Caller,
        status: Option<&str>,
    ) -> Result<Vec<wire::AccessRequest>, RegistryError> {
        if let Some(status) = status {
            if !["pending", "approved", "denied", "revoked", "expired"].contains(&status) {
                return Err(RegistryError::field(
                    Code::InvalidStatus,
                    "status",
                    format!("`{status}` is not a request status: pending, approved, denied, revoked or expired"),
                ));
            }
        }
        let (kvs, _) = self.store().list(self.keys().access_requests()).await?;
        let now = now_ms();
        let acl = self.acl().current();
        let mut requests: Vec<wire::AccessRequest> = kvs
            .iter()
            .filter_map(decode_request)
            .filter(|request| {
                self.may_see(
                    caller,
                    &request.caller,
                    request.requested_by.as_deref(),
                    &request.capability,
                )
            })
            .filter(|request| status.is_none_or(|status| status_now(request, now) == status))
            .map(|request| {
                let approvers = match request.status {
                    AccessStatus::Pending => acl.approvers_of(&request.capability),
                    _ => Vec::new(),
                };
                request_to_wire(&request, approvers.into_iter().map(str::to_string).collect(), now)
            })
            .collect();
        requests.sort_by(|a, b| (a.requested_at_ms, &a.id).cmp(&(b.requested_at_ms, &b.id)));
        Ok(requests)
    }

    /// One request, if `caller` may see it (otherwise it is not found).
    pub async fn access_request(&self, caller: &Caller, id: &str) -> Result<wire::AccessRequest, RegistryError> {
        let (request, _) = self.stored_request(id).await?;
        if !self.may_see(
            caller,
            &request.caller,
            request.requested_by.as_deref(),
            &request.capability,
        ) {
            return Err(request_not_found(id));
        }
        let approvers: Vec<String> = match request.status {
            AccessStatus::Pending => {
                let acl = self.acl().current();
                acl.approvers_of(&request.capability)
                    .into_iter()
                    .map(str::to_string)
                    .collect()
            }
            _ => Vec::new(),
        };
        Ok(request_to_wire(&request, approvers, now_ms()))
    }

    /// The stored request and its mod revision, read from the store (the
    /// one truth for a decision's guard).
    async fn stored_request(&self, id: &str) -> Result<(AccessRequest, i64), RegistryError> {
        if id.is_empty() || id.contains('/') {
            return Err(request_not_found(id));
        }
        let kv = self
            .store()
            .get(&self.keys().access_request(id))
            .await?
            .ok_or_else(|| request_not_found(id))?;
        let request = decode_request(&kv).ok_or_else(|| request_not_found(id))?;
        Ok((request, kv.mod_revision))
    }

    // === Decide ===

    /// Approves or denies a pending request, for an approver `owners:` names
    /// for its capability. Approving writes the grant in the same
    /// transaction as the decision; both are logged with the approver's name.
    #[tracing::instrument(skip_all, fields(id = %id, decision = ?decision))]
    pub async fn decide(
        &self,
        caller: &Caller,
        id: &str,
        decision: Decision,
        note: Option<String>,
    ) -> Result<wire::AccessRequest, RegistryError> {
        if let Some(note) = &note {
            text("note", note, false)?;
        }
        let approver = Self::subject(caller).map(str::to_string);
        for attempt in 0..WRITE_ATTEMPTS {
            let (request, revision) = self.stored_request(id).await?;
            if let Some(name) = &approver {
                let acl = self.acl().current();
                if !acl.is_approver(name, &request.capability) {
                    let approvers = acl.approvers_of(&request.capability);
                    return Err(RegistryError::new(
                        Code::Forbidden,
                        format!(
                            "`{name}` may not decide access to `{}`: only its owners' approvers may ({})",
                            request.capability,
                            if approvers.is_empty() {
                                "none named in acl.yaml".to_string()
                            } else {
                                approvers.join(", ")
                            }
                        ),
                    )
                    .with_details(
                        json!({ "capability": request.capability, "approvers": approvers, "reason": "not_an_owner" }),
                    ));
                }
            }
            if request.status != AccessStatus::Pending {
                return Err(RegistryError::new(
                    Code::AlreadyDecided,
                    format!(
                        "access request `{id}` is already {} (by {}); file a new request to ask again",
                        request.status.as_str(),
                        request.decided_by.as_deref().unwrap_or("someone")
                    ),
                )
                .with_details(json!({ "status": request.status.as_str(), "decided_by": request.decided_by })));
            }
            match self
                .write_decision(request, revision, decision, (&approver, &note))
                .await
            {
                Ok(decided) => return Ok(decided),
                // Someone else decided meanwhile: read again (and answer ALREADY_DECIDED).
                Err(StoreError::Conflict) if attempt + 1 < WRITE_ATTEMPTS => continue,
                Err(error) => return Err(error.into()),
            }
        }
        Err(RegistryError::new(
            Code::Conflict,
            format!("access request `{id}` kept changing while it was decided; retry"),
        ))
    }

    async fn write_decision(
        &self,
        mut request: AccessRequest,
        revision: i64,
        decision: Decision,
        (approver, note): (&Option<String>, &Option<String>),
    ) -> Result<wire::AccessRequest, StoreError> {
        let now = now_ms();
        request.decided_by = approver.clone();
        request.decided_at_ms = Some(now);
        request.note = note.clone();
        let key = self.keys().access_request(&request.id);
        let mut puts = Vec::with_capacity(2);
        let mut lease = 0;
        let grant = match decision {
            Decision::Deny => {
                request.status = AccessStatus::Denied;
                None
            }
            Decision::Approve => {
                let grant = Grant {
                    id: new_id("gr"),
                    caller: request.caller.clone(),
                    capability: request.capability.clone(),
                    request_id: request.id.clone(),
                    granted_by: approver.clone(),
                    granted_at_ms: now,
                    expires_at_ms: request
                        .ttl_s
                        .map(|ttl_s| now.saturating_add(ttl_s.saturating_mul(1000))),
                };
                if let Some(ttl_s) = request.ttl_s {
                    // Routers stop the grant at `expires_at_ms` by their clock;
                    // the lease removes its key from etcd after.
                    lease = self
                        .store()
                        .grant_lease(i64::try_from(ttl_s).unwrap_or(i64::MAX))
                        .await?;
                }
                request.status = AccessStatus::Approved;
                request.grant_id = Some(grant.id.clone());
                request.expires_at_ms = grant.expires_at_ms;
                puts.push(Put {
                    key: self.keys().grant(&grant.id),
                    value: serde_json::to_vec(&grant).map_err(|error| StoreError::Unavailable(error.to_string()))?,
                    lease,
                });
                Some(grant)
            }
        };
        puts.push(Put {
            key: key.clone(),
            value: serde_json::to_vec(&request).map_err(|error| StoreError::Unavailable(error.to_string()))?,
            lease: 0,
        });
        let written = self
            .store()
            .txn(vec![Condition::ModRevision { key, revision }], puts, Vec::new())
            .await;
        let revision = match written {
            Ok(revision) => revision,
            Err(error) => {
                if lease != 0 {
                    // Nothing may stay behind from a failed approval.
                    let _ = self.store().revoke_lease(lease).await;
                }
                return Err(error);
            }
        };
        self.catalog().wait_for(revision, CATALOG_WAIT).await;
        let approver = approver.as_deref().unwrap_or("");
        match &grant {
            Some(grant) => {
                self.metrics().access_decisions.with_label_values(&["approved"]).inc();
                tracing::info!(
                    message = "Access request approved.",
                    id = %request.id, caller = %request.caller, capability = %request.capability,
                    approver, grant_id = %grant.id, expires_at_ms = grant.expires_at_ms.unwrap_or(0), revision
                );
            }
            None => {
                self.metrics().access_decisions.with_label_values(&["denied"]).inc();
                tracing::info!(
                    message = "Access request denied.",
                    id = %request.id, caller = %request.caller, capability = %request.capability,
                    approver, revision
                );
            }
        }
        Ok(request_to_wire(&request, Vec::new(), now))
    }

    // === Grants ===

    /// The live grants `caller` may see (operators, the grantee, the
    /// capability's approvers), by id, filtered by `filter`.
    pub fn grants(&self, caller: &Caller, filter: &GrantFilter) -> Vec<wire::Grant> {
        let now = now_ms();
        self.catalog()
            .grants()
            .iter()
            .filter(|grant| grant.is_live(now))
            .filter(|grant| filter.caller.as_ref().is_none_or(|caller| *caller == grant.caller))
            .filter(|grant| {
                filter
                    .capability
                    .as_ref()
                    .is_none_or(|capability| *capability == grant.capability)
            })
            .filter(|grant| self.may_see(caller, &grant.caller, None, &grant.capability))
            .map(|grant| grant_to_wire(grant))
            .collect()
    }

    /// Revokes a grant (its capability's approvers, and operators): routers
    /// refuse its calls once the `Watch` brings the removal. Its request
    /// becomes `revoked`, with who did it.
    #[tracing::instrument(skip_all, fields(grant_id = %id))]
    pub async fn revoke_grant(&self, caller: &Caller, id: &str) -> Result<(), RegistryError> {
        if id.is_empty() || id.contains('/') {
            return Err(grant_not_found(id));
        }
        let key = self.keys().grant(id);
        let kv = self.store().get(&key).await?.ok_or_else(|| grant_not_found(id))?;
        let grant = decode_grant(&kv).ok_or_else(|| grant_not_found(id))?;
        let revoker = Self::subject(caller).map(str::to_string);
        if let Some(name) = &revoker {
            let acl = self.acl().current();
            if !(acl.is_operator(name) || acl.is_approver(name, &grant.capability)) {
                return Err(RegistryError::new(
                    Code::Forbidden,
                    format!(
                        "`{name}` may not revoke access to `{}`: its owners' approvers and operators may",
                        grant.capability
                    ),
                )
                .with_details(json!({ "capability": grant.capability, "reason": "not_an_owner" })));
            }
        }
        for attempt in 0..WRITE_ATTEMPTS {
            let now = now_ms();
            let mut conditions = vec![Condition::ModRevision {
                key: key.clone(),
                revision: kv.mod_revision,
            }];
            let mut puts = Vec::new();
            if let Ok((mut request, revision)) = self.stored_request(&grant.request_id).await {
                request.status = AccessStatus::Revoked;
                request.revoked_by = revoker.clone();
                request.revoked_at_ms = Some(now);
                conditions.push(Condition::ModRevision {
                    key: self.keys().access_request(&request.id),
                    revision,
                });
                puts.push(Put {
                    key: self.keys().access_request(&request.id),
                    value: encode(&request)?,
                    lease: 0,
                });
            }
            match self.store().txn(conditions, puts, vec![key.clone()]).await {
                Ok(revision) => {
                    if kv.lease != 0 {
                        // Its lease holds nothing more; let it go now rather than at expiry.
                        let _ = self.store().revoke_lease(kv.lease).await;
                    }
                    self.catalog().wait_for(revision, CATALOG_WAIT).await;
                    self.metrics().access_decisions.with_label_values(&["revoked"]).inc();
                    tracing::info!(
                        message = "Access grant revoked.",
                        caller = %grant.caller, capability = %grant.capability,
                        revoked_by = revoker.as_deref().unwrap_or(""), request_id = %grant.request_id, revision
                    );
                    return Ok(());
                }
                Err(StoreError::Conflict) if attempt + 1 < WRITE_ATTEMPTS => {
                    // The grant expired and went, or its request changed: read again.
                    if self.store().get(&key).await?.is_none() {
                        return Err(grant_not_found(id));
                    }
                }
                Err(error) => return Err(error.into()),
            }
        }
        Err(RegistryError::new(
            Code::Conflict,
            format!("grant `{id}` kept changing while it was revoked; retry"),
        ))
    }
}
