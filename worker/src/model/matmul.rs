//! Batched matrix multiply `y[n, out] = x[n, in] · W[out, in]ᵀ` of f32
//! activations by weights in their file format ([`QMatrix`]: Q8_0, Q4_0,
//! Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16, F32), and the f32 dot product used by attention.
//!
//! Determinism: every output element is computed by the same sequence of
//! floating-point operations regardless of `n`, the tile it falls in, or the
//! thread that computes it: `L` independent lane accumulators over `k = 0, L,
//! 2L, ...` (lane `l` sums elements `k + l` in increasing `k`), a fixed
//! pairwise lane reduction, then a sequential scalar tail for `in % L`
//! elements. `L` is 8 on the portable path (separate multiply and add) and
//! the AVX2 path (fused multiply-add), and 16 on the AVX-512 path (FMA). The
//! path is selected once at run time ([`SimdPath::detect`]), so results are
//! bit-identical for a token alone or in a batch, and reproducible per
//! machine, not across machines.
//!
//! Weights, steps of up to `FUSED_MAX_TOKENS` (8) tokens (decode): the fused
//! kernels decode each weight block in registers and use it for up to 4
//! tokens at once (AVX-512, Q4_1/Q8_0). Larger steps: a task decodes
//! `BLOCK_GROUPS` groups of `G` weight rows at a time (`G` = 4 on AVX-512 for
//! steps of more than 8 tokens, else [`TILE_R`]) into a per-thread f32
//! scratch block (L2 resident, reused across calls: no allocation in the hot
//! path) with the format's SIMD decoder; F32 weights are used in place. Every
//! decoder gives exactly the reference's dequantized values (see
//! [`super::kernels`]), so the products are those of the float32 reference;
//! only the summation order differs from it.
//!
//! Blocking: tasks of the [`pool`] own blocks of at least [`ROWS_PER_TASK`] weight rows
//! (more for steps of few tokens, see `rows_per_task`) and write their
//! columns of `y` in place; inside a task, register tiles walk the shared
//! dimension, the token tile staying in L1 while the decoded block streams
//! past it: on AVX-512, 4 tokens × 4 rows (16 accumulators, one transposed
//! reduction) for steps of more than 8 tokens, and 8 × 3 for steps of up to 8
//! tokens whose format has no fused kernel; 4 × 3 on the other paths. Activations and the scratch block start on
//! 64-byte boundaries ([`AlignedVec`]), so the 16-float loads are aligned.

use std::cell::RefCell;

use super::aligned::AlignedVec;
use super::kernels::QMatrix;
pub use super::kernels::SimdPath;
use super::pool;

/// Weight rows per pool task.
pub const ROWS_PER_TASK: usize = 48;
/// Tokens per register tile.
const TILE_T: usize = 4;
/// Weight rows per register tile (and per decoded scratch tile).
pub const TILE_R: usize = 3;
/// SIMD lanes of the portable and AVX2 accumulators.
const LANES: usize = 8;

