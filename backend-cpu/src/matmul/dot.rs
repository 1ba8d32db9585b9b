//! Dot products and scaled row additions of f32 vectors, the attention's kernels: each value
//! computed by the same register-tile kernels, with the same operation order, as an element of
//! [`super::matmul`] (see the module docs there), on the detected or a given SIMD path.

#[cfg(target_arch = "x86_64")]
use super::simd::{avx2, avx512};
use super::{tile, SimdPath, TILE_R};

/// Dot product of two equal-length slices, on the detected path, with the
/// same operation order as every element of [`super::matmul`].
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
/// AVX-512, 8 on AVX2, a plain loop (compiler-vectorised for the baseline target)
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
    add_scaled_rows_with::<1>(path, y, &[a], [x])
}

/// `N` [`add_scaled`] calls in a row, `y += a[i] * xs[i]` for `i = 0..N`,
/// bitwise equal to them (each element sees the same products and sums in the
/// same order) but with `y` kept in registers across the `N` rows on AVX-512 and AVX2.
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
    match path {
        // SAFETY: `Avx512` and `Avx2` come only from `SimdPath::available`, which detected
        // AVX-512F or AVX2; lengths checked above.
        #[cfg(target_arch = "x86_64")]
        SimdPath::Avx512 => unsafe { avx512::add_scaled_rows(y, a, xs) },
        #[cfg(target_arch = "x86_64")]
        SimdPath::Avx2 => unsafe { avx2::add_scaled_rows(y, a, xs) },
        _ => {
            for (x, &a) in xs.iter().zip(a) {
                for (y, &x) in y.iter_mut().zip(*x) {
                    *y += a * x;
                }
            }
        }
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
        return unsafe { dot_block_scaled_avx512(a, k, b, scale, out, stride) };
    }
    dot_block::<4, TILE_R, false>(path, a, k, b, scale, out, stride);
}

/// [`dot_block_scaled_with`] on AVX-512: 4 × 4 tiles of [`avx512::tile`] (inlined here), then
/// 4 × 1, 1 × 4 and 1 × 1 at the edges.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA; shapes as checked by the caller.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn dot_block_scaled_avx512(
    a: &[f32],
    k: usize,
    b: &[&[f32]],
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    dot_block::<4, 4, true>(SimdPath::Avx512, a, k, b, scale, out, stride);
}

/// The loops of [`dot_block_scaled_with`] with `T × R` tiles, and `T × 1`, `1 × R`, `1 × 1` at
/// the edges; `WIDE`: call the AVX-512 tile kernel directly (from [`dot_block_scaled_avx512`],
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
        // SAFETY: `WIDE` is only set by `dot_block_scaled_avx512`, whose caller checked the
        // AVX-512 path; rows are `k` long.
        return unsafe { avx512::tile::<T, R>(x, w, k, out) };
    }
    tile::<T, R>(path, x, w, k, out)
}
