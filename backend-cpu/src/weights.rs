//! Model weights, kept in memory in the GGUF file's own formats (for
//! SmolLM2-135M Q4_1: Q4_1 matrices, Q8_0 token embeddings / tied LM head,
//! F32 norms; about 100 MB instead of ~540 MB of f32). Matrices are
//! [`QMatrix`]es decoded tile by tile inside [`super::matmul`]; norm vectors
//! are dequantized to f32.
//!
//! Matrices whose bytes the source holds unmodified in a memory map (every tensor of a GGUF file,
//! the tensors of a Hugging Face folder used as stored) are not copied: the [`QMatrix`] borrows
//! them from the map, so loading reads no weight data, the weights live in the page cache
//! (shared, loaded on first use) and the map stays open as long as the weights. The model file must
//! therefore not be truncated or overwritten in place while the worker runs (replace it by
//! renaming a new file over it). F32 matrices and tensors the source converted are copied.
//!
//! Which tensors a model needs, their names, shapes and grouping are the shared loader's
//! ([`model_desc::ModelWeights::load`]); this module only turns each matrix it finds into a
//! [`QMatrix`].
//!
//! RoPE layout (`llama` only; the other architectures keep Hugging Face's
//! half-split order, see [`model_desc::RopeStyle`]): llama.cpp's converter permutes the rows of `attn_q` / `attn_k`
//! so that each head's rotation pairs are *adjacent* dimensions
//! `(2i, 2i+1)` instead of Hugging Face's half-split `(i, i + head_dim/2)`.
//! We keep the rows as stored and apply RoPE in the adjacent-pair form (see
//! [`super::ops::RopeTable::apply`]); since Q and K are permuted identically, the
//! attention scores equal the Hugging Face model's.

use super::kernels::QMatrix;
use engine::backend::ModelError;
use model_desc::{MatrixTensor, ModelDesc, ModelSource};

/// All weights of a model on the CPU: matrices as [`QMatrix`]es in their file formats (Q/K/V and
/// gate/up as parts of one matrix, multiplied together by [`super::matmul::matmul`]), norms and
/// biases as f32.
pub type ModelWeights = model_desc::ModelWeights<QMatrix>;

/// One transformer block's weights on the CPU (see [`ModelWeights`]).
pub type LayerWeights = model_desc::LayerWeights<QMatrix>;

/// Loads every tensor `desc` needs from `src` through the shared loader, norms and biases as f32,
/// matrices in their file format: borrowed from the source's memory map when it holds them as
/// stored (every tensor of a GGUF file but F32 ones, which are converted; the map stays open as
/// long as the weights, so the file must not be overwritten in place meanwhile), else copied.
///
/// Errors: [`ModelError::Arch`] for a missing tensor or one of the wrong dims (naming the tensor),
/// an unreadable source or an undecodable vector; [`ModelError::InvalidConfig`] for rows that are
/// not whole blocks or a matrix type the CPU does not decode.
pub fn load_weights(src: &dyn ModelSource, desc: &ModelDesc) -> Result<ModelWeights, ModelError> {
    ModelWeights::load(src, desc, qmatrix)
}

