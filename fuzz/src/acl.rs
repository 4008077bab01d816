//! `acl`: an `acl.yaml` file through `Acl::parse` (`access/src/acl.rs`), the
//! policy every service enforces its part of.
//!
//! Holds, for every input:
//! - parsing never panics; a refused file gives at least one problem, each a
//!   non-empty sentence;
//! - a parsed policy answers `may_call`, `may_provide`, `may_read_field`,
//!   `may_write_field` and `has_context_entry` without panicking, and exactly
//!   as the file says (default deny; a rule for the agent or for `*`; patterns
//!   `*`, `prefix.*` matching whole dotted segments, or an exact name), for
//!   every name the file mentions and names made to sit on the edges of its
//!   patterns.

use agent_reach_access::Acl;
use serde_yaml::Value;

/// Rules as the file states them: (who, patterns) per section.
#[derive(Default)]
struct Stated {
    permissions: Vec<(String, Vec<String>)>,
    providers: Vec<(String, Vec<String>)>,
    read: Vec<(String, Vec<String>)>,
    write: Vec<(String, Vec<String>)>,
}

/// At most this many names are asked about, in each role.
const MAX_NAMES: usize = 48;

pub fn run(data: &[u8]) {
    // The file is read as UTF-8 (`Acl::load`; the reloader refuses other bytes first).
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let acl = match Acl::parse(text) {
        Ok(acl) => acl,
        Err(problems) => {
            assert!(!problems.is_empty(), "refused without a problem");
            assert!(
                problems.iter().all(|problem| !problem.trim().is_empty()),
                "an empty problem: {problems:?}"
            );
            return;
        }
    };
    for (agent, name) in [("stranger", "order.query"), ("*", "*"), ("", "")] {
        let _ = (acl.may_call(agent, name), acl.may_provide(agent, name));
        let _ = (acl.may_read_field(agent, name), acl.may_write_field(agent, name));
    }
    // Names given as other scalars (`caller: 12`, read as the text `12`), YAML
    // tags or merge keys are beyond this plain reading: such files are held to
    // the above only.
    let Some(stated) = stated(text) else {
        return;
    };
    let (agents, names) = names(&stated);
    for agent in &agents {
        let has_entry = stated.read.iter().any(|(who, _)| who == agent || who == "*");
        assert_eq!(acl.has_context_entry(agent), has_entry, "has_context_entry({agent:?})");
        for name in &names {
            assert_eq!(
                acl.may_call(agent, name),
                allowed(&stated.permissions, agent, name),
                "may_call({agent:?}, {name:?})"
            );
            assert_eq!(
                acl.may_provide(agent, name),
                allowed(&stated.providers, agent, name),
                "may_provide({agent:?}, {name:?})"
            );
            assert_eq!(
                acl.may_read_field(agent, name),
                allowed(&stated.read, agent, name),
                "may_read_field({agent:?}, {name:?})"
            );
            assert_eq!(
                acl.may_write_field(agent, name),
                allowed(&stated.write, agent, name),
                "may_write_field({agent:?}, {name:?})"
            );
        }
    }
}

/// The policy as written (DESIGN §5), stated independently of `acl.rs`, for
/// a dotted `name` (the only names asked about: the services check them first).
fn allowed(rules: &[(String, Vec<String>)], agent: &str, name: &str) -> bool {
    let segments: Vec<&str> = name.split('.').collect();
    rules
        .iter()
        .filter(|(who, _)| who == agent || who == "*")
        .flat_map(|(_, patterns)| patterns)
        .any(|pattern| match pattern.strip_suffix(".*") {
            _ if pattern == "*" => true,
            Some(prefix) => {
                let prefix: Vec<&str> = prefix.split('.').collect();
                segments.len() > prefix.len() && segments[..prefix.len()] == prefix[..]
            }
            None => pattern == name,
        })
}

/// The rules of an accepted file, read as plain YAML; `None` if it is not
/// shaped as `Acl::parse` documents.
fn stated(text: &str) -> Option<Stated> {
    let document: Value = serde_yaml::from_str(text).ok()?;
    let mut stated = Stated::default();
    let section = |name: &str| {
        document
            .get(name)
            .and_then(Value::as_sequence)
            .map(Vec::as_slice)
            .unwrap_or_default()
    };
    let strings = |rule: &Value, key: &str| -> Option<Vec<String>> {
        match rule.get(key) {
            None | Some(Value::Null) => Some(Vec::new()),
            Some(value) => value
                .as_sequence()?
                .iter()
                .map(|item| item.as_str().map(str::to_string))
                .collect(),
        }
    };
    let who = |rule: &Value, key: &str| rule.get(key).and_then(Value::as_str).map(str::to_string);
    for rule in section("permissions") {
        stated.permissions.push((who(rule, "caller")?, strings(rule, "allow")?));
    }
    for rule in section("providers") {
        stated.providers.push((who(rule, "agent")?, strings(rule, "provides")?));
    }
    for rule in section("context") {
        let agent = who(rule, "agent")?;
        stated.read.push((agent.clone(), strings(rule, "read")?));
        stated.write.push((agent, strings(rule, "write")?));
    }
    Some(stated)
}

/// Who to ask about (every agent named, and strangers) and what (every name
/// and pattern mentioned, and the names just inside and outside each prefix).
fn names(stated: &Stated) -> (Vec<String>, Vec<String>) {
    let sections = [&stated.permissions, &stated.providers, &stated.read, &stated.write];
    let mut agents: Vec<String> = vec!["stranger".to_string(), "*".to_string()];
    let mut names: Vec<String> = vec!["order.query".to_string(), "order".to_string()];
    for (who, patterns) in sections.into_iter().flatten() {
        agents.push(who.clone());
        for pattern in patterns {
            names.push(pattern.clone());
            if let Some(prefix) = pattern.strip_suffix(".*") {
                for near in [
                    prefix.to_string(),
                    format!("{prefix}."),
                    format!("{prefix}.x"),
                    format!("{prefix}x.y"),
                    format!("{prefix}.x.y"),
                ] {
                    names.push(near);
                }
            } else {
                names.push(format!("{pattern}.x"));
                names.push(format!("{pattern}x"));
            }
        }
    }
    names.retain(|name| agent_reach_access::acl::check_dotted(name).is_ok());
    for list in [&mut agents, &mut names] {
        list.sort();
        list.dedup();
        list.truncate(MAX_NAMES);
    }
    (agents, names)
}
