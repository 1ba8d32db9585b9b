//! The request checks, each returning a [`ValidationError`] that names the field, with a message
//! that gives the numbers (see the module docs of [`super`] for the phases).

use inference_proto::sampling_limits::{
    SamplingConfig, SamplingError, MAX_ABS_PENALTY, MAX_REPETITION_PENALTY, MAX_TOP_LOGPROBS,
};
use structured_wire::constraint_spec;

use super::{RequestLimits, ValidationError};
use crate::model_context::ModelContext;
use crate::request::{GenerationRequest, Prompt};

/// Checks everything that does not need the tokenizer. Returns the sampling parameters, defaults
/// applied (`top_p` unset is 1, `repetition_penalty` 0 is 1 = off, `logit_bias` sorted by id).
///
/// Errors: [`ValidationError::Invalid`] for a request larger than `max_request_bytes` (over gRPC
/// the router's request guard already refuses such a message with `RESOURCE_EXHAUSTED` from its
/// frame header; this check covers the HTTP front and callers of the library), an empty
/// prompt or message list, an empty message role, `max_new_tokens` of 0 or above the limit, a
/// negative or non-finite temperature, `top_p` outside (0, 1], `min_p` outside [0, 1],
/// `repetition_penalty` outside (0, 10] (0 is accepted and means off), `frequency_penalty` or
/// `presence_penalty` outside [-2, 2], more than 300 `logit_bias` entries or a bias outside
/// [-100, 100], `top_logprobs` or `prompt_logprobs` above 20, too many, empty or too long stop strings.
pub fn check_request(
    req: &GenerationRequest,
    limits: &RequestLimits,
) -> Result<SamplingConfig, ValidationError> {
    let size = req.size_bytes;
    if size > limits.max_request_bytes as usize {
        return invalid(
            "prompt",
            format!(
                "request is {size} bytes; the limit is {} bytes",
                limits.max_request_bytes
            ),
        );
    }
    match &req.prompt {
        Prompt::Text { text, .. } if text.is_empty() => {
            return invalid("prompt", "prompt is empty (set prompt or messages)".into())
        }
        Prompt::Chat(messages) if messages.is_empty() => {
            return invalid("messages", "messages is empty".into())
        }
        Prompt::Ids(ids) if ids.is_empty() => {
            return invalid("prompt", "prompt is empty (no token ids)".into())
        }
        _ => {}
    }
    if let Prompt::Chat(messages) = &req.prompt {
        if let Some(i) = messages.iter().position(|m| m.role.is_empty()) {
            return invalid("messages", format!("messages[{i}].role is empty"));
        }
    }
    if let Some(n) = req.prompt_logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
        return invalid(
            "prompt_logprobs",
            format!("prompt_logprobs is {n}; the limit is {MAX_TOP_LOGPROBS}"),
        );
    }
    if let Some(n) = req.max_new_tokens {
        if n == 0 {
            return invalid("max_new_tokens", "max_new_tokens must be at least 1".into());
        }
        if n > limits.max_new_tokens {
            return invalid(
                "max_new_tokens",
                format!(
                    "max_new_tokens is {n}; the limit is {}",
                    limits.max_new_tokens
                ),
            );
        }
    }
    let sampling = sampling_config(req);
    sampling.validate().map_err(refusal)?;
    if req.stop.len() > limits.max_stop_sequences as usize {
        return invalid(
            "stop",
            format!(
                "{} stop sequences given; the limit is {}",
                req.stop.len(),
                limits.max_stop_sequences
            ),
        );
    }
    for (i, stop) in req.stop.iter().enumerate() {
        let chars = stop.chars().count();
        if chars == 0 {
            return invalid("stop", format!("stop[{i}] is empty"));
        }
        if chars > limits.max_stop_sequence_chars as usize {
            return invalid(
                "stop",
                format!(
                    "stop[{i}] is {chars} characters; the limit is {}",
                    limits.max_stop_sequence_chars
                ),
            );
        }
    }
    Ok(sampling)
}

/// The request's sampling parameters, defaults applied (see [`check_request`]); not yet checked.
fn sampling_config(req: &GenerationRequest) -> SamplingConfig {
    let mut logit_bias = req.logit_bias.clone();
    logit_bias.sort_unstable_by_key(|&(id, _)| id);
    let rp = req.repetition_penalty;
    SamplingConfig {
        temperature: req.temperature,
        top_k: req.top_k,
        top_p: req.top_p.unwrap_or(1.0),
        min_p: req.min_p,
        repetition_penalty: if rp == 0.0 { 1.0 } else { rp },
        frequency_penalty: req.frequency_penalty,
        presence_penalty: req.presence_penalty,
        logit_bias,
        top_logprobs: req.top_logprobs,
    }
}

