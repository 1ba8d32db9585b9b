//! The draft-model proposer changes no output: every case of the n-gram tests (greedy, sampled
//! with penalties, stops inside accepted runs, constraints, opt-out, the context's end) with a
//! draft model that disagrees with the target now and then equals speculation off, alone,
//! batched and under preemption; a draft equal to the target has every greedy proposal accepted
//! (so its K/V, caught up lazily and shared through the prefix cache, is right); a prompt found
//! in the prefix cache spares the draft its recomputation; no draft pass writes one slot twice.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::tests::{
    assert_same_with, case, cases, config, looping_prompt, run_groups, run_with_draft, Case,
    LoopCounters, LoopModel, Run, Vocab, TARGET_RULE, VOCAB,
};
use super::Proposer;

/// A draft model over the letters with `rule` (the target's is [`TARGET_RULE`]) and its counters;
/// its passes cost next to nothing (a real draft is much smaller than its target).
fn draft(rule: u32) -> (LoopModel, Arc<LoopCounters>) {
    let model = LoopModel {
        rule,
        record_reads: true,
        pass_micros: 0,
        ..LoopModel::target(VOCAB)
    };
    let counters = model.counters.clone();
    (model, counters)
}

/// Runs `cases` off and with a draft model of `rule`; asserts equal outputs, no slot conflict.
async fn assert_same(
    rule: u32,
    num_blocks: usize,
    cases: &[Case],
    at_once: usize,
) -> crate::EngineStats {
    let (model, _) = draft(rule);
    assert_same_drafted(model, num_blocks, cases, at_once).await
}

/// Runs `cases` off and with `model` as the draft model; asserts equal outputs, no slot conflict,
/// that the draft ran and read only committed tokens.
async fn assert_same_drafted(
    model: LoopModel,
    num_blocks: usize,
    cases: &[Case],
    at_once: usize,
) -> crate::EngineStats {
    let counters = model.counters.clone();
    let run = assert_same_with(
        Vocab::Letters,
        num_blocks,
        cases,
        at_once,
        Proposer::Draft,
        Some(model),
    )
    .await;
    assert_eq!(counters.slot_conflicts.load(Ordering::Relaxed), 0);
    assert!(counters.tokens.load(Ordering::Relaxed) > 0, "the draft ran");
    assert_draft_read_committed_tokens(cases, &run, &counters);
    run.stats
}

/// Every context the draft model computed logits from is a request's committed tokens followed by
/// at most a step's proposals: its K/V never keeps a rejected token (nor another sequence's).
fn assert_draft_read_committed_tokens(cases: &[Case], run: &Run, counters: &LoopCounters) {
    let full: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| {
            let mut t = c.request.prompt_ids.clone();
            t.extend(run.outputs[&c.request.request_id].iter().map(|s| s.0));
            t
        })
        .collect();
    let reads = counters.reads.lock().unwrap();
    assert!(!reads.is_empty());
    for seen in reads.iter() {
        // The last MAX_SPECULATIVE_TOKENS positions may be this step's proposals.
        let head = &seen[..seen.len().saturating_sub(super::MAX_SPECULATIVE_TOKENS)];
        assert!(
            full.iter().any(|f| f.starts_with(head)),
            "the draft read {seen:?}, which no request committed"
        );
    }
}

#[tokio::test]
async fn draft_outputs_equal_plain_decoding_alone() {
    let stats = assert_same(5, 256, &cases(), 1).await;
    assert!(stats.speculative_accepted_tokens > 100, "{stats:?}");
    assert!(
        stats.speculative_accepted_tokens < stats.speculative_draft_tokens,
        "a disagreeing draft is also rejected: {stats:?}"
    );
    assert!(stats.steps < stats.generated_tokens, "{stats:?}");
}

#[tokio::test]
async fn draft_outputs_equal_plain_decoding_batched() {
    let stats = assert_same(5, 256, &cases(), 6).await;
    assert!(stats.speculative_accepted_tokens > 0, "{stats:?}");
    // The same prompts twice at once: their drafts catch up over shared prefix blocks.
    let mut twice = cases()[..4].to_vec();
    twice.extend(cases()[..4].iter().cloned().map(|mut c| {
        c.request.request_id.push_str("-again");
        c
    }));
    assert_same(5, 256, &twice, 8).await;
}

#[tokio::test]
async fn draft_outputs_equal_plain_decoding_under_preemption() {
    let stats = assert_same(5, 20, &cases()[..10], 6).await;
    assert!(stats.preemptions > 0, "{stats:?}");
}

/// Greedy unconstrained requests without stop tokens.
fn greedy_cases() -> Vec<Case> {
    (0..4u32)
        .map(|i| case(&format!("g{i}"), looping_prompt(9 + i as usize, i), 40))
        .collect()
}

#[tokio::test]
async fn a_draft_equal_to_the_target_is_always_accepted() {
    for at_once in [1, 4] {
        let stats = assert_same(TARGET_RULE, 256, &greedy_cases(), at_once).await;
        assert!(stats.speculative_draft_tokens > 0, "{stats:?}");
        assert_eq!(
            stats.speculative_accepted_tokens, stats.speculative_draft_tokens,
            "{at_once} at once: {stats:?}"
        );
    }
}

