//! The request bodies of `POST /v1/chat/completions` and `POST /v1/completions` as OpenAI documents
//! them (plus vLLM's extensions `top_k`, `min_p`, `repetition_penalty`, `ignore_eos`,
//! `guided_json`, `guided_regex`, `guided_grammar`, `guided_choice`), and their translation into
//! the router's [`GenerationRequest`]s.
//!
//! Unknown fields are ignored, as OpenAI does; a known field of the wrong type is a 400 naming it
//! (parsed with `serde_path_to_error`). One body type serves both endpoints: `logprobs` is a flag
//! on chat and a count on completions, which [`Logprobs`] accepts either way and each endpoint
//! checks.

use std::collections::HashMap;

use inference_proto::public::{constraint::Kind, ChoiceList, Constraint};
use serde::Deserialize;

use super::echo::{self, Echo};
use super::error::{ApiError, Endpoint};
use super::tools::{message_tool_calls, tool_request};
use crate::chat_template::ChatMessage;
use crate::request::{GenerationRequest, Prompt};
use crate::tool_request::{check_tool_results, ToolRequest};

/// Most choices (`n`) of one request.
pub const MAX_CHOICES: u32 = 16;

/// OpenAI's `max_tokens` default for completions (chat defaults to the router's own default).
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;

/// A string or a list of them (`stop`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of strings")]
pub enum OneOrMany<T> {
    /// One value.
    One(T),
    /// Several.
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    fn into_vec(self) -> Vec<T> {
        match self {
            Self::One(v) => vec![v],
            Self::Many(v) => v,
        }
    }
}

/// A completions `prompt`: a string, strings, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "expected a string, a list of strings, a list of token ids or a list of lists of \
                 token ids"
)]
pub enum PromptInput {
    /// One text prompt.
    Text(String),
    /// Several text prompts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Ids(Vec<u32>),
    /// Several prompts as token ids.
    IdLists(Vec<Vec<u32>>),
}

/// A chat message's `content`: a string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "expected a string or a list of content parts ({\"type\": \"text\", \"text\": ...})"
)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts; only `{"type": "text", "text": ...}` parts are served.
    Parts(Vec<ContentPart>),
}

/// One part of a chat message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `"text"` (other kinds, e.g. images, are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    #[serde(default)]
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The message text (`null` reads as empty).
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant message's calls (checked by [`super::tools::message_tool_calls`]).
    #[serde(default)]
    pub tool_calls: Option<serde_json::Value>,
    /// A `tool` message: the id of the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// `logprobs`: a flag on chat, a count of alternatives on completions.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(
    untagged,
    expecting = "expected a boolean (chat) or a non-negative integer (completions)"
)]
pub enum Logprobs {
    /// Chat's `logprobs: true`.
    Flag(bool),
    /// Completions' `logprobs: N` (alternatives per token).
    Count(u32),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and empty `choices`) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// `response_format`'s `json_schema`.
#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    /// The schema's name (informational).
    #[serde(default)]
    pub name: Option<String>,
    /// The JSON Schema document.
    #[serde(default)]
    pub schema: Option<serde_json::Value>,
    /// Accepted; the constraint is always strict.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// With `json_schema`.
    #[serde(default)]
    pub json_schema: Option<JsonSchemaFormat>,
}

