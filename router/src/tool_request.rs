//! A request's tool calling, as both fronts pass it to validation: the functions offered, the
//! `tool_choice`, and whether several calls may come in one turn. The HTTP front parses OpenAI's
//! `tools` / `tool_choice` / `parallel_tool_calls` into it (`openai::tools`), the gRPC front the
//! `GenerateRequest` fields 24-26 (`validation::tools`); both go through the checks here
//! ([`FunctionTool::new`], [`ToolRequest::new`], [`check_message_call`], [`check_tool_results`]),
//! so a request is refused with the same message on either front. Validation renders the tools
//! into the prompt and turns the choice into a grammar (`validation::tools`).

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use structured_output::tool_call::{valid_function_name, CallMode, FunctionSchema};

use crate::chat_template::{ChatMessage, MessageToolCall};

/// Why a request's tool calling is refused: the field at fault (`tools`, `tool_choice` or
/// `messages`, the OpenAI names; the gRPC fields carry the same names) and what is wrong with it,
/// naming the function or message. Each front maps it to its own error at its edge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ToolRequestError {
    /// The request field at fault.
    pub field: &'static str,
    /// What is wrong, for the caller.
    pub message: String,
}

impl ToolRequestError {
    fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }
}

/// The JSON Schema of a function that declares no `parameters`: an object with no properties
/// (so its calls' arguments are `{}`).
pub fn no_parameters() -> Value {
    serde_json::json!({"type": "object", "properties": {}, "additionalProperties": false})
}

/// One function the model may call (OpenAI's `{"type": "function", "function": {...}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionTool {
    /// Its name (1 to 64 of `a-zA-Z0-9_-`, unique in the request).
    pub name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of its arguments (an object schema; [`no_parameters`] when the request
    /// gives none).
    pub parameters: serde_json::Value,
    /// OpenAI's `strict`: accepted; arguments are always constrained to the schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl FunctionTool {
    /// Entry `i` of `tools` (0-based, for messages): `name` must be 1 to 64 of `a-zA-Z0-9_-`;
    /// `parameters` (`None`: [`no_parameters`]) must be a JSON object whose `type`, when given, is
    /// `"object"`.
    ///
    /// Errors: [`ToolRequestError`] naming `tools`, entry `i` and the function.
    pub fn new(
        i: usize,
        name: &str,
        description: Option<String>,
        parameters: Option<Value>,
        strict: Option<bool>,
    ) -> Result<Self, ToolRequestError> {
        let bad =
            |message: String| ToolRequestError::new("tools", format!("tools[{i}]: {message}"));
        if !valid_function_name(name) {
            return Err(bad(format!(
                "function name {name:?} must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -"
            )));
        }
        let parameters = match parameters {
            None | Some(Value::Null) => no_parameters(),
            Some(schema @ Value::Object(_)) => {
                if let Some(kind) = schema.get("type") {
                    if kind != "object" {
                        return Err(bad(format!(
                            "function {name:?}: parameters must be an object schema (\"type\": \
                             \"object\"), got type {kind}"
                        )));
                    }
                }
                schema
            }
            Some(_) => {
                return Err(bad(format!(
                    "function {name:?}: parameters must be a JSON Schema object"
                )))
            }
        };
        Ok(Self {
            name: name.to_string(),
            description,
            parameters,
            strict,
        })
    }
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Plain text; no call is parsed.
    None,
    /// Text, or calls (the model decides).
    Auto,
    /// At least one call, to any offered function.
    Required,
    /// A call to this function.
    Function(String),
}

/// The tool-calling part of a chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    /// The functions offered, in the request's order.
    pub functions: Vec<FunctionTool>,
    /// What the model may answer.
    pub choice: ToolChoice,
    /// Several calls in one turn (OpenAI's default: true).
    pub parallel: bool,
}

