//! Packing one engine step for the GPU: the flat token list, per-row positions and KV slots, the
//! entries' block tables as one `[n_entries, stride]` u32 matrix, the rows whose logits are wanted, and
//! (fast mode) the prefill tiles of `attention_prefill.cu`. The batch is checked and laid out by the
//! backends' shared [`StepPlan`] (the same [`ModelError`]s as the CPU backend) before anything is
//! uploaded.

use engine::backend::{BatchEntry, EntryLimits, ModelError, StepPlan};

/// Query rows per prefill tile (`PF_QUERIES` in `kernels/attention_prefill.cu`).
pub const PREFILL_TILE_ROWS: usize = 16;

/// One step's device inputs, ready to upload (all vectors `[n_rows]` unless noted).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepInputs {
    /// Token id of each row.
    pub tokens: Vec<u32>,
    /// Position of each row (RoPE); -1 for padding rows.
    pub positions: Vec<i32>,
    /// Position seen by `attention_decode` (-1: the row is left to the prefill kernel, or padding).
    pub att_positions: Vec<i32>,
    /// KV slot each row writes (`block * block_size + offset`); -1: no write (padding).
    pub slots: Vec<i64>,
    /// Index of the row's entry in `block_tables`.
    pub table_index: Vec<i32>,
    /// Block tables, `[n_entries, table_stride]`, zero-filled past each entry's needed blocks.
    pub block_tables: Vec<u32>,
    /// Row length of `block_tables`.
    pub table_stride: usize,
    /// Rows whose logits are returned, in batch order (`[n_logits]`).
    pub logit_rows: Vec<i32>,
    /// Prefill tiles `{row0, nq, pos0, table}` (`[n_tiles * 4]`, fast mode only).
    pub prefill_tiles: Vec<i32>,
    /// Largest `pos + 1` of any row (the attention kernel's key buffer size).
    pub max_keys: usize,
    /// Rows that are real tokens (the rest is padding from [`StepInputs::pad_to`]).
    pub real_rows: usize,
}

impl StepInputs {
    /// Number of rows (real and padding).
    pub fn n_rows(&self) -> usize {
        self.tokens.len()
    }

    /// Whether every entry is one token that wants logits (the step a decode graph can replay).
    pub fn is_pure_decode(&self) -> bool {
        self.prefill_tiles.is_empty()
            && self.logit_rows.len() == self.real_rows
            && (0..self.real_rows)
                .all(|i| self.logit_rows[i] as usize == i && self.table_index[i] as usize == i)
    }

    /// Pads to `rows` rows for a graph captured at that batch size: padding rows read token 0 and
    /// block table 0, skip RoPE, KV writes and attention (negative position / slot), and get logit rows
    /// of their own (ignored). No-op when already that large.
    pub fn pad_to(&mut self, rows: usize) {
        let n = self.n_rows();
        for r in n..rows {
            self.tokens.push(0);
            self.positions.push(-1);
            self.att_positions.push(-1);
            self.slots.push(-1);
            self.table_index.push(0);
            self.logit_rows.push(r as i32);
        }
        let tables = rows.max(1) * self.table_stride;
        if self.block_tables.len() < tables {
            self.block_tables.resize(tables, 0);
        }
    }
}

