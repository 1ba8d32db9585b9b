//! Per-architecture knowledge of the Hugging Face → GGUF conversion, following llama.cpp's
//! `convert_hf_to_gguf.py` (its `LlamaModel`, `Qwen2Model`, `Qwen3Model`, `Gemma2Model`,
//! `Gemma3Model` and `Phi3MiniModel`): which `model_type`s map to which GGUF architecture, the
//! hyper-parameters as `{arch}.*` metadata, and the tensors each block needs with their expected
//! shapes and GGUF names.

use gguf::MetadataValue;

use super::config::{HfConfig, RopeParams};
use crate::error::{ModelFileError, Result};
pub use crate::Arch;

/// The `model_type` values accepted, for error messages.
const SUPPORTED: &str = "llama, mistral, qwen2, qwen3, gemma2, gemma3, gemma3_text, phi3";

impl Arch {
    /// The architecture of `config`'s `model_type`. Errors: `Key` when absent,
    /// `UnsupportedArchitecture` for other values.
    pub fn of(config: &HfConfig) -> Result<Arch> {
        let model_type = config
            .opt_str("model_type")?
            .ok_or_else(|| config.bad("model_type", "the architecture's name"))?;
        Ok(match model_type {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma2" => Arch::Gemma2,
            "gemma3" | "gemma3_text" => Arch::Gemma3,
            "phi3" => Arch::Phi3,
            other => {
                return Err(ModelFileError::UnsupportedArchitecture {
                    path: config.path().to_path_buf(),
                    model_type: other.to_string(),
                    supported: SUPPORTED.to_string(),
                })
            }
        })
    }

    /// Whether Q/K rows are permuted to GGUF's interleaved RoPE layout (llama only).
    pub fn permutes_qk(self) -> bool {
        self == Arch::Llama
    }

    /// Whether every `*norm.weight` is stored as `1 + w` (Gemma).
    pub fn shifts_norms(self) -> bool {
        matches!(self, Arch::Gemma2 | Arch::Gemma3)
    }

    fn is_gemma(self) -> bool {
        self.shifts_norms()
    }

    /// Whether the output projection is tied to the embeddings: `tie_word_embeddings`, whose
    /// transformers default is true for Gemma and false for the others. Gemma's converter never
    /// writes an `output.weight`.
    pub fn tied(self, config: &HfConfig) -> Result<bool> {
        Ok(self.is_gemma() || config.opt_bool("tie_word_embeddings")?.unwrap_or(false))
    }
}

/// The sizes a folder's tensors are checked against.
#[derive(Debug, Clone, PartialEq)]
pub struct Dims {
    /// `num_hidden_layers`.
    pub n_layers: usize,
    /// `hidden_size`.
    pub hidden: usize,
    /// `num_attention_heads` (Gemma 3 default 8).
    pub n_heads: usize,
    /// `num_key_value_heads` (default `n_heads`; Gemma 3 default 4).
    pub n_kv_heads: usize,
    /// `head_dim` (default `hidden / n_heads`; Gemma 3 default 256).
    pub head_dim: usize,
    /// `intermediate_size`.
    pub ffn: usize,
    /// `vocab_size`.
    pub vocab: usize,
}

impl Dims {
    /// Reads the sizes of `arch` from `config`. Errors: `Key` for missing or non-positive sizes,
    /// or an odd head size.
    pub fn read(arch: Arch, config: &HfConfig) -> Result<Dims> {
        let gemma3 = arch == Arch::Gemma3;
        let hidden = config.first_usize(&["hidden_size", "n_embd", "dim"])?;
        let n_heads = match (gemma3, config.opt_usize("num_attention_heads")?) {
            (_, Some(n)) => n,
            (true, None) => 8,
            (false, None) => config.usize("num_attention_heads")?,
        };
        let n_kv_heads = config
            .opt_usize("num_key_value_heads")?
            .unwrap_or(if gemma3 { 4 } else { n_heads });
        let head_dim = match config.opt_usize("head_dim")? {
            Some(d) => d,
            None if gemma3 => 256,
            None => hidden / n_heads,
        };
        if head_dim % 2 != 0 {
            // RoPE rotates pairs of dimensions.
            return Err(config.bad(
                "head_dim",
                "an even head size (hidden_size / num_attention_heads by default)",
            ));
        }
        Ok(Dims {
            n_layers: config.first_usize(&["num_hidden_layers", "n_layer", "num_layers"])?,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn: config.usize("intermediate_size")?,
            vocab: config.usize("vocab_size")?,
        })
    }
}

