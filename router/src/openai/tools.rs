//! OpenAI's tool-calling fields of a chat body: `tools`, `tool_choice`, `parallel_tool_calls`,
//! and the messages' `tool_calls` / `tool_call_id`, checked up front and turned into a
//! [`ToolRequest`] and [`MessageToolCall`]s. Every refusal is a 400 naming the field.

use serde_json::Value;

use super::error::ApiError;
use crate::chat_template::MessageToolCall;
use crate::tool_request::{
    check_message_call, FunctionTool, ToolChoice, ToolRequest, ToolRequestError,
};

impl From<ToolRequestError> for ApiError {
    fn from(e: ToolRequestError) -> Self {
        ApiError::invalid(e.field, e.message)
    }
}

/// One entry of `tools`: its JSON shape here, the rest in [`FunctionTool::new`].
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
    let description = match function.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(_) => {
            return Err(bad(format!(
                "function {name:?}: description must be a string"
            )))
        }
    };
    let strict = match function.get("strict") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => return Err(bad(format!("function {name:?}: strict must be a boolean"))),
    };
    let parameters = function.get("parameters").cloned();
    Ok(FunctionTool::new(i, name, description, parameters, strict)?)
}

/// `tool_choice` as given; whether it fits the offered functions is [`ToolRequest::new`]'s check.
fn tool_choice(choice: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let bad = |message: String| ApiError::invalid("tool_choice", message);
    match choice {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            other => Err(bad(format!(
                "tool_choice must be \"none\", \"auto\", \"required\" or \
                 {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {other:?}"
            ))),
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
            Ok(ToolChoice::Function(name.to_string()))
        }
        Some(other) => Err(bad(format!(
            "tool_choice must be a string or an object, got {other}"
        ))),
    }
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
        Some(Value::Array(entries)) => entries
            .iter()
            .enumerate()
            .map(|(i, entry)| function_tool(i, entry))
            .collect::<Result<_, _>>()?,
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
    Ok(ToolRequest::new(functions, tool_choice(choice)?, parallel)?)
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
        let call = MessageToolCall {
            id: id.to_string(),
            name: name.to_string(),
            arguments: arguments.to_string(),
        };
        check_message_call(i, j, &call)?;
        out.push(call);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
