//! The response documents of the generation endpoints, as OpenAI documents them: the whole
//! `chat.completion` / `text_completion` object, and the streamed `chat.completion.chunk` /
//! `text_completion` chunks, built from the router's per-step [`GenerateResponse`]s.
//!
//! Finish reasons: an EOS token or a stop string is `stop`; `max_new_tokens` or the context's end
//! is `length`. The EOS token itself is never shown (as its text is never emitted). Token texts
//! are the router's per-token texts (a partial UTF-8 character reads as U+FFFD); `bytes` are their
//! UTF-8 bytes. A completions `text_offset` is the character offset of the text emitted before the
//! token's step.

use inference_proto::public::{FinishReason, GenerateResponse, PromptToken, Token};
use serde_json::{json, Value};
use structured_output::tool_call::{parse_tool_calls, CallDelta, ToolSyntax};

use crate::tool_call_stream::tool_call_id;

use super::error::Endpoint;

/// What every document of one response shares.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Chat or completions.
    pub endpoint: Endpoint,
    /// `chatcmpl-...` / `cmpl-...`.
    pub id: String,
    /// Unix time of the request, in seconds.
    pub created: u64,
    /// The model name the response reports.
    pub model: String,
    /// Whether log probabilities were asked for.
    pub logprobs: bool,
    /// Whether streamed chunks carry `usage` (null until the last chunk).
    pub include_usage: bool,
    /// Chat with tools: the syntax tool calls are read out of the text in.
    pub tool_syntax: Option<ToolSyntax>,
    /// vLLM's `return_tokens_as_token_ids`: the tokens of `logprobs` and their alternatives are
    /// named `token_id:ID` instead of by their texts (`bytes` stay the texts' bytes).
    pub token_ids: bool,
}

/// The finish reason of a choice that made tool calls: `tool_calls` where it would be `stop`.
pub fn with_calls(reason: &'static str, made_calls: bool) -> &'static str {
    if made_calls && reason == "stop" {
        "tool_calls"
    } else {
        reason
    }
}

/// OpenAI's finish reason for the router's.
pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::EosToken
        | FinishReason::StopSequence
        | FinishReason::ConstraintComplete
        | FinishReason::Unspecified => "stop",
        FinishReason::MaxNewTokens | FinishReason::ContextLength => "length",
        FinishReason::ToolCalls => "tool_calls",
    }
}

/// The tokens of a step that are shown: all but an EOS token that ended the sequence.
fn shown_tokens(message: &GenerateResponse) -> &[Token] {
    let tokens = &message.tokens[..];
    match tokens.split_last() {
        Some((_, rest)) if message.finish_reason() == FinishReason::EosToken => rest,
        _ => tokens,
    }
}

/// One choice as it accumulates (the whole response) or as one step of it (a chunk).
#[derive(Debug, Clone, Default)]
pub struct ChoiceText {
    /// Text.
    pub text: String,
    /// Shown tokens with their text offsets (characters into the choice's text).
    tokens: Vec<ShownToken>,
    /// Characters of text so far (the offset of the next step).
    chars: usize,
}

/// A shown token: its text and alternatives, its log probability (`None`: the first token of an
/// echoed prompt, which has none) and its text offset.
#[derive(Debug, Clone)]
struct ShownToken {
    token: Token,
    logprob: Option<f32>,
    offset: usize,
}

impl ChoiceText {
    /// Adds one step's text and tokens.
    pub fn push(&mut self, message: &GenerateResponse) {
        let offset = self.chars;
        self.tokens
            .extend(shown_tokens(message).iter().map(|t| ShownToken {
                token: t.clone(),
                logprob: Some(t.logprob),
                offset,
            }));
        self.text.push_str(&message.text);
        self.chars += message.text.chars().count();
    }

