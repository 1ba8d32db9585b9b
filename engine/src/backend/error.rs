//! Errors from loading a model and checking a step's batch ([`ModelError`]), and from running a step
//! ([`StepError`]), shared by every backend.

use gguf::GgufError;

use model_desc::ArchError;

/// Everything that can go wrong while loading a model or checking a batch before a step, in any
/// backend (`backend_cpu::CpuModel`, `backend_cuda::CudaModel`).
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Reading the GGUF file or decoding a tensor failed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// Opening the model (a GGUF file or a Hugging Face folder) failed.
    #[error(transparent)]
    ModelFile(#[from] model_files::ModelFileError),
    /// The model description or its weights could not be read (unknown architecture, missing or
    /// inconsistent metadata, a missing tensor or one of the wrong dims).
    #[error(transparent)]
    Arch(#[from] ArchError),
    /// A tensor cannot be used as the description needs it (rows not whole blocks, a format the
    /// backend does not decode); the message names the tensor.
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
    /// A batch entry has no tokens.
    #[error("batch entry {entry} has no tokens")]
    EmptyInput {
        /// Index of the entry in the batch.
        entry: usize,
    },
    /// An entry asks for the logits of more tokens than it has.
    #[error("batch entry {entry} asks for the logits of {logit_tokens} tokens but has {tokens}")]
    TooManyLogitTokens {
        /// Index of the entry in the batch.
        entry: usize,
        /// The entry's `logit_tokens`.
        logit_tokens: usize,
        /// The entry's number of tokens.
        tokens: usize,
    },
    /// A token id is not below the vocabulary size.
    #[error(
        "batch entry {entry}: token id {token} is out of range (vocabulary size {vocab_size})"
    )]
    TokenOutOfRange {
        /// Index of the entry in the batch.
        entry: usize,
        /// The offending id.
        token: u32,
        /// Vocabulary size.
        vocab_size: usize,
    },
    /// The sequence would exceed the model's context length.
    #[error(
        "batch entry {entry}: sequence of {needed} tokens exceeds the context length {context_length}"
    )]
    ContextOverflow {
        /// Index of the entry in the batch.
        entry: usize,
        /// `start_pos` plus the entry's tokens.
        needed: usize,
        /// The model's maximum.
        context_length: usize,
    },
    /// A block table does not cover all positions of its entry.
    #[error("batch entry {entry}: block table has {have} blocks, {needed} needed")]
    BlockTableTooShort {
        /// Index of the entry in the batch.
        entry: usize,
        /// Blocks needed for positions `0..start_pos + tokens.len()`.
        needed: usize,
        /// Length of the block table.
        have: usize,
    },
    /// A block id is not below the number of blocks in the KV cache.
    #[error("batch entry {entry}: block id {block} is out of range ({num_blocks} blocks)")]
    BlockOutOfRange {
        /// Index of the entry in the batch.
        entry: usize,
        /// The offending id.
        block: u32,
        /// Blocks in the cache.
        num_blocks: usize,
    },
    /// Two tokens of one batch would write the same KV slot.
    #[error("KV slot {slot} is written twice in one batch (entries {first} and {second})")]
    SlotConflict {
        /// The slot (`block * block_size + offset`).
        slot: usize,
        /// Index of the first entry writing it.
        first: usize,
        /// Index of the other entry writing it (may equal `first`).
        second: usize,
    },
    /// The cache was created for a model with a different shape.
    #[error("KV cache does not match the model ({0})")]
    CacheMismatch(String),
}

/// Why [`BatchModel::forward_batch`](super::BatchModel::forward_batch) failed. The engine fails the
/// step's sequences with its message (and the messages of its sources, as `anyhow`'s `{:#}` would
/// print them) and goes on.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The backend's checks refused the batch before anything ran: an empty entry, an id outside
    /// the vocabulary, a block table too short, positions past the context length, a KV slot
    /// written twice, a cache of another shape (the variants of [`ModelError`] about a batch).
    #[error(transparent)]
    Batch(#[from] ModelError),
    /// The device failed while running the step (a driver call, a kernel launch, an upload); the
    /// backend's own error, e.g. a `CudaError`.
    #[error(transparent)]
    Device(Box<dyn std::error::Error + Send + Sync>),
}
