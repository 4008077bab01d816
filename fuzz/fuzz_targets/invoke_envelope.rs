//! libFuzzer target `invoke_envelope`: see [`agent_reach_fuzz::invoke_envelope`] for what it holds.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_reach_fuzz::invoke_envelope::run(data));
