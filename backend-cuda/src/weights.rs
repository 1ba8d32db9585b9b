//! Weights on the GPU, in the file's own formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
//! F16, BF16, F32): each matrix part is uploaded as the GGUF tensor's bytes, unchanged (row `o` of a
//! `[rows, cols]` part is `row_bytes` bytes of consecutive blocks), and decoded inside the matrix
//! kernels. Norm vectors, biases and RoPE frequency factors are uploaded as f32.
//!
//! Which tensors a model needs, their names, shapes and grouping are the shared loader's
//! ([`model_desc::ModelWeights::load`], the CPU's too): Q/K/V and gate/up are parts of one logical
//! matrix (one kernel launch per part, each writing its column range of the fused output; Phi-3's
//! fused `attn_qkv` and gate|up `ffn_up` are one part each). This module only checks that the
//! kernels decode each matrix ([`HostWeights`], borrowing the source's bytes, straight from the
//! model file's memory map when it holds them as stored) and uploads them ([`GpuWeights`]).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use gguf::GgmlType;

use super::error::{driver, CudaError};
use engine::backend::ModelError;
use model_desc::{MatrixTensor, ModelDesc, ModelSource};

/// Elements each lane of the matrix kernels decodes at once (`CHUNK` in `kernels/common.cuh`): every
/// row width must be a multiple of it.
pub const CHUNK: usize = 8;

/// Bytes of one `cols`-wide row in `format` (the kernels' `row_bytes_of`): whole blocks of 32
/// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) or 256 (Q4_K, Q5_K, Q6_K) elements, or `cols` elements of 2 or 4
/// bytes. `None` for a format without kernels, or a `cols` that is not a whole number of blocks and
/// of [`CHUNK`]s.
pub fn row_bytes(format: GgmlType, cols: usize) -> Option<usize> {
    format_suffix(format)?;
    let block = format.block_size()?;
    if cols == 0 || !cols.is_multiple_of(block) || !cols.is_multiple_of(CHUNK) {
        return None;
    }
    format.byte_size(cols as u64).map(|b| b as usize)
}

/// The kernel-name suffix of `format` (`gemv_<suffix>`, `gemm_<suffix>`); `None` for a type the
/// kernels do not decode.
pub fn format_suffix(format: GgmlType) -> Option<&'static str> {
    Some(match format {
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::BF16 => "bf16",
        GgmlType::Q4_0 => "q4_0",
        GgmlType::Q4_1 => "q4_1",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::Q5_0 => "q5_0",
        GgmlType::Q5_1 => "q5_1",
        GgmlType::Q4_K => "q4_k",
        GgmlType::Q5_K => "q5_k",
        GgmlType::Q6_K => "q6_k",
        GgmlType::Unsupported(_) => return None,
    })
}

/// All weights of the model on the host, checked for the kernels and ready to upload: each matrix
/// part the source's bytes of a row-major `[rows, cols]` matrix (`rows * row_bytes(format, cols)`
/// bytes, as stored).
#[derive(Debug, Clone)]
pub struct HostWeights<'a> {
    /// The model's tensors, as the shared loader groups them.
    pub tensors: model_desc::ModelWeights<MatrixTensor<'a>>,
    /// RoPE frequency divisors, `[head_dim / 2]`: `rope_freqs.weight` (Llama 3), else all ones
    /// (the `rope` kernel always divides; `x / 1.0 == x`).
    pub rope_factors: Vec<f32>,
}

impl<'a> HostWeights<'a> {
    /// Reads every tensor of `src` for `config` through the shared loader.
    ///
    /// Errors: [`ModelError::Arch`] for a missing tensor or one of the wrong dims (naming it) or an
    /// unreadable source, and [`ModelError::InvalidConfig`] for a format the kernels do not decode
    /// or rows that are not whole blocks.
    pub fn load(
        src: &'a dyn ModelSource,
        config: &ModelDesc,
    ) -> Result<HostWeights<'a>, ModelError> {
        Ok(HostWeights {
            tensors: model_desc::ModelWeights::load(src, config, checked_part)?,
            rope_factors: config
                .rope_freq_factors
                .clone()
                .unwrap_or_else(|| vec![1.0; config.head_dim / 2]),
        })
    }

    /// Bytes the weights take on the GPU.
    pub fn device_bytes(&self) -> usize {
        let (matrices, vectors) = self.tensors.tensors();
        let floats = vectors.iter().map(|v| v.len()).sum::<usize>() + self.rope_factors.len();
        matrices.iter().map(|p| p.tensor.bytes.len()).sum::<usize>() + floats * 4
    }
}