/// The body of both generation endpoints (each uses its own prompt field).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CompletionBody {
    /// The served model's name or an alias; omitted: the served model.
    pub model: Option<String>,
    /// Chat: the conversation.
    pub messages: Option<Vec<Message>>,
    /// Completions: the prompt(s).
    pub prompt: Option<PromptInput>,
    /// Tokens to generate at most.
    pub max_tokens: Option<u32>,
    /// Chat: tokens to generate at most (OpenAI's newer name; wins over `max_tokens`).
    pub max_completion_tokens: Option<u32>,
    /// Softmax temperature (OpenAI's default 1; 0 = greedy).
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Choices per prompt, each its own sequence.
    pub n: Option<u32>,
    /// Stop strings.
    pub stop: Option<OneOrMany<String>>,
    /// Sampler seed (choice `i` uses `seed + i`).
    pub seed: Option<i64>,
    /// OpenAI presence penalty.
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Token id (as a string) -> bias.
    pub logit_bias: Option<HashMap<String, f32>>,
    /// Chat: return log probabilities; completions: this many alternatives per token.
    pub logprobs: Option<Logprobs>,
    /// Chat: alternatives per token (needs `logprobs: true`).
    pub top_logprobs: Option<u32>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Structured output.
    pub response_format: Option<ResponseFormat>,
    /// Accepted, ignored.
    pub user: Option<String>,
    /// Completions: echo the prompt (see [`super::echo`]).
    pub echo: Option<bool>,
    /// Completions: text after the completion (not served).
    pub suffix: Option<String>,
    /// vLLM: top-k (0 or -1 = off).
    pub top_k: Option<i64>,
    /// vLLM: min-p.
    pub min_p: Option<f32>,
    /// vLLM: CTRL repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// vLLM: keep generating past EOS.
    pub ignore_eos: Option<bool>,
    /// vLLM: a JSON schema (object or string).
    pub guided_json: Option<serde_json::Value>,
    /// vLLM: a regular expression.
    pub guided_regex: Option<String>,
    /// vLLM: a grammar (llguidance Lark).
    pub guided_grammar: Option<String>,
    /// vLLM: one of these strings.
    pub guided_choice: Option<Vec<String>>,
    /// Chat: tools the model may call (see [`super::tools`]).
    pub tools: Option<serde_json::Value>,
    /// Chat: `"none"`, `"auto"`, `"required"` or a named function.
    pub tool_choice: Option<serde_json::Value>,
    /// Chat: several calls in one turn (default true).
    pub parallel_tool_calls: Option<serde_json::Value>,
    /// Chat: the deprecated `functions` (not served: refused unless `function_call` is `"none"`).
    pub functions: Option<serde_json::Value>,
    /// Chat: the deprecated `function_call`.
    pub function_call: Option<serde_json::Value>,
    /// Scheduling priority, as the gRPC request's `priority`: higher first, 0 the default, below 0
    /// sheddable; absent = the tenant's default. (vLLM's `priority` orders the other way.)
    pub priority: Option<i64>,
    /// Prefix-cache isolation, as vLLM's `cache_salt` (the gRPC request's `cache_salt`): cached
    /// prompt blocks are shared only with requests of the same salt; non-empty when given.
    pub cache_salt: Option<String>,
    /// Extension: `false` opts this request out of speculative decoding (outputs are the same
    /// either way; only the speed differs).
    pub speculation: Option<bool>,
    /// vLLM: name every token of `logprobs` (and of its alternatives) `token_id:ID` instead of by
    /// its text, so that tokens of the same text stay apart.
    pub return_tokens_as_token_ids: Option<bool>,
}

/// Parses a request body.
///
/// Errors: 400 `invalid_json` for a body that is not JSON, 400 `invalid_type` naming the field
/// (`param`) for a known field of the wrong type, 400 `unsupported_parameter` naming `functions`
/// (the deprecated tool calling; see [`refuse_functions`]).
pub fn parse(body: &[u8]) -> Result<CompletionBody, ApiError> {
    let body = parse_fields(body)?;
    refuse_functions(&body)?;
    Ok(body)
}

