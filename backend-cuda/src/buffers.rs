//! The persistent per-step device buffers of the CUDA model: the packed step inputs (tokens,
//! positions, slots, block tables, logit rows, prefill tiles) and the activations of one step, sized
//! by a [`Capacity`] that grows by powers of two (decode graphs point into them, so a reallocation
//! drops the graphs).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};

use super::error::{driver, CudaError};
use super::numerics::Numerics;
use model_desc::ModelDesc;

/// Sizes of the step buffers, in elements of rows / logit rows / block-table entries / tile ints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capacity {
    /// Token rows.
    pub rows: usize,
    /// Rows of logits.
    pub logits: usize,
    /// Block-table entries (u32).
    pub tables: usize,
    /// Prefill tile ints (4 per tile).
    pub tiles: usize,
}

impl Capacity {
    /// Whether every size is at least `need`'s.
    pub fn covers(&self, need: &Capacity) -> bool {
        self.rows >= need.rows
            && self.logits >= need.logits
            && self.tables >= need.tables
            && self.tiles >= need.tiles
    }

    /// The sizes to allocate for `need` after `self`: each the larger of both, rounded up to a power
    /// of two (at least 16), so a growing workload reallocates (and recaptures graphs) only
    /// logarithmically often.
    pub fn grown_to(&self, need: &Capacity) -> Capacity {
        let g = |a: usize, b: usize| a.max(b).max(16).next_power_of_two();
        Capacity {
            rows: g(self.rows, need.rows),
            logits: g(self.logits, need.logits),
            tables: g(self.tables, need.tables),
            tiles: g(self.tiles, need.tiles),
        }
    }
}

/// Persistent per-step device buffers (inputs and activations).
pub(super) struct StepBuffers {
    pub(super) cap: Capacity,
    pub(super) tokens: CudaSlice<u32>,
    pub(super) positions: CudaSlice<i32>,
    pub(super) att_positions: CudaSlice<i32>,
    pub(super) slots: CudaSlice<i64>,
    pub(super) table_index: CudaSlice<i32>,
    pub(super) block_tables: CudaSlice<u32>,
    pub(super) logit_rows: CudaSlice<i32>,
    pub(super) tiles: CudaSlice<i32>,
    /// Residual stream `[rows, hidden]`.
    pub(super) x: CudaSlice<u8>,
    /// Normalised `[rows, hidden]`.
    pub(super) xn: CudaSlice<u8>,
    /// Fused QKV `[rows, q_dim + 2 kv_dim]`.
    pub(super) qkv: CudaSlice<u8>,
    /// Attention output `[rows, q_dim]`.
    pub(super) att: CudaSlice<u8>,
    /// Gate/up `[rows, 2 ffn]`.
    pub(super) gu: CudaSlice<u8>,
    /// SwiGLU output `[rows, ffn]`.
    pub(super) h: CudaSlice<u8>,
    /// Gathered logit rows `[logits, hidden]` and their norm.
    pub(super) g: CudaSlice<u8>,
    pub(super) gn: CudaSlice<u8>,
    /// `[logits, vocab]` f32.
    pub(super) logits: CudaSlice<f32>,
}

impl StepBuffers {
    pub(super) fn alloc(
        stream: &Arc<CudaStream>,
        c: &ModelDesc,
        numerics: Numerics,
        cap: Capacity,
    ) -> Result<StepBuffers, CudaError> {
        fn z<T: DeviceRepr + ValidAsZeroBits>(
            stream: &Arc<CudaStream>,
            n: usize,
        ) -> Result<CudaSlice<T>, CudaError> {
            driver("allocating step buffers", stream.alloc_zeros::<T>(n.max(1)))
        }
        let a = numerics.act_bytes();
        let width = c.q_dim() + 2 * c.kv_dim();
        Ok(StepBuffers {
            cap,
            tokens: z(stream, cap.rows)?,
            positions: z(stream, cap.rows)?,
            att_positions: z(stream, cap.rows)?,
            slots: z(stream, cap.rows)?,
            table_index: z(stream, cap.rows)?,
            block_tables: z(stream, cap.tables)?,
            logit_rows: z(stream, cap.logits)?,
            tiles: z(stream, cap.tiles)?,
            x: z(stream, cap.rows * c.hidden * a)?,
            xn: z(stream, cap.rows * c.hidden * a)?,
            qkv: z(stream, cap.rows * width * a)?,
            att: z(stream, cap.rows * c.q_dim() * a)?,
            gu: z(stream, cap.rows * 2 * c.ffn_dim * a)?,
            h: z(stream, cap.rows * c.ffn_dim * a)?,
            g: z(stream, cap.logits * c.hidden * a)?,
            gn: z(stream, cap.logits * c.hidden * a)?,
            logits: z(stream, cap.logits * c.vocab_size)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_growth() {
        let need = Capacity {
            rows: 17,
            logits: 3,
            tables: 100,
            tiles: 0,
        };
        let cap = Capacity::default().grown_to(&need);
        assert_eq!(
            cap,
            Capacity {
                rows: 32,
                logits: 16,
                tables: 128,
                tiles: 16
            }
        );
        assert!(cap.covers(&need));
        assert!(!cap.covers(&Capacity { rows: 33, ..need }));
        let bigger = cap.grown_to(&Capacity { rows: 40, ..need });
        assert_eq!((bigger.rows, bigger.tables), (64, 128));
    }
}
