//! Access grants (DESIGN §2.11, §9): approved access requests, applied on
//! top of `acl.yaml` (a call is allowed when the file allows it or a live
//! grant does). The registry's `Watch` brings them with the snapshot and as
//! `grant_set` / `grant_removed` deltas; the watch task builds an immutable
//! index and swaps it whole ([`GrantsHandle`]), so admission looks a grant
//! up without a lock or a store, and only when the file said no. An expiry
//! is checked against this router's clock on every lookup: an expired
//! grant stops at once, whenever the registry gets round to removing it.

use std::sync::Arc;

use agent_reach_proto::registry as pb;
use ahash::AHashMap;
use arc_swap::ArcSwap;

/// One grant as the router holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub id: String,
    pub caller: String,
    pub capability: String,
    /// Epoch milliseconds; `None`: until revoked.
    pub expires_at_ms: Option<u64>,
    /// The approver (empty without authentication).
    pub granted_by: String,
    pub granted_at_ms: u64,
    pub request_id: String,
}

impl Grant {
    fn from_pb(record: &pb::Grant) -> Self {
        Self {
            id: record.id.clone(),
            caller: record.caller.clone(),
            capability: record.capability.clone(),
            expires_at_ms: Some(record.expires_at_ms).filter(|at| *at > 0),
            granted_by: record.granted_by.clone(),
            granted_at_ms: record.granted_at_ms,
            request_id: record.request_id.clone(),
        }
    }

    /// Live at `now_ms` (epoch): not yet past its expiry.
    pub fn is_live(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|expires| now_ms < expires)
    }
}

/// The grants of one tenant, indexed caller → capability → the latest
/// expiry among that pair's grants (`u64::MAX`: none). Immutable.
#[derive(Debug, Default)]
pub struct Grants {
    by_caller: AHashMap<Box<str>, AHashMap<Box<str>, u64>>,
    /// Every grant, by id (operators' view).
    all: Vec<Grant>,
}

impl Grants {
    pub fn empty() -> Self {
        Self::default()
    }

    pub fn build<'a>(records: impl IntoIterator<Item = &'a pb::Grant>) -> Self {
        let mut grants = Self::default();
        for record in records {
            let grant = Grant::from_pb(record);
            let until = grant.expires_at_ms.unwrap_or(u64::MAX);
            let latest = grants
                .by_caller
                .entry(grant.caller.as_str().into())
                .or_default()
                .entry(grant.capability.as_str().into())
                .or_insert(0);
            *latest = (*latest).max(until);
            grants.all.push(grant);
        }
        grants.all.sort_by(|a, b| a.id.cmp(&b.id));
        grants
    }

    /// Does a grant let `caller` call `capability` at `now_ms` (epoch)?
    pub fn allows(&self, caller: &str, capability: &str, now_ms: u64) -> bool {
        self.by_caller
            .get(caller)
            .and_then(|capabilities| capabilities.get(capability))
            .is_some_and(|until| now_ms < *until)
    }

    /// Every grant held, expired ones included until the registry removes them, by id.
    pub fn all(&self) -> &[Grant] {
        &self.all
    }
}

/// The live grants, swapped whole by the watch task; admission reads them lock-free.
#[derive(Debug, Default)]
pub struct GrantsHandle {
    current: ArcSwap<Grants>,
}

impl GrantsHandle {
    pub fn load(&self) -> arc_swap::Guard<Arc<Grants>> {
        self.current.load()
    }

    pub fn store(&self, grants: Grants) {
        self.current.store(Arc::new(grants));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, caller: &str, capability: &str, expires_at_ms: u64) -> pb::Grant {
        pb::Grant {
            id: id.to_string(),
            caller: caller.to_string(),
            capability: capability.to_string(),
            expires_at_ms,
            ..Default::default()
        }
    }

    /// A grant allows its caller and capability only, until its expiry by
    /// the clock given; of two grants for one pair the later expiry counts.
    #[test]
    fn grants_allow_their_pair_until_they_expire() {
        let grants = Grants::build(&[
            record("gr-2", "intent_parser", "order.query", 0),
            record("gr-1", "billing", "order.query", 1_000),
            record("gr-3", "billing", "order.query", 2_000),
            record("gr-4", "audit", "order.detail", 500),
        ]);
        assert!(grants.allows("intent_parser", "order.query", u64::MAX - 1), "no expiry");
        assert!(!grants.allows("intent_parser", "order.detail", 0), "another capability");
        assert!(!grants.allows("stranger", "order.query", 0), "another caller");
        assert!(
            grants.allows("billing", "order.query", 1_999),
            "the later expiry counts"
        );
        assert!(
            !grants.allows("billing", "order.query", 2_000),
            "expired at its instant"
        );
        assert!(grants.allows("audit", "order.detail", 499) && !grants.allows("audit", "order.detail", 500));
        let ids: Vec<&str> = grants.all().iter().map(|grant| grant.id.as_str()).collect();
        assert_eq!(ids, ["gr-1", "gr-2", "gr-3", "gr-4"]);
        assert!(!grants.all()[3].is_live(500) && grants.all()[1].is_live(u64::MAX - 1));
        assert!(!Grants::empty().allows("intent_parser", "order.query", 0));
    }

    /// The builder follows grants from the snapshot and its deltas without
    /// rebuilding routes, and hands the index over once per change.
    #[test]
    fn the_watch_brings_grants_without_a_rebuild() {
        use pb::watch_event::Kind;
        let event = |revision, kind| pb::WatchEvent {
            revision,
            kind: Some(kind),
        };
        let mut builder = crate::snapshot::SnapshotBuilder::new(crate::metrics::Metrics::new().unwrap());
        assert!(builder.take_grants().is_none(), "nothing yet");
        let snapshot = pb::Snapshot {
            grants: vec![record("gr-1", "billing", "order.query", 0)],
            ..Default::default()
        };
        assert!(builder.apply(event(1, Kind::Snapshot(snapshot))));
        let grants = builder.take_grants().expect("the snapshot's grants");
        assert!(grants.allows("billing", "order.query", 0));
        assert!(builder.take_grants().is_none(), "once per change");
        let routes_changed = builder.apply(event(2, Kind::GrantSet(record("gr-2", "audit", "order.query", 9))));
        assert!(!routes_changed, "a grant changes no route");
        assert!(builder.take_grants().expect("set").allows("audit", "order.query", 8));
        assert!(!builder.apply(event(3, Kind::GrantRemoved(pb::GrantRemoved { id: "gr-1".into() }))));
        let grants = builder.take_grants().expect("removed");
        assert!(!grants.allows("billing", "order.query", 0) && grants.allows("audit", "order.query", 8));
        builder.apply(event(
            4,
            Kind::GrantRemoved(pb::GrantRemoved {
                id: "gr-unknown".into(),
            }),
        ));
        assert!(builder.take_grants().is_none(), "removing nothing changes nothing");
        assert_eq!(builder.revision(), 4);
    }
}
