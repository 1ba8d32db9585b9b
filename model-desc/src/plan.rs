//! The order of operations of a forward pass, written once for every backend. A [`ModelPlan`],
//! built from a [`ModelDesc`] when the model is loaded, lists the embedding, each layer's
//! operations with their options decided (Q/K/V bias, q/k norms, the layer's RoPE, attention
//! scale, soft-cap and window, post-norms, activation) and the head. A backend executes it by
//! matching over the ops and calling its own kernels, so an architecture that combines existing
//! operations differently changes this file and no backend; only a new kind of op needs a kernel
//! in each backend. The options are decided here per layer, never inside a kernel's inner loop.
//!
//! The ops act on one step's activations, one row per token:
//!
//! | buffer | shape | written by |
//! |---|---|---|
//! | `x`, the residual stream | `[rows, hidden]` | [`Embed`], [`LayerOp::Residual`] |
//! | `xn` | `[rows, hidden]` | [`LayerOp::Norm`], [`HeadOp::Norm`] (on the logit rows) |
//! | `qkv` | `[rows, q_dim + 2 * kv_dim]`, each row Q, then K, then V | [`LayerOp::QkvProject`] and the ops up to [`LayerOp::KvWrite`] |
//! | `att` | `[rows, q_dim]` | [`LayerOp::Attention`] |
//! | `gate_up` | `[rows, 2 * ffn_dim]`, gate then up | [`LayerOp::GateUpProject`] |
//! | `h` | `[rows, ffn_dim]` | [`LayerOp::Gate`] |
//!
//! A backend may stop computing a row once its K/V are written and it wants no logits (the CPU
//! runs the last layer's attention and feed-forward on the logit rows only); every op after
//! [`LayerOp::KvWrite`] is per row, so that changes no value.

use super::{Activation, ModelDesc, RopeStyle};

/// The two residual branches of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Branch {
    /// `attn_norm`, attention, `wo`, `post_attention_norm`.
    Attention,
    /// `ffn_norm`, the gated feed-forward, `w_down`, `post_ffw_norm`.
    FeedForward,
}

/// The embedding lookup: `x[t] = token_embd[token_t] * scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Embed {
    /// Multiplier after the lookup (Gemma: `sqrt(hidden)`); `None` for none.
    pub scale: Option<f32>,
}

/// RoPE of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeOp {
    /// Which dimensions rotate together (the model's).
    pub style: RopeStyle,
    /// The layer's RoPE base θ and position scale, and their index in
    /// [`ModelPlan::rope_variants`] (for a backend that computes one table of angles per variant
    /// and step). The model's `rope_freq_factors` divide every frequency.
    pub variant: RopeVariant,
    /// Index of `variant` in [`ModelPlan::rope_variants`].
    pub index: usize,
}

/// A RoPE base and position scale (angles at `position * pos_scale * base^(-2i / head_dim)`,
/// divided by the model's frequency factors).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeVariant {
    /// Base θ.
    pub base: f32,
    /// Position scale (1, or `1 / factor` with linear RoPE scaling).
    pub pos_scale: f32,
}

/// Attention of one layer over the paged K/V cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionOp {
    /// Scores are `q·k * scale`.
    pub scale: f32,
    /// Scores are soft-capped to `c * tanh(s / c)` (Gemma 2).
    pub softcap: Option<f32>,
    /// A query at position `p` sees keys `p + 1 - w ..= p` (`Some(w)`), or all of `0 ..= p`.
    pub window: Option<usize>,
}

