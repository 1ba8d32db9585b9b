//! The marked rendering of `ChatTemplate::render_pieces` (each message's content between
//! [`CONTENT_OPEN`] and [`CONTENT_CLOSE`]) cut into template text and message content
//! ([`TemplatePiece`]s).

/// Opens a message's content in the marked rendering (a Unicode noncharacter).
pub(super) const CONTENT_OPEN: char = '\u{FDD0}';
/// Closes a message's content in the marked rendering.
pub(super) const CONTENT_CLOSE: char = '\u{FDD1}';

use tokenizer::TemplatePiece;

/// The template cut, nested or repeated a message's marked content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the chat template cut or repeated a message's content, so it cannot be kept apart from the \
     template's own text"
)]
pub(super) struct Unbalanced;

/// Splits a rendering with marked content into pieces (empty pieces are left out, and the markup
/// around an empty content is one piece).
///
/// Errors: [`Unbalanced`] when the marks do not pair up.
pub(super) fn split_marked(text: &str) -> Result<Vec<TemplatePiece>, Unbalanced> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find([CONTENT_OPEN, CONTENT_CLOSE]) {
        if rest[open..].starts_with(CONTENT_CLOSE) {
            return Err(Unbalanced);
        }
        push_markup(&mut pieces, &rest[..open]);
        let inner = &rest[open + CONTENT_OPEN.len_utf8()..];
        let close = inner
            .find([CONTENT_OPEN, CONTENT_CLOSE])
            .ok_or(Unbalanced)?;
        if inner[close..].starts_with(CONTENT_OPEN) {
            return Err(Unbalanced);
        }
        if close > 0 {
            pieces.push(TemplatePiece::Content(inner[..close].to_string()));
        }
        rest = &inner[close + CONTENT_CLOSE.len_utf8()..];
    }
    push_markup(&mut pieces, rest);
    Ok(pieces)
}

/// Appends template text to `pieces`, joining it to a markup piece just before it.
fn push_markup(pieces: &mut Vec<TemplatePiece>, text: &str) {
    if text.is_empty() {
        return;
    }
    match pieces.last_mut() {
        Some(TemplatePiece::Markup(last)) => last.push_str(text),
        _ => pieces.push(TemplatePiece::Markup(text.to_string())),
    }
}
