//! The draft-model proposer: a second, smaller model with the target's vocabulary proposes k tokens
//! greedily (the "speculative sampling" of Leviathan et al., ICML 2023, and Chen et al., 2023, with
//! this engine's exact acceptance rule instead of their rejection sampling: see the parent module).
//!
//! **Its KV cache.** The draft model has its own K/V storage with as many blocks as the target's
//! pool, and uses the target sequence's block table: block `i` of the pool holds the target's K/V
//! in the target's storage and the draft's K/V of the same positions in the draft's. So the
//! draft's blocks come from the same pool (the worker sizes the pool by the bytes per token of
//! both models), are rolled back with the target's ([`crate::kv::BlockPool::truncate`]) and
//! shared through the prefix cache with them. Which positions of a sequence hold draft K/V is
//! [`crate::kv::BlockPool::draft_computed`]; the draft catches up lazily: a step that speculates
//! first runs, for each sequence, the committed tokens its draft has not seen (at most
//! [`MAX_CATCH_UP_TOKENS`] per step for all sequences together; a sequence further behind only
//! catches up that step and proposes nothing), then the tokens the constraint forces, and
//! generates from there. Prefill steps and steps that do not speculate never run the draft, so
//! they cost what they cost without it.
//!
//! **A step.** Round 1 runs every speculating sequence's catch-up tokens, its last committed token
//! and its forced tokens as one batch entry returning the last position's logits; its argmax is
//! the first generated proposal. Each further round runs the previous proposal of the sequences
//! that want more. So a step runs at most `num_speculative_tokens` draft passes, each batched over
//! the speculating sequences. The draft wrote K/V for positions up to (not including) the last
//! proposal's: after verification, those before the target's computed tokens hold committed tokens.
//!
//! The draft model's kernels are batch invariant like the target's, so its K/V and its proposals
//! are a function of a sequence's committed tokens alone: acceptance does not depend on the batch.

use super::draft_cost::DraftCosts;
use crate::backend::{BatchEntry, BatchModel, Logits, StepError};

/// Most committed tokens the draft catches up over in a step, all sequences together (also at most
/// the scheduler's `max_batch_tokens`); a sequence whose backlog does not fit catches up what is
/// left of it and proposes nothing that step.
pub const MAX_CATCH_UP_TOKENS: usize = 512;

/// The draft model and its K/V storage.
pub struct Drafter<M: BatchModel> {
    model: M,
    kv: M::Kv,
    logits: Logits,
}

/// One sequence's work for the draft model in a step.
#[derive(Debug, Clone)]
pub(crate) struct DraftJob {
    /// The sequence's block table (covers every position the draft writes).
    pub table: Vec<u32>,
    /// Position of `input[0]`: the first position the draft has not computed.
    pub start_pos: usize,
    /// Tokens to run first: committed tokens from `start_pos` on, then the forced tokens.
    pub input: Vec<u32>,
    /// Proposals to generate after `input` (0: a catch-up only).
    pub generate: usize,
}

/// What the draft model did for one [`DraftJob`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Drafted {
    /// The generated proposals (`generate` of them, or none after a failure).
    pub tokens: Vec<u32>,
    /// End of the positions whose draft K/V the passes wrote (`start_pos + input.len()` plus all
    /// generated proposals but the last).
    pub written: usize,
}

impl<M: BatchModel> Drafter<M> {
    /// The draft model with K/V storage for `num_blocks` blocks of `block_size` tokens (the
    /// target's pool).
    pub fn new(model: M, num_blocks: usize, block_size: usize) -> Self {
        let kv = model.new_kv(num_blocks, block_size);
        Self {
            model,
            kv,
            logits: Logits::new(),
        }
    }

    /// The draft model's vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    /// The draft model's context length, in tokens.
    pub fn context_length(&self) -> usize {
        self.model.context_length()
    }

