//! Which decoding sequences speculate in a step, and how many tokens each proposes: the "never
//! slower" policy of issue 28.
//!
//! Speculation spends compute to save memory traffic, which pays only while a step is memory-bound.
//! So a step speculates only when it is a pure decode step (no prefill chunk: a prefill makes the
//! step compute-bound and its chunk would lose budget) with at most [`MAX_SPECULATING_STREAMS`]
//! sequences, and all the step's tokens (one per decode plus the drafts) stay within
//! [`MAX_SPECULATIVE_STEP_TOKENS`] and the scheduler's token budget. Each sequence proposes
//! `round(num_speculative_tokens * recent acceptance rate)` tokens (at least 1), never more than it
//! may still generate; a sequence whose n-gram finds no match proposes nothing and costs nothing.
//!
//! The drafts' positions get KV blocks only from the truly free list (never evicting a cached block
//! and never preempting); a draft that finds no room is shortened to what its blocks hold.
//!
//! A constrained sequence's draft starts with the tokens its constraint forces
//! ([`structured_output::ConstraintState::forced_tokens`]: positions whose mask allows a single
//! token), up to `num_speculative_tokens` and the same limits (what it may still generate, the
//! step's budget, free blocks), whatever its acceptance rate: the sampler can only choose them, so
//! they are always accepted and cost one forward position each. The n-gram then fills the draft up
//! to the throttled count, looking up as if the forced tokens were committed. Forced tokens do not
//! move the acceptance rate (see [`super::SequenceSpeculation::record`]). Finding them runs on the
//! engine thread before the forward pass: a copy of the matcher and a walk of its parser per
//! constrained sequence, plus one mask per forced token where bytes are forced. With speculation
//! `off` none of this runs.
//!
//! The two limits are first guesses for CPU decode of small models, not yet tuned by a benchmark.

use std::collections::HashMap;

use super::{ngram, Proposer, SpeculationConfig};
use crate::kv::BlockPool;
use crate::scheduler::{Chunk, SeqId};
use crate::sequence::Sequence;

/// More decoding sequences than this in a step: the step is treated as compute-bound.
pub const MAX_SPECULATING_STREAMS: usize = 8;

/// Most tokens (decodes plus drafts) in a step that speculates.
pub const MAX_SPECULATIVE_STEP_TOKENS: usize = 48;

/// Sets `speculation.draft` of the step's decoding sequences (and grows their block tables to hold
/// it), or leaves every draft empty when the step should not speculate (see the module docs).
/// `chunks` is the scheduled step; `max_batch_tokens` the scheduler's token budget.
pub(crate) fn plan_drafts(
    config: &SpeculationConfig,
    chunks: &[Chunk],
    seqs: &mut HashMap<SeqId, Sequence>,
    pool: &mut BlockPool,
    max_batch_tokens: usize,
) {
    if config.proposer == Proposer::Off || chunks.len() > MAX_SPECULATING_STREAMS {
        return;
    }
    let all_decodes = chunks
        .iter()
        .all(|c| c.num_tokens == 1 && seqs.get(&c.seq).is_some_and(|s| s.remaining() == 1));
    if !all_decodes {
        return;
    }
    let mut budget = max_batch_tokens
        .min(MAX_SPECULATIVE_STEP_TOKENS)
        .saturating_sub(chunks.len());
    for chunk in chunks {
        let Some(seq) = seqs.get_mut(&chunk.seq) else {
            continue;
        };
        if !seq.speculation.enabled || budget == 0 {
            continue;
        }
        // The most this sequence may propose: the setting, what it may still generate beyond the
        // step's own token, the step's budget.
        let cap = config
            .num_speculative_tokens
            .min(seq.tokens_left().saturating_sub(1))
            .min(budget);
        // Tokens the constraint forces come first and are not throttled: they are always
        // accepted.
        let mut draft = match seq.constraint.as_deref() {
            Some(constraint) => constraint.forced_tokens(cap),
            None => Vec::new(),
        };
        let forced = draft.len();
        let wanted =
            (config.num_speculative_tokens as f64 * seq.speculation.acceptance).round() as usize;
        let k = wanted.clamp(1, config.num_speculative_tokens).min(cap);
        if forced == 0 {
            draft = ngram::propose(&seq.tokens, config.ngram_min, config.ngram_max, k);
        } else if forced < k {
            // The n-gram continues the forced tokens (looked up as if they were committed).
            let mut context = Vec::with_capacity(seq.tokens.len() + forced);
            context.extend_from_slice(&seq.tokens);
            context.extend_from_slice(&draft);
            let more = ngram::propose(&context, config.ngram_min, config.ngram_max, k - forced);
            draft.extend(more);
        }
        if draft.is_empty() {
            continue;
        }
        let Some(blocks) = seq.blocks.as_mut() else {
            continue;
        };
        let verified = seq.computed + 1;
        let room = pool.grow_from_free(blocks, verified + draft.len());
        draft.truncate(room.saturating_sub(verified));
        budget -= draft.len();
        seq.speculation.forced = forced.min(draft.len());
        seq.speculation.draft = draft;
    }
}