/// Computes `out[t][r] = dot(x[t], w[r])` for a `T × R` tile.
/// `x` holds `T` rows and `w` holds `R` rows, both of length `k`.
#[inline(always)]
fn tile_portable<const T: usize, const R: usize>(
    x: &[&[f32]; T],
    w: &[&[f32]; R],
    k: usize,
    out: &mut [[f32; R]; T],
) {
    let mut acc = [[[0.0f32; LANES]; R]; T];
    let body = k - k % LANES;
    let mut i = 0;
    while i < body {
        for t in 0..T {
            let xv = &x[t][i..i + LANES];
            for r in 0..R {
                let wv = &w[r][i..i + LANES];
                for l in 0..LANES {
                    acc[t][r][l] += xv[l] * wv[l];
                }
            }
        }
        i += LANES;
    }
    for t in 0..T {
        for r in 0..R {
            let a = &acc[t][r];
            let mut s = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
            for j in body..k {
                s += x[t][j] * w[r][j];
            }
            out[t][r] = s;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::LANES;

    /// Lane reduction with the same association as the portable path:
    /// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
    #[inline(always)]
    pub(super) unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi); // [l0+l4, l1+l5, l2+l6, l3+l7]
        let sh = _mm_movehl_ps(s, s); // [l2+l6, l3+l7, ..]
        let s2 = _mm_add_ps(s, sh); // [(l0+l4)+(l2+l6), (l1+l5)+(l3+l7), ..]
        let s3 = _mm_shuffle_ps(s2, s2, 0b01);
        _mm_cvtss_f32(_mm_add_ss(s2, s3))
    }

    /// AVX2+FMA version of `tile_portable`.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; every slice must hold at least `k` floats.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const T: usize, const R: usize>(
        x: &[&[f32]; T],
        w: &[&[f32]; R],
        k: usize,
        out: &mut [[f32; R]; T],
    ) {
        let mut acc = [[_mm256_setzero_ps(); R]; T];
        let body = k - k % LANES;
        let xp: [*const f32; T] = std::array::from_fn(|t| x[t].as_ptr());
        let wp: [*const f32; R] = std::array::from_fn(|r| w[r].as_ptr());
        let mut i = 0;
        while i < body {
            let mut wv = [_mm256_setzero_ps(); R];
            for r in 0..R {
                wv[r] = _mm256_loadu_ps(wp[r].add(i));
            }
            for t in 0..T {
                let xv = _mm256_loadu_ps(xp[t].add(i));
                for r in 0..R {
                    acc[t][r] = _mm256_fmadd_ps(xv, wv[r], acc[t][r]);
                }
            }
            i += LANES;
        }
        for t in 0..T {
            for r in 0..R {
                let mut s = hsum(acc[t][r]);
                for j in body..k {
                    s += x[t][j] * w[r][j];
                }
                out[t][r] = s;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// SIMD lanes of the AVX-512 accumulators.
    const LANES: usize = 16;

    /// Lane reduction: `lo8 + hi8` lane-wise, then the AVX2 8-lane order.
    #[inline(always)]
    unsafe fn hsum(v: __m512) -> f32 {
        let lo = _mm512_castps512_ps256(v);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
        super::avx2::hsum(_mm256_add_ps(lo, hi))
    }

    /// AVX-512F version of `tile_portable` with 16 lanes.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2 and FMA; every slice must hold at least `k` floats.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn tile<const T: usize, const R: usize>(
        x: &[&[f32]; T],
        w: &[&[f32]; R],
        k: usize,
        out: &mut [[f32; R]; T],
    ) {
        let mut acc = [[_mm512_setzero_ps(); R]; T];
        let body = k - k % LANES;
        let xp: [*const f32; T] = std::array::from_fn(|t| x[t].as_ptr());
        let wp: [*const f32; R] = std::array::from_fn(|r| w[r].as_ptr());
        let mut i = 0;
        while i < body {
            let mut wv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                wv[r] = _mm512_loadu_ps(wp[r].add(i));
            }
            for t in 0..T {
                let xv = _mm512_loadu_ps(xp[t].add(i));
                for r in 0..R {
                    acc[t][r] = _mm512_fmadd_ps(xv, wv[r], acc[t][r]);
                }
            }
            i += LANES;
        }
        reduce_tile(&acc, out);
        if body < k {
            for t in 0..T {
                for r in 0..R {
                    for j in body..k {
                        out[t][r] += x[t][j] * w[r][j];
                    }
                }
            }
        }
    }

    /// [`super::dot_block_scaled_with`] on AVX-512: 4 × 4 tiles of [`tile`] (inlined here),
    /// then 4 × 1, 1 × 4 and 1 × 1 at the edges.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2 and FMA; shapes as checked by the caller.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn dot_block_scaled(
        a: &[f32],
        k: usize,
        b: &[&[f32]],
        scale: f32,
        out: &mut [f32],
        stride: usize,
    ) {
        super::dot_block::<4, 4, true>(super::SimdPath::Avx512, a, k, b, scale, out, stride);
    }

    /// [`super::add_scaled`]: 16 lanes at a time, multiply then add.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `x.len() == y.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn add_scaled(y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len();
        let body = n - n % LANES;
        let av = _mm512_set1_ps(a);
        let (yp, xp) = (y.as_mut_ptr(), x.as_ptr());
        let mut i = 0;
        while i < body {
            let prod = _mm512_mul_ps(av, _mm512_loadu_ps(xp.add(i)));
            _mm512_storeu_ps(yp.add(i), _mm512_add_ps(_mm512_loadu_ps(yp.add(i)), prod));
            i += LANES;
        }
        for j in body..n {
            y[j] += a * x[j];
        }
    }

    /// [`super::add_scaled_rows`]: 16 output lanes at a time, the `N` rows
    /// applied in order to a register.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; every `xs[i].len() == y.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn add_scaled_rows<const N: usize>(
        y: &mut [f32],
        a: &[f32; N],
        xs: [&[f32]; N],
    ) {
        let n = y.len();
        let body = n - n % LANES;
        let yp = y.as_mut_ptr();
        let mut i = 0;
        while i < body {
            let mut acc = _mm512_loadu_ps(yp.add(i));
            for r in 0..N {
                let prod =
                    _mm512_mul_ps(_mm512_set1_ps(a[r]), _mm512_loadu_ps(xs[r].as_ptr().add(i)));
                acc = _mm512_add_ps(acc, prod);
            }
            _mm512_storeu_ps(yp.add(i), acc);
            i += LANES;
        }
        for j in body..n {
            for r in 0..N {
                y[j] += a[r] * xs[r][j];
            }
        }
    }

    /// `out[t][r] = hsum(acc[t][r])` for a whole tile: one lane reduction per
    /// accumulator for tiles of fewer than 8, else [`reduce16`] over groups of
    /// up to 16 accumulators (bitwise the same sums).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    pub(super) unsafe fn reduce_tile<const T: usize, const R: usize>(
        acc: &[[__m512; R]; T],
        out: &mut [[f32; R]; T],
    ) {
        if T * R < 8 {
            for t in 0..T {
                for r in 0..R {
                    out[t][r] = hsum(acc[t][r]);
                }
            }
            return;
        }
        // Constant-bound loops only, so `acc` stays in registers.
        const { assert!(T * R <= 32, "reduce_tile: at most 32 accumulators") };
        let mut lo = [_mm512_setzero_ps(); 16];
        let mut hi = [_mm512_setzero_ps(); 16];
        for i in 0..T * R {
            if i < 16 {
                lo[i] = acc[i / R][i % R];
            } else {
                hi[i - 16] = acc[i / R][i % R];
            }
        }
        let mut sums = [0.0f32; 32];
        _mm512_storeu_ps(sums.as_mut_ptr(), reduce16(&lo));
        if T * R > 16 {
            _mm512_storeu_ps(sums.as_mut_ptr().add(16), reduce16(&hi));
        }
        for i in 0..T * R {
            out[i / R][i % R] = sums[i];
        }
    }

    /// The lane sums of 16 accumulators at once: lane `i` of the result is
    /// bitwise [`hsum`]`(v[i])`. The same pairwise tree (lanes `l` and `l + 8`,
    /// then `l` and `l + 4`, then `l` and `l + 2`, then the last two), each
    /// level computed for all vectors together on interleaved halves, so 16
    /// sums take 31 shuffles and 15 adds instead of 64 of each. Measured on
    /// the 2-core test machine, one core, the bare 8 × 3 tile kernel on
    /// 64-byte aligned f32 rows in L1/L2, k = 576: 84 GFLOP/s with one lane
    /// reduction per accumulator, 139 with this one.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn reduce16(v: &[__m512; 16]) -> __m512 {
        // Level 1, lanes l + (l + 8): [v0 halves summed | v1 halves summed], ...
        let mut a = [_mm512_setzero_ps(); 8];
        for j in 0..8 {
            let (x, y) = (v[2 * j], v[2 * j + 1]);
            a[j] = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x44>(x, y),
                _mm512_shuffle_f32x4::<0xEE>(x, y),
            );
        }
        // Level 2, l + (l + 4): one 128-bit quarter per vector, 4 vectors each.
        let mut b = [_mm512_setzero_ps(); 4];
        for j in 0..4 {
            let (x, y) = (a[2 * j], a[2 * j + 1]);
            b[j] = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(x, y),
                _mm512_shuffle_f32x4::<0xDD>(x, y),
            );
        }
        // Level 3, l + (l + 2), inside each quarter.
        let mut c = [_mm512_setzero_ps(); 2];
        for j in 0..2 {
            let (x, y) = (b[2 * j], b[2 * j + 1]);
            c[j] = _mm512_add_ps(
                _mm512_shuffle_ps::<0x44>(x, y),
                _mm512_shuffle_ps::<0xEE>(x, y),
            );
        }
        // Level 4, the last pair; lane 4q + e now holds the sum of v[4e + q].
        let f = _mm512_add_ps(
            _mm512_shuffle_ps::<0x88>(c[0], c[1]),
            _mm512_shuffle_ps::<0xDD>(c[0], c[1]),
        );
        _mm512_permutexvar_ps(
            _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
            f,
        )
    }
}

