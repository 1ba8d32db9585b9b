//! `POST /tokenize` and `POST /detokenize` in vLLM's shapes (llama.cpp's names accepted too).
//!
//! - `/tokenize` with a text: `{"prompt" | "content": TEXT, "add_special_tokens" | "add_special":
//!   BOOL (default true, as a completions prompt gets them), "return_token_strs": BOOL, "model"}`.
//! - `/tokenize` with a conversation: `{"messages": [...], "add_generation_prompt": BOOL (default
//!   true), "tools": [...], "tool_choice": ..., "return_token_strs": BOOL, "model"}`: the ids a chat
//!   request with these messages (and tools) would prefill, rendered by the model's chat template
//!   exactly as `/v1/chat/completions` renders it.
//! - Answer: `{"count": N, "max_model_len": CONTEXT, "tokens": [ids]}`, plus `"token_strs"` (each
//!   token's vocabulary string, e.g. `Ġthe`) when asked for.
//! - `/detokenize`: `{"tokens": [ids], "model"}` -> `{"prompt": TEXT}` (vLLM) with the same text
//!   as `"content"` (llama.cpp); special tokens are kept in the text.
//!
//! - `GET /tokenizer_info`: vLLM's description of the default model's tokenizer, what
//!   lm-evaluation-harness's `local-completions` reads to tokenize through this server
//!   (`tokenizer_backend=remote`, chosen by itself when the route answers): `{"tokenizer_class":
//!   "TextTokenizer", "eos_token": TEXT, "bos_token": TEXT | null, "pad_token": null,
//!   "add_bos_token": BOOL, "model_max_length": CONTEXT, "chat_template": SOURCE | null}` (the
//!   tokens' texts as the vocabulary spells them, e.g. `<|im_end|>`).
//!
//! Both name a served model with `model` (the default model without one) and answer 404
//! `model_not_found` / 400 `model_required` as the generation routes do; a body that is not JSON,
//! of the wrong shape or with an id outside the vocabulary gets 400 naming the field. Tokenizing
//! runs on a blocking thread.

use std::sync::Arc;

use axum::body::Body;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::schema::{chat_prompt, Message};
use super::tools::tool_request;
use crate::model_context::ModelContext;
use crate::pool::WorkerPool;
use crate::request::GenerationRequest;
use crate::route_error::RouteError;
use crate::validation::encode_prompt;

/// The body of `POST /tokenize` (see the module docs).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeBody {
    model: Option<String>,
    prompt: Option<String>,
    content: Option<String>,
    messages: Option<Vec<Message>>,
    add_special_tokens: Option<bool>,
    add_special: Option<bool>,
    add_generation_prompt: Option<bool>,
    return_token_strs: Option<bool>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<Value>,
}

/// The body of `POST /detokenize`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeBody {
    model: Option<String>,
    tokens: Vec<i64>,
}

/// What to tokenize, checked.
enum Input {
    Text { text: String, add_special: bool },
    Chat(Box<GenerationRequest>, bool),
}

impl TokenizeBody {
    /// The text or conversation to tokenize.
    ///
    /// Errors: 400 naming `prompt` when neither or both of a text and `messages` are given, or
    /// `messages` / `tools` when they are malformed.
    fn input(self) -> Result<Input, ApiError> {
        let text = self.prompt.or(self.content);
        match (text, self.messages) {
            (Some(text), None) => {
                if self.add_generation_prompt.is_some() || self.tools.is_some() {
                    return Err(ApiError::invalid(
                        "add_generation_prompt",
                        "add_generation_prompt and tools apply to messages, not to a prompt",
                    ));
                }
                Ok(Input::Text {
                    text,
                    add_special: self.add_special_tokens.or(self.add_special).unwrap_or(true),
                })
            }
            (None, Some(messages)) => {
                if messages.is_empty() {
                    // As a chat request with no messages is refused.
                    return Err(ApiError::invalid("messages", "messages is empty"));
                }
                if self.add_special_tokens.or(self.add_special).is_some() {
                    return Err(ApiError::invalid(
                        "add_special_tokens",
                        "add_special_tokens applies to a prompt; messages are tokenized as a chat \
                         request's prompt is",
                    ));
                }
                let tools = tool_request(
                    self.tools.as_ref(),
                    self.tool_choice.as_ref(),
                    self.parallel_tool_calls.as_ref(),
                )?;
                let request = GenerationRequest {
                    prompt: chat_prompt(Some(&messages))?,
                    tools,
                    ..GenerationRequest::default()
                };
                Ok(Input::Chat(
                    Box::new(request),
                    self.add_generation_prompt.unwrap_or(true),
                ))
            }
            (Some(_), Some(_)) => Err(ApiError::invalid(
                "prompt",
                "give either prompt (or content) or messages, not both",
            )),
            (None, None) => Err(ApiError::invalid(
                "prompt",
                "prompt (or content) or messages is required",
            )),
        }
    }
}

