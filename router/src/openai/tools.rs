//! OpenAI's tool-calling fields of a chat body: `tools`, `tool_choice`, `parallel_tool_calls`,
//! and the messages' `tool_calls` / `tool_call_id`, checked up front and turned into a
//! [`ToolRequest`] and [`MessageToolCall`]s. Every refusal is a 400 naming the field.

use std::collections::HashSet;

use serde_json::Value;
use structured_output::tool_call::valid_function_name;

use super::error::ApiError;
use crate::chat_template::{ChatMessage, MessageToolCall};
use crate::tool_request::{FunctionTool, ToolChoice, ToolRequest};

/// The JSON Schema of a function that declares no `parameters`: an object with no properties.
fn no_parameters() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// One entry of `tools`.
fn function_tool(i: usize, entry: &Value) -> Result<FunctionTool, ApiError> {
    let bad = |message: String| ApiError::invalid("tools", format!("tools[{i}]: {message}"));
    let kind = entry.get("type").and_then(Value::as_str);
    if kind != Some("function") {
        return Err(bad(format!(
            "type must be \"function\", got {}",
            entry.get("type").unwrap_or(&Value::Null)
        )));
    }
    let function = entry
        .get("function")
        .filter(|f| f.is_object())
        .ok_or_else(|| bad("function must be an object".into()))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("function.name must be a string".into()))?;
    if !valid_function_name(name) {
        return Err(bad(format!(
            "function name {name:?} must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -"
        )));
    }
    let description = match function.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(_) => {
            return Err(bad(format!(
                "function {name:?}: description must be a string"
            )))
        }
    };
    let parameters = match function.get("parameters") {
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
            schema.clone()
        }
        Some(_) => {
            return Err(bad(format!(
                "function {name:?}: parameters must be a JSON Schema object"
            )))
        }
    };
    let strict = match function.get("strict") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => return Err(bad(format!("function {name:?}: strict must be a boolean"))),
    };
    Ok(FunctionTool {
        name: name.to_string(),
        description,
        parameters,
        strict,
    })
}

/// `tool_choice` against the offered `functions`.
fn tool_choice(choice: Option<&Value>, functions: &[FunctionTool]) -> Result<ToolChoice, ApiError> {
    let bad = |message: String| ApiError::invalid("tool_choice", message);
    let choice = match choice {
        None | Some(Value::Null) => return Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "none" => return Ok(ToolChoice::None),
            "auto" => return Ok(ToolChoice::Auto),
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "tool_choice must be \"none\", \"auto\", \"required\" or \
                     {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {other:?}"
                )))
            }
        },
        Some(object @ Value::Object(_)) => {
            let name = object
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| object.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    bad("tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}"
                        .into())
                })?;
            if !functions.iter().any(|f| f.name == name) {
                return Err(bad(format!(
                    "tool_choice names function {name:?}, which is not in tools"
                )));
            }
            ToolChoice::Function(name.to_string())
        }
        Some(other) => {
            return Err(bad(format!(
                "tool_choice must be a string or an object, got {other}"
            )))
        }
    };
    if functions.is_empty() {
        return Err(bad(
            "tool_choice \"required\" needs at least one function in tools".into(),
        ));
    }
    Ok(choice)
}

/// The request's tools; `None` when it offers none (no `tools`, or an empty list).
///
/// Errors: 400 naming `tools` (not a list, an entry that is not a function, an invalid or
/// duplicate name, `parameters` that is not an object schema), `tool_choice` (unknown value, a
/// function not offered, `required` without tools) or `parallel_tool_calls` (not a boolean).
pub fn tool_request(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<&Value>,
) -> Result<Option<ToolRequest>, ApiError> {
    let functions = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(entries)) => {
            let mut seen = HashSet::new();
            let mut functions = Vec::with_capacity(entries.len());
            for (i, entry) in entries.iter().enumerate() {
                let function = function_tool(i, entry)?;
                if !seen.insert(function.name.clone()) {
                    return Err(ApiError::invalid(
                        "tools",
                        format!(
                            "tools[{i}]: function name {:?} is given twice",
                            function.name
                        ),
                    ));
                }
                functions.push(function);
            }
            functions
        }
        Some(_) => return Err(ApiError::invalid("tools", "tools must be a list")),
    };
    let parallel = match parallel {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid(
                "parallel_tool_calls",
                "parallel_tool_calls must be a boolean",
            ))
        }
    };
    let choice = tool_choice(choice, &functions)?;
    if functions.is_empty() {
        return Ok(None);
    }
    Ok(Some(ToolRequest {
        functions,
        choice,
        parallel,
    }))
}

/// An assistant message's `tool_calls` (message `i`).
///
/// Errors: 400 naming `messages` for an entry that is not `{"id", "type": "function",
/// "function": {"name", "arguments"}}` with `arguments` a string of JSON.
pub fn message_tool_calls(i: usize, calls: &Value) -> Result<Vec<MessageToolCall>, ApiError> {
    let bad = |j: usize, message: &str| {
        ApiError::invalid(
            "messages",
            format!("messages[{i}].tool_calls[{j}]: {message}"),
        )
    };
    let Value::Array(entries) = calls else {
        return Err(ApiError::invalid(
            "messages",
            format!("messages[{i}].tool_calls must be a list"),
        ));
    };
    let mut out = Vec::with_capacity(entries.len());
    for (j, entry) in entries.iter().enumerate() {
        let id = entry
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(j, "id must be a string"))?;
        let function = entry
            .get("function")
            .ok_or_else(|| bad(j, "function is missing"))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(j, "function.name must be a string"))?;
        let arguments = function
            .get("arguments")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(j, "function.arguments must be a string (JSON text)"))?;
        if serde_json::from_str::<Value>(arguments).is_err() {
            return Err(bad(j, "function.arguments is not valid JSON"));
        }
        out.push(MessageToolCall {
            id: id.to_string(),
            name: name.to_string(),
            arguments: arguments.to_string(),
        });
    }
    Ok(out)
}

/// Checks that every `tool` message answers a call an earlier assistant message made.
///
/// Errors: 400 naming `messages` for a `tool` message without `tool_call_id`, or whose id no
/// earlier call has.
pub fn check_tool_results(messages: &[ChatMessage]) -> Result<(), ApiError> {
    let mut calls = HashSet::new();
    for (i, message) in messages.iter().enumerate() {
        calls.extend(message.tool_calls.iter().map(|c| c.id.as_str()));
        if message.role != "tool" {
            continue;
        }
        let id = message.tool_call_id.as_deref().ok_or_else(|| {
            ApiError::invalid(
                "messages",
                format!("messages[{i}] (role tool) needs tool_call_id"),
            )
        })?;
        if !calls.contains(id) {
            return Err(ApiError::invalid(
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

#[cfg(test)]
mod tests;
