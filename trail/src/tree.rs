//! A collaboration as a tree of hops: who called whom, through which
//! version, how long, what failed.
//!
//! A record's parent is the record it names (`parent_request_id`, known when
//! an agent calls onwards within a call the router forwarded to it). Without
//! one, a call whose caller is an agent hangs under that agent's most recent
//! call of the same trace that was still running when it arrived; failing
//! that, it is a root.

use serde::Serialize;

use crate::record::Record;

/// One hop and the hops made while serving it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hop {
    #[serde(flatten)]
    pub record: Record,
    pub children: Vec<Hop>,
}

/// The records as a forest, each level in arrival order.
pub fn build(mut records: Vec<Record>) -> Vec<Hop> {
    records.sort_by(|a, b| (a.at_ms, &a.router, a.seq).cmp(&(b.at_ms, &b.router, b.seq)));
    let parents: Vec<Option<usize>> = (0..records.len()).map(|index| parent_of(&records, index)).collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); records.len()];
    let mut roots = Vec::new();
    for (index, parent) in parents.iter().enumerate() {
        match parent {
            Some(parent) => children[*parent].push(index),
            None => roots.push(index),
        }
    }
    let mut slots: Vec<Option<Record>> = records.into_iter().map(Some).collect();
    roots
        .into_iter()
        .filter_map(|root| assemble(root, &children, &mut slots))
        .collect()
}

fn assemble(index: usize, children: &[Vec<usize>], slots: &mut [Option<Record>]) -> Option<Hop> {
    // Each index is taken once: the parent links form a forest (a parent precedes its child).
    let record = slots[index].take()?;
    let children = children[index]
        .iter()
        .filter_map(|child| assemble(*child, children, slots))
        .collect();
    Some(Hop { record, children })
}

/// The parent of `records[index]` among the records before it (sorted by arrival).
fn parent_of(records: &[Record], index: usize) -> Option<usize> {
    let record = &records[index];
    if let Some(parent) = &record.parent_request_id {
        return records[..index]
            .iter()
            .rposition(|candidate| &candidate.request_id == parent);
    }
    records[..index].iter().rposition(|candidate| {
        candidate.agent.as_deref() == Some(record.caller.as_str())
            && candidate.trace_id == record.trace_id
            && candidate.at_ms as f64 + candidate.duration_ms >= record.at_ms as f64
    })
}

/// The tree as text, one hop a line: `capability@version → agent (caller) 12.3 ms succeeded`.
pub fn render(hops: &[Hop]) -> String {
    let mut out = String::new();
    for hop in hops {
        render_hop(hop, "", "", &mut out);
    }
    out
}

fn render_hop(hop: &Hop, first: &str, rest: &str, out: &mut String) {
    let record = &hop.record;
    let outcome = match &record.code {
        Some(code) => format!("{} {code}", record.status),
        None => record.status.clone(),
    };
    out.push_str(&format!(
        "{first}{}@{} → {} ({} from {}) {:.1} ms, {} attempt(s), {outcome}  [{}]\n",
        record.capability,
        record.capability_version.as_deref().unwrap_or("?"),
        record.agent_id.as_deref().unwrap_or("-"),
        record.door,
        if record.caller.is_empty() {
            "anonymous"
        } else {
            &record.caller
        },
        record.duration_ms,
        record.attempts,
        record.request_id,
    ));
    for (index, child) in hop.children.iter().enumerate() {
        let last = index + 1 == hop.children.len();
        let (branch, continuation) = if last { ("└─ ", "   ") } else { ("├─ ", "│  ") };
        render_hop(child, &format!("{rest}{branch}"), &format!("{rest}{continuation}"), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(request_id: &str, at_ms: u64, caller: &str, agent: &str, capability: &str) -> Record {
        Record {
            request_id: request_id.into(),
            at_ms,
            caller: caller.into(),
            agent: Some(agent.into()),
            capability: capability.into(),
            trace_id: "t-1".into(),
            duration_ms: 50.0,
            status: "succeeded".into(),
            door: "invoke".into(),
            attempts: 1,
            ..Record::default()
        }
    }

    #[test]
    fn a_three_hop_session_is_a_chain_of_three() {
        let records = vec![
            record("c", 1020, "order_query", "payment", "payment.check"),
            record("a", 1000, "user", "intent_parser", "intent.parse"),
            record("b", 1010, "intent_parser", "order_query", "order.query"),
            record("d", 1200, "user", "intent_parser", "intent.parse"),
        ];
        let forest = build(records);
        assert_eq!(forest.len(), 2);
        assert_eq!(forest[0].record.request_id, "a");
        assert_eq!(forest[0].children[0].record.request_id, "b");
        assert_eq!(forest[0].children[0].children[0].record.request_id, "c");
        assert!(forest[1].children.is_empty());
        let text = render(&forest);
        assert!(
            text.contains("└─ order.query@? → - (invoke from intent_parser)"),
            "{text}"
        );
        assert!(text.contains("   └─ payment.check"), "{text}");
    }

    #[test]
    fn a_named_parent_wins() {
        let mut child = record("b", 1500, "someone", "x", "x.y");
        child.parent_request_id = Some("a".into());
        let forest = build(vec![record("a", 1000, "user", "intent_parser", "intent.parse"), child]);
        assert_eq!(forest.len(), 1);
        assert_eq!(forest[0].children.len(), 1);
    }
}
