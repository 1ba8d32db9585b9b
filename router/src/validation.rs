//! Request validation: every check returns `INVALID_ARGUMENT` with a message that gives the numbers.
//!
//! Checks run in two phases: [`check_request`] before tokenization (shape, ranges, stop strings,
//! size) and, once the model is known, [`check_prompt`] (prompt length against the context and the
//! limits) and [`check_vocab`] (token ids against the vocabulary).
//!
//! The sampling ranges are `inference_proto::sampling_limits`, which the worker checks again.

use inference_proto::public::GenerateRequest;
use inference_proto::worker::SamplingParams;
use prost::Message;
use tonic::Status;

use crate::config::Limits;
use crate::model_context::ModelContext;

pub use inference_proto::sampling_limits::{
    MAX_ABS_LOGIT_BIAS, MAX_ABS_PENALTY, MAX_LOGIT_BIAS_ENTRIES, MAX_MIN_P, MAX_REPETITION_PENALTY,
    MAX_TOP_LOGPROBS,
};

/// Sampling parameters after validation, with defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// In (0, 1]; 1 = off.
    pub top_p: f32,
    /// In [0, 1]; 0 = off.
    pub min_p: f32,
    /// In (0, 10]; 1 = off (a request's 0 becomes 1).
    pub repetition_penalty: f32,
    /// In [-2, 2]; 0 = off.
    pub frequency_penalty: f32,
    /// In [-2, 2]; 0 = off.
    pub presence_penalty: f32,
    /// `(token id, bias)` sorted by id, biases in [-100, 100]; ids are checked by [`check_vocab`].
    pub logit_bias: Vec<(u32, f32)>,
    /// In [0, 20].
    pub top_logprobs: u32,
}

impl Sampling {
    /// The worker protocol's `SamplingParams` for these parameters and `seed`.
    pub fn to_wire(&self, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: self.logit_bias.iter().copied().collect(),
            top_logprobs: self.top_logprobs,
        }
    }
}

/// Checks everything that does not need the tokenizer. Returns the sampling parameters.
///
/// Errors: `INVALID_ARGUMENT` for a request larger than `max_request_bytes` (over gRPC the router's
/// [`crate::wire::WireGuard`] already refuses such a message with `RESOURCE_EXHAUSTED` from its frame
/// header; this check covers callers of the library), both or neither of
/// `prompt`/`messages`, an empty message role, `max_new_tokens` of 0 or above the limit, a negative or
/// non-finite temperature, `top_p` outside (0, 1], `min_p` outside [0, 1], `repetition_penalty`
/// outside (0, 10] (0 is accepted and means off), `frequency_penalty` or `presence_penalty` outside
/// [-2, 2], more than 300 `logit_bias` entries or a bias outside [-100, 100], `top_logprobs` above 20,
/// too many, empty or too long stop strings.
pub fn check_request(req: &GenerateRequest, limits: &Limits) -> Result<Sampling, Status> {
    let size = req.encoded_len();
    if size > limits.max_request_bytes as usize {
        return invalid(format!(
            "request is {size} bytes; the limit is {} bytes",
            limits.max_request_bytes
        ));
    }
    match (req.prompt.is_empty(), req.messages.is_empty()) {
        (false, false) => return invalid("set either prompt or messages, not both".into()),
        (true, true) => return invalid("prompt is empty (set prompt or messages)".into()),
        _ => {}
    }
    if let Some(i) = req.messages.iter().position(|m| m.role.is_empty()) {
        return invalid(format!("messages[{i}].role is empty"));
    }
    if let Some(n) = req.max_new_tokens {
        if n == 0 {
            return invalid("max_new_tokens must be at least 1".into());
        }
        if n > limits.max_new_tokens {
            return invalid(format!(
                "max_new_tokens is {n}; the limit is {}",
                limits.max_new_tokens
            ));
        }
    }
    if !(req.temperature.is_finite() && req.temperature >= 0.0) {
        return invalid(format!(
            "temperature must be a finite number >= 0 (0 = greedy), got {}",
            req.temperature
        ));
    }
    let top_p = req.top_p.unwrap_or(1.0);
    if top_p.is_nan() || top_p <= 0.0 || top_p > 1.0 {
        return invalid(format!("top_p must be in (0, 1], got {top_p}"));
    }
    let sampling = check_sampling(req, top_p)?;
    if req.stop.len() > limits.max_stop_sequences as usize {
        return invalid(format!(
            "{} stop sequences given; the limit is {}",
            req.stop.len(),
            limits.max_stop_sequences
        ));
    }
    for (i, stop) in req.stop.iter().enumerate() {
        let chars = stop.chars().count();
        if chars == 0 {
            return invalid(format!("stop[{i}] is empty"));
        }
        if chars > limits.max_stop_sequence_chars as usize {
            return invalid(format!(
                "stop[{i}] is {chars} characters; the limit is {}",
                limits.max_stop_sequence_chars
            ));
        }
    }
    Ok(sampling)
}

