//! The embedded store: etcd's lease, revision and watch semantics in memory,
//! for `agent-reach dev` and tests that are not about etcd itself.
//!
//! One `std::sync::Mutex` guards the state; no `.await` happens while it is
//! held. A background task expires leases (checked every 50 ms).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Condition, Event, KeyValue, LeaseId, LeaseTtl, Put, Revision, Store, StoreError, WatchBatch, WatchStream};

/// Events kept for watchers that resume from an older revision.
const HISTORY_LIMIT: usize = 100_000;
/// Batches buffered per watcher; a watcher that falls further behind is cut
/// off (its stream ends with an error) rather than buffering without bound.
const WATCHER_BUFFER: usize = 4_096;
const EXPIRY_TICK: Duration = Duration::from_millis(50);

struct Lease {
    ttl_s: i64,
    expires_at: Instant,
    keys: HashSet<String>,
}

struct Watcher {
    prefix: String,
    sender: mpsc::Sender<Result<WatchBatch, StoreError>>,
}

#[derive(Default)]
struct State {
    revision: Revision,
    /// History at or below this revision is gone.
    compacted: Revision,
    next_lease: LeaseId,
    kvs: BTreeMap<String, KeyValue>,
    leases: HashMap<LeaseId, Lease>,
    history: VecDeque<Event>,
    watchers: Vec<Watcher>,
}

impl State {
    fn delete_key(&mut self, key: &str, revision: Revision, events: &mut Vec<Event>) {
        if let Some(kv) = self.kvs.remove(key) {
            if let Some(lease) = self.leases.get_mut(&kv.lease) {
                lease.keys.remove(key);
            }
            events.push(Event::Delete {
                key: key.to_string(),
                mod_revision: revision,
            });
        }
    }

    /// Removes a lease and its keys as one revision.
    fn revoke(&mut self, lease: LeaseId) -> Option<Revision> {
        let lease = self.leases.remove(&lease)?;
        if lease.keys.is_empty() {
            return Some(self.revision);
        }
        let revision = self.revision + 1;
        let mut events = Vec::new();
        let mut keys: Vec<_> = lease.keys.into_iter().collect();
        keys.sort();
        for key in keys {
            self.delete_key(&key, revision, &mut events);
        }
        self.commit(revision, events);
        Some(revision)
    }

    /// Records events of `revision` and fans them out to watchers.
    fn commit(&mut self, revision: Revision, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        self.revision = revision;
        for event in &events {
            self.history.push_back(event.clone());
        }
        while self.history.len() > HISTORY_LIMIT {
            if let Some(old) = self.history.pop_front() {
                self.compacted = self.compacted.max(old.revision());
            }
        }
        self.watchers.retain(|watcher| {
            let matching: Vec<Event> = events
                .iter()
                .filter(|event| event_key(event).starts_with(&watcher.prefix))
                .cloned()
                .collect();
            if matching.is_empty() {
                return !watcher.sender.is_closed();
            }
            // A full buffer drops the watcher: its stream ends with an error.
            watcher
                .sender
                .try_send(Ok(WatchBatch {
                    revision,
                    events: matching,
                }))
                .is_ok()
        });
    }
}

fn event_key(event: &Event) -> &str {
    match event {
        Event::Put(kv) => &kv.key,
        Event::Delete { key, .. } => key,
    }
}

