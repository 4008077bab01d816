//! What `acl.yaml` says about delegation chains (DESIGN §9, docs/design.md
//! §3.15): a permission's `via:` (reached only through these callers) and
//! `subjects:` (only on behalf of these original subjects, or members of
//! these groups), and the `chains:` section's per-capability `max_depth`.

use serde::Deserialize;

use super::{any_matches, check_agent_name, Acl, Pattern};
use crate::delegation::Delegation;

/// The deepest chain a `chains:` entry may allow (as `--max-depth`).
pub const MAX_DEPTH_LIMIT: u32 = 64;

/// One `chains:` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawChainRule {
    capability: String,
    max_depth: u32,
}

/// Who a permission is for beyond its caller: an original subject by name, or a group of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    Name(String),
    Group(String),
}

/// One `permissions` entry: what its caller may call, and within which chains.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Permission {
    pub(super) allow: Vec<Pattern>,
    /// Empty: any chain, or none. Else the chain must have passed through one of them.
    pub(super) via: Vec<String>,
    /// Empty: on anyone's behalf. Else only for these original subjects.
    pub(super) subjects: Vec<Subject>,
}

impl Permission {
    /// The entry of `caller` allowing `allow`, its `via:` and `subjects:`
    /// checked; problems are pushed onto `problems`.
    pub(super) fn parse(
        caller: &str,
        allow: Vec<Pattern>,
        via: &[String],
        subjects: &[String],
        problems: &mut Vec<String>,
    ) -> Self {
        for name in via {
            if let Err(why) = check_agent_name(name) {
                problems.push(format!("permissions of `{caller}`: via `{name}`: {why}"));
            }
        }
        let subjects = subjects
            .iter()
            .filter_map(|subject| match subject.strip_prefix("group:") {
                Some(group) if !group.is_empty() && group.len() <= 256 => Some(Subject::Group(group.to_string())),
                Some(_) => {
                    problems.push(format!(
                        "permissions of `{caller}`: subject `{subject}`: a group name is 1..=256 characters"
                    ));
                    None
                }
                None => {
                    if let Err(why) = check_agent_name(subject) {
                        problems.push(format!(
                            "permissions of `{caller}`: subject `{subject}`: {why} (or `group:NAME`)"
                        ));
                    }
                    Some(Subject::Name(subject.clone()))
                }
            })
            .collect();
        Self {
            allow,
            via: via.to_vec(),
            subjects,
        }
    }

    /// Its patterns as written, each with its chain conditions, if any
    /// (`payment.check (via intent_parser; subjects alice, group:staff)`).
    pub(super) fn rule_texts(&self) -> impl Iterator<Item = String> + '_ {
        let mut conditions = Vec::new();
        if !self.via.is_empty() {
            conditions.push(format!("via {}", self.via.join(", ")));
        }
        if !self.subjects.is_empty() {
            let subjects: Vec<String> = self
                .subjects
                .iter()
                .map(|subject| match subject {
                    Subject::Name(name) => name.clone(),
                    Subject::Group(group) => format!("group:{group}"),
                })
                .collect();
            conditions.push(format!("subjects {}", subjects.join(", ")));
        }
        let suffix = if conditions.is_empty() {
            String::new()
        } else {
            format!(" ({})", conditions.join("; "))
        };
        self.allow.iter().map(move |pattern| format!("{pattern}{suffix}"))
    }

    /// Whether this entry lets `caller` call `capability` within `delegation`.
    pub(super) fn allows(&self, capability: &str, delegation: &Delegation, caller: &str) -> bool {
        any_matches(&self.allow, capability)
            && (self.via.is_empty() || self.via.iter().any(|name| delegation.passed_through(name)))
            && (self.subjects.is_empty() || {
                let subject = delegation.original_subject(caller);
                let groups = delegation.subject_groups();
                self.subjects.iter().any(|wanted| match wanted {
                    Subject::Name(name) => name == subject,
                    Subject::Group(group) => groups.iter().any(|held| held == group),
                })
            })
    }
}

// === The policy's chain rules ===

impl Acl {
    /// May `caller` invoke `capability` on its own behalf, with no chain (router)?
    pub fn may_call(&self, caller: &str, capability: &str) -> bool {
        self.may_call_in(caller, capability, &Delegation::direct(Vec::new()))
    }

    /// May `caller` invoke `capability` within `delegation` (its chain: `via:`
    /// and `subjects:` entries apply)? Any entry of the caller, or of `*`, that
    /// allows it is enough.
    pub fn may_call_in(&self, caller: &str, capability: &str, delegation: &Delegation) -> bool {
        [caller, "*"]
            .iter()
            .filter_map(|who| self.permissions.get(*who))
            .flatten()
            .any(|permission| permission.allows(capability, delegation, caller))
    }

    /// The `max_depth` acl.yaml's `chains:` sets for chains reaching
    /// `capability` (the first matching entry), if any.
    pub fn max_depth_for(&self, capability: &str) -> Option<u32> {
        self.chain_depths
            .iter()
            .find(|(pattern, _)| pattern.matches(capability))
            .map(|(_, max_depth)| *max_depth)
    }
}

