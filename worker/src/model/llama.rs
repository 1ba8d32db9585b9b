//! The llama forward pass (Touvron et al. 2023; pre-norm RMSNorm, RoPE,
//! grouped-query attention, SwiGLU FFN), f32 throughout.

use std::path::Path;

use gguf::GgufFile;

use super::attention::{attention, HeadShape};
use super::matmul::matmul;
use super::ops::{rms_norm, swiglu, RopeTable};
use super::weights::ModelWeights;
use super::{KvCache, LlamaConfig, ModelError};

/// A llama model with f32 weights in memory, run on the CPU.
#[derive(Debug)]
pub struct LlamaModel {
    config: LlamaConfig,
    weights: ModelWeights,
}

impl LlamaModel {
    /// Opens the GGUF file at `path`, reads its config and dequantizes all
    /// weights to f32 (about 4 bytes per parameter: ~540 MB for SmolLM2-135M).
    ///
    /// Errors: [`ModelError::Gguf`] (I/O, format, unsupported tensor types),
    /// [`ModelError::UnsupportedArchitecture`], [`ModelError::InvalidConfig`],
    /// [`ModelError::MissingTensor`], [`ModelError::TensorShape`].
    pub fn load(path: &Path) -> Result<LlamaModel, ModelError> {
        let file = GgufFile::open(path)?;
        let config = LlamaConfig::from_gguf(&file)?;
        let weights = ModelWeights::load(&file, &config)?;
        Ok(LlamaModel { config, weights })
    }

    /// Builds a model from an already-validated config and weights.
    pub fn from_parts(config: LlamaConfig, weights: ModelWeights) -> LlamaModel {
        LlamaModel { config, weights }
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// A new, empty KV cache for one sequence.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.config.n_layers, self.config.kv_dim())
    }

