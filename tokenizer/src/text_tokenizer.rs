//! [`TextTokenizer`]: the text tokenizer built from the [`TokenizerSpec`] a worker reports (GGUF
//! `tokenizer.ggml.*` metadata, or a `tokenizer.json`).
//!
//! GGUF model `"gpt2"` is a byte-level BPE ([`crate::bpe`]), `"llama"` a SentencePiece-style
//! vocabulary ([`crate::sentencepiece`]); a `tokenizer.json` brings its whole pipeline.
//!
//! Control and user-defined tokens are *special added tokens*: they are matched verbatim in input
//! text before pre-tokenization (`"<|im_start|>"` encodes to one id, `"<|im_start|"` does not) and
//! are dropped by [`TextTokenizer::decode`] with `skip_special`. [`TextTokenizer::encode_plain`]
//! treats that text as ordinary text instead (`"<|im_start|>"` splits into ordinary tokens), and
//! [`TextTokenizer::encode_pieces`] recognises special tokens only in a chat template's own text
//! ([`TemplatePiece::Markup`]), never in message content.

use std::collections::HashSet;

use inference_proto::worker::TokenizerSpec;
use tokenizers::{DecoderWrapper, Tokenizer};

use crate::error::TokenizerError;
use crate::token_bytes::TokenBytes;
use crate::{bpe, sentencepiece};

/// One piece of a rendered conversation, in order: text the template wrote (special tokens in it
/// are meant) or a message's content (plain text). The input of [`TextTokenizer::encode_pieces`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePiece {
    /// Text from the template itself: role headers, separators, special tokens.
    Markup(String),
    /// A message's content, to be tokenized as plain text.
    Content(String),
}

/// A text tokenizer shared by all request tasks (it is `Send + Sync`; wrap it
/// in an `Arc`).
///
/// Besides the `tokenizers::Tokenizer`, it keeps the set of special ids and,
/// when decoding is pure byte-level (each token maps to a fixed byte string
/// and decoding is their UTF-8-lossy concatenation), a table of each token's
/// bytes, which the streaming detokenizer uses.
pub struct TextTokenizer {
    inner: Tokenizer,
    /// `inner` with special-token text encoded as ordinary text
    /// (`set_encode_special_tokens(true)`).
    plain: Tokenizer,
    /// Each special token's text and id, longest text first (for matching in
    /// template text).
    special_texts: Vec<(String, u32)>,
    /// Prepended by `encode(.., add_special_tokens = true)` (GGUF specs only;
    /// a `tokenizer.json` brings its own post-processor).
    bos_to_prepend: Option<u32>,
    special_ids: HashSet<u32>,
    vocab_size: usize,
    /// Each token's decoded bytes, when decoding is their concatenation.
    token_bytes: Option<TokenBytes>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("special_ids", &self.special_ids.len())
            .field("bos_to_prepend", &self.bos_to_prepend)
            .field("byte_level", &self.token_bytes.is_some())
            .finish()
    }
}

impl TextTokenizer {
    /// Builds the tokenizer a worker described.
    ///
    /// A non-empty `tokenizer_json` takes precedence (its own normalizer,
    /// pre-tokenizer, post-processor and decoder are used; `add_bos_token`
    /// is then ignored). Otherwise `model` must be `"gpt2"` (byte-level BPE,
    /// with `pre` one of `smollm`, `starcoder`, `refact`, `gpt-2`, `gpt2`,
    /// `llama-bpe`, `llama3`) or `"llama"` (SentencePiece).
    ///
    /// # Errors
    /// [`TokenizerError::UnsupportedModel`] / [`TokenizerError::UnsupportedPreTokenizer`]
    /// for tokenizers this crate cannot reproduce, [`TokenizerError::InvalidSpec`]
    /// for an inconsistent vocabulary/merge list, [`TokenizerError::InvalidJson`]
    /// for an unparsable `tokenizer_json`.
    pub fn from_spec(spec: &TokenizerSpec) -> Result<Self, TokenizerError> {
        if !spec.tokenizer_json.is_empty() {
            return Self::from_tokenizer_json(&spec.tokenizer_json);
        }
        match spec.model.as_str() {
            "gpt2" => Self::from_gguf_bpe(spec),
            "llama" => Self::from_gguf_spm(spec),
            other => Err(TokenizerError::UnsupportedModel(other.to_string())),
        }
    }

