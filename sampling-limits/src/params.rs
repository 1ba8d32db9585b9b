//! [`SamplingConfig`]: one request's sampling parameters, the one shape the router's validation
//! yields and the engine's sampler reads, and [`SamplingConfig::validate`], their range check.
//!
//! The router checks a request with [`SamplingConfig::validate`] and words the refusal in its own
//! API's terms; the worker's engine calls it again because it does not trust its callers, and
//! reports [`SamplingError`]'s own messages.

use std::fmt;

use crate::{
    MAX_ABS_LOGIT_BIAS, MAX_ABS_PENALTY, MAX_LOGIT_BIAS_ENTRIES, MAX_MIN_P, MAX_REPETITION_PENALTY,
    MAX_TOP_LOGPROBS,
};

/// How to pick the next token: the processing steps of the engine's sampler, in the order it
/// applies them (bias, penalties, then greedy or temperature with top-k, top-p and min-p; the
/// engine's `sampler` module documents the whole pipeline).
///
/// [`Default`] is greedy decoding with every step off. A config is not validated when built;
/// [`validate`](Self::validate) and [`check_vocab`](Self::check_vocab) check the documented ranges,
/// and out-of-range values that slip through behave in the sampler as noted on each field (never a
/// panic).
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
    /// How many of the most likely tokens of the raw distribution to report with each sampled token;
    /// 0 reports none.
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
    /// [-2, 2], at most 300 `logit_bias` entries with every value in [-100, 100], `top_logprobs` at
    /// most 20. Token ids are checked by [`check_vocab`](Self::check_vocab), which needs the
    /// vocabulary size.
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
        if !(0.0..=MAX_MIN_P).contains(&m) {
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
        if self.logit_bias.len() > MAX_LOGIT_BIAS_ENTRIES {
            return Err(SamplingError::LogitBiasEntries(self.logit_bias.len()));
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
    /// Errors: [`SamplingError::LogitBiasOutsideVocab`] with the first offending id (the lowest, as
    /// `logit_bias` is sorted).
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
    pub fn repetition_on(&self) -> bool {
        let r = self.repetition_penalty;
        r > 0.0 && r.is_finite() && r != 1.0
    }

    /// Whether the frequency or the presence penalty is on.
    pub fn frequency_presence_on(&self) -> bool {
        self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }

    /// Whether any step changes the logits before greedy/temperature (bias or a penalty).
    pub fn processes_logits(&self) -> bool {
        !self.logit_bias.is_empty() || self.repetition_on() || self.frequency_presence_on()
    }
}

/// A sampling parameter outside its range. Its [`Display`](fmt::Display) names the parameter, its
/// range and the value (the worker's wording; the router words its refusals itself).
#[derive(Debug, Clone, PartialEq)]
pub enum SamplingError {
    /// `temperature` negative or not finite.
    Temperature(f32),
    /// `top_p` outside (0, 1].
    TopP(f32),
    /// `min_p` outside [0, 1].
    MinP(f32),
    /// `repetition_penalty` outside (0, 10].
    RepetitionPenalty(f32),
    /// `frequency_penalty` or `presence_penalty` outside [-2, 2].
    Penalty {
        /// `frequency_penalty` or `presence_penalty`.
        name: &'static str,
        /// The value given.
        value: f32,
    },
    /// More than 300 `logit_bias` entries (the number given).
    LogitBiasEntries(usize),
    /// A `logit_bias` value outside [-100, 100].
    LogitBias {
        /// The token id it biases.
        id: u32,
        /// The bias given.
        bias: f32,
    },
    /// `top_logprobs` above 20.
    TopLogprobs(u32),
    /// A `logit_bias` token id not below the vocabulary size.
    LogitBiasOutsideVocab {
        /// The first offending id.
        id: u32,
        /// The vocabulary size (the length of the logits).
        vocab_size: usize,
    },
}

impl SamplingError {
    /// The parameter at fault, as the APIs name it (`temperature`, `top_p`, ..., `logit_bias`).
    pub fn field(&self) -> &'static str {
        match self {
            Self::Temperature(_) => "temperature",
            Self::TopP(_) => "top_p",
            Self::MinP(_) => "min_p",
            Self::RepetitionPenalty(_) => "repetition_penalty",
            Self::Penalty { name, .. } => name,
            Self::LogitBiasEntries(_)
            | Self::LogitBias { .. }
            | Self::LogitBiasOutsideVocab { .. } => "logit_bias",
            Self::TopLogprobs(_) => "top_logprobs",
        }
    }
}

impl fmt::Display for SamplingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Temperature(t) => {
                write!(f, "temperature must be a finite number >= 0 (0 = greedy), got {t}")
            }
            Self::TopP(p) => write!(f, "top_p must be in (0, 1], got {p}"),
            Self::MinP(m) => write!(f, "min_p must be in [0, {MAX_MIN_P}], got {m}"),
            Self::RepetitionPenalty(r) => write!(
                f,
                "repetition_penalty must be in (0, {MAX_REPETITION_PENALTY}] (1 = off), got {r}"
            ),
            Self::Penalty { name, value } => write!(
                f,
                "{name} must be in [-{MAX_ABS_PENALTY}, {MAX_ABS_PENALTY}], got {value}"
            ),
            Self::LogitBiasEntries(n) => write!(
                f,
                "logit_bias has {n} entries; the limit is {MAX_LOGIT_BIAS_ENTRIES}"
            ),
            Self::LogitBias { id, bias } => write!(
                f,
                "logit_bias[{id}] must be in [-{MAX_ABS_LOGIT_BIAS}, {MAX_ABS_LOGIT_BIAS}], got {bias}"
            ),
            Self::TopLogprobs(n) => {
                write!(f, "top_logprobs is {n}; the limit is {MAX_TOP_LOGPROBS}")
            }
            Self::LogitBiasOutsideVocab { id, vocab_size } => write!(
                f,
                "logit_bias token id {id} is outside the vocabulary (size {vocab_size})"
            ),
        }
    }
}

impl std::error::Error for SamplingError {}
