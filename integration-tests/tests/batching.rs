//! Batch invariance and prefix caching through real processes (tiny random-weight model): a request's
//! tokens do not depend on what else runs beside it, on preemptions, or on the prefix cache, in
//! `numerics = exact` and in `fast`.

use inference_proto::public::{ChatMessage, GenerateRequest, ModelInfoRequest};
use integration_tests::{generate, generate_concurrently, greedy, tiny_model, Cluster, Generation};

/// 32 requests with mixed prompt lengths, output lengths and sampling parameters.
fn mixed_requests() -> Vec<GenerateRequest> {
    let words = [
        "the", "cat", "sat", "on", "a", "mat", "while", "it", "rained", "hard",
    ];
    (0..32)
        .map(|i| {
            let prompt: Vec<&str> = (0..(3 + i * 5 % 40))
                .map(|j| words[(i + j * 7) % 10])
                .collect();
            let mut r = greedy(&prompt.join(" "), 8 + (i * 13 % 48) as u32);
            if i % 3 == 1 {
                r.temperature = 0.8;
                r.top_p = Some(0.9);
                r.seed = Some(1000 + i as u64);
            }
            if i % 3 == 2 {
                r.temperature = 1.2;
                r.top_k = 20;
                r.seed = Some(7 + i as u64);
            }
            r
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_and_preempted_requests_equal_their_solo_runs() {
    assert_batch_invariant("exact").await;
}

/// `numerics = fast` (8-bit activations, integer dot products: the tiny model's Q8_0 embeddings
/// and LM head and Q4_1 layer) keeps the contract: 32 concurrent requests equal their solo runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_and_preempted_requests_equal_their_solo_runs_in_fast_numerics() {
    assert_batch_invariant("fast").await;
}

/// The 32 [`mixed_requests`] (greedy and seeded sampling) on workers with `--numerics NUMERICS`:
/// all at once, with plenty of KV blocks and with a pool small enough to force preemptions (and
/// chunked prefills), each gives bitwise the token ids and text of its solo run (one at a time,
/// prefix cache off).
async fn assert_batch_invariant(numerics: &str) {
    let (_dir, model) = tiny_model(11);
    let requests = mixed_requests();

    // Alone, one at a time, prefix cache off.
    let solo_cluster = Cluster::start_with(
        &model,
        &["--prefix-caching", "false", "--numerics", numerics],
    )
    .await;
    let mut client = solo_cluster.client().await;
    let info = client
        .model_info(ModelInfoRequest::default())
        .await
        .unwrap();
    assert_eq!(info.get_ref().numerics, numerics, "the mode that runs");
    let mut solo = Vec::new();
    for r in &requests {
        solo.push(generate(&mut client, r.clone()).await.unwrap());
    }
    drop(solo_cluster);

    // All 32 at once with plenty of KV blocks, then with a pool small enough to force preemptions
    // (and small steps, so prompts are prefilled in chunks).
    for worker_args in [
        &["--max-batch-tokens", "512", "--numerics", numerics][..],
        &[
            "--kv-cache-blocks",
            "40",
            "--max-batch-tokens",
            "48",
            "--numerics",
            numerics,
        ][..],
    ] {
        let cluster = Cluster::start_with(&model, worker_args).await;
        let client = cluster.client().await;
        let batched: Vec<Generation> = generate_concurrently(&client, requests.iter().cloned())
            .await
            .into_iter()
            .map(|g| g.expect("generation"))
            .collect();
        for (i, (got, want)) in batched.iter().zip(&solo).enumerate() {
            assert_eq!(got.token_ids, want.token_ids, "{worker_args:?} request {i}");
            assert_eq!(got.text, want.text, "{worker_args:?} request {i}");
        }
        let stats = cluster.worker_stats().await;
        if worker_args.contains(&"40") {
            assert!(stats.preemptions > 0, "expected preemptions: {stats:?}");
        }
        assert_eq!(stats.kv_blocks_used, 0, "every block returned: {stats:?}");
        assert_eq!(stats.running_sequences + stats.waiting_sequences, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_chat_request_reuses_the_shared_system_prompt() {
    let (_dir, model) = tiny_model(12);
    let system = ChatMessage {
        role: "system".into(),
        content: "You are a terse assistant who answers every question about the weather \
                  in exactly one short sentence, without any greeting."
            .into(),
        ..Default::default()
    };
    let chat = |question: &str| GenerateRequest {
        messages: vec![
            system.clone(),
            ChatMessage {
                role: "user".into(),
                content: question.into(),
                ..Default::default()
            },
        ],
        max_new_tokens: Some(12),
        ignore_eos: true,
        ..Default::default()
    };
    let first = chat("Will it rain today?");
    let second = chat("Is it windy?");

    let cached = Cluster::start(&model).await;
    let mut client = cached.client().await;
    generate(&mut client, first.clone()).await.unwrap();
    let before = cached.worker_stats().await;
    let with_cache = generate(&mut client, second.clone()).await.unwrap();
    let after = cached.worker_stats().await;
    let reused = after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens;
    assert!(
        reused >= 16,
        "the shared system prompt's blocks were reused: {after:?}"
    );
    assert!(after.prefix_cache_hit_rate > 0.0);

    let uncached = Cluster::start_with(&model, &["--prefix-caching", "false"]).await;
    let mut client = uncached.client().await;
    let without_cache = generate(&mut client, second).await.unwrap();
    assert_eq!(uncached.worker_stats().await.prefix_cache_hit_tokens, 0);
    assert_eq!(with_cache.token_ids, without_cache.token_ids);
    assert_eq!(with_cache.text, without_cache.text);
}
