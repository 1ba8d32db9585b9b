//! Errors from reading a model description and its weights.

/// Why a [`super::ModelDesc`] or its [`super::ModelWeights`] could not be read from a
/// [`super::ModelSource`].
#[derive(Debug, thiserror::Error)]
pub enum ArchError {
    /// The source failed to answer a lookup (for GGUF: a malformed file, or a key holding a value
    /// of another type); the message names the key or tensor.
    #[error(transparent)]
    Source(Box<dyn std::error::Error + Send + Sync>),
    /// `general.architecture` names an architecture this worker does not implement.
    #[error(
        "unsupported model architecture `{0}` (supported: llama, qwen2, qwen3, gemma2, gemma3, phi3)"
    )]
    UnsupportedArchitecture(String),
    /// A required metadata key is absent.
    #[error("missing metadata key `{0}`")]
    MissingKey(String),
    /// Hyper-parameters are inconsistent or use a feature that is not implemented; the message
    /// names the key and what was expected.
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
    /// A tensor the description or the weights need is absent.
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    /// A weight has other dims than the description implies (GGUF order: `dims[0]` is the row
    /// length).
    #[error("tensor `{name}` has dims {found:?}, expected {expected:?}")]
    TensorShape {
        /// The tensor's GGUF name.
        name: String,
        /// Expected GGUF dims.
        expected: Vec<u64>,
        /// Dims found in the source.
        found: Vec<u64>,
    },
    /// A tensor the description reads (`rope_freqs.weight`) has the wrong shape or type.
    #[error("tensor `{name}`: {message}")]
    Tensor {
        /// The tensor's GGUF name.
        name: String,
        /// What was expected and found.
        message: String,
    },
}

impl From<gguf::GgufError> for ArchError {
    fn from(e: gguf::GgufError) -> ArchError {
        ArchError::Source(Box::new(e))
    }
}
