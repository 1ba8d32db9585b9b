//! The marked rendering of [`super::ChatTemplate::render_pieces`] cut into template text and message
//! content.

use super::{ChatTemplateError, TemplatePiece, CONTENT_CLOSE, CONTENT_OPEN};

/// Splits a rendering with marked content into pieces (empty pieces are left out, and the markup
/// around an empty content is one piece).
pub(super) fn split_marked(text: &str) -> Result<Vec<TemplatePiece>, ChatTemplateError> {
    let unbalanced = || {
        ChatTemplateError::Content(
            "the chat template cut or repeated a message's content, so it cannot be kept apart \
             from the template's own text"
                .into(),
        )
    };
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find([CONTENT_OPEN, CONTENT_CLOSE]) {
        if rest[open..].starts_with(CONTENT_CLOSE) {
            return Err(unbalanced());
        }
        push_markup(&mut pieces, &rest[..open]);
        let inner = &rest[open + CONTENT_OPEN.len_utf8()..];
        let close = inner
            .find([CONTENT_OPEN, CONTENT_CLOSE])
            .ok_or_else(unbalanced)?;
        if inner[close..].starts_with(CONTENT_OPEN) {
            return Err(unbalanced());
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
