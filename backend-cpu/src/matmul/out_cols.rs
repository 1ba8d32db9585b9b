//! [`OutCols`]: disjoint column blocks of the matmul output, written in place by parallel tasks.

use crate::pool::DisjointSlice;

/// A block of columns `col0..col0 + cols` of a row-major `[n, stride]`
/// output, written one element at a time by one task. Blocks made by
/// [`OutCols::columns`] from one `&mut` borrow never overlap, so tasks can
/// fill disjoint column ranges of the same rows in parallel (the matmul
/// writes `y` in place, with no transposed copy).
pub(super) struct OutCols<'a> {
    y: DisjointSlice<'a, f32>,
    /// First row (token) of the block.
    row0: usize,
    n: usize,
    stride: usize,
    col0: usize,
    pub(super) cols: usize,
}

impl<'a> OutCols<'a> {
    /// All `stride` columns of `y` (`[n, stride]`).
    pub(super) fn new(y: &'a mut [f32], n: usize, stride: usize) -> OutCols<'a> {
        assert_eq!(y.len(), n * stride, "OutCols: shape");
        OutCols {
            y: DisjointSlice::new(y),
            row0: 0,
            n,
            stride,
            col0: 0,
            cols: stride,
        }
    }

    /// Columns `c0..c0 + cols` of this block (relative), borrowing it.
    /// Callers hand out non-overlapping ranges only: `matmul_with` gives each
    /// task its own rows of `W` (= columns of `y`), and a task's sub-blocks
    /// are used one after another.
    pub(super) fn columns(&mut self, c0: usize, cols: usize) -> OutCols<'a> {
        // SAFETY: `&mut self` keeps every other block made from this one unused
        // while the returned block is in use.
        unsafe { self.task_columns(c0, cols) }
    }

    /// Columns `c0..c0 + cols` of this block for one parallel task, from a
    /// shared reference.
    ///
    /// # Safety
    /// No two blocks in use at the same time may overlap: each task of a
    /// region asks for its own columns, once.
    pub(super) unsafe fn task_columns(&self, c0: usize, cols: usize) -> OutCols<'a> {
        assert!(c0 + cols <= self.cols, "OutCols: columns out of range");
        OutCols {
            y: self.y,
            row0: self.row0,
            n: self.n,
            stride: self.stride,
            col0: self.col0 + c0,
            cols,
        }
    }

    /// Rows (tokens) `t0..` of this block, borrowing it.
    pub(super) fn rows_from(&mut self, t0: usize) -> OutCols<'a> {
        assert!(t0 <= self.n, "OutCols: rows out of range");
        OutCols {
            y: self.y,
            row0: self.row0 + t0,
            n: self.n - t0,
            stride: self.stride,
            col0: self.col0,
            cols: self.cols,
        }
    }

    /// `y[row0 + t0 + i][col0 + c0 + r] = tile[i][r]` for a `T × R` register tile: one bounds
    /// check per row of `R` values. Panics if the tile reaches past the block.
    #[inline(always)]
    pub(super) fn put<const T: usize, const R: usize>(
        &mut self,
        t0: usize,
        c0: usize,
        tile: &[[f32; R]; T],
    ) {
        assert!(
            t0 + T <= self.n && c0 + R <= self.cols,
            "OutCols: tile out of range"
        );
        for (i, vals) in tile.iter().enumerate() {
            let at = (self.row0 + t0 + i) * self.stride + self.col0 + c0;
            // SAFETY: no other block writes these columns (`col0 + cols <= stride` by
            // construction, so the row's `R` elements are in this block's columns).
            unsafe { self.y.piece(at..at + R) }.copy_from_slice(vals);
        }
    }
}
