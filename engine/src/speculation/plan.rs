//! Which decoding sequences speculate in a step, and how many tokens each proposes: the "never
//! slower" policy of issue 28.
//!
//! Speculation spends compute to save memory traffic, which pays only while a step is memory-bound.
//! So a step speculates only when it is a pure decode step (no prefill chunk: a prefill makes the
//! step compute-bound and its chunk would lose budget) with at most [`MAX_SPECULATING_STREAMS`]
//! sequences, and all the step's tokens (one per decode plus the drafts) stay within
//! [`MAX_SPECULATIVE_STEP_TOKENS`] and the scheduler's token budget.
//!
//! How many tokens the step's sequences propose is one `k` for the step, chosen from what the
//! worker measures ([`super::draft_cost::choose_draft_length`]): target decode steps are timed by
//! the tokens they run (sampling included), draft-model passes by the sequences they run, and `k`
//! maximizes the expected committed tokens per second at the sequences' per-token acceptance
//! rates (a sequence not yet verified is assumed to have the worker's recent rate); it is 0 when
//! speculating does not pay by [`super::draft_cost::MIN_GAIN`]. Each sequence proposes at most
//! `k`, at most `num_speculative_tokens` and never more than it may still generate:
//! - **n-gram**: the lookup runs first for every sequence, so that `k` is chosen over what it found
//!   (a sequence without a match proposes nothing and costs nothing); its proposals cost no pass.
//! - **draft model** ([`super::draft`]): the sequence first gets the blocks for its proposals, then
//!   the draft model generates them, in passes batched over the step's speculating sequences; the
//!   draft's catch-up tokens are not counted in the step's token budget. A sequence whose draft
//!   is behind (a prompt it never saw) catches up only where that pays back within
//!   [`super::draft_cost::CATCH_UP_HORIZON`] tokens at the step's expected gain
//!   ([`super::draft_cost::catch_up_pays`]).
//!
//! A sequence that proposed nothing for [`super::draft_cost::PROBE_AFTER_STEPS`] steps while it
//! could have probes with two tokens, so that a change of its acceptance rate is seen; each probe
//! after which speculation still does not pay doubles its interval, up to
//! [`super::draft_cost::REMEASURE_AFTER_STEPS`] (at once when not even a draft that is always
//! right would pay). A draft-model probe also catches up over what the sequence decoded since,
//! so it comes only while that costs at most [`super::draft_cost::PROBE_CATCH_UP_SHARE`] of the
//! time since the worker last speculated.
//!
//! The drafts' positions get KV blocks only from the truly free list (never evicting a cached block
//! and never preempting); a draft that finds no room is shortened to what its blocks hold.
//!
//! A constrained sequence's draft starts with the tokens its constraint forces
//! ([`structured_output::ConstraintState::forced_tokens`]: positions whose mask allows a single
//! token), up to `num_speculative_tokens` and the same limits (what it may still generate, the
//! step's budget, free blocks), whatever `k` is: the sampler can only choose them, so they are
//! always accepted and cost one forward position each. The proposer then fills the draft up to
//! `k`, the n-gram looking up as if the forced tokens were committed. Forced tokens do not move the
//! acceptance rate (see [`super::SequenceSpeculation::record`]). Finding them runs on the engine
//! thread before the forward pass: a copy of the matcher and a walk of its parser per constrained
//! sequence, plus one mask per forced token where bytes are forced. With speculation `off` none of
//! this runs.
//!
//! The two step limits are first guesses for CPU decode of small models; the cost model decides
//! within them.

use std::collections::{HashMap, HashSet};

use super::draft::{DraftJob, Drafter, MAX_CATCH_UP_TOKENS};
use super::draft_cost::{
    catch_up_pays, choose_draft_length, DraftChoice, DraftCosts, PROBE_AFTER_STEPS,
    REMEASURE_AFTER_STEPS,
};
use super::{ngram, Proposer, SpeculationConfig};
use crate::backend::BatchModel;
use crate::kv::BlockPool;
use crate::scheduler::{Chunk, SeqId};
use crate::sequence::Sequence;

/// More decoding sequences than this in a step: the step is treated as compute-bound.
pub const MAX_SPECULATING_STREAMS: usize = 8;

