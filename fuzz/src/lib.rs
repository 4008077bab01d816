//! Fuzz targets for the parsers that take untrusted input (issue 20, point
//! 6), one module per target, each a `run(data)` that feeds the real code and
//! asserts what must hold for every input: no panic, a refusal is an error
//! value with its stable code, an acceptance keeps the parser's promises.
//!
//! The same functions are libFuzzer targets (`fuzz_targets/`, feature
//! `libfuzzer`, run by `scripts/fuzz.sh`) and a plain test
//! (`tests/corpus.rs`: the seed corpus, every regression input and seeded
//! mutations of them), so `cargo test` keeps every crash found fixed.
//! `docs/fuzzing.md` says how to run them and what they found.

pub mod acl;
pub mod assertion;
pub mod console_seal;
pub mod front_door;
pub mod invoke_envelope;
pub mod registration;
pub mod token;
pub mod workflow;

mod support;

/// A target: what it is given is one input, whatever it finds is a panic.
pub type Target = fn(&[u8]);

/// Every target, by the name of its binary and its corpus folder.
pub const TARGETS: [(&str, Target); 8] = [
    ("front_door", front_door::run),
    ("invoke_envelope", invoke_envelope::run),
    ("registration", registration::run),
    ("acl", acl::run),
    ("token", token::run),
    ("assertion", assertion::run),
    ("console_seal", console_seal::run),
    ("workflow", workflow::run),
];

pub use support::{assertion_key, HS256_SECRET};
