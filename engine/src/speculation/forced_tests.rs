//! Tokens a constraint forces are drafts too: they are proposed whatever the sequence's acceptance
//! rate, always accepted, and change no output (every constrained request's tokens, logprobs and
//! stop reasons equal those with speculation off, alone and batched); the block pool ends empty.

use std::collections::HashMap;

use structured_output::ConstraintSpec;

use super::draft_cost::DraftCosts;
use super::tests::{assert_same_on, case, looping_prompt, Case, Vocab};
use super::{metrics, plan_drafts, Proposer, SequenceSpeculation, SpeculationConfig};
use crate::kv::BlockPool;
use crate::sampler::{Sampler, SamplingConfig};
use crate::scheduler::Chunk;
use crate::sequence::Sequence;
use crate::tests::letters_compiler;
use crate::StopReason;

const SCHEMA: &str = r#"{"type":"object","properties":{
    "name":{"type":"string","maxLength":5},
    "color":{"enum":["green","grey","blue"]},
    "size":{"enum":["small","large"]}},
    "required":["name","color","size"],"additionalProperties":false}"#;

const REGEX: &str = "abc[0-9]{2}-(xyz|uvw)-done";

/// Constrained requests over [`Vocab::Chars`]: the schema and the regex, greedy and sampled.
fn constrained_cases() -> Vec<Case> {
    let mut all = Vec::new();
    for (i, spec) in [
        ConstraintSpec::JsonSchema(SCHEMA),
        ConstraintSpec::Regex(REGEX),
    ]
    .into_iter()
    .enumerate()
    {
        for sampled in [false, true] {
            let id = format!("c{i}-{}", if sampled { "sampled" } else { "greedy" });
            let mut c = case(&id, looping_prompt(9 + i, i as u32), 60);
            c.request.stop_token_ids = vec![0];
            if sampled {
                c.request.seed = 11 + i as u64;
                c.request.sampling = SamplingConfig {
                    temperature: 0.8,
                    top_k: 20,
                    repetition_penalty: 1.1,
                    logit_bias: vec![(ids("e")[0], 1.0)],
                    top_logprobs: 2,
                    ..Default::default()
                };
            }
            c.constraint = Some(spec);
            all.push(c);
        }
    }
    all
}

/// [`Vocab::Chars`]'s ids of `text`.
fn ids(text: &str) -> Vec<u32> {
    text.bytes().map(|b| u32::from(b - 0x20)).collect()
}

fn text(tokens: &[u32]) -> String {
    tokens.iter().map(|&i| char::from(i as u8 + 0x20)).collect()
}

fn grammar_counter() -> (u64, u64) {
    let labels = vec![("proposer".to_owned(), metrics::FORCED_LABEL.to_owned())];
    (
        metrics::draft_tokens().get_or_create(&labels).get(),
        metrics::accepted_tokens().get_or_create(&labels).get(),
    )
}

