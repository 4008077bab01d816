//! libFuzzer target `registration`: see [`agent_reach_fuzz::registration`] for what it holds.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_reach_fuzz::registration::run(data));
