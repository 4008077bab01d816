//! A call's place in a delegation chain (issue 39, DESIGN §9): on whose
//! behalf it is made, through whom, how deep, under which budget. The
//! router builds it from the upstream assertion an agent presents when it
//! calls onwards while serving a call (its own assertion, signed by the
//! router: an agent cannot forge or lengthen the chain, and one that
//! presents none calls as itself, with no one's authority but its own).

use crate::assertion::{Actor, AssertionClaims, BudgetClaim};

/// A call's delegation: the hops before it (`act`), its depth, its budget.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delegation {
    /// The hop the caller was serving, nested down to the original subject's.
    pub act: Option<Actor>,
    /// Hops in the chain, this one included.
    pub depth: u32,
    pub budget: Option<BudgetClaim>,
    /// The original subject's groups, for a call made by the original subject
    /// itself (a chained call carries them on its innermost hop).
    pub groups: Vec<String>,
}

impl Delegation {
    /// A call made by its original subject: no chain, depth 1.
    pub fn direct(groups: Vec<String>) -> Self {
        Self {
            act: None,
            depth: 1,
            budget: None,
            groups,
        }
    }

    /// The delegation of a call `caller` makes while serving the call that
    /// `upstream` (the assertion `caller` received) stands for.
    pub fn onward(upstream: &AssertionClaims) -> Self {
        Self {
            act: Some(Actor {
                sub: upstream.sub.clone(),
                cap: Some(upstream.cap.clone()),
                agent_id: Some(upstream.aud.clone()),
                groups: match &upstream.act {
                    // The original subject's groups live on the innermost hop.
                    None => upstream_groups(upstream),
                    Some(_) => Vec::new(),
                },
                act: upstream.act.clone().map(Box::new),
            }),
            depth: upstream.depth.unwrap_or(1).saturating_add(1),
            budget: upstream.budget.clone(),
            groups: Vec::new(),
        }
    }

    /// Whether `other` is the same chain, depth, budget ledger and groups
    /// (an assertion signed for one serves the other).
    pub fn same_chain(&self, other: &Delegation) -> bool {
        self.act == other.act
            && self.depth == other.depth
            && self.budget.as_ref().map(|budget| &budget.id) == other.budget.as_ref().map(|budget| &budget.id)
            && self.groups == other.groups
    }

    /// The hops before this one, latest first.
    pub fn hops(&self) -> impl Iterator<Item = &Actor> {
        std::iter::successors(self.act.as_ref(), |actor| actor.act.as_deref())
    }

    /// The original subject: the innermost hop's caller, or `caller` itself for a direct call.
    pub fn original_subject<'a>(&'a self, caller: &'a str) -> &'a str {
        self.hops().last().map_or(caller, |actor| actor.sub.as_str())
    }

    /// The original subject's groups.
    pub fn subject_groups(&self) -> &[String] {
        match self.hops().last() {
            Some(actor) => &actor.groups,
            None => &self.groups,
        }
    }

    /// Whether `name` called anywhere before this hop (a `via:` rule).
    pub fn passed_through(&self, name: &str) -> bool {
        self.hops().any(|actor| actor.sub == name)
    }

    /// Whether the chain already reached `capability` on the instance `agent_id` (a loop).
    pub fn visited(&self, capability: &str, agent_id: &str) -> bool {
        self.hops()
            .any(|actor| actor.cap.as_deref() == Some(capability) && actor.agent_id.as_deref() == Some(agent_id))
    }

    /// The chain as names, original subject first, then each agent it passed
    /// through, `caller` last (what SDKs expose as `ctx.chain`).
    pub fn names(&self, caller: &str) -> Vec<String> {
        let mut names: Vec<String> = self.hops().map(|actor| actor.sub.clone()).collect();
        names.reverse();
        names.push(caller.to_string());
        names
    }
}

/// The groups a direct call's assertion carries for its subject (kept on
/// the innermost hop as the chain grows).
fn upstream_groups(upstream: &AssertionClaims) -> Vec<String> {
    upstream.groups.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assertion(sub: &str, cap: &str, aud: &str, upstream: Option<&Delegation>) -> AssertionClaims {
        AssertionClaims {
            sub: sub.into(),
            cap: cap.into(),
            aud: aud.into(),
            act: upstream.and_then(|delegation| delegation.act.clone()),
            depth: upstream.map(|delegation| delegation.depth),
            ..AssertionClaims::default()
        }
    }

    #[test]
    fn a_chain_grows_one_hop_per_onward_call() {
        // user → intent.parse (a1) → order.query (b1) → payment.check.
        let mut to_a = assertion("user", "intent.parse", "a1", None);
        to_a.groups = vec!["staff".into()];
        let from_a = Delegation::onward(&to_a);
        assert_eq!(from_a.subject_groups(), ["staff"]);
        assert_eq!(from_a.depth, 2);
        assert_eq!(from_a.original_subject("intent_parser"), "user");
        assert_eq!(from_a.names("intent_parser"), ["user", "intent_parser"]);
        let to_b = assertion("intent_parser", "order.query", "b1", Some(&from_a));
        let from_b = Delegation::onward(&to_b);
        assert_eq!(from_b.depth, 3);
        assert_eq!(from_b.original_subject("order_query"), "user");
        assert_eq!(from_b.names("order_query"), ["user", "intent_parser", "order_query"]);
        assert!(from_b.passed_through("intent_parser") && from_b.passed_through("user"));
        assert!(!from_b.passed_through("order_query"), "the caller itself is not `via`");
        assert!(from_b.visited("order.query", "b1") && from_b.visited("intent.parse", "a1"));
        assert!(!from_b.visited("order.query", "b2"));
        assert_eq!(from_b.subject_groups(), ["staff"], "the subject's groups stay with it");
        // RFC 8693 nesting: the outermost `act` is the latest hop.
        let act = from_b.act.as_ref().unwrap();
        assert_eq!(
            (act.sub.as_str(), act.act.as_ref().unwrap().sub.as_str()),
            ("intent_parser", "user")
        );
        let direct = Delegation::direct(vec!["staff".into()]);
        assert_eq!((direct.depth, direct.original_subject("me")), (1, "me"));
        assert_eq!(direct.subject_groups(), ["staff"]);
        assert_eq!(direct.names("me"), ["me"]);
    }
}
