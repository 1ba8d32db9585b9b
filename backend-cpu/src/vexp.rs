//! A vectorised `expf` bitwise equal to `f32::exp`, for the softmax and the gated activations.
//!
//! `exp(x)` is computed 16 lanes at a time on AVX-512 by the algorithm of glibc's
//! `expf` (Szabolcs Nagy's from ARM's optimized-routines, glibc 2.28 and later: `x · 32/ln 2`
//! split into `k + r`, `2^(k/32)` from a 32-entry table, a cubic in `r`, all in double) with
//! exactly the fused multiply-adds of glibc's `__expf_fma` (read from its disassembly), so
//! every lane is the bits `f32::exp` returns; lanes glibc sends to its special cases
//! (`|x| >= 88`, NaN) are recomputed with `f32::exp` itself. The first use checks the kernel
//! against this process's `f32::exp` on a spread of inputs and keeps the scalar loop if any
//! differs (another libm), so callers get `f32::exp`'s bits on every path.

use std::sync::OnceLock;

use super::SimdPath;

/// `x[j] = (x[j] - max).exp()` for every `j`; with `vector`, 16 lanes at a time (AVX-512).
pub(crate) fn exp_sub(vector: bool, x: &mut [f32], max: f32) {
    #[cfg(target_arch = "x86_64")]
    if vector {
        // SAFETY: `vector` is only set on the AVX-512 path, detected with AVX-512F, AVX2 and FMA.
        return unsafe { avx512::exp_sub(x, max) };
    }
    let _ = vector;
    for v in x {
        *v = (*v - max).exp();
    }
}

/// Whether the AVX-512 kernel gives `f32::exp`'s bits on a spread of inputs (every 997th float
/// of `[-88, 0]`, the softmax's domain; every 9973rd of `[0, 88]`; the special-case boundaries,
/// zeros, infinities, NaN); checked once.
pub(crate) fn vector_exp_ok() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        SimdPath::available().contains(&SimdPath::Avx512)
            && vector_matches_libm((0x8000_0000u32..=0xC2B0_0000).step_by(997))
            && vector_matches_libm((0u32..=0x42B0_0000).step_by(9973))
            && vector_matches_libm(
                [
                    0.0f32, -0.0, -88.0, -87.99999, -88.00001, -103.9, -104.0, -1e-45, 88.0, 88.7,
                    89.0,
                ]
                .iter()
                .map(|x| x.to_bits())
                .chain([f32::NEG_INFINITY.to_bits(), f32::NAN.to_bits()]),
            )
    })
}

