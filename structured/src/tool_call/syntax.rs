//! The table of tool-call syntaxes, one row per model family.
//!
//! Every row writes a call as `call_prefix {"name": "NAME", "ARGUMENTS_KEY": ARGS} call_suffix`;
//! several calls (`parallel_tool_calls`) are joined by `separator` and the whole run is wrapped in
//! `section_prefix` ... `section_suffix`. `trigger` starts every run of calls: under
//! `tool_choice: "auto"` the model writes free text until it writes the trigger, then the calls.
//!
//! | family | a run of two calls | source |
//! |---|---|---|
//! | `hermes` (Hermes 2 Pro, Qwen 2.5, Qwen 3, and the built-in default) | `<tool_call>\n{"name": "f", "arguments": {..}}\n</tool_call>\n<tool_call>\n...\n</tool_call>` | NousResearch Hermes-2-Pro and Qwen2.5 `tokenizer_config.json` templates |
//! | `llama3_json` (Llama 3.1, 3.2, 3.3) | `{"name": "f", "parameters": {..}}\n{"name": "g", ...}` | Meta's Llama 3.1 JSON tool-calling format (one call per turn in Meta's docs; the newline join is ours) |
//! | `mistral` (Mistral v3 tokenizers) | `[TOOL_CALLS][{"name": "f", "arguments": {..}}, {...}]` | Mistral's `mistral-common` format |

/// A model family's tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFamily {
    /// `<tool_call>` ... `</tool_call>` (Hermes, Qwen 2.5 / 3, and the built-in default).
    Hermes,
    /// Bare JSON objects with `parameters` (Llama 3.1+).
    Llama3Json,
    /// `[TOOL_CALLS][...]` (Mistral).
    Mistral,
}

/// How one family writes a run of tool calls (see the module docs for the shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSyntax {
    /// The family.
    pub family: ToolFamily,
    /// The name used in logs and documents (`"hermes"`, `"llama3_json"`, `"mistral"`).
    pub name: &'static str,
    /// The text that starts a run of calls (a prefix of `section_prefix + call_prefix +
    /// {"name": "`).
    pub trigger: &'static str,
    /// Before the first call.
    pub section_prefix: &'static str,
    /// Before each call's JSON object.
    pub call_prefix: &'static str,
    /// The key of the arguments object (`"arguments"` or `"parameters"`).
    pub arguments_key: &'static str,
    /// After each call's JSON object.
    pub call_suffix: &'static str,
    /// Between calls.
    pub separator: &'static str,
    /// After the last call.
    pub section_suffix: &'static str,
}

/// Hermes-style calls, the built-in default.
pub const HERMES: ToolSyntax = ToolSyntax {
    family: ToolFamily::Hermes,
    name: "hermes",
    trigger: "<tool_call>",
    section_prefix: "",
    call_prefix: "<tool_call>\n",
    arguments_key: "arguments",
    call_suffix: "\n</tool_call>",
    separator: "\n",
    section_suffix: "",
};

/// Llama 3.1+ JSON calls.
pub const LLAMA3_JSON: ToolSyntax = ToolSyntax {
    family: ToolFamily::Llama3Json,
    name: "llama3_json",
    trigger: "{\"name\": \"",
    section_prefix: "",
    call_prefix: "",
    arguments_key: "parameters",
    call_suffix: "",
    separator: "\n",
    section_suffix: "",
};

/// Mistral calls.
pub const MISTRAL: ToolSyntax = ToolSyntax {
    family: ToolFamily::Mistral,
    name: "mistral",
    trigger: "[TOOL_CALLS]",
    section_prefix: "[TOOL_CALLS][",
    call_prefix: "",
    arguments_key: "arguments",
    call_suffix: "",
    separator: ", ",
    section_suffix: "]",
};

impl ToolSyntax {
    /// Every row of the table.
    pub const ALL: [ToolSyntax; 3] = [HERMES, LLAMA3_JSON, MISTRAL];

    /// The built-in default (Hermes), for models whose chat template has no tool support.
    pub const fn builtin() -> Self {
        HERMES
    }

    /// The syntax a chat template's own tool support writes, recognised by the markers in its
    /// source: `<tool_call>` (Hermes, Qwen), `[TOOL_CALLS]` (Mistral), `<|python_tag|>` (Llama 3.1+).
    /// `None` for a template without tool support (or with a syntax not in the table); such a
    /// model gets the built-in format.
    pub fn of_template(source: &str) -> Option<Self> {
        if !source.contains("tools") {
            return None;
        }
        if source.contains("<tool_call>") {
            Some(HERMES)
        } else if source.contains("[TOOL_CALLS]") {
            Some(MISTRAL)
        } else if source.contains("<|python_tag|>") {
            Some(LLAMA3_JSON)
        } else {
            None
        }
    }

    /// The text of one call's JSON object up to its name: `{"name": "`.
    pub const NAME_OPEN: &'static str = "{\"name\": \"";

    /// The text between the name and the arguments: `", "arguments": `.
    pub fn name_close(&self) -> String {
        format!("\", \"{}\": ", self.arguments_key)
    }

    /// The text of a whole run of `calls` (`(name, arguments JSON)` pairs), as a model writes it
    /// (how the built-in format renders earlier assistant turns).
    pub fn write(&self, calls: &[(&str, &str)]) -> String {
        let mut out = String::from(self.section_prefix);
        for (i, (name, arguments)) in calls.iter().enumerate() {
            if i > 0 {
                out.push_str(self.separator);
            }
            out.push_str(self.call_prefix);
            out.push_str(Self::NAME_OPEN);
            out.push_str(name);
            out.push_str(&self.name_close());
            out.push_str(arguments);
            out.push('}');
            out.push_str(self.call_suffix);
        }
        out.push_str(self.section_suffix);
        out
    }
}