/// The deprecated `functions` / `function_call` are not served (`tools` is): a request that offers
/// functions gets a 400 naming the field instead of a prose answer that ignores them, unless it
/// forbids calling them (`function_call: "none"`). An empty or null list offers none.
fn refuse_functions(body: &CompletionBody) -> Result<(), ApiError> {
    let offered = |list: &Option<serde_json::Value>| match list {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Array(items)) => !items.is_empty(),
        Some(_) => true,
    };
    let none = |choice: &Option<serde_json::Value>| matches!(choice, Some(c) if c == "none");
    for (field, list, choice, choice_field) in [(
        "functions",
        &body.functions,
        &body.function_call,
        "function_call",
    )] {
        if offered(list) && !none(choice) {
            return Err(ApiError::bad_request(
                "unsupported_parameter",
                Some(field.to_string()),
                format!(
                    "`{field}` (deprecated) is not served by this server; offer the functions \
                     as `tools`, or send `{choice_field}: \"none\"` for a plain answer"
                ),
            ));
        }
    }
    Ok(())
}

/// Deserializes the body's fields (no cross-field checks).
fn parse_fields(body: &[u8]) -> Result<CompletionBody, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(
            "invalid_json",
            None,
            format!("the body is not valid JSON: {e}"),
        )
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "invalid_type",
            None,
            "the body must be a JSON object",
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = path
            .split(['.', '['])
            .next()
            .unwrap_or_default()
            .to_string();
        ApiError::bad_request(
            "invalid_type",
            Some(param),
            format!("{path}: {}", e.into_inner()),
        )
    })
}

/// What a parsed body asks for beyond the generation requests.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Choices per prompt.
    pub n: u32,
    /// Stream server-sent events.
    pub stream: bool,
    /// Send the usage chunk when streaming.
    pub include_usage: bool,
    /// Report log probabilities (chat: `logprobs: true`; completions: `logprobs` given).
    pub logprobs: bool,
    /// Read tool calls out of the text (chat with tools and `tool_choice` other than `none`).
    pub tool_calls: bool,
    /// Completions' `echo: true` (see [`super::echo`]).
    pub echo: Option<Echo>,
    /// vLLM's `return_tokens_as_token_ids`: tokens in `logprobs` named `token_id:ID`.
    pub token_ids: bool,
}

impl CompletionBody {
    /// The requested `priority`, if any.
    ///
    /// Errors: 400 naming `priority` for a value outside the 32-bit range.
    pub fn priority(&self) -> Result<Option<i32>, ApiError> {
        self.priority
            .map(|p| {
                i32::try_from(p).map_err(|_| {
                    ApiError::invalid(
                        "priority",
                        format!("priority must be in [{}, {}], got {p}", i32::MIN, i32::MAX),
                    )
                })
            })
            .transpose()
    }

