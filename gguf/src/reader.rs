//! Memory-mapped GGUF reader.
//!
//! File layout (GGUF v2/v3, `docs/gguf.md` in the ggml repository), all
//! little-endian:
//! `"GGUF"` magic (u32 0x46554747), version u32, tensor count u64,
//! metadata count u64, metadata key/value pairs, tensor infos
//! (name, n_dims u32, dims u64 × n_dims, ggml type u32, offset u64), padding
//! to `general.alignment` (default 32), then the tensor data section.
//! Tensor offsets are relative to the start of the data section.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::cursor::Cursor;
use crate::error::{GgufError, Result};
use crate::mapped::MappedBytes;
use crate::metadata::{MetadataArray, MetadataValue, ValueType};
use crate::tensor_data::TensorData;
use crate::GgmlType;

/// The GGUF magic, `"GGUF"` read as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Description of one tensor stored in a GGUF file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in GGUF (ggml) order: `dims[0]` is the contiguous
    /// (row) length. A PyTorch `[out, in]` weight is stored as `[in, out]`.
    pub dims: Vec<u64>,
    /// Element type.
    pub dtype: GgmlType,
    /// Byte offset of the data relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Total number of elements (product of `dims`; 1 for a scalar). Saturates at `u64::MAX` for
    /// dims whose product does not fit (never for a tensor read by [`GgufFile::open`], which refuses
    /// them), so such a tensor has no [`byte_size`](Self::byte_size).
    pub fn n_elements(&self) -> u64 {
        self.dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// Bytes occupied by the data, or `None` for unsupported types or
    /// element counts that are not a whole number of blocks.
    pub fn byte_size(&self) -> Option<u64> {
        self.dtype.byte_size(self.n_elements())
    }
}

/// An opened, memory-mapped GGUF file with parsed metadata and tensor infos, or a model assembled
/// in the same shape from other files (see [`GgufFile::assemble`]).
///
/// Tensor bytes are read from the mapping, never copied by the reader; [`GgufFile::tensor_mapped`]
/// hands them out as a range that keeps the mapping alive after the `GgufFile` is dropped. The file
/// must therefore not be truncated or overwritten in place while it (or such a range) is in use:
/// replace a model file by renaming a new one over it.
pub struct GgufFile {
    pub(crate) path: PathBuf,
    pub(crate) storage: Storage,
    version: u32,
    alignment: u64,
    data_offset: u64,
    pub(crate) metadata: Vec<(String, MetadataValue)>,
    pub(crate) metadata_index: HashMap<String, usize>,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) tensor_index: HashMap<String, usize>,
}