/// The in-memory store. Cloning shares it.
#[derive(Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// Creates the store and its lease-expiry task (needs a Tokio runtime).
    pub fn new() -> Self {
        let state = Arc::new(Mutex::new(State {
            next_lease: 0x1000,
            ..State::default()
        }));
        tokio::spawn(expire_leases(Arc::downgrade(&state)));
        Self { state }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

/// A panic while holding the lock cannot leave `State` half-updated in a way
/// later calls could not cope with (every mutation is completed before any
/// fallible step), so a poisoned lock is recovered rather than propagated.
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn expire_leases(state: Weak<Mutex<State>>) {
    let mut ticker = tokio::time::interval(EXPIRY_TICK);
    loop {
        ticker.tick().await;
        let Some(state) = state.upgrade() else { return };
        let mut state = lock(&state);
        let now = Instant::now();
        let mut expired: Vec<LeaseId> = state
            .leases
            .iter()
            .filter(|(_, lease)| lease.expires_at <= now)
            .map(|(id, _)| *id)
            .collect();
        expired.sort_unstable();
        for lease in expired {
            state.revoke(lease);
        }
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn grant_lease(&self, ttl_s: i64) -> Result<LeaseId, StoreError> {
        let mut state = self.lock();
        state.next_lease += 1;
        let id = state.next_lease;
        let ttl_s = ttl_s.max(1);
        state.leases.insert(
            id,
            Lease {
                ttl_s,
                expires_at: Instant::now() + Duration::from_secs(ttl_s.unsigned_abs()),
                keys: HashSet::new(),
            },
        );
        Ok(id)
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<Revision, StoreError> {
        self.lock().revoke(lease).ok_or(StoreError::LeaseNotFound(lease))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<i64, StoreError> {
        let mut state = self.lock();
        let now = Instant::now();
        match state.leases.get_mut(&lease) {
            Some(entry) if entry.expires_at > now => {
                entry.expires_at = now + Duration::from_secs(entry.ttl_s.unsigned_abs());
                Ok(entry.ttl_s)
            }
            _ => Err(StoreError::LeaseNotFound(lease)),
        }
    }

    async fn lease_ttl(&self, lease: LeaseId) -> Result<Option<LeaseTtl>, StoreError> {
        let state = self.lock();
        let now = Instant::now();
        Ok(state
            .leases
            .get(&lease)
            .filter(|entry| entry.expires_at > now)
            .map(|entry| LeaseTtl {
                granted_s: entry.ttl_s,
                // Whole seconds, rounded down, as etcd answers them.
                remaining_s: i64::try_from(entry.expires_at.duration_since(now).as_secs()).unwrap_or(i64::MAX),
            }))
    }

    async fn txn(
        &self,
        conditions: Vec<Condition>,
        puts: Vec<Put>,
        deletes: Vec<String>,
    ) -> Result<Revision, StoreError> {
        let mut state = self.lock();
        for condition in &conditions {
            let Condition::ModRevision { key, revision } = condition;
            let current = state.kvs.get(key).map_or(0, |kv| kv.mod_revision);
            if current != *revision {
                return Err(StoreError::Conflict);
            }
        }
        // Check every lease before changing anything: all or nothing.
        let now = Instant::now();
        for put in &puts {
            if put.lease != 0 && state.leases.get(&put.lease).is_none_or(|lease| lease.expires_at <= now) {
                return Err(StoreError::LeaseNotFound(put.lease));
            }
        }
        let revision = state.revision + 1;
        let mut events = Vec::new();
        for key in &deletes {
            state.delete_key(key, revision, &mut events);
        }
        for put in puts {
            let previous = state.kvs.get(&put.key).cloned();
            if let Some(previous) = &previous {
                if previous.lease != put.lease {
                    if let Some(old) = state.leases.get_mut(&previous.lease) {
                        old.keys.remove(&put.key);
                    }
                }
            }
            if let Some(lease) = state.leases.get_mut(&put.lease) {
                lease.keys.insert(put.key.clone());
            }
            let kv = KeyValue {
                key: put.key.clone(),
                value: put.value,
                create_revision: previous.map_or(revision, |previous| previous.create_revision),
                mod_revision: revision,
                lease: put.lease,
            };
            state.kvs.insert(put.key, kv.clone());
            events.push(Event::Put(kv));
        }
        if events.is_empty() {
            return Ok(state.revision);
        }
        state.commit(revision, events);
        Ok(revision)
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        Ok(self.lock().kvs.get(key).cloned())
    }

    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision), StoreError> {
        let state = self.lock();
        let kvs = state
            .kvs
            .range(prefix.to_string()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(_, kv)| kv.clone())
            .collect();
        Ok((kvs, state.revision))
    }

    async fn watch(&self, prefix: &str, start_revision: Revision) -> Result<WatchStream, StoreError> {
        let mut state = self.lock();
        let start_revision = if start_revision <= 0 {
            state.revision + 1
        } else {
            start_revision
        };
        if start_revision <= state.compacted {
            return Err(StoreError::Compacted {
                requested: start_revision,
                compact_revision: state.compacted,
            });
        }
        let (sender, receiver) = mpsc::channel(WATCHER_BUFFER);
        // Replay history under the same lock that registers the watcher: no gap, no duplicate.
        let mut replay: Vec<Event> = state
            .history
            .iter()
            .filter(|event| event.revision() >= start_revision && event_key(event).starts_with(prefix))
            .cloned()
            .collect();
        while !replay.is_empty() {
            let revision = replay[0].revision();
            let split = replay
                .iter()
                .position(|event| event.revision() != revision)
                .unwrap_or(replay.len());
            let rest = replay.split_off(split);
            if sender
                .try_send(Ok(WatchBatch {
                    revision,
                    events: replay,
                }))
                .is_err()
            {
                return Err(StoreError::Compacted {
                    requested: start_revision,
                    compact_revision: state.revision,
                });
            }
            replay = rest;
        }
        state.watchers.push(Watcher {
            prefix: prefix.to_string(),
            sender,
        });
        Ok(Box::pin(watch_stream(receiver)))
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let mut state = self.lock();
        let revision = revision.min(state.revision);
        while state.history.front().is_some_and(|event| event.revision() <= revision) {
            state.history.pop_front();
        }
        state.compacted = state.compacted.max(revision);
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Ends with an error when the store cut the watcher off, so a consumer
/// never mistakes "dropped" for "no more events".
fn watch_stream(
    receiver: mpsc::Receiver<Result<WatchBatch, StoreError>>,
) -> impl futures::Stream<Item = Result<WatchBatch, StoreError>> + Send {
    futures::stream::unfold(Some(receiver), |receiver| async move {
        let mut receiver = receiver?;
        match receiver.recv().await {
            Some(item) => Some((item, Some(receiver))),
            None => Some((
                Err(StoreError::Unavailable(
                    "watcher fell behind and was cut off".to_string(),
                )),
                None,
            )),
        }
    })
}
