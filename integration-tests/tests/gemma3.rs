//! Gemma 3 270M Q4_K_M end to end through real router and CPU worker processes: the reference
//! prompts of `fixtures/gemma3-270m.json` (an independent float32 implementation) token-exact,
//! ids and text, and 32 concurrent requests (sliding window included) giving each one's solo
//! tokens.

use inference_proto::public::GenerateRequest;
use integration_tests::{
    check_reference_prompt, generate, generate_concurrently, greedy, Cluster, Generation,
};

use serde_json::Value;

fn reference() -> Value {
    let text = include_str!("../../fixtures/gemma3-270m.json");
    serde_json::from_str(text).expect("gemma3-270m.json is valid JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_prompts_are_token_exact() {
    let cluster = Cluster::start(&integration_tests::gemma3_model()).await;
    let mut client = cluster.client().await;
    let reference = reference();
    let prompts = reference["prompts"].as_array().expect("prompts");
    assert_eq!(prompts.len(), 6);
    for prompt in prompts {
        // Every Gemma prompt has its text in the fixture: the check compares it.
        assert!(prompt["greedy_text"].is_string(), "{prompt}");
        check_reference_prompt(&mut client, prompt).await;
    }
}

/// 32 requests: the reference prompts (the 634-token one twice, so it runs past the 512-token
/// window beside others) and shortened variants, greedy and seeded sampling.
fn requests() -> Vec<GenerateRequest> {
    let reference = reference();
    let texts: Vec<&str> = reference["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["text"].as_str().unwrap())
        .collect();
    (0..32)
        .map(|i| {
            let text = texts[i % texts.len()];
            // Drop a few words from the end of the later copies.
            let words: Vec<&str> = text.split(' ').collect();
            let keep = words.len().saturating_sub(i / texts.len()).max(1);
            let mut r = greedy(&words[..keep].join(" "), 6);
            if i % 4 == 3 {
                r.temperature = 0.9;
                r.seed = Some(100 + i as u64);
            }
            r
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_concurrent_requests_equal_their_solo_runs() {
    let model = integration_tests::gemma3_model();
    let requests = requests();
    let solo_cluster = Cluster::start_with(&model, &["--prefix-caching", "false"]).await;
    let mut client = solo_cluster.client().await;
    let mut solo = Vec::new();
    for r in &requests {
        solo.push(generate(&mut client, r.clone()).await.unwrap());
    }
    drop(solo_cluster);

    // All at once, prompts prefilled in chunks of at most 256 tokens beside the others' decodes.
    let cluster = Cluster::start_with(&model, &["--max-batch-tokens", "256"]).await;
    let client = cluster.client().await;
    let batched: Vec<Generation> = generate_concurrently(&client, requests.iter().cloned())
        .await
        .into_iter()
        .map(|g| g.expect("generation"))
        .collect();
    for (i, (got, want)) in batched.iter().zip(&solo).enumerate() {
        assert_eq!(got.token_ids, want.token_ids, "request {i}");
        assert_eq!(got.text, want.text, "request {i}");
    }
    let stats = cluster.worker_stats().await;
    assert_eq!(stats.kv_blocks_used, 0, "every block returned: {stats:?}");
}
