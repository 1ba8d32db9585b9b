//! Which tensors a layer of each architecture has, by GGUF name and shape: one description both
//! backends load from (the CPU into [`crate::backend::cpu::LayerWeights`], CUDA into its host weights).

use super::{ModelDesc, Projections};

/// One transformer block's tensors, matrices of type `M` (GGUF `[cols, rows]` read as row-major
/// `[rows, cols]`), norms and biases as f32.
#[derive(Debug, Clone)]
pub struct LayerTensors<M> {
    /// `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// Q, K, V parts (`[q_dim | kv_dim | kv_dim, hidden]`), or one fused part (Phi-3).
    pub wqkv: Vec<M>,
    /// Q, K and V biases stacked, `[q_dim + 2 * kv_dim]` (Qwen 2).
    pub qkv_bias: Option<Vec<f32>>,
    /// Per-head Q and K RMSNorm weights, `[head_dim]` each (Qwen 3, Gemma 3).
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// `[hidden, q_dim]`.
    pub wo: M,
    /// Norm of the attention output before its residual add, `[hidden]` (Gemma 2/3).
    pub post_attn_norm: Option<Vec<f32>>,
    /// `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// Gate and up parts (`[ffn | ffn, hidden]`), or one fused part (Phi-3).
    pub w_gate_up: Vec<M>,
    /// `[hidden, ffn]`.
    pub w_down: M,
    /// Norm of the feed-forward output before its residual add, `[hidden]` (Gemma 2/3).
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// Loads layer `l`'s tensors as `desc` lays them out: `matrix(name, cols, rows)` reads a GGUF
/// `[cols, rows]` matrix, `vector(name, len)` a `[len]` vector (both check the shape and name the
/// tensor in their errors).
///
/// Errors: the first error of `matrix` or `vector`.
pub fn layer_tensors<M, E>(
    desc: &ModelDesc,
    l: usize,
    matrix: impl Fn(&str, usize, usize) -> Result<M, E>,
    vector: impl Fn(&str, usize) -> Result<Vec<f32>, E>,
) -> Result<LayerTensors<M>, E> {
    let c = desc;
    let (h, f, q, kv, hd) = (c.hidden, c.ffn_dim, c.q_dim(), c.kv_dim(), c.head_dim);
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let (wqkv, w_gate_up) = match c.projections {
        Projections::Separate => (
            vec![
                matrix(&n("attn_q"), h, q)?,
                matrix(&n("attn_k"), h, kv)?,
                matrix(&n("attn_v"), h, kv)?,
            ],
            vec![matrix(&n("ffn_gate"), h, f)?, matrix(&n("ffn_up"), h, f)?],
        ),
        Projections::Fused => (
            vec![matrix(&n("attn_qkv"), h, q + 2 * kv)?],
            vec![matrix(&n("ffn_up"), h, 2 * f)?],
        ),
    };
    let qkv_bias = if c.qkv_bias {
        let bias = |s: &str, len| vector(&format!("blk.{l}.{s}.bias"), len);
        let mut b = bias("attn_q", q)?;
        b.extend(bias("attn_k", kv)?);
        b.extend(bias("attn_v", kv)?);
        Some(b)
    } else {
        None
    };
    let qk_norm = if c.qk_norm {
        Some((
            vector(&n("attn_q_norm"), hd)?,
            vector(&n("attn_k_norm"), hd)?,
        ))
    } else {
        None
    };
    let post = |s: &str| c.post_norms.then(|| vector(&n(s), h)).transpose();
    Ok(LayerTensors {
        attn_norm: vector(&n("attn_norm"), h)?,
        wqkv,
        qkv_bias,
        qk_norm,
        wo: matrix(&n("attn_output"), q, h)?,
        post_attn_norm: post("post_attention_norm")?,
        ffn_norm: vector(&n("ffn_norm"), h)?,
        w_gate_up,
        w_down: matrix(&n("ffn_down"), f, h)?,
        post_ffn_norm: post("post_ffw_norm")?,
    })
}
