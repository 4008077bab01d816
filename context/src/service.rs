//! Create / get / patch / close, transport-free: authentication, the access
//! rule, request validation, then one store call. HTTP and gRPC both call here.
//!
//! The access rule (DESIGN §4.3):
//! - every request needs a valid token (unless `--insecure-no-auth`, which trusts all);
//! - reads return only the fields the caller's `context:` `read` patterns match; an
//!   agent without an entry reads no fields (it still sees version and expiry, so it
//!   can make conditional writes); asking by name for a field it may not read is 403;
//! - writes (fields at create, `set` and `delete` in a patch) need every named field
//!   to match the caller's `write` patterns, else 403 and nothing is written;
//! - any authenticated agent may create a context; only its creator, or an agent with
//!   `write: ["*"]`, may close it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use agent_reach_access::{Acl, AclHandle, Authenticator, Caller};
use rand::RngCore;
use serde_json::Value;

use crate::error::{from_store, not_found, Code, ContextError};
use crate::metrics::{Metrics, Op};
use crate::model::{CloseAs, NewContext, Patch, Selection, Snapshot, StorePolicy, SweepReport, Tier, Written};
use crate::store::ContextStore;
use crate::validate::{self, CredentialFields, Limits};

/// Service settings; the defaults are the documented flag defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextConfig {
    pub policy: StorePolicy,
    /// Largest JSON text of one field value.
    pub max_field_bytes: usize,
    /// Largest accepted request body (HTTP) or message (gRPC).
    pub max_body_bytes: usize,
    pub sweep_interval: Duration,
    /// Field names refused as credentials (`CREDENTIAL_FIELD`).
    pub credential_fields: CredentialFields,
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            policy: StorePolicy::default(),
            max_field_bytes: 16 * 1024,
            max_body_bytes: 1024 * 1024,
            sweep_interval: Duration::from_secs(30),
            credential_fields: CredentialFields::default(),
        }
    }
}

impl ContextConfig {
    fn limits(&self) -> Limits {
        Limits {
            max_field_bytes: self.max_field_bytes,
            max_fields: self.policy.max_fields,
        }
    }
}

/// A create request, already decoded from its transport.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreateInput {
    pub context_id: Option<String>,
    pub tier: Option<String>,
    pub fields: BTreeMap<String, Value>,
}

/// A patch request, already decoded from its transport.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PatchInput {
    pub set: BTreeMap<String, Value>,
    pub delete: Vec<String>,
    pub if_version: Option<u64>,
}

/// The answer to a create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    pub context_id: String,
    pub tier: Tier,
    pub written: Written,
}

pub struct ContextService {
    store: Arc<dyn ContextStore>,
    acl: AclHandle,
    auth: Authenticator,
    config: ContextConfig,
    metrics: Metrics,
    /// Dropped with the service, which wakes its sweeper to stop at once (a
    /// tenant's part removed from the map stops sweeping then, not a sweep
    /// interval later). Nothing is ever sent.
    dropped: tokio::sync::watch::Sender<()>,
}

/// Whose reads and writes are filtered.
enum Access<'a> {
    /// Authentication is off: everything is allowed.
    Everything,
    Agent(&'a str),
}

impl<'a> Access<'a> {
    fn of(caller: &'a Caller) -> Self {
        match caller {
            Caller::Agent { name, .. } => Access::Agent(name),
            Caller::Unauthenticated => Access::Everything,
        }
    }

    fn may_read(&self, acl: &Acl, field: &str) -> bool {
        match self {
            Access::Everything => true,
            Access::Agent(name) => acl.may_read_field(name, field),
        }
    }

    fn may_write(&self, acl: &Acl, field: &str) -> bool {
        match self {
            Access::Everything => true,
            Access::Agent(name) => acl.may_write_field(name, field),
        }
    }
}

fn forbidden_write(field: String, name: &str) -> ContextError {
    ContextError::field(
        Code::Forbidden,
        field,
        format!("the `context:` whitelist of acl.yaml does not let you write `{name}`"),
    )
}

