//! Every fuzz target, as a plain test: each seed in `fuzz/corpus/<target>/`,
//! each input that once crashed a target (`fuzz/regressions/<target>/`), and
//! seeded mutations of them (the CI smoke: a short, repeatable taste of what
//! `scripts/fuzz.sh` runs for millions of inputs, without instrumentation).

use std::path::{Path, PathBuf};

/// Mutations per target: enough to reach past the seeds, few enough that the
/// whole replay stays a few seconds in a debug build.
const MUTATIONS: usize = 3000;

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut inputs = Vec::new();
    for folder in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(folder).join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a corpus entry").path();
            let bytes = std::fs::read(&path).expect("a corpus file");
            inputs.push((path, bytes));
        }
    }
    inputs.sort();
    inputs
}

/// xorshift64*: repeatable mutations without a dependency.
struct Mutator(u64);

impl Mutator {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound.max(1) as u64) as usize
    }

    /// One to four edits of `seed` (byte flips, interesting bytes, cuts,
    /// repeats, splices from `other`), as libFuzzer's simplest mutators do.
    fn mutate(&mut self, seed: &[u8], other: &[u8]) -> Vec<u8> {
        const INTERESTING: &[u8] = b"\0\r\n \t:.,\"\\{}[]*-0123456789\x7f\xff";
        let mut bytes = seed.to_vec();
        for _ in 0..=self.below(4) {
            let at = self.below(bytes.len() + 1);
            match self.below(6) {
                0 if at < bytes.len() => bytes[at] ^= 1 << self.below(8),
                1 if at < bytes.len() => bytes[at] = INTERESTING[self.below(INTERESTING.len())],
                2 => bytes.insert(at, INTERESTING[self.below(INTERESTING.len())]),
                3 => {
                    let end = (at + self.below(16) + 1).min(bytes.len());
                    bytes.drain(at.min(end)..end);
                }
                4 => {
                    let end = (at + self.below(32) + 1).min(bytes.len());
                    let piece = bytes[at.min(end)..end].to_vec();
                    bytes.splice(at..at, piece);
                }
                _ => {
                    let from = self.below(other.len() + 1);
                    let end = (from + self.below(64) + 1).min(other.len());
                    bytes.splice(at..at, other[from.min(end)..end].iter().copied());
                }
            }
        }
        bytes
    }
}

fn replay(target: &str, run: fn(&[u8])) {
    let inputs = inputs(target);
    assert!(!inputs.is_empty(), "no seeds for `{target}` in fuzz/corpus/{target}/");
    for (path, bytes) in &inputs {
        // A failing input is named, so it can be replayed by itself.
        let outcome = std::panic::catch_unwind(|| run(bytes));
        assert!(outcome.is_ok(), "`{target}` failed on {}", path.display());
    }
    let mut mutator = Mutator(0x9e37_79b9_7f4a_7c15 ^ target.len() as u64);
    for round in 0..MUTATIONS {
        let seed = &inputs[mutator.below(inputs.len())].1;
        let other = &inputs[mutator.below(inputs.len())].1;
        let input = mutator.mutate(seed, other);
        let outcome = std::panic::catch_unwind(|| run(&input));
        assert!(
            outcome.is_ok(),
            "`{target}` failed on mutation {round}: {:?}",
            String::from_utf8_lossy(&input)
        );
    }
}

/// Every target is a test here, a libFuzzer binary (`fuzz/Cargo.toml`, its
/// `fuzz_targets/` file) and a target of the documented command (`scripts/fuzz.sh`).
#[test]
fn every_target_is_tested_here_built_for_libfuzzer_and_run_by_the_script() {
    let names: Vec<&str> = agent_reach_fuzz::TARGETS.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names,
        [
            "front_door",
            "invoke_envelope",
            "registration",
            "acl",
            "token",
            "assertion",
            "console_seal",
            "workflow"
        ]
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("fuzz/Cargo.toml");
    let script = std::fs::read_to_string(root.join("../scripts/fuzz.sh")).expect("scripts/fuzz.sh");
    let listed = script
        .lines()
        .find_map(|line| line.strip_prefix("targets=(")?.strip_suffix(')'))
        .expect("scripts/fuzz.sh lists its targets as `targets=(...)`");
    assert_eq!(listed.split_whitespace().collect::<Vec<_>>(), names);
    for name in names {
        assert!(
            manifest.contains(&format!("name = \"{name}\"\npath = \"fuzz_targets/{name}.rs\"")),
            "no [[bin]] `{name}` in fuzz/Cargo.toml"
        );
        assert!(
            root.join("fuzz_targets").join(format!("{name}.rs")).is_file(),
            "no fuzz_targets/{name}.rs"
        );
    }
}

#[test]
fn front_door() {
    replay("front_door", agent_reach_fuzz::front_door::run);
}

#[test]
fn invoke_envelope() {
    replay("invoke_envelope", agent_reach_fuzz::invoke_envelope::run);
}

#[test]
fn registration() {
    replay("registration", agent_reach_fuzz::registration::run);
}

#[test]
fn acl() {
    replay("acl", agent_reach_fuzz::acl::run);
}

#[test]
fn token() {
    replay("token", agent_reach_fuzz::token::run);
}

#[test]
fn assertion() {
    replay("assertion", agent_reach_fuzz::assertion::run);
}

#[test]
fn console_seal() {
    replay("console_seal", agent_reach_fuzz::console_seal::run);
}

#[test]
fn workflow() {
    replay("workflow", agent_reach_fuzz::workflow::run);
}