/// Checks `batch` and packs it.
///
/// `table_stride`: the block-table row length, at least the most blocks any entry needs (`None`: that
/// maximum; graphs pass the context length's block count so the stride is fixed). `split_prefill`:
/// entries of more than one token go to prefill tiles (fast mode) instead of the one-pass attention.
///
/// Errors, as the CPU model: [`ModelError::EmptyInput`], [`ModelError::TokenOutOfRange`],
/// [`ModelError::ContextOverflow`], [`ModelError::BlockTableTooShort`],
/// [`ModelError::BlockOutOfRange`], [`ModelError::SlotConflict`]; a `table_stride` too small is
/// reported as [`ModelError::BlockTableTooShort`] of the entry that needs more.
pub fn pack_step(
    batch: &[BatchEntry<'_>],
    limits: EntryLimits,
    table_stride: Option<usize>,
    split_prefill: bool,
) -> Result<StepInputs, ModelError> {
    let plan = StepPlan::new(batch, limits)?;
    let stride = table_stride.unwrap_or(plan.most_blocks()).max(1);
    if let Some(entry) = plan.needed_blocks.iter().position(|&n| n > stride) {
        return Err(ModelError::BlockTableTooShort {
            entry,
            needed: plan.needed_blocks[entry],
            have: stride,
        });
    }
    let mut s = StepInputs {
        table_stride: stride,
        block_tables: vec![0; batch.len() * stride],
        ..Default::default()
    };
    for (entry, &needed) in plan.needed_blocks.iter().enumerate() {
        s.block_tables[entry * stride..entry * stride + needed]
            .copy_from_slice(&batch[entry].block_table[..needed]);
    }
    for t in &plan.tokens {
        let tiled = split_prefill && batch[t.entry].tokens.len() > 1;
        s.tokens.push(t.token);
        s.positions.push(t.pos as i32);
        s.att_positions.push(if tiled { -1 } else { t.pos as i32 });
        s.slots.push(t.slot as i64);
        s.table_index.push(t.entry as i32);
        s.max_keys = s.max_keys.max(t.pos + 1);
    }
    let mut row0 = 0;
    for (entry, e) in batch.iter().enumerate() {
        if split_prefill && e.tokens.len() > 1 {
            for start in (0..e.tokens.len()).step_by(PREFILL_TILE_ROWS) {
                let nq = PREFILL_TILE_ROWS.min(e.tokens.len() - start);
                s.prefill_tiles.extend([
                    (row0 + start) as i32,
                    nq as i32,
                    (e.start_pos + start) as i32,
                    entry as i32,
                ]);
            }
        }
        row0 += e.tokens.len();
    }
    s.logit_rows = plan.logit_rows.iter().map(|&r| r as i32).collect();
    s.real_rows = s.tokens.len();
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::backend::test_batch::{entry, LIMITS};

    #[test]
    fn packs_rows_slots_tables_and_logit_rows() {
        let (t0, t1) = ([5u32], [7u32, 8, 9]);
        let (b0, b1) = ([3u32, 1], [6u32, 2, 5]);
        let batch = [entry(&t0, 5, &b0), entry(&t1, 2, &b1)];
        let s = pack_step(&batch, LIMITS, None, false).unwrap();
        assert_eq!(s.tokens, [5, 7, 8, 9]);
        assert_eq!(s.positions, [5, 2, 3, 4]);
        assert_eq!(s.att_positions, s.positions);
        // pos 5 of [3, 1]: block 1 -> id 1, slot 4 + 1; pos 2,3 of [6, 2, 5]: id 6; pos 4: id 2.
        assert_eq!(s.slots, [5, 26, 27, 8]);
        assert_eq!(s.table_index, [0, 1, 1, 1]);
        assert_eq!(s.table_stride, 2);
        assert_eq!(s.block_tables, [3, 1, 6, 2]);
        assert_eq!(s.logit_rows, [0, 3]);
        assert_eq!((s.max_keys, s.real_rows), (6, 4));
        assert!(s.prefill_tiles.is_empty());
        assert!(!s.is_pure_decode());
    }

    #[test]
    fn fixed_stride_padding_and_pure_decode() {
        let (t0, t1) = ([1u32], [2u32]);
        let (b0, b1) = ([4u32], [0u32, 7]);
        let batch = [entry(&t0, 0, &b0), entry(&t1, 4, &b1)];
        let mut s = pack_step(&batch, LIMITS, Some(16), false).unwrap();
        assert_eq!(s.table_stride, 16);
        assert_eq!(&s.block_tables[16..18], &[0, 7]);
        assert!(s.is_pure_decode());
        s.pad_to(4);
        assert_eq!(s.n_rows(), 4);
        assert_eq!(s.real_rows, 2);
        assert_eq!(s.positions, [0, 4, -1, -1]);
        assert_eq!(s.slots[2..], [-1, -1]);
        assert_eq!(s.logit_rows, [0, 1, 2, 3]);
        assert_eq!(s.block_tables.len(), 64);
        let err = pack_step(&batch, LIMITS, Some(1), false).unwrap_err();
        assert!(matches!(
            err,
            ModelError::BlockTableTooShort { entry: 1, .. }
        ));
    }

    #[test]
    fn prefill_tiles_in_fast_mode() {
        let tokens: Vec<u32> = (0..20).collect();
        let table = [0u32, 1, 2, 3, 4, 5];
        let one = [3u32];
        let batch = [entry(&one, 0, &[7]), entry(&tokens, 2, &table)];
        let s = pack_step(&batch, LIMITS, None, true).unwrap();
        assert_eq!(s.att_positions[0], 0);
        assert!(s.att_positions[1..].iter().all(|&p| p == -1));
        assert_eq!(s.prefill_tiles, [1, 16, 2, 1, 17, 4, 18, 1]);
        assert_eq!(s.max_keys, 22);
    }

    #[test]
    fn rejects_like_the_cpu_model() {
        let t = [1u32, 2];
        let err = |batch: &[BatchEntry<'_>]| pack_step(batch, LIMITS, None, false).unwrap_err();
        assert!(matches!(
            err(&[entry(&[], 0, &[0])]),
            ModelError::EmptyInput { entry: 0 }
        ));
        assert!(matches!(
            err(&[entry(&[100], 0, &[0])]),
            ModelError::TokenOutOfRange { token: 100, .. }
        ));
        assert!(matches!(
            err(&[entry(&t, 63, &[0; 16])]),
            ModelError::ContextOverflow { needed: 65, .. }
        ));
        assert!(matches!(
            err(&[entry(&t, 3, &[0])]),
            ModelError::BlockTableTooShort {
                needed: 2,
                have: 1,
                ..
            }
        ));
        assert!(matches!(
            err(&[entry(&t, 0, &[8])]),
            ModelError::BlockOutOfRange { block: 8, .. }
        ));
        assert!(matches!(
            err(&[entry(&t, 0, &[1]), entry(&t, 0, &[1])]),
            ModelError::SlotConflict {
                slot: 4,
                first: 0,
                second: 1
            }
        ));
    }
}
