//! Softmax of attention score rows, bitwise equal to [`softmax_in_place`] on each row, faster:
//!
//! - the row maximum is a 16-lane fold (the maximum of the non-NaN values does not depend on
//!   the order; when it is a zero, its sign cannot change `x - max`'s exponential);
//! - `exp(x - max)` is computed 16 lanes at a time on AVX-512 by [`crate::vexp`],
//!   bitwise `f32::exp`;
//! - the sums `Σ e_j`, sequential per row as in [`softmax_in_place`], run for up to 8 rows at
//!   once, so their add latencies overlap.
//!
//! [`softmax_in_place`]: super::super::ops::softmax_in_place

use std::ops::Range;

use super::super::SimdPath;
use crate::vexp::{exp_sub, vector_exp_ok};

/// Rows whose sums are accumulated together.
const SUM_ROWS: usize = 8;

/// Softmax in place of rows `r = 0..n_rows` of `data`, row `r` being
/// `data[r * stride + range(r).start..r * stride + range(r).end]` (non-empty), each bitwise
/// [`softmax_in_place`](super::super::ops::softmax_in_place) of that row.
pub(super) fn softmax_rows(
    path: SimdPath,
    data: &mut [f32],
    stride: usize,
    n_rows: usize,
    range: impl Fn(usize) -> Range<usize>,
) {
    let vector = path == SimdPath::Avx512 && vector_exp_ok();
    let row_at = |r: usize| {
        let k = range(r);
        r * stride + k.start..r * stride + k.end
    };
    for r in 0..n_rows {
        let row = &mut data[row_at(r)];
        let max = row_max(row);
        exp_sub(vector, row, max);
    }
    for r0 in (0..n_rows).step_by(SUM_ROWS) {
        let rows = SUM_ROWS.min(n_rows - r0);
        let starts: [usize; SUM_ROWS] =
            std::array::from_fn(|i| if i < rows { row_at(r0 + i).start } else { 0 });
        let common = (r0..r0 + rows).map(|r| row_at(r).len()).min().unwrap_or(0);
        let mut sums = [0.0f32; SUM_ROWS];
        for j in 0..common {
            for (sum, &start) in sums[..rows].iter_mut().zip(&starts) {
                *sum += data[start + j];
            }
        }
        for (i, &sum) in sums[..rows].iter().enumerate() {
            let row = &mut data[row_at(r0 + i)];
            let mut sum = sum;
            for &v in &row[common..] {
                sum += v;
            }
            let inv = 1.0 / sum;
            for v in row.iter_mut() {
                *v *= inv;
            }
        }
    }
}

/// The maximum as `x.iter().copied().fold(f32::NEG_INFINITY, f32::max)`, in 16 lanes.
fn row_max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.max(v);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    acc.into_iter().fold(tail, f32::max)
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::super::super::ops::softmax_in_place;
    use super::*;

    #[test]
    fn softmax_rows_is_softmax_in_place_per_row() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let stride = 300;
        // Rows of every length, starting at various columns (a sliding window's rows).
        // (Rows 0..5 start at 0, so the awkward values below stay inside them.)
        let starts = |r: usize| if r < 5 { 0 } else { (r * 11) % 40 };
        let lens = |r: usize| 1 + (r * 37) % (stride - 40);
        for path in SimdPath::available() {
            let n_rows = 19;
            let mut data: Vec<f32> = (0..n_rows * stride)
                .map(|_| rng.random_range(-60.0..40.0))
                .collect();
            // Awkward values: ties, zeros of both signs, infinities, NaN, far below the max.
            data[3] = -0.0;
            data[4] = 0.0;
            data[stride + 2] = f32::NEG_INFINITY;
            data[2 * stride] = f32::NAN;
            data[3 * stride + 1] = -500.0;
            data[4 * stride..4 * stride + 40].fill(7.0);
            let mut want = data.clone();
            for r in 0..n_rows {
                let at = r * stride + starts(r);
                softmax_in_place(&mut want[at..at + lens(r)]);
            }
            softmax_rows(path, &mut data, stride, n_rows, |r| {
                starts(r)..starts(r) + lens(r)
            });
            for r in 0..n_rows {
                for j in starts(r)..starts(r) + lens(r) {
                    let (g, w) = (data[r * stride + j], want[r * stride + j]);
                    assert!(
                        g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                        "{path:?} row {r} key {j}: {g} vs {w}"
                    );
                }
            }
        }
    }
}
