//! How the router signs its hop assertions: the router vouches for every
//! call it forwards (DESIGN §8): each forwarded
//! request carries `Authorization: Bearer <assertion>`, an EdDSA JWT naming
//! the verified caller, the target instance, the capability, the tenant and
//! an expiry that is short and never past the call's deadline; the keys that
//! verify it are published at `GET /.well-known/jwks.json`.
//!
//! Keys come from files (`--assertion-key`, the signing key, and
//! `--assertion-published-key`, keys published beside it: the next key before
//! a rotation, the previous one after), polled every second and swapped
//! atomically when they change ([`agent_reach_reload`]), so a rotation is:
//! publish the new key on every router, then make it the signing key, then
//! drop the old one. A broken edit keeps the last good keys and is logged.
//!
//! Signing costs tens of microseconds, so each serving thread keeps the
//! assertion it issued per (caller, instance, capability) and reuses it while
//! it has at least half its life left and does not outlive the call's
//! deadline. No lock on the request path: a per-thread map and one atomic read.
//! A workflow step's assertion (it names its run) is kept apart, in a map the
//! threads share (sharded, each shard's lock held for one lookup or insert):
//! the run's steps are delivered by whichever thread's worker claims them, and
//! a per-thread map would sign, and the agent verify, one per thread.

