//! libFuzzer entry of the `detokenizer` target: [`fuzz::detokenizer`] (run it with `scripts/fuzz detokenizer SECONDS`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::detokenizer(data));