/// `t` as a row-major `[rows, cols]` [`QMatrix`] in the file's format: borrowed from the source's
/// memory map when it has one for the tensor ([`arch::SourceTensor::mapped`]), else copied.
fn qmatrix(t: MatrixTensor<'_>) -> Result<QMatrix, ModelError> {
    let (name, rows, cols, dtype) = (&t.name, t.rows, t.cols, t.tensor.dtype);
    let block = dtype.block_size().unwrap_or(1);
    if !cols.is_multiple_of(block) {
        return Err(ModelError::InvalidConfig(format!(
            "tensor `{name}`: row length {cols} is not a multiple of the {dtype} block size {block}"
        )));
    }
    match t.tensor.mapped {
        Some(mapped) => QMatrix::from_mapped(dtype, rows, cols, mapped),
        None => QMatrix::from_bytes(dtype, rows, cols, &t.tensor.bytes),
    }
    .map_err(|e| ModelError::InvalidConfig(format!("tensor `{name}`: {e}")))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use gguf::GgufFile;

    use super::*;
    use model_desc::{ArchError, SourceTensor};

    /// A source that answers as `file` does, except that `hide` is absent and `reshape` has
    /// other dims (the bytes are then checked against the declared shape first).
    struct Altered<'a> {
        file: &'a GgufFile,
        hide: &'a str,
        reshape: Option<(&'a str, Vec<u64>)>,
    }

    impl ModelSource for Altered<'_> {
        fn meta_str(&self, key: &str) -> Result<Option<String>, ArchError> {
            self.file.meta_str(key)
        }
        fn meta_u32(&self, key: &str) -> Result<Option<u32>, ArchError> {
            self.file.meta_u32(key)
        }
        fn meta_f32(&self, key: &str) -> Result<Option<f32>, ArchError> {
            self.file.meta_f32(key)
        }
        fn meta_array_len(&self, key: &str) -> Result<Option<usize>, ArchError> {
            self.file.meta_array_len(key)
        }
        fn tensor(&self, name: &str) -> Result<Option<SourceTensor<'_>>, ArchError> {
            if name == self.hide {
                return Ok(None);
            }
            let mut t = ModelSource::tensor(self.file, name)?;
            if let (Some(t), Some((n, dims))) = (&mut t, &self.reshape) {
                if *n == name {
                    t.dims = dims.clone();
                }
            }
            Ok(t)
        }
        fn has_tensor(&self, name: &str) -> bool {
            name != self.hide && self.file.has_tensor(name)
        }
    }

    fn open(arch: &str) -> GgufFile {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/tiny-arch")
            .join(arch)
            .join(format!("{arch}-f32.gguf"));
        GgufFile::open(&path).unwrap()
    }

    fn load_error(arch: &str, hide: &str, reshape: Option<(&str, Vec<u64>)>) -> String {
        let file = open(arch);
        let src = Altered {
            file: &file,
            hide,
            reshape,
        };
        let desc = ModelDesc::from_source(&src).unwrap();
        load_weights(&src, &desc).unwrap_err().to_string()
    }

    #[test]
    fn every_architecture_tensor_is_required_by_name() {
        for (arch, tensor) in [
            ("qwen2", "blk.1.attn_k.bias"),
            ("qwen3", "blk.2.attn_q_norm.weight"),
            ("gemma2", "blk.0.post_ffw_norm.weight"),
            ("gemma2", "blk.3.post_attention_norm.weight"),
            ("phi3", "blk.1.attn_qkv.weight"),
            ("llama3rope", "blk.0.ffn_gate.weight"),
        ] {
            let err = load_error(arch, tensor, None);
            assert_eq!(err, format!("missing tensor `{tensor}`"), "{arch}");
        }
    }

    #[test]
    fn shapes_are_checked_against_the_description() {
        // Phi-3's fused gate|up must hold 2 × 160 rows.
        let err = load_error("phi3", "", Some(("blk.0.ffn_up.weight", vec![64, 160])));
        assert_eq!(
            err,
            "tensor `blk.0.ffn_up.weight` has dims [64, 160], expected [64, 320]"
        );
        // Qwen 3's per-head norm is head_dim (32) wide, not hidden / heads (16).
        let err = load_error("qwen3", "", Some(("blk.1.attn_k_norm.weight", vec![16])));
        assert!(err.contains("expected [32]"), "{err}");
        let err = load_error("qwen2", "", Some(("blk.0.attn_v.bias", vec![64])));
        assert!(err.contains("`blk.0.attn_v.bias`"), "{err}");
    }

    #[test]
    fn tied_and_untied_heads() {
        for (arch, untied) in [("qwen2", true), ("qwen3", false), ("gemma2", false)] {
            let file = open(arch);
            let desc = ModelDesc::from_source(&file).unwrap();
            let w = load_weights(&file, &desc).unwrap();
            assert_eq!(w.output.is_some(), untied, "{arch}");
            assert_eq!(w.lm_head().rows(), 384);
        }
    }

    /// A matrix of a GGUF file borrows its rows from the file's memory map (no copy; the map
    /// outlives the file handle) and multiplies bitwise like a heap copy of the same bytes, on every
    /// path, for every format; tensors start at odd offsets (`general.alignment` 1), so nothing may
    /// assume aligned rows. F32 matrices are converted to floats as before.
    #[test]
    fn gguf_matrices_borrow_the_mapped_file_and_multiply_like_copies() {
        use crate::kernels::SERVED_FORMATS;
        use crate::matmul::matmul_with;
        use crate::SimdPath;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mapped.gguf");
        let mut w = gguf::GgufWriter::new();
        w.add_u32("general.alignment", 1);
        let shape = |format: gguf::GgmlType| match format.block_size() {
            Some(256) => (7, 512),
            _ => (9, 96),
        };
        for (i, format) in SERVED_FORMATS.into_iter().enumerate() {
            let (rows, cols) = shape(format);
            let bytes = gguf::testing::random_encoding(format, rows * cols, 40 + i as u64);
            w.add_tensor_raw(
                &format.to_string(),
                &[cols as u64, rows as u64],
                format,
                bytes,
            )
            .unwrap();
        }
        w.write(&path).unwrap();

        let file = GgufFile::open(&path).unwrap();
        let mut odd_starts = 0;
        let loaded: Vec<(QMatrix, QMatrix)> = SERVED_FORMATS
            .into_iter()
            .map(|format| {
                let (rows, cols) = shape(format);
                let name = format.to_string();
                let m = qmatrix(MatrixTensor::find(&file, &name, rows, cols).unwrap()).unwrap();
                let info = file.tensor(&name).unwrap();
                let bytes = file.tensor_bytes(info).unwrap();
                let copy = QMatrix::from_bytes(format, rows, cols, bytes).unwrap();
                assert_eq!(m.is_mapped(), format != gguf::GgmlType::F32, "{name}");
                if m.is_mapped() {
                    let map = file.tensor_mapped(info).unwrap().unwrap();
                    let in_map = map.map().as_ptr_range();
                    let rows_at = m.rows_encoded(0, rows).as_ptr_range();
                    assert_eq!(rows_at, bytes.as_ptr_range(), "{name}");
                    assert!(in_map.start <= rows_at.start && rows_at.end <= in_map.end);
                    assert_eq!(m.clone().row_encoded(1).as_ptr(), m.row_encoded(1).as_ptr());
                    assert_ne!(copy.row_encoded(0).as_ptr(), m.row_encoded(0).as_ptr());
                    odd_starts += usize::from(rows_at.start as usize % 2 == 1);
                }
                assert_eq!(m.size_bytes(), copy.size_bytes());
                (m, copy)
            })
            .collect();
        assert!(odd_starts > 0, "no tensor starts at an odd address");
        drop(file);

        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for (mapped, copy) in &loaded {
            let (rows, k) = (mapped.rows(), mapped.cols());
            let (mut a, mut b) = (vec![0.0; rows * k], vec![1.0; rows * k]);
            for path in SimdPath::available() {
                mapped.dequantize_rows_with(path, 0, &mut a);
                copy.dequantize_rows_with(path, 0, &mut b);
                assert_eq!(bits(&a), bits(&b), "{} {path:?}", mapped.format());
                for n in [1, 3, 70] {
                    let x: Vec<f32> = (0..n * k).map(|i| (i % 13) as f32 * 0.25 - 1.5).collect();
                    let y = matmul_with(path, &x, n, k, std::slice::from_ref(mapped));
                    let want = matmul_with(path, &x, n, k, std::slice::from_ref(copy));
                    assert_eq!(bits(&y), bits(&want), "{} {path:?} n={n}", mapped.format());
                }
            }
        }
    }
}
