//! [`validate`]: the one pass that checks a [`GenerationRequest`] against the limits and the served
//! model, tokenizes it (or renders its chat template) and yields a [`ValidRequest`] ready for
//! admission; and the gRPC request's conversion into a [`GenerationRequest`].
//!
//! [`validate`] is CPU work (a 1 MiB prompt tokenizes in about 0.7 s): call it off the async
//! runtime's threads (`generate::prepare` runs it under `tokio::task::spawn_blocking`).

use inference_proto::public::{Constraint, GenerateRequest};
use inference_proto::sampling_limits::SamplingConfig;
use inference_proto::worker::SamplingParams;
use prost::Message as _;

use super::checks::{check_constraint, check_prompt, check_prompt_ids, check_request, check_vocab};
use super::tools::{grpc_messages, grpc_tool_request, render_tool_chat, with_tool_constraint};
use super::{RequestLimits, ValidationError};
use crate::model_context::ModelContext;
use crate::request::{GenerationRequest, Prompt};

impl TryFrom<GenerateRequest> for GenerationRequest {
    type Error = ValidationError;

    /// The gRPC request as a [`GenerationRequest`].
    ///
    /// Errors: both `prompt` and `messages` set; `tools` with `prompt`; those of
    /// [`grpc_messages`] and [`grpc_tool_request`].
    fn try_from(req: GenerateRequest) -> Result<Self, ValidationError> {
        let size_bytes = req.encoded_len();
        if !req.tools.is_empty() && req.messages.is_empty() {
            return Err(ValidationError::invalid(
                "tools",
                "tools need messages (a chat request); a raw prompt takes no tools",
            ));
        }
        let tools = grpc_tool_request(req.tools, req.tool_choice, req.parallel_tool_calls)?;
        let prompt = match (req.prompt.is_empty(), req.messages.is_empty()) {
            (false, false) => {
                return Err(ValidationError::invalid(
                    "prompt",
                    "set either prompt or messages, not both",
                ))
            }
            (_, true) => Prompt::Text {
                text: req.prompt,
                plain_text: req.prompt_as_plain_text,
            },
            (true, false) => Prompt::Chat(grpc_messages(req.messages)?),
        };
        Ok(Self {
            prompt,
            max_new_tokens: req.max_new_tokens,
            temperature: req.temperature,
            top_k: req.top_k,
            top_p: req.top_p,
            min_p: req.min_p,
            repetition_penalty: req.repetition_penalty,
            frequency_penalty: req.frequency_penalty,
            presence_penalty: req.presence_penalty,
            logit_bias: req.logit_bias.into_iter().collect(),
            top_logprobs: req.top_logprobs,
            seed: req.seed,
            stop: req.stop,
            ignore_eos: req.ignore_eos,
            include_special_tokens: req.include_special_tokens,
            request_id: req.request_id.filter(|id| !id.is_empty()),
            constraint: req.constraint,
            tools,
            prompt_logprobs: req.prompt_logprobs,
            speculation: req.speculation,
            size_bytes,
        })
    }
}

/// The worker protocol's `SamplingParams` for `sampling` (validated parameters) and `seed`.
pub fn sampling_params(sampling: &SamplingConfig, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: sampling.temperature,
        top_k: sampling.top_k,
        top_p: sampling.top_p,
        seed,
        min_p: sampling.min_p,
        repetition_penalty: sampling.repetition_penalty,
        frequency_penalty: sampling.frequency_penalty,
        presence_penalty: sampling.presence_penalty,
        logit_bias: sampling.logit_bias.iter().copied().collect(),
        top_logprobs: sampling.top_logprobs,
    }
}

/// A request that passed [`validate`]: tokenized, with its limits applied. Admit it (once per
/// choice) with `generate::launch`.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    /// The prompt's token ids (at least one; fits the context with room for a new token).
    pub prompt_ids: Vec<u32>,
    /// The sampling parameters, defaults applied.
    pub sampling: SamplingConfig,
    /// Tokens to generate at most (the default applied, fits the context).
    pub max_new_tokens: u32,
    /// The caller's seed, if any.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Token ids that end generation (empty with `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Emit special tokens' text.
    pub include_special_tokens: bool,
    /// The caller's request id, if any.
    pub request_id: Option<String>,
    /// Structured output.
    pub constraint: Option<Constraint>,
    /// Prompt logprobs with this many alternatives each (at most 20); `None`: off.
    pub prompt_logprobs: Option<u32>,
    /// Speculative decoding: `Some(false)` opts out (the worker's `AddRequest.speculation`).
    pub speculation: Option<bool>,
}

impl ValidRequest {
    /// The sampler seed of choice `choice` (0-based) of this request: the caller's seed plus
    /// `choice` (wrapping), so every choice of a seeded request is reproducible and the choices
    /// differ; a fresh random seed when the caller gave none.
    pub fn choice_seed(&self, choice: u64) -> u64 {
        match self.seed {
            Some(seed) => seed.wrapping_add(choice),
            None => rand::random(),
        }
    }
}

