//! What the engine asks of a backend: "run this flat batch with these block tables, give me logits".
//!
//! Everything above this trait (scheduler, KV block manager, sampler, stop policy) is shared by every
//! backend and tested once; the CPU llama model and the CUDA model (`crate::backend::cuda::CudaModel`)
//! implement it.

/// One sequence's part of a step's batch.
///
/// The tokens run at positions `start_pos .. start_pos + tokens.len()`; the sequence's earlier
/// positions `0 .. start_pos` are already in the KV cache (computed by earlier steps or shared from the
/// prefix cache).
#[derive(Debug, Clone, Copy)]
pub struct BatchEntry<'a> {
    /// Token ids to run (never empty).
    pub tokens: &'a [u32],
    /// Position of `tokens[0]` in the sequence.
    pub start_pos: usize,
    /// Physical KV block ids: block `i` holds positions `i * block_size .. (i + 1) * block_size`.
    /// Covers at least `start_pos + tokens.len()` positions.
    pub block_table: &'a [u32],
    /// Whether the logits of the last token are wanted (the chunk ends the known tokens).
    pub want_logits: bool,
}

/// A model that runs a flattened batch of sequences over a paged KV cache.
///
/// Contract (batch invariance): the logits of an entry, and the K/V it writes, are bitwise identical
/// whatever else is in the batch, however its tokens were split into chunks, and whether its earlier
/// positions were computed by itself or shared from the prefix cache.
pub trait BatchModel: Send + 'static {
    /// The paged KV storage (all blocks of all layers).
    type Kv: Send;
    /// KV bytes per token (all layers, K and V).
    fn kv_bytes_per_token(&self) -> usize;
    /// Allocates storage for `num_blocks` blocks of `block_size` tokens.
    fn new_kv(&self, num_blocks: usize, block_size: usize) -> Self::Kv;
    /// Runs `batch` in one step: writes each entry's K/V into its blocks and returns the logits
    /// (`[vocab_size]` f32 each) of the last token of every entry with `want_logits`, in batch order.
    ///
    /// Errors: an empty entry, an out-of-vocabulary id, a block table too short for the positions,
    /// positions past the context length.
    fn forward_batch(
        &self,
        batch: &[BatchEntry<'_>],
        kv: &mut Self::Kv,
    ) -> anyhow::Result<Vec<Vec<f32>>>;
    /// Context length, in tokens.
    fn context_length(&self) -> usize;
    /// Vocabulary size (length of each logits vector).
    fn vocab_size(&self) -> usize;
}
