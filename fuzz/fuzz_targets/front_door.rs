//! libFuzzer target `front_door`: see [`agent_reach_fuzz::front_door`] for what it holds.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_reach_fuzz::front_door::run(data));
