//! libFuzzer entry of the `chat-template` target: [`fuzz::chat_template`] (run it with `scripts/fuzz chat-template SECONDS`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::chat_template(data));
