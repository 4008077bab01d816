//! libFuzzer target `console_seal`: see [`agent_reach_fuzz::console_seal`] for what it holds.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_reach_fuzz::console_seal::run(data));
