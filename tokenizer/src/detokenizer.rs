//! Streaming detokenization: [`IncrementalDetokenizer`] turns generated token
//! ids, one at a time, into text deltas whose concatenation equals
//! [`TextTokenizer::decode`] of all the ids, without ever emitting a broken
//! UTF-8 character.
//!
//! Two strategies, chosen by the tokenizer:
//!
//! - **Bytes** (byte-level BPE, every GGUF `"gpt2"` tokenizer): decoding is
//!   the UTF-8-lossy conversion of the concatenated token bytes, so the
//!   detokenizer appends each token's bytes to a small pending buffer and
//!   emits every complete character, holding only an incomplete trailing
//!   sequence (at most 3 bytes). Invalid sequences become U+FFFD exactly as
//!   `String::from_utf8_lossy` would do on the whole stream, because both use
//!   the same left-to-right "maximal subpart" rule (`Utf8Error::error_len`).
//!   Cost per token: O(token bytes).
//! - **Window** (any other decoder, e.g. SentencePiece-style `Metaspace`
//!   from a `tokenizer.json`): the prefix/read-offset scheme of Hugging Face
//!   text-generation-inference (`server/text_generation_server/models/model.py`,
//!   `decode_token`). The text of `ids[prefix_offset..]` minus that of
//!   `ids[prefix_offset..read_offset]` is emitted once it grows and does not
//!   end in U+FFFD; the tokens of the previous emission are kept as left
//!   context so decoders that strip a leading space see the same context as
//!   a full decode. Cost per token: O(window), the window being the tokens of
//!   the previous emission plus those held since (it only grows while the
//!   text keeps ending in an incomplete character).
//!
//! Skipped special tokens are dropped before either strategy sees them, which
//! matches `decode(ids, skip_special = true)` (it filters them out before the
//! decoder runs).

use std::sync::Arc;

use crate::text_tokenizer::TextTokenizer;

const REPLACEMENT: char = '\u{FFFD}';

/// Converts a stream of token ids into text deltas (one per
/// [`push`](Self::push)), for one generated sequence.
#[derive(Debug)]
pub struct IncrementalDetokenizer {
    tokenizer: Arc<TextTokenizer>,
    skip_special_tokens: bool,
    state: State,
}

#[derive(Debug)]
enum State {
    /// Bytes of an incomplete trailing UTF-8 character.
    Bytes { pending: Vec<u8> },
    Window {
        /// Ids from `prefix_offset` on (older ids are dropped).
        ids: Vec<u32>,
        /// Index in `ids` of the first token not yet emitted.
        read_offset: usize,
        /// Decoded text of `ids[..read_offset]`.
        prefix_text: String,
    },
}

impl IncrementalDetokenizer {
    /// A detokenizer for one sequence. `skip_special_tokens` leaves special
    /// tokens (`<|im_end|>` …) out of the text.
    pub fn new(tokenizer: Arc<TextTokenizer>, skip_special_tokens: bool) -> Self {
        let state = if tokenizer.is_byte_level() {
            State::Bytes {
                pending: Vec::new(),
            }
        } else {
            Self::window()
        };
        Self {
            tokenizer,
            skip_special_tokens,
            state,
        }
    }