    /// The generation requests (one per prompt) and the response shape, for `endpoint`.
    /// `size_bytes` is the body's length.
    ///
    /// Errors: 400 naming the field for `echo: true` on chat or streamed, a `suffix` (not served), a missing or
    /// malformed prompt, `n` outside [1, 16],
    /// a `logprobs` of the other endpoint's kind, `top_logprobs` without `logprobs`, a logit-bias
    /// key that is not a token id, a content part that is not text, more than one structured-output
    /// field, an unknown `response_format` type or a `json_schema` without `schema`.
    pub fn into_requests(
        self,
        endpoint: Endpoint,
        size_bytes: usize,
    ) -> Result<(Vec<GenerationRequest>, Shape), ApiError> {
        let echo = self.echo == Some(true);
        if echo {
            echo::check(endpoint, self.stream.unwrap_or(false))?;
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "suffix is not supported"));
        }
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_CHOICES).contains(&n) {
            return Err(ApiError::invalid(
                "n",
                format!("n must be in [1, {MAX_CHOICES}], got {n}"),
            ));
        }
        let (logprobs, top_logprobs) = match (endpoint, self.logprobs, self.top_logprobs) {
            (Endpoint::Chat, Some(Logprobs::Count(_)), _) => {
                return Err(ApiError::invalid("logprobs", "logprobs must be a boolean"))
            }
            (Endpoint::Chat, flag, top) => {
                let on = matches!(flag, Some(Logprobs::Flag(true)));
                if top.is_some_and(|t| t > 0) && !on {
                    return Err(ApiError::invalid(
                        "top_logprobs",
                        "top_logprobs needs logprobs: true",
                    ));
                }
                (on, top.unwrap_or(0))
            }
            (Endpoint::Completions, Some(Logprobs::Flag(_)), _) => {
                return Err(ApiError::invalid(
                    "logprobs",
                    "logprobs must be an integer (alternatives per token)",
                ))
            }
            (Endpoint::Completions, Some(Logprobs::Count(k)), _) => (true, k),
            (Endpoint::Completions, None, _) => (false, 0),
        };
        let shape = Shape {
            n,
            stream: self.stream.unwrap_or(false),
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            logprobs,
            tool_calls: false,
            echo: None,
            token_ids: self.return_tokens_as_token_ids == Some(true),
        };
        let tools = match endpoint {
            Endpoint::Chat => tool_request(
                self.tools.as_ref(),
                self.tool_choice.as_ref(),
                self.parallel_tool_calls.as_ref(),
            )?,
            Endpoint::Completions if self.tools.is_some() => {
                return Err(ApiError::invalid(
                    "tools",
                    "tools are served on /v1/chat/completions only",
                ))
            }
            Endpoint::Completions => None,
        };
        let mut shape = Shape {
            tool_calls: tools.as_ref().is_some_and(ToolRequest::parses_calls),
            ..shape
        };
        let prompts = match endpoint {
            Endpoint::Chat => vec![chat_prompt(self.messages.as_deref())?],
            Endpoint::Completions => completion_prompts(self.prompt.clone())?,
        };
        let max_new_tokens = match endpoint {
            Endpoint::Chat => self.max_completion_tokens.or(self.max_tokens),
            Endpoint::Completions => {
                let asked = self.max_tokens.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS);
                let (max_new_tokens, generate) = echo::max_new_tokens(asked, echo);
                if echo {
                    shape.echo = Some(Echo {
                        prompt_texts: prompts.iter().map(prompt_text).collect(),
                        generate,
                    });
                }
                Some(max_new_tokens)
            }
        };
        let mut logit_bias = Vec::new();
        for (key, bias) in self.logit_bias.iter().flatten() {
            let id = key.parse::<u32>().map_err(|_| {
                ApiError::invalid(
                    "logit_bias",
                    format!("logit_bias key {key:?} is not a token id"),
                )
            })?;
            logit_bias.push((id, *bias));
        }
        let base = GenerationRequest {
            prompt: Prompt::Ids(Vec::new()),
            max_new_tokens,
            // OpenAI's default temperature is 1.
            temperature: self.temperature.unwrap_or(1.0),
            top_k: self.top_k.map_or(0, |k| k.clamp(0, u32::MAX.into()) as u32),
            top_p: self.top_p,
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            logit_bias,
            top_logprobs,
            seed: self.seed.map(|s| s as u64),
            stop: self
                .stop
                .clone()
                .map(OneOrMany::into_vec)
                .unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            include_special_tokens: false,
            request_id: None,
            constraint: self.constraint()?,
            tools,
            // An echo with `logprobs: N` scores the prompt with N alternatives per token.
            prompt_logprobs: (echo && logprobs).then_some(top_logprobs),
            speculation: self.speculation,
            size_bytes,
        };
        let requests = prompts
            .into_iter()
            .map(|prompt| GenerationRequest {
                prompt,
                ..base.clone()
            })
            .collect();
        Ok((requests, shape))
    }

    /// The structured-output constraint of `response_format` or a `guided_*` field.
    fn constraint(&self) -> Result<Option<Constraint>, ApiError> {
        let mut kinds = Vec::new();
        if let Some(format) = &self.response_format {
            match format.kind.as_str() {
                "text" => {}
                "json_object" => kinds.push(Kind::JsonObject(true)),
                "json_schema" => {
                    let schema = format
                        .json_schema
                        .as_ref()
                        .and_then(|s| s.schema.as_ref())
                        .ok_or_else(|| {
                            ApiError::invalid(
                                "response_format",
                                "response_format.json_schema.schema is required with type json_schema",
                            )
                        })?;
                    kinds.push(Kind::JsonSchema(schema.to_string()));
                }
                other => {
                    return Err(ApiError::invalid(
                        "response_format",
                        format!(
                            "response_format.type must be text, json_object or json_schema, got {other:?}"
                        ),
                    ))
                }
            }
        }
        if let Some(schema) = &self.guided_json {
            kinds.push(Kind::JsonSchema(match schema {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            }));
        }
        if let Some(regex) = &self.guided_regex {
            kinds.push(Kind::Regex(regex.clone()));
        }
        if let Some(grammar) = &self.guided_grammar {
            kinds.push(Kind::Lark(grammar.clone()));
        }
        if let Some(choices) = &self.guided_choice {
            kinds.push(Kind::Choice(ChoiceList {
                choices: choices.clone(),
            }));
        }
        if kinds.len() > 1 {
            return Err(ApiError::invalid(
                "response_format",
                "give at most one of response_format (json_object, json_schema), guided_json, \
                 guided_regex, guided_grammar and guided_choice",
            ));
        }
        Ok(kinds.pop().map(|kind| Constraint { kind: Some(kind) }))
    }
}

