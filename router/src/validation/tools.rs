//! A chat request's tools in validation: the gRPC request's tool fields converted
//! ([`grpc_tool_request`], [`grpc_messages`]), rendering them into the prompt (the template's own
//! tool support, or the built-in prompt) and turning `tool_choice` into the grammar the worker
//! follows.

use inference_proto::public::{
    constraint::Kind, tool_choice, ChatMessage as WireMessage, Constraint, Tool,
    ToolChoice as WireToolChoice, ToolChoiceMode,
};
use structured_output::tool_call::tool_call_grammar;
use structured_output::ConstraintSpec;

use super::ValidationError;
use crate::chat_template::{
    builtin_tool_messages, ChatMessage, ChatTemplate, ChatTemplateError, MessageToolCall,
    TemplatePiece,
};
use crate::model_context::ModelContext;
use crate::request::GenerationRequest;
use crate::tool_request::{
    check_message_call, check_tool_results, FunctionTool, ToolChoice, ToolRequest, ToolRequestError,
};

impl From<ToolRequestError> for ValidationError {
    fn from(e: ToolRequestError) -> Self {
        ValidationError::invalid(e.field, e.message)
    }
}

/// The gRPC request's tool calling (`GenerateRequest.tools`, `tool_choice`,
/// `parallel_tool_calls`) as a [`ToolRequest`]; `None` when it offers no tools (and its choice
/// needs none).
///
/// Errors: [`ValidationError::Invalid`] naming `tools` (a `parameters` that is not JSON text, and
/// [`FunctionTool::new`]'s and [`ToolRequest::new`]'s checks) or `tool_choice` (an unknown mode,
/// a function not offered, REQUIRED without tools).
pub fn grpc_tool_request(
    tools: Vec<Tool>,
    choice: Option<WireToolChoice>,
    parallel: Option<bool>,
) -> Result<Option<ToolRequest>, ValidationError> {
    let functions = tools
        .into_iter()
        .enumerate()
        .map(|(i, tool)| {
            let parameters = match tool.parameters.trim() {
                "" => None,
                text => Some(serde_json::from_str(text).map_err(|e| {
                    ValidationError::invalid(
                        "tools",
                        format!(
                            "tools[{i}]: function {:?}: parameters is not JSON text: {e}",
                            tool.name
                        ),
                    )
                })?),
            };
            let description = Some(tool.description).filter(|d| !d.is_empty());
            Ok(FunctionTool::new(
                i,
                &tool.name,
                description,
                parameters,
                None,
            )?)
        })
        .collect::<Result<Vec<_>, ValidationError>>()?;
    let choice = match choice.and_then(|c| c.kind) {
        None => ToolChoice::Auto,
        Some(tool_choice::Kind::Function(name)) => ToolChoice::Function(name),
        Some(tool_choice::Kind::Mode(mode)) => match ToolChoiceMode::try_from(mode) {
            Ok(ToolChoiceMode::Unspecified | ToolChoiceMode::Auto) => ToolChoice::Auto,
            Ok(ToolChoiceMode::None) => ToolChoice::None,
            Ok(ToolChoiceMode::Required) => ToolChoice::Required,
            Err(_) => {
                return Err(ValidationError::invalid(
                    "tool_choice",
                    format!("tool_choice mode {mode} is not a ToolChoiceMode"),
                ))
            }
        },
    };
    Ok(ToolRequest::new(
        functions,
        choice,
        parallel.unwrap_or(true),
    )?)
}

/// The gRPC request's chat messages, their tool calls and results checked
/// ([`check_message_call`], [`check_tool_results`]).
///
/// Errors: [`ValidationError::Invalid`] naming `messages`.
pub fn grpc_messages(messages: Vec<WireMessage>) -> Result<Vec<ChatMessage>, ValidationError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        let mut message = ChatMessage::new(m.role, m.content);
        for (j, call) in m.tool_calls.into_iter().enumerate() {
            let call = MessageToolCall {
                id: call.id,
                name: call.name,
                arguments: call.arguments,
            };
            check_message_call(i, j, &call)?;
            message.tool_calls.push(call);
        }
        message.tool_call_id = m.tool_call_id;
        out.push(message);
    }
    check_tool_results(&out)?;
    Ok(out)
}

