//! GGUF model files: a memory-mapped reader, a writer (for test models),
//! tokenizer metadata and the reference (scalar) quantization formats; models from other
//! formats can be assembled into the same [`GgufFile`] shape ([`GgufFile::assemble`]).
//!
//! Format reference: the GGUF specification (`docs/gguf.md` in the ggml
//! repository) and llama.cpp's `ggml-quants.c` for block layouts.

#![warn(missing_docs)]

mod assembled;
mod cursor;
mod error;
mod ggml_type;
pub mod kquant;
mod mapped;
mod metadata;
pub mod quant;
mod reader;
mod tensor_data;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod tokenizer;
mod writer;

pub use assembled::AssembledTensor;
pub use error::{GgufError, Result};
pub use ggml_type::GgmlType;
pub use mapped::MappedBytes;
pub use metadata::{MetadataArray, MetadataValue, ValueType};
pub use quant::{dequantize, dequantize_to_vec, quantize_q4_1, quantize_q8_0};
pub use reader::{GgufFile, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC};
pub use tensor_data::TensorData;
pub use tokenizer::TokenizerMetadata;
pub use writer::GgufWriter;
