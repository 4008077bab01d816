//! libFuzzer target `acl`: see [`agent_reach_fuzz::acl`] for what it holds.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_reach_fuzz::acl::run(data));