/// A chat request's messages as the router's chat prompt.
pub(super) fn chat_prompt(messages: Option<&[Message]>) -> Result<Prompt, ApiError> {
    let messages = messages.ok_or_else(|| ApiError::invalid("messages", "messages is required"))?;
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let content = match &m.content {
            None => String::new(),
            Some(Content::Text(text)) => text.clone(),
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for (j, part) in parts.iter().enumerate() {
                    match (part.kind.as_str(), &part.text) {
                        ("text", Some(t)) => text.push_str(t),
                        ("text", None) => {
                            return Err(ApiError::invalid(
                                "messages",
                                format!("messages[{i}].content[{j}] has no text"),
                            ))
                        }
                        (kind, _) => {
                            return Err(ApiError::invalid(
                                "messages",
                                format!(
                                    "messages[{i}].content[{j}] is of type {kind:?}; only text parts are served"
                                ),
                            ))
                        }
                    }
                }
                text
            }
        };
        let mut message = ChatMessage::new(m.role.clone(), content);
        if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_null()) {
            message.tool_calls = message_tool_calls(i, calls)?;
        }
        message.tool_call_id = m.tool_call_id.clone();
        out.push(message);
    }
    check_tool_results(&out)?;
    Ok(Prompt::Chat(out))
}

/// A completions request's prompt(s).
/// A prompt's text as given (`None` for token ids).
fn prompt_text(prompt: &Prompt) -> Option<String> {
    match prompt {
        Prompt::Text { text, .. } => Some(text.clone()),
        Prompt::Chat(_) | Prompt::Ids(_) => None,
    }
}

fn completion_prompts(prompt: Option<PromptInput>) -> Result<Vec<Prompt>, ApiError> {
    let text = |text| Prompt::Text {
        text,
        plain_text: false,
    };
    let prompts: Vec<Prompt> =
        match prompt.ok_or_else(|| ApiError::invalid("prompt", "prompt is required"))? {
            PromptInput::Text(t) => vec![text(t)],
            PromptInput::Texts(ts) => ts.into_iter().map(text).collect(),
            PromptInput::Ids(ids) => vec![Prompt::Ids(ids)],
            PromptInput::IdLists(lists) => lists.into_iter().map(Prompt::Ids).collect(),
        };
    if prompts.is_empty() {
        return Err(ApiError::invalid("prompt", "prompt is an empty list"));
    }
    if prompts.len() > MAX_CHOICES as usize {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "{} prompts given; the limit is {MAX_CHOICES}",
                prompts.len()
            ),
        ));
    }
    Ok(prompts)
}

#[cfg(test)]
mod tests;