/// Fused decode-and-multiply kernels for a few tokens (GEMV-like steps): the
/// weight blocks are decoded in registers, never stored, and each decoded
/// vector is used for all `T` tokens. Bitwise equal to decoding into the
/// scratch tile and running [`tile`] on the same path: the decoded values are
/// the same, and each accumulator lane sees the same products in the same
/// order (lane `l` of 16 sums elements `k ≡ l (mod 16)` in increasing `k`).
///
/// Q4_1 decodes through a 16-entry table per block: `table[i] = fma(i, d, m)`
/// (one register), indexed by each nibble with one `vpermps` — the same value
/// `q * d + m` the reference computes (exact product, one rounding), with two
/// instructions per 16 weights instead of a convert and an FMA. The block's
/// two f16 scales are read with one 4-byte broadcast and one conversion.
#[cfg(target_arch = "x86_64")]
mod fused512 {
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
        super::avx2::hsum(_mm256_add_ps(lo, hi))
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
}

/// Whether [`fused_rows`] has a kernel for `path` and `format`.
fn has_fused(path: SimdPath, format: gguf::GgmlType) -> bool {
    path == SimdPath::Avx512 && matches!(format, gguf::GgmlType::Q4_1 | gguf::GgmlType::Q8_0)
}

/// `T` tokens against `R` encoded rows with a fused kernel, if there is one
/// for this path and format (AVX-512 with Q4_1 or Q8_0); `None` otherwise.
#[inline(always)]
fn fused_rows<const T: usize, const R: usize>(
    path: SimdPath,
    format: gguf::GgmlType,
    x: [&[f32]; T],
    rows: [&[u8]; R],
    k: usize,
) -> Option<[[f32; R]; T]> {
    #[cfg(target_arch = "x86_64")]
    if has_fused(path, format) {
        // SAFETY: `Avx512` comes only from `SimdPath::available`, which
        // detected AVX-512F, AVX2, FMA and F16C; `QMatrix` validated the row
        // lengths (whole 32-element blocks) and each `x[t]` holds `k` floats.
        match format {
            gguf::GgmlType::Q4_1 => return Some(unsafe { fused512::q4_1::<T, R>(x, rows, k) }),
            gguf::GgmlType::Q8_0 => return Some(unsafe { fused512::q8_0::<T, R>(x, rows, k) }),
            _ => {}
        }
    }
    let _ = (path, format, x, rows, k);
    None
}

#[inline(always)]
fn tile<const T: usize, const R: usize>(
    path: SimdPath,
    x: &[&[f32]; T],
    w: &[&[f32]; R],
    k: usize,
    out: &mut [[f32; R]; T],
) {
    #[cfg(target_arch = "x86_64")]
    match path {
        // SAFETY: non-portable paths come only from `SimdPath::available`,
        // which detected the features; callers pass rows of length `k`.
        SimdPath::Avx512 => return unsafe { avx512::tile::<T, R>(x, w, k, out) },
        SimdPath::Avx2 => return unsafe { avx2::tile::<T, R>(x, w, k, out) },
        SimdPath::Portable => {}
    }
    let _ = path;
    tile_portable::<T, R>(x, w, k, out)
}

/// Dot product of two equal-length slices, on the detected path, with the
/// same operation order as every element of [`matmul`].
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_with(SimdPath::detect(), a, b)
}

/// [`dot`] on a given path.
pub fn dot_with(path: SimdPath, a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut out = [[0.0f32; 1]; 1];
    tile::<1, 1>(path, &[a], &[b], a.len(), &mut out);
    out[0][0]
}

/// `y[i] += a * x[i]` for every `i` (a product, then a sum: two roundings,
/// bitwise the same on every path and for any length): 16 lanes at a time on
/// AVX-512, a plain loop (compiler-vectorised for the baseline target)
/// elsewhere. Attention accumulates `Σ p_j v_j` with it.
///
/// Panics if `x.len() != y.len()`.
pub fn add_scaled(y: &mut [f32], a: f32, x: &[f32]) {
    add_scaled_with(SimdPath::detect(), y, a, x)
}

