//! The llguidance grammar (Lark dialect) of a tool-calling request: the family's call syntax
//! around each offered function's argument schema (`%json`), for `tool_choice` `required` or a
//! named function (calls only), or `auto` (free text, then calls once the family's trigger is
//! written; a lazy lexeme ends the text at the trigger's first occurrence).

use serde_json::Value;

use super::syntax::ToolSyntax;

/// One function the model may call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FunctionSchema<'a> {
    /// Its name (`[A-Za-z0-9_-]{1,64}`, checked by the caller).
    pub name: &'a str,
    /// The JSON Schema of its arguments (an object schema).
    pub parameters: &'a Value,
}

/// What the generated text may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallMode {
    /// Calls only (`tool_choice` `required`, or a named function offered alone).
    Required,
    /// Free text, or free text followed by calls (`tool_choice` `auto`).
    Auto,
}

/// Why no grammar can be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolGrammarError {
    /// No function offered.
    #[error("no function to call")]
    NoFunctions,
    /// A name that cannot be written literally into the grammar.
    #[error("function name {0:?} must be 1 to 64 of a-z, A-Z, 0-9, _ and -")]
    BadName(String),
}

/// Whether `name` is a valid function name (OpenAI's rule: 1 to 64 of `a-zA-Z0-9_-`).
pub fn valid_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A Lark string literal of `text`.
fn literal(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// A Lark regex `/.../` body matching `text` literally.
fn regex_literal(text: &str) -> String {
    regex_syntax::escape(text).replace('/', "\\/")
}

/// The argument schema as `%json` gets it: compact JSON unless the schema sets llguidance's own
/// whitespace options (as the structured-output `json_schema` constraint).
fn compact_schema(parameters: &Value) -> Value {
    let mut schema = parameters.clone();
    if let Some(object) = schema.as_object_mut() {
        object
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({ "whitespace_flexible": false }));
    }
    schema
}

/// The grammar (llguidance Lark, from rule `start`) of calls to `functions` in `syntax`: in
/// `mode`, one call or, with `parallel`, one or more.
///
/// Errors: [`ToolGrammarError`] for an empty list or a bad name. A schema llguidance cannot
/// compile is found when the grammar is compiled (check each schema alone first to name it).
pub fn tool_call_grammar(
    syntax: &ToolSyntax,
    functions: &[FunctionSchema<'_>],
    mode: CallMode,
    parallel: bool,
) -> Result<String, ToolGrammarError> {
    if functions.is_empty() {
        return Err(ToolGrammarError::NoFunctions);
    }
    let mut rules = Vec::new();
    let mut alternatives = Vec::new();
    for (i, function) in functions.iter().enumerate() {
        if !valid_function_name(function.name) {
            return Err(ToolGrammarError::BadName(function.name.to_string()));
        }
        alternatives.push(format!("fn{i}"));
        rules.push(format!(
            "fn{i}: {} args{i}",
            literal(&format!("{}{}", function.name, syntax.name_close()))
        ));
        rules.push(format!(
            "args{i}: %json {}",
            compact_schema(function.parameters)
        ));
    }
    rules.push(format!("fns: {}", alternatives.join(" | ")));
    let call_end = literal(&format!("}}{}", syntax.call_suffix));
    rules.push(format!(
        "call: {} fns {call_end}",
        literal(&format!("{}{}", syntax.call_prefix, ToolSyntax::NAME_OPEN))
    ));
    let more = if parallel {
        format!("({} call)*", literal(syntax.separator))
    } else {
        String::new()
    };
    let suffix = if syntax.section_suffix.is_empty() {
        String::new()
    } else {
        literal(syntax.section_suffix)
    };
    let start = match mode {
        CallMode::Required => {
            let prefix = if syntax.section_prefix.is_empty() {
                String::new()
            } else {
                literal(syntax.section_prefix)
            };
            format!("start: {prefix} call {more} {suffix}")
        }
        CallMode::Auto => {
            let first = format!(
                "{}{}{}",
                syntax.section_prefix,
                syntax.call_prefix,
                ToolSyntax::NAME_OPEN
            );
            let tail = first.strip_prefix(syntax.trigger).unwrap_or_else(|| {
                unreachable!(
                    "the table's trigger starts the first call ({})",
                    syntax.name
                )
            });
            let trigger = regex_literal(syntax.trigger);
            rules.push(format!("lead[lazy]: /(.|\\n)*{trigger}/"));
            rules.push(format!("TEXT: /(.|\\n)*/ & ~/(.|\\n)*{trigger}(.|\\n)*/"));
            let tail = if tail.is_empty() {
                String::new()
            } else {
                literal(tail)
            };
            rules.push(format!("first: {tail} fns {call_end}"));
            format!("start: TEXT | lead first {more} {suffix}")
        }
    };
    rules.insert(0, start);
    Ok(rules.join("\n") + "\n")
}
