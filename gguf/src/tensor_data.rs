//! [`TensorData`]: a tensor's bytes, owned or a shared range of a memory-mapped file; what an
//! assembled model holds per tensor ([`crate::AssembledTensor`]) and what
//! [`GgufFile::tensor_data`](crate::GgufFile::tensor_data) gives for any tensor.

use crate::mapped::MappedBytes;

/// The bytes of one tensor, laid out as a GGUF file holds them (little-endian, `dims[0]`
/// contiguous): computed while assembling a model, or a range of a memory-mapped file.
#[derive(Clone)]
pub enum TensorData {
    /// Bytes computed while assembling (e.g. permuted rows, shifted norm weights).
    Owned(Vec<u8>),
    /// A byte range of a memory-mapped file, shared by every tensor that lies in it.
    Mapped(MappedBytes),
}

impl std::fmt::Debug for TensorData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TensorData::Owned(v) => write!(f, "Owned({} bytes)", v.len()),
            TensorData::Mapped(b) => write!(f, "Mapped({:?})", b.range()),
        }
    }
}

impl TensorData {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            TensorData::Owned(v) => v,
            TensorData::Mapped(b) => b,
        }
    }

    /// The shared mapped range, or `None` for owned bytes.
    pub fn mapped(&self) -> Option<&MappedBytes> {
        match self {
            TensorData::Owned(_) => None,
            TensorData::Mapped(b) => Some(b),
        }
    }
}
