//! Errors from loading and running the model.

use gguf::GgufError;

/// Everything that can go wrong while loading or running a [`super::LlamaModel`].
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Reading the GGUF file or decoding a tensor failed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// `general.architecture` is not a supported architecture.
    #[error("unsupported model architecture `{0}` (only `llama` is supported)")]
    UnsupportedArchitecture(String),
    /// Hyper-parameters are missing, inconsistent or unsupported.
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
    /// A required tensor is absent from the file.
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    /// A tensor has unexpected dimensions (GGUF order: `dims[0]` is the row length).
    #[error("tensor `{name}` has dims {found:?}, expected {expected:?}")]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Expected GGUF dims.
        expected: Vec<u64>,
        /// Dims found in the file.
        found: Vec<u64>,
    },
    /// `forward` was called with no tokens.
    #[error("forward called with no tokens")]
    EmptyInput,
    /// A token id is not below the vocabulary size.
    #[error("token id {token} is out of range (vocabulary size {vocab_size})")]
    TokenOutOfRange {
        /// The offending id.
        token: u32,
        /// Vocabulary size.
        vocab_size: usize,
    },
    /// The sequence would exceed the model's context length.
    #[error("sequence of {needed} tokens exceeds the context length {context_length}")]
    ContextOverflow {
        /// Cached tokens plus new tokens.
        needed: usize,
        /// The model's maximum.
        context_length: usize,
    },
    /// The cache was created for a model with a different shape.
    #[error("KV cache does not match the model ({0})")]
    CacheMismatch(String),
}
