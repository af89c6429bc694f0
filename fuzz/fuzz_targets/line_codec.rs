#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| buzz_agent_core::fuzzing::line_codec(data));