/// Most tokens (decodes plus drafts) in a step that speculates.
pub const MAX_SPECULATIVE_STEP_TOKENS: usize = 48;

/// A speculating sequence's candidates in a step, before `k` is chosen.
struct Candidate {
    seq: SeqId,
    /// Most tokens it may propose (the setting, what it may still generate beyond the step's own
    /// token, the step's budget).
    cap: usize,
    /// Its draft so far: the tokens its constraint forces, then (n-gram) what the lookup found.
    draft: Vec<u32>,
    /// How many of `draft`'s leading tokens are forced.
    forced: usize,
    /// How many tokens the proposer could propose after the forced ones: n-gram, what its lookup
    /// found; a draft model, up to `cap`; without a draft model, 0 (forced tokens only).
    proposable: usize,
    /// Committed tokens before the last one that the draft model has not computed (0 for the
    /// n-gram).
    backlog: usize,
}

/// Sets `speculation.draft` of the step's decoding sequences (and grows their block tables to hold
/// it), or leaves every draft empty when the step should not speculate (see the module docs).
/// `chunks` is the scheduled step; `max_batch_tokens` the scheduler's token budget; `costs` what
/// the worker measured (the draft model's passes are recorded into it); `drafter` the draft model
/// (used when the proposer is [`Proposer::Draft`]; without one that proposer proposes only forced
/// tokens).
pub(crate) fn plan_drafts<M: BatchModel>(
    config: &SpeculationConfig,
    chunks: &[Chunk],
    seqs: &mut HashMap<SeqId, Sequence>,
    pool: &mut BlockPool,
    max_batch_tokens: usize,
    costs: &mut DraftCosts,
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
    let mut budget = max_batch_tokens
        .min(MAX_SPECULATIVE_STEP_TOKENS)
        .saturating_sub(chunks.len());
    let has_model = drafter.is_some();
    let mut candidates: Vec<Candidate> = chunks
        .iter()
        .filter_map(|chunk| {
            let seq = seqs.get(&chunk.seq)?;
            candidate(config, has_model, chunk.seq, seq, pool, budget)
        })
        .collect();
    // One k for the step, from the measured costs: over what each sequence may propose (n-gram:
    // what its lookup found).
    let (mut choice, mut always_right_k) = choose(&candidates, chunks.len(), seqs, costs);
    // A draft model behind (a prompt it never saw, tokens decoded while it was idle) catches up
    // only where that pays at the step's expected gain (an exploring step has none: it measures),
    // judged again at each lower gain until every catch-up left pays.
    loop {
        let mut excluded = false;
        let behind = |c: &Candidate| c.backlog > 1 && c.proposable > 0;
        let judged = choice.k > 0 && !choice.explore;
        for c in candidates.iter_mut().filter(|c| judged && behind(c)) {
            let seq = &seqs[&c.seq];
            if !catch_up_pays(c.backlog, seq.tokens_left(), &choice, costs) {
                c.proposable = 0;
                excluded = true;
            }
        }
        if !excluded {
            break;
        }
        (choice, always_right_k) = choose(&candidates, chunks.len(), seqs, costs);
    }
    let step_k = choice.k;
    let mut speculated = false;

    let draft_context = drafter.as_ref().map_or(0, |d| d.context_length());
    let mut model_drafts = ModelDrafts::default();
    // Committed tokens the draft may catch up over in this step, all sequences together.
    let mut catch_up_budget = max_batch_tokens.min(MAX_CATCH_UP_TOKENS);
    for Candidate {
        seq: id,
        cap,
        mut draft,
        forced,
        proposable,
        backlog,
    } in candidates
    {
        let seq = seqs.get_mut(&id).expect("a candidate is a step's sequence");
        // A probe of a draft model that is behind pays its catch-up: only where that is cheap.
        let may_probe = backlog <= 1 || costs.probe_catch_up_pays(backlog, choice.plain_secs);
        let k = sequence_k(
            &mut seq.speculation,
            step_k,
            always_right_k,
            proposable,
            may_probe,
        );
        // Forced tokens are not throttled: they are always accepted.
        let wanted = (forced + k).min(cap).min(budget);
        let Some(blocks) = seq.blocks.as_mut().filter(|_| wanted > 0) else {
            continue;
        };
        // Room first: the verification (and a draft model) writes the proposals' positions.
        let verified = seq.computed + 1;
        let room = pool.grow_from_free(blocks, verified + wanted);
        let total = wanted.min(room.saturating_sub(verified));
        draft.truncate(total);
        budget -= total;
        seq.speculation.forced = forced.min(total);
        speculated |= total > forced;
        if config.proposer == Proposer::Draft {
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
                model_drafts.push(id, job);
            }
        }
        seq.speculation.draft = draft;
    }
    costs.steps_since_speculation = match speculated {
        true => 0,
        false => costs.steps_since_speculation + 1,
    };
    if let Some(drafter) = drafter {
        model_drafts.run(drafter, costs, seqs);
    }
}