impl ToolRequest {
    /// The tool calling of a request offering `functions` (checked by [`FunctionTool::new`]) with
    /// `choice` and `parallel`; `None` when it offers no function and `choice` needs none (`none`,
    /// `auto`).
    ///
    /// Errors: [`ToolRequestError`] naming `tools` for a name given twice, `tool_choice` for a
    /// named function not offered or `required` without functions.
    pub fn new(
        functions: Vec<FunctionTool>,
        choice: ToolChoice,
        parallel: bool,
    ) -> Result<Option<Self>, ToolRequestError> {
        let mut seen = HashSet::new();
        for (i, function) in functions.iter().enumerate() {
            if !seen.insert(function.name.as_str()) {
                return Err(ToolRequestError::new(
                    "tools",
                    format!(
                        "tools[{i}]: function name {:?} is given twice",
                        function.name
                    ),
                ));
            }
        }
        match &choice {
            ToolChoice::Function(name) if !seen.contains(name.as_str()) => {
                return Err(ToolRequestError::new(
                    "tool_choice",
                    format!("tool_choice names function {name:?}, which is not in tools"),
                ))
            }
            ToolChoice::Required if functions.is_empty() => {
                return Err(ToolRequestError::new(
                    "tool_choice",
                    "tool_choice \"required\" needs at least one function in tools",
                ))
            }
            _ => {}
        }
        if functions.is_empty() {
            return Ok(None);
        }
        Ok(Some(Self {
            functions,
            choice,
            parallel,
        }))
    }

    /// Whether calls are read out of the generated text (every choice but `none`).
    pub fn parses_calls(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The functions the grammar allows and its mode; `None` for `tool_choice: "none"`.
    pub fn grammar_functions(&self) -> Option<(Vec<FunctionSchema<'_>>, CallMode)> {
        fn schema(f: &FunctionTool) -> FunctionSchema<'_> {
            FunctionSchema {
                name: &f.name,
                parameters: &f.parameters,
            }
        }
        match &self.choice {
            ToolChoice::None => None,
            ToolChoice::Auto => Some((self.functions.iter().map(schema).collect(), CallMode::Auto)),
            ToolChoice::Required => Some((
                self.functions.iter().map(schema).collect(),
                CallMode::Required,
            )),
            ToolChoice::Function(name) => Some((
                self.functions
                    .iter()
                    .filter(|f| &f.name == name)
                    .map(schema)
                    .collect(),
                CallMode::Required,
            )),
        }
    }

    /// The `tools` list as chat templates receive it (Hugging Face's convention: OpenAI's shape).
    pub fn template_tools(&self) -> serde_json::Value {
        self.functions
            .iter()
            .map(|f| serde_json::json!({"type": "function", "function": f}))
            .collect()
    }
}

/// Checks call `j` of message `i` (an assistant turn's earlier call, fed back): its `id` must not
/// be empty and its `arguments` must be JSON text.
///
/// Errors: [`ToolRequestError`] naming `messages`, the message and the call.
pub fn check_message_call(
    i: usize,
    j: usize,
    call: &MessageToolCall,
) -> Result<(), ToolRequestError> {
    if call.id.is_empty() {
        return Err(ToolRequestError::new(
            "messages",
            format!("messages[{i}].tool_calls[{j}]: id is empty"),
        ));
    }
    if serde_json::from_str::<Value>(&call.arguments).is_err() {
        return Err(ToolRequestError::new(
            "messages",
            format!("messages[{i}].tool_calls[{j}]: function.arguments is not valid JSON"),
        ));
    }
    Ok(())
}

/// Checks that every call id of the conversation is given once and that every `tool` message
/// answers a call an earlier assistant message made.
///
/// Errors: [`ToolRequestError`] naming `messages` for a call id given twice, a `tool` message
/// without `tool_call_id`, or whose id no earlier call has.
pub fn check_tool_results(messages: &[ChatMessage]) -> Result<(), ToolRequestError> {
    let mut calls = HashSet::new();
    for (i, message) in messages.iter().enumerate() {
        for (j, call) in message.tool_calls.iter().enumerate() {
            if !calls.insert(call.id.as_str()) {
                return Err(ToolRequestError::new(
                    "messages",
                    format!(
                        "messages[{i}].tool_calls[{j}]: id {:?} is given twice in the conversation",
                        call.id
                    ),
                ));
            }
        }
        if message.role != "tool" {
            continue;
        }
        let id = message.tool_call_id.as_deref().ok_or_else(|| {
            ToolRequestError::new(
                "messages",
                format!("messages[{i}] (role tool) needs tool_call_id"),
            )
        })?;
        if !calls.contains(id) {
            return Err(ToolRequestError::new(
                "messages",
                format!(
                    "messages[{i}].tool_call_id {id:?} answers no tool call of an earlier \
                     assistant message"
                ),
            ));
        }
    }
    Ok(())
}