/// The router's refusal for a sampling parameter out of range: the parameter as the field, and
/// the API's wording, which tells what turns a step off where the worker's does not.
fn refusal(error: SamplingError) -> ValidationError {
    let field = error.field();
    let message = match error {
        SamplingError::MinP(m) => format!("min_p must be in [0, 1] (0 = off), got {m}"),
        SamplingError::RepetitionPenalty(rp) => format!(
            "repetition_penalty must be in (0, {MAX_REPETITION_PENALTY}] (1 or 0 = off), got {rp}"
        ),
        SamplingError::Penalty { name, value } => format!(
            "{name} must be in [-{MAX_ABS_PENALTY}, {MAX_ABS_PENALTY}] (0 = off), got {value}"
        ),
        SamplingError::LogitBiasOutsideVocab { id, vocab_size } => format!(
            "logit_bias token id {id} is outside this model's vocabulary of {vocab_size} tokens \
             (ids 0..={})",
            vocab_size.saturating_sub(1)
        ),
        // Worded the same on both sides.
        SamplingError::Temperature(_)
        | SamplingError::TopP(_)
        | SamplingError::LogitBiasEntries(_)
        | SamplingError::LogitBias { .. }
        | SamplingError::TopLogprobs(_) => error.to_string(),
    };
    ValidationError::Invalid { field, message }
}

/// Checks the ids of a token-id prompt against the model's vocabulary (text and chat prompts pass).
///
/// Errors: [`ValidationError::Invalid`] for an id `>= vocab_size` (the message names the first).
pub fn check_prompt_ids(prompt: &Prompt, vocab_size: u32) -> Result<(), ValidationError> {
    let Prompt::Ids(ids) = prompt else {
        return Ok(());
    };
    match ids.iter().position(|&id| id >= vocab_size) {
        Some(i) => invalid(
            "prompt",
            format!(
                "prompt token {i} is id {}, outside this model's vocabulary of {vocab_size} tokens",
                ids[i]
            ),
        ),
        None => Ok(()),
    }
}

/// Checks the token ids a request names (its `logit_bias` keys) against the model's vocabulary.
///
/// Errors: [`ValidationError::Invalid`] for an id `>= vocab_size` (the message names the lowest).
pub fn check_vocab(sampling: &SamplingConfig, vocab_size: u32) -> Result<(), ValidationError> {
    sampling.check_vocab(vocab_size as usize).map_err(refusal)
}

/// Checks the tokenized prompt and returns the effective `max_new_tokens`.
///
/// Unset `max_new_tokens` becomes [`RequestLimits::default_new_tokens`], capped by the room left in
/// the context.
///
/// Errors: [`ValidationError::Invalid`] for a prompt with no tokens, a prompt that leaves no room in the context
/// or passes `max_input_tokens`, and a `max_new_tokens` that does not fit in the context after the
/// prompt.
pub fn check_prompt(
    prompt_tokens: usize,
    requested_max_new: Option<u32>,
    context_length: u32,
    limits: &RequestLimits,
) -> Result<u32, ValidationError> {
    let ctx = context_length as usize;
    if prompt_tokens == 0 {
        return invalid("prompt", "prompt encodes to no tokens".into());
    }
    if prompt_tokens >= ctx {
        return invalid(
            "prompt",
            format!(
                "prompt is {prompt_tokens} tokens; this model's context is {ctx} tokens \
             (the prompt must leave room for at least one new token)"
            ),
        );
    }
    let max_input = limits.max_input_tokens as usize;
    if max_input > 0 && prompt_tokens > max_input {
        return invalid(
            "prompt",
            format!("prompt is {prompt_tokens} tokens; the limit is {max_input} tokens"),
        );
    }
    let room = (ctx - prompt_tokens) as u32;
    match requested_max_new {
        Some(n) if n > room => invalid(
            "max_new_tokens",
            format!(
                "prompt ({prompt_tokens} tokens) + max_new_tokens ({n}) exceeds this model's \
             context of {ctx} tokens; at most {room} new tokens fit"
            ),
        ),
        Some(n) => Ok(n),
        None => Ok(limits.default_new_tokens().min(room).max(1)),
    }
}

fn invalid<T>(field: &'static str, message: String) -> Result<T, ValidationError> {
    Err(ValidationError::Invalid { field, message })
}

/// Checks a request's structured-output `constraint` (when it has one) by compiling it against the
/// model's vocabulary, as the worker will: the request is refused before any work when the worker
/// could not follow it. Blocks while the model's compiler is still being built, and compiling takes
/// milliseconds: call it off the async runtime (as [`super::validate`] is).
///
/// Errors: [`ValidationError::Invalid`] (field `constraint`) naming the problem for an empty
/// constraint, a schema that is not JSON or that llguidance cannot compile (unsupported keyword,
/// unresolvable `$ref`, contradictory bounds, ...), an invalid regex or Lark grammar, an empty
/// choice list or choice; with `ignore_eos` (a complete output ends with EOS); and for a model whose
/// vocabulary cannot have structured output (the message says why).
pub fn check_constraint(
    req: &GenerationRequest,
    model: &ModelContext,
) -> Result<(), ValidationError> {
    let Some(constraint) = &req.constraint else {
        return Ok(());
    };
    if req.ignore_eos && req.tools.is_some() {
        // The constraint is the tool calls' grammar.
        return invalid(
            "tools",
            "ignore_eos cannot be combined with tools (a complete tool call ends with EOS)".into(),
        );
    }
    if req.ignore_eos {
        return invalid(
            "constraint",
            "ignore_eos cannot be combined with a constraint (a complete structured output ends \
             with EOS)"
                .into(),
        );
    }
    let compiler = model.constraints.wait().map_err(|reason| {
        ValidationError::invalid(
            "constraint",
            format!("constraint: structured output is not available for this model: {reason}"),
        )
    })?;
    constraint_spec(constraint)
        .and_then(|spec| compiler.check(spec))
        .map_err(|e| ValidationError::invalid("constraint", e.to_string()))
}