/// [`add_scaled`] on a given path (bitwise the same result on every path).
///
/// Panics if `x.len() != y.len()`.
pub fn add_scaled_with(path: SimdPath, y: &mut [f32], a: f32, x: &[f32]) {
    assert_eq!(x.len(), y.len(), "add_scaled: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if path == SimdPath::Avx512 {
        // SAFETY: `Avx512` is only detected with AVX-512F present; lengths checked above.
        return unsafe { avx512::add_scaled(y, a, x) };
    }
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `N` [`add_scaled`] calls in a row, `y += a[i] * xs[i]` for `i = 0..N`,
/// bitwise equal to them (each element sees the same products and sums in the
/// same order) but with `y` kept in registers across the `N` rows on AVX-512.
///
/// Panics if a row's length differs from `y`'s.
pub fn add_scaled_rows<const N: usize>(y: &mut [f32], a: &[f32; N], xs: [&[f32]; N]) {
    add_scaled_rows_with(SimdPath::detect(), y, a, xs)
}

/// [`add_scaled_rows`] on a given path (bitwise the same result on every path).
///
/// Panics if a row's length differs from `y`'s.
pub fn add_scaled_rows_with<const N: usize>(
    path: SimdPath,
    y: &mut [f32],
    a: &[f32; N],
    xs: [&[f32]; N],
) {
    assert!(
        xs.iter().all(|x| x.len() == y.len()),
        "add_scaled_rows: lengths differ"
    );
    #[cfg(target_arch = "x86_64")]
    if path == SimdPath::Avx512 {
        // SAFETY: `Avx512` comes only from `SimdPath::available`, which
        // detected AVX-512F; lengths checked above.
        return unsafe { avx512::add_scaled_rows(y, a, xs) };
    }
    for (x, &a) in xs.iter().zip(a) {
        add_scaled_with(path, y, a, x);
    }
}

/// `R` dot products of `a` with `rows[r]` (each `a.len()` long) on the
/// detected path, computed together (independent accumulators, so the FMA
/// latency is hidden) and each bitwise equal to [`dot`]`(a, rows[r])`.
pub fn dot_rows<const R: usize>(a: &[f32], rows: [&[f32]; R]) -> [f32; R] {
    dot_tile_with::<1, R>(SimdPath::detect(), [a], rows)[0]
}

/// `out[t][r] =` [`dot_with`]`(path, a[t], rows[r])` for a `T × R` register
/// tile (every slice as long as `a[0]`): each product bitwise equal to that
/// [`dot_with`] (the same lane accumulators, lane reduction and tail; see the
/// module docs), with each loaded row used for all `T` (or `R`) partners.
/// Attention scores a block of queries against a block of keys with it.
#[inline]
pub fn dot_tile_with<const T: usize, const R: usize>(
    path: SimdPath,
    a: [&[f32]; T],
    rows: [&[f32]; R],
) -> [[f32; R]; T] {
    let k = a[0].len();
    assert!(
        a.iter().chain(&rows).all(|x| x.len() == k),
        "dot_tile_with: lengths differ"
    );
    let mut out = [[0.0f32; R]; T];
    tile::<T, R>(path, &a, &rows, k, &mut out);
    out
}

/// `out[i * stride + j] =` [`dot_with`]`(path, a_i, b[j]) * scale` for every row `a_i` of `a`
/// (`[m, k]`) and every `b[j]` (`k` long): a block of attention scores. Each value is bitwise
/// that [`dot_with`] times `scale` (the same tile kernels, whose every product is a [`dot_with`]);
/// the register tiles (4 × 4 on AVX-512, 4 × 3 elsewhere) load each row once per tile.
///
/// Panics if `a.len()` is not a multiple of `k`, a `b[j]` is not `k` long, or `out` is too
/// short.
pub fn dot_block_scaled_with(
    path: SimdPath,
    a: &[f32],
    k: usize,
    b: &[&[f32]],
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    assert!(
        k > 0 && a.len().is_multiple_of(k),
        "dot_block_scaled_with: a is not [m, k]"
    );
    assert!(
        b.iter().all(|r| r.len() == k),
        "dot_block_scaled_with: a row of b is not k long"
    );
    let m = a.len() / k;
    if m == 0 || b.is_empty() {
        return;
    }
    assert!(
        out.len() >= (m - 1) * stride + b.len() && stride >= b.len(),
        "dot_block_scaled_with: out too short"
    );
    #[cfg(target_arch = "x86_64")]
    if path == SimdPath::Avx512 {
        // SAFETY: `Avx512` comes only from `SimdPath::available`, which detected AVX-512F,
        // AVX2 and FMA; shapes checked above.
        return unsafe { avx512::dot_block_scaled(a, k, b, scale, out, stride) };
    }
    dot_block::<4, TILE_R, false>(path, a, k, b, scale, out, stride);
}

/// The loops of [`dot_block_scaled_with`] with `T × R` tiles, and `T × 1`, `1 × R`, `1 × 1` at
/// the edges; `WIDE`: call the AVX-512 tile kernel directly (from [`avx512::dot_block_scaled`],
/// where it inlines), else [`tile`] on `path`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dot_block<const T: usize, const R: usize, const WIDE: bool>(
    path: SimdPath,
    a: &[f32],
    k: usize,
    b: &[&[f32]],
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    let m = a.len() / k;
    let row = |i: usize| &a[i * k..(i + 1) * k];
    let mut i = 0;
    while i + T <= m {
        let x: [&[f32]; T] = std::array::from_fn(|t| row(i + t));
        block_cols::<T, R, WIDE>(path, &x, b, k, scale, &mut out[i * stride..], stride);
        i += T;
    }
    for i in i..m {
        block_cols::<1, R, WIDE>(path, &[row(i)], b, k, scale, &mut out[i * stride..], stride);
    }
}

/// One band of `T` rows of [`dot_block`] against all of `b`.
#[inline(always)]
fn block_cols<const T: usize, const R: usize, const WIDE: bool>(
    path: SimdPath,
    x: &[&[f32]; T],
    b: &[&[f32]],
    k: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    let mut j = 0;
    let mut put = |j: usize, vals: &[f32], t: usize| {
        let at = t * stride + j;
        for (o, &v) in out[at..at + vals.len()].iter_mut().zip(vals) {
            *o = v * scale;
        }
    };
    while j + R <= b.len() {
        let w: [&[f32]; R] = std::array::from_fn(|r| b[j + r]);
        let mut o = [[0.0f32; R]; T];
        run_tile::<T, R, WIDE>(path, x, &w, k, &mut o);
        for (t, vals) in o.iter().enumerate() {
            put(j, vals, t);
        }
        j += R;
    }
    for (j, &bj) in b.iter().enumerate().skip(j) {
        let mut o = [[0.0f32; 1]; T];
        run_tile::<T, 1, WIDE>(path, x, &[bj], k, &mut o);
        for (t, vals) in o.iter().enumerate() {
            put(j, vals, t);
        }
    }
}