use std::cell::RefCell;
use std::hash::{BuildHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;

use crate::assertion::{jwks, AssertionClaims, AssertionError, AssertionKey, AssertionVerifier};
use crate::delegation::Delegation;
use crate::kept::Kept;
use crate::Caller;

/// Where the signing key comes from.
#[derive(Debug, Clone)]
pub enum SigningKey {
    /// A PKCS#8 PEM file, reloaded when it changes.
    File(PathBuf),
    /// A key held in memory.
    Key(Arc<AssertionKey>),
    /// A fresh key made when the router is built, held in memory (tests,
    /// `agent-reach dev`: one router; replicas must share key files).
    Generate,
}

/// How the router signs its assertions.
#[derive(Debug, Clone)]
pub struct AssertionSettings {
    pub signing: SigningKey,
    /// Keys published beside the signing key (PKCS#8 PEM files).
    pub published: Vec<PathBuf>,
    /// The `iss` claim agents expect.
    pub issuer: String,
    /// The longest life of an assertion.
    pub ttl: Duration,
}

impl Default for AssertionSettings {
    /// A key generated when the router is built, the default issuer, 10 s of life.
    fn default() -> Self {
        Self {
            signing: SigningKey::Generate,
            published: Vec::new(),
            issuer: crate::assertion::DEFAULT_ISSUER.to_string(),
            ttl: Duration::from_secs(10),
        }
    }
}

/// The keys in use: the signing key, the published ones, the JWKS document
/// (what the key files parse into; opaque outside this module).
pub struct KeySet {
    signing: Arc<AssertionKey>,
    published: Vec<AssertionKey>,
    jwks: Bytes,
    /// What checks the router's own assertions when an agent presents one upstream.
    verifier: AssertionVerifier,
}

/// Tells apart the key sets (and routers) a thread's cached assertions were signed under.
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// Issues assertions and publishes their keys.
pub struct Assertions {
    keys: ArcSwap<KeySet>,
    /// The generation of `keys`, read on every request (a cheaper check than the swap).
    generation: AtomicU64,
    settings: AssertionSettings,
    keys_valid: prometheus::IntGauge,
    runs: RunAssertions,
}

/// Shards of [`RunAssertions`], and the entries of each shard's generation
/// (a run's steps may wait seconds apart behind a backlog: 16 × 2 × 1,024
/// assertions kept, those in use kept longest; see [`Kept`]).
const RUN_SHARDS: usize = 16;
const RUN_SHARD_CAPACITY: usize = 1024;

/// Workflow steps' assertions, shared by every thread (see the module notes).
struct RunAssertions {
    /// One hasher for all threads: every thread must find the same key.
    hasher: ahash::RandomState,
    shards: [std::sync::Mutex<Kept<u64, Cached>>; RUN_SHARDS],
}

impl RunAssertions {
    fn new() -> Self {
        Self {
            hasher: ahash::RandomState::new(),
            shards: std::array::from_fn(|_| std::sync::Mutex::new(Kept::new(RUN_SHARD_CAPACITY))),
        }
    }

    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, Kept<u64, Cached>> {
        // The key's low bits pick the shard (on every word size: the
        // remainder is below RUN_SHARDS, so the casts lose nothing).
        let index = (key % RUN_SHARDS as u64) as usize;
        // A panic while the lock was held leaves at worst a stale entry, which is checked before use.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

struct Cached {
    generation: u64,
    caller: Option<Arc<str>>,
    tenant: Box<str>,
    agent_id: Box<str>,
    capability: Box<str>,
    delegation: Delegation,
    /// The workflow run the assertion claims (a step's call), if any.
    run: Option<Box<str>>,
    /// `Bearer <jwt>`.
    header: Arc<str>,
    issued_ms: u64,
    expires_ms: u64,
}

/// Entries per thread before the cache is cleared (bounds memory under churn).
const CACHE_CAPACITY: usize = 4096;

/// An upstream assertion already verified on this thread.
struct VerifiedUpstream {
    generation: u64,
    token: Box<str>,
    /// Shared: a chained call reads the claims, it never needs its own copy.
    claims: Arc<AssertionClaims>,
}

thread_local! {
    static CACHE: RefCell<ahash::AHashMap<u64, Cached>> = RefCell::new(ahash::AHashMap::new());
    static VERIFIED: RefCell<ahash::AHashMap<u64, VerifiedUpstream>> = RefCell::new(ahash::AHashMap::new());
    /// One hasher per thread: the map is keyed by this hash of (caller, instance, capability).
    static HASHER: ahash::RandomState = ahash::RandomState::new();
}

impl Assertions {
    /// Loads the keys the settings name; errors name the file.
    pub fn load(mut settings: AssertionSettings, registry: &prometheus::Registry) -> Result<Arc<Self>, String> {
        if let SigningKey::Generate = settings.signing {
            settings.signing = SigningKey::Key(Arc::new(AssertionKey::generate()?.0));
        }
        let keys_valid = prometheus::IntGauge::new(
            "agent_reach_router_assertion_keys_valid",
            "1 while the assertion key files last read were valid (a broken edit keeps the last good keys).",
        )
        .map_err(|error| error.to_string())?;
        registry
            .register(Box::new(keys_valid.clone()))
            .map_err(|error| error.to_string())?;
        let set = keys_from(&settings, &read_files(&settings)?)?;
        keys_valid.set(1);
        let generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
        let assertions = Arc::new(Self {
            keys: ArcSwap::from_pointee(set),
            generation: AtomicU64::new(generation),
            settings,
            keys_valid,
            runs: RunAssertions::new(),
        });
        tracing::info!(
            message = "Assertion keys loaded.",
            signing_kid = assertions.keys.load().signing.kid(),
            published = assertions.keys.load().published.len()
        );
        Ok(assertions)
    }

    /// The key files, as the reload loop follows them.
    fn reload(&self) -> agent_reach_reload::Reload {
        let mut paths = Vec::with_capacity(1 + self.settings.published.len());
        if let SigningKey::File(path) = &self.settings.signing {
            paths.push(path.clone());
        }
        paths.extend(self.settings.published.iter().cloned());
        agent_reach_reload::Reload {
            what: "assertion keys",
            paths,
            every: Duration::from_secs(1),
        }
    }

    /// Polls the key files every second until the assertions are dropped.
    pub fn watch(self: &Arc<Self>) {
        let reload = self.reload();
        if reload.paths.is_empty() {
            return;
        }
        // What the keys were made from (a change since is seen at the first look).
        let seen = reload.read().map(agent_reach_reload::Seen::applied).unwrap_or_default();
        reload.spawn(Arc::downgrade(self), seen);
    }

    /// The `iss` the router signs as.
    pub fn issuer(&self) -> &str {
        &self.settings.issuer
    }

    /// The key signing now (the console derives its sealing key from it).
    pub fn signing_key(&self) -> Arc<AssertionKey> {
        self.keys.load().signing.clone()
    }

    /// `GET /.well-known/jwks.json`: the signing key first, then the published ones.
    pub fn jwks(&self) -> Bytes {
        self.keys.load().jwks.clone()
    }

    /// The claims of an assertion this router (or a replica sharing its keys)
    /// signed, presented by an agent calling onwards while it serves that
    /// call: its signature by a key in use, its issuer, and its expiry give or
    /// take `grace` (an agent may call onwards late in a long call). Verified
    /// once per thread and token, then read from a cache.
    pub fn verify_own(
        &self,
        token: &str,
        now_ms: u64,
        grace: Duration,
    ) -> Result<Arc<AssertionClaims>, AssertionError> {
        let generation = self.generation.load(Ordering::Acquire);
        let key = HASHER.with(|state| state.hash_one(token));
        let cached = VERIFIED.with(|cache| {
            let cache = cache.borrow();
            let entry = cache.get(&key)?;
            (entry.generation == generation && &*entry.token == token).then(|| entry.claims.clone())
        });
        let claims = match cached {
            Some(claims) => claims,
            None => {
                let claims = Arc::new(self.keys.load().verifier.verify_own(token)?);
                VERIFIED.with(|cache| {
                    let mut cache = cache.borrow_mut();
                    if cache.len() >= CACHE_CAPACITY {
                        cache.clear();
                    }
                    cache.insert(
                        key,
                        VerifiedUpstream {
                            generation,
                            token: token.into(),
                            claims: claims.clone(),
                        },
                    );
                });
                claims
            }
        };
        let grace_s = grace.as_secs();
        if claims.exp.saturating_add(grace_s).saturating_mul(1000) < now_ms {
            return Err(AssertionError::Expired);
        }
        Ok(claims)
    }

    /// The `authorization` value for one forwarded attempt: `caller`'s call of
    /// `capability` on `agent_id` within `delegation` (its chain, depth and
    /// budget), expiring at most at `deadline_ms`. Assertions are reused
    /// for the same caller, instance, capability and chain (a budget by its
    /// ledger id: the `budget` an assertion carries is what was left when it
    /// was signed, at most half an assertion's life ago; the router's ledger
    /// holds what is exactly left); for a workflow's step, claiming its `run`,
    /// reused by the same run's steps on the same instance and capability (a
    /// cache of their own, shared by the threads, so runs' churn leaves plain
    /// calls' assertions be).
    pub fn header(
        &self,
        caller: &Caller,
        (agent_id, capability): (&str, &str),
        delegation: &Delegation,
        run: Option<&str>,
        deadline_ms: u64,
        now_ms: u64,
    ) -> Result<Arc<str>, String> {
        let generation = self.generation.load(Ordering::Acquire);
        let caller_name = match caller {
            Caller::Agent { name, .. } => Some(name),
            Caller::Unauthenticated => None,
        };
        let hash = |state: &ahash::RandomState| {
            let mut hasher = state.build_hasher();
            caller_name.map(|name| &**name).hash(&mut hasher);
            caller.tenant().hash(&mut hasher);
            agent_id.hash(&mut hasher);
            capability.hash(&mut hasher);
            delegation.act.hash(&mut hasher);
            delegation.depth.hash(&mut hasher);
            delegation.budget.as_ref().map(|budget| &budget.id).hash(&mut hasher);
            delegation.groups.hash(&mut hasher);
            run.hash(&mut hasher);
            hasher.finish()
        };
        let ttl_ms = u64::try_from(self.settings.ttl.as_millis()).unwrap_or(u64::MAX);
        let reusable = |entry: &Cached| {
            let same = entry.generation == generation
                && entry.caller.as_deref() == caller_name.map(|name| &**name)
                && &*entry.tenant == caller.tenant()
                && &*entry.agent_id == agent_id
                && &*entry.capability == capability
                && entry.delegation.same_chain(delegation)
                && entry.run.as_deref() == run;
            // At least half its life left, and never past this call's deadline.
            let fresh = now_ms < entry.issued_ms + ttl_ms / 2 && entry.expires_ms <= deadline_ms;
            (same && fresh).then(|| entry.header.clone())
        };
        // A run's steps that reach the same instance and capability (a
        // `for_each`, or steps of one capability) share one assertion, as
        // plain calls do: one signature and one verification by the agent,
        // whichever thread delivers them.
        let key = match run {
            Some(_) => hash(&self.runs.hasher),
            None => HASHER.with(hash),
        };
        let found = match run {
            Some(_) => self.runs.shard(key).get(&key).and_then(reusable),
            None => CACHE.with(|cache| cache.borrow().get(&key).and_then(reusable)),
        };
        if let Some(header) = found {
            return Ok(header);
        }
        let expires_ms = now_ms.saturating_add(ttl_ms).min(deadline_ms);
        let claims = AssertionClaims {
            run: run.map(str::to_string),
            ..self.claims(caller, agent_id, capability, delegation, now_ms, expires_ms)
        };
        let token = self.keys.load().signing.sign(&claims)?;
        let header: Arc<str> = format!("Bearer {token}").into();
        // Only full-life assertions are worth keeping: one cut short by a
        // near deadline would serve no later call.
        if expires_ms == now_ms.saturating_add(ttl_ms) {
            let entry = Cached {
                generation,
                caller: caller_name.cloned(),
                tenant: caller.tenant().into(),
                agent_id: agent_id.into(),
                capability: capability.into(),
                delegation: delegation.clone(),
                run: run.map(Box::from),
                header: header.clone(),
                issued_ms: now_ms,
                expires_ms,
            };
            // Bounded: plain calls' map cleared when full; runs' map (its
            // own, so runs' churn never touches plain calls' assertions)
            // keeps those in use (a run's steps may be seconds apart).
            match run {
                Some(_) => self.runs.shard(key).insert(key, entry),
                None => CACHE.with(|cache| {
                    let mut cache = cache.borrow_mut();
                    if cache.len() >= CACHE_CAPACITY {
                        cache.clear();
                    }
                    cache.insert(key, entry);
                }),
            }
        }
        Ok(header)
    }

    fn claims(
        &self,
        caller: &Caller,
        agent_id: &str,
        capability: &str,
        delegation: &Delegation,
        now_ms: u64,
        expires_ms: u64,
    ) -> AssertionClaims {
        AssertionClaims {
            iss: self.settings.issuer.clone(),
            sub: caller.name().map(str::to_string).unwrap_or_default(),
            aud: agent_id.to_string(),
            cap: capability.to_string(),
            tenant: caller.tenant().to_string(),
            iat: now_ms / 1000,
            // JWT times are seconds; round down so the assertion never outlives the deadline.
            exp: expires_ms / 1000,
            run: None,
            act: delegation.act.clone(),
            // A direct call's depth (1) goes without saying.
            depth: (delegation.depth > 1).then_some(delegation.depth),
            budget: delegation.budget.clone(),
            groups: delegation.groups.clone(),
        }
    }
}

/// The key files' bytes, signing key first.
fn read_files(settings: &AssertionSettings) -> Result<Vec<Vec<u8>>, String> {
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|error| format!("cannot read assertion key {}: {error}", path.display()))
    };
    let mut files = Vec::with_capacity(1 + settings.published.len());
    if let SigningKey::File(path) = &settings.signing {
        files.push(read(path)?);
    }
    for path in &settings.published {
        files.push(read(path)?);
    }
    Ok(files)
}

fn keys_from(settings: &AssertionSettings, files: &[Vec<u8>]) -> Result<KeySet, String> {
    let mut files = files.iter();
    let signing = match &settings.signing {
        SigningKey::Key(key) => key.clone(),
        SigningKey::Generate => return Err("the signing key was not generated before use".to_string()),
        SigningKey::File(path) => {
            let pem = files.next().ok_or("the signing key file was not read")?;
            Arc::new(AssertionKey::from_pkcs8_pem(pem).map_err(|error| format!("{}: {error}", path.display()))?)
        }
    };
    let mut published = Vec::new();
    for (path, pem) in settings.published.iter().zip(files) {
        let key = AssertionKey::from_pkcs8_pem(pem).map_err(|error| format!("{}: {error}", path.display()))?;
        if key.kid() != signing.kid() && published.iter().all(|known: &AssertionKey| known.kid() != key.kid()) {
            published.push(key);
        }
    }
    let document = jwks(std::iter::once(&*signing).chain(published.iter()));
    let jwks = Bytes::from(serde_json::to_vec(&document).map_err(|error| error.to_string())?);
    let verifier = AssertionVerifier::from_jwks(&jwks, &settings.issuer)?;
    Ok(KeySet {
        signing,
        published,
        jwks,
        verifier,
    })
}

impl agent_reach_reload::Follow for Assertions {
    type Value = KeySet;

    fn parse(&self, contents: &[Vec<u8>]) -> Result<KeySet, String> {
        keys_from(&self.settings, contents)
    }

    fn apply(&self, set: KeySet) -> bool {
        let signing = set.signing.kid().to_string();
        self.keys.store(Arc::new(set));
        self.generation
            .store(NEXT_GENERATION.fetch_add(1, Ordering::Relaxed), Ordering::Release);
        tracing::info!(message = "Assertion keys reloaded.", signing_kid = %signing);
        true
    }

    fn observe(&self, outcome: agent_reach_reload::Outcome) {
        self.keys_valid
            .set(i64::from(outcome == agent_reach_reload::Outcome::Applied));
    }
}

#[cfg(test)]
mod tests {
    use crate::assertion::{AssertionVerifier, DEFAULT_ISSUER};

    use super::*;

    fn settings_in(dir: &std::path::Path) -> AssertionSettings {
        AssertionSettings {
            signing: SigningKey::File(dir.join("signing.pem")),
            published: vec![dir.join("next.pem")],
            issuer: DEFAULT_ISSUER.into(),
            ttl: Duration::from_secs(10),
        }
    }

    fn write_key(path: &std::path::Path) -> String {
        let (key, pem) = AssertionKey::generate().unwrap();
        std::fs::write(path, pem).unwrap();
        key.kid().to_string()
    }

    fn verifier(assertions: &Assertions) -> AssertionVerifier {
        AssertionVerifier::from_jwks(&assertions.jwks(), DEFAULT_ISSUER).unwrap()
    }

    /// Assertions with a fresh key, an agent caller and the time now (ms).
    fn signing_setup() -> (Arc<Assertions>, Caller, u64) {
        let assertions = Assertions::load(AssertionSettings::default(), &prometheus::Registry::new()).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        (assertions, Caller::agent("intent_parser"), now)
    }

    #[test]
    fn a_runs_steps_on_one_target_share_an_assertion_that_names_the_run() {
        let (assertions, caller, now) = signing_setup();
        let far = now + 60_000;
        let direct = Delegation::direct(Vec::new());
        let step = |run: Option<&str>, capability: &str| {
            assertions
                .header(&caller, ("a-1", capability), &direct, run, far, now)
                .unwrap()
        };
        let first = step(Some("t_run1"), "order.query");
        assert!(
            Arc::ptr_eq(&first, &step(Some("t_run1"), "order.query")),
            "one run, one target: reused"
        );
        assert_ne!(first, step(Some("t_run2"), "order.query"), "another run: its own");
        assert_ne!(
            first,
            step(Some("t_run1"), "shipping.rules"),
            "another capability: its own"
        );
        let plain = step(None, "order.query");
        assert_ne!(first, plain, "a plain call never gets a run's assertion");
        // A run's steps are delivered by whichever thread claims them: the
        // threads share its assertions (plain calls' stay each thread's own).
        std::thread::scope(|scope| {
            scope.spawn(|| {
                assert!(
                    Arc::ptr_eq(&first, &step(Some("t_run1"), "order.query")),
                    "another thread: the run's assertion reused"
                );
                assert!(
                    !Arc::ptr_eq(&plain, &step(None, "order.query")),
                    "a plain call's is the thread's"
                );
            });
        });
        let claims = |header: &Arc<str>| {
            verifier(&assertions)
                .verify(header.strip_prefix("Bearer ").unwrap(), "a-1")
                .unwrap()
        };
        assert_eq!(claims(&first).run.as_deref(), Some("t_run1"));
        assert_eq!(claims(&plain).run, None);
    }

    #[test]
    fn assertions_are_cached_per_call_target_and_never_outlive_the_deadline() {
        let (assertions, caller, now) = signing_setup();
        let far = now + 60_000;
        let first = assertions
            .header(
                &caller,
                ("a-1", "order.query"),
                &Delegation::direct(Vec::new()),
                None,
                far,
                now,
            )
            .unwrap();
        let again = assertions
            .header(
                &caller,
                ("a-1", "order.query"),
                &Delegation::direct(Vec::new()),
                None,
                far,
                now + 1000,
            )
            .unwrap();
        assert!(Arc::ptr_eq(&first, &again), "reused while fresh");
        let other_agent = assertions
            .header(
                &caller,
                ("a-2", "order.query"),
                &Delegation::direct(Vec::new()),
                None,
                far,
                now,
            )
            .unwrap();
        assert_ne!(first, other_agent, "one per instance");
        // Half its life gone: a new one.
        let later = assertions
            .header(
                &caller,
                ("a-1", "order.query"),
                &Delegation::direct(Vec::new()),
                None,
                far,
                now + 6000,
            )
            .unwrap();
        assert_ne!(first, later);
        // A call whose deadline is sooner than the cached expiry gets one of its own, cut to the deadline.
        let short = assertions
            .header(
                &caller,
                ("a-1", "order.query"),
                &Delegation::direct(Vec::new()),
                None,
                now + 2500,
                now + 6000,
            )
            .unwrap();
        assert_ne!(short, later);
        let token = short.strip_prefix("Bearer ").unwrap();
        let claims = verifier(&assertions).verify(token, "a-1").unwrap();
        assert!(claims.exp * 1000 <= now + 2500, "exp {} past the deadline", claims.exp);
        assert_eq!(
            (claims.sub.as_str(), claims.aud.as_str(), claims.cap.as_str()),
            ("intent_parser", "a-1", "order.query")
        );
    }

    #[test]
    fn a_rotation_publishes_both_keys_and_switches_the_signer() {
        let dir = tempfile::tempdir().unwrap();
        let first = write_key(&dir.path().join("signing.pem"));
        let second = write_key(&dir.path().join("next.pem"));
        let assertions = Assertions::load(settings_in(dir.path()), &prometheus::Registry::new()).unwrap();
        let reload = assertions.reload();
        let mut seen = agent_reach_reload::Seen::applied(reload.read().unwrap());
        let published = verifier(&assertions);
        assert!(published.knows(&first) && published.knows(&second));
        let caller = Caller::agent("c");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let before = assertions
            .header(
                &caller,
                ("a", "x.y"),
                &Delegation::direct(Vec::new()),
                None,
                now + 60_000,
                now,
            )
            .unwrap();
        assert_eq!(
            AssertionVerifier::key_id(before.strip_prefix("Bearer ").unwrap()).unwrap(),
            first
        );
        // Swap: the next key signs, the old one stays published.
        let signing = std::fs::read(dir.path().join("signing.pem")).unwrap();
        let next = std::fs::read(dir.path().join("next.pem")).unwrap();
        std::fs::write(dir.path().join("signing.pem"), next).unwrap();
        std::fs::write(dir.path().join("next.pem"), signing).unwrap();
        reload.check(&*assertions, &mut seen);
        let after = assertions
            .header(
                &caller,
                ("a", "x.y"),
                &Delegation::direct(Vec::new()),
                None,
                now + 60_000,
                now,
            )
            .unwrap();
        assert_eq!(
            AssertionVerifier::key_id(after.strip_prefix("Bearer ").unwrap()).unwrap(),
            second
        );
        let published = verifier(&assertions);
        assert!(published.knows(&first) && published.knows(&second));
        assert!(published.verify(before.strip_prefix("Bearer ").unwrap(), "a").is_ok());
        assert!(published.verify(after.strip_prefix("Bearer ").unwrap(), "a").is_ok());
        // A broken edit keeps the last good keys.
        std::fs::write(dir.path().join("signing.pem"), "garbage").unwrap();
        reload.check(&*assertions, &mut seen);
        assert_eq!(assertions.keys_valid.get(), 0);
        let still = assertions
            .header(
                &caller,
                ("b", "x.y"),
                &Delegation::direct(Vec::new()),
                None,
                now + 60_000,
                now,
            )
            .unwrap();
        assert_eq!(
            AssertionVerifier::key_id(still.strip_prefix("Bearer ").unwrap()).unwrap(),
            second
        );
    }

    #[test]
    fn missing_or_bad_key_files_are_refused_at_start_with_their_name() {
        let dir = tempfile::tempdir().unwrap();
        let error = Assertions::load(settings_in(dir.path()), &prometheus::Registry::new())
            .err()
            .unwrap();
        assert!(error.contains("signing.pem"), "{error}");
        std::fs::write(dir.path().join("signing.pem"), "not a key").unwrap();
        std::fs::write(dir.path().join("next.pem"), "not a key").unwrap();
        let error = Assertions::load(settings_in(dir.path()), &prometheus::Registry::new())
            .err()
            .unwrap();
        assert!(error.contains("signing.pem"), "{error}");
    }
}