    /// Like [`new`](Self::new) but always uses the window (prefix/read-offset)
    /// strategy, even for a byte-level tokenizer; exposed so both strategies
    /// can be compared on the same vocabulary.
    pub fn new_windowed(tokenizer: Arc<TextTokenizer>, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer,
            skip_special_tokens,
            state: Self::window(),
        }
    }

    fn window() -> State {
        State::Window {
            ids: Vec::new(),
            read_offset: 0,
            prefix_text: String::new(),
        }
    }

    /// Adds the next generated token and returns the newly completed text
    /// (possibly empty while a multi-byte character is incomplete).
    pub fn push(&mut self, token_id: u32) -> String {
        if self.skip_special_tokens && self.tokenizer.is_special(token_id) {
            return String::new();
        }
        match &mut self.state {
            State::Bytes { pending } => {
                pending.extend_from_slice(self.tokenizer.token_bytes(token_id).unwrap_or_default());
                drain_complete_utf8(pending)
            }
            State::Window {
                ids,
                read_offset,
                prefix_text,
            } => {
                ids.push(token_id);
                let text = self.tokenizer.decode(ids, self.skip_special_tokens);
                if text.len() <= prefix_text.len() || text.ends_with(REPLACEMENT) {
                    return String::new();
                }
                let delta = suffix_after(&text, prefix_text).to_string();
                // The tokens just emitted become the left context.
                ids.drain(..*read_offset);
                *read_offset = ids.len();
                *prefix_text = self.tokenizer.decode(ids, self.skip_special_tokens);
                delta
            }
        }
    }

    /// Releases whatever is held (an incomplete character becomes U+FFFD);
    /// call once when the sequence ends. Further pushes start clean.
    pub fn finish(&mut self) -> String {
        match &mut self.state {
            State::Bytes { pending } => {
                let out = String::from_utf8_lossy(pending).into_owned();
                pending.clear();
                out
            }
            State::Window {
                ids,
                read_offset,
                prefix_text,
            } => {
                let out = if ids.len() > *read_offset {
                    let text = self.tokenizer.decode(ids, self.skip_special_tokens);
                    suffix_after(&text, prefix_text).to_string()
                } else {
                    String::new()
                };
                ids.clear();
                *read_offset = 0;
                prefix_text.clear();
                out
            }
        }
    }
}

/// Removes and returns the longest decodable head of `pending`: valid UTF-8
/// as is, each invalid sequence as one U+FFFD; an incomplete sequence at the
/// very end stays in `pending`.
fn drain_complete_utf8(pending: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut start = 0;
    while start < pending.len() {
        match std::str::from_utf8(&pending[start..]) {
            Ok(s) => {
                out.push_str(s);
                start = pending.len();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(
                    std::str::from_utf8(&pending[start..start + valid])
                        .expect("valid_up_to is valid UTF-8"),
                );
                match e.error_len() {
                    Some(len) => {
                        out.push(REPLACEMENT);
                        start += valid + len;
                    }
                    None => {
                        start += valid;
                        break;
                    }
                }
            }
        }
    }
    pending.drain(..start);
    out
}

/// `text` after `prefix`. When the decoder did not reproduce `prefix` as a
/// prefix of the longer decode (not the case for the supported decoders), it
/// is the part after their longest common prefix, cut at a char boundary.
fn suffix_after<'a>(text: &'a str, prefix: &str) -> &'a str {
    if let Some(rest) = text.strip_prefix(prefix) {
        return rest;
    }
    let common = text
        .char_indices()
        .zip(prefix.chars())
        .find(|((_, a), b)| a != b)
        .map_or_else(|| text.len().min(prefix.len()), |((i, _), _)| i);
    &text[common..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_complete_characters_only() {
        let mut p = "a😀".as_bytes()[..3].to_vec();
        assert_eq!(drain_complete_utf8(&mut p), "a");
        assert_eq!(p, vec![0xF0, 0x9F]);
        p.extend_from_slice(&[0x98, 0x80, b'b']);
        assert_eq!(drain_complete_utf8(&mut p), "😀b");
        assert!(p.is_empty());
    }

    #[test]
    fn invalid_bytes_become_replacement_like_lossy() {
        let streams: [&[u8]; 4] = [
            &[0xC3, 0xC3, 0xA9],
            &[0x80, b'x', 0xF0, 0x9F, b'y'],
            &[0xE2, 0x82],
            &[0xED, 0xA0, 0x80, b'z'],
        ];
        for bytes in streams {
            let mut pending = Vec::new();
            let mut out = String::new();
            for &b in bytes {
                pending.push(b);
                out += &drain_complete_utf8(&mut pending);
            }
            out += &String::from_utf8_lossy(&pending);
            assert_eq!(out, String::from_utf8_lossy(bytes), "{bytes:?}");
        }
    }

    #[test]
    fn suffix_after_handles_non_prefix() {
        assert_eq!(suffix_after("hello world", "hello"), " world");
        assert_eq!(suffix_after("héllo", "hé!"), "llo");
        assert_eq!(suffix_after("ab", "abc"), "");
    }
}