#[inline(always)]
fn run_tile<const T: usize, const R: usize, const WIDE: bool>(
    path: SimdPath,
    x: &[&[f32]; T],
    w: &[&[f32]; R],
    k: usize,
    out: &mut [[f32; R]; T],
) {
    #[cfg(target_arch = "x86_64")]
    if WIDE {
        // SAFETY: `WIDE` is only set by `avx512::dot_block_scaled`, whose caller checked the
        // AVX-512 path; rows are `k` long.
        return unsafe { avx512::tile::<T, R>(x, w, k, out) };
    }
    tile::<T, R>(path, x, w, k, out)
}

/// Computes the `groups * R` weight rows of `w_rows` (each `k` long, decoded
/// f32) against all `n` tokens of `x`, writing `y[t][r]` through `out`
/// (column `r` of the block).
///
/// Loop order: token tiles outermost, then the row groups of the block, so a
/// tile of `T` token rows stays in L1 while the block's decoded rows (up to
/// [`BLOCK_GROUPS`] × `R` rows, in L2) stream past it; `T` is 8 for 3-row
/// groups on AVX-512 (24 accumulators of 32 registers), else 4 (4 × 4 = 16 of
/// 32 on AVX-512, 4 × 3 = 12 of 16 elsewhere).
fn rows_block<const R: usize>(
    path: SimdPath,
    x: &[f32],
    n: usize,
    k: usize,
    w_rows: &[f32],
    out: &mut OutCols<'_>,
) {
    let groups = w_rows.len() / (R * k);
    let mut t = 0;
    if path == SimdPath::Avx512 && R == TILE_R {
        t = token_tiles::<8, R>(path, x, n, k, t, w_rows, groups, out);
    }
    t = token_tiles::<TILE_T, R>(path, x, n, k, t, w_rows, groups, out);
    token_tiles::<1, R>(path, x, n, k, t, w_rows, groups, out);
}

/// The [`rows_block`] sweep with tiles of `T` tokens, from token `t0` while a
/// whole tile fits; returns the first token not done.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn token_tiles<const T: usize, const R: usize>(
    path: SimdPath,
    x: &[f32],
    n: usize,
    k: usize,
    t0: usize,
    w_rows: &[f32],
    groups: usize,
    out: &mut OutCols<'_>,
) -> usize {
    let mut t = t0;
    while t + T <= n {
        let xs: [&[f32]; T] = std::array::from_fn(|i| &x[(t + i) * k..(t + i + 1) * k]);
        for g in 0..groups {
            let wg = &w_rows[g * R * k..(g + 1) * R * k];
            let w: [&[f32]; R] = std::array::from_fn(|r| &wg[r * k..(r + 1) * k]);
            let mut o = [[0.0; R]; T];
            tile::<T, R>(path, &xs, &w, k, &mut o);
            for (i, oi) in o.iter().enumerate() {
                for (r, &v) in oi.iter().enumerate() {
                    out.set(t + i, g * R + r, v);
                }
            }
        }
        t += T;
    }
    t
}

/// Row groups of [`TILE_R`] rows decoded together into the scratch block
/// (8 × 4 rows of 1536 floats = 192 KiB at most for SmolLM2, L2 resident).
const BLOCK_GROUPS: usize = 8;

thread_local! {
    /// Per-thread decoded weight block, `BLOCK_GROUPS * G * in` floats; grows to the widest matrix seen.
    static SCRATCH: RefCell<AlignedVec> = const { RefCell::new(AlignedVec::new()) };
}

/// Computes rows `r0..r0 + out.len() / n` of `w` against all `n` tokens of
/// `x`, writing `y[t][r]` through `out` (column `r`, relative to `r0`).
fn rows_task(path: SimdPath, x: &[f32], n: usize, w: &QMatrix, r0: usize, mut out: OutCols<'_>) {
    // AVX-512 with the scratch path: 4-row groups under 4 × 4 register tiles,
    // whose 16 accumulators take one `reduce16`. Measured on the 2-core test
    // machine, one thread, the whole matmul (Q4_1 [576, 1536] decoded to the
    // scratch block, then the tiles, both with `reduce16`) at 512 tokens:
    // 86 GFLOP/s with 8 × 3 tiles, 103 with 4 × 4.
    if path == SimdPath::Avx512 && n > FUSED_MAX_TOKENS {
        rows_task_g::<4>(path, x, n, w, r0, &mut out)
    } else {
        rows_task_g::<TILE_R>(path, x, n, w, r0, &mut out)
    }
}

/// Most tokens of a step that take the fused decode-in-registers kernels, in
/// tiles of up to [`FUSED_TILE_T`] tokens (more reuse each decoded weight
/// block from the scratch path instead). Measured on the 2-core test machine,
/// Q4_1 `[3072, 576]`, one thread, GFLOP/s per CPU-second, scratch path ->
/// fused: 4 tokens 41 -> 64-76, 6 tokens 40 -> 64, 8 tokens 64 -> 68.
const FUSED_MAX_TOKENS: usize = 8;

/// Tokens per fused kernel call.
const FUSED_TILE_T: usize = 4;

