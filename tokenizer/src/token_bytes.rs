//! [`TokenBytes`]: the bytes each token contributes to decoded text, for vocabularies whose decoding
//! is a pure concatenation of per-token bytes (byte-level BPE, and SentencePiece without a space
//! prefix). The text tokenizer's `decode` and the streaming detokenizer read them instead of running
//! the `tokenizers` decoder.

use tokenizers::Tokenizer;

use crate::byte_level::unicode_to_byte;

/// Each token's decoded bytes, flattened: token `i` is `bytes[offsets[i]..offsets[i + 1]]`.
pub(crate) struct TokenBytes {
    offsets: Vec<u32>,
    bytes: Vec<u8>,
    /// Whether id `i` is in the vocabulary (an absent id decodes to nothing).
    present: Vec<bool>,
}

impl TokenBytes {
    /// Maps every vocabulary string of ids `0..vocab_size` through the GPT-2 byte-to-unicode table
    /// in reverse, as the `ByteLevel` decoder does (a string with a character outside the table
    /// contributes its own UTF-8 bytes).
    pub(crate) fn from_byte_level(tok: &Tokenizer, vocab_size: usize) -> Self {
        let mut offsets = Vec::with_capacity(vocab_size + 1);
        let mut bytes = Vec::new();
        let mut present = Vec::with_capacity(vocab_size);
        offsets.push(0);
        for id in 0..vocab_size as u32 {
            let piece = tok.id_to_token(id);
            present.push(piece.is_some());
            if let Some(piece) = piece {
                let mapped: Option<Vec<u8>> = piece.chars().map(unicode_to_byte).collect();
                bytes.extend_from_slice(&mapped.unwrap_or_else(|| piece.as_bytes().to_vec()));
            }
            offsets.push(bytes.len() as u32);
        }
        Self {
            offsets,
            bytes,
            present,
        }
    }

    /// A table from each token's bytes (index = id).
    pub(crate) fn from_tokens(tokens: Vec<Vec<u8>>) -> Self {
        let mut offsets = Vec::with_capacity(tokens.len() + 1);
        let mut bytes = Vec::new();
        offsets.push(0);
        for t in &tokens {
            bytes.extend_from_slice(t);
            offsets.push(bytes.len() as u32);
        }
        Self {
            offsets,
            bytes,
            present: vec![true; tokens.len()],
        }
    }

    /// The bytes of token `id`, or `None` for an id outside the vocabulary.
    pub(crate) fn get(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        if !*self.present.get(i)? {
            return None;
        }
        Some(&self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize])
    }
}