/// Renders a chat prompt with its tools: through the template's own tool support (`tools` and
/// the messages' calls as Hugging Face passes them) when it has one, else rewritten into the
/// built-in format ([`builtin_tool_messages`]) when the request offers tools or the conversation
/// holds calls or tool results.
///
/// With `add_generation_prompt` the template appends the opening of the assistant's turn (what a
/// chat request generates after).
///
/// Errors: the template's.
pub fn render_tool_chat(
    template: &ChatTemplate,
    model: &ModelContext,
    messages: &[ChatMessage],
    tools: Option<&ToolRequest>,
    add_generation_prompt: bool,
) -> Result<Vec<TemplatePiece>, ChatTemplateError> {
    let open = add_generation_prompt;
    if model.template_has_tools {
        let list = tools.map(ToolRequest::template_tools);
        return template.render_pieces_with_tools(messages, open, list.as_ref());
    }
    let has_tool_turns = messages
        .iter()
        .any(|m| m.role == "tool" || !m.tool_calls.is_empty());
    match tools {
        Some(tools) => {
            template.render_pieces(&builtin_tool_messages(messages, &tools.functions), open)
        }
        None if has_tool_turns => {
            template.render_pieces(&builtin_tool_messages(messages, &[]), open)
        }
        None => template.render_pieces(messages, open),
    }
}

/// `req` with the grammar of its tool choice as its constraint (unchanged without tools or with
/// `tool_choice: "none"`).
///
/// Errors: [`ValidationError::Invalid`] naming `tools` for tools with a `response_format` (or
/// another constraint), a model without structured output, a function whose `parameters`
/// llguidance cannot compile (naming the function), or a grammar that does not compile.
pub fn with_tool_constraint(
    mut req: GenerationRequest,
    model: &ModelContext,
) -> Result<GenerationRequest, ValidationError> {
    let Some(tools) = &req.tools else {
        return Ok(req);
    };
    let Some((functions, mode)) = tools.grammar_functions() else {
        return Ok(req);
    };
    if req.constraint.is_some() {
        return Err(ValidationError::invalid(
            "tools",
            "tools (with tool_choice other than \"none\") cannot be combined with a \
             constraint (response_format or a guided_* field over HTTP)",
        ));
    }
    let compiler = model.constraints.wait().map_err(|reason| {
        ValidationError::invalid(
            "tools",
            format!("tool calling needs structured output, which this model lacks: {reason}"),
        )
    })?;
    for function in &functions {
        let schema = function.parameters.to_string();
        compiler
            .check(ConstraintSpec::JsonSchema(&schema))
            .map_err(|e| {
                ValidationError::invalid(
                    "tools",
                    format!(
                        "function {:?}: its parameters schema cannot be used: {e}",
                        function.name
                    ),
                )
            })?;
    }
    let grammar = tool_call_grammar(&model.tool_syntax, &functions, mode, tools.parallel)
        .map_err(|e| ValidationError::invalid("tools", e.to_string()))?;
    compiler
        .check(ConstraintSpec::Lark(&grammar))
        .map_err(|e| ValidationError::invalid("tools", format!("the call grammar: {e}")))?;
    req.constraint = Some(Constraint {
        kind: Some(Kind::Lark(grammar)),
    });
    Ok(req)
}

#[cfg(test)]
mod tests {
    use inference_proto::public::ToolCall as WireCall;
    use serde_json::json;

    use super::*;

    fn weather() -> Tool {
        Tool {
            name: "get_weather".into(),
            description: "Weather in a city.".into(),
            parameters: r#"{"type": "object", "properties": {"city": {"type": "string"}}}"#.into(),
        }
    }

    fn mode(mode: ToolChoiceMode) -> Option<WireToolChoice> {
        Some(WireToolChoice {
            kind: Some(tool_choice::Kind::Mode(mode as i32)),
        })
    }

    fn named(name: &str) -> Option<WireToolChoice> {
        Some(WireToolChoice {
            kind: Some(tool_choice::Kind::Function(name.into())),
        })
    }

    /// The refusal's field and message.
    fn refused(tools: Vec<Tool>, choice: Option<WireToolChoice>) -> (&'static str, String) {
        let e = grpc_tool_request(tools, choice, None).unwrap_err();
        (e.field(), e.to_string())
    }

    #[test]
    fn grpc_tools_convert_with_their_choice() {
        let t = grpc_tool_request(vec![weather()], None, None)
            .unwrap()
            .unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        assert!(t.parallel);
        assert_eq!(
            t.functions[0].parameters["properties"]["city"]["type"],
            "string"
        );
        assert_eq!(
            t.functions[0].description.as_deref(),
            Some("Weather in a city.")
        );
        let bare = Tool {
            name: "now".into(),
            ..Default::default()
        };
        let t = grpc_tool_request(vec![bare], mode(ToolChoiceMode::Required), Some(false))
            .unwrap()
            .unwrap();
        assert_eq!(
            t.functions[0].parameters,
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        );
        assert_eq!(t.functions[0].description, None);
        assert_eq!((t.choice, t.parallel), (ToolChoice::Required, false));
        let t = grpc_tool_request(vec![weather()], named("get_weather"), None)
            .unwrap()
            .unwrap();
        assert_eq!(t.choice, ToolChoice::Function("get_weather".into()));
        let t = grpc_tool_request(vec![weather()], mode(ToolChoiceMode::None), None)
            .unwrap()
            .unwrap();
        assert!(!t.parses_calls());
        assert_eq!(
            grpc_tool_request(vec![], mode(ToolChoiceMode::None), None).unwrap(),
            None
        );
        assert_eq!(grpc_tool_request(vec![], None, None).unwrap(), None);
    }

