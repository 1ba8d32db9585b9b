//! A model's vocabulary as the byte strings llguidance works on.
//!
//! llguidance matches grammars against the *bytes* each token adds to the text, so every GGUF token
//! string is turned back into its bytes:
//!
//! - **Byte-level BPE** (`tokenizer.ggml.model = "gpt2"`, e.g. SmolLM2): token strings are written
//!   in GPT-2's byte-to-unicode alphabet (Radford et al. 2019, `bytes_to_unicode` in OpenAI's
//!   `encoder.py`): the printable bytes `!`..`~`, `¡`..`¬`, `®`..`ÿ` stand for themselves and the
//!   other 68 bytes for U+0100.. in byte order (`Ġ` = space; [`tokenizer::byte_level`]). Each
//!   character maps back to one byte.
//!   User-defined tokens are stored as plain text (as llama.cpp reads them).
//! - **SentencePiece** (`"llama"`, e.g. Gemma 3): `▁` (U+2581) is a space, byte tokens (type 6)
//!   are `<0xNN>` (byte fallback), everything else is its UTF-8 text.
//!
//! Control and unknown tokens (types 3 and 2: `<|im_end|>`, `<eos>`, ...) are *special*: llguidance
//! sees them as `0xFF` followed by their text, so no grammar over text can produce them (the EOS
//! tokens are allowed by llguidance itself when the grammar is complete). Unused tokens (type 5) and
//! ids past the tokenizer's list (a model whose output layer is wider) are empty: never allowed.

use llguidance::toktrie::TokTrie;
use tokenizer::byte_level::unicode_to_byte;

use crate::error::VocabError;

/// GGUF token types (`tokenizer.ggml.token_type`).
const TYPE_UNKNOWN: i32 = 2;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;
const TYPE_UNUSED: i32 = 5;
const TYPE_BYTE: i32 = 6;

/// How the vocabulary's token strings encode bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabKind {
    /// GGUF `"gpt2"`: GPT-2's byte-to-unicode alphabet.
    ByteLevelBpe,
    /// GGUF `"llama"`: SentencePiece pieces with `▁` for space and `<0xNN>` byte fallback.
    SentencePiece,
}

impl VocabKind {
    /// The kind of GGUF tokenizer model `model` (`tokenizer.ggml.model`).
    ///
    /// Errors: [`VocabError::UnsupportedTokenizer`] for anything but `"gpt2"` and `"llama"`.
    pub fn from_gguf_model(model: &str) -> Result<Self, VocabError> {
        match model {
            "gpt2" => Ok(Self::ByteLevelBpe),
            "llama" => Ok(Self::SentencePiece),
            other => Err(VocabError::UnsupportedTokenizer(other.to_string())),
        }
    }
}

/// The bytes of every token id in `0..vocab_size` as llguidance expects them (see the module doc):
/// `tokens[i]` with GGUF type `token_types[i]` (type 1, normal, when `token_types` is shorter).
///
/// Errors: [`VocabError::BadByteToken`] for a SentencePiece byte token not of the form `<0xNN>`.
pub fn token_bytes(
    kind: VocabKind,
    tokens: &[String],
    token_types: &[i32],
    vocab_size: usize,
) -> Result<Vec<Vec<u8>>, VocabError> {
    let mut out = Vec::with_capacity(vocab_size.max(tokens.len()));
    for (id, token) in tokens.iter().enumerate() {
        let kind_of = token_types.get(id).copied().unwrap_or(1);
        let bytes = match kind_of {
            TYPE_UNUSED => Vec::new(),
            TYPE_CONTROL | TYPE_UNKNOWN => special(token),
            TYPE_USER_DEFINED => plain(kind, token),
            TYPE_BYTE if kind == VocabKind::SentencePiece => {
                vec![
                    parse_byte_token(token).ok_or_else(|| VocabError::BadByteToken {
                        id: id as u32,
                        token: token.clone(),
                    })?,
                ]
            }
            _ => match kind {
                VocabKind::ByteLevelBpe => byte_level_decode(token),
                VocabKind::SentencePiece => plain(kind, token),
            },
        };
        out.push(bytes);
    }
    out.resize(vocab_size.max(tokens.len()), Vec::new());
    Ok(out)
}

