//! 8-bit activations ([`QuantActs`]): each row of a step's f32 activations quantized once into
//! blocks that match a weight format's block, as ggml's `Q8_0` / `Q8_1` (blocks of 32) and `Q8_K`
//! (blocks of 256 with per-16 block sums), with one rounding rule for every SIMD path.
//!
//! A block of `B` values `x` becomes `d = max|x| / 127` (f32) and `q = round(x / d)` as i8 in
//! `[-127, 127]` (`round` to nearest, ties to even; `x * (1 / d)`, computed once per block), so
//! `d * q` approximates `x` with an error of at most `d / 2` per value. `-128` never occurs, so the
//! kernels may negate any `q` (the sign trick of `vpsignb` for signed weights).

use std::fmt;

use crate::pool::{self, DisjointSlice};

/// Values per block of the 32-block kind (the legacy formats' block).
pub(super) const QK32: usize = 32;
/// Values per block of the 256-block kind (the k-quants' super-block).
pub(super) const QK256: usize = 256;

/// Which block layout a weight format needs from its activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ActBlocks {
    /// Blocks of 32 with `d`, the integer sum of the block's `q` and `d * Σq` (Q8_0/Q8_1-like), for
    /// Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 weights.
    B32,
    /// Blocks of 256 with `d` and the sums of each 16 `q` (Q8_K-like), for Q4_K, Q5_K and Q6_K.
    B256,
}

impl ActBlocks {
    /// Values per block.
    pub(super) fn len(self) -> usize {
        match self {
            ActBlocks::B32 => QK32,
            ActBlocks::B256 => QK256,
        }
    }
}

/// The rows of an `[n, k]` activation matrix in 8-bit blocks of one [`ActBlocks`] kind; reused
/// across steps (its vectors grow to the largest step and are then only overwritten).
#[derive(Default)]
pub(super) struct QuantActs {
    /// Row length (a multiple of the block length).
    k: usize,
    /// Rows.
    n: usize,
    /// Block length (32 or 256; 0 before the first [`Self::quantize`]).
    block: usize,
    /// `q`, `[n, k]`.
    qs: Vec<i8>,
    /// Scales, `[n, k / block]`.
    d: Vec<f32>,
    /// B32: `Σ q` per block, `[n, k / 32]`.
    sums: Vec<i32>,
    /// B32: `d * (Σ q as f32)` per block, `[n, k / 32]`.
    dsums: Vec<f32>,
    /// B256: `Σ q` per 16 values, `[n, k / 16]`.
    bsums: Vec<i16>,
}

impl fmt::Debug for QuantActs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "QuantActs[{}, {}] in blocks of {}",
            self.n, self.k, self.block
        )
    }
}

/// One quantized row (see [`QuantActs`]).
#[derive(Clone, Copy)]
pub(super) struct QRow<'a> {
    /// `q`, `k` values.
    pub(super) qs: &'a [i8],
    /// One scale per block.
    pub(super) d: &'a [f32],
    /// B32: `Σ q` per block (empty for B256).
    pub(super) sums: &'a [i32],
    /// B32: `d * Σ q` per block (empty for B256).
    pub(super) dsums: &'a [f32],
    /// B256: `Σ q` per 16 values (empty for B32).
    pub(super) bsums: &'a [i16],
}

/// Quantizes one block: writes `q` and returns `d` (see the module docs).
#[inline(always)]
fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    d
}

/// Values below which a step's activations are quantized on the calling thread alone (a pool
/// region costs a few microseconds; single-stream decode quantizes under a thousand values).
const PARALLEL_MIN_VALUES: usize = 8 * 1024;

/// The output buffers of a run of whole rows ([`QuantActs`]' fields, sliced to those rows).
struct BlocksMut<'a> {
    qs: &'a mut [i8],
    d: &'a mut [f32],
    sums: &'a mut [i32],
    dsums: &'a mut [f32],
    bsums: &'a mut [i16],
}

impl BlocksMut<'_> {
    /// Quantizes `x` (the rows these buffers hold) into blocks of `kind`, compiled for AVX2 when
    /// `simd` and the CPU has it (bitwise the same result either way).
    fn fill(self, kind: ActBlocks, x: &[f32], simd: bool) {
        #[cfg(target_arch = "x86_64")]
        if simd && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was just detected.
            unsafe { self.fill_avx2(kind, x) };
            return;
        }
        self.fill_portable(kind, x);
    }

    /// [`Self::fill_portable`] compiled for AVX2, where `round_ties_even` is one `vroundps` and
    /// the loops vectorize: the same operations, so bitwise the same codes, scales and sums.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn fill_avx2(self, kind: ActBlocks, x: &[f32]) {
        self.fill_portable(kind, x);
    }

    /// Quantizes every block of `x` into the buffers (sized for `x`).
    #[inline(always)]
    fn fill_portable(self, kind: ActBlocks, x: &[f32]) {
        let block = kind.len();
        let blocks = x.chunks_exact(block).zip(self.qs.chunks_exact_mut(block));
        for (b, (xb, qb)) in blocks.enumerate() {
            let d = quantize_block(xb, qb);
            self.d[b] = d;
            match kind {
                ActBlocks::B32 => {
                    let s: i32 = qb.iter().map(|&q| i32::from(q)).sum();
                    self.sums[b] = s;
                    self.dsums[b] = d * s as f32;
                }
                ActBlocks::B256 => {
                    for (j, g) in qb.chunks_exact(16).enumerate() {
                        // |Σ| <= 16 * 127, well inside i16.
                        self.bsums[16 * b + j] = g.iter().map(|&q| i16::from(q)).sum();
                    }
                }
            }
        }
    }
}

