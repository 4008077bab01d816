//! Who a call acts for, how deep it is, and what it may still spend (issue
//! 39, DESIGN §9). An agent calling onwards while it serves a call presents
//! the assertion the router gave it for that call (`agent-reach-upstream`,
//! and the request id it serves in `agent-reach-upstream-request`); the
//! router checks it is its own, for an instance of the caller, and builds
//! the next hop's chain from it. An agent that presents none calls as
//! itself: it can lose the authority of whoever it acts for, never gain any.
//!
//! Budgets are counted in a ledger per chain on the router that admitted its
//! first call; a router that meets a chain begun elsewhere starts from what
//! the upstream assertion says is left (at most half an assertion's life
//! old), so a chain spread over several routers may spend up to what each
//! believed was left (docs/design.md §3.14).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_reach_access::{Assertions, BudgetClaim, Caller, Delegation};
use agent_reach_proto::envelope::{BudgetGiven, BudgetLeft};
use serde_json::json;

use crate::error::{Code, RouterError};
use crate::snapshot::Snapshot;

/// The header an agent presents its upstream assertion in.
pub const UPSTREAM_HEADER: &str = "agent-reach-upstream";
/// The header naming the request the agent serves (the trail's parent link).
pub const UPSTREAM_REQUEST_HEADER: &str = "agent-reach-upstream-request";

/// What an onward call presents of the call it is made within.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// The assertion the router gave the agent for the call it serves.
    pub token: String,
    /// That call's request id, as the agent says (for the trail's tree only).
    pub request_id: Option<String>,
}

impl Upstream {
    /// The upstream an onward call's headers present, when they do.
    pub fn from_headers(headers: &impl agent_reach_serving::HeaderLookup) -> Option<Self> {
        let token = headers.value(UPSTREAM_HEADER)?;
        let token = std::str::from_utf8(token).ok()?.trim();
        let request_id = headers
            .value(UPSTREAM_REQUEST_HEADER)
            .and_then(|value| std::str::from_utf8(value).ok())
            .map(str::trim)
            .filter(|id| !id.is_empty() && id.len() <= 128 && id.bytes().all(|byte| byte.is_ascii_graphic()))
            .map(str::to_string);
        Some(Self {
            token: token.to_string(),
            request_id,
        })
    }
}

/// How deep chains may go and how late an upstream assertion still counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainRules {
    /// Hops a chain may have (`--max-depth`, 16), unless acl.yaml's `chains:`
    /// names another for the capability called.
    pub max_depth: u32,
    /// How long past its expiry an upstream assertion is believed
    /// (`--upstream-grace-s`, 300 s): an agent may call onwards late in a long call.
    pub upstream_grace: Duration,
}

impl Default for ChainRules {
    fn default() -> Self {
        Self {
            max_depth: 16,
            upstream_grace: Duration::from_secs(300),
        }
    }
}

fn unauthenticated(reason: &'static str, message: String) -> RouterError {
    RouterError::new(Code::Unauthenticated, message).with_details(json!({ "reason": reason }))
}

/// The delegation of `caller`'s call: direct, or the next hop of the chain
/// `upstream` stands for (its assertion checked: this router's keys, the
/// caller's own instance, the caller's tenant).
pub fn delegation_of(
    caller: &Caller,
    upstream: Option<&Upstream>,
    snapshot: &Snapshot,
    assertions: &Assertions,
    rules: &ChainRules,
    now_ms: u64,
) -> Result<Delegation, RouterError> {
    let Some(upstream) = upstream else {
        return Ok(Delegation::direct(groups_of(caller)));
    };
    let Caller::Agent { name, .. } = caller else {
        // Without authentication there is no caller to check the assertion against.
        return Ok(Delegation::direct(groups_of(caller)));
    };
    let claims = assertions
        .verify_own(&upstream.token, now_ms, rules.upstream_grace)
        .map_err(|error| {
            let reason = match error {
                agent_reach_access::AssertionError::Expired => "upstream_expired",
                _ => "upstream_invalid",
            };
            unauthenticated(
                reason,
                format!("the upstream assertion presented in `{UPSTREAM_HEADER}` is not believed: {error}"),
            )
        })?;
    if claims.tenant != caller.tenant() {
        return Err(unauthenticated(
            "upstream_not_yours",
            format!(
                "the upstream assertion is of tenant `{}`, not the caller's",
                claims.tenant
            ),
        ));
    }
    // The assertion's audience must be an instance of the caller: an agent
    // presents only what it was given.
    let owner = snapshot
        .capabilities
        .get(&claims.cap)
        .into_iter()
        .flat_map(|capability| capability.versions.iter())
        .flat_map(|group| group.instances.iter())
        .find(|instance| instance.agent_id == claims.aud)
        .map(|instance| instance.name.as_str());
    match owner {
        Some(owner) if owner == &**name => {}
        Some(owner) => {
            return Err(unauthenticated(
                "upstream_not_yours",
                format!("the upstream assertion was given to `{owner}`, not to `{name}`"),
            ))
        }
        None => {
            return Err(unauthenticated(
                "upstream_not_yours",
                format!(
                    "the upstream assertion's instance `{}` is not registered for `{}` now",
                    claims.aud, claims.cap
                ),
            ))
        }
    }
    Ok(Delegation::onward(&claims))
}

