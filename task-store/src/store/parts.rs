//! Several scripts run as one: one round trip and one `EVALSHA` for a change
//! that spans scripts (on a cluster, of one slot: a run and its held task
//! share their lane; on one server, any). Each script is written once, as
//! the text it always was; here it becomes a local function of its own
//! `KEYS` and `ARGV` ([`function`]), and a [`Part`] carries the keys and
//! arguments one call of it gets. The combined script's own text decides
//! which parts run, from the answers of those before.

use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, ErrorKind, FromRedisValue, Script, ServerErrorKind, ToRedisArgs};

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

/// One script's keys and arguments. The arguments are written once, into
/// one buffer (a `Cmd` used as one: no allocation per argument), and copied
/// once more into the `EVALSHA` that carries them ([`command`]).
#[derive(Debug, Default)]
pub(super) struct Part {
    keys: Vec<String>,
    args: Cmd,
}

impl Part {
    pub(super) fn key(&mut self, key: impl Into<String>) -> &mut Self {
        self.keys.push(key.into());
        self
    }

    /// Adds `arg`, as many arguments as it makes (a list: one each).
    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args.arg(arg);
        self
    }

    /// The arguments, in order. Only `arg` writes them, and it never writes
    /// a cursor, so every one is a plain argument (`arg_count` counts them).
    fn args(&self) -> impl Iterator<Item = &[u8]> {
        self.args.args_iter().filter_map(|arg| match arg {
            Arg::Simple(bytes) => Some(bytes),
            _ => None,
        })
    }

    fn arg_count(&self) -> usize {
        self.args.args_iter().len()
    }
}

/// Runs `script` with `parts` (one: the script it was written for; more: a
/// combined script, read as [`PARTS`] says); the script is loaded when the
/// server does not know it yet; a failure is the store's outage.
pub(super) async fn invoke<T: FromRedisValue>(
    script: &Script,
    parts: &[&Part],
    connection: &mut impl ConnectionLike,
) -> Result<T, TaskStoreError> {
    let command = command(script, parts);
    match command.query_async(connection).await {
        Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(connection).await.map_err(unavailable)?;
            command.query_async(connection).await.map_err(unavailable)
        }
        answer => answer.map_err(unavailable),
    }
}

/// The `EVALSHA` of `script` with `parts`: one part as the script it was
/// written for reads it; more as a combined script starting with [`PARTS`]
/// reads them.
pub(super) fn command(script: &Script, parts: &[&Part]) -> Cmd {
    let combined = parts.len() != 1;
    let keys: usize = parts.iter().map(|part| part.keys.len()).sum();
    let args: usize = parts.iter().map(|part| part.arg_count()).sum();
    let bytes: usize = parts
        .iter()
        .map(|part| part.keys.iter().map(String::len).sum::<usize>() + part.args().map(<[u8]>::len).sum::<usize>())
        .sum();
    let counts = if combined { 1 + 2 * parts.len() } else { 0 };
    let mut command = Cmd::with_capacity(3 + keys + counts + args, bytes + 64 + 8 * counts);
    command.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    for part in parts {
        for key in &part.keys {
            command.arg(key.as_str());
        }
    }
    if combined {
        command.arg(parts.len());
        for part in parts {
            command.arg(part.keys.len()).arg(part.arg_count());
        }
    }
    for part in parts {
        for arg in part.args() {
            command.arg(arg);
        }
    }
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_counts_a_list_as_one_argument_each() {
        let mut part = Part::default();
        part.key("k").arg("a").arg(vec!["b", "c"]).arg(7_u64);
        assert_eq!(part.keys, vec!["k".to_string()]);
        assert_eq!(part.arg_count(), 4);
        assert_eq!(part.args().collect::<Vec<_>>(), [&b"a"[..], b"b", b"c", b"7"]);
    }

    fn words(command: &Cmd) -> Vec<String> {
        command
            .args_iter()
            .map(|arg| match arg {
                Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<not a plain argument>".to_string(),
            })
            .collect()
    }

    #[test]
    fn one_part_is_the_script_it_was_written_for() {
        let script = Script::new("return 1");
        let mut part = Part::default();
        part.key("k1").key("k2").arg("a").arg(7_u64);
        let hash = script.get_hash().to_string();
        assert_eq!(
            words(&command(&script, &[&part])),
            ["EVALSHA", &hash, "2", "k1", "k2", "a", "7"]
        );
    }

    #[test]
    fn parts_are_counted_then_given_in_order() {
        let script = Script::new("return 1");
        let (mut first, mut second) = (Part::default(), Part::default());
        first.key("k1").arg("a").arg("b");
        second.key("k2").key("k3").arg("c");
        let hash = script.get_hash().to_string();
        assert_eq!(
            words(&command(&script, &[&first, &second])),
            [
                "EVALSHA", &hash, "3", "k1", "k2", "k3", // every key
                "2", "1", "2", "2", "1", // two parts: 1 key 2 args, 2 keys 1 arg
                "a", "b", "c",
            ]
        );
    }

    #[test]
    fn a_script_becomes_a_function_of_its_own_keys_and_arguments() {
        let text = function("move", "return {KEYS[1], ARGV[1]}");
        assert!(text.starts_with("local function move(KEYS, ARGV)\n"));
        assert!(text.ends_with("\nend\n"));
    }
}
