//! What changed between two JSON values, as JSON pointers: a replayed
//! output against the recorded one.

use serde_json::Value;

/// One difference at `pointer` (RFC 6901): what was recorded and what came now
/// (`None`: absent on that side).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Change {
    pub pointer: String,
    pub recorded: Option<Value>,
    pub replayed: Option<Value>,
}

/// Every difference between `recorded` and `replayed`, depth first, members in name order.
pub fn diff(recorded: &Value, replayed: &Value) -> Vec<Change> {
    let mut changes = Vec::new();
    walk(String::new(), Some(recorded), Some(replayed), &mut changes);
    changes
}

fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn walk(pointer: String, recorded: Option<&Value>, replayed: Option<&Value>, changes: &mut Vec<Change>) {
    match (recorded, replayed) {
        (Some(Value::Object(left)), Some(Value::Object(right))) => {
            let mut names: Vec<&String> = left.keys().chain(right.keys()).collect();
            names.sort();
            names.dedup();
            for name in names {
                walk(
                    format!("{pointer}/{}", escape(name)),
                    left.get(name),
                    right.get(name),
                    changes,
                );
            }
        }
        (Some(Value::Array(left)), Some(Value::Array(right))) => {
            for index in 0..left.len().max(right.len()) {
                walk(format!("{pointer}/{index}"), left.get(index), right.get(index), changes);
            }
        }
        (left, right) if left == right => {}
        (left, right) => changes.push(Change {
            pointer,
            recorded: left.cloned(),
            replayed: right.cloned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn changes_are_named_by_pointer() {
        let recorded = json!({"ships_today": true, "items": [1, 2], "note": "a/b", "gone": 1});
        let replayed = json!({"ships_today": false, "items": [1, 2, 3], "note": "a/b", "new": {"x": 1}});
        let changes = diff(&recorded, &replayed);
        let pointers: Vec<&str> = changes.iter().map(|change| change.pointer.as_str()).collect();
        assert_eq!(pointers, ["/gone", "/items/2", "/new", "/ships_today"]);
        assert_eq!(changes[3].recorded, Some(json!(true)));
        assert_eq!(changes[3].replayed, Some(json!(false)));
        assert!(diff(&recorded, &recorded).is_empty());
        assert_eq!(diff(&json!(1), &json!("1"))[0].pointer, "");
    }
}
