//! [`crate::engine::SequenceModel`] for the CPU llama model.

use super::{KvCache, LlamaModel};
use crate::engine::SequenceModel;

impl SequenceModel for LlamaModel {
    type Cache = KvCache;

    fn new_cache(&self) -> KvCache {
        LlamaModel::new_cache(self)
    }

    fn cache_len(cache: &KvCache) -> usize {
        cache.len()
    }

    fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> anyhow::Result<Vec<f32>> {
        Ok(LlamaModel::forward(self, tokens, cache)?)
    }

    fn context_length(&self) -> usize {
        self.config().context_length
    }

    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }
}
