//! The registry's in-memory view of every instance, kept current by a watch on
//! the store. Reads (get, list, resolve) are served from here and never touch
//! etcd; writes go to the store and then wait until the catalog has seen them,
//! so a caller reads its own registration from the same registry at once.
//!
//! Each registry process has its own catalog rebuilt from the store, which is
//! what keeps registries stateless.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;

use crate::metrics::Metrics;
use crate::model::{Capability, Grant, Instance, Keys, Policy, Split, Status};
use crate::store::{Event, KeyValue, Revision, Store, StoreError};

#[derive(Debug, Clone)]
pub struct Entry {
    pub instance: Arc<Instance>,
    pub mod_revision: Revision,
}

#[derive(Default)]
struct State {
    revision: Revision,
    instances: HashMap<String, Entry>,
    /// capability name → agent ids offering it (any version).
    by_capability: HashMap<String, BTreeSet<String>>,
    /// capability name → its traffic split (DESIGN §2.9), ordered for listings.
    splits: BTreeMap<String, Arc<Split>>,
    /// grant id → its access grant (DESIGN §2.11), expired ones included until removed.
    grants: BTreeMap<String, Arc<Grant>>,
    /// capability name → its default selection policy (DESIGN §9).
    policies: BTreeMap<String, Arc<Policy>>,
}

impl State {
    fn upsert(&mut self, entry: Entry, metrics: &Metrics) -> Option<Entry> {
        let agent_id = entry.instance.agent_id.clone();
        let previous = self.remove(&agent_id, metrics);
        for capability in &entry.instance.capabilities {
            self.by_capability
                .entry(capability.name.clone())
                .or_default()
                .insert(agent_id.clone());
        }
        metrics
            .instances
            .with_label_values(&[entry.instance.status.as_str()])
            .inc();
        self.instances.insert(agent_id, entry);
        previous
    }

    fn remove(&mut self, agent_id: &str, metrics: &Metrics) -> Option<Entry> {
        let previous = self.instances.remove(agent_id)?;
        for capability in &previous.instance.capabilities {
            if let Some(ids) = self.by_capability.get_mut(&capability.name) {
                ids.remove(agent_id);
                if ids.is_empty() {
                    self.by_capability.remove(&capability.name);
                }
            }
        }
        metrics
            .instances
            .with_label_values(&[previous.instance.status.as_str()])
            .dec();
        Some(previous)
    }
}

/// One capability across all instances (for `GET /v1/capabilities`).
#[derive(Debug, Clone, PartialEq)]
pub struct CapabilitySummary {
    pub name: String,
    /// Highest first.
    pub versions: Vec<semver::Version>,
    pub instances: usize,
    pub routable_instances: usize,
}

/// What a `Watch` snapshot carries, at one revision.
pub struct WatchSnapshot {
    pub instances: Vec<Arc<Instance>>,
    pub splits: Vec<Arc<Split>>,
    pub grants: Vec<Arc<Grant>>,
    pub policies: Vec<Arc<Policy>>,
    pub revision: Revision,
}

/// Which instances serve a capability at the chosen version.
#[derive(Debug, Clone)]
pub struct Resolution {
    /// Every registered version, highest first.
    pub available: Vec<semver::Version>,
    pub chosen: Option<semver::Version>,
    /// Routable instances at the chosen version, with that version's descriptor.
    pub instances: Vec<(Arc<Instance>, Capability)>,
}

pub struct Catalog {
    keys: Keys,
    state: RwLock<State>,
    revision: tokio::sync::watch::Sender<Revision>,
    synced: AtomicBool,
    /// Woken when `synced` becomes true ([`Catalog::synced_within`]).
    synced_news: tokio::sync::Notify,
    metrics: Metrics,
    /// Removals this process asked for; any other removal is a lease expiry
    /// (or another registry's deregistration) and is counted as an expiry.
    expected_removals: Mutex<HashSet<String>>,
    /// `true` once [`Catalog::stop`] was called; dropping the sender (the
    /// catalog) also ends everything waiting on it.
    stopped: tokio::sync::watch::Sender<bool>,
}

/// Decodes a stored instance; undecodable values are skipped with a warning.
pub fn decode(kv: &KeyValue) -> Option<Instance> {
    match serde_json::from_slice::<Instance>(&kv.value) {
        Ok(instance) => Some(instance),
        Err(error) => {
            tracing::warn!(message = "Skipping undecodable registry record.", key = %kv.key, %error);
            None
        }
    }
}

