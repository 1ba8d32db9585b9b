//! The one weight loader of every backend: which tensors a model of a [`ModelDesc`] needs, by GGUF
//! name and shape, grouped per layer as the [`super::plan`] ops use them, and read through a
//! [`ModelSource`].
//!
//! Names and GGUF shapes follow llama.cpp's converter (`token_embd`,
//! `blk.N.attn_{norm,q,k,v,output}`, `blk.N.ffn_{norm,gate,up,down}`, `output_norm`, optional
//! `output`; per architecture also `blk.N.attn_{q,k,v}.bias`, `blk.N.attn_{q,k}_norm`,
//! `blk.N.post_attention_norm`, `blk.N.post_ffw_norm`, and Phi-3's fused `blk.N.attn_qkv` and
//! `blk.N.ffn_up` holding gate then up). A GGUF matrix with dims `[in, out]` is a row-major
//! `[out, in]` matrix: row `o` holds the `in` weights of output `o`.
//!
//! Norms and biases are read here as f32. Each matrix is handed to the backend, its shape checked,
//! as a [`MatrixTensor`] (the source's bytes in the file's format), and the backend turns it into
//! its own storage: the CPU keeps it in memory or in the mapped file, CUDA checks that its kernels
//! decode the format and uploads it. Q/K/V and gate/up stay parts of one logical matrix (one part
//! each, or one fused part for Phi-3), and the LM head is the embeddings when the file has no
//! `output.weight`.

use super::plan::Branch;
use super::{ArchError, ModelDesc, ModelSource, Projections, SourceTensor};

/// A weight matrix as its source holds it, shape-checked: a row-major `[rows, cols]` matrix
/// stored as the GGUF tensor `[cols, rows]`.
#[derive(Debug, Clone)]
pub struct MatrixTensor<'a> {
    /// GGUF tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Type, dims (`[cols, rows]`) and bytes.
    pub tensor: SourceTensor<'a>,
}

impl<'a> MatrixTensor<'a> {
    /// The tensor `name` of `src` as a `[rows, cols]` matrix.
    ///
    /// Errors: [`ArchError::MissingTensor`], [`ArchError::TensorShape`] (naming the tensor), or
    /// the source's error.
    pub fn find(
        src: &'a dyn ModelSource,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<MatrixTensor<'a>, ArchError> {
        Ok(MatrixTensor {
            name: name.to_string(),
            rows,
            cols,
            tensor: find(src, name, &[cols as u64, rows as u64])?,
        })
    }
}

/// One transformer block's weights: matrices of type `M` (a [`MatrixTensor`] turned into a
/// backend's storage), norms and biases of type `V` (f32 values, `[len]`).
#[derive(Debug, Clone)]
pub struct LayerWeights<M, V = Vec<f32>> {
    /// RMSNorm weight before attention, `[hidden]`.
    pub attn_norm: V,
    /// Q, K, V parts (`[q_dim | kv_dim | kv_dim, hidden]`), or one fused part (Phi-3); Q/K rows in
    /// the file's RoPE order.
    pub wqkv: Vec<M>,
    /// Q, K and V biases stacked, `[q_dim + 2 * kv_dim]` (Qwen 2).
    pub qkv_bias: Option<V>,
    /// Per-head Q and K RMSNorm weights, `[head_dim]` each (Qwen 3, Gemma 3).
    pub qk_norm: Option<(V, V)>,
    /// Attention output projection, `[hidden, q_dim]`.
    pub wo: M,
    /// Norm of the attention output before its residual add, `[hidden]` (Gemma 2/3).
    pub post_attn_norm: Option<V>,
    /// RMSNorm weight before the feed-forward, `[hidden]`.
    pub ffn_norm: V,
    /// Gate and up parts (`[ffn | ffn, hidden]`), or one fused part with the gate rows first
    /// (Phi-3).
    pub w_gate_up: Vec<M>,
    /// Down projection, `[hidden, ffn]`.
    pub w_down: M,
    /// Norm of the feed-forward output before its residual add, `[hidden]` (Gemma 2/3).
    pub post_ffn_norm: Option<V>,
}

/// What a plan op asks of a layer that the description did not load: a bug in `arch`, not in a
/// file (the plan and the loader read the same options).
const PLANNED: &str = "the weight loader reads every tensor the plan uses";

impl<M, V> LayerWeights<M, V> {
    /// The RMSNorm weight before `branch` ([`super::LayerOp::Norm`]).
    pub fn norm(&self, branch: Branch) -> &V {
        match branch {
            Branch::Attention => &self.attn_norm,
            Branch::FeedForward => &self.ffn_norm,
        }
    }