    #[test]
    fn bad_grpc_tools_are_refused_naming_the_field() {
        let (field, message) = refused(vec![weather(), weather()], None);
        assert_eq!(field, "tools");
        assert!(message.contains("given twice"), "{message}");
        let mut bad = weather();
        bad.name = "bad name".into();
        let (field, message) = refused(vec![bad], None);
        assert_eq!(field, "tools");
        assert!(message.contains("\"bad name\""), "{message}");
        let mut bad = weather();
        bad.parameters = "{not json".into();
        let (field, message) = refused(vec![bad], None);
        assert_eq!(field, "tools");
        assert!(
            message.contains("get_weather") && message.contains("not JSON"),
            "{message}"
        );
        let mut bad = weather();
        bad.parameters = r#"{"type": "string"}"#.into();
        let (_, message) = refused(vec![bad], None);
        assert!(message.contains("object schema"), "{message}");
        let (field, message) = refused(vec![weather()], named("nope"));
        assert_eq!(field, "tool_choice");
        assert!(message.contains("\"nope\""), "{message}");
        let (field, message) = refused(vec![], mode(ToolChoiceMode::Required));
        assert_eq!(field, "tool_choice");
        assert!(message.contains("at least one function"), "{message}");
        let (field, message) = refused(
            vec![weather()],
            Some(WireToolChoice {
                kind: Some(tool_choice::Kind::Mode(9)),
            }),
        );
        assert_eq!(field, "tool_choice");
        assert!(message.contains("9"), "{message}");
    }

    #[test]
    fn grpc_messages_carry_calls_and_results_checked() {
        let call = WireCall {
            id: "c1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city": "Oslo"}"#.into(),
        };
        let assistant = WireMessage {
            role: "assistant".into(),
            tool_calls: vec![call.clone()],
            ..Default::default()
        };
        let result = WireMessage {
            role: "tool".into(),
            content: "12 C".into(),
            tool_call_id: Some("c1".into()),
            ..Default::default()
        };
        let out = grpc_messages(vec![assistant.clone(), result.clone()]).unwrap();
        assert_eq!(out[0].tool_calls[0].arguments, r#"{"city": "Oslo"}"#);
        assert_eq!(out[1].tool_call_id.as_deref(), Some("c1"));
        let orphan = WireMessage {
            tool_call_id: Some("c9".into()),
            ..result.clone()
        };
        let e = grpc_messages(vec![assistant.clone(), orphan]).unwrap_err();
        assert_eq!(e.field(), "messages");
        assert!(e.to_string().contains("\"c9\""), "{e}");
        let no_id = WireMessage {
            tool_call_id: None,
            ..result
        };
        let e = grpc_messages(vec![assistant, no_id]).unwrap_err();
        assert!(e.to_string().contains("needs tool_call_id"), "{e}");
        let broken = WireMessage {
            role: "assistant".into(),
            tool_calls: vec![WireCall {
                arguments: "{oops".into(),
                ..call.clone()
            }],
            ..Default::default()
        };
        let e = grpc_messages(vec![broken]).unwrap_err();
        assert!(e.to_string().contains("messages[0].tool_calls[0]"), "{e}");
        // An empty id, and an id given twice in the conversation.
        let empty_id = WireMessage {
            role: "assistant".into(),
            tool_calls: vec![WireCall {
                id: String::new(),
                ..call.clone()
            }],
            ..Default::default()
        };
        let e = grpc_messages(vec![empty_id]).unwrap_err();
        assert!(e.to_string().contains("id is empty"), "{e}");
        let twice = WireMessage {
            role: "assistant".into(),
            tool_calls: vec![call.clone(), call],
            ..Default::default()
        };
        let e = grpc_messages(vec![twice]).unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
    }

    #[test]
    fn grpc_tools_need_messages() {
        let req = inference_proto::public::GenerateRequest {
            prompt: "hi".into(),
            tools: vec![weather()],
            ..Default::default()
        };
        let e = GenerationRequest::try_from(req).unwrap_err();
        assert_eq!(e.field(), "tools");
        let req = inference_proto::public::GenerateRequest {
            messages: vec![WireMessage {
                role: "user".into(),
                content: "weather?".into(),
                ..Default::default()
            }],
            tools: vec![weather()],
            tool_choice: mode(ToolChoiceMode::Required),
            ..Default::default()
        };
        let req = GenerationRequest::try_from(req).unwrap();
        assert_eq!(req.tools.unwrap().choice, ToolChoice::Required);
    }
}