    /// Adds an echoed prompt: its `text` and, when the request scored them, its `tokens` (the
    /// first without a log probability), each at the character offset where its own text starts
    /// within the prompt's tokens' texts.
    pub fn push_prompt(&mut self, text: &str, tokens: &[PromptToken]) {
        let mut offset = self.chars;
        for t in tokens {
            self.tokens.push(ShownToken {
                token: Token {
                    id: t.id,
                    text: t.text.clone(),
                    logprob: t.logprob.unwrap_or(f32::NAN),
                    special: t.special,
                    top_logprobs: t.top_logprobs.clone(),
                },
                logprob: t.logprob,
                offset,
            });
            offset += t.text.chars().count();
        }
        self.text.push_str(text);
        self.chars += text.chars().count();
    }

    /// Whether there is nothing to show.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty() && self.tokens.is_empty()
    }

    /// Empties the text and tokens (the character offset stays).
    pub fn take(&mut self) -> ChoiceText {
        let chars = self.chars;
        let taken = std::mem::take(self);
        self.chars = chars;
        taken
    }
}

impl Reply {
    /// The `logprobs` value of a choice (`null` unless asked for).
    fn logprobs(&self, text: &ChoiceText) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let name = |id: u32, text: &str| {
            if self.token_ids {
                format!("token_id:{id}")
            } else {
                text.to_string()
            }
        };
        match self.endpoint {
            Endpoint::Chat => {
                let entry = |id: u32, text: &str, logprob: f32| json!({"token": name(id, text), "logprob": logprob, "bytes": text.as_bytes()});
                let content: Vec<Value> = text
                    .tokens
                    .iter()
                    .map(|ShownToken { token: t, .. }| {
                        let mut e = entry(t.id, &t.text, t.logprob);
                        e["top_logprobs"] = t
                            .top_logprobs
                            .iter()
                            .map(|a| entry(a.id, &a.text, a.logprob))
                            .collect();
                        e
                    })
                    .collect();
                json!({"content": content, "refusal": null})
            }
            Endpoint::Completions => {
                let tokens = &text.tokens;
                json!({
                    "tokens": tokens.iter().map(|t| name(t.token.id, &t.token.text)).collect::<Vec<_>>(),
                    "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                    // OpenAI's first echoed prompt token has `null` here too.
                    "top_logprobs": tokens.iter().map(|t| {
                        t.logprob.map(|_| t.token.top_logprobs
                            .iter()
                            .map(|a| (name(a.id, &a.text), json!(a.logprob)))
                            .collect::<serde_json::Map<_, _>>())
                    }).collect::<Vec<_>>(),
                    "text_offset": tokens.iter().map(|t| t.offset).collect::<Vec<_>>(),
                })
            }
        }
    }

    /// A choice of the whole response.
    pub fn choice(&self, index: usize, text: &ChoiceText, reason: &'static str) -> Value {
        let logprobs = self.logprobs(text);
        match self.endpoint {
            Endpoint::Chat if self.tool_syntax.is_some() => {
                let syntax = self.tool_syntax.unwrap_or(ToolSyntax::builtin());
                let parsed = parse_tool_calls(&syntax, &text.text);
                let mut message =
                    json!({"role": "assistant", "content": parsed.content, "refusal": null});
                if !parsed.calls.is_empty() {
                    message["tool_calls"] = parsed
                        .calls
                        .iter()
                        .map(|c| {
                            json!({"id": tool_call_id(), "type": "function",
                                   "function": {"name": c.name, "arguments": c.arguments}})
                        })
                        .collect();
                }
                json!({
                    "index": index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": with_calls(reason, !parsed.calls.is_empty()),
                })
            }
            Endpoint::Chat => json!({
                "index": index,
                "message": {"role": "assistant", "content": text.text, "refusal": null},
                "logprobs": logprobs,
                "finish_reason": reason,
            }),
            Endpoint::Completions => json!({
                "index": index,
                "text": text.text,
                "logprobs": logprobs,
                "finish_reason": reason,
            }),
        }
    }

    /// The whole response.
    pub fn response(&self, choices: Vec<Value>, usage: Value) -> Value {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completions => "text_completion",
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage,
            "system_fingerprint": null,
        })
    }

    /// The first chunk of a streamed chat choice: its role, with an empty content, or a null one
    /// in a chat with tools (so that the SDK's stream helpers assemble a message that only calls
    /// functions with `content: None`, as OpenAI's first tool-call chunk does).
    pub fn role_choice(&self, index: usize) -> Value {
        let content = if self.tool_syntax.is_some() {
            Value::Null
        } else {
            json!("")
        };
        json!({
            "index": index,
            "delta": {"role": "assistant", "content": content},
            "logprobs": null,
            "finish_reason": null,
        })
    }

    /// A streamed step of a choice (text and, when asked, its tokens' log probabilities).
    pub fn delta_choice(&self, index: usize, text: &ChoiceText) -> Value {
        let logprobs = self.logprobs(text);
        match self.endpoint {
            Endpoint::Chat => json!({
                "index": index,
                "delta": {"content": text.text},
                "logprobs": logprobs,
                "finish_reason": null,
            }),
            Endpoint::Completions => json!({
                "index": index,
                "text": text.text,
                "logprobs": logprobs,
                "finish_reason": null,
            }),
        }
    }

    /// A streamed step of a chat choice with tools: content, a call's id and name (its arguments
    /// empty), or a fragment of a call's arguments, as the OpenAI SDK's stream helpers assemble.
    pub fn tool_delta_choice(&self, index: usize, delta: &CallDelta) -> Value {
        let delta = match delta {
            CallDelta::Content(text) => json!({"content": text}),
            CallDelta::Start { index, name } => json!({"tool_calls": [{
                "index": index, "id": tool_call_id(), "type": "function",
                "function": {"name": name, "arguments": ""},
            }]}),
            CallDelta::Arguments { index, fragment } => json!({"tool_calls": [{
                "index": index, "function": {"arguments": fragment},
            }]}),
        };
        json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null})
    }

    /// The last streamed chunk of a choice: its finish reason.
    pub fn finish_choice(&self, index: usize, reason: &str) -> Value {
        match self.endpoint {
            Endpoint::Chat => json!({
                "index": index,
                "delta": {},
                "logprobs": null,
                "finish_reason": reason,
            }),
            Endpoint::Completions => json!({
                "index": index,
                "text": "",
                "logprobs": null,
                "finish_reason": reason,
            }),
        }
    }

    /// A streamed chunk with `choices`; `usage` is set on the usage chunk only (and is `null`
    /// on the others when `include_usage` is set, absent otherwise).
    pub fn chunk(&self, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        let mut chunk = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        });
        if self.include_usage {
            chunk["usage"] = usage.unwrap_or(Value::Null);
        }
        chunk
    }
}

