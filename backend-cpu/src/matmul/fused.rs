//! Fused decode-and-multiply kernels for a few tokens (GEMV-like steps): the
//! weight blocks are decoded in registers by the format's
//! [`Block512`] decoder, never stored, and each decoded
//! vector is used for all `T` tokens. Bitwise equal to decoding into the
//! scratch tile and running the AVX-512 tile kernel: the decoded values are
//! the same, and each accumulator lane sees the same products in the same
//! order (lane `l` of 16 sums elements `k ≡ l (mod 16)` in increasing `k`).
//! Every block format has one (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).

use std::arch::x86_64::*;

use gguf::GgmlType;

use crate::kernels::blocks512::{self, Block512};

/// How many row groups ahead of the current one the kernels prefetch
/// (measured on the 2-core test machine: 1 group 4.4 GB/s per core from
/// memory, 4 groups 5.9, 8 and 16 no better).
const PREFETCH_GROUPS: usize = 4;

/// Lane reduction, same order as the AVX-512 tile kernel.
#[inline(always)]
unsafe fn hsum(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    super::simd::avx2::hsum(_mm256_add_ps(lo, hi))
}

/// `out[t][r] = Σ_k x_t[k] · W_r[k]` for `T` tokens and `R` rows of format `F`
/// (`rows[r]`: `k / F::WEIGHTS` blocks of `F::BYTES` bytes), `k` a multiple of `F::WEIGHTS`.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C; each `x[t]` holds `k`
/// floats and each row `k / F::WEIGHTS * F::BYTES` bytes.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn kernel<F: Block512, const T: usize, const R: usize>(
    x: [&[f32]; T],
    rows: [&[u8]; R],
    k: usize,
) -> [[f32; R]; T] {
    let mut acc = [[_mm512_setzero_ps(); R]; T];
    let xp: [*const f32; T] = std::array::from_fn(|t| x[t].as_ptr());
    let blocks = k / F::WEIGHTS;
    // Row groups are consecutive in memory: fetch the blocks `PREFETCH_GROUPS`
    // groups ahead (the hardware prefetchers alone left a core at ~55% of
    // this streaming rate), one prefetch per cache line of a block.
    let ahead = PREFETCH_GROUPS * R * blocks * F::BYTES;
    for b in 0..blocks {
        for r in 0..R {
            let p = rows[r].as_ptr().add(F::BYTES * b);
            for line in 0..F::BYTES.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead + 64 * line) as *const i8);
            }
            let s = F::state(p);
            for c in 0..F::WEIGHTS / 16 {
                let w = F::chunk(&s, p, c);
                for t in 0..T {
                    let xv = _mm512_loadu_ps(xp[t].add(F::WEIGHTS * b + 16 * c));
                    acc[t][r] = _mm512_fmadd_ps(xv, w, acc[t][r]);
                }
            }
        }
    }
    std::array::from_fn(|t| std::array::from_fn(|r| hsum(acc[t][r])))
}

/// Whether `format` has a fused kernel.
pub(super) fn supports(format: GgmlType) -> bool {
    blocks512::supports(format)
}

/// `out[t][r] = Σ_k x_t[k] · W_r[k]` for `T` tokens and `R` rows encoded in `format` (one
/// [`supports`]).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C; each `x[t]` holds `k` floats and each row
/// is `k` values of `format`.
#[inline(always)]
pub(super) unsafe fn rows<const T: usize, const R: usize>(
    format: GgmlType,
    x: [&[f32]; T],
    rows: [&[u8]; R],
    k: usize,
) -> [[f32; R]; T] {
    match format {
        GgmlType::Q8_0 => kernel::<blocks512::Q8_0, T, R>(x, rows, k),
        GgmlType::Q4_0 => kernel::<blocks512::Q4_0, T, R>(x, rows, k),
        GgmlType::Q4_1 => kernel::<blocks512::Q4_1, T, R>(x, rows, k),
        GgmlType::Q5_0 => kernel::<blocks512::Q5_0, T, R>(x, rows, k),
        GgmlType::Q5_1 => kernel::<blocks512::Q5_1, T, R>(x, rows, k),
        GgmlType::Q4_K => kernel::<blocks512::Q4K, T, R>(x, rows, k),
        GgmlType::Q5_K => kernel::<blocks512::Q5K, T, R>(x, rows, k),
        GgmlType::Q6_K => kernel::<blocks512::Q6K, T, R>(x, rows, k),
        _ => unreachable!("fused::rows: {format} has no fused kernel"),
    }
}
