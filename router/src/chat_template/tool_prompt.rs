//! The built-in tool-calling prompt, for models whose chat template has no tool support: the
//! conversation is rewritten into plain messages in the Hermes format (the format Qwen 2.5's own
//! template writes), then rendered by the model's template as usual.
//!
//! - the tool list goes into the system turn (appended to the request's system message, or a new
//!   one first): the functions as JSON lines inside `<tools></tools>`, and the instruction to answer
//!   with `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`;
//! - an assistant turn's earlier calls are appended to its content in that syntax;
//! - `tool` messages become one `user` turn per run of them, each result inside
//!   `<tool_response>\n...\n</tool_response>`.

use structured_output::tool_call::ToolSyntax;

use super::ChatMessage;
use crate::tool_request::FunctionTool;

/// The system-turn text that offers `functions`.
pub fn tools_system_text(functions: &[FunctionTool]) -> String {
    let mut lines = String::new();
    for function in functions {
        let entry = serde_json::json!({"type": "function", "function": function});
        lines.push_str(&entry.to_string());
        lines.push('\n');
    }
    format!(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
         {lines}</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
    )
}

/// `messages` rewritten into plain messages in the built-in format, offering `functions` (no tool
/// text in the system turn when there are none).
pub fn builtin_tool_messages(
    messages: &[ChatMessage],
    functions: &[FunctionTool],
) -> Vec<ChatMessage> {
    let syntax = ToolSyntax::builtin();
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    if !functions.is_empty() {
        let tools = tools_system_text(functions);
        match messages.first() {
            Some(first) if first.role == "system" => {}
            _ => out.push(ChatMessage::new("system", tools)),
        }
    }
    let mut previous_was_tool = false;
    for (i, message) in messages.iter().enumerate() {
        match message.role.as_str() {
            "system" if i == 0 && !functions.is_empty() => out.push(ChatMessage::new(
                "system",
                format!("{}\n\n{}", message.content, tools_system_text(functions)),
            )),
            "tool" => {
                let response = format!("<tool_response>\n{}\n</tool_response>", message.content);
                match out.last_mut() {
                    Some(last) if previous_was_tool => {
                        last.content.push('\n');
                        last.content.push_str(&response);
                    }
                    _ => out.push(ChatMessage::new("user", response)),
                }
            }
            _ if !message.tool_calls.is_empty() => {
                let calls: Vec<(&str, &str)> = message
                    .tool_calls
                    .iter()
                    .map(|c| (c.name.as_str(), c.arguments.as_str()))
                    .collect();
                let mut content = message.content.clone();
                if !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(&syntax.write(&calls));
                out.push(ChatMessage::new(message.role.clone(), content));
            }
            _ => out.push(ChatMessage::new(
                message.role.clone(),
                message.content.clone(),
            )),
        }
        previous_was_tool = message.role == "tool";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat_template::MessageToolCall;

    #[test]
    fn tools_go_to_the_system_turn_and_calls_and_results_to_text() {
        let functions = vec![FunctionTool {
            name: "get_weather".into(),
            description: Some("Weather".into()),
            parameters: serde_json::json!({"type": "object"}),
            strict: None,
        }];
        let mut assistant = ChatMessage::new("assistant", "");
        assistant.tool_calls = vec![MessageToolCall {
            id: "c1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Oslo"}"#.into(),
        }];
        let mut tool = ChatMessage::new("tool", "12 C");
        tool.tool_call_id = Some("c1".into());
        let messages = vec![
            ChatMessage::new("user", "Weather?"),
            assistant,
            tool.clone(),
            tool,
        ];
        let out = builtin_tool_messages(&messages, &functions);
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].role, "system");
        assert!(out[0].content.contains(
            r#"{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object"}}}"#
        ));
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>"
        );
        assert_eq!(out[3].role, "user");
        assert_eq!(
            out[3].content,
            "<tool_response>\n12 C\n</tool_response>\n<tool_response>\n12 C\n</tool_response>"
        );
        let with_system = builtin_tool_messages(
            &[
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "x"),
            ],
            &functions,
        );
        assert_eq!(with_system.len(), 2);
        assert!(with_system[0].content.starts_with("Be brief.\n\n# Tools"));
        let none = builtin_tool_messages(&[ChatMessage::new("user", "x")], &[]);
        assert_eq!(none, vec![ChatMessage::new("user", "x")]);
    }
}