/// Whether [`exp_sub`] with the AVX-512 kernel and `max` 0 gives `f32::exp`'s bits for every
/// input (as bit patterns), bitwise (NaN as NaN).
fn vector_matches_libm(bits: impl Iterator<Item = u32>) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let mut xs: Vec<f32> = bits.map(f32::from_bits).collect();
        let want: Vec<f32> = xs.iter().map(|x| x.exp()).collect();
        // SAFETY: the caller checked that the CPU has the AVX-512 path.
        unsafe { avx512::exp_sub(&mut xs, 0.0) };
        xs.iter()
            .zip(&want)
            .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = bits;
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// glibc's `__exp2f_data.tab`: `bits(2^(i/32)) - (i << 47)`.
    const TAB: [u64; 32] = [
        0x3ff0000000000000,
        0x3fefd9b0d3158574,
        0x3fefb5586cf9890f,
        0x3fef9301d0125b51,
        0x3fef72b83c7d517b,
        0x3fef54873168b9aa,
        0x3fef387a6e756238,
        0x3fef1e9df51fdee1,
        0x3fef06fe0a31b715,
        0x3feef1a7373aa9cb,
        0x3feedea64c123422,
        0x3feece086061892d,
        0x3feebfdad5362a27,
        0x3feeb42b569d4f82,
        0x3feeab07dd485429,
        0x3feea47eb03a5585,
        0x3feea09e667f3bcd,
        0x3fee9f75e8ec5f74,
        0x3feea11473eb0187,
        0x3feea589994cce13,
        0x3feeace5422aa0db,
        0x3feeb737b0cdc5e5,
        0x3feec49182a3f090,
        0x3feed503b23e255d,
        0x3feee89f995ad3ad,
        0x3feeff76f2fb5e47,
        0x3fef199bdd85529c,
        0x3fef3720dcef9069,
        0x3fef5818dcfba487,
        0x3fef7c97337b9b5f,
        0x3fefa4afa2a490da,
        0x3fefd0765b6e4540,
    ];
    /// `32 / ln 2`, the cubic's coefficients scaled for `N = 32`, and the rounding shift
    /// `1.5 · 2^52` (glibc's `invln2_scaled`, `poly_scaled`, `shift`).
    const INV_LN2_N: f64 = f64::from_bits(0x40471547652b82fe);
    const C0: f64 = f64::from_bits(0x3ebc6af84b912394);
    const C1: f64 = f64::from_bits(0x3f2ebfce50fac4f3);
    const C2: f64 = f64::from_bits(0x3f962e42ff0c52d6);
    const SHIFT: f64 = f64::from_bits(0x4338000000000000);
    /// `|x|` bits from which glibc takes its special-case branch (`top12(88.0f)`).
    const SPECIAL: u32 = 0x42B0_0000;

    /// glibc `__expf_fma`'s main path on 8 lanes (widened to double).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn exp8(x: __m256, tab: &[__m512i; 4]) -> __m256 {
        let xd = _mm512_cvtps_pd(x);
        let inv = _mm512_set1_pd(INV_LN2_N);
        let shift = _mm512_set1_pd(SHIFT);
        let kd_shifted = _mm512_fmadd_pd(inv, xd, shift);
        let ki = _mm512_castpd_si512(kd_shifted);
        let kd = _mm512_sub_pd(kd_shifted, shift);
        let r = _mm512_fmsub_pd(inv, xd, kd);
        // tab[ki % 32]: bit 3 of the index picks the table of each pair, bit 4 the pair.
        let lo = _mm512_permutex2var_epi64(tab[0], ki, tab[1]);
        let hi = _mm512_permutex2var_epi64(tab[2], ki, tab[3]);
        let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
        let t = _mm512_add_epi64(
            _mm512_mask_blend_epi64(upper, lo, hi),
            _mm512_slli_epi64::<47>(ki),
        );
        let s = _mm512_castsi512_pd(t);
        let z = _mm512_fmadd_pd(r, _mm512_set1_pd(C0), _mm512_set1_pd(C1));
        let r2 = _mm512_mul_pd(r, r);
        let y = _mm512_fmadd_pd(r, _mm512_set1_pd(C2), _mm512_set1_pd(1.0));
        let y = _mm512_fmadd_pd(z, r2, y);
        _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
    }

    /// [`super::exp_sub`] 16 lanes at a time.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn exp_sub(x: &mut [f32], max: f32) {
        let tab: [__m512i; 4] =
            std::array::from_fn(|i| _mm512_loadu_si512(TAB[8 * i..].as_ptr() as *const _));
        let m = _mm512_set1_ps(max);
        let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
        let special = _mm512_set1_epi32(SPECIAL as i32);
        let n = x.len();
        let p = x.as_mut_ptr();
        let mut i = 0;
        while i + 16 <= n {
            let v = _mm512_sub_ps(_mm512_loadu_ps(p.add(i)), m);
            let lo = exp8(_mm512_castps512_ps256(v), &tab);
            let hi = exp8(
                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)),
                &tab,
            );
            let e = _mm512_castpd_ps(_mm512_insertf64x4(
                _mm512_castps_pd(_mm512_castps256_ps512(lo)),
                _mm256_castps_pd(hi),
                1,
            ));
            _mm512_storeu_ps(p.add(i), e);
            let abs = _mm512_and_si512(_mm512_castps_si512(v), abs_mask);
            let mut odd = _mm512_cmpge_epu32_mask(abs, special);
            if odd != 0 {
                let mut lanes = [0.0f32; 16];
                _mm512_storeu_ps(lanes.as_mut_ptr(), v);
                while odd != 0 {
                    let l = odd.trailing_zeros() as usize;
                    *p.add(i + l) = lanes[l].exp();
                    odd &= odd - 1;
                }
            }
            i += 16;
        }
        for j in i..n {
            *p.add(j) = (*p.add(j) - max).exp();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 exponential against `f32::exp` on every `STRIDE`-th float of `[-88, 0]`
    /// (`SOFTMAX_EXP_STRIDE=1`: all 1.1e9 of them, a few seconds) and across glibc's
    /// special-case boundary.
    #[test]
    fn vector_exp_is_libm_expf() {
        if !SimdPath::available().contains(&SimdPath::Avx512) {
            return; // no AVX-512 kernel on this CPU: the scalar loop is f32::exp itself
        }
        let stride = std::env::var("SOFTMAX_EXP_STRIDE")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(101);
        assert!(vector_matches_libm(
            (0x8000_0000u32..=0xC2B0_0000).step_by(stride)
        ));
        assert!(vector_matches_libm(0xC2A0_0000u32..=0xC2E0_0000));
        assert!(vector_matches_libm(
            (0..=0x42B0_0000u32).step_by(stride * 10)
        ));
        assert!(vector_exp_ok());
    }
}