    fn check(&self, tokens: &[u32], cache: &KvCache) -> Result<(), ModelError> {
        let c = &self.config;
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(ModelError::TokenOutOfRange {
                token,
                vocab_size: c.vocab_size,
            });
        }
        let needed = cache.len() + tokens.len();
        if needed > c.context_length {
            return Err(ModelError::ContextOverflow {
                needed,
                context_length: c.context_length,
            });
        }
        if cache.layers.len() != c.n_layers || cache.kv_dim != c.kv_dim() {
            return Err(ModelError::CacheMismatch(format!(
                "cache has {} layers of width {}, model {} of width {}",
                cache.layers.len(),
                cache.kv_dim,
                c.n_layers,
                c.kv_dim()
            )));
        }
        Ok(())
    }

    /// Runs `tokens` at positions `cache.len()..cache.len() + tokens.len()`,
    /// appends their keys/values to `cache`, and returns the logits
    /// (`[vocab_size]`, f32, unnormalised) of the last token.
    ///
    /// All tokens go through each linear layer as one `[n, hidden]` matrix
    /// multiply (prefill); pass one token for a decode step. A token's logits
    /// are bit-identical whether it is processed alone or in a batch.
    ///
    /// Errors (the cache is left unchanged): [`ModelError::EmptyInput`],
    /// [`ModelError::TokenOutOfRange`], [`ModelError::ContextOverflow`],
    /// [`ModelError::CacheMismatch`].
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Vec<f32>, ModelError> {
        self.check(tokens, cache)?;
        // Drop K/V left behind by an earlier forward that panicked midway.
        cache.rollback();
        let c = &self.config;
        let (n, hidden, start) = (tokens.len(), c.hidden, cache.len());
        let (q_dim, kv_dim) = (c.q_dim(), c.kv_dim());
        let heads = HeadShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };
        let rope = RopeTable::new(start, n, c.head_dim, c.rope_base);

        let mut x = Vec::with_capacity(n * hidden);
        for &t in tokens {
            x.extend_from_slice(self.weights.token_embd.row(t as usize));
        }

        for (layer, lc) in self.weights.layers.iter().zip(&mut cache.layers) {
            // Attention block.
            let xn = rms_norm(&x, &layer.attn_norm, c.rms_eps);
            let mut qkv = matmul(&xn, n, hidden, &layer.wqkv.data);
            let row = q_dim + 2 * kv_dim;
            let mut q = Vec::with_capacity(n * q_dim);
            for (t, r) in qkv.chunks_exact_mut(row).enumerate() {
                let (qt, kv) = r.split_at_mut(q_dim);
                let (k, v) = kv.split_at_mut(kv_dim);
                rope.apply(qt, t);
                rope.apply(k, t);
                q.extend_from_slice(qt);
                lc.k.extend_from_slice(k);
                lc.v.extend_from_slice(v);
            }
            let att = attention(&q, n, start, lc, heads);
            let o = matmul(&att, n, q_dim, &layer.wo.data);
            add_in_place(&mut x, &o);

            // Feed-forward block.
            let xn = rms_norm(&x, &layer.ffn_norm, c.rms_eps);
            let gu = matmul(&xn, n, hidden, &layer.w_gate_up.data);
            let h = swiglu(&gu, c.ffn_dim);
            let d = matmul(&h, n, c.ffn_dim, &layer.w_down.data);
            add_in_place(&mut x, &d);
        }
        cache.commit(n);

        let last = &x[(n - 1) * hidden..];
        let xn = rms_norm(last, &self.weights.output_norm, c.rms_eps);
        Ok(matmul(&xn, 1, hidden, &self.weights.lm_head().data))
    }
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> (tempfile::TempDir, LlamaModel) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        gguf::testing::write_tiny_llama(&path, 42).unwrap();
        let model = LlamaModel::load(&path).unwrap();
        (dir, model)
    }

    #[test]
    fn batch_and_single_are_bit_identical() {
        let (_dir, model) = tiny();
        let prompt = [1u32, 40, 77, 100, 200, 5, 9, 260, 270, 33, 2];
        // The same token at the same position: once inside a prefill batch, once alone.
        for split in [1usize, 4, 7, 10] {
            let mut a = model.new_cache();
            let batched = model.forward(&prompt[..split + 1], &mut a).unwrap();
            let mut b = model.new_cache();
            model.forward(&prompt[..split], &mut b).unwrap();
            let single = model.forward(&prompt[split..split + 1], &mut b).unwrap();
            assert_eq!(batched, single, "split {split}");
            assert_eq!(a.layers[0].k, b.layers[0].k);
        }
    }

    #[test]
    fn errors_leave_cache_untouched() {
        let (_dir, model) = tiny();
        let mut cache = model.new_cache();
        model.forward(&[1, 2, 3], &mut cache).unwrap();
        let vocab = model.config().vocab_size as u32;
        assert!(matches!(
            model.forward(&[], &mut cache),
            Err(ModelError::EmptyInput)
        ));
        assert!(matches!(
            model.forward(&[5, vocab], &mut cache),
            Err(ModelError::TokenOutOfRange { token, .. }) if token == vocab
        ));
        let long = vec![3u32; model.config().context_length - 2];
        assert!(matches!(
            model.forward(&long, &mut cache),
            Err(ModelError::ContextOverflow { needed, .. }) if needed == model.config().context_length + 1
        ));
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.layers[1].k.len(), 3 * model.config().kv_dim());
        // Exactly filling the context is allowed.
        let fill = vec![3u32; model.config().context_length - 3];
        model.forward(&fill, &mut cache).unwrap();
        assert_eq!(cache.len(), model.config().context_length);
        cache.clear();
        assert!(cache.is_empty());
    }

    #[test]
    fn logits_are_finite_and_vary() {
        let (_dir, model) = tiny();
        let mut cache = model.new_cache();
        let logits = model.forward(&[1, 72, 105], &mut cache).unwrap();
        assert_eq!(logits.len(), model.config().vocab_size);
        assert!(logits.iter().all(|v| v.is_finite()));
        let spread = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
            - logits.iter().fold(f32::INFINITY, |a, &b| a.min(b));
        assert!(spread > 0.1, "spread {spread}");
    }
}