/// The candidates of a decoding sequence that allows speculation, with `budget` tokens left in
/// the step: its cap, its forced tokens and (n-gram) what the lookup finds after them;
/// `has_model`: the worker has a draft model.
fn candidate(
    config: &SpeculationConfig,
    has_model: bool,
    id: SeqId,
    seq: &Sequence,
    pool: &BlockPool,
    budget: usize,
) -> Option<Candidate> {
    let blocks = seq.blocks.as_ref()?;
    if !seq.speculation.enabled || budget == 0 {
        return None;
    }
    let cap = config
        .num_speculative_tokens
        .min(seq.tokens_left().saturating_sub(1))
        .min(budget);
    let mut draft = match seq.constraint.as_deref() {
        Some(constraint) => constraint.forced_tokens(cap),
        None => Vec::new(),
    };
    let forced = draft.len();
    if config.proposer == Proposer::Ngram && forced < cap {
        let more = if forced == 0 {
            ngram::propose(&seq.tokens, config.ngram_min, config.ngram_max, cap)
        } else {
            // The n-gram continues the forced tokens (looked up as if they were committed).
            let mut context = Vec::with_capacity(seq.tokens.len() + forced);
            context.extend_from_slice(&seq.tokens);
            context.extend_from_slice(&draft);
            ngram::propose(&context, config.ngram_min, config.ngram_max, cap - forced)
        };
        draft.extend(more);
    }
    let (proposable, backlog) = match config.proposer {
        Proposer::Draft if has_model => {
            let seen = pool.draft_computed(blocks);
            (cap - forced, seq.computed.saturating_sub(seen))
        }
        Proposer::Draft | Proposer::Off => (0, 0),
        Proposer::Ngram => (draft.len() - forced, 0),
    };
    Some(Candidate {
        seq: id,
        cap,
        draft,
        forced,
        proposable,
        backlog,
    })
}

/// The step's [`DraftChoice`] over the candidates that may propose, among `decodes` decoding
/// sequences, and the `k` an always-right proposer would get.
fn choose(
    candidates: &[Candidate],
    decodes: usize,
    seqs: &HashMap<SeqId, Sequence>,
    costs: &DraftCosts,
) -> (DraftChoice, usize) {
    let prior = costs.prior_acceptance();
    let speculating: Vec<(f64, usize)> = candidates
        .iter()
        .filter(|c| c.proposable > 0)
        .map(|c| {
            (
                seqs[&c.seq].speculation.token_acceptance_rate(prior),
                c.proposable,
            )
        })
        .collect();
    let plain = decodes - speculating.len();
    // Forced tokens are verified whatever k is: they are in every size the choice compares.
    let forced: usize = candidates.iter().map(|c| c.forced).sum();
    let always_right: Vec<(f64, usize)> = speculating.iter().map(|&(_, c)| (1.0, c)).collect();
    (
        choose_draft_length(&speculating, plain, forced, costs),
        choose_draft_length(&always_right, plain, forced, costs).k,
    )
}