/// The groups of a caller who begins a chain (its verified token's groups
/// claim, `--auth-claim-groups`), for `subjects: [group:NAME]`; the chain
/// carries them on from its first hop. The one place a call's subject groups
/// come from. Empty (no allocation) for a token that names none.
pub fn groups_of(caller: &Caller) -> Vec<String> {
    caller.groups().iter().map(|group| group.to_string()).collect()
}

/// Refuses a chain deeper than `max_depth` hops (`--max-depth`, or the
/// capability's `chains:` entry in acl.yaml).
pub fn check_depth(
    delegation: &Delegation,
    max_depth: u32,
    caller: &Caller,
    capability: &str,
) -> Result<(), RouterError> {
    if delegation.depth <= max_depth {
        return Ok(());
    }
    Err(RouterError::new(
        Code::DepthExceeded,
        format!(
            "the delegation chain would be {} hops deep to reach `{capability}`; at most {max_depth} \
             (--max-depth, or `chains:` in acl.yaml): a loop, or a chain too long",
            delegation.depth
        ),
    )
    .with_details(json!({
        "depth": delegation.depth,
        "max_depth": max_depth,
        "capability": capability,
        "chain": delegation.names(caller.name().unwrap_or("")),
    })))
}

// === Budgets ===

/// What is left of one chain's budget.
#[derive(Debug)]
pub struct Ledger {
    pub id: String,
    left: Mutex<Left>,
}

#[derive(Debug, Clone, Copy)]
struct Left {
    /// `None`: no limit on calls.
    calls: Option<i64>,
    /// `None`: no limit on cost.
    cost: Option<f64>,
    /// When the entry may go (epoch ms).
    until_ms: u64,
}

impl Left {
    fn view(&self) -> BudgetLeft {
        BudgetLeft {
            calls_left: self.calls.map(|calls| calls.max(0)),
            cost_left: self.cost.map(|cost| cost.max(0.0)),
        }
    }
}

impl Ledger {
    /// Charges one call, or refuses it when no call (or no cost) is left.
    fn charge_call(&self) -> Result<BudgetLeft, RouterError> {
        let mut left = self.left.lock().unwrap_or_else(PoisonError::into_inner);
        let spent = left.calls.is_some_and(|calls| calls <= 0) || left.cost.is_some_and(|cost| cost <= 0.0);
        if spent {
            let view = left.view();
            return Err(RouterError::new(
                Code::BudgetExhausted,
                format!(
                    "the delegation chain's budget is spent ({} call(s), {} cost left): give the first call a larger `budget`",
                    view.calls_left.map_or("unlimited".to_string(), |calls| calls.to_string()),
                    view.cost_left.map_or("unlimited".to_string(), |cost| cost.to_string()),
                ),
            )
            .with_details(json!({ "calls_left": view.calls_left, "cost_left": view.cost_left, "budget": self.id })));
        }
        if let Some(calls) = &mut left.calls {
            *calls -= 1;
        }
        Ok(left.view())
    }

    /// Subtracts what an agent reported it cost; answers what was subtracted.
    pub fn spend(&self, cost: f64) -> f64 {
        if !(cost.is_finite() && cost > 0.0) {
            return 0.0;
        }
        let mut left = self.left.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(left) = &mut left.cost {
            *left -= cost;
        }
        cost
    }

    /// What is left now.
    pub fn left(&self) -> BudgetLeft {
        self.left.lock().unwrap_or_else(PoisonError::into_inner).view()
    }

    /// The claim an assertion carries.
    pub fn claim(&self) -> BudgetClaim {
        let left = self.left();
        BudgetClaim {
            id: self.id.clone(),
            calls_left: left.calls_left,
            cost_left: left.cost_left,
        }
    }
}

/// Shards of the ledgers (a chain's calls lock only its shard, briefly).
const SHARDS: usize = 16;
/// Ledgers per shard before the expired ones are swept.
const SWEEP_AT: usize = 4096;
/// How long a ledger outlives its first call's deadline (onward calls of long calls, tasks).
const KEEP_AFTER_DEADLINE_MS: u64 = 3_600_000;