/// How a tensor's values change on the way to GGUF.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transform {
    /// Bytes as stored.
    None,
    /// Rows permuted for interleaved RoPE over this many heads ([`super::convert::permute_rows`]).
    Permute(usize),
    /// `1 + w`, as f32 ([`super::convert::add_one`]).
    AddOne,
}

/// One tensor the model needs.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    /// Hugging Face name without the `model.` prefix (`layers.0.self_attn.q_proj.weight`), or
    /// with `lm_head.` for the output projection.
    pub hf: String,
    /// GGUF name (`blk.0.attn_q.weight`).
    pub gguf: String,
    /// Expected shape, PyTorch order.
    pub shape: Vec<usize>,
    /// Which config values give the shape (for error messages).
    pub why: String,
    /// The value change.
    pub transform: Transform,
}

/// The value change of the tensor `hf` (converter: `Gemma2Model` / `Gemma3Model` add 1 to every
/// `*norm.weight`; `LlamaModel` permutes `q_proj` over the query heads and `k_proj` over the
/// key/value heads, weights and biases alike).
fn transform(arch: Arch, d: &Dims, hf: &str) -> Transform {
    if arch.shifts_norms() && hf.ends_with("norm.weight") {
        Transform::AddOne
    } else if arch.permutes_qk() && hf.contains(".q_proj.") {
        Transform::Permute(d.n_heads)
    } else if arch.permutes_qk() && hf.contains(".k_proj.") {
        Transform::Permute(d.n_kv_heads)
    } else {
        Transform::None
    }
}

/// Every tensor of the model, in GGUF file order (embeddings, blocks, output).
///
/// Errors: `Key` for a mistyped `attention_bias` / `tie_word_embeddings`.
pub fn tensor_specs(arch: Arch, config: &HfConfig, d: &Dims) -> Result<Vec<TensorSpec>> {
    let (h, f) = (d.hidden, d.ffn);
    let (q, kv) = (d.n_heads * d.head_dim, d.n_kv_heads * d.head_dim);
    let why_h = format!("hidden_size {h}");
    let why_q = format!(
        "num_attention_heads {} x head_dim {}",
        d.n_heads, d.head_dim
    );
    let why_kv = format!(
        "num_key_value_heads {} x head_dim {}",
        d.n_kv_heads, d.head_dim
    );
    let why_f = format!("intermediate_size {f}");
    let mut specs = Vec::new();
    let mut add = |hf: String, gguf: String, shape: Vec<usize>, why: String| {
        let transform = transform(arch, d, &hf);
        specs.push(TensorSpec {
            hf,
            gguf,
            shape,
            why,
            transform,
        });
    };
    add(
        "embed_tokens.weight".into(),
        "token_embd.weight".into(),
        vec![d.vocab, h],
        format!("vocab_size {} by {why_h}", d.vocab),
    );
    let biases = match arch {
        Arch::Qwen2 => true,
        Arch::Llama => config.opt_bool("attention_bias")?.unwrap_or(false),
        _ => false,
    };
    for l in 0..d.n_layers {
        let hf = |s: &str| format!("layers.{l}.{s}");
        let gg = |s: &str| format!("blk.{l}.{s}");
        let mut norm = |hf_name: &str, gguf_name: &str| {
            add(hf(hf_name), gg(gguf_name), vec![h], why_h.clone());
        };
        norm("input_layernorm.weight", "attn_norm.weight");
        if arch.is_gemma() {
            norm(
                "post_attention_layernorm.weight",
                "post_attention_norm.weight",
            );
            norm("pre_feedforward_layernorm.weight", "ffn_norm.weight");
            norm("post_feedforward_layernorm.weight", "post_ffw_norm.weight");
        } else {
            norm("post_attention_layernorm.weight", "ffn_norm.weight");
        }
        let by_h = |why: &str| format!("{why} by {why_h}");
        if arch == Arch::Phi3 {
            add(
                hf("self_attn.qkv_proj.weight"),
                gg("attn_qkv.weight"),
                vec![q + 2 * kv, h],
                by_h(&format!("{why_q} + 2 x {why_kv}")),
            );
            add(
                hf("mlp.gate_up_proj.weight"),
                gg("ffn_up.weight"),
                vec![2 * f, h],
                by_h(&format!("2 x {why_f}")),
            );
        } else {
            for (name, rows, why) in [("q", q, &why_q), ("k", kv, &why_kv), ("v", kv, &why_kv)] {
                add(
                    hf(&format!("self_attn.{name}_proj.weight")),
                    gg(&format!("attn_{name}.weight")),
                    vec![rows, h],
                    by_h(why),
                );
                if biases {
                    add(
                        hf(&format!("self_attn.{name}_proj.bias")),
                        gg(&format!("attn_{name}.bias")),
                        vec![rows],
                        why.clone(),
                    );
                }
            }
            add(
                hf("mlp.gate_proj.weight"),
                gg("ffn_gate.weight"),
                vec![f, h],
                by_h(&why_f),
            );
            add(
                hf("mlp.up_proj.weight"),
                gg("ffn_up.weight"),
                vec![f, h],
                by_h(&why_f),
            );
        }
        if matches!(arch, Arch::Qwen3 | Arch::Gemma3) {
            let why = format!("head_dim {}", d.head_dim);
            add(
                hf("self_attn.q_norm.weight"),
                gg("attn_q_norm.weight"),
                vec![d.head_dim],
                why.clone(),
            );
            add(
                hf("self_attn.k_norm.weight"),
                gg("attn_k_norm.weight"),
                vec![d.head_dim],
                why,
            );
        }
        add(
            hf("self_attn.o_proj.weight"),
            gg("attn_output.weight"),
            vec![h, q],
            format!("{why_h} by {why_q}"),
        );
        if biases && arch == Arch::Llama {
            add(
                hf("self_attn.o_proj.bias"),
                gg("attn_output.bias"),
                vec![h],
                why_h.clone(),
            );
        }
        add(
            hf("mlp.down_proj.weight"),
            gg("ffn_down.weight"),
            vec![h, f],
            format!("{why_h} by {why_f}"),
        );
    }
    add(
        "norm.weight".into(),
        "output_norm.weight".into(),
        vec![h],
        why_h.clone(),
    );
    if !arch.tied(config)? {
        add(
            "lm_head.weight".into(),
            "output.weight".into(),
            vec![d.vocab, h],
            format!("vocab_size {} by {why_h}", d.vocab),
        );
    }
    Ok(specs)
}

