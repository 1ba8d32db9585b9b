//! The two questions a model description asks of a model file: a metadata value by GGUF key, and
//! a tensor by GGUF name. [`gguf::GgufFile`] answers them directly; other containers (a Hugging
//! Face folder) answer them by mapping their own names onto GGUF's, so one loader serves both.

use std::borrow::Cow;

use gguf::{GgmlType, GgufFile, MappedBytes};

use super::ArchError;

/// One tensor as a [`ModelSource`] answers it: its type, GGUF dims and raw bytes, and the memory
/// map holding those bytes when the source has them unmodified in one.
#[derive(Debug, Clone)]
pub struct SourceTensor<'a> {
    /// Element type (quantized types as ggml lays out their blocks).
    pub dtype: GgmlType,
    /// GGUF order: `dims[0]` is the row length (input features of a matrix), `dims[1]` the rows.
    pub dims: Vec<u64>,
    /// The data, row-major in `dtype`'s encoding: borrowed from a memory map or owned when the
    /// source had to convert it (e.g. to permute rows).
    pub bytes: Cow<'a, [u8]>,
    /// The same bytes as a shared range of the memory-mapped file that holds them as stored, for
    /// a consumer that keeps them past the source's lifetime without copying them (the weights,
    /// which are then served from the page cache); `None` when the source computed them.
    pub mapped: Option<MappedBytes>,
}

/// Metadata and tensors looked up by their GGUF names (`llama.block_count`,
/// `blk.0.attn_q.weight`, ...). Every lookup answers `Ok(None)` when the key or tensor is absent
/// and an error only when it is present but unreadable.
pub trait ModelSource {
    /// A string value (`general.architecture`, `{arch}.rope.scaling.type`).
    fn meta_str(&self, key: &str) -> Result<Option<String>, ArchError>;
    /// An unsigned integer value (`{arch}.block_count`), any integer type that fits a `u32`.
    fn meta_u32(&self, key: &str) -> Result<Option<u32>, ArchError>;
    /// A float value (`{arch}.rope.freq_base`), f32 or f64.
    fn meta_f32(&self, key: &str) -> Result<Option<f32>, ArchError>;
    /// The length of an array value (`tokenizer.ggml.tokens`).
    fn meta_array_len(&self, key: &str) -> Result<Option<usize>, ArchError>;
    /// The tensor named `name` (`rope_freqs.weight`), its bytes checked to lie within the source.
    fn tensor(&self, name: &str) -> Result<Option<SourceTensor<'_>>, ArchError>;
    /// Whether a tensor named `name` exists (without reading it).
    fn has_tensor(&self, name: &str) -> bool;
}

impl ModelSource for GgufFile {
    fn meta_str(&self, key: &str) -> Result<Option<String>, ArchError> {
        Ok(self.get_opt_str(key)?.map(str::to_string))
    }

    fn meta_u32(&self, key: &str) -> Result<Option<u32>, ArchError> {
        Ok(self.get_opt_u32(key)?)
    }

    fn meta_f32(&self, key: &str) -> Result<Option<f32>, ArchError> {
        Ok(self.get_opt_f32(key)?)
    }

    fn meta_array_len(&self, key: &str) -> Result<Option<usize>, ArchError> {
        Ok(match self.metadata(key) {
            Some(gguf::MetadataValue::Array(a)) => Some(a.len()),
            Some(other) => {
                return Err(ArchError::InvalidConfig(format!(
                    "metadata key `{key}`: expected an array, found {}",
                    other.describe()
                )))
            }
            None => None,
        })
    }

    fn tensor(&self, name: &str) -> Result<Option<SourceTensor<'_>>, ArchError> {
        let Some(info) = GgufFile::tensor(self, name) else {
            return Ok(None);
        };
        Ok(Some(SourceTensor {
            dtype: info.dtype,
            dims: info.dims.clone(),
            bytes: Cow::Borrowed(self.tensor_bytes(info)?),
            mapped: self.tensor_mapped(info)?,
        }))
    }

    fn has_tensor(&self, name: &str) -> bool {
        GgufFile::tensor(self, name).is_some()
    }
}
