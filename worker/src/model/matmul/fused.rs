//! Fused decode-and-multiply kernels for a few tokens (GEMV-like steps): the
//! weight blocks are decoded in registers, never stored, and each decoded
//! vector is used for all `T` tokens. Bitwise equal to decoding into the
//! scratch tile and running [`tile`] on the same path: the decoded values are
//! the same, and each accumulator lane sees the same products in the same
//! order (lane `l` of 16 sums elements `k ≡ l (mod 16)` in increasing `k`).
//!
//! Q4_1 decodes through a 16-entry table per block: `table[i] = fma(i, d, m)`
//! (one register), indexed by each nibble with one `vpermps` — the same value
//! `q * d + m` the reference computes (exact product, one rounding), with two
//! instructions per 16 weights instead of a convert and an FMA. The block's
//! two f16 scales are read with one 4-byte broadcast and one conversion.

use std::arch::x86_64::*;

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

/// `out[t][r] = Σ_k x_t[k] · W_r[k]` for `T` tokens and `R` Q4_1 rows
/// (`rows[r]`: `k / 32` blocks of 20 bytes: f16 d, f16 m, 16 nibble bytes),
/// `k` a multiple of 32.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C; each `x[t]` holds `k`
/// floats and each row `k / 32 * 20` bytes.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn q4_1<const T: usize, const R: usize>(
    x: [&[f32]; T],
    rows: [&[u8]; R],
    k: usize,
) -> [[f32; R]; T] {
    let mut acc = [[_mm512_setzero_ps(); R]; T];
    let iota = _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    );
    let xp: [*const f32; T] = std::array::from_fn(|t| x[t].as_ptr());
    // Row groups are consecutive in memory: fetch the blocks
    // `PREFETCH_GROUPS` groups ahead (the hardware prefetchers alone left
    // a core at ~55% of this streaming rate).
    let ahead = PREFETCH_GROUPS * R * (k / 32) * 20;
    for b in 0..k / 32 {
        for r in 0..R {
            let p = rows[r].as_ptr().add(20 * b);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead) as *const i8);
            // [d, m, d, m, ...] from one 4-byte broadcast.
            let dm = _mm512_cvtph_ps(_mm256_set1_epi32((p as *const i32).read_unaligned()));
            let d = _mm512_moveldup_ps(dm);
            let m = _mm512_movehdup_ps(dm);
            // table[i] = fma(i, d, m) == i * d + m: i * d is exact (4-bit × 11-bit).
            let table = _mm512_fmadd_ps(iota, d, m);
            // vpermps reads the low 4 bits of each index lane: the low nibble
            // directly, the high nibble after a shift.
            let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(4) as *const __m128i));
            let w0 = _mm512_permutexvar_ps(q, table);
            let w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
            for t in 0..T {
                let x0 = _mm512_loadu_ps(xp[t].add(32 * b));
                let x1 = _mm512_loadu_ps(xp[t].add(32 * b + 16));
                acc[t][r] = _mm512_fmadd_ps(x0, w0, acc[t][r]);
                acc[t][r] = _mm512_fmadd_ps(x1, w1, acc[t][r]);
            }
        }
    }
    std::array::from_fn(|t| std::array::from_fn(|r| hsum(acc[t][r])))
}

/// As [`q4_1`] for Q8_0 rows (`k / 32` blocks of 34 bytes: f16 d, 32 i8).
///
/// # Safety
/// As [`q4_1`], with 34-byte blocks.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn q8_0<const T: usize, const R: usize>(
    x: [&[f32]; T],
    rows: [&[u8]; R],
    k: usize,
) -> [[f32; R]; T] {
    let mut acc = [[_mm512_setzero_ps(); R]; T];
    let xp: [*const f32; T] = std::array::from_fn(|t| x[t].as_ptr());
    let ahead = PREFETCH_GROUPS * R * (k / 32) * 34;
    for b in 0..k / 32 {
        for r in 0..R {
            let p = rows[r].as_ptr().add(34 * b);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead) as *const i8);
            let d = _mm512_cvtph_ps(_mm256_set1_epi16((p as *const i16).read_unaligned()));
            let q0 = _mm_loadu_si128(p.add(2) as *const __m128i);
            let q1 = _mm_loadu_si128(p.add(18) as *const __m128i);
            // q * d is exact (8-bit × 11-bit), as in the reference.
            let w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
            let w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
            for t in 0..T {
                let x0 = _mm512_loadu_ps(xp[t].add(32 * b));
                let x1 = _mm512_loadu_ps(xp[t].add(32 * b + 16));
                acc[t][r] = _mm512_fmadd_ps(x0, w0, acc[t][r]);
                acc[t][r] = _mm512_fmadd_ps(x1, w1, acc[t][r]);
            }
        }
    }
    std::array::from_fn(|t| std::array::from_fn(|r| hsum(acc[t][r])))
}
