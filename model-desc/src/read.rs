//! [`ModelDesc::from_source`]: the description from GGUF metadata (`{arch}.*` keys as llama.cpp's
//! `convert_hf_to_gguf.py` writes them), the `rope_freqs.weight` tensor, and the published
//! [`defaults`] for what the file does not store.

use gguf::GgmlType;

use super::defaults;
use super::{
    Activation, Arch, ArchError, LayerDesc, ModelDesc, ModelSource, Projections, RopeStyle,
};

/// Metadata of one architecture: `{arch}.{key}` lookups.
struct Keys<'a> {
    src: &'a dyn ModelSource,
    arch: Arch,
}

impl Keys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch.name())
    }

    fn usize(&self, k: &str) -> Result<Option<usize>, ArchError> {
        Ok(self.src.meta_u32(&self.key(k))?.map(|v| v as usize))
    }

    fn required(&self, k: &str) -> Result<usize, ArchError> {
        self.usize(k)?
            .ok_or_else(|| ArchError::MissingKey(self.key(k)))
    }

    fn f32(&self, k: &str) -> Result<Option<f32>, ArchError> {
        self.src.meta_f32(&self.key(k))
    }

    fn str(&self, k: &str) -> Result<Option<String>, ArchError> {
        self.src.meta_str(&self.key(k))
    }
}

/// Most layers a model may declare (`{arch}.block_count`): the largest published models of the
/// supported architectures have under 200, so a larger count is a corrupt file, refused before
/// anything is allocated per layer.
pub const MAX_LAYERS: usize = 4096;

impl ModelDesc {
    /// Reads the description of the model in `src`.
    ///
    /// Errors: [`ArchError::MissingKey`] for `general.architecture` or a required `{arch}.*`
    /// key; [`ArchError::UnsupportedArchitecture`]; [`ArchError::InvalidConfig`] for sizes that
    /// do not fit together, a `block_count` above [`MAX_LAYERS`], a partial RoPE (`rope.dimension_count != head size`), value heads of
    /// another size than key heads, a RoPE scaling other than `linear`, or Phi-3's LongRoPE
    /// factor tensors; [`ArchError::Tensor`] for a `rope_freqs.weight` that is not `[head/2]`;
    /// [`ArchError::Source`] for unreadable metadata.
    pub fn from_source(src: &dyn ModelSource) -> Result<ModelDesc, ArchError> {
        let name = src
            .meta_str("general.architecture")?
            .ok_or_else(|| ArchError::MissingKey("general.architecture".into()))?;
        let arch = Arch::from_name(&name)
            .ok_or_else(|| ArchError::UnsupportedArchitecture(name.clone()))?;
        let m = Keys { src, arch };
        let n_layers = m.required("block_count")?;
        if n_layers > MAX_LAYERS {
            return Err(ArchError::InvalidConfig(format!(
                "{} is {n_layers}, more than the {MAX_LAYERS} layers any supported model has \
                 (a corrupt file?)",
                m.key("block_count")
            )));
        }
        let hidden = m.required("embedding_length")?;
        let n_heads = m.required("attention.head_count")?;
        let n_kv_heads = m.usize("attention.head_count_kv")?.unwrap_or(n_heads);
        let head_dim = match m.usize("attention.key_length")? {
            Some(v) => v,
            None if n_heads > 0 => hidden / n_heads,
            None => 0,
        };
        if let Some(v) = m.usize("attention.value_length")? {
            if v != head_dim {
                return Err(ArchError::InvalidConfig(format!(
                    "{}: value heads of {v} differ from key heads of {head_dim} (not supported)",
                    m.key("attention.value_length")
                )));
            }
        }
        if let Some(rope_dims) = m.usize("rope.dimension_count")? {
            if rope_dims != head_dim {
                return Err(ArchError::InvalidConfig(format!(
                    "partial RoPE is not supported ({} {rope_dims}, head size {head_dim})",
                    m.key("rope.dimension_count")
                )));
            }
        }
        let vocab_size = match m.usize("vocab_size")? {
            Some(v) => v,
            None => src
                .meta_array_len("tokenizer.ggml.tokens")?
                .ok_or_else(|| {
                    ArchError::InvalidConfig(format!(
                        "neither {} nor tokenizer.ggml.tokens is present",
                        m.key("vocab_size")
                    ))
                })?,
        };
        let rope_base = m.f32("rope.freq_base")?.unwrap_or(defaults::ROPE_BASE);
        // Written by today's converter (and by the Hugging Face folder reader); older Gemma 3
        // files leave it to the published default.
        let local_rope_base = m
            .f32("rope.freq_base_swa")?
            .unwrap_or(defaults::GEMMA3_LOCAL_ROPE_BASE);
        let rope_scale = rope_position_scale(&m)?;
        if src.has_tensor("rope_factors_long.weight") || src.has_tensor("rope_factors_short.weight")
        {
            return Err(ArchError::InvalidConfig(
                "LongRoPE (rope_factors_long/short tensors, Phi-3 128k) is not supported".into(),
            ));
        }
        let rope_freq_factors = freq_factors(src, head_dim)?;

        let gemma = matches!(arch, Arch::Gemma2 | Arch::Gemma3);
        let window = match arch {
            Arch::Gemma2 => Some(
                m.usize("attention.sliding_window")?
                    .unwrap_or(defaults::GEMMA2_SLIDING_WINDOW),
            ),
            Arch::Gemma3 => m.usize("attention.sliding_window")?.filter(|&w| w > 0),
            _ => None,
        };
        let layers = (0..n_layers)
            .map(|l| {
                let local = window.filter(|_| defaults::is_local_layer(arch, l));
                let gemma3_local = arch == Arch::Gemma3 && local.is_some();
                LayerDesc {
                    sliding_window: local,
                    rope_base: if gemma3_local {
                        local_rope_base
                    } else {
                        rope_base
                    },
                    rope_scale: if gemma3_local { 1.0 } else { rope_scale },
                }
            })
            .collect();
        let (attn_softcap, final_softcap) = match arch {
            Arch::Gemma2 => (
                Some(
                    m.f32("attn_logit_softcapping")?
                        .unwrap_or(defaults::GEMMA2_ATTN_SOFTCAP),
                ),
                Some(
                    m.f32("final_logit_softcapping")?
                        .unwrap_or(defaults::GEMMA2_FINAL_SOFTCAP),
                ),
            ),
            Arch::Gemma3 => (
                m.f32("attn_logit_softcapping")?,
                m.f32("final_logit_softcapping")?,
            ),
            _ => (None, None),
        };
        let attn_scale = match m.f32("attention.scale")? {
            Some(s) => s,
            None if gemma && n_heads > 0 => {
                let q = defaults::gemma_query_pre_attn_scalar(
                    arch, n_layers, hidden, n_heads, head_dim,
                );
                1.0 / (q as f32).sqrt()
            }
            None => 1.0 / (head_dim as f32).sqrt(),
        };
        let desc = ModelDesc {
            arch,
            n_layers,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim: m.required("feed_forward_length")?,
            vocab_size,
            context_length: m.required("context_length")?,
            rms_eps: m
                .f32("attention.layer_norm_rms_epsilon")?
                .unwrap_or(defaults::RMS_EPS),
            rope_base,
            rope_style: match arch {
                Arch::Llama => RopeStyle::Interleaved,
                _ => RopeStyle::Neox,
            },
            rope_freq_factors,
            activation: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            projections: match arch {
                Arch::Phi3 => Projections::Fused,
                _ => Projections::Separate,
            },
            qkv_bias: arch == Arch::Qwen2,
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3),
            post_norms: gemma,
            embed_scale: gemma.then(|| defaults::gemma_embed_scale(hidden)),
            attn_scale,
            attn_softcap,
            final_softcap,
            layers,
        };
        desc.validate()?;
        Ok(desc)
    }
}

