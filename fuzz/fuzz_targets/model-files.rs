//! libFuzzer entry of the `model-files` target: [`fuzz::model_files`] (run it with `scripts/fuzz model-files SECONDS`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::model_files(data));
