//! [`SamplingConfig`]: one request's sampling parameters, and their validation.
//!
//! The ranges are the `sampling-limits` crate's, shared with the router; the engine checks them
//! again because it does not trust its callers ([`SamplingConfig::validate`], [`SamplingError`]).

use sampling_limits::{
    MAX_ABS_LOGIT_BIAS, MAX_ABS_PENALTY, MAX_REPETITION_PENALTY, MAX_TOP_LOGPROBS,
};

/// How to pick the next token: the processing steps of [`Sampler`](super::Sampler), in the order it
/// applies them (see the [module docs](super) for the whole pipeline).
///
/// [`Default`] is greedy decoding with every step off. A config is not validated when built;
/// [`validate`](Self::validate) and [`check_vocab`](Self::check_vocab) check the documented ranges,
/// and out-of-range values that slip through behave as noted on each field (never a panic).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingConfig {
    /// Softmax temperature; `<= 0` (or NaN) means greedy argmax of the processed logits (ties go to the
    /// lowest id).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (ties: lower ids first); 0 disables.
    pub top_k: u32,
    /// Keep the smallest set of most likely tokens whose probability mass (of the distribution after
    /// temperature and top-k) is `>= top_p` (Holtzman et al. 2019; ties: lower ids first); values `>= 1`
    /// or `<= 0` disable.
    pub top_p: f32,
    /// Keep only tokens whose probability is `>= min_p` times the most likely token's, after top-k and
    /// top-p; `<= 0` disables, values above 1 act as 1.
    pub min_p: f32,
    /// CTRL repetition penalty (Keskar et al. 2019): for every distinct id in the prompt or the
    /// generated tokens, `logit > 0 ? logit / p : logit * p`. 1 disables; values `<= 0` or NaN are
    /// treated as 1.
    pub repetition_penalty: f32,
    /// OpenAI frequency penalty: `logit -= frequency_penalty * count`, `count` being how often the id
    /// occurs among the generated tokens (not the prompt). 0 disables.
    pub frequency_penalty: f32,
    /// OpenAI presence penalty: `logit -= presence_penalty` for every id generated at least once (not
    /// counting the prompt). 0 disables.
    pub presence_penalty: f32,
    /// `(token id, bias)` added to the logits before anything else, sorted by id with distinct ids.
    /// Ids outside the logits are ignored.
    pub logit_bias: Vec<(u32, f32)>,
    /// How many of the most likely tokens of the raw distribution to report with each sampled token
    /// ([`SampledToken::top_logprobs`](super::SampledToken::top_logprobs)); 0 reports none.
    pub top_logprobs: u32,
}

impl Default for SamplingConfig {
    /// Greedy decoding, no penalties, no bias, no alternatives.
    fn default() -> Self {
        SamplingConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            top_logprobs: 0,
        }
    }
}

impl SamplingConfig {
    /// Checks the ranges: `temperature` finite and `>= 0`, `top_p` in (0, 1], `min_p` in [0, 1],
    /// `repetition_penalty` in (0, 10] (1 = off), `frequency_penalty` and `presence_penalty` in
    /// [-2, 2], every `logit_bias` value in [-100, 100], `top_logprobs` at most 20. Token ids are
    /// checked by [`check_vocab`](Self::check_vocab), which needs the vocabulary size.
    ///
    /// Errors: the first [`SamplingError`] found, in that order.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(SamplingError::Temperature(t));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(SamplingError::TopP(p));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return Err(SamplingError::MinP(m));
        }
        let r = self.repetition_penalty;
        if !(r > 0.0 && r <= MAX_REPETITION_PENALTY) {
            return Err(SamplingError::RepetitionPenalty(r));
        }
        for (name, value) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !(-MAX_ABS_PENALTY..=MAX_ABS_PENALTY).contains(&value) {
                return Err(SamplingError::Penalty { name, value });
            }
        }
        if let Some(&(id, bias)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-MAX_ABS_LOGIT_BIAS..=MAX_ABS_LOGIT_BIAS).contains(b))
        {
            return Err(SamplingError::LogitBias { id, bias });
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(SamplingError::TopLogprobs(self.top_logprobs));
        }
        Ok(())
    }

    /// Checks that every `logit_bias` token id is below `vocab_size` (the length of the logits).
    ///
    /// Errors: [`SamplingError::LogitBiasOutsideVocab`] with the first offending id.
    pub fn check_vocab(&self, vocab_size: usize) -> Result<(), SamplingError> {
        match self
            .logit_bias
            .iter()
            .find(|&&(id, _)| id as usize >= vocab_size)
        {
            Some(&(id, _)) => Err(SamplingError::LogitBiasOutsideVocab { id, vocab_size }),
            None => Ok(()),
        }
    }

    /// Whether sampling is greedy: `temperature <= 0` (or NaN), or `top_k == 1`.
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature <= 0.0 || self.top_k == 1
    }

    /// Whether the repetition penalty is on (a finite value > 0 other than 1).
    pub(crate) fn repetition_on(&self) -> bool {
        let r = self.repetition_penalty;
        r > 0.0 && r.is_finite() && r != 1.0
    }

    /// Whether the frequency or the presence penalty is on.
    pub(crate) fn frequency_presence_on(&self) -> bool {
        self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }

    /// Whether any step changes the logits before greedy/temperature (bias or a penalty).
    pub(crate) fn processes_logits(&self) -> bool {
        !self.logit_bias.is_empty() || self.repetition_on() || self.frequency_presence_on()
    }
}

/// A sampling parameter outside its range (the message names the parameter, its range and the
/// value).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// `temperature` negative or not finite.
    #[error("temperature must be a finite number >= 0 (0 = greedy), got {0}")]
    Temperature(f32),
    /// `top_p` outside (0, 1].
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    /// `min_p` outside [0, 1].
    #[error("min_p must be in [0, 1], got {0}")]
    MinP(f32),
    /// `repetition_penalty` outside (0, 10].
    #[error("repetition_penalty must be in (0, {max}] (1 = off), got {0}", max = MAX_REPETITION_PENALTY)]
    RepetitionPenalty(f32),
    /// `frequency_penalty` or `presence_penalty` outside [-2, 2].
    #[error("{name} must be in [-{max}, {max}], got {value}", max = MAX_ABS_PENALTY)]
    Penalty {
        /// `frequency_penalty` or `presence_penalty`.
        name: &'static str,
        /// The value given.
        value: f32,
    },
    /// A `logit_bias` value outside [-100, 100].
    #[error("logit_bias[{id}] must be in [-{max}, {max}], got {bias}", max = MAX_ABS_LOGIT_BIAS)]
    LogitBias {
        /// The token id it biases.
        id: u32,
        /// The bias given.
        bias: f32,
    },
    /// `top_logprobs` above 20.
    #[error("top_logprobs is {0}; the limit is {max}", max = MAX_TOP_LOGPROBS)]
    TopLogprobs(u32),
    /// A `logit_bias` token id not below the vocabulary size.
    #[error("logit_bias token id {id} is outside the vocabulary (size {vocab_size})")]
    LogitBiasOutsideVocab {
        /// The first offending id.
        id: u32,
        /// The vocabulary size (the length of the logits).
        vocab_size: usize,
    },
}