/// The position multiplier of `{arch}.rope.scaling.type`: 1 for none, `1 / factor` for
/// `linear`. Errors: other scaling types (YaRN, LongRoPE), a missing or non-positive factor.
fn rope_position_scale(m: &Keys<'_>) -> Result<f32, ArchError> {
    match m.str("rope.scaling.type")?.as_deref() {
        None | Some("none") => Ok(1.0),
        Some("linear") => {
            let key = m.key("rope.scaling.factor");
            match m.f32("rope.scaling.factor")? {
                Some(f) if f > 0.0 && f.is_finite() => Ok(1.0 / f),
                other => Err(ArchError::InvalidConfig(format!(
                    "{key} is {other:?}, expected a positive factor for linear RoPE scaling"
                ))),
            }
        }
        Some(other) => Err(ArchError::InvalidConfig(format!(
            "RoPE scaling `{other}` ({}) is not supported (none, linear; Llama 3's is read from \
             rope_freqs.weight)",
            m.key("rope.scaling.type")
        ))),
    }
}

/// Llama 3's `rope_freqs.weight` (`[head_dim / 2]` f32 divisors of the RoPE frequencies), when
/// present.
fn freq_factors(src: &dyn ModelSource, head_dim: usize) -> Result<Option<Vec<f32>>, ArchError> {
    const NAME: &str = "rope_freqs.weight";
    let Some(t) = src.tensor(NAME)? else {
        return Ok(None);
    };
    let bad = |message: String| ArchError::Tensor {
        name: NAME.into(),
        message,
    };
    if t.dims != [head_dim as u64 / 2] {
        return Err(bad(format!(
            "dims {:?}, expected [{}] (half the head size)",
            t.dims,
            head_dim / 2
        )));
    }
    if t.dtype != GgmlType::F32 {
        return Err(bad(format!("type {}, expected F32", t.dtype)));
    }
    let values = gguf::dequantize_to_vec(t.dtype, &t.bytes, head_dim / 2)?;
    Ok(Some(values))
}