    /// Runs the draft model for `jobs` (see the module docs) and returns, per job, its greedy
    /// proposals (the argmax of the draft's logits, lowest id on ties) and how far its K/V goes.
    /// Each pass of about one token per sequence is recorded in `costs.pass` (seconds by the
    /// sequences it ran, the argmax included), and a first pass that caught up over more as
    /// [`DraftCosts::observe_catch_up`], once all passes succeeded.
    ///
    /// Errors: the draft model's [`StepError`]; then no job has proposals and what the failed pass
    /// wrote is not counted (its sequences' draft K/V stays where it was before the pass).
    pub(crate) fn propose(
        &mut self,
        jobs: &[DraftJob],
        costs: &mut DraftCosts,
    ) -> Result<Vec<Drafted>, StepError> {
        let mut out: Vec<Drafted> = jobs
            .iter()
            .map(|j| Drafted {
                tokens: Vec::with_capacity(j.generate),
                written: j.start_pos,
            })
            .collect();
        // Round 1: the input of every job, logits of the last position where it generates.
        let entries: Vec<BatchEntry<'_>> = jobs
            .iter()
            .map(|j| BatchEntry {
                tokens: &j.input,
                start_pos: j.start_pos,
                block_table: &j.table,
                logit_tokens: usize::from(j.generate > 0),
            })
            .collect();
        // Only passes of about one token per sequence measure the draft's cost per proposal
        // (a first pass that catches up over many tokens is a prefill, not a proposal's price).
        let mut timed = Timed::default();
        let started = std::time::Instant::now();
        self.model
            .forward_batch(&entries, &mut self.kv, &mut self.logits)?;
        let mut rows = 0;
        for (j, d) in jobs.iter().zip(&mut out) {
            d.written = j.start_pos + j.input.len();
            if j.generate > 0 {
                d.tokens.push(argmax(self.logits.row(rows)));
                rows += 1;
            }
        }
        let first_secs = started.elapsed().as_secs_f64();
        let catch_up: usize = jobs.iter().map(|j| j.input.len()).sum();
        if jobs.iter().all(|j| j.input.len() <= 2) {
            timed.add(jobs.len(), first_secs);
        }
        // Further rounds: the last proposal of every job that wants more.
        loop {
            let more: Vec<usize> = (0..jobs.len())
                .filter(|&i| out[i].tokens.len() < jobs[i].generate)
                .collect();
            if more.is_empty() {
                for (sequences, secs) in timed.passes {
                    costs.pass.observe(sequences, secs);
                }
                if jobs.iter().any(|j| j.input.len() > 2) {
                    // The pass's own cost (reading the weights) is not the catch-up's.
                    let pass = costs.pass.predict(jobs.len()).unwrap_or(0.0);
                    costs.observe_catch_up(catch_up, (first_secs - pass).max(0.0));
                }
                return Ok(out);
            }
            let inputs: Vec<[u32; 1]> = more
                .iter()
                .map(|&i| [*out[i].tokens.last().expect("round 1 proposed")])
                .collect();
            let entries: Vec<BatchEntry<'_>> = more
                .iter()
                .zip(&inputs)
                .map(|(&i, input)| BatchEntry {
                    tokens: input,
                    start_pos: out[i].written,
                    block_table: &jobs[i].table,
                    logit_tokens: 1,
                })
                .collect();
            let started = std::time::Instant::now();
            self.model
                .forward_batch(&entries, &mut self.kv, &mut self.logits)?;
            for (row, &i) in more.iter().enumerate() {
                out[i].written += 1;
                out[i].tokens.push(argmax(self.logits.row(row)));
            }
            timed.add(more.len(), started.elapsed().as_secs_f64());
        }
    }
}

/// Draft passes timed in one [`Drafter::propose`]: (sequences, seconds) each.
#[derive(Default)]
struct Timed {
    passes: Vec<(usize, f64)>,
}

impl Timed {
    fn add(&mut self, sequences: usize, secs: f64) {
        self.passes.push((sequences, secs));
    }
}

/// How many leading positions of a sequence hold draft K/V of committed tokens after a
/// verification: the draft wrote positions up to `written` (exclusive) with the sequence's tokens
/// and its proposals in order, and the target has `computed` committed tokens in its cache, so the
/// proposals the verification accepted are the only written ones that can lie before `computed`.
pub(crate) fn committed_draft_positions(written: usize, computed: usize) -> usize {
    written.min(computed)
}

/// Index of the largest value, the lowest index on ties (NaN never wins).
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] || row[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::{argmax, committed_draft_positions};

    #[test]
    fn argmax_takes_the_lowest_id_on_ties_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, -2.0]), 1);
        assert_eq!(argmax(&[0.5]), 0);
    }

    #[test]
    fn only_committed_positions_count() {
        // Draft wrote 10..15 (last committed token at 10, proposals at 11..15); 2 accepted: the
        // target computed 10, 11, 12 (and 13 is its own, uncomputed).
        assert_eq!(committed_draft_positions(15, 13), 13);
        // All accepted and more computed than the draft wrote (its last proposal is not run).
        assert_eq!(committed_draft_positions(15, 16), 15);
    }
}