/// Decodes a stored split; undecodable values are skipped with a warning.
pub fn decode_split(kv: &KeyValue) -> Option<Split> {
    match serde_json::from_slice::<Split>(&kv.value) {
        Ok(split) => Some(split),
        Err(error) => {
            tracing::warn!(message = "Skipping undecodable traffic split.", key = %kv.key, %error);
            None
        }
    }
}

/// Decodes a stored grant; undecodable values are skipped with a warning.
pub fn decode_grant(kv: &KeyValue) -> Option<Grant> {
    match serde_json::from_slice::<Grant>(&kv.value) {
        Ok(grant) => Some(grant),
        Err(error) => {
            tracing::warn!(message = "Skipping undecodable access grant.", key = %kv.key, %error);
            None
        }
    }
}

/// Decodes a stored policy; undecodable values are skipped with a warning.
pub fn decode_policy(kv: &KeyValue) -> Option<Policy> {
    match serde_json::from_slice::<Policy>(&kv.value) {
        Ok(policy) => Some(policy),
        Err(error) => {
            tracing::warn!(message = "Skipping undecodable capability policy.", key = %kv.key, %error);
            None
        }
    }
}

impl Catalog {
    pub fn new(keys: Keys, metrics: Metrics) -> Arc<Self> {
        Arc::new(Self {
            keys,
            state: RwLock::new(State::default()),
            revision: tokio::sync::watch::channel(0).0,
            synced: AtomicBool::new(false),
            synced_news: tokio::sync::Notify::new(),
            metrics,
            expected_removals: Mutex::new(HashSet::new()),
            stopped: tokio::sync::watch::channel(false).0,
        })
    }

    /// Stops the sync with the store and ends every stream waiting on
    /// [`Catalog::stopped`] (its tenant is no longer served, DESIGN §8).
    pub fn stop(&self) {
        self.stopped.send_replace(true);
    }

    /// Resolves once the catalog is stopped.
    pub async fn stopped(&self) {
        let mut stopped = self.stopped.subscribe();
        // An error means the sender is gone: the catalog is dropped, so stopped too.
        let _ = stopped.wait_for(|stopped| *stopped).await;
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // Mutations complete before any fallible step, so a poisoned lock holds consistent data.
        self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// True once the first full listing was loaded and the watch is live.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Waits until the catalog is in sync, at most `bound`; whether it is.
    pub async fn synced_within(&self, bound: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let news = self.synced_news.notified();
            if self.is_synced() {
                return true;
            }
            if tokio::time::timeout_at(deadline, news).await.is_err() {
                return self.is_synced();
            }
        }
    }

    pub fn revision(&self) -> Revision {
        self.read().revision
    }

    pub fn get(&self, agent_id: &str) -> Option<Entry> {
        self.read().instances.get(agent_id).cloned()
    }

    /// Every instance, ordered by agent id, and the revision they reflect.
    pub fn list(&self) -> (Vec<Arc<Instance>>, Revision) {
        let state = self.read();
        let mut instances: Vec<_> = state.instances.values().map(|entry| entry.instance.clone()).collect();
        instances.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
        (instances, state.revision)
    }

    /// At most `limit` instances by agent id, after `after` (none: from the
    /// first), and whether more follow; one page of a listing. Instances
    /// registered or removed between pages are seen or not, never twice.
    pub fn page(&self, after: Option<&str>, limit: usize) -> (Vec<Arc<Instance>>, bool, Revision) {
        let (instances, revision) = self.list();
        let start = after.map_or(0, |after| {
            instances.partition_point(|instance| instance.agent_id.as_str() <= after)
        });
        let end = start.saturating_add(limit).min(instances.len());
        (instances[start..end].to_vec(), end < instances.len(), revision)
    }

