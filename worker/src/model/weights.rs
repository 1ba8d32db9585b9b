//! Model weights, kept in memory in the GGUF file's own formats (for
//! SmolLM2-135M Q4_1: Q4_1 matrices, Q8_0 token embeddings / tied LM head,
//! F32 norms; about 100 MB instead of ~540 MB of f32). Matrices are
//! [`QMatrix`]es decoded tile by tile inside [`super::matmul`]; norm vectors
//! are dequantized to f32.
//!
//! Tensor names and GGUF shapes follow llama.cpp's llama layout
//! (`token_embd`, `blk.N.attn_{norm,q,k,v,output}`, `blk.N.ffn_{norm,gate,up,down}`,
//! `output_norm`, optional `output`). A GGUF matrix with dims `[in, out]` is a
//! row-major `[out, in]` matrix: row `o` holds the `in` weights of output `o`.
//!
//! RoPE layout: llama.cpp's converter permutes the rows of `attn_q` / `attn_k`
//! so that each head's rotation pairs are *adjacent* dimensions
//! `(2i, 2i+1)` instead of Hugging Face's half-split `(i, i + head_dim/2)`.
//! We keep the rows as stored and apply RoPE in the adjacent-pair form (see
//! [`super::ops::RopeTable::apply`]); since Q and K are permuted identically, the
//! attention scores equal the Hugging Face model's.

use gguf::{GgufFile, TensorInfo};

use super::kernels::QMatrix;
use super::ModelError;
use crate::arch::ModelDesc;

/// A weight matrix `[rows, cols]` made of one or more [`QMatrix`] parts
/// stacked by rows (e.g. Q, K and V), each in its own file format.
#[derive(Debug, Clone)]
pub struct Matrix {
    /// The parts, all `cols` wide, in row order.
    pub parts: Vec<QMatrix>,
}

impl Matrix {
    /// Total rows (output features) over all parts.
    pub fn rows(&self) -> usize {
        self.parts.iter().map(QMatrix::rows).sum()
    }

    /// Columns (input features).
    pub fn cols(&self) -> usize {
        self.parts[0].cols()
    }

    /// Bytes held in memory.
    pub fn size_bytes(&self) -> usize {
        self.parts.iter().map(QMatrix::size_bytes).sum()
    }

    /// Decodes row `r` into `out[..cols]` (exactly the reference dequantized values).
    ///
    /// Panics if `r >= self.rows()` or `out` is shorter than a row.
    pub fn row_into(&self, mut r: usize, out: &mut [f32]) {
        let cols = self.cols();
        for p in &self.parts {
            if r < p.rows() {
                p.dequantize_rows(r, &mut out[..cols]);
                return;
            }
            r -= p.rows();
        }
        panic!("Matrix::row_into: row out of range");
    }

    fn single(m: QMatrix) -> Matrix {
        Matrix { parts: vec![m] }
    }
}

/// Weights of one transformer block.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// RMSNorm weight before attention, `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// Q, K and V projections stacked: `[q_dim + 2 * kv_dim, hidden]`
    /// (rows `0..q_dim` are Q, then K, then V; Q/K rows in GGUF's RoPE order).
    pub wqkv: Matrix,
    /// Attention output projection, `[hidden, q_dim]`.
    pub wo: Matrix,
    /// RMSNorm weight before the FFN, `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// Gate and up projections stacked: `[2 * ffn_dim, hidden]` (gate rows first).
    pub w_gate_up: Matrix,
    /// Down projection, `[hidden, ffn_dim]`.
    pub w_down: Matrix,
}

/// All weights of a llama model.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// Token embeddings, `[vocab_size, hidden]`.
    pub token_embd: Matrix,
    /// Transformer blocks in order.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm weight, `[hidden]`.
    pub output_norm: Vec<f32>,
    /// LM head `[vocab_size, hidden]`; `None` when tied to `token_embd`
    /// (no `output.weight` in the file).
    pub output: Option<Matrix>,
}

impl ModelWeights {
    /// The LM head: `output` if present, else the tied token embeddings.
    pub fn lm_head(&self) -> &Matrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Loads every tensor of `file` (matrices in their file format, norms as f32), checking shapes against `config`.
    ///
    /// Errors: [`ModelError::MissingTensor`], [`ModelError::TensorShape`], and
    /// [`ModelError::Gguf`] for unsupported types or out-of-bounds data.
    pub fn load(file: &GgufFile, config: &ModelDesc) -> Result<ModelWeights, ModelError> {
        let c = config;
        let (h, f) = (c.hidden as u64, c.ffn_dim as u64);
        let (q, kv) = (c.q_dim() as u64, c.kv_dim() as u64);
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            let name = |s: &str| format!("blk.{l}.{s}.weight");
            layers.push(LayerWeights {
                attn_norm: vector(file, &name("attn_norm"), h)?,
                wqkv: Matrix {
                    parts: vec![
                        matrix(file, &name("attn_q"), h, q)?,
                        matrix(file, &name("attn_k"), h, kv)?,
                        matrix(file, &name("attn_v"), h, kv)?,
                    ],
                },
                wo: Matrix::single(matrix(file, &name("attn_output"), q, h)?),
                ffn_norm: vector(file, &name("ffn_norm"), h)?,
                w_gate_up: Matrix {
                    parts: vec![
                        matrix(file, &name("ffn_gate"), h, f)?,
                        matrix(file, &name("ffn_up"), h, f)?,
                    ],
                },
                w_down: Matrix::single(matrix(file, &name("ffn_down"), f, h)?),
            });
        }
        let vocab = c.vocab_size as u64;
        let output = match file.tensor("output.weight") {
            Some(_) => Some(Matrix::single(matrix(file, "output.weight", h, vocab)?)),
            None => None,
        };
        Ok(ModelWeights {
            token_embd: Matrix::single(matrix(file, "token_embd.weight", h, vocab)?),
            layers,
            output_norm: vector(file, "output_norm.weight", h)?,
            output,
        })
    }
}

fn find<'a>(file: &'a GgufFile, name: &str, dims: &[u64]) -> Result<&'a TensorInfo, ModelError> {
    let info = file
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
    if info.dims != dims {
        return Err(ModelError::TensorShape {
            name: name.to_string(),
            expected: dims.to_vec(),
            found: info.dims.clone(),
        });
    }
    Ok(info)
}

/// Loads a GGUF `[cols, rows]` tensor as a row-major `[rows, cols]`
/// [`QMatrix`] in the file's format (bytes copied out of the mapping).
fn matrix(file: &GgufFile, name: &str, cols: u64, rows: u64) -> Result<QMatrix, ModelError> {
    let info = find(file, name, &[cols, rows])?;
    let bytes = file.tensor_bytes(info)?;
    let (rows, cols) = (rows as usize, cols as usize);
    let block = info.dtype.block_size().unwrap_or(1);
    if !cols.is_multiple_of(block) {
        return Err(ModelError::InvalidConfig(format!(
            "tensor `{name}`: row length {cols} is not a multiple of the {} block size {block}",
            info.dtype
        )));
    }
    QMatrix::from_bytes(info.dtype, rows, cols, bytes)
        .map_err(|e| ModelError::InvalidConfig(format!("tensor `{name}`: {e}")))
}

fn vector(file: &GgufFile, name: &str, len: u64) -> Result<Vec<f32>, ModelError> {
    let info = find(file, name, &[len])?;
    Ok(gguf::dequantize_to_vec(
        info.dtype,
        file.tensor_bytes(info)?,
        len as usize,
    )?)
}