/// The sampling checks past temperature and top_p (see [`check_request`]).
fn check_sampling(req: &GenerateRequest, top_p: f32) -> Result<Sampling, Status> {
    let min_p = req.min_p;
    if !(0.0..=MAX_MIN_P).contains(&min_p) {
        return invalid(format!("min_p must be in [0, 1] (0 = off), got {min_p}"));
    }
    let rp = req.repetition_penalty;
    if !(0.0..=MAX_REPETITION_PENALTY).contains(&rp) {
        return invalid(format!(
            "repetition_penalty must be in (0, {MAX_REPETITION_PENALTY}] (1 or 0 = off), got {rp}"
        ));
    }
    for (name, v) in [
        ("frequency_penalty", req.frequency_penalty),
        ("presence_penalty", req.presence_penalty),
    ] {
        if !(-MAX_ABS_PENALTY..=MAX_ABS_PENALTY).contains(&v) {
            return invalid(format!(
                "{name} must be in [-{MAX_ABS_PENALTY}, {MAX_ABS_PENALTY}] (0 = off), got {v}"
            ));
        }
    }
    if req.logit_bias.len() > MAX_LOGIT_BIAS_ENTRIES {
        return invalid(format!(
            "logit_bias has {} entries; the limit is {MAX_LOGIT_BIAS_ENTRIES}",
            req.logit_bias.len()
        ));
    }
    let mut logit_bias: Vec<(u32, f32)> = req.logit_bias.iter().map(|(&k, &v)| (k, v)).collect();
    logit_bias.sort_unstable_by_key(|&(id, _)| id);
    if let Some((id, bias)) = logit_bias
        .iter()
        .find(|(_, b)| !(-MAX_ABS_LOGIT_BIAS..=MAX_ABS_LOGIT_BIAS).contains(b))
    {
        return invalid(format!(
            "logit_bias[{id}] must be in [-{MAX_ABS_LOGIT_BIAS}, {MAX_ABS_LOGIT_BIAS}], got {bias}"
        ));
    }
    if req.top_logprobs > MAX_TOP_LOGPROBS {
        return invalid(format!(
            "top_logprobs is {}; the limit is {MAX_TOP_LOGPROBS}",
            req.top_logprobs
        ));
    }
    Ok(Sampling {
        temperature: req.temperature,
        top_k: req.top_k,
        top_p,
        min_p,
        repetition_penalty: if rp == 0.0 { 1.0 } else { rp },
        frequency_penalty: req.frequency_penalty,
        presence_penalty: req.presence_penalty,
        logit_bias,
        top_logprobs: req.top_logprobs,
    })
}

/// Checks the token ids a request names (its `logit_bias` keys) against the model's vocabulary.
///
/// Errors: `INVALID_ARGUMENT` for an id `>= vocab_size` (the message names the lowest one).
pub fn check_vocab(sampling: &Sampling, vocab_size: u32) -> Result<(), Status> {
    match sampling.logit_bias.iter().find(|(id, _)| *id >= vocab_size) {
        Some((id, _)) => invalid(format!(
            "logit_bias token id {id} is outside this model's vocabulary of {vocab_size} tokens \
             (ids 0..={})",
            vocab_size.saturating_sub(1)
        )),
        None => Ok(()),
    }
}

/// Checks a request's structured-output `constraint` (when it has one) by compiling it against the
/// model's vocabulary, as the worker will: the request is refused before any work when the worker
/// could not follow it. Blocks while the model's compiler is still being built, and compiling takes
/// milliseconds: call it off the async runtime.
///
/// Errors: `INVALID_ARGUMENT` naming the problem for an empty constraint, a schema that is not JSON
/// or that llguidance cannot compile (unsupported keyword, unresolvable `$ref`, contradictory
/// bounds, ...), an invalid regex or Lark grammar, an empty choice list or choice; with
/// `ignore_eos` (a complete output ends with EOS); and for a model whose vocabulary cannot have
/// structured output (the message says why).
pub fn check_constraint(req: &GenerateRequest, model: &ModelContext) -> Result<(), Status> {
    let Some(constraint) = &req.constraint else {
        return Ok(());
    };
    if req.ignore_eos {
        return invalid(
            "ignore_eos cannot be combined with a constraint (a complete structured output ends \
             with EOS)"
                .into(),
        );
    }
    let compiler = model.constraints.wait().map_err(|reason| {
        Status::invalid_argument(format!(
            "constraint: structured output is not available for this model: {reason}"
        ))
    })?;
    compiler
        .compile(constraint)
        .map(drop)
        .map_err(|e| Status::invalid_argument(e.to_string()))
}