impl ContextService {
    pub fn new(
        store: Arc<dyn ContextStore>,
        acl: AclHandle,
        auth: Authenticator,
        config: ContextConfig,
        metrics: Metrics,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            acl,
            auth,
            config,
            metrics,
            dropped: tokio::sync::watch::channel(()).0,
        })
    }

    pub fn config(&self) -> &ContextConfig {
        &self.config
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn store(&self) -> &Arc<dyn ContextStore> {
        &self.store
    }

    pub fn authenticate(&self, header: Option<&http::HeaderValue>) -> Result<Caller, ContextError> {
        Ok(self.auth.verify_header(header)?)
    }

    /// Counts the outcome and the time of one operation.
    fn observe<T>(&self, op: Op, started: Instant, result: &Result<T, ContextError>) {
        let series = self.metrics.series(op);
        series.seconds.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(_) => series.ok.inc(),
            Err(error) => self
                .metrics
                .operations
                .with_label_values(&[op.as_str(), error.code.outcome()])
                .inc(),
        }
        let op = op.as_str();
        match result {
            Err(error) if error.code == Code::VersionConflict => self.metrics.version_conflicts.inc(),
            Err(error) if error.code == Code::ContextStoreUnavailable => {
                tracing::warn!(message = "Context store unavailable.", op, error = %error)
            }
            Err(error) if error.code == Code::Internal => {
                tracing::error!(message = "Context operation failed.", op, error = %error)
            }
            _ => {}
        }
    }

    #[tracing::instrument(name = "context.create", skip_all, fields(context_id, caller = caller.name()))]
    pub async fn create(&self, caller: &Caller, input: CreateInput) -> Result<Created, ContextError> {
        let started = Instant::now();
        let result = self.create_inner(caller, input).await;
        self.observe(Op::Create, started, &result);
        result
    }

    async fn create_inner(&self, caller: &Caller, input: CreateInput) -> Result<Created, ContextError> {
        let context_id = match input.context_id {
            Some(id) => {
                validate::context_id(&id)?;
                id
            }
            None => generate_id(),
        };
        tracing::Span::current().record("context_id", context_id.as_str());
        let tier = match input.tier.as_deref() {
            None => Tier::Default,
            Some(text) => Tier::parse(text).ok_or_else(|| {
                ContextError::field(
                    Code::InvalidTier,
                    "tier",
                    format!("unknown tier `{text}`; use `default` or `one_shot`"),
                )
            })?,
        };
        let fields = validate::fields(input.fields, &self.config.limits(), "fields")?;
        validate::refuse_credentials(&self.config.credential_fields, fields.keys(), "fields")?;
        let access = Access::of(caller);
        let acl = self.acl.current();
        if let Some(name) = fields.keys().find(|name| !access.may_write(&acl, name)) {
            return Err(forbidden_write(format!("fields.{name}"), name));
        }
        let context = NewContext {
            tier,
            owner: caller.name().unwrap_or_default().to_string(),
            fields,
        };
        let written = self
            .store
            .create(&context_id, &context)
            .await
            .map_err(|error| from_store(error, &context_id))?;
        Ok(Created {
            context_id,
            tier,
            written,
        })
    }

    /// The context with only the fields the caller may read; `fields` narrows it further.
    #[tracing::instrument(name = "context.get", skip_all, fields(context_id, caller = caller.name()))]
    pub async fn get(
        &self,
        caller: &Caller,
        context_id: &str,
        fields: Option<Vec<String>>,
    ) -> Result<Snapshot, ContextError> {
        tracing::Span::current().record("context_id", context_id);
        let started = Instant::now();
        let result = self.get_inner(caller, context_id, fields).await;
        self.observe(Op::Get, started, &result);
        result
    }

    async fn get_inner(
        &self,
        caller: &Caller,
        context_id: &str,
        fields: Option<Vec<String>>,
    ) -> Result<Snapshot, ContextError> {
        validate::context_id(context_id)?;
        let access = Access::of(caller);
        let acl = self.acl.current();
        let selection = match fields {
            Some(names) => {
                if names.len() > self.config.policy.max_fields {
                    return Err(ContextError::field(
                        Code::TooManyFields,
                        "fields",
                        format!("at most {} field names per read", self.config.policy.max_fields),
                    ));
                }
                let mut unique = BTreeSet::new();
                for (index, name) in names.iter().enumerate() {
                    validate::field_name(name, || format!("fields[{index}]"))?;
                    if !access.may_read(&acl, name) {
                        return Err(ContextError::field(
                            Code::Forbidden,
                            format!("fields[{index}]"),
                            format!("the `context:` whitelist of acl.yaml does not let you read `{name}`"),
                        ));
                    }
                    unique.insert(name.clone());
                }
                Selection::Only(unique.into_iter().collect())
            }
            None => match access {
                // Secure default: no whitelist entry, no fields (metadata only).
                Access::Agent(name) if !acl.has_context_entry(name) => Selection::Only(Vec::new()),
                _ => Selection::All,
            },
        };
        let mut snapshot = self
            .store
            .get(context_id, &selection)
            .await
            .map_err(|error| from_store(error, context_id))?
            .ok_or_else(|| not_found(context_id))?;
        snapshot.fields.retain(|name, _| access.may_read(&acl, name));
        Ok(snapshot)
    }

    #[tracing::instrument(name = "context.patch", skip_all, fields(context_id, caller = caller.name()))]
    pub async fn patch(&self, caller: &Caller, context_id: &str, input: PatchInput) -> Result<Written, ContextError> {
        tracing::Span::current().record("context_id", context_id);
        let started = Instant::now();
        let result = self.patch_inner(caller, context_id, input).await;
        self.observe(Op::Patch, started, &result);
        result
    }

    async fn patch_inner(&self, caller: &Caller, context_id: &str, input: PatchInput) -> Result<Written, ContextError> {
        validate::context_id(context_id)?;
        if input.set.is_empty() && input.delete.is_empty() {
            return Err(ContextError::new(
                Code::EmptyPatch,
                "a patch needs `set` or `delete`; nothing to change",
            ));
        }
        let limits = self.config.limits();
        let set = validate::fields(input.set, &limits, "set")?;
        validate::refuse_credentials(&self.config.credential_fields, set.keys(), "set")?;
        let delete = validate::deletions(input.delete, &set, &limits)?;
        let access = Access::of(caller);
        let acl = self.acl.current();
        if let Some(name) = set.keys().find(|name| !access.may_write(&acl, name)) {
            return Err(forbidden_write(format!("set.{name}"), name));
        }
        if let Some((index, name)) = delete
            .iter()
            .enumerate()
            .find(|(_, name)| !access.may_write(&acl, name))
        {
            return Err(forbidden_write(format!("delete[{index}]"), name));
        }
        let patch = Patch {
            set,
            delete,
            if_version: input.if_version,
        };
        self.store
            .patch(context_id, &patch)
            .await
            .map_err(|error| from_store(error, context_id))
    }

    #[tracing::instrument(name = "context.close", skip_all, fields(context_id, caller = caller.name()))]
    pub async fn close(&self, caller: &Caller, context_id: &str) -> Result<(), ContextError> {
        tracing::Span::current().record("context_id", context_id);
        let started = Instant::now();
        let result = async {
            validate::context_id(context_id)?;
            let who = match caller {
                Caller::Unauthenticated => CloseAs::Anyone,
                Caller::Agent { name, .. } if self.acl.current().may_write_field(name, "*") => CloseAs::Anyone,
                Caller::Agent { name, .. } => CloseAs::Owner(name.to_string()),
            };
            self.store
                .close(context_id, &who)
                .await
                .map_err(|error| from_store(error, context_id))
        }
        .await;
        self.observe(Op::Close, started, &result);
        result
    }

    /// One sweep: removes idle contexts and refreshes the live-contexts gauge.
    #[tracing::instrument(name = "context.sweep", skip_all)]
    pub async fn sweep_once(&self) -> Result<SweepReport, ContextError> {
        let result = async {
            let report = self.store.sweep().await?;
            let live = self.store.live_contexts().await?;
            Ok((report, live))
        }
        .await
        .map_err(|error| from_store(error, ""));
        match result {
            Ok((report, live)) => {
                self.metrics.sweeps.with_label_values(&["ok"]).inc();
                self.metrics
                    .sweeper_removals
                    .with_label_values(&["idle"])
                    .inc_by(report.idle);
                self.metrics
                    .sweeper_removals
                    .with_label_values(&["expired"])
                    .inc_by(report.expired);
                self.metrics.live_contexts.set(i64::try_from(live).unwrap_or(i64::MAX));
                if report.idle > 0 {
                    tracing::info!(message = "Swept idle contexts.", idle = report.idle, live);
                }
                Ok(report)
            }
            Err(error) => {
                self.metrics.sweeps.with_label_values(&["error"]).inc();
                tracing::warn!(message = "Sweep failed; retrying next interval.", error = %error);
                Err(error)
            }
        }
    }

    /// Runs [`Self::sweep_once`] every `sweep_interval` until the service is
    /// dropped (the task then ends at once).
    /// Every replica may run it: removals are atomic and happen once (see the stores).
    pub fn spawn_sweeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let service: Weak<Self> = Arc::downgrade(self);
        let interval = self.config.sweep_interval;
        let mut dropped = self.dropped.subscribe();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    // Never sent: this resolves when the service is dropped.
                    _ = dropped.changed() => return,
                }
                let Some(service) = service.upgrade() else { return };
                // Failures are counted and logged inside; the next tick retries.
                let _ = service.sweep_once().await;
            }
        })
    }
}

