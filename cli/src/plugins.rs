//! The selection policies plugged into `agent-reach router`, each named
//! `plugin:NAME` by calls (`target_policy`) and by capabilities
//! (`PUT /v1/capabilities/{name}/policy`); DESIGN §3.4.1.
//!
//! To plug in a policy of your own: implement
//! `agent_reach_pipeline::policy::SelectionPolicy` in your crate (see
//! `policy-example/` for one), add the crate to `cli/Cargo.toml`, and add one
//! `.with("NAME", YourPolicy)` below. Names are `[a-z][a-z0-9_]*`; a
//! duplicate stops the router at start-up.

use agent_reach_router::Plugins;

/// Every policy this binary plugs into its router.
pub fn all() -> anyhow::Result<Plugins> {
    Plugins::new()
        .with(agent_reach_policy_example::NAME, agent_reach_policy_example::Cheapest)
        .map_err(anyhow::Error::msg)
}