/// Checks `req` against `limits` and `model`, tokenizes its prompt and returns it ready for
/// admission. CPU-bound: run it off the async runtime (see the module docs).
///
/// Errors: every [`ValidationError`] of [`check_request`], then those of tokenization (a prompt
/// that cannot be tokenized, a chat request for a model without a template, a role holding
/// special-token text), [`check_prompt_ids`], [`check_prompt`] and [`check_vocab`], in that order.
pub fn validate(
    req: GenerationRequest,
    model: &ModelContext,
    limits: &RequestLimits,
) -> Result<ValidRequest, ValidationError> {
    let sampling = check_request(&req, limits)?;
    let prompt_ids =
        tracing::info_span!("tokenize").in_scope(|| encode_prompt(model, &req, true))?;
    check_prompt_ids(&req.prompt, model.vocab_size)?;
    let max_new_tokens = check_prompt(
        prompt_ids.len(),
        req.max_new_tokens,
        model.context_length,
        limits,
    )?;
    check_vocab(&sampling, model.vocab_size)?;
    let req = tracing::info_span!("tools").in_scope(|| with_tool_constraint(req, model))?;
    tracing::info_span!("constraint").in_scope(|| check_constraint(&req, model))?;
    Ok(ValidRequest {
        prompt_ids,
        sampling,
        max_new_tokens,
        seed: req.seed,
        stop: req.stop,
        stop_token_ids: if req.ignore_eos {
            Vec::new()
        } else {
            model.eos_token_ids.clone()
        },
        include_special_tokens: req.include_special_tokens,
        request_id: req.request_id,
        constraint: req.constraint,
        prompt_logprobs: req.prompt_logprobs,
        speculation: req.speculation,
    })
}

/// Renders the chat template for a chat prompt, or takes a text prompt as is, and tokenizes it.
///
/// A text prompt parses special-token text (`<|im_start|>` becomes the control token) unless
/// `plain_text` is set. Chat messages are rendered as pieces: special tokens count only where the
/// template writes them, and each message's content is plain text; a role holding special-token
/// text is refused (the template writes roles as its own text). With `add_generation_prompt` (what
/// a chat request uses) the template appends the opening of the assistant's turn.
///
/// Errors: [`ValidationError::Invalid`] naming `prompt` or `messages` for text the tokenizer or
/// the template refuses, a model without a chat template, or a role holding special-token text.
pub fn encode_prompt(
    model: &ModelContext,
    req: &GenerationRequest,
    add_generation_prompt: bool,
) -> Result<Vec<u32>, ValidationError> {
    let tokenizer = &model.tokenizer;
    let messages = match &req.prompt {
        Prompt::Ids(ids) => return Ok(ids.clone()),
        Prompt::Text { text, plain_text } => {
            let ids = if *plain_text {
                tokenizer.encode_plain(text, true)
            } else {
                tokenizer.encode(text, true)
            };
            return ids.map_err(|e| {
                ValidationError::invalid("prompt", format!("cannot tokenize the prompt: {e}"))
            });
        }
        Prompt::Chat(messages) => messages,
    };
    let template = model.chat_template.as_ref().ok_or_else(|| {
        ValidationError::invalid(
            "messages",
            "this model has no chat template; send `prompt` instead of `messages`",
        )
    })?;
    // A role is written into the template's own text, where special tokens count: refuse one
    // that would add chat structure.
    if let Some(i) = messages
        .iter()
        .position(|m| tokenizer.contains_special_text(&m.role))
    {
        return Err(ValidationError::invalid(
            "messages",
            format!("messages[{i}].role holds special-token text"),
        ));
    }
    let pieces = render_tool_chat(
        template,
        model,
        messages,
        req.tools.as_ref(),
        add_generation_prompt,
    )
    .map_err(|e| {
        ValidationError::invalid("messages", format!("cannot render the chat template: {e}"))
    })?;
    tokenizer.encode_pieces(&pieces).map_err(|e| {
        ValidationError::invalid("messages", format!("cannot tokenize the chat prompt: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat_template::ChatMessage;
    use inference_proto::public::ChatMessage as WireMessage;

    #[test]
    fn grpc_request_converts_field_by_field() {
        let wire = GenerateRequest {
            messages: vec![WireMessage {
                role: "user".into(),
                content: "hi".into(),
                ..Default::default()
            }],
            max_new_tokens: Some(7),
            temperature: 0.5,
            top_k: 3,
            top_p: Some(0.9),
            seed: Some(11),
            stop: vec!["x".into()],
            ignore_eos: true,
            request_id: Some(String::new()),
            logit_bias: [(4, 1.5)].into(),
            top_logprobs: 2,
            ..Default::default()
        };
        let size = wire.encoded_len();
        let req = GenerationRequest::try_from(wire).unwrap();
        assert_eq!(
            req.prompt,
            Prompt::Chat(vec![ChatMessage::new("user", "hi")])
        );
        assert_eq!(req.max_new_tokens, Some(7));
        assert_eq!((req.temperature, req.top_k, req.top_p), (0.5, 3, Some(0.9)));
        assert_eq!((req.seed, req.ignore_eos), (Some(11), true));
        assert_eq!(req.logit_bias, vec![(4, 1.5)]);
        assert_eq!(req.request_id, None, "an empty id counts as unset");
        assert_eq!(req.size_bytes, size);
        let both = GenerateRequest {
            prompt: "p".into(),
            messages: vec![WireMessage::default()],
            ..Default::default()
        };
        let err = GenerationRequest::try_from(both).unwrap_err();
        assert_eq!(err.to_string(), "set either prompt or messages, not both");
    }
}