    /// Every capability with its versions, instance count and routable count.
    pub fn capabilities(&self) -> (Vec<CapabilitySummary>, Revision) {
        let state = self.read();
        let mut out: Vec<_> = state
            .by_capability
            .iter()
            .map(|(name, ids)| {
                let mut versions = BTreeSet::new();
                let mut routable = 0;
                for id in ids {
                    if let Some(entry) = state.instances.get(id) {
                        if entry.instance.status.is_routable() {
                            routable += 1;
                        }
                        for capability in entry.instance.capabilities.iter().filter(|c| &c.name == name) {
                            versions.insert(capability.version.clone());
                        }
                    }
                }
                CapabilitySummary {
                    name: name.clone(),
                    versions: versions.into_iter().rev().collect(),
                    instances: ids.len(),
                    routable_instances: routable,
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        (out, state.revision)
    }

    /// The best version matching `requirement` (the highest when `None`)
    /// among routable instances, and those instances.
    pub fn resolve(&self, name: &str, requirement: Option<&semver::VersionReq>) -> Option<Resolution> {
        let state = self.read();
        let ids = state.by_capability.get(name)?;
        let offers: Vec<(&Arc<Instance>, &Capability)> = ids
            .iter()
            .filter_map(|id| state.instances.get(id))
            .flat_map(|entry| {
                entry
                    .instance
                    .capabilities
                    .iter()
                    .filter(|capability| capability.name == name)
                    .map(move |capability| (&entry.instance, capability))
            })
            .collect();
        let available: BTreeSet<&semver::Version> = offers.iter().map(|(_, capability)| &capability.version).collect();
        let chosen = offers
            .iter()
            .filter(|(instance, capability)| {
                instance.status.is_routable() && requirement.is_none_or(|req| req.matches(&capability.version))
            })
            .map(|(_, capability)| &capability.version)
            .max()
            .cloned();
        let instances = match &chosen {
            Some(version) => offers
                .iter()
                .filter(|(instance, capability)| instance.status.is_routable() && &capability.version == version)
                .map(|(instance, capability)| (Arc::clone(instance), (*capability).clone()))
                .collect(),
            None => Vec::new(),
        };
        Some(Resolution {
            available: available.into_iter().rev().cloned().collect(),
            chosen,
            instances,
        })
    }

    /// Marks a removal as requested here, so it is not counted as an expiry.
    pub fn expect_removal(&self, agent_id: &str) {
        self.expected_removals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(agent_id.to_string());
    }

    /// Waits (bounded) until the catalog reflects `revision`.
    pub async fn wait_for(&self, revision: Revision, timeout: Duration) -> bool {
        let mut receiver = self.revision.subscribe();
        tokio::time::timeout(timeout, receiver.wait_for(|seen| *seen >= revision))
            .await
            .is_ok_and(|seen| seen.is_ok())
    }

    /// Does any registered instance (in any status) offer `capability`?
    pub fn offers(&self, capability: &str) -> bool {
        self.read().by_capability.contains_key(capability)
    }

    /// A capability's traffic split, if an operator set one.
    pub fn split(&self, capability: &str) -> Option<Arc<Split>> {
        self.read().splits.get(capability).cloned()
    }

    /// Every grant the store holds, by id (expired ones until their lease removes them).
    pub fn grants(&self) -> Vec<Arc<Grant>> {
        self.read().grants.values().cloned().collect()
    }

    /// A grant by id.
    pub fn grant(&self, id: &str) -> Option<Arc<Grant>> {
        self.read().grants.get(id).cloned()
    }

    /// A capability's default selection policy, if an operator set one.
    pub fn policy(&self, capability: &str) -> Option<Arc<Policy>> {
        self.read().policies.get(capability).cloned()
    }

    /// Every instance (ordered by agent id), split, grant and policy, at one
    /// revision: what a `Watch` snapshot carries.
    pub fn snapshot(&self) -> WatchSnapshot {
        let state = self.read();
        let mut instances: Vec<_> = state.instances.values().map(|entry| entry.instance.clone()).collect();
        instances.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
        WatchSnapshot {
            instances,
            splits: state.splits.values().cloned().collect(),
            grants: state.grants.values().cloned().collect(),
            policies: state.policies.values().cloned().collect(),
            revision: state.revision,
        }
    }

    /// Applies one stored value: an instance, a split or a policy, by its
    /// key; keys of anything else under the tenant are not the catalog's.
    fn put(&self, state: &mut State, kv: &KeyValue) {
        if self.keys.agent_id_of(&kv.key).is_some() {
            if let Some(instance) = decode(kv) {
                state.upsert(
                    Entry {
                        instance: Arc::new(instance),
                        mod_revision: kv.mod_revision,
                    },
                    &self.metrics,
                );
            }
        } else if let Some(capability) = self.keys.capability_of_split(&kv.key) {
            if let Some(split) = decode_split(kv) {
                state.splits.insert(capability.to_string(), Arc::new(split));
            }
        } else if let Some(id) = self.keys.grant_id_of(&kv.key) {
            if let Some(grant) = decode_grant(kv) {
                state.grants.insert(id.to_string(), Arc::new(grant));
            }
        } else if let Some(capability) = self.keys.capability_of_policy(&kv.key) {
            if let Some(policy) = decode_policy(kv) {
                state.policies.insert(capability.to_string(), Arc::new(policy));
            }
        }
    }

    fn load(&self, kvs: Vec<KeyValue>, revision: Revision) {
        let mut state = self.write();
        let stale: Vec<String> = state.instances.keys().cloned().collect();
        for agent_id in stale {
            state.remove(&agent_id, &self.metrics);
        }
        state.splits.clear();
        state.grants.clear();
        state.policies.clear();
        for kv in kvs {
            self.put(&mut state, &kv);
        }
        state.revision = revision;
        drop(state);
        self.metrics.catalog_revision.set(revision);
        self.revision.send_replace(revision);
    }

    fn apply(&self, events: Vec<Event>, revision: Revision) {
        let mut state = self.write();
        for event in events {
            match event {
                Event::Put(kv) => self.put(&mut state, &kv),
                Event::Delete { key, .. } => {
                    if let Some(capability) = self.keys.capability_of_split(&key) {
                        state.splits.remove(capability);
                        continue;
                    }
                    if let Some(id) = self.keys.grant_id_of(&key) {
                        state.grants.remove(id);
                        continue;
                    }
                    if let Some(capability) = self.keys.capability_of_policy(&key) {
                        state.policies.remove(capability);
                        continue;
                    }
                    let Some(agent_id) = self.keys.agent_id_of(&key) else {
                        continue;
                    };
                    if state.remove(agent_id, &self.metrics).is_some() {
                        let expected = self
                            .expected_removals
                            .lock()
                            .unwrap_or_else(|poisoned| poisoned.into_inner())
                            .remove(agent_id);
                        if !expected {
                            self.metrics.lease_expiries.inc();
                        }
                    }
                }
            }
        }
        state.revision = state.revision.max(revision);
        let revision = state.revision;
        drop(state);
        self.metrics.catalog_revision.set(revision);
        self.revision.send_replace(revision);
    }

    /// Keeps the catalog in sync with the store until the catalog is stopped
    /// or dropped (the store watch ends with it, not at its next event): list,
    /// then watch from the next revision; on a broken watch resume from the
    /// last applied revision, on compaction list again.
    pub fn spawn_sync(self: &Arc<Self>, store: Arc<dyn Store>) {
        let mut stopped = self.stopped.subscribe();
        let sync = Self::sync(Arc::downgrade(self), store);
        tokio::spawn(async move {
            tokio::select! {
                () = sync => {}
                // An error means the catalog is dropped: stop as well.
                _ = stopped.wait_for(|stopped| *stopped) => {}
            }
        });
    }

    async fn sync(catalog: std::sync::Weak<Self>, store: Arc<dyn Store>) {
        let mut backoff = Duration::from_millis(100);
        let mut need_listing = true;
        loop {
            let Some(this) = catalog.upgrade() else { return };
            // Agents and splits: one watch, so both share one revision order.
            let prefix = this.keys.tenant_prefix().to_string();
            if need_listing {
                match store.list(&prefix).await {
                    Ok((kvs, revision)) => {
                        this.load(kvs, revision);
                        need_listing = false;
                    }
                    Err(error) => {
                        this.synced.store(false, Ordering::Release);
                        tracing::warn!(message = "Registry store listing failed; retrying.", %error);
                        drop(this);
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
            let from = this.revision() + 1;
            let mut stream = match store.watch(&prefix, from).await {
                Ok(stream) => stream,
                Err(error) => {
                    need_listing = matches!(error, StoreError::Compacted { .. });
                    this.synced.store(false, Ordering::Release);
                    tracing::warn!(message = "Registry store watch failed; retrying.", %error);
                    drop(this);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            this.synced.store(true, Ordering::Release);
            this.synced_news.notify_waiters();
            backoff = Duration::from_millis(100);
            drop(this);
            while let Some(batch) = stream.next().await {
                let Some(this) = catalog.upgrade() else { return };
                match batch {
                    Ok(batch) => this.apply(batch.events, batch.revision),
                    Err(error) => {
                        need_listing = matches!(error, StoreError::Compacted { .. });
                        this.synced.store(false, Ordering::Release);
                        tracing::warn!(message = "Registry store watch broke; resuming.", %error);
                        break;
                    }
                }
            }
            tokio::time::sleep(backoff).await;
        }
    }

    /// Instances by status (for tests and the CLI).
    pub fn count(&self, status: Status) -> usize {
        self.read()
            .instances
            .values()
            .filter(|entry| entry.instance.status == status)
            .count()
    }
}
