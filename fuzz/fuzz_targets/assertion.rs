//! libFuzzer target `assertion`: see [`agent_reach_fuzz::assertion`] for what it holds.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_reach_fuzz::assertion::run(data));