/// Builds `{arch}.*` metadata.
struct Meta<'a> {
    prefix: &'a str,
    out: Vec<(String, MetadataValue)>,
}

impl Meta<'_> {
    fn set(&mut self, key: &str, v: MetadataValue) {
        let key = format!("{}.{key}", self.prefix);
        // Like gguf-py's writer, a key set twice keeps the last value.
        self.out.retain(|(k, _)| *k != key);
        self.out.push((key, v));
    }
    fn u32(&mut self, key: &str, v: usize) {
        self.set(key, MetadataValue::U32(v as u32));
    }
    fn f32(&mut self, key: &str, v: f64) {
        self.set(key, MetadataValue::F32(v as f32));
    }
}

/// The `{arch}.*` metadata the converter writes for `config`.
///
/// Errors: `Key` for missing or mistyped values (e.g. phi3 without
/// `original_max_position_embeddings`, Gemma 2 without `sliding_window`).
pub fn metadata(
    arch: Arch,
    config: &HfConfig,
    d: &Dims,
    rope: &RopeParams,
) -> Result<Vec<(String, MetadataValue)>> {
    let mut m = Meta {
        prefix: arch.name(),
        out: Vec::new(),
    };
    let c = config;
    let context = c.opt_usize("max_position_embeddings")?;
    let rms_eps = c.opt_f64("rms_norm_eps")?;
    match arch {
        Arch::Gemma2 => {
            m.u32("context_length", c.usize("max_position_embeddings")?);
            m.u32("embedding_length", d.hidden);
            m.u32("block_count", d.n_layers);
            m.u32("feed_forward_length", d.ffn);
            m.u32("attention.head_count", d.n_heads);
            m.u32("attention.head_count_kv", d.n_kv_heads);
            m.f32("attention.layer_norm_rms_epsilon", c.f64("rms_norm_eps")?);
            m.u32("attention.key_length", c.usize("head_dim")?);
            m.u32("attention.value_length", c.usize("head_dim")?);
            m.f32("attn_logit_softcapping", c.f64("attn_logit_softcapping")?);
            m.f32("final_logit_softcapping", c.f64("final_logit_softcapping")?);
            m.u32("attention.sliding_window", c.usize("sliding_window")?);
        }
        Arch::Phi3 => {
            let original = rope
                .original_max_position_embeddings
                .ok_or_else(|| c.bad("original_max_position_embeddings", "a positive integer"))?;
            let rot = rope.partial_rotary_factor.unwrap_or(1.0);
            m.u32(
                "context_length",
                c.first_usize(&["n_positions", "max_position_embeddings"])?,
            );
            m.u32("rope.scaling.original_context_length", original as usize);
            m.u32("embedding_length", d.hidden);
            m.u32("feed_forward_length", d.ffn);
            m.u32("block_count", d.n_layers);
            m.u32("attention.head_count", d.n_heads);
            m.u32("attention.head_count_kv", d.n_kv_heads);
            m.f32("attention.layer_norm_rms_epsilon", c.f64("rms_norm_eps")?);
            m.u32(
                "rope.dimension_count",
                (rot * d.hidden as f64) as usize / d.n_heads,
            );
            let theta = rope
                .theta
                .ok_or_else(|| c.bad(&rope.key, "a `rope_theta`"))?;
            m.f32("rope.freq_base", theta);
            m.u32(
                "attention.sliding_window",
                c.opt_usize("sliding_window")?.unwrap_or(0),
            );
            if let Some(scale) = longrope_attn_factor(c, rope, original)? {
                m.f32("rope.scaling.attn_factor", scale);
            }
        }
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 => {
            m.u32("block_count", d.n_layers);
            if let Some(n) = context {
                m.u32("context_length", n);
            }
            m.u32("embedding_length", d.hidden);
            m.u32("feed_forward_length", d.ffn);
            m.u32("attention.head_count", d.n_heads);
            if c.get("num_key_value_heads").is_some() {
                m.u32("attention.head_count_kv", d.n_kv_heads);
            }
            rope_scaling(&mut m, rope)?;
            if let Some(theta) = rope.theta {
                m.f32("rope.freq_base", theta);
            }
            if let Some(local) = rope.local_theta {
                m.f32("rope.freq_base_swa", local);
            }
            if let Some(eps) = rms_eps {
                m.f32("attention.layer_norm_rms_epsilon", eps);
            }
            if c.get("head_dim").is_some() {
                m.u32("attention.key_length", d.head_dim);
                m.u32("attention.value_length", d.head_dim);
            }
        }
    }
    match arch {
        Arch::Llama => {
            m.u32("vocab_size", d.vocab);
            m.u32("rope.dimension_count", d.head_dim);
        }
        Arch::Gemma3 => {
            // Defaults for values some Gemma 3 configs leave out (the converter's).
            m.u32("context_length", context.unwrap_or(131072));
            m.u32("attention.head_count", d.n_heads);
            m.f32("attention.layer_norm_rms_epsilon", rms_eps.unwrap_or(1e-6));
            m.u32("attention.key_length", d.head_dim);
            m.u32("attention.value_length", d.head_dim);
            m.f32("rope.freq_base", rope.theta.unwrap_or(1_000_000.0));
            if let Some(cap) = c.opt_f64("final_logit_softcapping")?.filter(|&x| x != 0.0) {
                m.f32("final_logit_softcapping", cap);
            }
            if c.opt_usize("sliding_window_pattern")? != Some(1) {
                m.u32("attention.sliding_window", c.usize("sliding_window")?);
            }
            m.u32("attention.head_count_kv", d.n_kv_heads);
        }
        _ => {}
    }
    Ok(m.out)
}