/// `ctx_` and 128 random bits in hex: unguessable, so ids are not enumerable.
fn generate_id() -> String {
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("ctx_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_valid_and_distinct() {
        let (a, b) = (generate_id(), generate_id());
        assert_ne!(a, b);
        assert!(validate::context_id(&a).is_ok());
        assert_eq!(a.len(), 36);
    }

    #[tokio::test]
    async fn the_sweeper_stops_when_its_service_is_dropped() {
        let config = ContextConfig {
            sweep_interval: Duration::from_secs(3600),
            ..ContextConfig::default()
        };
        let service = ContextService::new(
            Arc::new(crate::store::MemoryStore::new(config.policy)),
            AclHandle::new(Acl::parse("version: 1\n").unwrap()),
            Authenticator::hs256(b"0123456789abcdef0123456789abcdef"),
            config,
            Metrics::new().unwrap(),
        );
        let sweeper = service.spawn_sweeper();
        // The first tick is at once: one sweep, then an hour's wait.
        let swept = || service.metrics().sweeps.with_label_values(&["ok"]).get();
        let deadline = Instant::now() + Duration::from_secs(10);
        while swept() == 0 && Instant::now() < deadline {
            tokio::task::yield_now().await;
        }
        assert_eq!(swept(), 1);
        assert!(!sweeper.is_finished());
        drop(service);
        tokio::time::timeout(Duration::from_secs(10), sweeper)
            .await
            .expect("the sweeper still runs an interval after its service was dropped")
            .unwrap();
    }

    #[test]
    fn the_example_policy_follows_the_documented_rule() {
        let acl = Acl::parse(include_str!("../../acl.yaml")).unwrap();
        assert!(acl.may_read_field("reply_writer", "order_status"));
        assert!(
            !acl.may_write_field("reply_writer", "order_status"),
            "readers do not write"
        );
        assert!(acl.may_write_field("order_query", "order_status"));
        assert!(!acl.has_context_entry("payment_check"), "no entry: reads nothing");
    }
}
