//! The bounds of one chat-template rendering, so that a template (from a model file or the
//! `chat_template` setting) and the messages of a request cannot make the router loop or grow a
//! prompt without end: every rendering gets [`RENDER_FUEL`] steps of minijinja's engine and at
//! most [`MAX_RENDERED_BYTES`] of output, and fails with a [`RenderFailure`] naming the limit past
//! either (issue 31; the `chat-template` fuzz target renders fuzzed templates under
//! them). Without them, two nested loops of `range(100000)` are 10^10 steps: minutes of a CPU.
//!
//! Not bounded here: a value the template builds without writing it (a string doubled in a loop is
//! only stopped by minijinja's own caps, such as 100 MB for `"x" * n`).

use std::io;

use minijinja::{ErrorKind, Template};
use serde::Serialize;

use super::helpers::describe;

/// Steps (minijinja "fuel": about one per instruction) one rendering may take: 20,000 turns (1 MB
/// of content, the default `max_request_bytes`) render with every built-in template well within it
/// (tested below).
pub const RENDER_FUEL: u64 = 10_000_000;

/// Most bytes one rendering may write (16 MiB: a prompt of far more tokens than any model's
/// context, and 16 times the default `max_request_bytes`).
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

/// Why one rendering failed (the chat template's `Render` error holds its text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum RenderFailure {
    /// The template took more than [`RENDER_FUEL`] steps.
    #[error("the template took more than {RENDER_FUEL} steps (the chat template's step limit)")]
    OutOfSteps,
    /// The output passed this many bytes.
    #[error("the rendered prompt passes {0} bytes (the chat template's output limit)")]
    TooLong(usize),
    /// The template's own error (it raised, or used a value in an unsupported way).
    #[error("{0}")]
    Template(String),
}

/// The output of one rendering, refusing to grow past `limit` bytes.
struct BoundedOutput {
    text: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.text.len() + buf.len() > self.limit {
            self.overflowed = true;
            return Err(io::Error::other("the rendered prompt is too long"));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Renders `template` with `context` within the bounds (the environment's fuel is set by
/// [`super::ChatTemplate::new`]; the output bound is `max_bytes`).
///
/// Errors: [`RenderFailure`]: the template's own error, or the bound it passed.
pub(super) fn render_bounded<S: Serialize>(
    template: &Template<'_, '_>,
    context: S,
    max_bytes: usize,
) -> Result<String, RenderFailure> {
    let mut out = BoundedOutput {
        text: Vec::new(),
        limit: max_bytes,
        overflowed: false,
    };
    let rendered = template.render_captured_to(context, &mut out).map(drop);
    if out.overflowed {
        return Err(RenderFailure::TooLong(max_bytes));
    }
    rendered.map_err(|e| match e.kind() {
        ErrorKind::OutOfFuel => RenderFailure::OutOfSteps,
        _ => RenderFailure::Template(describe(&e)),
    })?;
    String::from_utf8(out.text).map_err(|e| RenderFailure::Template(e.to_string()))
}
