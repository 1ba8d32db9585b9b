//! A chat request's tools in validation: rendering them into the prompt (the template's own tool
//! support, or the built-in prompt) and turning `tool_choice` into the grammar the worker follows.

use inference_proto::public::{constraint::Kind, Constraint};
use structured_output::tool_call::tool_call_grammar;
use structured_output::ConstraintSpec;

use super::ValidationError;
use crate::chat_template::{
    builtin_tool_messages, ChatMessage, ChatTemplate, ChatTemplateError, TemplatePiece,
};
use crate::model_context::ModelContext;
use crate::request::GenerationRequest;
use crate::tool_request::ToolRequest;

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
            "tools (with tool_choice other than \"none\") cannot be combined with \
             response_format or a guided_* field",
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
