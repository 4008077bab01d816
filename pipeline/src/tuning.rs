//! The router's retry, breaker, pool and serving tuning ([`Tuning`]): read by
//! admission, the attempt loop and the server alike, so it lives in a leaf.

use std::time::Duration;

/// Retry, breaker and pool tuning; [`Default`] gives the documented defaults.
#[derive(Debug, Clone)]
pub struct Tuning {
    pub max_body_bytes: usize,
    pub default_timeout: Duration,
    pub max_attempts: u32,
    pub retry_budget_percent: u32,
    pub retry_budget_floor: u32,
    pub breaker_failures: u32,
    pub breaker_open: Duration,
    pub max_inflight_per_instance: u32,
    pub pool_idle_per_instance: usize,
    pub max_staleness: Duration,
    /// Request-serving threads of `run` (0: one per core).
    pub threads: usize,
    /// The capability whose A2A agent card is also served at the host root
    /// (`/.well-known/agent-card.json`, `--a2a-root-capability`).
    pub a2a_root_capability: Option<String>,
    /// Every A2A message a durable task (`--a2a-tasks always`, needs `--redis`):
    /// a plain `SendMessage` is answered with the ended Task rather than a
    /// Message, a stream is the task's, and both are found by `GetTask`.
    pub a2a_tasks_always: bool,
    /// Browser origins `/mcp` answers besides loopback ones (`--mcp-allowed-origin`; `*`: any).
    pub mcp_allowed_origins: Vec<String>,
    /// Whether the listener serves TLS (A2A cards then name `https://` URLs);
    /// set by `build` from the listener's settings.
    pub serves_tls: bool,
    /// How deep delegation chains may go, how late an upstream assertion counts.
    pub chains: crate::delegation::ChainRules,
    /// The outcome history's bucket (`--routing-history-bucket-ms`): an hour
    /// in production, so 24 buckets are a day; shorter only to compress time
    /// in tests and benches (DESIGN §3.4.1).
    pub history_bucket: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            max_body_bytes: 1024 * 1024,
            default_timeout: Duration::from_secs(30),
            max_attempts: 3,
            retry_budget_percent: 20,
            retry_budget_floor: 10,
            breaker_failures: 5,
            breaker_open: Duration::from_secs(30),
            max_inflight_per_instance: 1024,
            pool_idle_per_instance: 64,
            max_staleness: Duration::from_secs(60),
            threads: 0,
            a2a_root_capability: None,
            a2a_tasks_always: false,
            mcp_allowed_origins: Vec::new(),
            serves_tls: false,
            chains: crate::delegation::ChainRules::default(),
            history_bucket: Duration::from_secs(3600),
        }
    }
}