/// The scaling keys the converter writes for `linear`, `yarn` and `longrope` (llama3's scaling
/// becomes the `rope_freqs.weight` tensor instead).
fn rope_scaling(m: &mut Meta<'_>, rope: &RopeParams) -> Result<()> {
    let string = |s: &str| MetadataValue::String(s.to_string());
    match (rope.rope_type.as_deref(), rope.factor) {
        (Some("linear"), Some(factor)) => {
            m.set("rope.scaling.type", string("linear"));
            m.f32("rope.scaling.factor", factor);
        }
        (Some("yarn"), Some(factor)) => {
            m.set("rope.scaling.type", string("yarn"));
            m.f32("rope.scaling.factor", factor);
            if let Some(original) = rope.original_max_position_embeddings {
                m.u32("rope.scaling.original_context_length", original as usize);
            }
        }
        (Some("su" | "longrope"), _) => m.set("rope.scaling.type", string("longrope")),
        _ => {}
    }
    Ok(())
}

/// Phi-3's longrope attention factor, when the config has `long_factor`s (converter's
/// `Phi3MiniModel.generate_extra_tensors`): `sqrt(1 + ln(s) / ln(original))` for
/// `s = context / original > 1`, else 1.
fn longrope_attn_factor(c: &HfConfig, rope: &RopeParams, original: f64) -> Result<Option<f64>> {
    if rope.long_factor.is_none() {
        return Ok(None);
    }
    let context = c.first_usize(&["n_positions", "max_position_embeddings"])? as f64;
    let scale = context / original;
    Ok(Some(match rope.rope_type.as_deref() {
        Some("su" | "longrope") if scale > 1.0 => (1.0 + scale.ln() / original.ln()).sqrt(),
        Some("yarn") if scale > 1.0 => 0.1 * scale.ln() + 1.0,
        _ => 1.0,
    }))
}