#[tokio::test]
async fn a_cached_prefix_spares_the_draft_its_recomputation() {
    // One long prompt, generated twice one after the other: the second finds the prompt's full
    // blocks in the prefix cache, draft part included.
    let prompt = looping_prompt(60, 1);
    let first = [case("first", prompt.clone(), 8)];
    let second = [case("second", prompt, 8)];
    let (model, counters) = draft(TARGET_RULE);
    let engine_config = config(256, Proposer::Draft, true);
    // One engine for both requests, so the second sees the first's cache.
    let both = [first[0].clone(), second[0].clone()];
    let run = run_with_draft(Vocab::Letters, engine_config, Some(model), &both, 1).await;
    let ran_both = counters.tokens.load(Ordering::Relaxed);
    let (alone_model, alone_counters) = draft(TARGET_RULE);
    run_with_draft(
        Vocab::Letters,
        config(256, Proposer::Draft, true),
        Some(alone_model),
        &first,
        1,
    )
    .await;
    let ran_first = alone_counters.tokens.load(Ordering::Relaxed);
    let ran_second = ran_both - ran_first;
    // The first catches up the whole prompt (60 tokens) plus its proposals; the second only the
    // part after the cached blocks (56 of 60 tokens are cached: 14 blocks of 4).
    assert!(ran_first >= 60, "{ran_first}");
    assert!(
        ran_second + 50 <= ran_first,
        "the second request's draft ran {ran_second} tokens, the first's {ran_first}"
    );
    assert_eq!(run.outputs["first"], run.outputs["second"]);
}

#[tokio::test]
async fn two_drafts_catching_up_one_cached_prefix_in_one_step_do_not_collide() {
    // The first request opts out of speculation, so its prompt's blocks enter the prefix cache
    // without the draft's K/V; two requests with that prompt then arrive together and both find
    // those blocks: their drafts have the same shared blocks to fill in at their first step.
    let prompt = looping_prompt(40, 2);
    let mut first = case("first", prompt.clone(), 6);
    first.request.speculation_opt_out = true;
    let first = [first];
    let pair = [case("b", prompt.clone(), 30), case("c", prompt, 30)];
    let groups: [&[Case]; 2] = [&first, &pair];
    let off = run_groups(
        Vocab::Letters,
        config(256, Proposer::Off, true),
        None,
        &groups,
    )
    .await;
    let (model, counters) = draft(TARGET_RULE);
    let spec = run_groups(
        Vocab::Letters,
        config(256, Proposer::Draft, true),
        Some(model),
        &groups,
    )
    .await;
    assert_eq!(counters.slot_conflicts.load(Ordering::Relaxed), 0);
    for id in ["first", "b", "c"] {
        assert_eq!(off.outputs[id], spec.outputs[id], "{id}");
    }
    let stats = spec.stats;
    assert!(stats.prefix_cache_hit_tokens >= 2 * 36, "{stats:?}");
    assert!(stats.speculative_draft_tokens > 0, "{stats:?}");
    assert_eq!(
        stats.speculative_accepted_tokens, stats.speculative_draft_tokens,
        "{stats:?}"
    );
}

#[tokio::test]
async fn a_draft_that_costs_more_than_it_saves_is_only_probed() {
    // A draft pass costs ten target steps: no acceptance rate makes it pay, so after the first
    // measurements a sequence proposes only a probe token every REMEASURE_AFTER_STEPS steps.
    let (mut model, _) = draft(TARGET_RULE);
    model.pass_micros = 3000;
    let stats = assert_same_drafted(model, 256, &greedy_cases(), 1).await;
    // Each request's first speculating step measures (before the first measurement the draft is
    // taken for free); then not even an always-right draft pays, so no probe comes within a
    // request's 40 tokens.
    assert!(
        stats.speculative_draft_tokens <= 5 * 4,
        "at most the first step's proposals per request: {stats:?}"
    );
    assert!(stats.speculative_draft_tokens > 0, "{stats:?}");
}

#[tokio::test]
async fn a_draft_catches_up_over_a_prompt_only_where_that_pays() {
    // Each token a draft pass runs costs 0.1 ms, a target step 0.3 ms: an always-right draft of
    // 5 commits 6 tokens in 0.8 ms (2.25x), but catching up over an 80-token prompt (8 ms) cannot
    // pay back within 12 tokens (2 ms saved). Only the first request's catch-up runs, before its
    // cost was measured; after it no sequence catches up over a prompt (distinct prompts: the
    // prefix cache holds none of their draft K/V). Without the rule every request's draft would
    // run its 80 tokens.
    let long: Vec<Case> = (0..4u32)
        .map(|i| case(&format!("long{i}"), looping_prompt(80, i), 12))
        .collect();
    let (mut model, counters) = draft(TARGET_RULE);
    model.token_micros = 100;
    let run = assert_same_with(Vocab::Letters, 256, &long, 1, Proposer::Draft, Some(model)).await;
    let ran = counters.tokens.load(Ordering::Relaxed);
    assert!(
        ran <= 80 + 12 * 6,
        "the draft ran {ran} tokens: {:?}",
        run.stats
    );
    assert!(ran > 0, "the first catch-up measures");
    assert_eq!(counters.slot_conflicts.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn long_backlogs_catch_up_within_the_steps_budget() {
    // Four 80-token prompts at once: their drafts have 320 tokens to catch up, the step's budget
    // (max_batch_tokens, 64 here) allows 64 per pass plus each sequence's own inputs.
    let long: Vec<Case> = (0..4u32)
        .map(|i| case(&format!("long{i}"), looping_prompt(80, i), 12))
        .collect();
    let (model, counters) = draft(5);
    let stats = assert_same_drafted(model, 256, &long, 4).await;
    let most = counters.most_pass_tokens.load(Ordering::Relaxed);
    assert!(most <= 64 + 4 * 6, "a draft pass ran {most} tokens");
    assert!(stats.speculative_draft_tokens > 0, "{stats:?}");
}
