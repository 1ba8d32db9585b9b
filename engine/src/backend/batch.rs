//! What the engine asks of a backend: "run this flat batch with these block tables, give me logits".
//!
//! Everything above this trait (scheduler, KV block manager, sampler, stop policy) is shared by every
//! backend and tested once; the CPU llama model and the CUDA model (`crate::backend::cuda::CudaModel`)
//! implement it.

use super::StepError;

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
    /// How many of the entry's last tokens have their logits returned (at most `tokens.len()`):
    /// 0 for none (a prefill chunk that does not end the known tokens), 1 for the last token (decode,
    /// a prefill's final chunk), more to score several positions in one pass (speculative
    /// verification, prompt logprobs). Each returned row is bitwise the row that a pass ending at
    /// that token would return (batch and chunk invariance).
    pub logit_tokens: usize,
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
    /// Runs `batch` in one step: writes each entry's K/V into its blocks and leaves in `logits` the
    /// logits (`[vocab_size]` f32 each) of the last `logit_tokens` tokens of every entry, entries
    /// in batch order and tokens in position order, and nothing else. `logits` is the caller's buffer, kept from step to step, so a
    /// step allocates none; after an error its contents are unspecified.
    ///
    /// Errors: [`StepError::Batch`] for an empty entry, an out-of-vocabulary id, a block table too
    /// short for the positions, positions past the context length; [`StepError::Device`] when the
    /// device fails.
    fn forward_batch(
        &self,
        batch: &[BatchEntry<'_>],
        kv: &mut Self::Kv,
        logits: &mut Logits,
    ) -> Result<(), StepError>;
    /// Context length, in tokens.
    fn context_length(&self) -> usize;
    /// Vocabulary size (length of each logits vector).
    fn vocab_size(&self) -> usize;
}

/// The logits of one step: a row of `vocab` f32 for each entry that wanted them, in batch order,
/// in one row-major `[rows, vocab]` buffer that the engine keeps from step to step (32 rows of Gemma
/// 3's 262,144-token vocabulary are 32 MiB, so neither a copy per row nor a new buffer per step).
/// Its allocation keeps the largest step's size: at most `max_num_seqs` rows, e.g. 128 MiB for 128
/// Gemma 3 sequences.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Logits {
    values: Vec<f32>,
    vocab: usize,
}

impl Logits {
    /// An empty buffer.
    pub fn new() -> Logits {
        Logits::default()
    }

    /// Sets the row length to `vocab` and returns the values for a backend to fill with whole rows
    /// (its length must end a multiple of `vocab`; e.g. `matmul_into` resizes it to
    /// `rows * vocab`). The allocation is kept.
    pub fn buffer(&mut self, vocab: usize) -> &mut Vec<f32> {
        assert!(vocab > 0, "Logits: vocab must be at least 1");
        self.vocab = vocab;
        &mut self.values
    }

    /// Empties the buffer and sets the row length to `vocab` (then [`Logits::push_row`]).
    pub fn clear(&mut self, vocab: usize) {
        self.buffer(vocab).clear();
    }

    /// Appends one row. Panics if `row.len()` is not the row length.
    pub fn push_row(&mut self, row: &[f32]) {
        assert_eq!(row.len(), self.vocab, "Logits: row length");
        self.values.extend_from_slice(row);
    }

    /// Number of rows. Panics if the values are not whole rows.
    pub fn rows(&self) -> usize {
        if self.vocab == 0 {
            return 0;
        }
        assert_eq!(self.values.len() % self.vocab, 0, "Logits: partial row");
        self.values.len() / self.vocab
    }

    /// Row `i`, `[vocab]`. Panics if out of range.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.vocab..(i + 1) * self.vocab]
    }

    /// The rows in order.
    pub fn iter(&self) -> impl Iterator<Item = &[f32]> + '_ {
        (0..self.rows()).map(|i| self.row(i))
    }
}

#[cfg(test)]
mod tests {
    use super::Logits;

    #[test]
    fn rows_of_one_buffer() {
        let mut l = Logits::new();
        assert_eq!(l.rows(), 0);
        l.clear(3);
        l.push_row(&[1.0, 2.0, 3.0]);
        l.push_row(&[4.0, 5.0, 6.0]);
        assert_eq!(l.rows(), 2);
        assert_eq!(l.row(1), [4.0, 5.0, 6.0]);
        assert_eq!(l.iter().map(|r| r[0]).collect::<Vec<_>>(), [1.0, 4.0]);
        // The next step reuses the allocation.
        let cap = l.buffer(3).capacity();
        l.clear(3);
        assert_eq!((l.rows(), l.buffer(3).capacity()), (0, cap));
    }

    #[test]
    #[should_panic(expected = "row length")]
    fn refuses_a_short_row() {
        let mut l = Logits::new();
        l.clear(4);
        l.push_row(&[1.0]);
    }
}