#[tokio::test]
async fn forced_tokens_are_accepted_and_outputs_equal_plain_decoding() {
    let cases = constrained_cases();
    for at_once in [1, cases.len()] {
        let run = assert_same_on(Vocab::Chars, 256, &cases, at_once).await;
        let s = &run.stats;
        // Forced tokens were proposed, and every one was accepted.
        assert!(s.speculative_forced_tokens >= 20, "{at_once}: {s:?}");
        assert_eq!(
            s.speculative_forced_accepted_tokens, s.speculative_forced_tokens,
            "{at_once}: {s:?}"
        );
        assert!(s.steps < s.generated_tokens, "{s:?}");
        // Each output is complete and fits its constraint.
        for c in &cases {
            let seen = &run.outputs[&c.request.request_id];
            assert_eq!(seen.last().unwrap().3, Some(StopReason::ConstraintComplete));
            let out = text(&seen.iter().map(|t| t.0).collect::<Vec<_>>());
            match c.constraint {
                Some(ConstraintSpec::JsonSchema(_)) => {
                    assert!(out.starts_with(r#"{"name":""#), "{out}");
                    assert!(out.contains(r#"","color":"g"#) || out.contains("\"blue\""));
                    assert!(out.ends_with(r#"","size":"small"}"#) || out.ends_with(r#"large"}"#));
                }
                _ => assert!(out.starts_with("abc") && out.ends_with("-done"), "{out}"),
            }
        }
    }
    // The metrics count them under their own proposer label.
    let (proposed, accepted) = grammar_counter();
    assert!(proposed > 0 && accepted > 0, "{proposed} {accepted}");
}

#[tokio::test]
async fn forced_tokens_beside_unconstrained_requests_and_under_preemption() {
    // Constrained requests among the n-gram cases, 6 at a time on a roomy pool and on a pool so
    // small that decodes preempt each other.
    let mut cases = constrained_cases();
    cases.extend((0..4u32).map(|i| case(&format!("free{i}"), looping_prompt(10, i), 40)));
    for (blocks, at_once) in [(256, 6), (24, 6)] {
        let run = assert_same_on(Vocab::Chars, blocks, &cases, at_once).await;
        let s = &run.stats;
        assert!(s.speculative_forced_tokens > 0, "{blocks}: {s:?}");
        assert_eq!(
            s.speculative_forced_accepted_tokens,
            s.speculative_forced_tokens
        );
        if blocks == 24 {
            assert!(s.preemptions > 0, "{s:?}");
        }
    }
}

/// A decoding sequence `id` (prompt `prompt`, its last token uncomputed) constrained by `regex`
/// over the letters, with blocks from `pool`.
fn decoding(pool: &mut BlockPool, prompt: &[u32], regex: &str, max_new: usize) -> Sequence {
    let sampler = Sampler::new(SamplingConfig::default(), 0);
    let mut seq = Sequence::new(1, "r".into(), prompt.to_vec(), sampler, max_new, [0], 96);
    let (blocks, _) = pool
        .allocate(prompt, block_hash::SEED, usize::MAX, 0)
        .unwrap();
    seq.blocks = Some(blocks);
    seq.computed = prompt.len() - 1;
    let state = letters_compiler()
        .compile(ConstraintSpec::Regex(regex))
        .unwrap();
    seq.constraint = Some(Box::new(state));
    seq
}

/// Plans one step for `seq` alone, nothing measured yet; returns its draft and forced count, and
/// gives the blocks back.
fn plan_one(
    proposer: Proposer,
    pool: &mut BlockPool,
    seq: Sequence,
    acceptance: f64,
) -> (Vec<u32>, usize) {
    plan_one_measured(proposer, pool, seq, acceptance, DraftCosts::default())
}

/// [`plan_one`] with the worker's measured `costs`.
fn plan_one_measured(
    proposer: Proposer,
    pool: &mut BlockPool,
    mut seq: Sequence,
    acceptance: f64,
    mut costs: DraftCosts,
) -> (Vec<u32>, usize) {
    seq.speculation.token_acceptance = (acceptance, 1.0);
    let mut seqs = HashMap::from([(7, seq)]);
    let chunks = [Chunk {
        seq: 7,
        num_tokens: 1,
    }];
    let speculation = SpeculationConfig {
        proposer,
        ..Default::default()
    };
    let no_draft: Option<&mut super::draft::Drafter<super::tests::LoopModel>> = None;
    plan_drafts(
        &speculation,
        &chunks,
        &mut seqs,
        pool,
        64,
        &mut costs,
        no_draft,
    );
    let mut seq = seqs.remove(&7).unwrap();
    let out = (
        std::mem::take(&mut seq.speculation.draft),
        seq.speculation.forced,
    );
    pool.release(seq.blocks.take().unwrap());
    assert_eq!(pool.stats().used, 0);
    out
}

#[test]
fn forced_tokens_are_not_throttled_and_keep_the_other_limits() {
    // Letters: id i is `a` + i - 1. The prompt has nothing for the n-gram to find.
    let abc: Vec<u32> = (1..=8).collect();
    let prompt = [20, 21, 22, 23];
    let regex = "abcdefgh";
    let mut pool = BlockPool::new(32, 4, false);
    // An acceptance rate of 0 (one n-gram token at most): still the five forced ones.
    let seq = decoding(&mut pool, &prompt, regex, 40);
    assert_eq!(
        plan_one(Proposer::Ngram, &mut pool, seq, 0.0),
        (abc[..5].to_vec(), 5)
    );
    // Speculation off: nothing.
    let seq = decoding(&mut pool, &prompt, regex, 40);
    assert_eq!(plan_one(Proposer::Off, &mut pool, seq, 1.0), (vec![], 0));
    // Three tokens left to generate: two drafts (the step's own token is the third).
    let seq = decoding(&mut pool, &prompt, regex, 3);
    assert_eq!(
        plan_one(Proposer::Ngram, &mut pool, seq, 1.0),
        (abc[..2].to_vec(), 2)
    );
    // Blocks only from the free list: with one free block (the prompt fills the other, its last
    // token's position included), the draft is cut to the free block's four slots.
    let mut small = BlockPool::new(2, 4, false);
    let seq = decoding(&mut small, &prompt, regex, 40);
    assert_eq!(
        plan_one(Proposer::Ngram, &mut small, seq, 1.0),
        (abc[..4].to_vec(), 4)
    );
    // The draft proposer without a draft model (or past the draft's context) still proposes
    // the forced tokens: they need no model.
    let seq = decoding(&mut pool, &prompt, regex, 40);
    assert_eq!(
        plan_one(Proposer::Draft, &mut pool, seq, 0.0),
        (abc[..5].to_vec(), 5)
    );
    // The n-gram fills the rest, looking up as if the forced tokens were committed: the prompt
    // `c x y t` has `x y` after `c`, so `abc` (forced) is followed by `x y` (where the measured
    // costs say verification is nearly free).
    let prompt = [3, 24, 25, 20];
    let seq = decoding(&mut pool, &prompt, "abc[a-z]*", 40);
    let memory_bound = measured(&[(1, 10.0), (6, 10.5)]);
    assert_eq!(
        plan_one_measured(Proposer::Ngram, &mut pool, seq, 1.0, memory_bound),
        (vec![1, 2, 3, 24, 25], 3)
    );
}

/// Target steps measured at `points` (tokens, seconds).
fn measured(points: &[(usize, f64)]) -> DraftCosts {
    let mut costs = DraftCosts::default();
    for &(tokens, secs) in points {
        costs.step.observe(tokens, secs);
    }
    costs
}

#[test]
fn the_ngram_proposes_what_the_measured_costs_pay_for() {
    // `c` was followed by `x y t c`: the lookup finds four tokens.
    let prompt = [3, 24, 25, 20, 3];
    let mut pool = BlockPool::new(32, 4, false);
    let found = |pool: &mut BlockPool, acceptance, costs| {
        let seq = decoding(pool, &prompt, "[a-z]*", 40);
        plan_one_measured(Proposer::Ngram, pool, seq, acceptance, costs).0
    };
    // Verification nearly free (10 ms a step, +0.1 ms a token): everything found.
    let memory_bound = measured(&[(1, 10.0), (6, 10.5)]);
    assert_eq!(
        found(&mut pool, 0.9, memory_bound.clone()),
        vec![24, 25, 20, 3]
    );
    // Each verified token costing a step: nothing.
    let compute_bound = measured(&[(1, 10.0), (6, 60.0)]);
    assert_eq!(found(&mut pool, 0.9, compute_bound), Vec::<u32>::new());
    // Nothing accepted lately: nothing, even where verification is nearly free.
    assert_eq!(
        found(&mut pool, 0.0, memory_bound.clone()),
        Vec::<u32>::new()
    );
    // A gain under MIN_GAIN (5 %) does not pay: one token at 4 % acceptance.
    assert_eq!(found(&mut pool, 0.04, memory_bound), Vec::<u32>::new());
}

#[test]
fn forced_tokens_do_not_move_the_acceptance_rate() {
    let mut s = SequenceSpeculation::new(true);
    s.token_acceptance = (1.0, 2.0);
    // All forced, all accepted: the totals grow, the rate stays.
    s.record(4, 4, 4);
    assert_eq!(
        (
            s.draft_tokens,
            s.accepted_draft_tokens,
            s.token_acceptance_rate(1.0)
        ),
        (4, 4, 0.5)
    );
    // Two forced then four n-gram tokens of which one was accepted: the rate sees 1 accepted and
    // one rejection. Decayed sums: (0.7 * 1 + 1) / (0.7 * 2 + 2).
    s.record(6, 2, 3);
    assert_eq!((s.draft_tokens, s.accepted_draft_tokens), (10, 7));
    assert!((s.token_acceptance_rate(1.0) - 1.7 / 3.4).abs() < 1e-12);
}

#[test]
fn the_per_token_acceptance_counts_one_rejection_per_verification() {
    let mut s = SequenceSpeculation::new(true);
    assert_eq!(
        s.token_acceptance_rate(1.0),
        1.0,
        "optimistic before the first"
    );
    // 2 of 5 accepted: the third was rejected and the last two were never tried.
    s.record(5, 0, 2);
    assert!((s.token_acceptance_rate(1.0) - 2.0 / 3.0).abs() < 1e-12);
    // All 5 accepted: no rejection. Decayed sums: (0.7 * 2 + 5) / (0.7 * 3 + 5).
    s.record(5, 0, 5);
    assert!((s.token_acceptance_rate(1.0) - 6.4 / 7.1).abs() < 1e-12);
    // Forced tokens do not count.
    s.record(3, 3, 3);
    assert!((s.token_acceptance_rate(1.0) - 6.4 / 7.1).abs() < 1e-12);
}