impl QuantActs {
    /// Quantizes `x` (`[n, k]` row-major) into blocks of `kind`, replacing the contents.
    ///
    /// Panics if `x.len() != n * k` or `k` is not a multiple of the block length.
    pub(super) fn quantize(&mut self, kind: ActBlocks, x: &[f32], n: usize, k: usize) {
        self.quantize_with(kind, x, n, k, true);
    }

    /// [`Self::quantize`], compiled for AVX2 when `simd` and the CPU has it (bitwise the same
    /// result either way; `false` is for the tests that check so). Steps of at least
    /// [`PARALLEL_MIN_VALUES`] values are split by rows over the compute pool; a row's blocks
    /// depend on that row alone, so the split changes no value.
    pub(super) fn quantize_with(
        &mut self,
        kind: ActBlocks,
        x: &[f32],
        n: usize,
        k: usize,
        simd: bool,
    ) {
        let block = kind.len();
        assert_eq!(x.len(), n * k, "QuantActs: x has wrong length");
        assert!(
            k.is_multiple_of(block),
            "QuantActs: k {k} is not whole blocks of {block}"
        );
        let nb = n * k / block;
        (self.n, self.k, self.block) = (n, k, block);
        self.qs.resize(n * k, 0);
        self.d.resize(nb, 0.0);
        let (n_sums, n_bsums) = match kind {
            ActBlocks::B32 => (nb, 0),
            ActBlocks::B256 => (0, n * k / 16),
        };
        self.sums.resize(n_sums, 0);
        self.dsums.resize(n_sums, 0.0);
        self.bsums.resize(n_bsums, 0);
        let pool = pool::global();
        if n < 2 || n * k < PARALLEL_MIN_VALUES || pool.threads() < 2 {
            let all = BlocksMut {
                qs: &mut self.qs,
                d: &mut self.d,
                sums: &mut self.sums,
                dsums: &mut self.dsums,
                bsums: &mut self.bsums,
            };
            all.fill(kind, x, simd);
            return;
        }
        // Per row: k codes, k / block scales, and the sums of its kind.
        let (per_d, per_sums, per_bsums) = (k / block, n_sums / n, n_bsums / n);
        let rows_per_task = n.div_ceil(pool.threads());
        let (qs, d) = (
            DisjointSlice::new(&mut self.qs),
            DisjointSlice::new(&mut self.d),
        );
        let (sums, dsums) = (
            DisjointSlice::new(&mut self.sums),
            DisjointSlice::new(&mut self.dsums),
        );
        let bsums = DisjointSlice::new(&mut self.bsums);
        pool.run(n.div_ceil(rows_per_task), &|i| {
            let rows = i * rows_per_task..((i + 1) * rows_per_task).min(n);
            let of = |per: usize| rows.start * per..rows.end * per;
            // SAFETY: `run` calls each task once and tasks take disjoint row ranges, so the
            // pieces of every buffer are disjoint.
            let piece = unsafe {
                BlocksMut {
                    qs: qs.piece(of(k)),
                    d: d.piece(of(per_d)),
                    sums: sums.piece(of(per_sums)),
                    dsums: dsums.piece(of(per_sums)),
                    bsums: bsums.piece(of(per_bsums)),
                }
            };
            piece.fill(kind, &x[of(k)], simd);
        });
    }

    /// Row `t`. Panics if `t` is not below the row count.
    pub(super) fn row(&self, t: usize) -> QRow<'_> {
        assert!(t < self.n, "QuantActs: row {t} of {}", self.n);
        let nb = self.k / self.block;
        let per = |len: usize| t * len..(t + 1) * len;
        let (sums, bsums) = if self.sums.is_empty() {
            (0, self.k / 16)
        } else {
            (nb, 0)
        };
        QRow {
            qs: &self.qs[per(self.k)],
            d: &self.d[per(nb)],
            sums: &self.sums[per(sums)],
            dsums: &self.dsums[per(sums)],
            bsums: &self.bsums[per(bsums)],
        }
    }
}
