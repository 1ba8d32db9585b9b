//! A request's tool calling, as both fronts pass it to validation: the functions offered, the
//! `tool_choice`, and whether several calls may come in one turn. The HTTP front parses OpenAI's
//! `tools` / `tool_choice` / `parallel_tool_calls` into it (`openai::tools`); validation renders
//! the tools into the prompt and turns the choice into a grammar (`validation::tools`).

use serde::{Deserialize, Serialize};
use structured_output::tool_call::{CallMode, FunctionSchema};

/// One function the model may call (OpenAI's `{"type": "function", "function": {...}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionTool {
    /// Its name (1 to 64 of `a-zA-Z0-9_-`, unique in the request).
    pub name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of its arguments (an object schema; `{"type": "object",
    /// "properties": {}}` when the request gives none).
    pub parameters: serde_json::Value,
    /// OpenAI's `strict`: accepted; arguments are always constrained to the schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
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
