//! Chat templates: arbitrary messages through every built-in template and the tiny model's own
//! (SmolLM2's), and an arbitrary template source through the router's template environment
//! ([`ChatTemplate::new`]: minijinja with the project's helpers and limits).
//!
//! Properties: no panic; every failure a [`ChatTemplateError`]; a rendering ends within the
//! template limits ([`router::chat_template::RENDER_FUEL`] steps, [`MAX_RENDERED_BYTES`] of output;
//! `scripts/fuzz` gives each input 10 s); for the built-in templates (which
//! never edit content), the pieces the router tokenizes ([`ChatTemplate::render_pieces`]) are
//! the rendered text cut into markup and content, with each message's content whole and in order.

use router::chat_template::{
    builtin_template, ChatMessage, ChatTemplate, ChatTemplateError, MessageToolCall, TemplatePiece,
    MAX_RENDERED_BYTES,
};

use crate::input::Input;

/// The architectures whose built-in templates [`chat_template()`] renders (every built-in one:
/// `gemma`, `chatml`, `llama3`, `phi3`).
const ARCHITECTURES: [&str; 4] = ["gemma3", "qwen2", "llama", "phi3"];

/// Roles a message takes by its role byte (modulo 5; the last takes its role from the input).
const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// `chat-template`. First byte even: messages (see [`messages`]) through every built-in template and
/// SmolLM2's. Odd: the rest of the input, lossily as UTF-8, is a template source, rendered (when it
/// compiles) over a fixed conversation with and without tools.
pub fn chat_template(data: &[u8]) {
    let mut input = Input::new(data);
    if input.byte().is_multiple_of(2) {
        let messages = messages(&mut input);
        let mut sources: Vec<(&str, &str)> = ARCHITECTURES
            .iter()
            .filter_map(|arch| builtin_template(arch, |_| true))
            .map(|t| (t.name, t.source))
            .collect();
        sources.push(("smollm2", gguf::testing::SMOLLM2_CHAT_TEMPLATE));
        for (name, source) in sources {
            let template = ChatTemplate::new(source, Some("<s>".into()), Some("</s>".into()))
                .expect("a built-in template compiles");
            check_builtin(name, &template, &messages);
        }
    } else {
        let source = String::from_utf8_lossy(input.rest());
        let Ok(template) = ChatTemplate::new(&source, Some("<s>".into()), Some("</s>".into()))
        else {
            return;
        };
        let messages = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
            ChatMessage {
                tool_calls: vec![MessageToolCall {
                    id: "call_1".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Paris"}"#.into(),
                }],
                ..ChatMessage::new("assistant", "")
            },
            ChatMessage {
                tool_call_id: Some("call_1".into()),
                ..ChatMessage::new("tool", "sunny")
            },
        ];
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        if let Ok(text) = template.render(&messages, true) {
            assert!(
                text.len() <= MAX_RENDERED_BYTES,
                "{} bytes rendered",
                text.len()
            );
        }
        let _ = template.render_pieces_with_tools(&messages, true, Some(&tools));
    }
}

/// Messages from the input: per message a role byte (see [`ROLES`]; bit 4 adds a tool call, bit 5 a
/// tool call id), a length byte and that many bytes of content, lossily as UTF-8 (a role from the
/// input takes a length byte and its bytes first).
fn messages(input: &mut Input<'_>) -> Vec<ChatMessage> {
    let mut messages = Vec::new();
    let text = |input: &mut Input<'_>| {
        let len = input.byte() as usize;
        String::from_utf8_lossy(input.bytes(len)).into_owned()
    };
    while !input.is_empty() {
        let r = input.byte();
        let role = match ROLES.get(r as usize % 5) {
            Some(role) => role.to_string(),
            None => text(input),
        };
        let mut message = ChatMessage::new(role, text(input));
        if r & 0x10 != 0 {
            message.tool_calls.push(MessageToolCall {
                id: "call_0".into(),
                name: text(input),
                arguments: text(input),
            });
        }
        if r & 0x20 != 0 {
            message.tool_call_id = Some(text(input));
        }
        messages.push(message);
    }
    messages
}

/// Renders `messages` with a built-in `template` as text and as pieces, and checks that they agree.
fn check_builtin(name: &str, template: &ChatTemplate, messages: &[ChatMessage]) {
    for add_generation_prompt in [false, true] {
        let text = template.render(messages, add_generation_prompt);
        let pieces = template.render_pieces(messages, add_generation_prompt);
        let (text, pieces) = match (text, pieces) {
            (Ok(text), Ok(pieces)) => (text, pieces),
            (_, Err(ChatTemplateError::Content(_))) => continue, // reserved characters in content
            (Err(e), _) | (_, Err(e)) => {
                assert!(!e.to_string().is_empty());
                continue;
            }
        };
        let joined: String = pieces
            .iter()
            .map(|p| match p {
                TemplatePiece::Markup(s) | TemplatePiece::Content(s) => s.as_str(),
            })
            .collect();
        assert_eq!(joined, text, "{name}: the pieces are not the rendered text");
        let contents: Vec<&str> = pieces
            .iter()
            .filter_map(|p| match p {
                TemplatePiece::Content(s) => Some(s.as_str()),
                TemplatePiece::Markup(_) => None,
            })
            .collect();
        let expected: Vec<&str> = messages
            .iter()
            .map(|m| m.content.as_str())
            .filter(|c| !c.is_empty())
            .collect();
        let contents: Vec<&str> = contents.into_iter().filter(|c| !c.is_empty()).collect();
        assert_eq!(
            contents, expected,
            "{name}: message content cut, lost or reordered"
        );
    }
}