    /// The projection that ends `branch` (`wo` or `w_down`; [`super::LayerOp::Residual`]).
    pub fn out_projection(&self, branch: Branch) -> &M {
        match branch {
            Branch::Attention => &self.wo,
            Branch::FeedForward => &self.w_down,
        }
    }

    /// The post-norm of `branch` ([`super::LayerOp::Residual`] with `post_norm`).
    ///
    /// Panics if it was not loaded (the plan asks for it only when the description has them).
    pub fn post_norm(&self, branch: Branch) -> &V {
        match branch {
            Branch::Attention => &self.post_attn_norm,
            Branch::FeedForward => &self.post_ffn_norm,
        }
        .as_ref()
        .expect(PLANNED)
    }

    /// The stacked Q/K/V bias ([`super::LayerOp::QkvBias`]). Panics if it was not loaded.
    pub fn bias(&self) -> &V {
        self.qkv_bias.as_ref().expect(PLANNED)
    }

    /// The Q and K head norms ([`super::LayerOp::QkNorm`]). Panics if they were not loaded.
    pub fn qk_norms(&self) -> (&V, &V) {
        let (q, k) = self.qk_norm.as_ref().expect(PLANNED);
        (q, k)
    }
}

/// All weights of a model (see [`LayerWeights`] for `M` and `V`).
#[derive(Debug, Clone)]
pub struct ModelWeights<M, V = Vec<f32>> {
    /// Token embeddings, `[vocab_size, hidden]`.
    pub token_embd: M,
    /// Transformer blocks in order.
    pub layers: Vec<LayerWeights<M, V>>,
    /// Final RMSNorm weight, `[hidden]`.
    pub output_norm: V,
    /// LM head `[vocab_size, hidden]`; `None` when tied to `token_embd` (no `output.weight`).
    pub output: Option<M>,
}

impl<M> ModelWeights<M> {
    /// Reads every tensor `desc` needs from `src`, in layer order and then `output`,
    /// `token_embd`, `output_norm`: norms and biases as f32, each matrix checked against the
    /// shape `desc` implies and turned into an `M` by `matrix`.
    ///
    /// Errors: [`ArchError::MissingTensor`], [`ArchError::TensorShape`] (both naming the tensor),
    /// the source's errors or an undecodable vector ([`ArchError::Source`]), all as `E`; and the
    /// first error of `matrix`.
    pub fn load<'a, E: From<ArchError>>(
        src: &'a dyn ModelSource,
        desc: &ModelDesc,
        mut matrix: impl FnMut(MatrixTensor<'a>) -> Result<M, E>,
    ) -> Result<ModelWeights<M>, E> {
        let (h, vocab) = (desc.hidden, desc.vocab_size);
        let mut layers = Vec::with_capacity(desc.n_layers);
        for l in 0..desc.n_layers {
            layers.push(load_layer(src, desc, l, &mut matrix)?);
        }
        let mut head = |name: &str| matrix(MatrixTensor::find(src, name, vocab, h)?);
        let output = if src.has_tensor("output.weight") {
            Some(head("output.weight")?)
        } else {
            None
        };
        Ok(ModelWeights {
            token_embd: head("token_embd.weight")?,
            layers,
            output_norm: vector(src, "output_norm.weight", h)?,
            output,
        })
    }
}

impl<M, V> ModelWeights<M, V> {
    /// The LM head: `output` if present, else the tied token embeddings.
    pub fn lm_head(&self) -> &M {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// The same weights with every matrix turned by `matrix` and every norm or bias by `vector`
    /// (a host copy uploaded to a device), layers first, each in field order, then `token_embd`,
    /// `output_norm`, `output`. Errors: the first error of either.
    pub fn try_map<M2, V2, E>(
        &self,
        mut matrix: impl FnMut(&M) -> Result<M2, E>,
        mut vector: impl FnMut(&V) -> Result<V2, E>,
    ) -> Result<ModelWeights<M2, V2>, E> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(LayerWeights {
                attn_norm: vector(&l.attn_norm)?,
                wqkv: l.wqkv.iter().map(&mut matrix).collect::<Result<_, _>>()?,
                qkv_bias: l.qkv_bias.as_ref().map(&mut vector).transpose()?,
                qk_norm: match &l.qk_norm {
                    Some((q, k)) => Some((vector(q)?, vector(k)?)),
                    None => None,
                },
                wo: matrix(&l.wo)?,
                post_attn_norm: l.post_attn_norm.as_ref().map(&mut vector).transpose()?,
                ffn_norm: vector(&l.ffn_norm)?,
                w_gate_up: l
                    .w_gate_up
                    .iter()
                    .map(&mut matrix)
                    .collect::<Result<_, _>>()?,
                w_down: matrix(&l.w_down)?,
                post_ffn_norm: l.post_ffn_norm.as_ref().map(&mut vector).transpose()?,
            });
        }
        Ok(ModelWeights {
            token_embd: matrix(&self.token_embd)?,
            layers,
            output_norm: vector(&self.output_norm)?,
            output: self.output.as_ref().map(matrix).transpose()?,
        })
    }