/// The number of tokens a sequence that may propose `proposable` proposes when the step's cost
/// model chose `step_k` (`always_right_k`: its choice were every proposal accepted): `step_k`, or
/// a two-token probe after the sequence's probe interval of idle steps where `may_probe` (see the
/// module docs). Updates the sequence's idle steps and probe interval.
fn sequence_k(
    spec: &mut super::SequenceSpeculation,
    step_k: usize,
    always_right_k: usize,
    proposable: usize,
    may_probe: bool,
) -> usize {
    let mut k = step_k.min(proposable);
    if k > 0 {
        spec.probe_interval = PROBE_AFTER_STEPS;
    } else if proposable > 0 {
        // Not even an always-right proposer would pay this step: only the longest interval.
        let interval = match always_right_k {
            0 => REMEASURE_AFTER_STEPS,
            _ => spec.probe_interval,
        };
        if may_probe && spec.idle_steps >= interval {
            k = proposable.min(2);
            spec.probe_interval = (spec.probe_interval * 2).min(REMEASURE_AFTER_STEPS);
        }
    }
    // Idle steps count the steps in which the sequence could have proposed and did not.
    spec.idle_steps = match (k, proposable) {
        (0, 0) => spec.idle_steps,
        (0, _) => spec.idle_steps + 1,
        _ => 0,
    };
    k
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
    fn run<M: BatchModel>(
        self,
        drafter: &mut Drafter<M>,
        costs: &mut DraftCosts,
        seqs: &mut HashMap<SeqId, Sequence>,
    ) {
        if self.jobs.is_empty() {
            return;
        }
        let jobs = &self.jobs;
        let proposed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            drafter.propose(jobs, costs)
        }));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculation::SequenceSpeculation;

    /// The steps (of `steps`) at which a sequence that may propose 5 tokens, and probe,
    /// speculates, when the cost model chooses `step_k` and would choose `always_right_k` for an
    /// always-right draft.
    fn speculating_steps(
        spec: &mut SequenceSpeculation,
        steps: u32,
        step_k: usize,
        always_right_k: usize,
    ) -> Vec<u32> {
        speculating_steps_with(spec, steps, step_k, always_right_k, 5, true)
    }

    /// [`speculating_steps`] for a sequence that may propose `proposable` tokens and probe where
    /// `may_probe`.
    fn speculating_steps_with(
        spec: &mut SequenceSpeculation,
        steps: u32,
        step_k: usize,
        always_right_k: usize,
        proposable: usize,
        may_probe: bool,
    ) -> Vec<u32> {
        (0..steps)
            .filter(|_| sequence_k(spec, step_k, always_right_k, proposable, may_probe) > 0)
            .collect()
    }

    #[test]
    fn probes_back_off_while_speculation_does_not_pay() {
        let mut spec = SequenceSpeculation::new(true);
        // Each probe doubles the interval of idle steps before the next: 8, 16, ..., 256.
        assert_eq!(
            speculating_steps(&mut spec, 600, 0, 3),
            vec![8, 25, 58, 123, 252, 509]
        );
        assert_eq!(spec.probe_interval, REMEASURE_AFTER_STEPS);
        // A probe proposes two tokens.
        spec.idle_steps = REMEASURE_AFTER_STEPS;
        assert_eq!(sequence_k(&mut spec, 0, 3, 5, true), 2);
        // When speculation pays again the interval starts over.
        assert_eq!(sequence_k(&mut spec, 3, 3, 5, true), 3);
        assert_eq!(spec.probe_interval, PROBE_AFTER_STEPS);
        assert_eq!(speculating_steps(&mut spec, 10, 0, 3), vec![8]);
        // Not even an always-right draft would pay: the longest interval at once.
        let mut spec = SequenceSpeculation::new(true);
        assert_eq!(speculating_steps(&mut spec, 300, 0, 0), vec![256]);
        // Nothing to propose: no probe, and no idle step counted (a first match is not a probe).
        let mut spec = SequenceSpeculation::new(true);
        assert!(speculating_steps_with(&mut spec, 20, 0, 3, 0, true).is_empty());
        assert_eq!(spec.idle_steps, 0);
        // The longest interval applies while not even an always-right proposer pays, and the
        // backoff's own interval again once one would.
        let mut spec = SequenceSpeculation::new(true);
        assert_eq!(speculating_steps(&mut spec, 20, 0, 0), Vec::<u32>::new());
        assert_eq!(speculating_steps(&mut spec, 1, 0, 3), vec![0]);
        // A draft model whose catch-up is costly: no probe.
        let mut spec = SequenceSpeculation::new(true);
        assert!(speculating_steps_with(&mut spec, 300, 0, 3, 5, false).is_empty());
    }
}