/// [`rows_task_g`] for the first `T` tokens of `x` (`[_, k]`) with the fused kernels:
/// rows in groups of `G`, the last `rows % G` one at a time.
fn fused_task<const T: usize, const G: usize>(
    path: SimdPath,
    x: &[f32],
    w: &QMatrix,
    r0: usize,
    out: &mut OutCols<'_>,
) {
    let k = w.cols();
    let rows = out.cols;
    let xs: [&[f32]; T] = std::array::from_fn(|t| &x[t * k..(t + 1) * k]);
    let mut r = 0;
    while r < rows {
        if r + G <= rows {
            let enc = std::array::from_fn(|i| w.row_encoded(r0 + r + i));
            let y = fused_rows::<T, G>(path, w.format(), xs, enc, k).expect("checked");
            for (t, yt) in y.iter().enumerate() {
                for (i, &v) in yt.iter().enumerate() {
                    out.set(t, r + i, v);
                }
            }
            r += G;
        } else {
            let enc = [w.row_encoded(r0 + r)];
            let y = fused_rows::<T, 1>(path, w.format(), xs, enc, k).expect("checked");
            for (t, yt) in y.iter().enumerate() {
                out.set(t, r, yt[0]);
            }
            r += 1;
        }
    }
}

/// [`rows_task`] with weight-row groups (decoded tile and register tile) of `G` rows.
fn rows_task_g<const G: usize>(
    path: SimdPath,
    x: &[f32],
    n: usize,
    w: &QMatrix,
    r0: usize,
    out: &mut OutCols<'_>,
) {
    let k = w.cols();
    let rows = out.cols;
    if n <= FUSED_MAX_TOKENS && has_fused(path, w.format()) {
        // Few tokens: decode in registers (bitwise the same as the tile path).
        for t0 in (0..n).step_by(FUSED_TILE_T) {
            let (xt, mut o) = (&x[t0 * k..], out.rows_from(t0));
            match (n - t0).min(FUSED_TILE_T) {
                1 => fused_task::<1, G>(path, xt, w, r0, &mut o),
                2 => fused_task::<2, G>(path, xt, w, r0, &mut o),
                3 => fused_task::<3, G>(path, xt, w, r0, &mut o),
                _ => fused_task::<4, G>(path, xt, w, r0, &mut o),
            }
        }
        return;
    }
    let mut run = |scratch: &mut AlignedVec| {
        let mut r = 0;
        while r < rows {
            // A block of whole groups, or else the last rows one at a time.
            let groups = ((rows - r) / G).min(BLOCK_GROUPS);
            let count = if groups > 0 { groups * G } else { 1 };
            let wr: &[f32] = match w.f32_rows(r0 + r, count) {
                Some(v) => v,
                None => {
                    let s = &mut scratch[..count * k];
                    w.dequantize_rows_with(path, r0 + r, s);
                    s
                }
            };
            let mut o = out.columns(r, count);
            if groups > 0 {
                rows_block::<G>(path, x, n, k, wr, &mut o);
            } else {
                rows_block::<1>(path, x, n, k, wr, &mut o);
            }
            r += count;
        }
    };
    SCRATCH.with_borrow_mut(|s| {
        if s.len() < BLOCK_GROUPS * G * k {
            s.resize(BLOCK_GROUPS * G * k, 0.0);
        }
        run(s)
    });
}

/// `y[n, out] = x[n, in] · W[out, in]ᵀ` where `W` is the row-wise
/// concatenation of `parts` (rows of `parts[0]`, then `parts[1]`, ...; each
/// `[out_i, in]`, `out = Σ out_i`), on the detected path. `x` is row-major
/// (`n * in` floats); returns `y` row-major (`n * out` floats).
///
/// Parallel over blocks of output rows ([`pool::global`]). Bit-identical per element for
/// any `n` (see the module docs).
///
/// Panics if `x.len() != n * in_dim` or a part does not have `in_dim` columns.
pub fn matmul(x: &[f32], n: usize, in_dim: usize, parts: &[QMatrix]) -> Vec<f32> {
    matmul_with(SimdPath::detect(), x, n, in_dim, parts)
}

/// [`matmul`] into `y` (resized to `n * out`, every element overwritten; its
/// allocation is reused, so a step's buffers are not allocated again).
pub fn matmul_into(x: &[f32], n: usize, in_dim: usize, parts: &[QMatrix], y: &mut Vec<f32>) {
    matmul_into_with(SimdPath::detect(), x, n, in_dim, parts, y)
}

/// [`matmul`] on a given path.
pub fn matmul_with(
    path: SimdPath,
    x: &[f32],
    n: usize,
    in_dim: usize,
    parts: &[QMatrix],
) -> Vec<f32> {
    let mut y = Vec::new();
    matmul_into_with(path, x, n, in_dim, parts, &mut y);
    y
}

/// [`matmul_into`] on a given path.
pub fn matmul_into_with(
    path: SimdPath,
    x: &[f32],
    n: usize,
    in_dim: usize,
    parts: &[QMatrix],
    y: &mut Vec<f32>,
) {
    assert_eq!(x.len(), n * in_dim, "matmul: x has wrong length");
    assert!(
        parts.iter().all(|p| p.cols() == in_dim),
        "matmul: weight width differs from in_dim"
    );
    let out_dim: usize = parts.iter().map(QMatrix::rows).sum();
    // Every element is written below, so only new elements are zeroed.
    y.resize(n * out_dim, 0.0);
    if n == 0 {
        return;
    }
    let pool = pool::global();
    let per_task = rows_per_task(n, out_dim, pool.threads());
    // Task i: the i-th block of `per_task` rows, counting through the parts in order.
    let n_tasks = parts.iter().map(|w| w.rows().div_ceil(per_task)).sum();
    let all = OutCols::new(y, n, out_dim);
    pool.run(n_tasks, &|mut i| {
        let mut col = 0;
        for w in parts {
            let here = w.rows().div_ceil(per_task);
            if i < here {
                let r0 = i * per_task;
                // SAFETY: task i alone writes these columns (blocks of distinct
                // tasks do not overlap), and `run` calls each task once.
                let out = unsafe { all.task_columns(col + r0, per_task.min(w.rows() - r0)) };
                return rows_task(path, x, n, w, r0, out);
            }
            i -= here;
            col += w.rows();
        }
        unreachable!("matmul: task index past the last part")
    });
}

