//! libFuzzer target `token`: see [`agent_reach_fuzz::token`] for what it holds.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_reach_fuzz::token::run(data));
