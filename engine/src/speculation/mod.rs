//! Speculative decoding whose output is bitwise plain decoding's (issue 28).
//!
//! A decoding sequence gets up to k proposed tokens (the *draft*, from a [`Proposer`]); the step runs
//! its last committed token plus the draft as one batch entry that returns the logits of all k + 1
//! positions ([`crate::backend::BatchEntry::logit_tokens`]). The backends' kernels are batch and
//! chunk invariant, so each row is bitwise the row plain decoding computes at that position.
//! `verify` then commits, position by position, exactly the token plain decoding would emit
//! there (same sampler, same draw index, penalties over the committed tokens before it, the
//! constraint's mask in the state after them), while it equals the proposal; the first mismatch
//! commits the model's own token, so every step commits at least one token and the committed tokens
//! are plain decoding's. Rejected positions never touch the sequence's tokens, penalties or
//! constraint state (those only ever see committed tokens); their K/V lies past `computed` and the
//! blocks that held only them go back to the free list ([`crate::kv::BlockPool::truncate`]), and
//! only blocks full of computed committed tokens are ever hashed into the prefix cache.
//!
//! Proposals come from the configured [`Proposer`] and, for a constrained sequence, from its
//! constraint: the tokens it forces (the only token its mask allows at each of the next positions,
//! [`structured_output::ConstraintState::forced_tokens`]) lead the draft. They cost nothing to
//! propose but a lookahead on a copy of the constraint, are always accepted, and so are proposed
//! whatever number of proposals the cost model chooses; they count in the request's `draft_tokens` and
//! `accepted_draft_tokens` and in the metrics under [`metrics::FORCED_LABEL`]. Verification treats
//! them like any proposal, so exactness does not depend on them being forced.
//!
//! - [`ngram`]: the prompt-lookup proposer.
//! - [`draft`]: the draft-model proposer (a second model whose K/V lives in the same block pool).
//! - [`draft_cost`]: how long either proposer's drafts are, from measured costs.
//! - `plan`: which sequences speculate in a step, and how far (the "never slower" policy), forced
//!   tokens first.
//! - `verify`: the acceptance rule.
//! - [`metrics`]: the process-wide counters and histogram the worker exports.

pub mod draft;
pub mod draft_cost;
pub mod metrics;
pub mod ngram;
mod plan;
mod verify;

pub(crate) use plan::plan_drafts;
pub(crate) use verify::verify;

/// Most speculative tokens per sequence and step that `num_speculative_tokens` may ask for.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// Which proposer drafts tokens (the worker's `speculation` setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Proposer {
    /// No speculation: every step scores one token per decoding sequence.
    #[default]
    Off,
    /// Prompt lookup: the tokens that followed the most recent earlier occurrence of the last n
    /// tokens of the prompt and generated text ([`ngram::propose`]).
    Ngram,
    /// A draft model with the target's vocabulary proposes greedily ([`draft`]).
    Draft,
}

impl Proposer {
    /// The setting's value for this proposer (`off`, `ngram`, `draft`), also the metrics'
    /// `proposer` label.
    pub fn name(self) -> &'static str {
        match self {
            Proposer::Off => "off",
            Proposer::Ngram => "ngram",
            Proposer::Draft => "draft",
        }
    }
}

/// A speculation setting the engine cannot run; the message names the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpeculationConfigError {
    /// `num_speculative_tokens` outside `1..=MAX_SPECULATIVE_TOKENS`.
    #[error(
        "num_speculative_tokens must be in 1..={MAX_SPECULATIVE_TOKENS} (tokens proposed per \
         sequence and step), got {0}"
    )]
    NumSpeculativeTokens(usize),
    /// `ngram_min` / `ngram_max` not `1 <= ngram_min <= ngram_max <= 64`.
    #[error("ngram_min and ngram_max must satisfy 1 <= ngram_min <= ngram_max <= 64, got ngram_min = {min}, ngram_max = {max}")]
    NgramRange {
        /// The `ngram_min` given.
        min: usize,
        /// The `ngram_max` given.
        max: usize,
    },
}

/// The engine's speculation settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculationConfig {
    /// Which proposer runs.
    pub proposer: Proposer,
    /// Most tokens proposed per sequence and step (the scheduler picks 0 up to this).
    pub num_speculative_tokens: usize,
    /// Shortest suffix the n-gram proposer matches, in tokens.
    pub ngram_min: usize,
    /// Longest suffix the n-gram proposer matches (tried first), in tokens.
    pub ngram_max: usize,
}

