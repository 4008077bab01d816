//! The package's integration tests, linked as one test binary: every other
//! file in this directory is a module here, so a clean test build links one
//! binary instead of one per file (each is ~115 MB; one per file filled a CI
//! disk). Files that install a process-wide tracing subscriber stay binaries
//! of their own, listed in Cargo.toml; `every_test_file_runs` below fails when a
//! file is in neither place.

mod support;

mod durability;
mod engine;
mod preemption;
mod runs;

#[test]
fn every_test_file_runs() {
    agent_reach_testkit::assert_every_test_file_runs(env!("CARGO_MANIFEST_DIR"));
}
