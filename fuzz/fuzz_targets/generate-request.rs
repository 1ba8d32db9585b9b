//! libFuzzer entry of the `generate-request` target: [`fuzz::generate_request`] (run it with `scripts/fuzz generate-request SECONDS`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::generate_request(data));
