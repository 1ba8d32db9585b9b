//! libFuzzer entry of the `constraint` target: [`fuzz::constraint`] (run it with `scripts/fuzz constraint SECONDS`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::constraint(data));
