//! The weights of a Hugging Face folder: `model.safetensors`, or the shards listed by
//! `model.safetensors.index.json` (`weight_map`: tensor name → shard file). Each file is
//! memory-mapped once; its header is read with the `safetensors` crate (which checks that the
//! offsets are contiguous, agree with each dtype and shape, and cover the file exactly), and the
//! tensors borrow byte ranges of the shared mapping.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gguf::{GgmlType, MappedBytes, TensorData};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use super::config::read_json;
use crate::error::{ModelFileError, Result};

/// Single-file weights.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The shard index of sharded weights.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One tensor of the folder, as stored.
#[derive(Debug, Clone)]
pub struct SourceTensor {
    /// The safetensors file holding it.
    pub file: PathBuf,
    /// Element type (F32, F16 or BF16).
    pub dtype: GgmlType,
    /// Shape in PyTorch order (`[out, in]` for a linear weight).
    pub shape: Vec<usize>,
    /// The bytes (row-major, little-endian), borrowed from the file's mapping.
    pub data: TensorData,
}

/// All tensors of a folder's weight files, by Hugging Face name.
#[derive(Debug)]
pub struct Weights {
    /// The tensors.
    pub tensors: HashMap<String, SourceTensor>,
    /// What lists the tensors: `model.safetensors` or the index file (named in missing-tensor
    /// errors).
    pub listing: PathBuf,
    /// The number of safetensors files read.
    pub n_files: usize,
}

impl Weights {
    /// Reads the weights of `dir`: the shard index when present, else `model.safetensors`.
    ///
    /// Errors: `MissingFile` when neither exists or a shard named by the index is absent;
    /// `Json` / `Key` for a malformed index; `Io`; `Safetensors` for a malformed file;
    /// `UnsupportedDtype` for a tensor that is not F32, F16 or BF16; `MissingTensor` when a
    /// tensor the index assigns to a shard is not in it.
    pub fn read(dir: &Path) -> Result<Weights> {
        let index = dir.join(INDEX_FILE);
        if index.is_file() {
            return Self::read_sharded(dir, &index);
        }
        let single = dir.join(SINGLE_FILE);
        if !single.is_file() {
            return Err(ModelFileError::MissingFile {
                path: single,
                what: "the weights: model.safetensors or model.safetensors.index.json",
            });
        }
        let tensors = read_file(&single)?;
        Ok(Weights {
            tensors,
            listing: single,
            n_files: 1,
        })
    }

    fn read_sharded(dir: &Path, index: &Path) -> Result<Weights> {
        let Some(Value::Object(map)) = read_json(index)?.get("weight_map").cloned() else {
            return Err(ModelFileError::Key {
                path: index.to_path_buf(),
                key: "weight_map".into(),
                expected: "an object mapping tensor names to shard files".into(),
                found: "something else".into(),
            });
        };
        let mut by_shard: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (tensor, shard) in map {
            let Value::String(shard) = shard else {
                return Err(ModelFileError::Key {
                    path: index.to_path_buf(),
                    key: format!("weight_map.{tensor}"),
                    expected: "a shard file name".into(),
                    found: shard.to_string(),
                });
            };
            by_shard.entry(shard).or_default().push(tensor);
        }
        let mut tensors = HashMap::new();
        for (shard, names) in &by_shard {
            let path = dir.join(shard);
            if Path::new(shard).components().count() != 1 || !path.is_file() {
                return Err(ModelFileError::MissingFile {
                    path,
                    what: "a shard listed in model.safetensors.index.json",
                });
            }
            let mut in_shard = read_file(&path)?;
            for name in names {
                let t = in_shard
                    .remove(name)
                    .ok_or_else(|| ModelFileError::MissingTensor {
                        path: path.clone(),
                        tensor: name.clone(),
                    })?;
                tensors.insert(name.clone(), t);
            }
        }
        Ok(Weights {
            tensors,
            listing: index.to_path_buf(),
            n_files: by_shard.len(),
        })
    }
}

/// Maps `path` and lists its tensors.
fn read_file(path: &Path) -> Result<HashMap<String, SourceTensor>> {
    let io = |source| ModelFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    // SAFETY: read-only mapping; as with any mmap-based loader we assume the file is not
    // truncated or modified while the worker runs.
    let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(io)?);
    let (header_len, metadata) =
        SafeTensors::read_metadata(&map[..]).map_err(|e| ModelFileError::Safetensors {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    let data_start = 8 + header_len;
    let mut out = HashMap::new();
    for (name, info) in metadata.tensors() {
        let dtype = match info.dtype {
            Dtype::F32 => GgmlType::F32,
            Dtype::F16 => GgmlType::F16,
            Dtype::BF16 => GgmlType::BF16,
            other => {
                return Err(ModelFileError::UnsupportedDtype {
                    path: path.to_path_buf(),
                    tensor: name,
                    dtype: format!("{other:?}"),
                })
            }
        };
        let (start, end) = info.data_offsets;
        // safetensors checked that the offsets cover the data section exactly.
        let bytes = MappedBytes::new(map.clone(), data_start + start..data_start + end)
            .ok_or_else(|| ModelFileError::Safetensors {
                path: path.to_path_buf(),
                message: format!("tensor `{name}`: data past the end of the file"),
            })?;
        out.insert(
            name,
            SourceTensor {
                file: path.to_path_buf(),
                dtype,
                shape: info.shape.clone(),
                data: TensorData::Mapped(bytes),
            },
        );
    }
    Ok(out)
}