/// A block of columns `col0..col0 + cols` of a row-major `[n, stride]`
/// output, written one element at a time by one task. Blocks made by
/// [`OutCols::columns`] from one `&mut` borrow never overlap, so tasks can
/// fill disjoint column ranges of the same rows in parallel (the matmul
/// writes `y` in place, with no transposed copy).
struct OutCols<'a> {
    ptr: *mut f32,
    /// First row (token) of the block.
    row0: usize,
    n: usize,
    stride: usize,
    col0: usize,
    cols: usize,
    _y: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: an `OutCols` is the only writer of its columns (see `columns` and
// `task_columns`); shared, it is only used to make disjoint task blocks.
unsafe impl Send for OutCols<'_> {}
unsafe impl Sync for OutCols<'_> {}

impl<'a> OutCols<'a> {
    /// All `stride` columns of `y` (`[n, stride]`).
    fn new(y: &'a mut [f32], n: usize, stride: usize) -> OutCols<'a> {
        assert_eq!(y.len(), n * stride, "OutCols: shape");
        OutCols {
            ptr: y.as_mut_ptr(),
            row0: 0,
            n,
            stride,
            col0: 0,
            cols: stride,
            _y: std::marker::PhantomData,
        }
    }

    /// Columns `c0..c0 + cols` of this block (relative), borrowing it.
    /// Callers hand out non-overlapping ranges only: `matmul_with` gives each
    /// task its own rows of `W` (= columns of `y`), and a task's sub-blocks
    /// are used one after another.
    fn columns(&mut self, c0: usize, cols: usize) -> OutCols<'a> {
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
    unsafe fn task_columns(&self, c0: usize, cols: usize) -> OutCols<'a> {
        assert!(c0 + cols <= self.cols, "OutCols: columns out of range");
        OutCols {
            ptr: self.ptr,
            row0: self.row0,
            n: self.n,
            stride: self.stride,
            col0: self.col0 + c0,
            cols,
            _y: std::marker::PhantomData,
        }
    }

    /// Rows (tokens) `t0..` of this block, borrowing it.
    fn rows_from(&mut self, t0: usize) -> OutCols<'a> {
        assert!(t0 <= self.n, "OutCols: rows out of range");
        OutCols {
            ptr: self.ptr,
            row0: self.row0 + t0,
            n: self.n - t0,
            stride: self.stride,
            col0: self.col0,
            cols: self.cols,
            _y: std::marker::PhantomData,
        }
    }

    /// `y[row0 + t][col0 + c] = v`.
    #[inline(always)]
    fn set(&mut self, t: usize, c: usize, v: f32) {
        assert!(t < self.n && c < self.cols, "OutCols: index out of range");
        // SAFETY: in bounds of the `[n, stride]` buffer (checked above, and
        // `col0 + cols <= stride` by construction); no other block writes
        // these columns.
        unsafe { *self.ptr.add((self.row0 + t) * self.stride + self.col0 + c) = v }
    }
}

/// Tasks per thread a decode-sized matmul is split into (enough for load
/// balance, few enough that the per-task cost stays small).
const TASKS_PER_THREAD: usize = 8;

/// Weight rows per pool task for `n` tokens and `out_dim` output rows on
/// `threads` threads: [`ROWS_PER_TASK`] when each row is much work (many
/// tokens), else about `out_dim / (threads * TASKS_PER_THREAD)` rows (e.g. 3072 for the 49152-row
/// LM head on 2 threads), always a multiple of [`TILE_R`]. Row grouping never
/// changes a value (each output element has one fixed reduction order).
fn rows_per_task(n: usize, out_dim: usize, threads: usize) -> usize {
    if n > FUSED_MAX_TOKENS {
        return ROWS_PER_TASK;
    }
    let even = out_dim.div_ceil(threads.max(1) * TASKS_PER_THREAD);
    even.next_multiple_of(TILE_R).max(ROWS_PER_TASK)
}

