//! The error type shared by the reader, writer, quantizers and tokenizer metadata.

use std::path::PathBuf;

use crate::GgmlType;

/// Everything that can go wrong while reading, decoding or writing GGUF data.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// Opening, mapping or writing the file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the `GGUF` magic.
    #[error("{}: not a GGUF file (magic {found:#010x}, expected 0x46554747 \"GGUF\")", path.display())]
    BadMagic {
        /// The file involved.
        path: PathBuf,
        /// The little-endian u32 found at offset 0.
        found: u32,
    },
    /// The GGUF version is not 2 or 3.
    #[error("{}: unsupported GGUF version {version} (supported: 2, 3)", path.display())]
    UnsupportedVersion {
        /// The file involved.
        path: PathBuf,
        /// The version found in the header.
        version: u32,
    },
    /// The file structure is inconsistent (truncated, bad lengths, bad types, ...).
    #[error("{}: malformed GGUF file: {message}", path.display())]
    Malformed {
        /// The file involved.
        path: PathBuf,
        /// What is wrong, including the byte offset where known.
        message: String,
    },
    /// A required metadata key is absent.
    #[error("missing GGUF metadata key `{key}`")]
    MissingKey {
        /// The key looked up.
        key: String,
    },
    /// A metadata key exists but holds a value of a different type (or out of range).
    #[error("GGUF metadata key `{key}`: expected {expected}, found {found}")]
    TypeMismatch {
        /// The key looked up.
        key: String,
        /// What the caller asked for.
        expected: &'static str,
        /// A description of the stored value.
        found: String,
    },
    /// A tensor's data lies (partly) outside the file's data section.
    #[error("tensor `{name}`: data [{start}, {end}) lies outside the file (size {file_size})")]
    TensorOutOfBounds {
        /// Tensor name.
        name: String,
        /// Absolute start offset in bytes.
        start: u64,
        /// Absolute end offset in bytes (exclusive).
        end: u64,
        /// File size in bytes.
        file_size: u64,
    },
    /// The element type cannot be decoded / encoded by this crate.
    #[error("unsupported tensor type {0}")]
    UnsupportedType(GgmlType),
    /// Element count / byte length / output length do not agree.
    #[error("size mismatch: {0}")]
    SizeMismatch(String),
}

/// Shorthand for `Result<T, GgufError>`.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;
