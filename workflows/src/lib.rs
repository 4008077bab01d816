//! Workflows (issue 36, DESIGN §9, docs/design.md §3.14): a declared graph of
//! capability calls, itself callable as a capability. This crate is the
//! definition language, shared by the registry (which checks and stores
//! definitions), the router (which runs them) and the CLI:
//!
//! - [`definition`]: the document as written, JSON or YAML;
//! - [`expr`] and [`template`]: `${…}` expressions and the JSON templates
//!   they live in (a step's input, the output);
//! - [`check`]: a definition checked into a [`Workflow`] (names, bounds,
//!   expressions, references, the DAG, schemas; with the registered
//!   capabilities, every input mapping, [`mapping`]);
//! - [`problem`]: what is wrong, as `INVALID_WORKFLOW`'s details.
//!
//! How runs execute is the router's (`runs/`); this crate holds no state.

pub mod check;
pub mod definition;
pub mod expr;
pub mod mapping;
pub mod problem;
pub mod template;

use std::sync::Arc;

use serde_json::Value;

pub use check::{check, Catalog, Offer};
pub use definition::{Definition, Format};
pub use expr::{Expr, Scope};
pub use problem::{Problem, Reason};
pub use template::Template;

/// A checked workflow: its steps parsed, ordered and bounded, its schemas
/// compiled (once, off any request path).
pub struct Workflow {
    pub name: String,
    pub version: semver::Version,
    pub description: String,
    /// As registered (what `GET /v1/workflows/{name}` shows and runs keep).
    pub definition: Definition,
    pub input_validator: Arc<jsonschema::Validator>,
    pub output_validator: Option<Arc<jsonschema::Validator>>,
    pub steps: Vec<Step>,
    /// Every step index, each after the steps it depends on.
    pub order: Vec<usize>,
    pub output: Template,
}

impl std::fmt::Debug for Workflow {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Workflow")
            .field("name", &self.name)
            .field("version", &self.version.to_string())
            .field("steps", &self.steps.iter().map(|step| &step.id).collect::<Vec<_>>())
            .finish()
    }
}

/// One step of a workflow.
#[derive(Debug, Clone)]
pub struct Step {
    pub id: String,
    pub capability: String,
    /// `None`: the highest version.
    pub version: Option<semver::VersionReq>,
    pub input: Template,
    /// Indices of the steps it waits for: those written in `depends_on`,
    /// and every step one of its expressions reads. Sorted, distinct.
    pub depends_on: Vec<usize>,
    /// An array: one call per element (`item`, `index` in the input).
    pub for_each: Option<Expr>,
    /// A `for_each` step's calls at once.
    pub max_parallel: usize,
    /// Runs only when `true`; otherwise skipped (its output `null`).
    pub when: Option<Expr>,
    /// Each call's deadline; absent: the capability's.
    pub timeout_ms: Option<u64>,
    pub retry: Retry,
    pub on_failure: OnFailure,
}

/// How often a step's call is tried, and after how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// Calls at most, the first included (1: no retry).
    pub max_attempts: u32,
    /// The wait before the second call, doubled before each later one.
    pub backoff_ms: u64,
    /// Only failures with these codes are retried; empty: every failure.
    pub codes: Vec<String>,
}

impl Retry {
    /// One call, no retry (the default).
    pub fn once() -> Self {
        Self {
            max_attempts: 1,
            backoff_ms: check::DEFAULT_BACKOFF_MS,
            codes: Vec::new(),
        }
    }

    /// Whether a failure with `codes` (the router's code and, for an
    /// agent's own error, its code) is retried after attempt `attempt`.
    pub fn retries(&self, attempt: u32, codes: &[&str]) -> bool {
        attempt < self.max_attempts
            && (self.codes.is_empty() || self.codes.iter().any(|wanted| codes.contains(&wanted.as_str())))
    }

    /// The wait before attempt `next` (2, 3, …): the backoff, doubled each time, at most 10 minutes.
    pub fn delay_ms(&self, next: u32) -> u64 {
        let doublings = next.saturating_sub(2).min(16);
        self.backoff_ms
            .saturating_mul(1 << doublings)
            .min(check::MAX_BACKOFF_MS)
    }
}

/// What a step's failure (after its retries) does to the run.
#[derive(Debug, Clone)]
pub enum OnFailure {
    /// The run fails; steps still running are canceled.
    Fail,
    /// The step is failed, the run goes on (its output is `null`).
    Continue,
    /// The compensating call runs, then the run fails.
    Compensate(Compensation),
}

#[derive(Debug, Clone)]
pub struct Compensation {
    pub capability: String,
    pub version: Option<semver::VersionReq>,
    /// May read `steps.ID.error` of the step that failed.
    pub input: Template,
    pub timeout_ms: Option<u64>,
}

impl Workflow {
    /// Reads and checks a stored definition (a router building its
    /// snapshot: the registry checked it against the capabilities already).
    pub fn from_stored(name: &str, definition: Value) -> Result<Self, Problem> {
        check(name, definition::from_value(definition)?, None)
    }

    /// The step called `id`.
    pub fn step(&self, id: &str) -> Option<(usize, &Step)> {
        self.steps.iter().enumerate().find(|(_, step)| step.id == id)
    }
}

#[cfg(test)]
mod tests;