/// One operation of a layer, in the order [`LayerPlan::ops`] lists them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LayerOp {
    /// `xn = rmsnorm(x) * w` with the norm before `branch` (`attn_norm`, `ffn_norm`).
    Norm(Branch),
    /// `qkv = xn · Wqkv^T`, one product per part of `wqkv`, each writing its column range.
    QkvProject,
    /// `qkv += qkv_bias` on every row (Qwen 2).
    QkvBias,
    /// RMSNorm of each Q head and each K head of every row with `attn_q_norm` / `attn_k_norm`
    /// (Qwen 3, Gemma 3).
    QkNorm,
    /// RoPE of every Q and K head at its token's position.
    Rope(RopeOp),
    /// Every row's K and V into its slot of this layer's cache.
    KvWrite,
    /// `att = attention(Q, cached K/V)`, each query over its own sequence's positions.
    Attention(AttentionOp),
    /// `x += y`, or `x += rmsnorm(y) * post` with `post_norm` (Gemma), where `y` is the branch's
    /// output projected back: `att · Wo^T` or `h · Wdown^T`.
    Residual {
        /// Which branch ends here.
        branch: Branch,
        /// Norm `y` with the branch's post-norm before adding it.
        post_norm: bool,
    },
    /// `gate_up = xn · [Wgate | Wup]^T`, one product per part.
    GateUpProject,
    /// `h = act(gate) * up` per element.
    Gate(Activation),
}

/// The operations of one transformer block.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerPlan {
    /// In execution order.
    pub ops: Vec<LayerOp>,
}

/// One operation after the last layer, on the rows that want logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HeadOp {
    /// `xn = rmsnorm(x) * output_norm`.
    Norm,
    /// `logits = xn · lm_head^T`, f32 `[rows, vocab]`.
    LmHead,
    /// `logits = c * tanh(logits / c)` (Gemma 2).
    Softcap(f32),
}

/// A whole forward pass (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPlan {
    /// The first op.
    pub embed: Embed,
    /// One plan per layer, `[n_layers]`.
    pub layers: Vec<LayerPlan>,
    /// After the last layer, in order.
    pub head: Vec<HeadOp>,
    /// The distinct RoPE variants of the layers in first-use order: one for most models, two for
    /// Gemma 3 (local and global layers).
    pub rope_variants: Vec<RopeVariant>,
}

impl ModelPlan {
    /// The plan of the model `desc` describes: the Llama block (pre-norm attention and gated
    /// feed-forward, each added to the residual stream) with `desc`'s options.
    pub fn new(desc: &ModelDesc) -> ModelPlan {
        let mut rope_variants: Vec<RopeVariant> = Vec::new();
        let layers = desc
            .layers
            .iter()
            .map(|ld| {
                let variant = RopeVariant {
                    base: ld.rope_base,
                    pos_scale: ld.rope_scale,
                };
                let index = match rope_variants.iter().position(|v| *v == variant) {
                    Some(i) => i,
                    None => {
                        rope_variants.push(variant);
                        rope_variants.len() - 1
                    }
                };
                let attention = AttentionOp {
                    scale: desc.attn_scale,
                    softcap: desc.attn_softcap,
                    window: ld.sliding_window,
                };
                let post_norm = desc.post_norms;
                let mut ops = vec![LayerOp::Norm(Branch::Attention), LayerOp::QkvProject];
                ops.extend(desc.qkv_bias.then_some(LayerOp::QkvBias));
                ops.extend(desc.qk_norm.then_some(LayerOp::QkNorm));
                ops.extend([
                    LayerOp::Rope(RopeOp {
                        style: desc.rope_style,
                        variant,
                        index,
                    }),
                    LayerOp::KvWrite,
                    LayerOp::Attention(attention),
                    LayerOp::Residual {
                        branch: Branch::Attention,
                        post_norm,
                    },
                    LayerOp::Norm(Branch::FeedForward),
                    LayerOp::GateUpProject,
                    LayerOp::Gate(desc.activation),
                    LayerOp::Residual {
                        branch: Branch::FeedForward,
                        post_norm,
                    },
                ]);
                LayerPlan { ops }
            })
            .collect();
        let mut head = vec![HeadOp::Norm, HeadOp::LmHead];
        head.extend(desc.final_softcap.map(HeadOp::Softcap));
        ModelPlan {
            embed: Embed {
                scale: desc.embed_scale,
            },
            layers,
            head,
            rope_variants,
        }
    }
}
