//! A step's token layout, shared by every backend: each token's position and KV slot, the rows
//! whose logits are returned, and the checks that must pass before anything is written.

use super::{BatchEntry, EntryLimits, ModelError};

/// One token of a step, in batch order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedToken {
    /// Token id.
    pub token: u32,
    /// Position in its sequence.
    pub pos: usize,
    /// KV slot it writes: `block_table[pos / block_size] * block_size + pos % block_size`.
    pub slot: usize,
    /// Index of its entry in the batch.
    pub entry: usize,
}

/// A checked batch, flattened: every entry's tokens in batch order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Every token of every entry, entries in batch order (`[n_tokens]`).
    pub tokens: Vec<PlannedToken>,
    /// Index in [`StepPlan::tokens`] of each of the last `logit_tokens` tokens of every entry, in
    /// batch order (`[n_logits]`): the rows whose logits the step returns.
    pub logit_rows: Vec<usize>,
    /// KV blocks each entry covers, `ceil((start_pos + tokens.len()) / block_size)` (`[n_entries]`).
    pub needed_blocks: Vec<usize>,
}

impl StepPlan {
    /// Checks every entry against `limits` and lays out the batch's tokens.
    ///
    /// Errors, before anything is computed: those of [`EntryLimits::check`] (the first failing
    /// entry), then [`ModelError::SlotConflict`] if two tokens of the batch would write one KV slot
    /// (the lowest such slot, with the entries writing it).
    pub fn new(batch: &[BatchEntry<'_>], limits: EntryLimits) -> Result<StepPlan, ModelError> {
        let bs = limits.block_size;
        let n: usize = batch.iter().map(|e| e.tokens.len()).sum();
        let mut plan = StepPlan {
            tokens: Vec::with_capacity(n),
            logit_rows: Vec::new(),
            needed_blocks: Vec::with_capacity(batch.len()),
        };
        for (entry, e) in batch.iter().enumerate() {
            plan.needed_blocks.push(limits.check(entry, e)?);
            for (i, &token) in e.tokens.iter().enumerate() {
                let pos = e.start_pos + i;
                let slot = e.block_table[pos / bs] as usize * bs + pos % bs;
                plan.tokens.push(PlannedToken {
                    token,
                    pos,
                    slot,
                    entry,
                });
            }
            let end = plan.tokens.len();
            plan.logit_rows.extend(end - e.logit_tokens..end);
        }
        let mut writes: Vec<(usize, usize)> =
            plan.tokens.iter().map(|t| (t.slot, t.entry)).collect();
        writes.sort_unstable();
        if let Some(w) = writes.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(ModelError::SlotConflict {
                slot: w[0].0,
                first: w[0].1,
                second: w[1].1,
            });
        }
        Ok(plan)
    }

    /// The most blocks any entry covers (0 for an empty batch).
    pub fn most_blocks(&self) -> usize {
        self.needed_blocks.iter().copied().max().unwrap_or(0)
    }
}

/// Small batches for the tests of every backend's step packing (feature `testing`, for the
/// backends' tests).
#[cfg(any(test, feature = "testing"))]
pub mod test_batch {
    use super::{BatchEntry, EntryLimits};

    /// 100 tokens, 64 positions, 8 blocks of 4 slots.
    pub const LIMITS: EntryLimits = EntryLimits {
        vocab_size: 100,
        context_length: 64,
        num_blocks: 8,
        block_size: 4,
    };

    /// An entry that wants logits.
    pub fn entry<'a>(tokens: &'a [u32], start_pos: usize, table: &'a [u32]) -> BatchEntry<'a> {
        BatchEntry {
            tokens,
            start_pos,
            block_table: table,
            logit_tokens: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_batch::{entry, LIMITS};
    use super::*;

    #[test]
    fn lays_out_tokens_slots_and_logit_rows() {
        let (a, b) = ([5, 6, 7], [9]);
        let mut second = entry(&b, 5, &[3, 1]);
        second.logit_tokens = 0;
        let plan = StepPlan::new(&[entry(&a, 3, &[2, 6]), second], LIMITS).unwrap();
        let slots: Vec<(u32, usize, usize, usize)> = plan
            .tokens
            .iter()
            .map(|t| (t.token, t.pos, t.slot, t.entry))
            .collect();
        // Position 3 is block 2 offset 3; positions 4 and 5 are block 6 offsets 0 and 1.
        assert_eq!(
            slots,
            [(5, 3, 11, 0), (6, 4, 24, 0), (7, 5, 25, 0), (9, 5, 5, 1)]
        );
        assert_eq!(plan.logit_rows, [2]);
        assert_eq!(plan.needed_blocks, [2, 2]);
        assert_eq!(plan.most_blocks(), 2);
    }

    #[test]
    fn refuses_two_writes_of_one_slot() {
        let (a, b) = ([1, 2], [3]);
        let err = StepPlan::new(&[entry(&a, 0, &[4]), entry(&b, 1, &[4])], LIMITS).unwrap_err();
        assert!(
            matches!(
                err,
                ModelError::SlotConflict {
                    slot: 17,
                    first: 0,
                    second: 1
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn reports_the_first_bad_entry() {
        let (ok, bad) = ([1], [100]);
        let err = StepPlan::new(&[entry(&ok, 0, &[0]), entry(&bad, 0, &[1])], LIMITS).unwrap_err();
        assert!(
            matches!(
                err,
                ModelError::TokenOutOfRange {
                    entry: 1,
                    token: 100,
                    ..
                }
            ),
            "{err}"
        );
        let empty = StepPlan::new(&[], LIMITS).unwrap();
        assert!(empty.tokens.is_empty() && empty.most_blocks() == 0);
    }
}
