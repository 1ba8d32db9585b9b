//! Batched f32 matrix multiply `y[n, out] = x[n, in] · W[out, in]ᵀ` and the
//! dot product used everywhere else in the model.
//!
//! Determinism: every output element is computed by the same sequence of
//! floating-point operations regardless of `n`, the tile it falls in, or the
//! thread that computes it: 8 independent lane accumulators over `k = 0, 8,
//! 16, ...` (lane `l` sums elements `k + l` in increasing `k`), a fixed
//! pairwise lane reduction, then a sequential scalar tail for `in % 8`
//! elements. So the same token gives bit-identical results alone or in a
//! batch. On x86-64 CPUs with AVX2+FMA the lanes use fused multiply-add
//! (selected once at runtime); elsewhere a portable path uses separate
//! multiply and add, so results are reproducible per machine, not across
//! machines.
//!
//! Blocking: rayon tasks own blocks of [`ROWS_PER_TASK`] weight rows; inside
//! a task a register tile of up to 4 tokens × 3 weight rows (12 vector
//! accumulators) walks the shared dimension, so each weight row block is
//! reused from L1/L2 for every token.

use rayon::prelude::*;

/// Weight rows per rayon task.
pub const ROWS_PER_TASK: usize = 48;
/// Tokens per register tile.
const TILE_T: usize = 4;
/// Weight rows per register tile.
const TILE_R: usize = 3;
/// SIMD lanes of the accumulators.
const LANES: usize = 8;

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx2_fma() -> bool {
    false
}

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
    unsafe fn hsum(v: __m256) -> f32 {
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

#[inline(always)]
fn tile<const T: usize, const R: usize>(
    simd: bool,
    x: &[&[f32]; T],
    w: &[&[f32]; R],
    k: usize,
    out: &mut [[f32; R]; T],
) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is only true when AVX2 and FMA were detected, and
        // callers pass rows of length `k`.
        unsafe { avx2::tile::<T, R>(x, w, k, out) };
        return;
    }
    let _ = simd;
    tile_portable::<T, R>(x, w, k, out)
}

/// Dot product of two equal-length slices with the same operation order as
/// every element of [`matmul`].
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut out = [[0.0f32; 1]; 1];
    tile::<1, 1>(has_avx2_fma(), &[a], &[b], a.len(), &mut out);
    out[0][0]
}

/// Computes `R` weight rows (`w_rows`, each `k` long) against all `n` tokens
/// of `x`, writing `out[r * n + t]` (weight-row-major block of `yᵀ`).
fn rows_block<const R: usize>(
    simd: bool,
    x: &[f32],
    n: usize,
    k: usize,
    w_rows: &[f32],
    out: &mut [f32],
) {
    let w: [&[f32]; R] = std::array::from_fn(|r| &w_rows[r * k..(r + 1) * k]);
    let row = |t: usize| &x[t * k..(t + 1) * k];
    let mut t = 0;
    while t + TILE_T <= n {
        let xs: [&[f32]; TILE_T] = std::array::from_fn(|i| row(t + i));
        let mut o = [[0.0; R]; TILE_T];
        tile::<TILE_T, R>(simd, &xs, &w, k, &mut o);
        for (i, oi) in o.iter().enumerate() {
            for r in 0..R {
                out[r * n + t + i] = oi[r];
            }
        }
        t += TILE_T;
    }
    while t < n {
        let mut o = [[0.0; R]; 1];
        tile::<1, R>(simd, &[row(t)], &w, k, &mut o);
        for r in 0..R {
            out[r * n + t] = o[0][r];
        }
        t += 1;
    }
}

