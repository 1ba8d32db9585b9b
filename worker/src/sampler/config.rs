//! [`SamplingConfig`]: one request's sampling parameters, and their validation from the wire.
//!
//! The ranges are `inference_proto::sampling_limits`, shared with the router; the worker checks them
//! again because it does not trust its callers.

use inference_proto::worker::SamplingParams;

pub use inference_proto::sampling_limits::{
    MAX_ABS_LOGIT_BIAS, MAX_ABS_PENALTY, MAX_REPETITION_PENALTY, MAX_TOP_LOGPROBS,
};

/// How to pick the next token: the processing steps of [`Sampler`](super::Sampler), in the order it
/// applies them (see the [module docs](super) for the whole pipeline).
///
/// [`Default`] is greedy decoding with every step off. A config built by hand is not validated;
/// [`from_wire`](Self::from_wire) and [`validate`](Self::validate) check the documented ranges, and
/// out-of-range values that slip through behave as noted on each field (never a panic).
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
    /// The config for the worker protocol's `SamplingParams` (the seed is not part of it: pass
    /// `params.seed` to [`Sampler::new`](super::Sampler::new)).
    ///
    /// `repetition_penalty` 0 (the protocol's unset value) means 1 (off); `logit_bias` is sorted by id.
    ///
    /// Errors (a message naming the field and the value): `temperature` negative or not finite, `top_p`
    /// outside (0, 1], `min_p` outside [0, 1], `repetition_penalty` outside (0, 10] (0 allowed as off),
    /// `frequency_penalty` or `presence_penalty` outside [-2, 2], a `logit_bias` value outside
    /// [-100, 100], `top_logprobs` above 20. Token ids are checked by
    /// [`check_vocab`](Self::check_vocab), which needs the vocabulary size.
    pub fn from_wire(params: &SamplingParams) -> Result<SamplingConfig, String> {
        let mut logit_bias: Vec<(u32, f32)> = params
            .logit_bias
            .iter()
            .map(|(&id, &bias)| (id, bias))
            .collect();
        logit_bias.sort_unstable_by_key(|&(id, _)| id);
        let config = SamplingConfig {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            min_p: params.min_p,
            repetition_penalty: if params.repetition_penalty == 0.0 {
                1.0
            } else {
                params.repetition_penalty
            },
            frequency_penalty: params.frequency_penalty,
            presence_penalty: params.presence_penalty,
            logit_bias,
            top_logprobs: params.top_logprobs,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the ranges [`from_wire`](Self::from_wire) documents (here `repetition_penalty` must be in
    /// (0, 10]: 0 is only the wire's spelling of "off").
    pub fn validate(&self) -> Result<(), String> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(format!(
                "temperature must be a finite number >= 0 (0 = greedy), got {t}"
            ));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {p}"));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return Err(format!("min_p must be in [0, 1], got {m}"));
        }
        let r = self.repetition_penalty;
        if !(r > 0.0 && r <= MAX_REPETITION_PENALTY) {
            return Err(format!(
                "repetition_penalty must be in (0, {MAX_REPETITION_PENALTY}] (1 = off), got {r}"
            ));
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !(-MAX_ABS_PENALTY..=MAX_ABS_PENALTY).contains(&v) {
                return Err(format!(
                    "{name} must be in [-{MAX_ABS_PENALTY}, {MAX_ABS_PENALTY}], got {v}"
                ));
            }
        }
        if let Some(&(id, bias)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-MAX_ABS_LOGIT_BIAS..=MAX_ABS_LOGIT_BIAS).contains(b))
        {
            return Err(format!(
                "logit_bias[{id}] must be in [-{MAX_ABS_LOGIT_BIAS}, {MAX_ABS_LOGIT_BIAS}], got {bias}"
            ));
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(format!(
                "top_logprobs is {}; the limit is {MAX_TOP_LOGPROBS}",
                self.top_logprobs
            ));
        }
        Ok(())
    }

    /// Checks that every `logit_bias` token id is below `vocab_size` (the length of the logits).
    ///
    /// Errors: a message with the first offending id and the vocabulary size.
    pub fn check_vocab(&self, vocab_size: usize) -> Result<(), String> {
        match self
            .logit_bias
            .iter()
            .find(|&&(id, _)| id as usize >= vocab_size)
        {
            Some((id, _)) => Err(format!(
                "logit_bias token id {id} is outside the vocabulary (size {vocab_size})"
            )),
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