    fn from_tokenizer_json(json: &str) -> Result<Self, TokenizerError> {
        let inner = Tokenizer::from_bytes(json.as_bytes())
            .map_err(|e| TokenizerError::InvalidJson(e.to_string()))?;
        let special_ids: HashSet<u32> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);
        let token_bytes = matches!(inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_)))
            .then(|| TokenBytes::from_byte_level(&inner, vocab_size));
        Ok(Self::assemble(
            inner,
            None,
            special_ids,
            vocab_size,
            token_bytes,
        ))
    }

    /// The tokenizer around `inner`, with its plain-text twin and the table of
    /// special-token texts.
    fn assemble(
        inner: Tokenizer,
        bos_to_prepend: Option<u32>,
        special_ids: HashSet<u32>,
        vocab_size: usize,
        token_bytes: Option<TokenBytes>,
    ) -> Self {
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);
        let mut special_texts: Vec<(String, u32)> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special && !t.content.is_empty())
            .map(|(id, t)| (t.content, id))
            .collect();
        special_texts.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Self {
            inner,
            plain,
            special_texts,
            bos_to_prepend,
            special_ids,
            vocab_size,
            token_bytes,
        }
    }

    /// A byte-level BPE GGUF vocabulary ([`crate::bpe`]).
    fn from_gguf_bpe(spec: &TokenizerSpec) -> Result<Self, TokenizerError> {
        let bpe = bpe::build(spec)?;
        let vocab_size = spec.tokens.len();
        let bos_to_prepend = bos_to_prepend(spec)?;
        let token_bytes = Some(TokenBytes::from_byte_level(&bpe.tokenizer, vocab_size));
        Ok(Self::assemble(
            bpe.tokenizer,
            bos_to_prepend,
            bpe.special_ids,
            vocab_size,
            token_bytes,
        ))
    }

    /// A SentencePiece-style GGUF vocabulary ([`crate::sentencepiece`]).
    fn from_gguf_spm(spec: &TokenizerSpec) -> Result<Self, TokenizerError> {
        let spm = sentencepiece::build(spec)?;
        let vocab_size = spec.tokens.len();
        Ok(Self::assemble(
            spm.tokenizer,
            bos_to_prepend(spec)?,
            spm.special_ids,
            vocab_size,
            spm.token_bytes.map(TokenBytes::from_tokens),
        ))
    }

    /// Encodes `text` into token ids. With `add_special_tokens`, the BOS token
    /// is prepended when the model asks for it (`add_bos_token`), or the
    /// `tokenizer.json` post-processor runs. Special tokens written in the
    /// text (`"<|im_start|>"`) are always recognised.
    ///
    /// # Errors
    /// [`TokenizerError::Encode`] if the `tokenizers` library fails.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(self.with_bos(enc.get_ids().to_vec(), add_special_tokens))
    }

    /// Like [`encode`](Self::encode), but special-token text in `text` is
    /// ordinary text: `"<|im_start|>"` becomes the ids of its characters, not
    /// the control token (a raw prompt with `prompt_as_plain_text`). With
    /// `add_special_tokens` the BOS token is still prepended as in `encode`.
    ///
    /// # Errors
    /// [`TokenizerError::Encode`] if the `tokenizers` library fails.
    pub fn encode_plain(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .plain
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(self.with_bos(enc.get_ids().to_vec(), add_special_tokens))
    }

    /// Encodes a rendered chat (the router's `ChatTemplate::render_pieces`) without BOS
    /// or post-processing: special tokens are recognised in the template's
    /// [`TemplatePiece::Markup`] only; [`TemplatePiece::Content`] is plain
    /// text. The text between two special tokens is encoded as one, as
    /// [`encode`](Self::encode) does (the `tokenizers` library also splits
    /// at special tokens first), so a conversation whose content holds no
    /// special-token text gets exactly `encode(render(..), false)`.
    ///
    /// # Errors
    /// [`TokenizerError::Encode`] if the `tokenizers` library fails.
    pub fn encode_pieces(&self, pieces: &[TemplatePiece]) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        let mut text = String::new();
        for piece in pieces {
            match piece {
                TemplatePiece::Content(content) => text.push_str(content),
                TemplatePiece::Markup(markup) => {
                    let mut rest = markup.as_str();
                    while let Some((at, len, id)) = self.find_special(rest) {
                        text.push_str(&rest[..at]);
                        self.flush_plain(&mut text, &mut ids)?;
                        ids.push(id);
                        rest = &rest[at + len..];
                    }
                    text.push_str(rest);
                }
            }
        }
        self.flush_plain(&mut text, &mut ids)?;
        Ok(ids)
    }

    /// Whether `text` holds the text of a special token (e.g. `"<|im_start|>"`).
    pub fn contains_special_text(&self, text: &str) -> bool {
        self.find_special(text).is_some()
    }

    /// The leftmost special-token text in `text` (the longest one at that
    /// position): its byte offset, byte length and id.
    fn find_special(&self, text: &str) -> Option<(usize, usize, u32)> {
        let mut best: Option<(usize, usize, u32)> = None;
        for (special, id) in &self.special_texts {
            if let Some(at) = text.find(special.as_str()) {
                // Longest first, so an equal offset never replaces a longer match.
                if best.is_none_or(|(b, _, _)| at < b) {
                    best = Some((at, special.len(), *id));
                }
            }
        }
        best
    }

    /// Appends the plain-text encoding of `text` to `ids` and empties `text`.
    fn flush_plain(&self, text: &mut String, ids: &mut Vec<u32>) -> Result<(), TokenizerError> {
        if !text.is_empty() {
            ids.extend(self.encode_plain(text, false)?);
            text.clear();
        }
        Ok(())
    }

    /// Like [`encode`](Self::encode), also returning each id's vocabulary
    /// string (byte-level form, e.g. `"Ġworld"`).
    ///
    /// # Errors
    /// [`TokenizerError::Encode`] if the `tokenizers` library fails.
    pub fn encode_with_pieces(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<(Vec<u32>, Vec<String>), TokenizerError> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let ids = self.with_bos(enc.get_ids().to_vec(), add_special_tokens);
        let mut pieces = enc.get_tokens().to_vec();
        if ids.len() > pieces.len() {
            // The BOS this type prepended itself.
            pieces.insert(0, self.inner.id_to_token(ids[0]).unwrap_or_default());
        }
        Ok((ids, pieces))
    }

    fn with_bos(&self, mut ids: Vec<u32>, add_special_tokens: bool) -> Vec<u32> {
        if let (true, Some(bos)) = (add_special_tokens, self.bos_to_prepend) {
            ids.insert(0, bos);
        }
        ids
    }

    /// Decodes ids to text (invalid UTF-8 is replaced by U+FFFD; ids outside
    /// the vocabulary are ignored). With `skip_special`, special tokens are
    /// left out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        match &self.token_bytes {
            Some(table) => {
                let mut bytes = Vec::with_capacity(ids.len() * 4);
                for &id in ids {
                    if !(skip_special && self.is_special(id)) {
                        bytes.extend_from_slice(table.get(id).unwrap_or_default());
                    }
                }
                String::from_utf8_lossy(&bytes).into_owned()
            }
            // Decoders in the supported tokenizer.json files do not fail.
            None => self.inner.decode(ids, skip_special).unwrap_or_default(),
        }
    }

    /// Whether `id` is a special (control / user-defined) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// What the token alone decodes to (lossy: a partial UTF-8 character
    /// becomes U+FFFD), or `None` for an id outside the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)?;
        Some(self.decode(&[id], false))
    }

    /// The raw bytes token `id` contributes to decoded text, when decoding is
    /// pure byte-level (always for GGUF `"gpt2"` specs); `None` otherwise or
    /// for an id outside the vocabulary. Decoding a sequence is then the
    /// UTF-8-lossy conversion of the concatenated bytes.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.as_ref()?.get(id)
    }

    /// Whether [`token_bytes`](Self::token_bytes) is available.
    pub fn is_byte_level(&self) -> bool {
        self.token_bytes.is_some()
    }

    /// Number of ids: one more than the largest token id (49152 for SmolLM2).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The id of vocabulary string `token` (byte-level form, e.g. `"Ġthe"`,
    /// or a special token's text such as `"<|im_end|>"`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary string of `id` (the inverse of [`token_id`](Self::token_id)).
    pub fn id_to_piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }
}

/// The BOS id [`TextTokenizer::encode`] prepends for a GGUF spec: `bos_token_id` when
/// `add_bos_token` is set.
///
/// Errors: [`TokenizerError::InvalidSpec`] when `add_bos_token` is set without a BOS id in the
/// vocabulary.
fn bos_to_prepend(spec: &TokenizerSpec) -> Result<Option<u32>, TokenizerError> {
    let vocab_size = spec.tokens.len();
    match (spec.add_bos_token, spec.bos_token_id) {
        (true, Some(bos)) if (bos as usize) < vocab_size => Ok(Some(bos)),
        (true, Some(bos)) => Err(TokenizerError::InvalidSpec(format!(
            "bos_token_id {bos} outside the vocabulary of {vocab_size}"
        ))),
        (true, None) => Err(TokenizerError::InvalidSpec(
            "add_bos_token set without bos_token_id".into(),
        )),
        (false, _) => Ok(None),
    }
}
