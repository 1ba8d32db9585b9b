//! 8-bit activations ([`QuantActs`]): each row of a step's f32 activations quantized once into
//! blocks of 32, as ggml's `Q8_0` / `Q8_1`, with the sums every weight format's kernel needs, and
//! one rounding rule for every SIMD path.
//!
//! A block of 32 values `x` becomes `d = max|x| / 127` (f32) and `q = round(x / d)` as i8 in
//! `[-127, 127]` (`round` to nearest, ties to even; `x * (1 / d)`, computed once per block), so
//! `d * q` approximates `x` with an error of at most `d / 2` per value. `-128` never occurs, so the
//! kernels may negate any `q` (the sign trick of `vpsignb` for signed weights).
//!
//! The k-quants (super-blocks of 256) read the same blocks of 32, not ggml's `Q8_K` (one scale per
//! 256): a scale per 32 values keeps an outlier from coarsening the codes of the 224 values around
//! it. Measured on Gemma 3 270M Q4_K_M, whose `ffn_down` input (the gated GELU) has such outliers:
//! its activations rounded per 256 cost +0.54 % perplexity against `exact`, per 32 +0.25 %
//! (BENCHMARKS.md, 2026-12-06).

use std::fmt;

use crate::pool::{self, DisjointSlice};

/// Values per block.
pub(super) const QK: usize = 32;

/// The rows of an `[n, k]` activation matrix in 8-bit blocks of [`QK`]; reused across steps (its
/// vectors grow to the largest step and are then only overwritten).
#[derive(Default)]
pub(super) struct QuantActs {
    /// Row length (a multiple of [`QK`]).
    k: usize,
    /// Rows.
    n: usize,
    /// `q`, `[n, k]`.
    qs: Vec<i8>,
    /// Scales, `[n, k / 32]`.
    d: Vec<f32>,
    /// `Σ q` per block, `[n, k / 32]`.
    sums: Vec<i32>,
    /// `d * (Σ q as f32)` per block, `[n, k / 32]`.
    dsums: Vec<f32>,
    /// `Σ q` per 16 values (Q6_K's sub-blocks), `[n, k / 16]`.
    bsums: Vec<i16>,
}

impl fmt::Debug for QuantActs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QuantActs[{}, {}]", self.n, self.k)
    }
}

/// One quantized row (see [`QuantActs`]).
#[derive(Clone, Copy)]
pub(super) struct QRow<'a> {
    /// `q`, `k` values.
    pub(super) qs: &'a [i8],
    /// One scale per block of 32.
    pub(super) d: &'a [f32],
    /// `Σ q` per block of 32.
    pub(super) sums: &'a [i32],
    /// `d * Σ q` per block of 32.
    pub(super) dsums: &'a [f32],
    /// `Σ q` per 16 values.
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

