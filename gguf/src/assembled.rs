//! Models assembled in memory in the shape of a GGUF file: metadata under GGUF keys and tensors
//! under GGUF names, each tensor's bytes either owned or borrowed from a shared memory map.
//!
//! This is how a model stored in another format (a Hugging Face safetensors folder, see the
//! `model-files` crate) is presented to code written against [`GgufFile`]: the accessors behave
//! exactly as for a parsed file, only [`GgufFile::origin`] tells them apart.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::error::{GgufError, Result};
use crate::metadata::MetadataValue;
use crate::reader::{GgufFile, Storage, TensorInfo};
use crate::tensor_data::TensorData;
use crate::GgmlType;

/// One tensor of an assembled model.
#[derive(Debug, Clone)]
pub struct AssembledTensor {
    /// GGUF tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in GGUF order (`dims[0]` is the row length).
    pub dims: Vec<u64>,
    /// Element type (F32, F16 or BF16 for the formats assembled today, any decodable type allowed).
    pub dtype: GgmlType,
    /// The bytes, exactly `dtype.byte_size(product of dims)` long.
    pub data: TensorData,
}

impl GgufFile {
    /// Builds a model from metadata and tensors assembled elsewhere; `path` is what it was read
    /// from (shown in errors) and `origin` a short description returned by [`GgufFile::origin`].
    ///
    /// Errors: [`GgufError::Malformed`] (naming `path`) for a duplicate metadata key or tensor
    /// name; [`GgufError::SizeMismatch`] when a tensor's
    /// byte length disagrees with its dims and type; [`GgufError::UnsupportedType`] for a type
    /// whose size is unknown.
    pub fn assemble(
        path: PathBuf,
        origin: String,
        metadata: Vec<(String, MetadataValue)>,
        tensors: Vec<AssembledTensor>,
    ) -> Result<GgufFile> {
        let malformed = |message: String| GgufError::Malformed {
            path: path.clone(),
            message,
        };
        let mut metadata_index = HashMap::with_capacity(metadata.len());
        for (i, (key, _)) in metadata.iter().enumerate() {
            if metadata_index.insert(key.clone(), i).is_some() {
                return Err(malformed(format!("duplicate metadata key `{key}`")));
            }
        }
        let mut infos = Vec::with_capacity(tensors.len());
        let mut tensor_index = HashMap::with_capacity(tensors.len());
        let mut data = Vec::with_capacity(tensors.len());
        let mut offset = 0u64;
        for t in tensors {
            let info = TensorInfo {
                name: t.name,
                dims: t.dims,
                dtype: t.dtype,
                offset,
            };
            let size = info
                .byte_size()
                .ok_or(GgufError::UnsupportedType(info.dtype))?;
            let len = t.data.bytes().len();
            if len as u64 != size {
                return Err(GgufError::SizeMismatch(format!(
                    "tensor `{}`: {} {:?} needs {size} bytes, got {}",
                    info.name, info.dtype, info.dims, len
                )));
            }
            if tensor_index
                .insert(info.name.clone(), infos.len())
                .is_some()
            {
                return Err(malformed(format!("duplicate tensor name `{}`", info.name)));
            }
            offset += size.div_ceil(crate::DEFAULT_ALIGNMENT) * crate::DEFAULT_ALIGNMENT;
            infos.push(info);
            data.push(t.data);
        }
        Ok(GgufFile::from_assembled_parts(
            path,
            Storage::Assembled { data, origin },
            metadata,
            metadata_index,
            infos,
            tensor_index,
        ))
    }

