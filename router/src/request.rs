//! The generation request both public fronts build (gRPC `GenerateRequest`, OpenAI HTTP JSON),
//! before validation: [`Prompt`] and [`GenerationRequest`]. The HTTP front builds it in
//! `openai::schema`; the gRPC request converts with `GenerationRequest::try_from`, which lives
//! beside the checks in `validation` since it refuses `prompt` and `messages` together.

use inference_proto::public::Constraint;

use crate::chat_template::ChatMessage;
use crate::tool_request::ToolRequest;

/// What the model continues.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Raw text. Special-token text in it (`<|im_start|>`) becomes the control token unless
    /// `plain_text` is set. BOS is added when the model asks for it.
    Text {
        /// The text (empty is refused).
        text: String,
        /// Tokenize special-token text as ordinary text.
        plain_text: bool,
    },
    /// Chat messages, rendered with the model's chat template plus the generation prompt; their
    /// content is always plain text.
    Chat(Vec<ChatMessage>),
    /// Token ids, taken as they are (no BOS added); each must be below the vocabulary size.
    Ids(Vec<u32>),
}

/// One generation request as a front received it, before validation. Field meanings and ranges
/// are those of `inference.v1.GenerateRequest` (see `proto/proto/inference/v1/generation.proto`).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Tokens to generate at most; `None`: the router's default.
    pub max_new_tokens: Option<u32>,
    /// Softmax temperature; 0 = greedy.
    pub temperature: f32,
    /// Top-k; 0 = off.
    pub top_k: u32,
    /// Nucleus mass in (0, 1]; `None` = off.
    pub top_p: Option<f32>,
    /// Min-p in [0, 1]; 0 = off.
    pub min_p: f32,
    /// CTRL repetition penalty in (0, 10]; 0 and 1 = off.
    pub repetition_penalty: f32,
    /// OpenAI frequency penalty in [-2, 2].
    pub frequency_penalty: f32,
    /// OpenAI presence penalty in [-2, 2].
    pub presence_penalty: f32,
    /// `(token id, bias)` pairs; biases in [-100, 100].
    pub logit_bias: Vec<(u32, f32)>,
    /// Alternatives per generated token, in [0, 20].
    pub top_logprobs: u32,
    /// Seed of the sampler; `None`: drawn by the router.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Emit special tokens' text.
    pub include_special_tokens: bool,
    /// The caller's request id; `None`: generated.
    pub request_id: Option<String>,
    /// Structured output.
    pub constraint: Option<Constraint>,
    /// Tool calling (chat prompts only); validation renders the tools and sets `constraint`.
    pub tools: Option<ToolRequest>,
    /// Prompt logprobs with this many alternatives per prompt token, in [0, 20]; `None`: off.
    pub prompt_logprobs: Option<u32>,
    /// Speculative decoding: `Some(false)` opts out; `None`/`Some(true)` = as the worker is set up.
    pub speculation: Option<bool>,
    /// Size of the request as received (encoded message or HTTP body), in bytes.
    pub size_bytes: usize,
}

impl Default for GenerationRequest {
    fn default() -> Self {
        Self {
            prompt: Prompt::Text {
                text: String::new(),
                plain_text: false,
            },
            max_new_tokens: None,
            temperature: 0.0,
            top_k: 0,
            top_p: None,
            min_p: 0.0,
            repetition_penalty: 0.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            top_logprobs: 0,
            seed: None,
            stop: Vec::new(),
            ignore_eos: false,
            include_special_tokens: false,
            request_id: None,
            constraint: None,
            tools: None,
            prompt_logprobs: None,
            speculation: None,
            size_bytes: 0,
        }
    }
}
