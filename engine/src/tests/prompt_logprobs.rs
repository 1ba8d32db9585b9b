//! Prompt logprobs through the engine loop: chunked prefill, the prefix cache and preemption.

use super::*;
use crate::sampler::score_token;

/// [`SumModel`]'s logits at position `p` of `tokens` (the row a pass ending at `p` returns).
fn sum_model_row(tokens: &[u32], p: usize) -> Vec<f32> {
    let sum: u32 = tokens[..=p].iter().sum();
    let mut logits = vec![0.0; VOCAB as usize];
    logits[((sum + p as u32 + 1) % VOCAB) as usize] = 10.0;
    logits
}

/// Collects `id`'s scored prompt tokens (checking they arrive in order, before its first generated
/// token) until it finishes.
async fn prompt_scores(
    c: &mut Client,
    id: &str,
    prompt_len: usize,
) -> Vec<crate::sampler::SampledToken> {
    let mut scored = Vec::new();
    loop {
        let step = tokio::time::timeout(Duration::from_secs(10), c.rx.recv())
            .await
            .expect("engine output within 10 s")
            .expect("engine alive");
        assert!(step.errors.is_empty(), "{:?}", step.errors);
        for p in step.prompt_logprobs.iter().filter(|p| p.request_id == id) {
            assert_eq!(p.first_index as usize, scored.len() + 1);
            scored.extend(p.tokens.iter().cloned());
        }
        if let Some(t) = step.tokens.iter().find(|t| t.request_id == id) {
            assert_eq!(
                scored.len() + 1,
                prompt_len,
                "all scored before the first token"
            );
            if t.stop.is_some() {
                return scored;
            }
        }
    }
}

#[tokio::test]
async fn prompt_tokens_are_scored_as_teacher_forcing_would_through_chunks_and_the_cache() {
    // Chunks of 4 tokens (blocks of 4), a 14-token prompt.
    let mut c = Client::new(config(64, 4, true));
    let p = prompt(14, 3);
    // Cache the prompt's blocks first, so the scoring request must bypass them.
    c.add(add("warm", p.clone(), 1, vec![]));
    c.collect(&["warm"]).await;
    for top_n in [0u32, 3] {
        let mut req = add("scored", p.clone(), 2, vec![]);
        req.prompt_logprobs = Some(top_n);
        c.add(req);
        let scored = prompt_scores(&mut c, "scored", p.len()).await;
        assert_eq!(scored.len(), p.len() - 1);
        for (i, s) in scored.iter().enumerate() {
            let want = score_token(&sum_model_row(&p, i), p[i + 1], top_n as usize);
            assert_eq!(s, &want, "prompt token {}", i + 1);
            assert_eq!(s.logprob.to_bits(), want.logprob.to_bits());
        }
    }
    let stats = c.stats().await;
    assert_eq!(stats.kv_blocks_used, 0);
    // The warm request took nothing from the cache, the scored ones nothing either (the cache
    // is bypassed from their first position to score, here position 0).
    assert_eq!(stats.prefix_cache_hit_tokens, 0);
}

#[tokio::test]
async fn a_one_token_prompt_has_nothing_to_score_and_bad_counts_are_refused() {
    let mut c = Client::new(config(64, 16, true));
    let mut req = add("one", vec![7], 2, vec![]);
    req.prompt_logprobs = Some(1);
    c.add(req);
    assert!(prompt_scores(&mut c, "one", 1).await.is_empty());
    let mut req = add("many", vec![7, 8], 2, vec![]);
    req.prompt_logprobs = Some(21);
    c.add(req);
    let err = c.collect(&["many"]).await.remove(0).unwrap_err();
    assert!(
        err.message.contains("prompt_logprobs is 21"),
        "{}",
        err.message
    );
}
