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
//! With a draft model ([`super::draft`]) the number of proposals is instead one `k` for the step
//! that maximizes the expected tokens per second given the sequences' acceptance rates and the
//! measured costs of target steps and draft passes ([`super::draft_cost::best_draft_length`]; 0
//! when speculating does not pay, with a 2-token probe every [`super::draft::PROBE_AFTER_STEPS`]
//! steps, or every [`super::draft::REMEASURE_AFTER_STEPS`] when not even a draft that is always
//! right would pay), and the sequence first gets the blocks for its proposals, then the draft
//! model generates them, in passes batched over the step's speculating sequences; the draft's
//! catch-up tokens are not counted in the step's token budget.
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

use std::collections::{HashMap, HashSet};

use super::draft::{
    DraftJob, Drafter, MAX_CATCH_UP_TOKENS, PROBE_AFTER_STEPS, REMEASURE_AFTER_STEPS,
};
use super::draft_cost::best_draft_length;
use super::{ngram, Proposer, SpeculationConfig};
use crate::backend::BatchModel;
use crate::kv::BlockPool;
use crate::scheduler::{Chunk, SeqId};
use crate::sequence::Sequence;

/// More decoding sequences than this in a step: the step is treated as compute-bound.
pub const MAX_SPECULATING_STREAMS: usize = 8;

/// Most tokens (decodes plus drafts) in a step that speculates.
pub const MAX_SPECULATIVE_STEP_TOKENS: usize = 48;

/// Sets `speculation.draft` of the step's decoding sequences (and grows their block tables to hold
/// it), or leaves every draft empty when the step should not speculate (see the module docs).
/// `chunks` is the scheduled step; `max_batch_tokens` the scheduler's token budget; `drafter` the
/// draft model (used when the proposer is [`Proposer::Draft`]; without one that proposer proposes
/// only forced tokens).
pub(crate) fn plan_drafts<M: BatchModel>(
    config: &SpeculationConfig,
    chunks: &[Chunk],
    seqs: &mut HashMap<SeqId, Sequence>,
    pool: &mut BlockPool,
    max_batch_tokens: usize,
    drafter: Option<&mut Drafter<M>>,
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
    let draft_context = drafter.as_ref().map_or(0, |d| d.context_length());
    // With a draft model: one draft length for the step, from the measured costs.
    let (draft_k, always_right_k) = match &drafter {
        Some(d) if config.proposer == Proposer::Draft => {
            let caps: Vec<(f64, usize)> = chunks
                .iter()
                .filter_map(|c| seqs.get(&c.seq))
                .filter(|s| s.speculation.enabled)
                .map(|s| {
                    let cap = config
                        .num_speculative_tokens
                        .min(s.tokens_left().saturating_sub(1));
                    (s.speculation.token_acceptance_rate(), cap)
                })
                .collect();
            let plain = chunks.len() - caps.len();
            let always_right: Vec<(f64, usize)> = caps.iter().map(|&(_, c)| (1.0, c)).collect();
            (
                best_draft_length(&caps, plain, d.costs()),
                best_draft_length(&always_right, plain, d.costs()),
            )
        }
        _ => (0, 0),
    };
    let mut model_drafts = ModelDrafts::default();
    // Committed tokens the draft may catch up over in this step, all sequences together.
    let mut catch_up_budget = max_batch_tokens.min(MAX_CATCH_UP_TOKENS);
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
        if config.proposer == Proposer::Draft {
            let Some(blocks) = seq.blocks.as_mut() else {
                continue;
            };
            // The draft costs a pass per proposal: propose what pays for it (probing now and
            // then when nothing does).
            let spec = &mut seq.speculation;
            let mut k = draft_k.min(cap);
            if k == 0 && cap > 0 {
                // A probe tells whether the acceptance rate changed; when not even a draft that
                // is always right would pay, only whether the costs did (rarely).
                let interval = match always_right_k {
                    0 => REMEASURE_AFTER_STEPS,
                    _ => PROBE_AFTER_STEPS,
                };
                if spec.idle_steps >= interval {
                    // Two tokens: the second pass, free of catch-up, also re-measures the cost.
                    k = cap.min(2);
                }
            }
            spec.idle_steps = if k == 0 { spec.idle_steps + 1 } else { 0 };
            // Room first: the draft model writes the positions it proposes from.
            let verified = seq.computed + 1;
            let wanted_total = k.max(forced);
            let room = pool.grow_from_free(blocks, verified + wanted_total);
            let total = wanted_total.min(room.saturating_sub(verified));
            draft.truncate(total);
            budget -= total;
            seq.speculation.forced = draft.len();
            // The draft model writes positions up to `computed + total - 1`: past its context it
            // proposes nothing (forced tokens need no model).
            let generate = match seq.computed + total <= draft_context {
                true => total - draft.len(),
                false => 0,
            };
            let draft_computed = pool.draft_computed(blocks);
            let job = (generate > 0).then(|| {
                draft_job(
                    blocks.table(),
                    &seq.tokens[..verified],
                    draft_computed,
                    &draft,
                    generate,
                    &mut catch_up_budget,
                )
            });
            if let Some(job) = job.filter(|job| model_drafts.claim(job, pool.block_size())) {
                model_drafts.push(chunk.seq, job);
            }
            seq.speculation.draft = draft;
            continue;
        }
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
    if let Some(drafter) = drafter {
        model_drafts.run(drafter, seqs);
    }
}

