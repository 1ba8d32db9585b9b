//! The error type of this crate: every variant's message starts with the file it concerns, and
//! names the key or tensor and what was expected, so it can be shown as one line.

use std::path::PathBuf;

use gguf::GgufError;

/// Everything that can go wrong while opening a model file or folder.
#[derive(Debug, thiserror::Error)]
pub enum ModelFileError {
    /// Reading a GGUF file (or assembling the folder's tensors) failed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A file could not be opened, mapped or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A required file of a Hugging Face folder is absent.
    #[error("{}: missing ({what})", path.display())]
    MissingFile {
        /// Where the file was looked for.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
    },
    /// A JSON file does not parse or has the wrong shape.
    #[error("{}: invalid JSON: {message}", path.display())]
    Json {
        /// The file involved.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A configuration value is missing, mistyped or out of range.
    #[error("{}: key `{key}`: expected {expected}, found {found}", path.display())]
    Key {
        /// The file involved (usually `config.json`).
        path: PathBuf,
        /// The key, e.g. `hidden_size` or `rope_parameters.factor`.
        key: String,
        /// What was expected.
        expected: String,
        /// What the file holds (`nothing` when absent).
        found: String,
    },
    /// `model_type` names an architecture this reader does not convert.
    #[error("{}: unsupported model_type `{model_type}` (supported: {supported})", path.display())]
    UnsupportedArchitecture {
        /// The `config.json` read.
        path: PathBuf,
        /// Its `model_type`.
        model_type: String,
        /// The supported values, comma separated.
        supported: String,
    },
    /// A safetensors file is malformed (bad header, truncated data, ...).
    #[error("{}: invalid safetensors file: {message}", path.display())]
    Safetensors {
        /// The file involved.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A tensor's element type is not F32, F16 or BF16.
    #[error("{}: tensor `{tensor}` has dtype {dtype}, expected F32, F16 or BF16", path.display())]
    UnsupportedDtype {
        /// The safetensors file holding it.
        path: PathBuf,
        /// The tensor's Hugging Face name.
        tensor: String,
        /// Its dtype as safetensors names it.
        dtype: String,
    },
    /// A tensor the architecture needs is in none of the weight files.
    #[error("{}: missing tensor `{tensor}`", path.display())]
    MissingTensor {
        /// The weights file, or the shard index, that should list it.
        path: PathBuf,
        /// The tensor's Hugging Face name.
        tensor: String,
    },
    /// A tensor's shape disagrees with `config.json`.
    #[error("{}: tensor `{tensor}` has shape {found:?}, expected {expected:?} ({why})", path.display())]
    TensorShape {
        /// The safetensors file holding it.
        path: PathBuf,
        /// The tensor's Hugging Face name.
        tensor: String,
        /// The shape `config.json` implies (PyTorch order, `[out, in]`).
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
        /// Which config values give the expected shape.
        why: String,
    },
    /// A tokenizer file is present but unusable.
    #[error("{}: {message}", path.display())]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// Shorthand for `Result<T, ModelFileError>`.
pub type Result<T, E = ModelFileError> = std::result::Result<T, E>;