/// A special token's bytes: llguidance's marker byte, then its text.
fn special(token: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(token.len() + 1);
    bytes.push(TokTrie::SPECIAL_TOKEN_MARKER);
    bytes.extend_from_slice(token.as_bytes());
    bytes
}

/// A token stored as text: its UTF-8 bytes (SentencePiece's `▁` as a space).
fn plain(kind: VocabKind, token: &str) -> Vec<u8> {
    match kind {
        VocabKind::SentencePiece => token.replace('\u{2581}', " ").into_bytes(),
        VocabKind::ByteLevelBpe => token.as_bytes().to_vec(),
    }
}

/// `<0xNN>` (two hex digits) as its byte.
fn parse_byte_token(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// A byte-level token string back to its bytes. A character outside the alphabet (not produced by
/// GPT-2-style converters) keeps its UTF-8 bytes.
fn byte_level_decode(token: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(token.len());
    for c in token.chars() {
        match unicode_to_byte(c) {
            Some(b) => bytes.push(b),
            None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes back to a byte-level token string (the inverse of `byte_level_decode`).
    fn byte_level_encode(bytes: &[u8]) -> String {
        let table = tokenizer::byte_level::byte_to_unicode();
        bytes.iter().map(|&b| table[b as usize]).collect()
    }

    /// The tiny test model's vocabulary (3 control tokens, the 256 byte symbols, merges): every
    /// token round-trips, and the byte symbols are the 256 single bytes.
    #[test]
    fn tiny_model_vocabulary_round_trips() {
        let dir = std::env::temp_dir().join(format!("structured-vocab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny.gguf");
        gguf::testing::write_tiny_llama(&path, 1).unwrap();
        let file = gguf::GgufFile::open(&path).unwrap();
        let meta = gguf::TokenizerMetadata::from_gguf(&file).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let bytes = token_bytes(
            VocabKind::ByteLevelBpe,
            &meta.tokens,
            &meta.token_types,
            meta.tokens.len(),
        )
        .unwrap();
        for (b, token) in bytes.iter().zip(&meta.tokens).take(3) {
            assert_eq!(b[0], TokTrie::SPECIAL_TOKEN_MARKER);
            assert_eq!(&b[1..], token.as_bytes());
        }
        let mut singles: Vec<u8> = bytes[3..259].iter().map(|b| b[0]).collect();
        assert!(bytes[3..259].iter().all(|b| b.len() == 1));
        singles.sort_unstable();
        assert_eq!(singles, (0..=255u8).collect::<Vec<_>>());
        for (id, (b, token)) in bytes.iter().zip(&meta.tokens).enumerate().skip(3) {
            assert_eq!(&byte_level_encode(b), token, "token {id}");
        }
    }

    #[test]
    fn byte_level_tokens_and_specials() {
        let tokens: Vec<String> = ["<|im_end|>", "Ġworld", "Ċ", "Ã©", "<unused>", "hi"]
            .map(String::from)
            .to_vec();
        let types = [3, 1, 1, 1, 5, 4];
        let bytes = token_bytes(VocabKind::ByteLevelBpe, &tokens, &types, 8).unwrap();
        assert_eq!(bytes[0], b"\xff<|im_end|>");
        assert_eq!(bytes[1], b" world");
        assert_eq!(bytes[2], b"\n");
        assert_eq!(bytes[3], "é".as_bytes());
        assert!(bytes[4].is_empty());
        assert_eq!(bytes[5], b"hi");
        // Ids past the token list (a wider output layer) are never allowed.
        assert_eq!(bytes.len(), 8);
        assert!(bytes[6].is_empty() && bytes[7].is_empty());
    }

    #[test]
    fn sentencepiece_byte_fallback_and_spaces() {
        let tokens: Vec<String> = ["<eos>", "▁the", "<0x0A>", "<0xE2>", "▁▁", "<unk>"]
            .map(String::from)
            .to_vec();
        let types = [3, 1, 6, 6, 1, 2];
        let bytes = token_bytes(VocabKind::SentencePiece, &tokens, &types, 6).unwrap();
        assert_eq!(bytes[0], b"\xff<eos>");
        assert_eq!(bytes[1], b" the");
        assert_eq!(bytes[2], b"\n");
        assert_eq!(bytes[3], [0xE2]);
        assert_eq!(bytes[4], b"  ");
        assert_eq!(bytes[5], b"\xff<unk>");
        // Round trip: every piece's bytes written back as a piece give the piece.
        for (id, token) in tokens.iter().enumerate() {
            let back = match types[id] {
                6 => format!("<0x{:02X}>", bytes[id][0]),
                3 | 2 => String::from_utf8(bytes[id][1..].to_vec()).unwrap(),
                _ => String::from_utf8(bytes[id].clone())
                    .unwrap()
                    .replace(' ', "\u{2581}"),
            };
            assert_eq!(&back, token);
        }
        let bad = ["<0xZZ>".to_string()];
        assert!(matches!(
            token_bytes(VocabKind::SentencePiece, &bad, &[6], 1),
            Err(VocabError::BadByteToken { id: 0, .. })
        ));
    }

    #[test]
    fn unknown_tokenizer_model_is_refused() {
        assert!(matches!(
            VocabKind::from_gguf_model("bert"),
            Err(VocabError::UnsupportedTokenizer(m)) if m == "bert"
        ));
    }

    /// The real SmolLM2 vocabulary: every normal token's bytes written back in GPT-2's alphabet give
    /// the token string, and the control tokens are special.
    #[test]
    fn smollm2_vocabulary_round_trips() {
        let path = gguf::testing::default_model_path();
        if !path.is_file() {
            eprintln!(
                "skipping: {} is missing (scripts/fetch-model)",
                path.display()
            );
            return;
        }
        let file = gguf::GgufFile::open(&path).unwrap();
        let meta = gguf::TokenizerMetadata::from_gguf(&file).unwrap();
        assert_eq!(meta.model, "gpt2");
        let bytes = token_bytes(
            VocabKind::ByteLevelBpe,
            &meta.tokens,
            &meta.token_types,
            meta.tokens.len(),
        )
        .unwrap();
        let mut normal = 0;
        for (id, token) in meta.tokens.iter().enumerate() {
            match meta.token_types[id] {
                1 => {
                    assert_eq!(&byte_level_encode(&bytes[id]), token, "token {id}");
                    normal += 1;
                }
                3 => assert_eq!(bytes[id][0], TokTrie::SPECIAL_TOKEN_MARKER, "token {id}"),
                _ => {}
            }
        }
        assert!(normal > 49_000, "{normal} normal tokens");
        let im_end = meta.tokens.iter().position(|t| t == "<|im_end|>").unwrap();
        assert_eq!(bytes[im_end], b"\xff<|im_end|>");
        let space_the = meta.tokens.iter().position(|t| t == "Ġthe").unwrap();
        assert_eq!(bytes[space_the], b" the");
    }

    /// The real Gemma 3 vocabulary (SentencePiece): the 256 byte tokens are the 256 bytes, every
    /// normal piece round-trips through `▁` <-> space, and the control tokens are special.
    #[test]
    fn gemma3_vocabulary_round_trips() {
        let path = gguf::testing::gemma3_model_path();
        if !path.is_file() {
            eprintln!("skipping: {} is missing", path.display());
            return;
        }
        let file = gguf::GgufFile::open(&path).unwrap();
        let meta = gguf::TokenizerMetadata::from_gguf(&file).unwrap();
        assert_eq!(meta.model, "llama");
        let n = meta.tokens.len();
        let bytes =
            token_bytes(VocabKind::SentencePiece, &meta.tokens, &meta.token_types, n).unwrap();
        let mut byte_tokens = Vec::new();
        for (id, token) in meta.tokens.iter().enumerate() {
            match meta.token_types[id] {
                1 => assert_eq!(
                    String::from_utf8(bytes[id].clone())
                        .unwrap()
                        .replace(' ', "\u{2581}"),
                    *token,
                    "token {id}"
                ),
                3 => assert_eq!(bytes[id][0], TokTrie::SPECIAL_TOKEN_MARKER, "token {id}"),
                6 => {
                    assert_eq!(format!("<0x{:02X}>", bytes[id][0]), *token);
                    byte_tokens.push(bytes[id][0]);
                }
                _ => {}
            }
        }
        byte_tokens.sort_unstable();
        assert_eq!(byte_tokens, (0..=255u8).collect::<Vec<_>>());
        let eot = meta
            .tokens
            .iter()
            .position(|t| t == "<end_of_turn>")
            .unwrap();
        assert_eq!(bytes[eot], b"\xff<end_of_turn>");
    }
}
