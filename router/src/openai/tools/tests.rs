//! Parsing and refusing `tools`, `tool_choice`, `parallel_tool_calls` and the messages' calls.

use serde_json::json;

use super::*;
use crate::chat_template::ChatMessage;
use crate::tool_request::check_tool_results;

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "d",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}})
}

fn refused(tools: Value, choice: Value, parallel: Value) -> (String, String) {
    let e = tool_request(Some(&tools), Some(&choice), Some(&parallel)).unwrap_err();
    assert_eq!(e.status, 400);
    (e.param.unwrap(), e.message)
}

#[test]
fn tools_parse_with_their_choice() {
    let t = tool_request(Some(&json!([weather()])), None, None)
        .unwrap()
        .unwrap();
    assert_eq!(t.choice, ToolChoice::Auto);
    assert!(t.parallel);
    assert_eq!(t.functions[0].name, "get_weather");
    assert_eq!(t.functions[0].strict, Some(true));
    let bare = json!([{"type": "function", "function": {"name": "now"}}]);
    let t = tool_request(Some(&bare), Some(&json!("required")), Some(&json!(false)))
        .unwrap()
        .unwrap();
    assert_eq!(
        t.functions[0].parameters,
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    );
    assert_eq!((t.choice, t.parallel), (ToolChoice::Required, false));
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let t = tool_request(Some(&json!([weather()])), Some(&named), None)
        .unwrap()
        .unwrap();
    assert_eq!(t.choice, ToolChoice::Function("get_weather".into()));
    assert!(tool_request(Some(&json!([])), Some(&json!("auto")), None)
        .unwrap()
        .is_none());
}

#[test]
fn bad_tools_are_refused_naming_the_field() {
    let null = Value::Null;
    let cases = [
        (
            json!({"a": 1}),
            null.clone(),
            null.clone(),
            "tools",
            "must be a list",
        ),
        (
            json!([{"type": "code"}]),
            null.clone(),
            null.clone(),
            "tools",
            "tools[0]: type",
        ),
        (
            json!([{"type": "function", "function": {"name": "a b"}}]),
            null.clone(),
            null.clone(),
            "tools",
            "\"a b\"",
        ),
        (
            json!([weather(), weather()]),
            null.clone(),
            null.clone(),
            "tools",
            "given twice",
        ),
        (
            json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]),
            null.clone(),
            null.clone(),
            "tools",
            "object schema",
        ),
        (
            json!([weather()]),
            json!({"type": "function", "function": {"name": "other"}}),
            null.clone(),
            "tool_choice",
            "\"other\"",
        ),
        (
            json!([weather()]),
            json!("sometimes"),
            null.clone(),
            "tool_choice",
            "sometimes",
        ),
        (
            json!([]),
            json!("required"),
            null.clone(),
            "tool_choice",
            "needs at least one",
        ),
        (
            json!([weather()]),
            null.clone(),
            json!("yes"),
            "parallel_tool_calls",
            "boolean",
        ),
    ];
    for (tools, choice, parallel, field, needle) in cases {
        let (param, message) = refused(tools.clone(), choice, parallel);
        assert_eq!(param, field, "{tools}: {message}");
        assert!(message.contains(needle), "{message}");
    }
}

#[test]
fn tool_messages_must_answer_an_earlier_call() {
    let calls = json!([{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]);
    let parsed = message_tool_calls(1, &calls).unwrap();
    assert_eq!(parsed[0].id, "c1");
    let bad = json!([{"id": "c1", "function": {"name": "f", "arguments": "{not json"}}]);
    let e = message_tool_calls(1, &bad).unwrap_err();
    assert!(
        e.message.contains("messages[1].tool_calls[0]"),
        "{}",
        e.message
    );
    let mut assistant = ChatMessage::new("assistant", "");
    assistant.tool_calls = parsed;
    let mut answer = ChatMessage::new("tool", "12 C");
    answer.tool_call_id = Some("c1".into());
    let ok = [
        ChatMessage::new("user", "?"),
        assistant.clone(),
        answer.clone(),
    ];
    check_tool_results(&ok).unwrap();
    answer.tool_call_id = Some("c9".into());
    let e = check_tool_results(&[assistant.clone(), answer.clone()]).unwrap_err();
    assert_eq!(e.field, "messages");
    assert!(e.message.contains("\"c9\""), "{}", e.message);
    answer.tool_call_id = None;
    let e = check_tool_results(&[assistant, answer]).unwrap_err();
    assert!(e.message.contains("needs tool_call_id"), "{}", e.message);
}
