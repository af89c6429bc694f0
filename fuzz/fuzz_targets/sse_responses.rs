#![no_main]
use buzz_agent_core::fuzzing::{Route, sse_decoder};
libfuzzer_sys::fuzz_target!(|data: &[u8]| sse_decoder(Route::OpenAiResponses, data));