/// Checks the tokenized prompt and returns the effective `max_new_tokens`.
///
/// Unset `max_new_tokens` becomes `default_max_new_tokens`, capped by the room left in the context.
///
/// Errors: `INVALID_ARGUMENT` for a prompt with no tokens, a prompt that leaves no room in the context
/// or passes `max_input_tokens`, and a `max_new_tokens` that does not fit in the context after the
/// prompt.
pub fn check_prompt(
    prompt_tokens: usize,
    requested_max_new: Option<u32>,
    context_length: u32,
    limits: &Limits,
) -> Result<u32, Status> {
    let ctx = context_length as usize;
    if prompt_tokens == 0 {
        return invalid("prompt encodes to no tokens".into());
    }
    if prompt_tokens >= ctx {
        return invalid(format!(
            "prompt is {prompt_tokens} tokens; this model's context is {ctx} tokens \
             (the prompt must leave room for at least one new token)"
        ));
    }
    let max_input = limits.max_input_tokens as usize;
    if max_input > 0 && prompt_tokens > max_input {
        return invalid(format!(
            "prompt is {prompt_tokens} tokens; the limit is {max_input} tokens"
        ));
    }
    let room = (ctx - prompt_tokens) as u32;
    match requested_max_new {
        Some(n) if n > room => invalid(format!(
            "prompt ({prompt_tokens} tokens) + max_new_tokens ({n}) exceeds this model's \
             context of {ctx} tokens; at most {room} new tokens fit"
        )),
        Some(n) => Ok(n),
        None => Ok(limits.default_max_new_tokens.min(room).max(1)),
    }
}