    /// The data of the assembled tensor named like `info`, which must be `size` bytes long.
    pub(crate) fn assembled_data<'a>(
        &self,
        data: &'a [TensorData],
        info: &TensorInfo,
        size: u64,
    ) -> Result<&'a TensorData> {
        let tensor = self
            .tensor_index
            .get(&info.name)
            .map(|&i| &data[i])
            .ok_or_else(|| GgufError::Malformed {
                path: self.path.clone(),
                message: format!("no tensor `{}`", info.name),
            })?;
        let held = tensor.bytes().len();
        if held as u64 != size {
            return Err(GgufError::SizeMismatch(format!(
                "tensor `{}`: {size} bytes asked for, {held} held",
                info.name
            )));
        }
        Ok(tensor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MappedBytes;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn an_assembled_model_reads_like_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let mapped = dir.path().join("data.bin");
        std::fs::write(&mapped, f32_bytes(&[9.0, 1.0, 2.0, 3.0, 4.0])).unwrap();
        // SAFETY: the test's own file, not modified while mapped.
        let map = unsafe { memmap2::Mmap::map(&std::fs::File::open(&mapped).unwrap()) }.unwrap();
        let map = MappedBytes::new(std::sync::Arc::new(map), 4..20).unwrap();
        let file = GgufFile::assemble(
            dir.path().to_path_buf(),
            "test".into(),
            vec![
                (
                    "general.architecture".into(),
                    MetadataValue::String("llama".into()),
                ),
                ("llama.block_count".into(), MetadataValue::U32(2)),
            ],
            vec![
                AssembledTensor {
                    name: "a".into(),
                    dims: vec![2, 2],
                    dtype: GgmlType::F32,
                    data: TensorData::Mapped(map.clone()),
                },
                AssembledTensor {
                    name: "b".into(),
                    dims: vec![1],
                    dtype: GgmlType::F32,
                    data: TensorData::Owned(f32_bytes(&[7.0])),
                },
            ],
        )
        .unwrap();
        assert_eq!(file.origin(), Some("test"));
        assert_eq!(file.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(file.get_u32("llama.block_count").unwrap(), 2);
        let a = file.tensor("a").unwrap();
        assert_eq!(
            crate::dequantize_to_vec(a.dtype, file.tensor_bytes(a).unwrap(), 4).unwrap(),
            [1.0, 2.0, 3.0, 4.0]
        );
        let shared = file.tensor_mapped(a).unwrap().unwrap();
        assert_eq!((shared.range(), shared.as_ptr()), (4..20, map.as_ptr()));
        let b = file.tensor("b").unwrap();
        assert_eq!(file.tensor_bytes(b).unwrap(), f32_bytes(&[7.0]));
        assert!(file.tensor_mapped(b).unwrap().is_none());
        // The data in one lookup: shared where it is mapped, copied where it was computed.
        let a_data = file.tensor_data(a).unwrap();
        let a_shared = a_data.mapped().unwrap();
        assert_eq!((a_shared.range(), a_shared.as_ptr()), (4..20, map.as_ptr()));
        let b_data = file.tensor_data(b).unwrap();
        assert!(b_data.mapped().is_none());
        assert_eq!(b_data.bytes(), f32_bytes(&[7.0]));
    }

    #[test]
    fn inconsistent_parts_are_refused() {
        let t = |name: &str, n: usize| AssembledTensor {
            name: name.into(),
            dims: vec![2],
            dtype: GgmlType::F32,
            data: TensorData::Owned(vec![0; n]),
        };
        let path = PathBuf::from("/models/x");
        let err =
            GgufFile::assemble(path.clone(), String::new(), vec![], vec![t("a", 7)]).unwrap_err();
        assert!(err.to_string().contains("needs 8 bytes, got 7"), "{err}");
        let err = GgufFile::assemble(
            path.clone(),
            String::new(),
            vec![],
            vec![t("a", 8), t("a", 8)],
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("duplicate tensor name `a`"),
            "{err}"
        );
        let kv = || ("k".to_string(), MetadataValue::U32(1));
        let err = GgufFile::assemble(path, String::new(), vec![kv(), kv()], vec![]).unwrap_err();
        assert!(
            err.to_string()
                .contains("/models/x: malformed GGUF file: duplicate metadata key `k`"),
            "{err}"
        );
    }
}
