//! Runs the text's windows through the CPU backend's real forward pass in two numerics settings,
//! side by side, and scores every position ([`super::metrics::QualityTally`]).
//!
//! Each window runs from position 0 into its own paged KV cache (blocks of [`BLOCK`] tokens; the
//! caches are reused from window to window, every position being written before it is read). A
//! window's last token is only a target, so its first `n - 1` tokens are the input, in chunks of
//! at most `chunk` tokens with `logit_tokens` covering the chunk's scored positions: the backend
//! returns the logits of those positions, each bitwise the row that a pass ending at that position
//! would return (the backend's chunk invariance), and at most `chunk` rows of `vocab` f32 per
//! setting are held at once (64 rows of Gemma 3's 262,144-token vocabulary are 64 MiB).
//!
//! Scored are the window's tokens from index `max(1, score_from)` on (`score_from` 0: every token
//! but the first; `llama-perplexity` scores from `window / 2`).

use backend_cpu::{CpuModel, PagedKvCache};
use engine::backend::{BatchEntry, Logits};

use super::metrics::QualityTally;
use super::QualityError;

/// Tokens per KV block.
pub const BLOCK: usize = 16;

/// The two settings' models (the same weights in two numerics modes) and their caches.
pub struct SideBySide<'m> {
    baseline: &'m CpuModel,
    candidate: &'m CpuModel,
    kv: [PagedKvCache; 2],
    table: Vec<u32>,
    logits: [Logits; 2],
    chunk: usize,
    score_from: usize,
}

impl<'m> SideBySide<'m> {
    /// Caches for windows of up to `window` tokens; chunks of `chunk` tokens (at least 1); each
    /// window scored from its token `score_from` on (see the module docs).
    ///
    /// Errors: [`QualityError::ScoreFromPastWindow`] when `score_from` leaves nothing to score,
    /// [`QualityError::WindowPastContext`] when `window` exceeds the model's context,
    /// [`QualityError::VocabMismatch`] when the two models' vocabularies differ.
    pub fn new(
        baseline: &'m CpuModel,
        candidate: &'m CpuModel,
        window: usize,
        chunk: usize,
        score_from: usize,
    ) -> Result<SideBySide<'m>, QualityError> {
        if score_from >= window {
            return Err(QualityError::ScoreFromPastWindow { score_from, window });
        }
        let context = baseline.config().context_length;
        if window > context {
            return Err(QualityError::WindowPastContext { window, context });
        }
        let (vb, vc) = (baseline.config().vocab_size, candidate.config().vocab_size);
        if vb != vc {
            return Err(QualityError::VocabMismatch {
                baseline: vb,
                candidate: vc,
            });
        }
        let blocks = window.div_ceil(BLOCK);
        Ok(SideBySide {
            baseline,
            candidate,
            kv: [
                baseline.new_kv(blocks, BLOCK),
                candidate.new_kv(blocks, BLOCK),
            ],
            table: (0..blocks as u32).collect(),
            logits: [Logits::new(), Logits::new()],
            chunk: chunk.max(1),
            score_from,
        })
    }

    /// Runs `window` (token ids, at most the `window` of [`Self::new`]) in both settings and adds
    /// its scored positions (the predictions of `window[max(1, score_from)..]`) to `tally`.
    /// Returns how many positions it scored.
    ///
    /// Errors: [`QualityError::Model`] when the backend refuses a step (e.g. an id outside the
    /// vocabulary); [`QualityError::TokenOutOfVocab`] for an id outside the vocabulary (the
    /// tokenizer's and the model's vocabularies differ); [`QualityError::WindowPastContext`] for a
    /// window longer than the caches.
    pub fn score_window(
        &mut self,
        window: &[u32],
        tally: &mut QualityTally,
    ) -> Result<usize, QualityError> {
        let capacity = self.table.len() * BLOCK;
        if window.len() > capacity {
            return Err(QualityError::WindowPastContext {
                window: window.len(),
                context: capacity,
            });
        }
        let vocab = self.baseline.config().vocab_size;
        if let Some(&id) = window.iter().find(|&&id| id as usize >= vocab) {
            return Err(QualityError::TokenOutOfVocab { id, vocab });
        }
        let Some((_, input)) = window.split_last() else {
            return Ok(0);
        };
        // Input position `p` predicts `window[p + 1]`: the scored rows are `first_row..`.
        let first_row = self.score_from.saturating_sub(1);
        let mut start = 0;
        while start < input.len() {
            let end = (start + self.chunk).min(input.len());
            let from = start.max(first_row).min(end);
            let entry = BatchEntry {
                tokens: &input[start..end],
                start_pos: start,
                block_table: &self.table,
                logit_tokens: end - from,
            };
            let [kv_b, kv_c] = &mut self.kv;
            let [logits_b, logits_c] = &mut self.logits;
            self.baseline.forward_batch_into(&[entry], kv_b, logits_b)?;
            self.candidate
                .forward_batch_into(&[entry], kv_c, logits_c)?;
            for (i, (row_b, row_c)) in logits_b.iter().zip(logits_c.iter()).enumerate() {
                tally.add(row_b, row_c, window[from + i + 1]);
            }
            start = end;
        }
        Ok(input.len().saturating_sub(first_row))
    }
}