/// The draft model's jobs of a step, and the blocks their catch-ups write.
#[derive(Default)]
struct ModelDrafts {
    owners: Vec<SeqId>,
    jobs: Vec<DraftJob>,
    /// Blocks written by the catch-up part of a job (the only part that can lie in blocks shared
    /// through the prefix cache): two entries of one pass must not write one slot.
    claimed: HashSet<u32>,
}

impl ModelDrafts {
    /// Claims the blocks `job`'s committed tokens write; false (nothing claimed) when another job
    /// of the step writes one of them (that sequence proposes only forced tokens this step).
    fn claim(&mut self, job: &DraftJob, block_size: usize) -> bool {
        let catch_up_end = job.start_pos + job.input.len();
        let blocks: Vec<u32> = (job.start_pos / block_size..catch_up_end.div_ceil(block_size))
            .map(|i| job.table[i])
            .collect();
        if blocks.iter().any(|b| self.claimed.contains(b)) {
            return false;
        }
        self.claimed.extend(blocks);
        true
    }

    fn push(&mut self, owner: SeqId, job: DraftJob) {
        self.owners.push(owner);
        self.jobs.push(job);
    }

    /// Runs the jobs and appends each sequence's proposals to its draft (after its forced tokens);
    /// a draft model that fails or panics leaves the drafts as they are (forced tokens only) and is
    /// logged: speculation never fails a request.
    fn run<M: BatchModel>(self, drafter: &mut Drafter<M>, seqs: &mut HashMap<SeqId, Sequence>) {
        if self.jobs.is_empty() {
            return;
        }
        let jobs = &self.jobs;
        let proposed =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drafter.propose(jobs)));
        match proposed {
            Ok(Ok(drafted)) => {
                for (owner, d) in self.owners.iter().zip(drafted) {
                    if let Some(seq) = seqs.get_mut(owner) {
                        seq.speculation.draft.extend(d.tokens);
                        seq.speculation.draft_written = Some(d.written);
                    }
                }
            }
            Ok(Err(e)) => {
                let error = crate::error::with_sources(&e);
                tracing::warn!(%error, "draft model failed; this step proposes only forced tokens");
            }
            Err(_) => {
                tracing::warn!("draft model panicked; this step proposes only forced tokens");
            }
        }
    }
}

/// The draft model's job for a sequence with block table `table` whose committed tokens are
/// `tokens` (the last one not yet computed by the target): catch up from `draft_computed` over
/// what the step's `catch_up_budget` still allows (a longer backlog only catches up, as far as the
/// budget goes, and generates nothing), then the `forced` tokens, then `generate` proposals.
fn draft_job(
    table: &[u32],
    tokens: &[u32],
    draft_computed: usize,
    forced: &[u32],
    generate: usize,
    catch_up_budget: &mut usize,
) -> DraftJob {
    let committed = &tokens[draft_computed.min(tokens.len() - 1)..];
    let start_pos = tokens.len() - committed.len();
    // The last committed token is the proposal's own input, not a catch-up.
    let catch_up = committed.len() - 1;
    if catch_up > *catch_up_budget {
        let take = (*catch_up_budget).max(1);
        *catch_up_budget = 0;
        return DraftJob {
            table: table.to_vec(),
            start_pos,
            input: committed[..take].to_vec(),
            generate: 0,
        };
    }
    *catch_up_budget -= catch_up;
    let mut input = Vec::with_capacity(committed.len() + forced.len());
    input.extend_from_slice(committed);
    input.extend_from_slice(forced);
    DraftJob {
        table: table.to_vec(),
        start_pos,
        input,
        generate,
    }
}