    /// Every matrix (the tied LM head once) and every norm or bias, for sizes and checks.
    pub fn tensors(&self) -> (Vec<&M>, Vec<&V>) {
        let (mut ms, mut vs) = (vec![&self.token_embd], vec![&self.output_norm]);
        ms.extend(&self.output);
        for l in &self.layers {
            ms.extend(l.wqkv.iter().chain(&l.w_gate_up).chain([&l.wo, &l.w_down]));
            vs.extend([&l.attn_norm, &l.ffn_norm]);
            vs.extend(
                l.qkv_bias
                    .iter()
                    .chain(&l.post_attn_norm)
                    .chain(&l.post_ffn_norm),
            );
            vs.extend(l.qk_norm.iter().flat_map(|(q, k)| [q, k]));
        }
        (ms, vs)
    }
}

/// Layer `l`'s tensors as `desc` lays them out.
fn load_layer<'a, M, E: From<ArchError>>(
    src: &'a dyn ModelSource,
    desc: &ModelDesc,
    l: usize,
    matrix: &mut impl FnMut(MatrixTensor<'a>) -> Result<M, E>,
) -> Result<LayerWeights<M>, E> {
    let c = desc;
    let (h, f, q, kv, hd) = (c.hidden, c.ffn_dim, c.q_dim(), c.kv_dim(), c.head_dim);
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let mut m =
        |s: &str, cols: usize, rows: usize| matrix(MatrixTensor::find(src, &n(s), rows, cols)?);
    let (wqkv, w_gate_up) = match c.projections {
        Projections::Separate => (
            vec![m("attn_q", h, q)?, m("attn_k", h, kv)?, m("attn_v", h, kv)?],
            vec![m("ffn_gate", h, f)?, m("ffn_up", h, f)?],
        ),
        Projections::Fused => (
            vec![m("attn_qkv", h, q + 2 * kv)?],
            vec![m("ffn_up", h, 2 * f)?],
        ),
    };
    let v = |s: &str, len| vector(src, &n(s), len);
    let qkv_bias = if c.qkv_bias {
        let bias = |s: &str, len| vector(src, &format!("blk.{l}.{s}.bias"), len);
        let mut b = bias("attn_q", q)?;
        b.extend(bias("attn_k", kv)?);
        b.extend(bias("attn_v", kv)?);
        Some(b)
    } else {
        None
    };
    let qk_norm = if c.qk_norm {
        Some((v("attn_q_norm", hd)?, v("attn_k_norm", hd)?))
    } else {
        None
    };
    let post = |s: &str| c.post_norms.then(|| v(s, h)).transpose();
    Ok(LayerWeights {
        attn_norm: v("attn_norm", h)?,
        wqkv,
        qkv_bias,
        qk_norm,
        wo: m("attn_output", q, h)?,
        post_attn_norm: post("post_attention_norm")?,
        ffn_norm: v("ffn_norm", h)?,
        w_gate_up,
        w_down: m("ffn_down", f, h)?,
        post_ffn_norm: post("post_ffw_norm")?,
    })
}

/// The tensor `name` of `src`, checked to have GGUF dims `dims`.
fn find<'a>(
    src: &'a dyn ModelSource,
    name: &str,
    dims: &[u64],
) -> Result<SourceTensor<'a>, ArchError> {
    let t = src
        .tensor(name)?
        .ok_or_else(|| ArchError::MissingTensor(name.to_string()))?;
    if t.dims != dims {
        return Err(ArchError::TensorShape {
            name: name.to_string(),
            expected: dims.to_vec(),
            found: t.dims,
        });
    }
    Ok(t)
}

/// The `[len]` tensor `name` of `src` as f32.
fn vector(src: &dyn ModelSource, name: &str, len: usize) -> Result<Vec<f32>, ArchError> {
    let t = find(src, name, &[len as u64])?;
    Ok(gguf::dequantize_to_vec(t.dtype, &t.bytes, len)?)
}
