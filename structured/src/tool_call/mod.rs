//! Tool calling: how each model family writes a function call ([`ToolSyntax`], one table), the
//! llguidance grammar that keeps sampled calls inside that syntax and each function's argument
//! schema ([`tool_call_grammar`]), and reading the calls back out of the generated text, whole or
//! while it streams ([`parse_tool_calls`], [`StreamingCalls`]).
//!
//! The grammar fixes every byte around the arguments (`{"name": "NAME", "arguments": ARGS}` and
//! the family's wrapper), so the parser is exact: what a constrained generation returns always
//! parses, and `ARGS` always validates against the function's schema.

mod grammar;
mod parse;
mod syntax;

pub use grammar::{
    tool_call_grammar, valid_function_name, CallMode, FunctionSchema, ToolGrammarError,
};
pub use parse::{parse_tool_calls, CallDelta, ParsedCall, ParsedOutput, StreamingCalls};
pub use syntax::{ToolFamily, ToolSyntax};

#[cfg(test)]
mod tests;
