//! [`TokenizerError`]: why a tokenizer could not be built from a worker's spec, or could not encode.

/// Why a tokenizer could not be built or could not encode.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` names a tokenizer this crate cannot build.
    #[error(
        "unsupported tokenizer model {0:?} (supported: \"gpt2\" byte-level BPE, \"llama\" \
         SentencePiece, or a tokenizer.json)"
    )]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know.
    #[error(
        "unsupported pre-tokenizer {0:?} for byte-level BPE (supported: smollm, starcoder, refact, \
         gpt-2, llama-bpe; or ship a tokenizer.json beside the model)"
    )]
    UnsupportedPreTokenizer(String),
    /// The spec is inconsistent (empty vocabulary, malformed merge, …).
    #[error("invalid tokenizer spec: {0}")]
    InvalidSpec(String),
    /// The `tokenizer_json` could not be parsed.
    #[error("invalid tokenizer.json: {0}")]
    InvalidJson(String),
    /// Encoding the text failed inside the `tokenizers` library.
    #[error("encoding failed: {0}")]
    Encode(String),
}
