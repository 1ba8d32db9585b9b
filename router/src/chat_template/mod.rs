//! Chat templates: [`ChatTemplate`] renders a conversation into the prompt
//! text a model was trained on, from the Jinja template shipped in the GGUF
//! (`tokenizer.chat_template`) or `tokenizer_config.json`, a file named by the `chat_template`
//! setting, or, for a model file without one, a built-in template chosen by architecture
//! ([`builtin_template`]).
//!
//! The environment mirrors the one Hugging Face `transformers` uses for
//! `apply_chat_template` (`ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True)` plus `raise_exception` and a `tojson` filter with
//! Python `json.dumps(ensure_ascii=False)` formatting), on minijinja with the
//! `minijinja-contrib` Python-compatibility methods (`.strip()`,
//! `.startswith()`, `.items()`, …). Template variables: `messages` (list of
//! `{role, content}`), `add_generation_prompt`, `bos_token`, `eos_token`.
//!
//! Message content is user text, not markup: [`ChatTemplate::render_pieces`] keeps it apart from
//! what the template writes, so the tokenizer recognises special tokens such as `<|im_start|>` only
//! in the template's own text ([`tokenizer::TextTokenizer::encode_pieces`]); the same text
//! inside a message is ordinary text (no prompt injection into the chat structure). It renders
//! each non-empty content (an empty one stays empty: templates test it) wrapped in two Unicode
//! noncharacters (U+FDD0 ... U+FDD1, reserved for a program's
//! internal use) and splits the output at them. A template that edits content as a string sees the
//! wrapped text: `| trim` or `.strip()` then leave the content's own outer whitespace in place
//! (SmolLM2's template does not edit content).

use minijinja::Environment;
use serde::{Deserialize, Serialize};

mod builtin;
mod helpers;
mod limits;
mod pieces;
#[cfg(test)]
mod tests;
mod tool_prompt;

pub use builtin::{builtin_template, BuiltinTemplate};
use helpers::{describe, raise_exception, strftime_now, tojson};
pub use limits::{MAX_RENDERED_BYTES, RENDER_FUEL};
use pieces::{split_marked, CONTENT_CLOSE, CONTENT_OPEN};
/// What [`ChatTemplate::render_pieces`] gives: the tokenizer's input type, defined beside
/// [`TextTokenizer::encode_pieces`](tokenizer::TextTokenizer::encode_pieces).
pub use tokenizer::TemplatePiece;
pub use tool_prompt::{builtin_tool_messages, tools_system_text};

const TEMPLATE_NAME: &str = "chat_template";

/// Why a chat template could not be compiled or rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template source does not compile (the message names the line).
    #[error("invalid chat template: {0}")]
    Syntax(String),
    /// Rendering failed: the template called `raise_exception` (e.g. roles
    /// that do not alternate), or used a value in an unsupported way.
    #[error("chat template rendering failed: {0}")]
    Render(String),
    /// A message's content cannot be kept apart from the template's text: it holds one of the
    /// noncharacters that mark content, or the template cut or repeated the marked content.
    #[error("message content: {0}")]
    Content(String),
}

/// A call an earlier assistant turn made (OpenAI's `tool_calls` entries).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageToolCall {
    /// The call's id, which a later `tool` message answers.
    pub id: String,
    /// The function called.
    pub name: String,
    /// The arguments, as JSON text.
    pub arguments: String,
}

impl MessageToolCall {
    /// The call as chat templates receive it (Hugging Face's convention:
    /// `{"id", "type": "function", "function": {"name", "arguments"}}` with the arguments as a
    /// JSON value, as vLLM passes them; text that is not JSON stays a string).
    fn template_value(&self) -> serde_json::Value {
        let arguments = serde_json::from_str(&self.arguments)
            .unwrap_or_else(|_| serde_json::Value::String(self.arguments.clone()));
        serde_json::json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": arguments},
        })
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `"system"`, `"user"`, `"assistant"`, `"tool"`, … (passed to the template as is).
    pub role: String,
    /// The message text.
    pub content: String,
    /// An assistant turn's calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<MessageToolCall>,
    /// A `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// Anything that reads as one chat message: [`ChatMessage`], the public
/// API's `inference.v1.ChatMessage`, or a `(role, content)` pair.
pub trait ChatTurn {
    /// The speaker: `"system"`, `"user"`, `"assistant"`, …
    fn role(&self) -> &str;
    /// The message text.
    fn content(&self) -> &str;
    /// An assistant turn's calls (none by default).
    fn tool_calls(&self) -> &[MessageToolCall] {
        &[]
    }
    /// A `tool` message's call id (none by default).
    fn tool_call_id(&self) -> Option<&str> {
        None
    }
}

impl ChatTurn for ChatMessage {
    fn role(&self) -> &str {
        &self.role
    }
    fn content(&self) -> &str {
        &self.content
    }
    fn tool_calls(&self) -> &[MessageToolCall] {
        &self.tool_calls
    }
    fn tool_call_id(&self) -> Option<&str> {
        self.tool_call_id.as_deref()
    }
}

/// A message with its content marked (see [`ChatTemplate::render_pieces`]).
struct MarkedTurn<'a> {
    role: &'a str,
    content: String,
    tool_calls: &'a [MessageToolCall],
    tool_call_id: Option<&'a str>,
}

