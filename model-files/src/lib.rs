//! Opens a model given by path: a GGUF file, or a Hugging Face model folder presented as the
//! GGUF file llama.cpp's converter would have made of it (see [`hf`]).
//!
//! Code that reads models is written once, against [`gguf::GgufFile`] (metadata under GGUF
//! keys, tensors under GGUF names and in GGUF layout); [`open`] is the one place that knows
//! which format a path holds.

#![warn(missing_docs)]

mod arch;
mod error;
pub mod hf;
pub mod sampling;

use std::path::Path;

pub use arch::Arch;
pub use error::{ModelFileError, Result};
pub use gguf::GgufFile;

/// Opens `path`: a directory as a Hugging Face model folder ([`hf::open_folder`]), anything
/// else as a GGUF file ([`GgufFile::open`]).
///
/// Errors: [`ModelFileError`], whose message starts with the file at fault and names the key or
/// tensor and what was expected.
pub fn open(path: &Path) -> Result<GgufFile> {
    if path.is_dir() {
        hf::open_folder(path)
    } else {
        Ok(GgufFile::open(path)?)
    }
}
