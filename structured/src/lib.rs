//! Structured output: the generated text is kept inside a language (a JSON Schema, any JSON object,
//! a regular expression, a Lark grammar, or one of a list of strings) by masking, at every position,
//! the tokens that would leave it. Built on llguidance (Microsoft's guidance project, MIT), over the
//! model's own vocabulary bytes.
//!
//! - [`vocab`]: GGUF token strings back to the bytes they stand for.
//! - [`ConstraintSpec`]: a request's constraint, by kind (the router and the worker convert the
//!   proto's `Constraint` into it).
//! - [`ConstraintCompiler`]: one per model; checks and compiles a request's [`ConstraintSpec`]
//!   (the router to refuse a bad one with `INVALID_ARGUMENT`, the worker to follow it).
//! - [`tool_call`]: tool calling: each model family's call syntax, the grammar of a request's
//!   calls (compiled as a `lark` constraint) and reading the calls back out of the text.
//! - [`ConstraintState`]: one per constrained sequence; the [`TokenMask`] of allowed tokens for the
//!   next position, the tokens the constraint forces next (free speculative proposals), and
//!   advancing by the chosen token.

mod compiler;
mod error;
mod spec;
mod state;
pub mod testing;
pub mod tool_call;
pub mod vocab;

pub use compiler::{ConstraintCompiler, VocabSource};
pub use error::{ConstraintError, MatchError, VocabError};
pub use spec::ConstraintSpec;
pub use state::{ConstraintState, Progress, TokenMask};
#[cfg(test)]
mod forced_tests;
#[cfg(test)]
mod tests;