/// Where a [`GgufFile`]'s tensor data lives.
pub(crate) enum Storage {
    /// A GGUF file: tensor offsets are relative to `data_offset` in this mapping, which tensors
    /// share with the consumers of their bytes ([`GgufFile::tensor_mapped`]).
    Mapped(Arc<Mmap>),
    /// An assembled model: one byte source per tensor, in tensor order; `origin` says what it was
    /// assembled from.
    Assembled {
        data: Vec<TensorData>,
        origin: String,
    },
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("origin", &self.origin())
            .field("version", &self.version)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and memory-maps `path`, parsing the header, metadata and tensor infos.
    ///
    /// Errors: [`GgufError::Io`] if the file cannot be opened or mapped,
    /// [`GgufError::BadMagic`], [`GgufError::UnsupportedVersion`] (only v2 and
    /// v3 are read), [`GgufError::Malformed`] for truncation, unknown value
    /// types, duplicate names, dimensions whose product passes 2^64, misaligned tensor offsets or
    /// tensor data past the end of the file. Every error names `path`.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let io_err = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        // SAFETY: the mapping is read-only; like every mmap-based model loader we
        // assume the file is not truncated or modified while it is mapped.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        Self::parse(path.to_path_buf(), mmap)
    }

    fn parse(path: PathBuf, mmap: Mmap) -> Result<GgufFile> {
        let mut c = Cursor {
            buf: &mmap[..],
            pos: 0,
            path: &path,
        };
        if mmap.is_empty() {
            return Err(GgufError::Malformed {
                path: path.clone(),
                message: "the file is empty (0 bytes)".into(),
            });
        }
        // A file of 1 to 3 bytes is a truncation error naming the bytes left.
        let magic = c.u32("magic")?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic {
                path: path.clone(),
                found: magic,
            });
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion {
                path: path.clone(),
                version,
            });
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;

        let n_kv = c.check_count(n_kv, ValueType::Array, "metadata count")?;
        let mut metadata = Vec::with_capacity(n_kv);
        let mut metadata_index = HashMap::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = c.string(&format!("metadata key #{i}"))?;
            let ty = c.value_type(&key)?;
            let value = c.value(ty, &key)?;
            if metadata_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(c.err(format!("duplicate metadata key `{key}`")));
            }
            metadata.push((key, value));
        }

        let n_tensors = c.check_count(n_tensors, ValueType::Array, "tensor count")?;
        let mut tensors = Vec::with_capacity(n_tensors);
        let mut tensor_index = HashMap::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = c.string(&format!("tensor info #{i}"))?;
            let n_dims = c.u32(&name)?;
            if n_dims > 8 {
                return Err(c.err(format!("tensor `{name}` has {n_dims} dimensions")));
            }
            let dims = (0..n_dims)
                .map(|_| c.u64(&name))
                .collect::<Result<Vec<_>>>()?;
            if dims
                .iter()
                .try_fold(1u64, |n, &d| n.checked_mul(d))
                .is_none()
            {
                return Err(c.err(format!(
                    "tensor `{name}` has dimensions {dims:?}, more than 2^64 elements"
                )));
            }
            let dtype = GgmlType::from_id(c.u32(&name)?);
            let offset = c.u64(&name)?;
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(c.err(format!("duplicate tensor name `{name}`")));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                dtype,
                offset,
            });
        }

        let alignment = match metadata_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => match metadata[i].1.as_integer() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() => a as u64,
                _ => {
                    return Err(c.err(format!(
                        "general.alignment must be a power of two, found {}",
                        metadata[i].1.describe()
                    )))
                }
            },
        };
        let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;

        let file = GgufFile {
            path,
            storage: Storage::Mapped(Arc::new(mmap)),
            version,
            alignment,
            data_offset,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
        };
        for t in &file.tensors {
            if t.offset % alignment != 0 {
                return Err(file.malformed(format!(
                    "tensor `{}` offset {} is not a multiple of the alignment {alignment}",
                    t.name, t.offset
                )));
            }
            if t.byte_size().is_some() {
                file.tensor_bytes(t)
                    .map_err(|e| file.malformed(e.to_string()))?;
            }
        }
        Ok(file)
    }

    fn malformed(&self, message: String) -> GgufError {
        GgufError::Malformed {
            path: self.path.clone(),
            message,
        }
    }

    /// The path the file was opened from (for an assembled model, the folder or file it was
    /// assembled from).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `None` for a GGUF file; for a model built with [`GgufFile::assemble`], the description it
    /// was given (e.g. `Hugging Face folder: 2 safetensors shards`).
    pub fn origin(&self) -> Option<&str> {
        match &self.storage {
            Storage::Mapped(_) => None,
            Storage::Assembled { origin, .. } => Some(origin),
        }
    }

    /// Builds the parts an assembled model shares with a parsed file (version 3, default
    /// alignment, data offset 0); used by [`GgufFile::assemble`].
    pub(crate) fn from_assembled_parts(
        path: PathBuf,
        storage: Storage,
        metadata: Vec<(String, MetadataValue)>,
        metadata_index: HashMap<String, usize>,
        tensors: Vec<TensorInfo>,
        tensor_index: HashMap<String, usize>,
    ) -> GgufFile {
        GgufFile {
            path,
            storage,
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            data_offset: 0,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
        }
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata key/value pairs in file order.
    pub fn metadata_entries(&self) -> impl Iterator<Item = (&str, &MetadataValue)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The raw metadata value for `key`, if present.
    pub fn metadata(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn required(&self, key: &str) -> Result<&MetadataValue> {
        self.metadata(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    fn mismatch(key: &str, expected: &'static str, v: &MetadataValue) -> GgufError {
        GgufError::TypeMismatch {
            key: key.to_string(),
            expected,
            found: v.describe(),
        }
    }

    /// `key` as a u32. Accepts any integer type whose value fits in u32.
    /// Errors: `MissingKey`, or `TypeMismatch` for non-integers / out of range.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let v = self.required(key)?;
        v.as_integer()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| Self::mismatch(key, "an integer fitting in u32", v))
    }

    /// `key` as a u64. Accepts any non-negative integer type.
    /// Errors: `MissingKey`, `TypeMismatch`.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.required(key)?;
        v.as_integer()
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| Self::mismatch(key, "an integer fitting in u64", v))
    }

    /// `key` as an f32. Accepts f32, f64 (rounded) and integers.
    /// Errors: `MissingKey`, `TypeMismatch`.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.required(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| Self::mismatch(key, "a number", v))
    }

    /// `key` as a bool. Errors: `MissingKey`, `TypeMismatch`.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.required(key)? {
            MetadataValue::Bool(b) => Ok(*b),
            v => Err(Self::mismatch(key, "a bool", v)),
        }
    }

    /// `key` as a string. Errors: `MissingKey`, `TypeMismatch`.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.required(key)? {
            MetadataValue::String(s) => Ok(s),
            v => Err(Self::mismatch(key, "a string", v)),
        }
    }

    /// `key` as an array of strings. Errors: `MissingKey`, `TypeMismatch`.
    pub fn get_str_array(&self, key: &str) -> Result<&[String]> {
        match self.required(key)? {
            MetadataValue::Array(MetadataArray::String(s)) => Ok(s),
            v => Err(Self::mismatch(key, "an array of strings", v)),
        }
    }

    /// `key` as an array of i32. Accepts any integer array whose values fit.
    /// Errors: `MissingKey`, `TypeMismatch`.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        let v = self.required(key)?;
        match v {
            MetadataValue::Array(a) => a
                .to_i64_vec()
                .and_then(|xs| xs.into_iter().map(|x| i32::try_from(x).ok()).collect())
                .ok_or_else(|| Self::mismatch(key, "an array of integers fitting in i32", v)),
            _ => Err(Self::mismatch(key, "an array of integers", v)),
        }
    }

    /// `key` as an array of f32 (f32 or f64 arrays).
    /// Errors: `MissingKey`, `TypeMismatch`.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        match self.required(key)? {
            MetadataValue::Array(MetadataArray::F32(v)) => Ok(v.clone()),
            MetadataValue::Array(MetadataArray::F64(v)) => {
                Ok(v.iter().map(|&x| x as f32).collect())
            }
            v => Err(Self::mismatch(key, "an array of floats", v)),
        }
    }

    /// Like [`Self::get_u32`] but `Ok(None)` when the key is absent.
    pub fn get_opt_u32(&self, key: &str) -> Result<Option<u32>> {
        optional(self.get_u32(key))
    }

    /// Like [`Self::get_f32`] but `Ok(None)` when the key is absent.
    pub fn get_opt_f32(&self, key: &str) -> Result<Option<f32>> {
        optional(self.get_f32(key))
    }

    /// Like [`Self::get_bool`] but `Ok(None)` when the key is absent.
    pub fn get_opt_bool(&self, key: &str) -> Result<Option<bool>> {
        optional(self.get_bool(key))
    }

    /// Like [`Self::get_str`] but `Ok(None)` when the key is absent.
    pub fn get_opt_str(&self, key: &str) -> Result<Option<&str>> {
        optional(self.get_str(key))
    }

    /// Like [`Self::get_str_array`] but `Ok(None)` when the key is absent.
    pub fn get_opt_str_array(&self, key: &str) -> Result<Option<&[String]>> {
        optional(self.get_str_array(key))
    }

    /// Like [`Self::get_f32_array`] but `Ok(None)` when the key is absent.
    pub fn get_opt_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>> {
        optional(self.get_f32_array(key))
    }

    /// Like [`Self::get_i32_array`] but `Ok(None)` when the key is absent.
    pub fn get_opt_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>> {
        optional(self.get_i32_array(key))
    }

    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw (possibly quantized) bytes of `info`'s data, borrowed from the mapping.
    ///
    /// Errors: [`GgufError::UnsupportedType`] if the size of the type is
    /// unknown, [`GgufError::SizeMismatch`] if the element count is not a whole
    /// number of blocks, [`GgufError::TensorOutOfBounds`] if the data extends
    /// past the end of the file.
    /// For an assembled model, the bytes of the tensor named `info.name` (checked against
    /// `info`'s size).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> Result<&[u8]> {
        Ok(match self.locate(info)? {
            Located::File(map, range) => &map[range],
            Located::Assembled(data) => data.bytes(),
        })
    }

    /// `info`'s bytes as a range of the memory-mapped file that holds them unmodified, shared with
    /// the mapping (no copy; the range keeps the mapping alive): always `Some` for a GGUF file, and
    /// for an assembled model `Some` for a tensor used as stored in its file and `None` for one
    /// computed while assembling (read it with [`Self::tensor_bytes`]).
    ///
    /// Errors: as [`Self::tensor_bytes`].
    pub fn tensor_mapped(&self, info: &TensorInfo) -> Result<Option<MappedBytes>> {
        Ok(match self.locate(info)? {
            Located::File(map, range) => Some(
                MappedBytes::new(map.clone(), range).expect("tensor range checked against the map"),
            ),
            Located::Assembled(data) => data.mapped().cloned(),
        })
    }

    /// `info`'s data in one lookup: the shared mapped range of [`Self::tensor_mapped`] when there
    /// is one, else a copy of the bytes computed while assembling.
    ///
    /// Errors: as [`Self::tensor_bytes`].
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<TensorData> {
        Ok(match self.locate(info)? {
            Located::File(map, range) => TensorData::Mapped(
                MappedBytes::new(map.clone(), range).expect("tensor range checked against the map"),
            ),
            Located::Assembled(data) => data.clone(),
        })
    }

    /// Where `info`'s data lies, its size and bounds checked (see [`Self::tensor_bytes`]).
    fn locate(&self, info: &TensorInfo) -> Result<Located<'_>> {
        let size = match info.byte_size() {
            Some(s) => s,
            None if info.dtype.block_size().is_none() => {
                return Err(GgufError::UnsupportedType(info.dtype))
            }
            None => {
                return Err(GgufError::SizeMismatch(format!(
                    "tensor `{}`: {} elements is not a multiple of the {} block size",
                    info.name,
                    info.n_elements(),
                    info.dtype
                )))
            }
        };
        let mmap = match &self.storage {
            Storage::Mapped(mmap) => mmap,
            Storage::Assembled { data, .. } => {
                return self
                    .assembled_data(data, info, size)
                    .map(Located::Assembled)
            }
        };
        let file_size = mmap.len() as u64;
        let start = self.data_offset.checked_add(info.offset);
        let end = start.and_then(|s| s.checked_add(size));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_size => {
                Ok(Located::File(mmap, start as usize..end as usize))
            }
            _ => Err(GgufError::TensorOutOfBounds {
                name: info.name.clone(),
                start: start.unwrap_or(u64::MAX),
                end: end.unwrap_or(u64::MAX),
                file_size,
            }),
        }
    }
}

/// Where a tensor's data lies (see [`GgufFile::locate`]).
enum Located<'a> {
    /// A checked byte range of a GGUF file's mapping.
    File(&'a Arc<Mmap>, Range<usize>),
    /// An assembled tensor's data.
    Assembled(&'a TensorData),
}

fn optional<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(GgufError::MissingKey { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}