/// `y[n, out] = x[n, in] · W[out, in]ᵀ` with row-major `x` (`n * in` floats)
/// and `w` (`out * in` floats). Returns `y` row-major (`n * out` floats).
///
/// Parallel over blocks of output rows (rayon). Bit-identical per element for
/// any `n` (see the module docs).
///
/// Panics if `x.len() != n * in_dim` or `w.len() % in_dim != 0` (internal invariants).
pub fn matmul(x: &[f32], n: usize, in_dim: usize, w: &[f32]) -> Vec<f32> {
    assert_eq!(x.len(), n * in_dim, "matmul: x has wrong length");
    assert!(
        in_dim > 0 && w.len().is_multiple_of(in_dim),
        "matmul: w has wrong length"
    );
    let out_dim = w.len() / in_dim;
    if n == 0 {
        return Vec::new();
    }
    let simd = has_avx2_fma();
    // yt[o * n + t] = y[t, o]
    let mut yt = vec![0.0f32; out_dim * n];
    yt.par_chunks_mut(ROWS_PER_TASK * n)
        .zip(w.par_chunks(ROWS_PER_TASK * in_dim))
        .for_each(|(out, w_block)| {
            let rows = w_block.len() / in_dim;
            let mut r = 0;
            while r + TILE_R <= rows {
                let wr = &w_block[r * in_dim..(r + TILE_R) * in_dim];
                rows_block::<TILE_R>(simd, x, n, in_dim, wr, &mut out[r * n..(r + TILE_R) * n]);
                r += TILE_R;
            }
            while r < rows {
                let wr = &w_block[r * in_dim..(r + 1) * in_dim];
                rows_block::<1>(simd, x, n, in_dim, wr, &mut out[r * n..(r + 1) * n]);
                r += 1;
            }
        });
    if n == 1 {
        return yt;
    }
    transpose(&yt, out_dim, n)
}

/// Tokens per rayon task of [`transpose`].
const TRANSPOSE_ROWS: usize = 8;

/// Transposes the row-major `[rows, cols]` matrix `a` into `[cols, rows]`, in
/// parallel over blocks of [`TRANSPOSE_ROWS`] output rows (each task reads
/// short contiguous runs of `a` and writes a few output rows).
fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; rows * cols];
    out.par_chunks_mut(TRANSPOSE_ROWS * rows)
        .enumerate()
        .for_each(|(b, block)| {
            let c0 = b * TRANSPOSE_ROWS;
            let nc = block.len() / rows;
            for (r, src) in a.chunks_exact(cols).enumerate() {
                for (i, &v) in src[c0..c0 + nc].iter().enumerate() {
                    block[i * rows + r] = v;
                }
            }
        });
    out
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn matches_naive() {
        for &(n, k, out) in &[(1, 8, 1), (5, 37, 7), (9, 64, 100), (3, 576, 50)] {
            let x = data(n * k, 1);
            let w = data(out * k, 2);
            let y = matmul(&x, n, k, &w);
            for t in 0..n {
                for o in 0..out {
                    let want: f64 = (0..k)
                        .map(|i| x[t * k + i] as f64 * w[o * k + i] as f64)
                        .sum();
                    let got = y[t * out + o] as f64;
                    assert!(
                        (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{got} {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn batch_invariant_bitwise() {
        let (n, k, out) = (11, 200, 131);
        let x = data(n * k, 3);
        let w = data(out * k, 4);
        let y = matmul(&x, n, k, &w);
        for t in 0..n {
            let single = matmul(&x[t * k..(t + 1) * k], 1, k, &w);
            assert_eq!(single, y[t * out..(t + 1) * out], "token {t}");
            for o in 0..out {
                assert_eq!(
                    dot(&x[t * k..(t + 1) * k], &w[o * k..(o + 1) * k]),
                    single[o]
                );
            }
        }
    }

    #[test]
    fn transpose_and_empty() {
        let a: Vec<f32> = (0..60).map(|i| i as f32).collect();
        let t = transpose(&a, 6, 10);
        for r in 0..6 {
            for c in 0..10 {
                assert_eq!(t[c * 6 + r], a[r * 10 + c]);
            }
        }
        assert!(matmul(&[], 0, 4, &[1.0; 8]).is_empty());
    }

    #[test]
    fn portable_matches_simd_closely() {
        let k = 77;
        let (a, b) = (data(k, 5), data(k, 6));
        let mut out = [[0.0f32; 1]; 1];
        tile_portable::<1, 1>(&[&a], &[&b], k, &mut out);
        assert!((out[0][0] - dot(&a, &b)).abs() < 1e-5);
    }
}