/// Reads a JSON body of at most `limit` bytes into `T`.
///
/// Errors: 413 above the limit, 400 `invalid_json` for a body that is not JSON of `T`'s shape.
async fn read_body<T: serde::de::DeserializeOwned>(
    limit: usize,
    body: Body,
) -> Result<T, ApiError> {
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::too_large(limit))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(
            "invalid_json",
            None,
            format!("the body is not a valid request: {e}"),
        )
    })
}

/// The context of the model `requested` names (the default model for `None`).
///
/// Errors: the generation routes' model errors (404, 400), 503 while no worker described it.
fn model_context(
    pool: &WorkerPool,
    requested: Option<&str>,
) -> Result<Arc<ModelContext>, ApiError> {
    pool.resolve_model(requested)
        .map(|model| model.context.clone())
        .map_err(|e| ApiError::from_route(e, None))
}

/// Runs `work` on a blocking thread.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::from_route(RouteError::Internal(e.to_string()), None))?
}

/// `POST /tokenize` (see the module docs) with a body of at most `limit` bytes: the answer's JSON.
///
/// Errors: as the module docs say.
pub async fn tokenize(pool: &WorkerPool, limit: usize, body: Body) -> Result<Value, ApiError> {
    let body: TokenizeBody = read_body(limit, body).await?;
    let model = model_context(pool, body.model.as_deref())?;
    let token_strs = body.return_token_strs.unwrap_or(false);
    let input = body.input()?;
    blocking(move || {
        let ids = match input {
            Input::Text { text, add_special } => model
                .tokenizer
                .encode(&text, add_special)
                .map_err(|e| ApiError::invalid("prompt", format!("cannot tokenize: {e}")))?,
            Input::Chat(request, open) => encode_prompt(&model, &request, open)
                .map_err(|e| ApiError::from_route(e.into(), None))?,
        };
        let mut answer = json!({
            "count": ids.len(),
            "max_model_len": model.context_length,
            "tokens": ids,
        });
        if token_strs {
            let strs: Vec<String> = ids
                .iter()
                .map(|&id| model.tokenizer.id_to_piece(id).unwrap_or_default())
                .collect();
            answer["token_strs"] = json!(strs);
        }
        Ok(answer)
    })
    .await
}

/// `GET /tokenizer_info` (see the module docs): the default model's tokenizer description.
///
/// Errors: 503 while no worker described the model.
pub fn tokenizer_info(pool: &WorkerPool) -> Result<Value, ApiError> {
    let model = model_context(pool, None)?;
    let text = |id: u32| model.tokenizer.decode(&[id], false);
    Ok(json!({
        "tokenizer_class": "TextTokenizer",
        "eos_token": model.eos_token_ids.first().map(|&id| text(id)),
        "bos_token": model.bos_token_id.map(text),
        "pad_token": null,
        "add_bos_token": model.add_bos_token,
        "model_max_length": model.context_length,
        "chat_template": (!model.chat_template_source.is_empty())
            .then_some(model.chat_template_source.as_str()),
    }))
}

/// `POST /detokenize` (see the module docs) with a body of at most `limit` bytes: the answer's
/// JSON.
///
/// Errors: as the module docs say.
pub async fn detokenize(pool: &WorkerPool, limit: usize, body: Body) -> Result<Value, ApiError> {
    let body: DetokenizeBody = read_body(limit, body).await?;
    let model = model_context(pool, body.model.as_deref())?;
    let vocab = model.vocab_size;
    let outside = |i: usize, id: i64| {
        ApiError::invalid(
            "tokens",
            format!("tokens[{i}] is {id}, outside the vocabulary of {vocab} tokens"),
        )
    };
    let ids = body
        .tokens
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            u32::try_from(id)
                .ok()
                .filter(|&id| id < vocab)
                .ok_or_else(|| outside(i, id))
        })
        .collect::<Result<Vec<u32>, ApiError>>()?;
    blocking(move || {
        let text = model.tokenizer.decode(&ids, false);
        Ok(json!({"prompt": text, "content": text}))
    })
    .await
}
