//! An example of a selection policy a team plugs into the router from its
//! own crate (issue 38, point 4; DESIGN §3.4.1): `plugin:cheapest`.
//!
//! Seed 000 §4.1: agents behind one capability differ by an order of
//! magnitude, a small model beside a large one. Each instance says what a
//! call costs it with a tag, `cost` (any number: cents, GPU-seconds); this
//! policy sends each attempt to the cheapest instance that is fit to take it
//! now, and to the next cheapest when it is not:
//!
//! - healthy: its passive health at least half (a failure halves it), and
//!   its history predicting under 20 % failures now;
//! - with room: fewer requests in flight (this router's, or what it
//!   reported, whichever is larger) than its tag `max_inflight`, when it has one.
//!
//! Instances without a `cost` tag come last; ties go to the one with fewer
//! requests in flight. When none is fit, the policy leaves the choice to
//! weighted round-robin (`None`).
//!
//! Plugged into `agent-reach router` by one line of `cli/src/plugins.rs`:
//!
//! ```
//! use agent_reach_pipeline::policy::Plugins;
//!
//! let plugins = Plugins::new().with("cheapest", agent_reach_policy_example::Cheapest).unwrap();
//! assert_eq!(plugins.names().collect::<Vec<_>>(), ["cheapest"]);
//! ```
//!
//! then named by a call (`"target_policy": "plugin:cheapest"`) or set as a
//! capability's policy (`PUT /v1/capabilities/{name}/policy`
//! `{"policy": "plugin:cheapest"}`).

use agent_reach_pipeline::policy::{CallView, CandidateView, Candidates, SelectionPolicy};

/// The name `agent-reach router` registers it under (`plugin:cheapest`).
pub const NAME: &str = "cheapest";

/// The cheapest fit instance first (see the crate's documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct Cheapest;

/// An instance is fit while its health is at least this (permille) ...
const MIN_HEALTH: u32 = 500;
/// ... and its history predicts fewer failures than this (permille).
const MAX_PREDICTED_FAILURE: u32 = 200;

impl SelectionPolicy for Cheapest {
    fn choose(&self, _call: &CallView<'_>, candidates: &Candidates<'_>) -> Option<usize> {
        candidates
            .iter()
            .enumerate()
            .filter(|(_, candidate)| fit(candidate))
            .min_by(|(_, a), (_, b)| cost(a).total_cmp(&cost(b)).then(load(a).cmp(&load(b))))
            .map(|(position, _)| position)
    }
}

/// The `cost` tag; an instance without one (or with a broken one) costs the most.
pub fn cost(candidate: &CandidateView<'_>) -> f64 {
    candidate
        .tags()
        .get("cost")
        .and_then(|text| text.parse::<f64>().ok())
        .filter(|cost| cost.is_finite())
        .unwrap_or(f64::INFINITY)
}

fn load(candidate: &CandidateView<'_>) -> u32 {
    candidate.inflight().max(candidate.reported_inflight())
}

fn fit(candidate: &CandidateView<'_>) -> bool {
    let healthy = candidate.health_permille() >= MIN_HEALTH
        && candidate
            .predicted_failure_permille()
            .is_none_or(|failure| failure < MAX_PREDICTED_FAILURE);
    let room = candidate
        .tags()
        .get("max_inflight")
        .and_then(|text| text.parse::<u32>().ok())
        .is_none_or(|max| load(candidate) < max);
    healthy && room
}