/// Every chain's ledger this router holds.
pub struct Budgets {
    shards: Box<[Mutex<HashMap<String, Arc<Ledger>>>]>,
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

impl Budgets {
    fn shard(&self, id: &str) -> &Mutex<HashMap<String, Arc<Ledger>>> {
        let index = id.bytes().fold(0usize, |hash, byte| {
            hash.wrapping_mul(31).wrapping_add(usize::from(byte))
        });
        &self.shards[index % SHARDS]
    }

    /// Charges a call of `delegation`'s chain (the budget it carries), or of a
    /// new chain given `given` (a call that begins one; a chained call's
    /// `budget` field is ignored: the chain's own budget binds it). `None`: no
    /// budget. The delegation then carries the chain's claim for the next hop.
    pub fn charge(
        &self,
        delegation: &mut Delegation,
        given: Option<&BudgetGiven>,
        now_ms: u64,
        deadline_ms: u64,
    ) -> Result<Option<(Arc<Ledger>, BudgetLeft)>, RouterError> {
        let left = |calls, cost| Left {
            calls,
            cost,
            until_ms: deadline_ms.saturating_add(KEEP_AFTER_DEADLINE_MS),
        };
        let ledger = match (&delegation.budget, given) {
            (Some(claim), _) => self.ledger(&claim.id, now_ms, || left(claim.calls_left, claim.cost_left)),
            (None, Some(given)) => {
                let id = format!("b{:016x}", rand::random::<u64>());
                self.ledger(&id, now_ms, || left(given.calls.map(i64::from), given.cost))
            }
            (None, None) => return Ok(None),
        };
        let left = ledger.charge_call()?;
        delegation.budget = Some(ledger.claim());
        Ok(Some((ledger, left)))
    }

    /// The ledger `id`: this router's, or a new one from `begin` (a new
    /// chain, or one begun on another router: its claim says what is left).
    fn ledger(&self, id: &str, now_ms: u64, begin: impl FnOnce() -> Left) -> Arc<Ledger> {
        let shard = self.shard(id);
        let mut ledgers = shard.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ledger) = ledgers.get(id) {
            return ledger.clone();
        }
        if ledgers.len() >= SWEEP_AT {
            ledgers.retain(|_, ledger| ledger.left.lock().unwrap_or_else(PoisonError::into_inner).until_ms > now_ms);
        }
        let ledger = Arc::new(Ledger {
            id: id.to_string(),
            left: Mutex::new(begin()),
        });
        ledgers.insert(id.to_string(), ledger.clone());
        ledger
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_of_five_calls_admits_exactly_five_whoever_makes_them() {
        let budgets = Budgets::default();
        let mut root = Delegation::direct(Vec::new());
        let given = BudgetGiven {
            calls: Some(5),
            cost: None,
        };
        let (ledger, left) = budgets.charge(&mut root, Some(&given), 0, 1_000).unwrap().unwrap();
        assert_eq!(left.calls_left, Some(4));
        // Every later call of the chain carries its claim, from any hop.
        let mut admitted = 1;
        let mut refused = 0;
        for _ in 0..10 {
            let mut hop = Delegation {
                budget: root.budget.clone(),
                depth: 2,
                ..Delegation::default()
            };
            match budgets.charge(&mut hop, None, 0, 1_000) {
                Ok(Some(_)) => admitted += 1,
                Ok(None) => panic!("a chained call lost its budget"),
                Err(error) => {
                    assert_eq!(error.code, Code::BudgetExhausted);
                    refused += 1;
                }
            }
        }
        assert_eq!((admitted, refused), (5, 6));
        assert_eq!(ledger.left().calls_left, Some(0));
        // No budget, no ledger.
        assert!(budgets
            .charge(&mut Delegation::direct(Vec::new()), None, 0, 1_000)
            .unwrap()
            .is_none());
    }

    #[test]
    fn reported_cost_is_subtracted_and_a_spent_cost_refuses_the_next_call() {
        let budgets = Budgets::default();
        let mut root = Delegation::direct(Vec::new());
        let given = BudgetGiven {
            calls: None,
            cost: Some(100.0),
        };
        let (ledger, _) = budgets.charge(&mut root, Some(&given), 0, 1_000).unwrap().unwrap();
        ledger.spend(60.0);
        ledger.spend(f64::NAN);
        ledger.spend(-5.0);
        assert_eq!(
            ledger.left(),
            BudgetLeft {
                calls_left: None,
                cost_left: Some(40.0)
            }
        );
        let mut next = Delegation {
            budget: root.budget.clone(),
            ..Delegation::default()
        };
        assert!(budgets.charge(&mut next, None, 0, 1_000).is_ok());
        ledger.spend(50.0);
        let mut last = Delegation {
            budget: root.budget.clone(),
            ..Delegation::default()
        };
        assert_eq!(
            budgets.charge(&mut last, None, 0, 1_000).unwrap_err().code,
            Code::BudgetExhausted
        );
    }
}
