//! libFuzzer target `workflow`: see [`agent_reach_fuzz::workflow`] for what it holds.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_reach_fuzz::workflow::run(data));
