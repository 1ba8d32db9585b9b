//! The description's types: what a forward pass needs to know about a model, in no backend's
//! terms.

use super::ArchError;

pub use model_files::Arch;

/// Which dimensions of a head RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i + 1)` rotated by angle `i` (llama.cpp's `LLAMA_ROPE_TYPE_NORM`):
    /// llama.cpp's converter permutes the rows of a `llama` model's Q and K into this order.
    Interleaved,
    /// Half-split pairs `(i, i + head_dim / 2)` (GPT-NeoX, Hugging Face's `rotate_half`;
    /// llama.cpp's `LLAMA_ROPE_TYPE_NEOX`): Q and K rows as Hugging Face stores them.
    Neox,
}

/// The gate's activation in the gated feed-forward `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (`x / (1 + e^-x)`): SwiGLU (Shazeer 2020).
    Silu,
    /// GELU, tanh approximation (`0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`, PyTorch's
    /// `gelu(approximate="tanh")`): GeGLU.
    GeluTanh,
}

/// How the attention and feed-forward projections are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Projections {
    /// `attn_q`, `attn_k`, `attn_v` and `ffn_gate`, `ffn_up`: one tensor each.
    Separate,
    /// `attn_qkv` (Q rows, then K, then V) and `ffn_up` holding the gate rows then the up rows
    /// (Phi-3).
    Fused,
}

/// Options of one transformer block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerDesc {
    /// A query at position `p` attends to keys `p + 1 - w ..= p` only (`Some(w)`), or to all of
    /// `0 ..= p` (`None`).
    pub sliding_window: Option<usize>,
    /// RoPE base θ of this layer.
    pub rope_base: f32,
    /// RoPE position scale (linear scaling: angles are computed at `position * rope_scale`);
    /// 1 unless the file sets `rope.scaling.type = linear`.
    pub rope_scale: f32,
}

/// Everything a backend needs to run a model: architecture, sizes, numerics options and per-layer
/// options. Built by [`ModelDesc::from_source`] (see the [module docs](super)).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDesc {
    /// The architecture.
    pub arch: Arch,
    /// Transformer blocks (`{arch}.block_count`).
    pub n_layers: usize,
    /// Embedding width (`{arch}.embedding_length`).
    pub hidden: usize,
    /// Query heads (`{arch}.attention.head_count`).
    pub n_heads: usize,
    /// Key/value heads (`{arch}.attention.head_count_kv`, default `n_heads`).
    pub n_kv_heads: usize,
    /// Per-head width of queries, keys and values (`{arch}.attention.key_length`, default
    /// `hidden / n_heads`; Mistral Nemo, Qwen 3 and Gemma differ from that).
    pub head_dim: usize,
    /// Feed-forward width (`{arch}.feed_forward_length`).
    pub ffn_dim: usize,
    /// Vocabulary size (`{arch}.vocab_size`, else the length of `tokenizer.ggml.tokens`).
    pub vocab_size: usize,
    /// Maximum sequence length in tokens (`{arch}.context_length`).
    pub context_length: usize,
    /// RMSNorm epsilon (`{arch}.attention.layer_norm_rms_epsilon`, default 1e-5). Every norm is
    /// `x / sqrt(mean(x²) + eps) * w` with `w` as stored (Gemma's converter stores `1 + w`).
    pub rms_eps: f32,
    /// The file's RoPE base θ (`{arch}.rope.freq_base`, default 10000); a layer's own base is in
    /// [`LayerDesc::rope_base`] (Gemma 3's local layers differ).
    pub rope_base: f32,
    /// Which dimensions RoPE pairs.
    pub rope_style: RopeStyle,
    /// Llama 3's per-frequency RoPE divisors (`rope_freqs.weight`, `[head_dim / 2]`): pair `i`'s
    /// frequency is `base^(-2i / head_dim) / factors[i]`.
    pub rope_freq_factors: Option<Vec<f32>>,
    /// Gate activation of the feed-forward.
    pub activation: Activation,
    /// Tensor layout of the projections.
    pub projections: Projections,
    /// Biases on Q, K and V (`blk.N.attn_{q,k,v}.bias`; Qwen 2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of Q and K before RoPE (`blk.N.attn_{q,k}_norm`, `[head_dim]`; Qwen 3,
    /// Gemma 3).
    pub qk_norm: bool,
    /// RMSNorm of the attention output and of the feed-forward output before each residual add
    /// (`blk.N.post_attention_norm`, `blk.N.post_ffw_norm`; Gemma 2 and 3).
    pub post_norms: bool,
    /// Token embeddings are multiplied by this after the lookup (Gemma: `sqrt(hidden)`).
    pub embed_scale: Option<f32>,
    /// Attention scores are `q·k * attn_scale`.
    pub attn_scale: f32,
    /// Attention scores are soft-capped to `c * tanh(s / c)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Logits are soft-capped to `c * tanh(z / c)` (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Per-layer options, `[n_layers]`.
    pub layers: Vec<LayerDesc>,
}