/// [`quantize_block`] in AVX2 (see [`BlocksMut::fill_avx2`]): writes the 32 codes `q` and returns
/// `d` and the sums of the codes' two halves.
///
/// # Safety
/// The CPU must support AVX2; `x` and `q` hold [`QK`] values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_block_avx2(x: &[f32], q: &mut [i8]) -> (f32, i16, i16) {
    use std::arch::x86_64::*;
    assert!(x.len() == QK && q.len() == QK, "quantize: not a block");
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut v = [_mm256_setzero_ps(); 4];
    let mut m = _mm256_setzero_ps();
    for (i, v) in v.iter_mut().enumerate() {
        *v = _mm256_loadu_ps(x.as_ptr().add(8 * i));
        // The running maximum second: a NaN lane keeps it, as `f32::max` ignores a NaN.
        m = _mm256_max_ps(_mm256_and_ps(*v, abs_mask), m);
    }
    // Lanes are >= 0 and not NaN, so the order of the reduction changes nothing.
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    let (lo_clamp, hi_clamp) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let mut c = [_mm256_setzero_si256(); 4];
    for (c, &v) in c.iter_mut().zip(&v) {
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(v, id),
        );
        // NaN -> 0, as `NaN as i8`.
        let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r));
        *c = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo_clamp), hi_clamp));
    }
    // `packs` interleaves the 128-bit lanes; the permutation puts the 32 codes back in order.
    let packed = _mm256_packs_epi16(
        _mm256_packs_epi32(c[0], c[1]),
        _mm256_packs_epi32(c[2], c[3]),
    );
    let packed = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q.as_mut_ptr().cast(), packed);
    // |Σ| <= 16 * 127, well inside i16.
    let half = |a: __m256i, b: __m256i| {
        let s = _mm256_add_epi32(a, b);
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
        _mm_cvtsi128_si32(s) as i16
    };
    (d, half(c[0], c[1]), half(c[2], c[3]))
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
    /// Quantizes `x` (the rows these buffers hold), compiled for AVX2 when `simd` and the CPU has
    /// it (bitwise the same result either way).
    fn fill(self, x: &[f32], simd: bool) {
        #[cfg(target_arch = "x86_64")]
        if simd && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was just detected.
            unsafe { self.fill_avx2(x) };
            return;
        }
        self.fill_portable(x);
    }

    /// [`Self::fill_portable`] in AVX2 intrinsics, bitwise the same codes, scales and sums: the
    /// block maximum of `|x|` is order-independent (`vmaxps` with the running maximum second
    /// ignores a NaN as `f32::max` does), the scale is the same scalar division, `vroundps` rounds
    /// to nearest even as `round_ties_even`, a NaN product is zeroed as `as i8` zeroes it, and
    /// the clamped codes are integers, so packing them loses nothing. (The compiled portable
    /// loop kept the maximum a serial chain of scalar `vmaxss`: 9 % of a Gemma 3 prefill.)
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn fill_avx2(mut self, x: &[f32]) {
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let (d, lo, hi) = quantize_block_avx2(xb, &mut self.qs[b * QK..(b + 1) * QK]);
            self.put(b, d, lo, hi);
        }
    }

    /// Quantizes every block of `x` into the buffers (sized for `x`).
    #[inline(always)]
    fn fill_portable(mut self, x: &[f32]) {
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let qb = &mut self.qs[b * QK..(b + 1) * QK];
            let d = quantize_block(xb, qb);
            // |Σ| <= 16 * 127, well inside i16.
            let half = |h: &[i8]| h.iter().map(|&q| i16::from(q)).sum::<i16>();
            let (lo, hi) = (half(&qb[..16]), half(&qb[16..]));
            self.put(b, d, lo, hi);
        }
    }

    /// Block `b`'s scale `d` and the sums of its codes' halves `lo`, `hi`, with the sums derived
    /// from them.
    #[inline(always)]
    fn put(&mut self, b: usize, d: f32, lo: i16, hi: i16) {
        let s = i32::from(lo) + i32::from(hi);
        self.d[b] = d;
        self.sums[b] = s;
        self.dsums[b] = d * s as f32;
        self.bsums[2 * b] = lo;
        self.bsums[2 * b + 1] = hi;
    }
}

impl QuantActs {
    /// Quantizes `x` (`[n, k]` row-major), replacing the contents.
    ///
    /// Panics if `x.len() != n * k` or `k` is not a multiple of [`QK`].
    pub(super) fn quantize(&mut self, x: &[f32], n: usize, k: usize) {
        self.quantize_with(x, n, k, true);
    }

    /// [`Self::quantize`], compiled for AVX2 when `simd` and the CPU has it (bitwise the same
    /// result either way; `false` is for the tests that check so). Steps of at least
    /// [`PARALLEL_MIN_VALUES`] values are split by rows over the compute pool; a row's blocks
    /// depend on that row alone, so the split changes no value.
    pub(super) fn quantize_with(&mut self, x: &[f32], n: usize, k: usize, simd: bool) {
        assert_eq!(x.len(), n * k, "QuantActs: x has wrong length");
        assert!(
            k.is_multiple_of(QK),
            "QuantActs: k {k} is not whole blocks of {QK}"
        );
        let nb = n * k / QK;
        (self.n, self.k) = (n, k);
        self.qs.resize(n * k, 0);
        self.d.resize(nb, 0.0);
        self.sums.resize(nb, 0);
        self.dsums.resize(nb, 0.0);
        self.bsums.resize(2 * nb, 0);
        let pool = pool::global();
        if n < 2 || n * k < PARALLEL_MIN_VALUES || pool.threads() < 2 {
            let all = BlocksMut {
                qs: &mut self.qs,
                d: &mut self.d,
                sums: &mut self.sums,
                dsums: &mut self.dsums,
                bsums: &mut self.bsums,
            };
            all.fill(x, simd);
            return;
        }
        // Per row: k codes, k / 32 scales, sums and scaled sums, k / 16 half sums.
        let per_b = k / QK;
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
                    d: d.piece(of(per_b)),
                    sums: sums.piece(of(per_b)),
                    dsums: dsums.piece(of(per_b)),
                    bsums: bsums.piece(of(2 * per_b)),
                }
            };
            piece.fill(&x[of(k)], simd);
        });
    }

    /// Row `t`. Panics if `t` is not below the row count.
    pub(super) fn row(&self, t: usize) -> QRow<'_> {
        assert!(t < self.n, "QuantActs: row {t} of {}", self.n);
        let nb = self.k / QK;
        let per = |len: usize| t * len..(t + 1) * len;
        QRow {
            qs: &self.qs[per(self.k)],
            d: &self.d[per(nb)],
            sums: &self.sums[per(nb)],
            dsums: &self.dsums[per(nb)],
            bsums: &self.bsums[per(2 * nb)],
        }
    }
}
