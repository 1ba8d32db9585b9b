//! Register-tile dot-product kernels `out[t][r] = dot(x[t], w[r])` over decoded f32 rows, one per
//! SIMD path (portable, AVX2+FMA, AVX-512), with the lane layouts and reductions the module
//! docs of [`super`] fix.

/// SIMD lanes of the portable and AVX2 accumulators.
const LANES: usize = 8;

/// Computes `out[t][r] = dot(x[t], w[r])` for a `T × R` tile.
/// `x` holds `T` rows and `w` holds `R` rows, both of length `k`.
#[inline(always)]
pub(super) fn tile_portable<const T: usize, const R: usize>(
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
pub(super) mod avx2 {
    use std::arch::x86_64::*;

    use super::LANES;

    /// Lane reduction with the same association as the portable path:
    /// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
    #[inline(always)]
    pub(crate) unsafe fn hsum(v: __m256) -> f32 {
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
    pub(crate) unsafe fn tile<const T: usize, const R: usize>(
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

    /// [`super::super::add_scaled_rows`]: 8 output lanes at a time ([`super::rows::add_scaled_rows`]).
    ///
    /// # Safety
    /// The CPU must support AVX2; every `xs[i].len() == y.len()`.
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn add_scaled_rows<const N: usize>(
        y: &mut [f32],
        a: &[f32; N],
        xs: [&[f32]; N],
    ) {
        super::rows::add_scaled_rows::<__m256, N>(y, a, xs)
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use std::arch::x86_64::*;

    /// SIMD lanes of the AVX-512 accumulators.
    const LANES: usize = 16;

    /// Lane reduction: `lo8 + hi8` lane-wise, then the AVX2 8-lane order.
    #[inline(always)]
    pub(crate) unsafe fn hsum(v: __m512) -> f32 {
        let lo = _mm512_castps512_ps256(v);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
        super::avx2::hsum(_mm256_add_ps(lo, hi))
    }

    /// AVX-512F version of `tile_portable` with 16 lanes.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2 and FMA; every slice must hold at least `k` floats.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(crate) unsafe fn tile<const T: usize, const R: usize>(
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

    /// [`super::super::add_scaled_rows`]: 16 output lanes at a time ([`super::rows::add_scaled_rows`]).
    ///
    /// # Safety
    /// The CPU must support AVX-512F; every `xs[i].len() == y.len()`.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn add_scaled_rows<const N: usize>(
        y: &mut [f32],
        a: &[f32; N],
        xs: [&[f32]; N],
    ) {
        super::rows::add_scaled_rows::<__m512, N>(y, a, xs)
    }

    /// `out[t][r] = hsum(acc[t][r])` for a whole tile: one lane reduction per
    /// accumulator for tiles of fewer than 8, else [`reduce16`] over groups of
    /// up to 16 accumulators (bitwise the same sums).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    pub(crate) unsafe fn reduce_tile<const T: usize, const R: usize>(
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
    pub(crate) unsafe fn reduce16(v: &[__m512; 16]) -> __m512 {
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

/// Scaled row additions written once for both x86 vector widths.
#[cfg(target_arch = "x86_64")]
mod rows {
    use std::arch::x86_64::*;

    /// The f32 vector operations of one x86 width that [`add_scaled_rows`] needs. The methods
    /// are `inline(always)` so that they compile inside the caller's `target_feature` function.
    pub(super) trait F32Vector: Copy {
        /// f32 lanes per vector.
        const LANES: usize;
        /// `a` in every lane.
        unsafe fn splat(a: f32) -> Self;
        /// `LANES` floats from `p` (unaligned).
        unsafe fn load(p: *const f32) -> Self;
        /// Writes the lanes to `p` (unaligned).
        unsafe fn store(self, p: *mut f32);
        /// Lane-wise `self * o` (one rounding).
        unsafe fn mul(self, o: Self) -> Self;
        /// Lane-wise `self + o` (one rounding).
        unsafe fn add(self, o: Self) -> Self;
    }

    impl F32Vector for __m256 {
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn splat(a: f32) -> Self {
            _mm256_set1_ps(a)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            _mm256_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm256_storeu_ps(p, self)
        }
        #[inline(always)]
        unsafe fn mul(self, o: Self) -> Self {
            _mm256_mul_ps(self, o)
        }
        #[inline(always)]
        unsafe fn add(self, o: Self) -> Self {
            _mm256_add_ps(self, o)
        }
    }

    impl F32Vector for __m512 {
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn splat(a: f32) -> Self {
            _mm512_set1_ps(a)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            _mm512_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm512_storeu_ps(p, self)
        }
        #[inline(always)]
        unsafe fn mul(self, o: Self) -> Self {
            _mm512_mul_ps(self, o)
        }
        #[inline(always)]
        unsafe fn add(self, o: Self) -> Self {
            _mm512_add_ps(self, o)
        }
    }

    /// `y += a[r] * xs[r]` for `r = 0..N` in order, each element a product then a sum (two
    /// roundings per row, no FMA), so bitwise the scalar loop on every width and length. `y`
    /// stays in a register across the `N` rows, `V::LANES` elements at a time; the
    /// `len % LANES` tail is scalar.
    ///
    /// # Safety
    /// The caller's `target_feature` must cover `V`'s instructions; every `xs[r].len() ==
    /// y.len()`.
    #[inline(always)]
    pub(super) unsafe fn add_scaled_rows<V: F32Vector, const N: usize>(
        y: &mut [f32],
        a: &[f32; N],
        xs: [&[f32]; N],
    ) {
        let n = y.len();
        let body = n - n % V::LANES;
        let yp = y.as_mut_ptr();
        let mut i = 0;
        while i < body {
            let mut acc = V::load(yp.add(i));
            for r in 0..N {
                acc = acc.add(V::splat(a[r]).mul(V::load(xs[r].as_ptr().add(i))));
            }
            acc.store(yp.add(i));
            i += V::LANES;
        }
        for j in body..n {
            for r in 0..N {
                y[j] += a[r] * xs[r][j];
            }
        }
    }
}
