//! libFuzzer entry of the `router-stream` target: [`fuzz::router_stream`] (run it with `scripts/fuzz router-stream SECONDS`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::router_stream(data));
