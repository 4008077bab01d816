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
//! believed was left (docs/design.md §3.15).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
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
/// Entries per shard before the first sweep of the ledgers no call holds.
const SWEEP_AT: usize = 1024;

/// One shard: ledgers by id, held by the calls in flight of their chains
/// (each admitted call keeps an `Arc`); an entry whose chain has no call in
/// flight is dead and swept.
#[derive(Default)]
struct Shard {
    ledgers: HashMap<String, Weak<Ledger>>,
    /// The size at which the next sweep runs: twice what the last one left,
    /// so sweeping stays amortised O(1) per new chain.
    sweep_at: usize,
}

/// Every chain's ledger this router holds, while a call of the chain is in
/// flight. A chain met again after all its calls ended (an agent calling
/// onwards after it answered) starts again from what its assertion's claim
/// says was left when it was signed.
pub struct Budgets {
    shards: Box<[Mutex<Shard>]>,
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }
}

impl Budgets {
    fn shard(&self, id: &str) -> &Mutex<Shard> {
        let index = id.bytes().fold(0usize, |hash, byte| {
            hash.wrapping_mul(31).wrapping_add(usize::from(byte))
        });
        &self.shards[index % SHARDS]
    }

    /// Charges a call of `delegation`'s chain (the budget it carries), or of a
    /// new chain given `given` (a call that begins one; a chained call's
    /// `budget` field is ignored: the chain's own budget binds it). `None`: no
    /// budget. The delegation then carries the chain's claim for the next hop;
    /// the caller holds the ledger for as long as the call is in flight.
    pub fn charge(
        &self,
        delegation: &mut Delegation,
        given: Option<&BudgetGiven>,
    ) -> Result<Option<(Arc<Ledger>, BudgetLeft)>, RouterError> {
        let ledger = match (&delegation.budget, given) {
            (Some(claim), _) => self.ledger(&claim.id, claim.calls_left, claim.cost_left),
            (None, Some(given)) => {
                let id = format!("b{:016x}", rand::random::<u64>());
                self.ledger(&id, given.calls.map(i64::from), given.cost)
            }
            (None, None) => return Ok(None),
        };
        let left = ledger.charge_call()?;
        delegation.budget = Some(ledger.claim());
        Ok(Some((ledger, left)))
    }

    /// The ledger `id`: the one a call in flight holds, or a new one with
    /// `calls` and `cost` left (a new chain, or one met again: its claim says
    /// what was left).
    fn ledger(&self, id: &str, calls: Option<i64>, cost: Option<f64>) -> Arc<Ledger> {
        let mut shard = self.shard(id).lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ledger) = shard.ledgers.get(id).and_then(Weak::upgrade) {
            return ledger;
        }
        if shard.ledgers.len() >= shard.sweep_at.max(SWEEP_AT) {
            shard.ledgers.retain(|_, ledger| ledger.strong_count() > 0);
            shard.sweep_at = shard.ledgers.len().saturating_mul(2);
        }
        let ledger = Arc::new(Ledger {
            id: id.to_string(),
            left: Mutex::new(Left { calls, cost }),
        });
        shard.ledgers.insert(id.to_string(), Arc::downgrade(&ledger));
        ledger
    }

    /// Ledgers this router holds an entry for, live or not yet swept (tests).
    #[cfg(test)]
    fn entries(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().unwrap_or_else(PoisonError::into_inner).ledgers.len())
            .sum()
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
        let (ledger, left) = budgets.charge(&mut root, Some(&given)).unwrap().unwrap();
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
            match budgets.charge(&mut hop, None) {
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
            .charge(&mut Delegation::direct(Vec::new()), None)
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
        let (ledger, _) = budgets.charge(&mut root, Some(&given)).unwrap().unwrap();
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
        assert!(budgets.charge(&mut next, None).is_ok());
        ledger.spend(50.0);
        let mut last = Delegation {
            budget: root.budget.clone(),
            ..Delegation::default()
        };
        assert_eq!(budgets.charge(&mut last, None).unwrap_err().code, Code::BudgetExhausted);
    }

    #[test]
    fn a_ledger_lives_while_a_call_of_its_chain_holds_it_and_dead_ones_are_swept() {
        let budgets = Budgets::default();
        let given = BudgetGiven {
            calls: Some(3),
            cost: None,
        };
        for _ in 0..(SWEEP_AT * SHARDS * 4) {
            // Each call begins a chain and ends at once.
            let (ledger, _) = budgets
                .charge(&mut Delegation::direct(Vec::new()), Some(&given))
                .unwrap()
                .unwrap();
            drop(ledger);
        }
        assert!(
            budgets.entries() <= SWEEP_AT * SHARDS,
            "dead ledgers swept: {}",
            budgets.entries()
        );
        // A chain whose root call is in flight keeps its ledger for its onward calls.
        let mut root = Delegation::direct(Vec::new());
        let (held, _) = budgets.charge(&mut root, Some(&given)).unwrap().unwrap();
        let mut onward = Delegation {
            budget: root.budget.clone(),
            ..Delegation::default()
        };
        let (same, left) = budgets.charge(&mut onward, None).unwrap().unwrap();
        assert!(Arc::ptr_eq(&held, &same));
        assert_eq!(left.calls_left, Some(1));
    }
}
