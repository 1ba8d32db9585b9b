//! [`engine::backend::BatchModel`] for the CPU llama model: a thin adapter over
//! [`CpuModel::forward_batch_into`] and [`PagedKvCache`].

use super::{CpuModel, PagedKvCache};
use engine::backend::{BatchEntry, BatchModel, Logits, StepError};

impl BatchModel for CpuModel {
    type Kv = PagedKvCache;

    fn kv_bytes_per_token(&self) -> usize {
        CpuModel::kv_bytes_per_token(self)
    }

    fn new_kv(&self, num_blocks: usize, block_size: usize) -> PagedKvCache {
        CpuModel::new_kv(self, num_blocks, block_size)
    }

    fn forward_batch(
        &self,
        batch: &[BatchEntry<'_>],
        kv: &mut PagedKvCache,
        logits: &mut Logits,
    ) -> Result<(), StepError> {
        Ok(CpuModel::forward_batch_into(self, batch, kv, logits)?)
    }

    fn context_length(&self) -> usize {
        self.config().context_length
    }

    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }
}
