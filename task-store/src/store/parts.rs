//! Several scripts run as one: one round trip and one `EVALSHA` for a change
//! that spans scripts (on a cluster, of one slot: a run and its held task
//! share their lane; on one server, any). Each script is written once, as
//! the text it always was; here it becomes a local function of its own
//! `KEYS` and `ARGV` ([`function`]), and a [`Part`] carries the keys and
//! arguments one call of it gets. The combined script's own text decides
//! which parts run, from the answers of those before.

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, Script, ScriptInvocation, ToRedisArgs};

use super::{unavailable, TaskStoreError};

/// The parts' keys and arguments as a combined script reads them (`parts()`):
/// `ARGV[1]` the number of parts, then each part's keys' and arguments'
/// counts, then every part's arguments in order; `KEYS` every part's keys in
/// order. Answers `{{keys, args}, …}`.
pub(super) const PARTS: &str = r#"
local function parts()
  local n = tonumber(ARGV[1])
  local out, k, a = {}, 1, 2 + 2 * n
  for i = 1, n do
    local nk, na = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
    local keys, args = {}, {}
    for j = 0, nk - 1 do keys[j + 1] = KEYS[k + j] end
    for j = 0, na - 1 do args[j + 1] = ARGV[a + j] end
    out[i] = {keys, args}
    k, a = k + nk, a + na
  end
  return out
end
"#;

/// `body`, a script's whole text, as a local function `name(KEYS, ARGV)`
/// answering what the script answers.
pub(super) fn function(name: &str, body: &str) -> String {
    format!("local function {name}(KEYS, ARGV)\n{body}\nend\n")
}

/// One script's keys and arguments.
#[derive(Debug, Default)]
pub(super) struct Part {
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
}

impl Part {
    pub(super) fn key(&mut self, key: impl Into<String>) -> &mut Self {
        self.keys.push(key.into());
        self
    }

    /// Adds `arg`, as many arguments as it makes (a list: one each).
    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// This part alone: `script` (the text it was written for) with its keys and arguments.
    pub(super) fn invocation<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let mut invocation = script.prepare_invoke();
        for key in &self.keys {
            invocation.key(key);
        }
        for arg in &self.args {
            invocation.arg(arg.as_slice());
        }
        invocation
    }
}

/// Runs `script` with `parts` (one: the script it was written for; more: a
/// combined script, [`invocation`]); a failure is the store's outage.
pub(super) async fn invoke<T: FromRedisValue>(
    script: &Script,
    parts: &[&Part],
    connection: &mut impl ConnectionLike,
) -> Result<T, TaskStoreError> {
    let invocation = match parts {
        [part] => part.invocation(script),
        parts => invocation(script, parts),
    };
    invocation.invoke_async(connection).await.map_err(unavailable)
}

/// `parts` as `script`, a combined script starting with [`PARTS`], reads them.
pub(super) fn invocation<'s>(script: &'s Script, parts: &[&Part]) -> ScriptInvocation<'s> {
    let mut invocation = script.prepare_invoke();
    invocation.arg(parts.len());
    for part in parts {
        invocation.arg(part.keys.len()).arg(part.args.len());
    }
    for part in parts {
        for key in &part.keys {
            invocation.key(key);
        }
        for arg in &part.args {
            invocation.arg(arg.as_slice());
        }
    }
    invocation
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_counts_a_list_as_one_argument_each() {
        let mut part = Part::default();
        part.key("k").arg("a").arg(vec!["b", "c"]).arg(7_u64);
        assert_eq!(part.keys, vec!["k".to_string()]);
        assert_eq!(
            part.args,
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"7".to_vec()]
        );
    }

    #[test]
    fn a_script_becomes_a_function_of_its_own_keys_and_arguments() {
        let text = function("move", "return {KEYS[1], ARGV[1]}");
        assert!(text.starts_with("local function move(KEYS, ARGV)\n"));
        assert!(text.ends_with("\nend\n"));
    }
}