fn invalid<T>(message: String) -> Result<T, Status> {
    Err(Status::invalid_argument(message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use inference_proto::public::ChatMessage;

    fn req() -> GenerateRequest {
        GenerateRequest {
            prompt: "hi".into(),
            ..Default::default()
        }
    }

    fn err(r: &GenerateRequest) -> String {
        let status = check_request(r, &Limits::default()).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        status.message().to_string()
    }

    fn off() -> Sampling {
        Sampling {
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

    #[test]
    fn accepts_defaults() {
        let s = check_request(&req(), &Limits::default()).unwrap();
        assert_eq!(s, off());
    }

    #[test]
    fn accepts_sampling_extremes_and_normalises() {
        let r = GenerateRequest {
            temperature: 0.7,
            top_k: 40,
            top_p: Some(0.9),
            min_p: 1.0,
            repetition_penalty: 10.0,
            frequency_penalty: -2.0,
            presence_penalty: 2.0,
            logit_bias: (0..300)
                .map(|id| (299 - id, id as f32 / 3.0 - 50.0))
                .collect(),
            logprobs: true,
            top_logprobs: 20,
            ..req()
        };
        let s = check_request(&r, &Limits::default()).unwrap();
        assert_eq!(s.logit_bias.len(), 300);
        assert!(s.logit_bias.windows(2).all(|w| w[0].0 < w[1].0), "sorted");
        assert_eq!(s.logit_bias[0], (0, 299.0 / 3.0 - 50.0));
        assert_eq!(
            (s.min_p, s.repetition_penalty, s.top_logprobs),
            (1.0, 10.0, 20)
        );
        let wire = s.to_wire(42);
        assert_eq!(wire.seed, 42);
        assert_eq!(wire.top_p, 0.9);
        assert_eq!(wire.top_k, 40);
        assert_eq!(wire.min_p, 1.0);
        assert_eq!(wire.repetition_penalty, 10.0);
        assert_eq!((wire.frequency_penalty, wire.presence_penalty), (-2.0, 2.0));
        assert_eq!(wire.logit_bias.len(), 300);
        assert_eq!(wire.logit_bias[&299], -50.0);
        assert_eq!(wire.top_logprobs, 20);
        // repetition_penalty 0 (unset) is off, which the worker receives as 1.
        let s = check_request(
            &GenerateRequest {
                repetition_penalty: 0.0,
                ..req()
            },
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(s.repetition_penalty, 1.0);
        assert_eq!(s.to_wire(0).repetition_penalty, 1.0);
    }

    #[test]
    fn rejects_min_p_outside_0_1() {
        for bad in [-0.1, 1.5, f32::NAN] {
            let m = err(&GenerateRequest {
                min_p: bad,
                ..req()
            });
            assert!(m.contains("min_p must be in [0, 1]"), "{m}");
            assert!(m.contains(&bad.to_string()), "{m}");
        }
    }

    #[test]
    fn rejects_repetition_penalty_outside_0_10() {
        for bad in [-1.0, 10.5, f32::INFINITY, f32::NAN] {
            let m = err(&GenerateRequest {
                repetition_penalty: bad,
                ..req()
            });
            assert!(m.contains("repetition_penalty must be in (0, 10]"), "{m}");
            assert!(m.contains(&bad.to_string()), "{m}");
        }
    }

    #[test]
    fn rejects_frequency_and_presence_penalties_outside_2() {
        let m = err(&GenerateRequest {
            frequency_penalty: 2.5,
            ..req()
        });
        assert_eq!(m, "frequency_penalty must be in [-2, 2] (0 = off), got 2.5");
        let m = err(&GenerateRequest {
            presence_penalty: -3.0,
            ..req()
        });
        assert_eq!(m, "presence_penalty must be in [-2, 2] (0 = off), got -3");
        assert!(err(&GenerateRequest {
            presence_penalty: f32::NAN,
            ..req()
        })
        .contains("presence_penalty"));
    }

    #[test]
    fn rejects_logit_bias_values_and_counts() {
        let m = err(&GenerateRequest {
            logit_bias: [(5, 1.0), (7, 100.5), (9, -101.0)].into(),
            ..req()
        });
        assert_eq!(m, "logit_bias[7] must be in [-100, 100], got 100.5");
        assert!(err(&GenerateRequest {
            logit_bias: [(3, f32::NAN)].into(),
            ..req()
        })
        .contains("logit_bias[3]"));
        let m = err(&GenerateRequest {
            logit_bias: (0..301).map(|id| (id, 1.0)).collect(),
            ..req()
        });
        assert_eq!(m, "logit_bias has 301 entries; the limit is 300");
    }

    #[test]
    fn rejects_top_logprobs_above_20() {
        let m = err(&GenerateRequest {
            top_logprobs: 21,
            ..req()
        });
        assert_eq!(m, "top_logprobs is 21; the limit is 20");
    }

    #[test]
    fn logit_bias_ids_against_the_vocabulary() {
        let s = Sampling {
            logit_bias: vec![(3, 1.0), (99, -1.0), (100, 2.0), (500, 0.0)],
            ..off()
        };
        let e = check_vocab(&s, 100).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            e.message(),
            "logit_bias token id 100 is outside this model's vocabulary of 100 tokens (ids 0..=99)"
        );
        assert!(check_vocab(&s, 501).is_ok());
        assert!(check_vocab(&off(), 1).is_ok());
    }

    #[test]
    fn rejects_bad_shapes_and_ranges() {
        assert!(err(&GenerateRequest::default()).contains("prompt is empty"));
        let mut both = req();
        both.messages.push(ChatMessage {
            role: "user".into(),
            content: "x".into(),
        });
        assert!(err(&both).contains("not both"));
        assert!(err(&GenerateRequest {
            max_new_tokens: Some(0),
            ..req()
        })
        .contains("at least 1"));
        assert!(err(&GenerateRequest {
            max_new_tokens: Some(5000),
            ..req()
        })
        .contains("4096"));
        assert!(err(&GenerateRequest {
            temperature: -0.5,
            ..req()
        })
        .contains("-0.5"));
        assert!(err(&GenerateRequest {
            temperature: f32::NAN,
            ..req()
        })
        .contains("finite"));
        assert!(err(&GenerateRequest {
            top_p: Some(0.0),
            ..req()
        })
        .contains("(0, 1]"));
        assert!(err(&GenerateRequest {
            top_p: Some(1.5),
            ..req()
        })
        .contains("1.5"));
        let stops = GenerateRequest {
            stop: vec!["a".into(); 9],
            ..req()
        };
        assert!(err(&stops).contains("9 stop sequences given; the limit is 8"));
        assert!(err(&GenerateRequest {
            stop: vec![String::new()],
            ..req()
        })
        .contains("stop[0] is empty"));
        let big = GenerateRequest {
            prompt: "x".repeat(2 << 20),
            ..req()
        };
        assert!(err(&big).contains("bytes"));
    }

    #[test]
    fn prompt_against_context() {
        let l = Limits::default();
        assert_eq!(check_prompt(10, None, 100, &l).unwrap(), 90);
        assert_eq!(check_prompt(10, Some(5), 100, &l).unwrap(), 5);
        assert!(check_prompt(100, None, 100, &l)
            .unwrap_err()
            .message()
            .contains("prompt is 100 tokens; this model's context is 100 tokens"));
        assert!(check_prompt(10, Some(91), 100, &l)
            .unwrap_err()
            .message()
            .contains("at most 90"));
        assert!(check_prompt(0, None, 100, &l).is_err());
        let l = Limits {
            max_input_tokens: 5,
            ..Limits::default()
        };
        assert!(check_prompt(6, None, 100, &l)
            .unwrap_err()
            .message()
            .contains("limit is 5"));
    }
}
