//! libFuzzer entry of the `gguf` target: [`fuzz::gguf`] (run it with `scripts/fuzz gguf SECONDS`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::gguf(data));