#[cfg(test)]
mod tests {
    use gguf::GgmlType;

    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed * 97);
                ((h >> 8) % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// The transposed 16-way reduction gives bitwise the per-vector lane sums,
    /// including for values whose sum depends on the association order.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn reduce16_is_bitwise_hsum() {
        if !SimdPath::available().contains(&SimdPath::Avx512) {
            return;
        }
        use std::arch::x86_64::*;
        // Mixed magnitudes, so a different association would round differently.
        let v: Vec<f32> = data(256, 7)
            .iter()
            .enumerate()
            .map(|(i, &x)| x * [1.0, 1e7, 3e-3, 1e4][i % 4])
            .collect();
        // SAFETY: AVX-512F was detected above; every load reads 16 of the 256 floats.
        unsafe {
            let vs: [__m512; 16] = std::array::from_fn(|i| _mm512_loadu_ps(v[16 * i..].as_ptr()));
            let mut sums = [0.0f32; 16];
            _mm512_storeu_ps(sums.as_mut_ptr(), avx512::reduce16(&vs));
            for (i, &s) in sums.iter().enumerate() {
                let mut one = [[0.0f32; 1]; 1];
                avx512::tile::<1, 1>(&[&v[16 * i..16 * i + 16]], &[&[1.0; 16]], 16, &mut one);
                assert_eq!(s.to_bits(), one[0][0].to_bits(), "vector {i}");
            }
        }
    }

    #[test]
    fn add_scaled_rows_is_bitwise_add_scaled_in_order() {
        for len in [1, 16, 64, 67] {
            let rows: Vec<Vec<f32>> = (0..4).map(|i| data(len, 10 + i)).collect();
            let a = [0.3, -1.7e3, 2.5e-4, 0.9];
            let mut expected = data(len, 3);
            let mut got = expected.clone();
            for (x, &ai) in rows.iter().zip(&a) {
                add_scaled(&mut expected, ai, x);
            }
            add_scaled_rows::<4>(&mut got, &a, std::array::from_fn(|i| &rows[i][..]));
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&expected), "len {len}");
            let scalar: Vec<f32> = (0..len)
                .map(|j| (0..4).fold(data(len, 3)[j], |y, i| y + a[i] * rows[i][j]))
                .collect();
            assert_eq!(bits(&got), bits(&scalar), "len {len} against scalar");
        }
    }

    fn f32_matrix(rows: usize, cols: usize, seed: u32) -> QMatrix {
        QMatrix::from_f32(rows, cols, data(rows * cols, seed))
    }

    /// `[rows, cols]` random weights encoded in `format`.
    fn encoded(format: GgmlType, rows: usize, cols: usize, seed: u32) -> QMatrix {
        let w = data(rows * cols, seed);
        let bytes = match format {
            GgmlType::Q8_0 => gguf::quantize_q8_0(&w).unwrap(),
            GgmlType::Q4_1 => gguf::quantize_q4_1(&w).unwrap(),
            GgmlType::F16 => gguf::quant::quantize_f16(&w),
            GgmlType::BF16 => w
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
            GgmlType::F32 => gguf::quant::encode_f32(&w),
            _ => gguf::testing::random_encoding(format, rows * cols, seed as u64),
        };
        QMatrix::from_bytes(format, rows, cols, &bytes).unwrap()
    }

    /// Scalar f64 reference over the reference-dequantized weights.
    fn naive(x: &[f32], n: usize, parts: &[QMatrix]) -> Vec<f64> {
        let k = parts[0].cols();
        let mut w = Vec::new();
        for p in parts {
            let mut d = vec![0.0; p.rows() * k];
            p.dequantize_rows_with(SimdPath::Portable, 0, &mut d);
            w.extend(d);
        }
        let out = w.len() / k;
        let mut y = vec![0.0; n * out];
        for t in 0..n {
            for o in 0..out {
                y[t * out + o] = (0..k)
                    .map(|i| x[t * k + i] as f64 * w[o * k + i] as f64)
                    .sum();
            }
        }
        y
    }

    /// Every available path, every format, awkward sizes, against the scalar
    /// reference; and per path, each row alone gives bitwise its batched result.
    #[test]
    fn every_path_and_format_matches_reference_and_is_batch_invariant() {
        let formats = [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q8_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ];
        for path in SimdPath::available() {
            for format in formats {
                let shapes: &[(usize, [usize; 2])] = if format.block_size() == Some(256) {
                    &[(256, [1, 5]), (512, [3, 17])]
                } else {
                    &[(32, [1, 5]), (96, [50, 7]), (576, [3, 97])]
                };
                for &(k, outs) in shapes {
                    let parts: Vec<QMatrix> = outs
                        .iter()
                        .enumerate()
                        .map(|(i, &o)| encoded(format, o, k, 10 + i as u32))
                        .collect();
                    let out: usize = outs.iter().sum();
                    for n in [1usize, 2, 3, 5, 8, 17, 64] {
                        let x = data(n * k, n as u32);
                        let y = matmul_with(path, &x, n, k, &parts);
                        let want = naive(&x, n, &parts);
                        for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
                            assert!(
                                (g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()) * (k as f64).sqrt(),
                                "{path:?} {format} n={n} k={k} elem {i}: {g} vs {w}"
                            );
                        }
                        for t in [0, n / 2, n - 1] {
                            let single = matmul_with(path, &x[t * k..(t + 1) * k], 1, k, &parts);
                            let bits =
                                |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(&single),
                                bits(&y[t * out..(t + 1) * out]),
                                "{path:?} {format} n={n} k={k} row {t}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn matches_naive_f32_odd_widths() {
        for path in SimdPath::available() {
            for &(n, k, out) in &[(1, 8, 1), (5, 37, 7), (9, 64, 100), (3, 577, 50)] {
                let x = data(n * k, 1);
                let w = [f32_matrix(out, k, 2)];
                let y = matmul_with(path, &x, n, k, &w);
                let want = naive(&x, n, &w);
                for (&g, &w) in y.iter().zip(&want) {
                    assert!(
                        (g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()),
                        "{path:?} {g} {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn batch_invariant_bitwise() {
        let (n, k, out) = (11, 200, 131);
        let x = data(n * k, 3);
        let wv = data(out * k, 4);
        let w = [QMatrix::from_f32(out, k, wv.clone())];
        for path in SimdPath::available() {
            let y = matmul_with(path, &x, n, k, &w);
            for t in 0..n {
                let single = matmul_with(path, &x[t * k..(t + 1) * k], 1, k, &w);
                assert_eq!(single, y[t * out..(t + 1) * out], "token {t}");
                for o in 0..out {
                    assert_eq!(
                        dot_with(path, &x[t * k..(t + 1) * k], &wv[o * k..(o + 1) * k]),
                        single[o]
                    );
                }
            }
        }
    }

    #[test]
    fn task_sizes() {
        assert_eq!(rows_per_task(32, 49152, 2), ROWS_PER_TASK);
        assert_eq!(rows_per_task(1, 49152, 2), 3072);
        assert_eq!(rows_per_task(1, 960, 2), 60);
        assert_eq!(rows_per_task(3, 576, 2), ROWS_PER_TASK);
        assert_eq!(rows_per_task(1, 100_000, 0) % TILE_R, 0);
    }

    #[test]
    fn empty() {
        assert!(matmul(&[], 0, 4, &[f32_matrix(2, 4, 1)]).is_empty());
    }

    #[test]
    fn portable_matches_simd_closely() {
        let k = 77;
        let (a, b) = (data(k, 5), data(k, 6));
        for path in SimdPath::available() {
            let p = dot_with(SimdPath::Portable, &a, &b);
            assert!((p - dot_with(path, &a, &b)).abs() < 1e-5);
        }
    }
}
