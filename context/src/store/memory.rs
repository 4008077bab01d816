//! The embedded store for development (`agent-reach dev`, `--embedded-store`):
//! the Redis store's semantics in one process, behind one lock. Contexts are
//! lost on exit and not shared between replicas.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{ContextStore, StoreError};
use crate::model::{
    field_cost, CloseAs, Fields, NewContext, Patch, Selection, Snapshot, StorePolicy, SweepReport, Tier, Written,
};

#[derive(Debug)]
struct Entry {
    version: u64,
    tier: Tier,
    owner: String,
    fields: Fields,
    bytes: usize,
    expires_at_ms: i64,
    /// When the sweeper may remove it: `min(last access + idle timeout, expiry)`.
    deadline_ms: i64,
}

#[derive(Debug, Default)]
pub struct MemoryStore {
    policy: StorePolicy,
    contexts: Mutex<HashMap<String, Entry>>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX).max(1)
}

impl MemoryStore {
    pub fn new(policy: StorePolicy) -> Self {
        Self {
            policy,
            contexts: Mutex::new(HashMap::new()),
        }
    }

    /// The map, with contexts past their TTL dropped from view first (Redis'
    /// expiry makes them vanish the same way).
    fn locked(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A poisoned lock only means another request panicked mid-operation;
        // every operation validates before mutating, so the map is consistent.
        self.contexts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn live<'a>(map: &'a mut HashMap<String, Entry>, id: &str, now: i64) -> Option<&'a mut Entry> {
        if map.get(id).is_some_and(|entry| entry.expires_at_ms <= now) {
            map.remove(id);
        }
        map.get_mut(id)
    }
}

#[async_trait::async_trait]
impl ContextStore for MemoryStore {
    async fn create(&self, id: &str, context: &NewContext) -> Result<Written, StoreError> {
        let now = now_ms();
        let mut map = self.locked();
        if Self::live(&mut map, id, now).is_some() {
            return Err(StoreError::Exists);
        }
        if context.fields.len() > self.policy.max_fields {
            return Err(StoreError::TooManyFields {
                limit: self.policy.max_fields,
                would_have: context.fields.len(),
            });
        }
        let bytes = context.fields.iter().map(|(name, value)| field_cost(name, value)).sum();
        if bytes > self.policy.max_context_bytes {
            return Err(StoreError::TooLarge {
                limit: self.policy.max_context_bytes,
                would_have: bytes,
            });
        }
        let ttl = millis(self.policy.ttl(context.tier));
        let entry = Entry {
            version: 1,
            tier: context.tier,
            owner: context.owner.clone(),
            fields: context.fields.clone(),
            bytes,
            expires_at_ms: now + ttl,
            deadline_ms: now + millis(self.policy.idle_deadline_after_write(context.tier)),
        };
        map.insert(id.to_string(), entry);
        Ok(Written {
            version: 1,
            expires_at_ms: now + ttl,
        })
    }

    async fn get(&self, id: &str, selection: &Selection) -> Result<Option<Snapshot>, StoreError> {
        let now = now_ms();
        let mut map = self.locked();
        let Some(entry) = Self::live(&mut map, id, now) else {
            return Ok(None);
        };
        entry.deadline_ms = now + (entry.expires_at_ms - now).min(millis(self.policy.idle_timeout));
        let fields = match selection {
            Selection::All => entry.fields.clone(),
            Selection::Only(names) => names
                .iter()
                .filter_map(|name| entry.fields.get(name).map(|value| (name.clone(), value.clone())))
                .collect(),
        };
        Ok(Some(Snapshot {
            version: entry.version,
            tier: entry.tier,
            owner: entry.owner.clone(),
            expires_at_ms: entry.expires_at_ms,
            fields,
        }))
    }

    async fn patch(&self, id: &str, patch: &Patch) -> Result<Written, StoreError> {
        let now = now_ms();
        let mut map = self.locked();
        let Some(entry) = Self::live(&mut map, id, now) else {
            return Err(StoreError::NotFound);
        };
        if patch.if_version.is_some_and(|expected| expected != entry.version) {
            return Err(StoreError::VersionConflict { current: entry.version });
        }
        let mut count = entry.fields.len();
        let mut bytes = entry.bytes;
        for (name, value) in &patch.set {
            match entry.fields.get(name) {
                Some(old) => bytes = bytes + value.len() - old.len(),
                None => {
                    count += 1;
                    bytes += field_cost(name, value);
                }
            }
        }
        for name in &patch.delete {
            if let Some(old) = entry.fields.get(name) {
                count -= 1;
                bytes -= field_cost(name, old);
            }
        }
        if count > self.policy.max_fields {
            return Err(StoreError::TooManyFields {
                limit: self.policy.max_fields,
                would_have: count,
            });
        }
        if bytes > self.policy.max_context_bytes {
            return Err(StoreError::TooLarge {
                limit: self.policy.max_context_bytes,
                would_have: bytes,
            });
        }
        for (name, value) in &patch.set {
            entry.fields.insert(name.clone(), value.clone());
        }
        for name in &patch.delete {
            entry.fields.remove(name);
        }
        let ttl = millis(self.policy.ttl(entry.tier));
        entry.version += 1;
        entry.bytes = bytes;
        // Within the refresh granularity of the last refresh the expiry stays,
        // as in the Redis store (`StorePolicy::refresh_granularity`).
        let granularity = millis(self.policy.refresh_granularity(entry.tier));
        if (now + ttl - entry.expires_at_ms).abs() >= granularity {
            entry.expires_at_ms = now + ttl;
            entry.deadline_ms = now + millis(self.policy.idle_deadline_after_write(entry.tier));
        }
        Ok(Written {
            version: entry.version,
            expires_at_ms: entry.expires_at_ms,
        })
    }

    async fn close(&self, id: &str, who: &CloseAs) -> Result<(), StoreError> {
        let now = now_ms();
        let mut map = self.locked();
        let Some(entry) = Self::live(&mut map, id, now) else {
            return Err(StoreError::NotFound);
        };
        if let CloseAs::Owner(name) = who {
            if &entry.owner != name {
                return Err(StoreError::NotOwner);
            }
        }
        map.remove(id);
        Ok(())
    }

    async fn sweep(&self) -> Result<SweepReport, StoreError> {
        let now = now_ms();
        let mut report = SweepReport::default();
        self.locked().retain(|_, entry| {
            if entry.deadline_ms > now {
                return true;
            }
            if entry.expires_at_ms > now {
                report.idle += 1;
            } else {
                report.expired += 1;
            }
            false
        });
        Ok(report)
    }

    async fn live_contexts(&self) -> Result<u64, StoreError> {
        let now = now_ms();
        Ok(self.locked().values().filter(|entry| entry.deadline_ms > now).count() as u64)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