impl ChatTurn for MarkedTurn<'_> {
    fn role(&self) -> &str {
        self.role
    }
    fn content(&self) -> &str {
        &self.content
    }
    fn tool_calls(&self) -> &[MessageToolCall] {
        self.tool_calls
    }
    fn tool_call_id(&self) -> Option<&str> {
        self.tool_call_id
    }
}

/// The wire message as a turn without its tool calls (a request with calls converts its messages
/// into [`ChatMessage`]s first: `GenerationRequest::try_from`).
impl ChatTurn for inference_proto::public::ChatMessage {
    fn role(&self) -> &str {
        &self.role
    }
    fn content(&self) -> &str {
        &self.content
    }
    fn tool_call_id(&self) -> Option<&str> {
        self.tool_call_id.as_deref()
    }
}

impl<R: AsRef<str>, C: AsRef<str>> ChatTurn for (R, C) {
    fn role(&self) -> &str {
        self.0.as_ref()
    }
    fn content(&self) -> &str {
        self.1.as_ref()
    }
}

/// The template's view of one message.
#[derive(Serialize)]
struct TemplateMessage<'a> {
    role: &'a str,
    content: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<serde_json::Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

/// A compiled chat template (`Send + Sync`; share it behind an `Arc`).
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles a Jinja chat template. `bos_token` / `eos_token` are the
    /// token texts exposed to the template (undefined when `None`).
    ///
    /// # Errors
    /// [`ChatTemplateError::Syntax`] when the template does not compile.
    pub fn new(
        source: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// Renders `messages` into prompt text; with `add_generation_prompt` the
    /// template appends the opening of the assistant's turn.
    ///
    /// # Errors
    /// [`ChatTemplateError::Render`] when the template raises or fails, or passes
    /// [`RENDER_FUEL`] steps or [`MAX_RENDERED_BYTES`] of output.
    pub fn render<M: ChatTurn>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with_tools(messages, add_generation_prompt, None)
    }

    /// [`render`](Self::render) with the template variable `tools` set to `tools` (OpenAI's
    /// `tools` list, as Hugging Face passes it) when given; messages carry their `tool_calls` and
    /// `tool_call_id`.
    ///
    /// # Errors
    /// As [`render`](Self::render).
    pub fn render_with_tools<M: ChatTurn>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String, ChatTemplateError> {
        let messages: Vec<TemplateMessage<'_>> = messages
            .iter()
            .map(|m| TemplateMessage {
                role: m.role(),
                content: m.content(),
                tool_calls: (!m.tool_calls().is_empty()).then(|| {
                    m.tool_calls()
                        .iter()
                        .map(MessageToolCall::template_value)
                        .collect()
                }),
                tool_call_id: m.tool_call_id(),
            })
            .collect();
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError::Render(describe(&e)))?;
        let context = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        };
        let context = match tools {
            Some(tools) => minijinja::context! { tools => tools, ..context },
            None => context,
        };
        limits::render_bounded(&template, context, MAX_RENDERED_BYTES)
            .map_err(|e| ChatTemplateError::Render(e.to_string()))
    }
}

impl ChatTemplate {
    /// Renders `messages` like [`render`](Self::render), as pieces that tell the template's own
    /// text from message content (see the module docs). Concatenated, the pieces are the text
    /// `render` gives for the same messages (for templates that do not edit content).
    ///
    /// # Errors
    /// [`ChatTemplateError::Content`] when a content holds U+FDD0 or U+FDD1, or the template cut,
    /// nested or dropped part of the marked content; [`ChatTemplateError::Render`] as for
    /// `render`.
    pub fn render_pieces<M: ChatTurn>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
    ) -> Result<Vec<TemplatePiece>, ChatTemplateError> {
        self.render_pieces_with_tools(messages, add_generation_prompt, None)
    }

    /// [`render_pieces`](Self::render_pieces) with `tools` as in
    /// [`render_with_tools`](Self::render_with_tools). Only message content is marked: the tool
    /// list and earlier calls' arguments are written as the template's own text.
    ///
    /// # Errors
    /// As [`render_pieces`](Self::render_pieces).
    pub fn render_pieces_with_tools<M: ChatTurn>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<Vec<TemplatePiece>, ChatTemplateError> {
        if let Some(i) = messages
            .iter()
            .position(|m| m.content().contains([CONTENT_OPEN, CONTENT_CLOSE]))
        {
            return Err(ChatTemplateError::Content(format!(
                "messages[{i}].content holds U+FDD0 or U+FDD1 (Unicode noncharacters, reserved \
                 for internal use)"
            )));
        }
        let marked: Vec<MarkedTurn<'_>> = messages
            .iter()
            .map(|m| MarkedTurn {
                role: m.role(),
                // An empty content stays empty (a template tests it: `{% if message.content %}`).
                content: if m.content().is_empty() {
                    String::new()
                } else {
                    format!("{CONTENT_OPEN}{}{CONTENT_CLOSE}", m.content())
                },
                tool_calls: m.tool_calls(),
                tool_call_id: m.tool_call_id(),
            })
            .collect();
        split_marked(&self.render_with_tools(&marked, add_generation_prompt, tools)?)
            .map_err(|e| ChatTemplateError::Content(e.to_string()))
    }
}
