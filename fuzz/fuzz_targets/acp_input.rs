#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| buzz_agent_core::fuzzing::acp_input(data));
