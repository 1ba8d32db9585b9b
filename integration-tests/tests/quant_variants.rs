//! The default SmolLM2 file requantized by llama.cpp's `llama-quantize` to Q4_K_M, Q5_K_M, Q6_K,
//! Q8_0, Q5_0 and Q5_1 (`fixtures/smollm2-quants.json`): through a real worker and router, every
//! reference prompt's 20 greedy ids equal those of an independent float32 forward pass over the same
//! file's weights.
//!
//! Ignored in CI (`cargo test` without `--ignored`): the files are made by
//! `scripts/check-smollm2-quants`, which builds llama-quantize (minutes), checks every file's sha256
//! against the fixture and runs this test with `QUANTS_DIR` set.

use std::path::PathBuf;
use std::time::Duration;

use inference_proto::public::GenerateRequest;
use integration_tests::{connect_ready, generate, start_router, start_worker};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the requantized files: run scripts/check-smollm2-quants"]
async fn every_smollm2_variant_is_token_exact() {
    let dir = PathBuf::from(
        std::env::var("QUANTS_DIR").expect("QUANTS_DIR (set by scripts/check-smollm2-quants)"),
    );
    let fixture: Value =
        serde_json::from_str(include_str!("../../fixtures/smollm2-quants.json")).unwrap();
    let texts = &fixture["prompt_texts"];
    let mut failures = Vec::new();
    let mut checked = 0;
    for (variant, v) in fixture["variants"].as_object().unwrap() {
        let file = dir.join(v["file"].as_str().unwrap());
        assert!(file.exists(), "{} is missing", file.display());
        let (_worker, worker_addr) = start_worker(&file).await;
        let (_router, router_addr) = start_router(&[&worker_addr], &[]).await;
        let mut client = connect_ready(&router_addr, Duration::from_secs(60)).await;
        for p in v["prompts"].as_array().unwrap() {
            let name = p["name"].as_str().unwrap();
            let want: Vec<u32> = serde_json::from_value(p["greedy_ids"].clone()).unwrap();
            let prompt_ids: Vec<u32> = serde_json::from_value(p["prompt_ids"].clone()).unwrap();
            let request = GenerateRequest {
                prompt: texts[name].as_str().unwrap().to_string(),
                max_new_tokens: Some(want.len() as u32),
                ignore_eos: true,
                ..Default::default()
            };
            let g = generate(&mut client, request).await.expect("generation");
            let usage = g.usage.expect("usage");
            checked += 1;
            if usage.prompt_tokens as usize != prompt_ids.len() || g.token_ids != want {
                let same = g
                    .token_ids
                    .iter()
                    .zip(&want)
                    .take_while(|(a, b)| a == b)
                    .count();
                failures.push(format!(
                    "{variant} {name}: {} prompt tokens (want {}); ids agree for {same} of {} \
                     (margin there: {})\n  got  {:?}\n  want {:?}",
                    usage.prompt_tokens,
                    prompt_ids.len(),
                    want.len(),
                    p["margins"][same],
                    g.token_ids,
                    want
                ));
            }
        }
        eprintln!(
            "{variant}: {} prompts checked",
            v["prompts"].as_array().unwrap().len()
        );
    }
    assert_eq!(checked, 48, "6 variants x 8 prompts");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