/// The `chains:` entries, checked: (capability pattern, max_depth), in file order.
pub(super) fn parse_chain_rules(raw: &[RawChainRule], problems: &mut Vec<String>) -> Vec<(Pattern, u32)> {
    let mut rules = Vec::new();
    for rule in raw {
        if !(1..=MAX_DEPTH_LIMIT).contains(&rule.max_depth) {
            problems.push(format!(
                "chains: `{}`: max_depth {} must be 1..={MAX_DEPTH_LIMIT}",
                rule.capability, rule.max_depth
            ));
            continue;
        }
        match Pattern::parse(&rule.capability) {
            Ok(pattern) => rules.push((pattern, rule.max_depth)),
            Err(why) => problems.push(format!("chains: {why}")),
        }
    }
    rules
}

#[cfg(test)]
mod tests {
    use crate::assertion::AssertionClaims;
    use crate::{Acl, Delegation};

    /// The delegation of the call the last of `hops` (capability, instance,
    /// the caller it serves next) makes: a chain begun by `subject` with
    /// `groups`, each hop signed as the router signs it.
    fn chain(subject: &str, groups: &[&str], hops: &[(&str, &str, &str)]) -> Delegation {
        let mut caller = subject.to_string();
        let mut delegation = Delegation::direct(groups.iter().map(|group| group.to_string()).collect());
        for (cap, aud, next) in hops {
            let claims = AssertionClaims {
                sub: caller,
                cap: cap.to_string(),
                aud: aud.to_string(),
                act: delegation.act.clone(),
                depth: Some(delegation.depth),
                groups: delegation.groups.clone(),
                ..AssertionClaims::default()
            };
            delegation = Delegation::onward(&claims);
            caller = next.to_string();
        }
        delegation
    }

    const POLICY: &str = r#"
version: 1
permissions:
  - caller: order_query
    allow: [payment.check]
    via: [intent_parser]
  - caller: intent_parser
    allow: [order.query]
    subjects: [alice, "group:staff"]
  - caller: alice
    allow: [intent.parse]
chains:
  - capability: payment.*
    max_depth: 3
  - capability: "*"
    max_depth: 20
"#;

    #[test]
    fn via_admits_only_calls_that_passed_through_a_named_caller() {
        let acl = Acl::parse(POLICY).unwrap();
        assert!(
            !acl.may_call("order_query", "payment.check"),
            "a direct call is not `via` anyone"
        );
        let through_parser = chain(
            "alice",
            &[],
            &[
                ("intent.parse", "ip-1", "intent_parser"),
                ("order.query", "oq-1", "order_query"),
            ],
        );
        assert!(acl.may_call_in("order_query", "payment.check", &through_parser));
        let around_parser = chain("alice", &[], &[("order.query", "oq-1", "order_query")]);
        assert!(!acl.may_call_in("order_query", "payment.check", &around_parser));
    }

    #[test]
    fn subjects_admit_only_chains_begun_by_a_named_subject_or_group_member() {
        let acl = Acl::parse(POLICY).unwrap();
        let by = |subject: &str, groups: &[&str]| chain(subject, groups, &[("intent.parse", "ip-1", "intent_parser")]);
        assert!(acl.may_call_in("intent_parser", "order.query", &by("alice", &[])));
        assert!(!acl.may_call_in("intent_parser", "order.query", &by("bob", &[])));
        assert!(acl.may_call_in("intent_parser", "order.query", &by("bob", &["staff"])));
        assert!(!acl.may_call_in("intent_parser", "order.query", &by("bob", &["guests"])));
        assert!(
            !acl.may_call("intent_parser", "order.query"),
            "on its own behalf, intent_parser is no listed subject"
        );
        // The innermost hop keeps the groups however long the chain grows.
        let deep = chain(
            "carol",
            &["staff"],
            &[("a.b", "x-1", "x"), ("c.d", "y-1", "intent_parser")],
        );
        assert_eq!(deep.subject_groups(), ["staff"]);
        assert!(acl.may_call_in("intent_parser", "order.query", &deep));
    }

    #[test]
    fn chains_name_a_max_depth_per_capability_first_match_wins() {
        let acl = Acl::parse(POLICY).unwrap();
        assert_eq!(acl.max_depth_for("payment.check"), Some(3));
        assert_eq!(acl.max_depth_for("order.query"), Some(20));
        assert_eq!(Acl::parse("version: 1\n").unwrap().max_depth_for("order.query"), None);
    }

    #[test]
    fn nonsense_in_via_subjects_and_chains_is_reported() {
        let problems = Acl::parse(
            "version: 1\npermissions:\n  - caller: a\n    allow: [x.y]\n    via: [\"Not A Name\"]\n    subjects: [\"group:\", \"Bad Subject\"]\nchains:\n  - capability: x.*\n    max_depth: 0\n  - capability: \"X\"\n    max_depth: 4\n  - capability: y.z\n    max_depth: 65\n",
        )
        .unwrap_err();
        assert_eq!(problems.len(), 6, "{problems:#?}");
        assert!(
            Acl::parse("version: 1\nchains:\n  - capability: x.y\n").is_err(),
            "max_depth is required"
        );
    }
}