impl Default for SpeculationConfig {
    /// Off, with the defaults for the rest (5 tokens, n-grams of 3 down to 1).
    fn default() -> Self {
        Self {
            proposer: Proposer::Off,
            num_speculative_tokens: 5,
            ngram_min: 1,
            ngram_max: 3,
        }
    }
}

impl SpeculationConfig {
    /// Checks the numbers (also when the proposer is off, so a bad file fails at once).
    ///
    /// Errors: [`SpeculationConfigError`] naming the setting.
    pub fn validate(&self) -> Result<(), SpeculationConfigError> {
        if !(1..=MAX_SPECULATIVE_TOKENS).contains(&self.num_speculative_tokens) {
            return Err(SpeculationConfigError::NumSpeculativeTokens(
                self.num_speculative_tokens,
            ));
        }
        if !(1 <= self.ngram_min && self.ngram_min <= self.ngram_max && self.ngram_max <= 64) {
            return Err(SpeculationConfigError::NgramRange {
                min: self.ngram_min,
                max: self.ngram_max,
            });
        }
        Ok(())
    }
}

/// One sequence's speculation state.
#[derive(Debug, Clone)]
pub struct SequenceSpeculation {
    /// The request allows speculation (its per-request opt-out clears it).
    pub enabled: bool,
    /// This step's proposals (empty: a plain decode step).
    pub draft: Vec<u32>,
    /// How many of `draft`'s leading tokens the sequence's constraint forces (the only token its
    /// mask allows there, so always accepted); the rest came from the proposer.
    pub forced: usize,
    /// Tokens proposed for this request so far.
    pub draft_tokens: u64,
    /// Of those, tokens accepted.
    pub accepted_draft_tokens: u64,
    /// With a draft model: the end of the positions whose draft K/V this step's draft passes
    /// wrote (set while planning, taken by the verification).
    pub draft_written: Option<usize>,
    /// Planned steps in a row in which this sequence proposed nothing of the proposer's (its
    /// expected gain did not pay for the proposals); see [`draft_cost::PROBE_AFTER_STEPS`].
    pub idle_steps: u32,
    /// Idle steps after which this sequence probes: [`draft_cost::PROBE_AFTER_STEPS`], doubled by every
    /// probe after which speculation still did not pay, up to [`draft_cost::REMEASURE_AFTER_STEPS`];
    /// back to the first when the cost model chooses to speculate.
    pub probe_interval: u32,
    /// Recent per-token acceptance probability of the proposer's tokens, for the cost model
    /// ([`draft_cost`]): accepted / (accepted + rejections), each verification counting one
    /// rejection when it stopped at one (a verification stops at its first rejection, so accepted
    /// / proposed per step would underestimate it); forced tokens do not count. Decayed sums:
    /// (accepted, trials).
    pub token_acceptance: (f64, f64),
}

impl SequenceSpeculation {
    /// The per-token acceptance probability (see [`SequenceSpeculation::token_acceptance`]);
    /// `prior` before the first verification (the worker's recent rate over all sequences,
    /// [`draft_cost::DraftCosts::prior_acceptance`]).
    pub fn token_acceptance_rate(&self, prior: f64) -> f64 {
        let (acc, trials) = self.token_acceptance;
        if trials <= 0.0 {
            prior
        } else {
            acc / trials
        }
    }

    /// A request's state before its first step; `enabled` = it allows speculation.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            draft: Vec::new(),
            forced: 0,
            draft_written: None,
            idle_steps: 0,
            probe_interval: draft_cost::PROBE_AFTER_STEPS,
            token_acceptance: (0.0, 0.0),
            draft_tokens: 0,
            accepted_draft_tokens: 0,
        }
    }

    /// Records a verification of `proposed` tokens, the first `forced` of them forced by the
    /// constraint, of which the first `accepted` were accepted. Forced tokens count in the totals
    /// but not in the acceptance rate (they say nothing about the proposer).
    pub fn record(&mut self, proposed: usize, forced: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        self.draft_tokens += proposed as u64;
        self.accepted_draft_tokens += accepted as u64;
        if let Some((accepted, trials)) = draft_cost::token_trials(proposed, forced, accepted) {
            let (acc, all) = self.token_acceptance;
            self.token_acceptance = (0.7 * acc + accepted, 0.7 * all + trials);
        }
    }
}

#[cfg(test)]
mod draft_tests;
#[cfg(test)]
mod forced_tests;
#[cfg(test)]
mod tests;