impl ModelDesc {
    /// Width of all query heads together (`n_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of all key (or value) heads together (`n_kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Whether this is a plain Llama: interleaved RoPE at one base without frequency factors,
    /// SwiGLU, separate projections, no biases, q/k norms, post-norms, embedding scale,
    /// soft-caps or sliding windows, and the default attention scale (what a backend that only
    /// implements Llama 2 can run).
    pub fn is_plain_llama(&self) -> bool {
        self.arch == Arch::Llama
            && self.rope_style == RopeStyle::Interleaved
            && self.rope_freq_factors.is_none()
            && self.activation == Activation::Silu
            && self.projections == Projections::Separate
            && !self.qkv_bias
            && !self.qk_norm
            && !self.post_norms
            && self.embed_scale.is_none()
            && self.attn_scale == 1.0 / (self.head_dim as f32).sqrt()
            && self.attn_softcap.is_none()
            && self.final_softcap.is_none()
            && self.layers.iter().all(|l| {
                l.sliding_window.is_none() && l.rope_base == self.rope_base && l.rope_scale == 1.0
            })
    }

    /// Checks that the sizes and options are usable. Errors: [`ArchError::InvalidConfig`]
    /// naming the value.
    pub fn validate(&self) -> Result<(), ArchError> {
        let bad = |m: String| Err(ArchError::InvalidConfig(m));
        let sizes = [
            ("block_count", self.n_layers),
            ("embedding_length", self.hidden),
            ("attention.head_count", self.n_heads),
            ("attention.head_count_kv", self.n_kv_heads),
            ("attention.key_length (head size)", self.head_dim),
            ("feed_forward_length", self.ffn_dim),
            ("vocab_size", self.vocab_size),
            ("context_length", self.context_length),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{}.{name} is 0", self.arch));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "head_count {} is not a multiple of head_count_kv {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head size {} is odd", self.head_dim));
        }
        if self.layers.len() != self.n_layers {
            return bad(format!(
                "{} layer descriptions for {} layers",
                self.layers.len(),
                self.n_layers
            ));
        }
        if !(self.rms_eps >= 0.0 && self.attn_scale > 0.0 && self.attn_scale.is_finite()) {
            return bad(format!(
                "rms eps {} / attention scale {} out of range",
                self.rms_eps, self.attn_scale
            ));
        }
        for (what, cap) in [
            ("attn_logit_softcapping", self.attn_softcap),
            ("final_logit_softcapping", self.final_softcap),
            ("embedding scale", self.embed_scale),
        ] {
            if cap.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
                return bad(format!("{what} {cap:?} must be positive"));
            }
        }
        if let Some(f) = &self.rope_freq_factors {
            if f.len() != self.head_dim / 2 || f.iter().any(|&x| !(x > 0.0 && x.is_finite())) {
                return bad(format!(
                    "rope_freqs.weight: {} factors, expected {} positive ones",
                    f.len(),
                    self.head_dim / 2
                ));
            }
        }
        for (l, layer) in self.layers.iter().enumerate() {
            if !(layer.rope_base > 0.0 && layer.rope_scale > 0.0) {
                return bad(format!(
                    "layer {l}: rope base {} / scale {} out of range",
                    layer.rope_base, layer.rope_scale
                ));
            }
            if layer.sliding_window == Some(0) {
                return bad(format!("layer {l}: sliding window of 0 tokens"));
            }
        }
        Ok(())
    }
}

impl ModelDesc {
    /// One line naming the options that set this model apart from a plain Llama, for logs and
    /// `worker inspect` (e.g. `half-split RoPE, GeGLU, q/k norms, post-norms, embeddings x 25.3,
    /// sliding window 512 on 15 of 18 layers (local RoPE base 10000)`); `plain Llama` when none.
    pub fn options_summary(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        if self.rope_style == RopeStyle::Neox {
            parts.push("half-split RoPE".into());
        }
        if self.rope_freq_factors.is_some() {
            parts.push("RoPE frequency factors (rope_freqs.weight)".into());
        }
        if self.activation == Activation::GeluTanh {
            parts.push("GeGLU".into());
        }
        if self.projections == Projections::Fused {
            parts.push("fused QKV and gate|up".into());
        }
        for (on, what) in [
            (self.qkv_bias, "QKV biases"),
            (self.qk_norm, "q/k norms"),
            (self.post_norms, "post-norms"),
        ] {
            if on {
                parts.push(what.into());
            }
        }
        if let Some(s) = self.embed_scale {
            parts.push(format!("embeddings x {s:.1}"));
        }
        if self.attn_scale != 1.0 / (self.head_dim as f32).sqrt() {
            parts.push(format!("attention scale {}", self.attn_scale));
        }
        if let Some(c) = self.attn_softcap {
            parts.push(format!("attention soft-cap {c}"));
        }
        if let Some(c) = self.final_softcap {
            parts.push(format!("logit soft-cap {c}"));
        }
        let local: Vec<&LayerDesc> = self
            .layers
            .iter()
            .filter(|l| l.sliding_window.is_some())
            .collect();
        if let Some(first) = local.first() {
            let mut s = format!(
                "sliding window {} on {} of {} layers",
                first.sliding_window.unwrap_or(0),
                local.len(),
                self.n_layers
            );
            if first.rope_base != self.rope_base {
                s.push_str(&format!(" (local RoPE base {})", first.rope_base));
            }
            parts.push(s);
        }
        if let Some(l) = self.layers.iter().find(|l| l.rope_scale != 1.0) {
            parts.push(format!("linear RoPE scaling x{}", 1.0 / l.rope_scale));
        }
        if parts.is_empty() {
            "plain Llama".into()
        } else {
            parts.join(", ")
        }
    }
}