/// `t` if the matrix kernels decode it: a format with kernels, whole blocks per row, and the
/// bytes of `[rows, cols]`.
fn checked_part(t: MatrixTensor<'_>) -> Result<MatrixTensor<'_>, ModelError> {
    let (name, rows, cols, format) = (&t.name, t.rows, t.cols, t.tensor.dtype);
    let rb = row_bytes(format, cols).ok_or_else(|| {
        ModelError::InvalidConfig(format!(
            "tensor `{name}`: {format} rows of {cols} cannot run on the CUDA backend"
        ))
    })?;
    let len = t.tensor.bytes.len();
    if len != rows * rb {
        return Err(ModelError::InvalidConfig(format!(
            "tensor `{name}`: {len} bytes for [{rows}, {cols}] {format}"
        )));
    }
    Ok(t)
}

/// A matrix part on the GPU.
#[derive(Debug)]
pub struct GpuPart {
    /// Storage format.
    pub format: GgmlType,
    /// GGML type id passed to the kernels.
    pub format_id: i32,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// The file's bytes.
    pub data: CudaSlice<u8>,
}

/// All weights on the GPU.
#[derive(Debug)]
pub struct GpuWeights {
    /// The model's tensors: matrix parts, and norms and biases as f32.
    pub tensors: model_desc::ModelWeights<GpuPart, CudaSlice<f32>>,
    /// RoPE frequency divisors, `[head_dim / 2]` f32 (ones when the model has none).
    pub rope_factors: CudaSlice<f32>,
}

impl GpuWeights {
    /// Uploads `host` on `stream` (synchronously).
    ///
    /// Errors: [`CudaError::Driver`] (e.g. out of memory), naming the tensor when it is a matrix.
    pub fn upload(host: &HostWeights, stream: &Arc<CudaStream>) -> Result<GpuWeights, CudaError> {
        let up = |p: &MatrixTensor| -> Result<GpuPart, CudaError> {
            let format = p.tensor.dtype;
            Ok(GpuPart {
                format,
                format_id: format.id() as i32,
                rows: p.rows,
                cols: p.cols,
                data: driver(
                    &format!("uploading {}", p.name),
                    stream.clone_htod(&p.tensor.bytes[..]),
                )?,
            })
        };
        let vec = |v: &Vec<f32>| {
            driver(
                "uploading a norm, bias or RoPE factors",
                stream.clone_htod(v.as_slice()),
            )
        };
        let w = GpuWeights {
            tensors: host.tensors.try_map(up, vec)?,
            rope_factors: vec(&host.rope_factors)?,
        };
        driver("uploading the weights", stream.synchronize())?;
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use gguf::GgufFile;

    use super::*;
    use model_desc::Projections;

    #[test]
    fn row_sizes_and_kernel_names() {
        assert_eq!(row_bytes(GgmlType::Q4_1, 576), Some(18 * 20));
        assert_eq!(row_bytes(GgmlType::Q8_0, 64), Some(68));
        assert_eq!(row_bytes(GgmlType::Q4_0, 32), Some(18));
        assert_eq!(row_bytes(GgmlType::F16, 8), Some(16));
        assert_eq!(row_bytes(GgmlType::BF16, 8), Some(16));
        assert_eq!(row_bytes(GgmlType::F32, 8), Some(32));
        assert_eq!(row_bytes(GgmlType::Q8_0, 40), None);
        assert_eq!(row_bytes(GgmlType::Unsupported(16), 256), None);
        // The 5-bit formats: 32-element blocks of 22 / 24 bytes.
        assert_eq!(row_bytes(GgmlType::Q5_0, 640), Some(20 * 22));
        assert_eq!(row_bytes(GgmlType::Q5_1, 64), Some(48));
        assert_eq!(row_bytes(GgmlType::Q5_0, 48), None);
        // The k-quants: 256-element super-blocks, so a 32-multiple is not enough.
        assert_eq!(row_bytes(GgmlType::Q4_K, 2048), Some(8 * 144));
        assert_eq!(row_bytes(GgmlType::Q5_K, 256), Some(176));
        assert_eq!(row_bytes(GgmlType::Q6_K, 512), Some(420));
        for k in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            assert_eq!(row_bytes(k, 640), None, "{k}");
            assert_eq!(row_bytes(k, 0), None, "{k}");
        }
        // Plain types still need whole chunks of 8 (one lane's unit of work).
        assert_eq!(row_bytes(GgmlType::F32, 12), None);
        assert_eq!(format_suffix(GgmlType::Q4_1), Some("q4_1"));
        assert_eq!(format_suffix(GgmlType::Q6_K), Some("q6_k"));
        assert_eq!(format_suffix(GgmlType::Unsupported(16)), None);
    }

    /// Every format with a suffix has a GEMV and a GEMM kernel in the kernel list, and the row size
    /// agrees with the GGUF type's own block arithmetic at a width every format accepts.
    #[test]
    fn every_format_has_kernels_and_consistent_rows() {
        let formats = [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ];
        for f in formats {
            let suffix = format_suffix(f).unwrap();
            for prefix in ["gemv", "gemm"] {
                let name = format!("{prefix}_{suffix}");
                assert!(
                    crate::kernels::KernelFile::containing(&name).is_some(),
                    "{name} is not in the kernel list"
                );
            }
            let bpb = f.bytes_per_block().unwrap();
            let bs = f.block_size().unwrap();
            assert_eq!(row_bytes(f, 768), Some(768 / bs * bpb), "{f}");
        }
    }

    #[test]
    fn loads_the_tiny_model_as_parts_in_file_formats() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        gguf::testing::write_tiny_llama(&path, 1).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let config = ModelDesc::from_source(&file).unwrap();
        let w = HostWeights::load(&file, &config).unwrap();
        assert_eq!(w.tensors.layers.len(), config.n_layers);
        let l = &w.tensors.layers[0];
        let rows: Vec<usize> = l.wqkv.iter().map(|p| p.rows).collect();
        assert_eq!(rows, [config.q_dim(), config.kv_dim(), config.kv_dim()]);
        assert_eq!(l.w_gate_up[1].rows, config.ffn_dim);
        assert_eq!(
            (l.w_down.rows, l.w_down.cols),
            (config.hidden, config.ffn_dim)
        );
        for p in l.wqkv.iter().chain(&l.w_gate_up).chain([&l.wo, &l.w_down]) {
            let info = file.tensor(&p.name).unwrap();
            assert_eq!(p.tensor.dtype, info.dtype);
            let bytes = file.tensor_bytes(info).unwrap();
            assert_eq!(&p.tensor.bytes[..], bytes);
            assert_eq!(p.tensor.bytes.as_ptr(), bytes.as_ptr());
            let mapped = p.tensor.mapped.as_ref().map(|m| m.as_ptr());
            assert_eq!(mapped, Some(bytes.as_ptr()));
            assert_eq!(
                p.tensor.bytes.len(),
                p.rows * row_bytes(p.tensor.dtype, p.cols).unwrap()
            );
        }
        assert_eq!(w.tensors.token_embd.rows, config.vocab_size);
        assert!(w.device_bytes() > w.tensors.token_embd.tensor.bytes.len());
        assert_eq!(w.rope_factors, vec![1.0; config.head_dim / 2]);
        assert!(l.qkv_bias.is_none() && l.qk_norm.is_none() && l.post_attn_norm.is_none());
    }

    /// Loads `path` and checks that every per-architecture tensor the description asks for is
    /// there with its shape, and that the projections are parts covering the fused widths.
    fn check_arch_file(path: &std::path::Path) -> ModelDesc {
        let file = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let c = ModelDesc::from_source(&file).unwrap();
        let w = HostWeights::load(&file, &c).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let width = c.q_dim() + 2 * c.kv_dim();
        for l in &w.tensors.layers {
            assert_eq!(l.wqkv.iter().map(|p| p.rows).sum::<usize>(), width);
            assert_eq!(
                l.w_gate_up.iter().map(|p| p.rows).sum::<usize>(),
                2 * c.ffn_dim
            );
            let parts = if c.projections == Projections::Fused {
                1
            } else {
                3
            };
            assert_eq!(l.wqkv.len(), parts);
            assert_eq!(
                l.qkv_bias.as_ref().map(Vec::len),
                c.qkv_bias.then_some(width)
            );
            let norms = l.qk_norm.as_ref().map(|(q, k)| (q.len(), k.len()));
            assert_eq!(norms, c.qk_norm.then_some((c.head_dim, c.head_dim)));
            let post = c.post_norms.then_some(c.hidden);
            assert_eq!(l.post_attn_norm.as_ref().map(Vec::len), post);
            assert_eq!(l.post_ffn_norm.as_ref().map(Vec::len), post);
            for p in l.wqkv.iter().chain(&l.w_gate_up).chain([&l.wo, &l.w_down]) {
                assert_eq!(
                    p.tensor.bytes.len(),
                    p.rows * row_bytes(p.tensor.dtype, p.cols).unwrap()
                );
            }
        }
        let want = c
            .rope_freq_factors
            .clone()
            .unwrap_or(vec![1.0; c.head_dim / 2]);
        assert_eq!(w.rope_factors, want);
        c
    }

    /// Every tiny architecture of `fixtures/tiny-arch/` (qwen2 biases, qwen3 q/k norms, llama3
    /// RoPE factors, gemma2 post-norms, phi3 fused projections) loads for the GPU, F32 and BF16.
    #[test]
    fn loads_every_tiny_architecture() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-arch");
        let mut seen = Vec::new();
        for arch in ["qwen2", "qwen3", "llama3rope", "gemma2", "phi3"] {
            for dtype in ["f32", "bf16"] {
                let c = check_arch_file(&root.join(format!("{arch}/{arch}-{dtype}.gguf")));
                seen.push(c.options_summary());
            }
        }
        assert!(seen.iter().any(|s| s.contains("QKV biases")), "{seen:?}");
        assert!(seen.iter().any(|s| s.contains("fused QKV")), "{seen:?}");
        assert!(
            seen.iter().any(|s| s.contains("frequency factors")),
            "{seen:?}"
        );
    }

    /// Gemma 3 270M Q4_K_M (k-quants, Q5_0, Q8_0 and F32 tensors, q/k norms, post-norms) loads for
    /// the GPU in its file formats.
    #[test]
    fn loads_gemma3_270m_in_its_formats() {
        let path = gguf::testing::gemma3_model_path();
        assert!(
            path.is_file(),
            "{} not found: run scripts/fetch-model gemma3-270m",
            path.display()
        );
        let c = check_arch_file(&path);
        assert!(c.qk_norm && c.post_norms && c.embed_scale.is_some());
    }
}