/// OpenAI's `usage` object.
pub fn usage(prompt_tokens: u64, completion_tokens: u64) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use inference_proto::public::TopLogprob;

    fn reply(endpoint: Endpoint) -> Reply {
        Reply {
            endpoint,
            id: "x".into(),
            created: 1,
            model: "m".into(),
            logprobs: true,
            include_usage: false,
            tool_syntax: None,
            token_ids: false,
        }
    }

    fn token(id: u32, text: &str, logprob: f32) -> Token {
        Token {
            id,
            text: text.into(),
            logprob,
            special: false,
            top_logprobs: vec![TopLogprob {
                id: 9,
                text: "z".into(),
                logprob: -0.5,
            }],
        }
    }

    #[test]
    fn eos_is_hidden_and_offsets_count_characters() {
        let mut c = ChoiceText::default();
        c.push(&GenerateResponse {
            text: "hé".into(),
            tokens: vec![token(1, "hé", -1.0)],
            ..Default::default()
        });
        c.push(&GenerateResponse {
            text: "!".into(),
            tokens: vec![token(2, "!", -2.0), token(0, "", -0.1)],
            finish_reason: FinishReason::EosToken as i32,
            ..Default::default()
        });
        let lp = reply(Endpoint::Completions).logprobs(&c);
        assert_eq!(lp["tokens"], json!(["hé", "!"]));
        assert_eq!(lp["token_logprobs"], json!([-1.0, -2.0]));
        assert_eq!(lp["text_offset"], json!([0, 2]));
        assert_eq!(lp["top_logprobs"][1], json!({"z": -0.5}));
        let chat = reply(Endpoint::Chat).logprobs(&c);
        assert_eq!(chat["content"][0]["bytes"], json!("hé".as_bytes()));
        assert_eq!(chat["content"][1]["top_logprobs"][0]["token"], "z");
        assert_eq!(chat["content"].as_array().unwrap().len(), 2);
        // vLLM's `return_tokens_as_token_ids`: tokens and alternatives named by id.
        let by_id = Reply {
            token_ids: true,
            ..reply(Endpoint::Completions)
        };
        let lp = by_id.logprobs(&c);
        assert_eq!(lp["tokens"], json!(["token_id:1", "token_id:2"]));
        assert_eq!(lp["top_logprobs"][1], json!({"token_id:9": -0.5}));
        let chat = Reply {
            endpoint: Endpoint::Chat,
            ..by_id
        }
        .logprobs(&c);
        assert_eq!(chat["content"][0]["token"], "token_id:1");
        assert_eq!(chat["content"][0]["bytes"], json!("hé".as_bytes()));
        assert_eq!(chat["content"][1]["top_logprobs"][0]["token"], "token_id:9");
        let taken = c.take();
        assert_eq!(taken.text, "hé!");
        assert!(c.is_empty());
        assert_eq!(c.chars, 3);
    }

    #[test]
    fn the_role_chunk_of_a_chat_with_tools_has_null_content() {
        // The SDK's stream helpers start the message from the first delta: a chat that only
        // calls functions must assemble to `content: None`, as its non-streamed answer has.
        assert_eq!(reply(Endpoint::Chat).role_choice(0)["delta"]["content"], "");
        let tools = Reply {
            tool_syntax: Some(ToolSyntax::builtin()),
            ..reply(Endpoint::Chat)
        };
        assert_eq!(
            tools.role_choice(1)["delta"],
            json!({"role": "assistant", "content": null})
        );
    }

    #[test]
    fn finish_reasons_and_usage_chunks() {
        assert_eq!(finish_reason(FinishReason::EosToken), "stop");
        assert_eq!(finish_reason(FinishReason::StopSequence), "stop");
        assert_eq!(finish_reason(FinishReason::MaxNewTokens), "length");
        assert_eq!(finish_reason(FinishReason::ContextLength), "length");
        let mut r = reply(Endpoint::Chat);
        assert!(r.chunk(vec![], None).get("usage").is_none());
        r.include_usage = true;
        assert_eq!(r.chunk(vec![], None)["usage"], Value::Null);
        let u = r.chunk(vec![], Some(usage(3, 4)));
        assert_eq!(u["usage"]["total_tokens"], 7);
        assert_eq!(u["object"], "chat.completion.chunk");
    }

    #[test]
    fn tool_calls_take_the_message_and_the_finish_reason() {
        let mut r = reply(Endpoint::Chat);
        r.logprobs = false;
        r.tool_syntax = Some(ToolSyntax::builtin());
        let mut c = ChoiceText::default();
        c.push(&GenerateResponse {
            text: "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":1}}\n</tool_call>".into(),
            ..Default::default()
        });
        let choice = r.choice(0, &c, "stop");
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], Value::Null);
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert_eq!(
            call["function"],
            json!({"name": "f", "arguments": "{\"a\":1}"})
        );
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(r.choice(0, &c, "length")["finish_reason"], "length");
        let mut plain = ChoiceText::default();
        plain.push(&GenerateResponse {
            text: "No call.".into(),
            ..Default::default()
        });
        let choice = r.choice(0, &plain, "stop");
        assert_eq!(choice["message"]["content"], "No call.");
        assert!(choice["message"].get("tool_calls").is_none());
        assert_eq!(choice["finish_reason"], "stop");
        let start = r.tool_delta_choice(
            1,
            &CallDelta::Start {
                index: 0,
                name: "f".into(),
            },
        );
        assert_eq!(start["delta"]["tool_calls"][0]["function"]["arguments"], "");
        assert_eq!(start["index"], 1);
    }
}
