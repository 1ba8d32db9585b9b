//! libFuzzer entry of the `openai-json` target: [`fuzz::openai_json`] (run it with `scripts/fuzz openai-json SECONDS`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::openai_json(data));
