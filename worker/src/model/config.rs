//! Llama hyper-parameters read from GGUF metadata (`{arch}.*` keys as written
//! by llama.cpp's `convert_hf_to_gguf.py`).

use gguf::GgufFile;

use super::ModelError;

/// Hyper-parameters of a llama-architecture model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Transformer blocks (`llama.block_count`).
    pub n_layers: usize,
    /// Embedding width (`llama.embedding_length`).
    pub hidden: usize,
    /// Query heads (`llama.attention.head_count`).
    pub n_heads: usize,
    /// Key/value heads (`llama.attention.head_count_kv`, default `n_heads`).
    pub n_kv_heads: usize,
    /// Per-head width (`llama.attention.key_length`, default `hidden / n_heads`).
    pub head_dim: usize,
    /// Feed-forward width (`llama.feed_forward_length`).
    pub ffn_dim: usize,
    /// Vocabulary size (`llama.vocab_size`, else the length of `tokenizer.ggml.tokens`).
    pub vocab_size: usize,
    /// Maximum sequence length in tokens (`llama.context_length`).
    pub context_length: usize,
    /// RoPE base θ (`llama.rope.freq_base`, default 10000).
    pub rope_base: f32,
    /// RMSNorm epsilon (`llama.attention.layer_norm_rms_epsilon`, default 1e-5).
    pub rms_eps: f32,
}

impl LlamaConfig {
    /// Reads the config of `file`.
    ///
    /// Errors: [`ModelError::UnsupportedArchitecture`] unless
    /// `general.architecture` is `"llama"`; [`ModelError::Gguf`] for missing or
    /// mistyped keys; [`ModelError::InvalidConfig`] for zero sizes, heads not
    /// dividing evenly, an odd head dimension, or a partial RoPE
    /// (`rope.dimension_count != head_dim`), which is not supported.
    pub fn from_gguf(file: &GgufFile) -> Result<LlamaConfig, ModelError> {
        let arch = file.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::UnsupportedArchitecture(arch.to_string()));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let get = |k: &str| -> Result<usize, ModelError> { Ok(file.get_u32(&key(k))? as usize) };
        let n_heads = get("attention.head_count")?;
        let hidden = get("embedding_length")?;
        let n_kv_heads = match file.get_opt_u32(&key("attention.head_count_kv"))? {
            Some(v) => v as usize,
            None => n_heads,
        };
        let head_dim = match file.get_opt_u32(&key("attention.key_length"))? {
            Some(v) => v as usize,
            None if n_heads > 0 => hidden / n_heads,
            None => 0,
        };
        let vocab_size = match file.get_opt_u32(&key("vocab_size"))? {
            Some(v) => v as usize,
            None => file
                .get_opt_str_array("tokenizer.ggml.tokens")?
                .map(<[String]>::len)
                .ok_or_else(|| {
                    ModelError::InvalidConfig(
                        "neither llama.vocab_size nor tokenizer.ggml.tokens is present".into(),
                    )
                })?,
        };
        let config = LlamaConfig {
            n_layers: get("block_count")?,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim: get("feed_forward_length")?,
            vocab_size,
            context_length: get("context_length")?,
            rope_base: file.get_opt_f32(&key("rope.freq_base"))?.unwrap_or(10000.0),
            rms_eps: file
                .get_opt_f32(&key("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-5),
        };
        if let Some(rope_dims) = file.get_opt_u32(&key("rope.dimension_count"))? {
            if rope_dims as usize != config.head_dim {
                return Err(ModelError::InvalidConfig(format!(
                    "partial RoPE is not supported (rope.dimension_count {rope_dims}, head_dim {})",
                    config.head_dim
                )));
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks that the sizes are usable. Errors: [`ModelError::InvalidConfig`].
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::InvalidConfig(m));
        let sizes = [
            ("n_layers", self.n_layers),
            ("hidden", self.hidden),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("ffn_dim", self.ffn_dim),
            ("vocab_size", self.vocab_size),
            ("context_length", self.context_length),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{name} is 0"));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "head_count {} is not a multiple of head_count_kv {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} is odd", self.head_dim));
        }
        if !(self.rope_base > 0.0 && self.rms_eps >= 0.0) {
            return bad(format!(
                "rope base {} / rms eps {} out of range",
                self.rope_base, self.rms_eps
            ));
        }
        Ok(())
    }

    /// Width of all query heads together (`n_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of all key (or value) heads together (`n_kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tiny_model() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        let info = gguf::testing::write_tiny_llama(&path, 1).unwrap();
        let c = LlamaConfig::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        assert_eq!(c.n_layers, info.n_layers);
        assert_eq!(c.hidden, 64);
        assert_eq!(c.n_heads, 4);
        assert_eq!(c.n_kv_heads, 2);
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.ffn_dim, 128);
        assert_eq!(c.vocab_size, info.vocab_size());
        assert_eq!(c.context_length, 256);
        assert_eq!(c.rope_base, 10000.0);
    }

    #[test]
    fn rejects_other_architectures() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.gguf");
        let mut w = gguf::GgufWriter::new();
        w.add_string("general.architecture", "gpt2");
        w.write(&path).unwrap();
        let err = LlamaConfig::from_gguf(&GgufFile::open(&path).unwrap()).unwrap_err();
        assert!(matches!(err, ModelError::UnsupportedArchitecture(ref a) if a == "gpt2"));
    }
}
