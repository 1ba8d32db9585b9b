//! Hugging Face model folders presented as GGUF models.
//!
//! A folder holds `config.json`, the weights (`model.safetensors`, or shards listed by
//! `model.safetensors.index.json`) in F32, F16 or BF16, and the tokenizer (`tokenizer.json`
//! and/or `tokenizer.model`, with `tokenizer_config.json`). [`open_folder`] turns it into the
//! [`GgufFile`] that llama.cpp's `convert_hf_to_gguf.py` would have written (without
//! re-encoding the weights): the same metadata keys and values, the same tensor names, shapes
//! and values. Tensors that need no change borrow the memory-mapped safetensors bytes in their
//! stored dtype; the llama Q/K projections (row permutation), Gemma's norm weights (`1 + w`,
//! f32) and the llama3 RoPE factors (`rope_freqs.weight`, f32) are computed.
//!
//! Every check that involves the folder is made here, with errors naming the file, the key or
//! tensor and what was expected: a missing `config.json` or shard, an unsupported `model_type`
//! or dtype, a missing tensor, a shape that disagrees with `config.json`.

mod arch;
pub(crate) mod config;
mod convert;
mod sentencepiece;
mod shards;
mod tokenizer;

use std::path::Path;

use gguf::{AssembledTensor, GgmlType, GgufFile, MetadataValue, TensorData};

pub use arch::Arch;
use arch::{Dims, Transform};
pub use config::HfConfig;
use shards::{SourceTensor, Weights};

use crate::error::{ModelFileError, Result};

/// Name prefixes under which checkpoints store the language model's tensors (plain causal LMs;
/// Gemma 3's multimodal checkpoints, old and new layout).
const BODY_PREFIXES: [&str; 3] = ["model.", "language_model.model.", "model.language_model."];
/// Prefixes of the output projection.
const HEAD_PREFIXES: [&str; 2] = ["", "language_model."];

/// Opens the Hugging Face model folder `dir` (see the [module docs](self)).
///
/// Errors: [`ModelFileError`] naming the file and the key or tensor at fault.
pub fn open_folder(dir: &Path) -> Result<GgufFile> {
    let config = HfConfig::read(dir)?;
    let arch = Arch::of(&config)?;
    let dims = Dims::read(arch, &config)?;
    let rope = config.rope()?;
    let tokenizer = tokenizer::read(dir, arch, &config, dims.vocab)?;
    let weights = Weights::read(dir)?;

    let mut metadata = vec![
        (
            "general.architecture".to_string(),
            MetadataValue::String(arch.name().into()),
        ),
        (
            "general.name".to_string(),
            MetadataValue::String(
                dir.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
        ),
    ];
    metadata.extend(arch::metadata(arch, &config, &dims, &rope)?);
    metadata.extend(tokenizer.metadata);

    let mut tensors = Vec::new();
    if let Some(factors) = rope_factors(arch, &dims, &rope)? {
        tensors.push(AssembledTensor {
            name: "rope_freqs.weight".into(),
            dims: vec![factors.len() as u64],
            dtype: GgmlType::F32,
            data: TensorData::Owned(convert::f32_bytes(&factors)),
        });
    }
    if let (Some(long), Some(short)) = (&rope.long_factor, &rope.short_factor) {
        for (name, factors) in [("rope_factors_long", long), ("rope_factors_short", short)] {
            tensors.push(AssembledTensor {
                name: format!("{name}.weight"),
                dims: vec![factors.len() as u64],
                dtype: GgmlType::F32,
                data: TensorData::Owned(convert::f32_bytes(factors)),
            });
        }
    }
    let mut dtypes = std::collections::BTreeSet::new();
    for spec in arch::tensor_specs(arch, &config, &dims)? {
        let (hf_name, source) = find(&weights, &spec.hf)?;
        if source.shape != spec.shape {
            return Err(ModelFileError::TensorShape {
                path: source.file.clone(),
                tensor: hf_name,
                expected: spec.shape,
                found: source.shape.clone(),
                why: format!("from config.json: {}", spec.why),
            });
        }
        dtypes.insert(source.dtype.to_string());
        let bytes = source.data.bytes();
        let (dtype, data) = match spec.transform {
            Transform::None => (source.dtype, source.data.clone()),
            Transform::AddOne => (
                GgmlType::F32,
                TensorData::Owned(convert::add_one(source.dtype, bytes)?),
            ),
            Transform::Permute(n_head) => {
                let row_bytes = bytes.len() / spec.shape[0];
                (
                    source.dtype,
                    TensorData::Owned(convert::permute_rows(bytes, row_bytes, n_head)),
                )
            }
        };
        tensors.push(AssembledTensor {
            name: spec.gguf,
            dims: spec.shape.iter().rev().map(|&n| n as u64).collect(),
            dtype,
            data,
        });
    }
    let origin = format!(
        "Hugging Face folder: {} ({} safetensors file{}, {}), tokenizer from {}",
        arch.name(),
        weights.n_files,
        if weights.n_files == 1 { "" } else { "s" },
        dtypes.into_iter().collect::<Vec<_>>().join("/"),
        tokenizer
            .source
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    Ok(GgufFile::assemble(
        dir.to_path_buf(),
        origin,
        metadata,
        tensors,
    )?)
}

/// The tensor `name` (without prefix) under one of the known prefixes.
/// Errors: `MissingTensor` naming the file that lists the weights and the usual full name.
fn find<'a>(weights: &'a Weights, name: &str) -> Result<(String, &'a SourceTensor)> {
    let prefixes: &[&str] = match name.starts_with("lm_head.") {
        true => &HEAD_PREFIXES,
        false => &BODY_PREFIXES,
    };
    for prefix in prefixes {
        let full = format!("{prefix}{name}");
        if let Some(t) = weights.tensors.get(&full) {
            return Ok((full, t));
        }
    }
    Err(ModelFileError::MissingTensor {
        path: weights.listing.clone(),
        tensor: format!("{}{name}", prefixes[0]),
    })
}

/// `rope_freqs.weight` for llama3 RoPE scaling (llama only, as in the converter).
/// Absent parameters take the converter's defaults (factor 8, 1, 4, 8192, base 10000).
fn rope_factors(arch: Arch, dims: &Dims, rope: &config::RopeParams) -> Result<Option<Vec<f32>>> {
    if arch != Arch::Llama || rope.rope_type.as_deref() != Some("llama3") {
        return Ok(None);
    }
    Ok(Some(convert::llama3_rope_factors(
        rope.theta.unwrap_or(10000.0),
        dims.head_dim,
        rope.factor.unwrap_or(8.0),
        rope.low_freq_factor.unwrap_or(1.0),
        rope.high_freq_factor.unwrap_or(4.0),
        rope.original_max_position_embeddings.unwrap_or(8192.0),
    )))
}

#[cfg(test)]
mod folder_tests;
#[cfg(test)]
mod tests;
