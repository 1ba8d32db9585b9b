//! The byte multiply-accumulate of each x86 path ([`Mac`]): AVX2 `vpmaddubsw` + `vpmaddwd`, or
//! AVX-512 VNNI `vpdpbusd` (256-bit form).

use std::arch::x86_64::*;

use super::codes::bytes_from_bits;

/// The integer products of a tile of 8 weight rows (lane `r` = row `r`) with one activation
/// block, for the transposed codes of [`super::transpose8`].
pub(super) trait Mac {
    /// What Q8_0's integer sum must subtract times the activation block's `Σq` (the bias
    /// [`Mac::prep`] added to the codes).
    const Q8_OFFSET: i32;

    /// The unsigned operands of [`Mac::dot8`] from the transposed codes `raw` (for Q8_0, `signed`,
    /// the signed weight bytes; otherwise the codes themselves).
    unsafe fn prep(signed: bool, raw: [__m256i; 8]) -> [__m256i; 8];

    /// Per lane `r`: `Σ_i Σ_j u[i]_r[j] · x[4i + j]` (`x` the 32 activation codes at `xq`), plus
    /// `Q8_OFFSET · Σ x` for Q8_0; exact. Codes are below 32 unless `signed`, so 4 `vpmaddubsw`
    /// pairs of sums (each at most 2 · 31 · 127) add in i16 without overflow.
    unsafe fn dot8(u: &[__m256i; 8], raw: &[__m256i; 8], signed: bool, xq: *const i8) -> __m256i;

    /// `0x10` in each byte `j` of the result whose bit `j` of `bits` is set, else 0 (a 5-bit
    /// format's fifth bits as code bytes).
    unsafe fn fifth_bits(bits: u32) -> __m256i;

    /// `acc + Σ_j u_r[j] · x[j]` per dword lane `r` (the 4 bytes of `u`'s lane against the
    /// activation dword at `xq`, broadcast; exact for codes up to 63).
    unsafe fn mac1(acc: __m256i, u: __m256i, xq: *const i8) -> __m256i;

    /// Lane partial sums of `u[i] * x[i]` (`u` unsigned, `x` signed bytes; exact, which lane holds
    /// which partial differs between implementations, the total does not).
    unsafe fn dot1(u: __m256i, x: __m256i) -> __m256i;

    /// Per lane `r`: `Σ_{i<N} Σ_j u[i]_r[j] · x[4i + j]` (`x` the `4N` activation codes at `xq`),
    /// exact when `N · 2 · c · 127 < 2¹⁵` for the largest code `c` (AVX2 adds the `N`
    /// `vpmaddubsw` results in i16 before one `vpmaddwd`): `N` up to 8 for 4-bit codes, 2 for
    /// 6-bit ones. By default [`Mac::mac1`] in two chains.
    #[inline(always)]
    unsafe fn dot_n<const N: usize>(u: &[__m256i; N], xq: *const i8) -> __m256i {
        let mut s = [_mm256_setzero_si256(); 2];
        for i in 0..N {
            s[i % 2] = Self::mac1(s[i % 2], u[i], xq.add(4 * i));
        }
        _mm256_add_epi32(s[0], s[1])
    }
}

/// The activation dword `i` of `xq` in every lane.
#[inline(always)]
unsafe fn bcast(xq: *const i8, i: usize) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(xq.add(4 * i) as *const i32))
}

/// `vpmaddubsw` then `vpmaddwd` by ones (Q8_0: weight magnitudes, activations given the
/// weights' signs by `vpsignb`).
pub(super) struct Avx2Mac;

impl Mac for Avx2Mac {
    const Q8_OFFSET: i32 = 0;

    #[inline(always)]
    unsafe fn prep(signed: bool, raw: [__m256i; 8]) -> [__m256i; 8] {
        if signed {
            let mut u = raw;
            for v in &mut u {
                *v = _mm256_abs_epi8(*v);
            }
            u
        } else {
            raw
        }
    }

    #[inline(always)]
    unsafe fn fifth_bits(bits: u32) -> __m256i {
        _mm256_and_si256(bytes_from_bits(bits), _mm256_set1_epi8(0x10))
    }

    #[inline(always)]
    unsafe fn mac1(acc: __m256i, u: __m256i, xq: *const i8) -> __m256i {
        // A `vpmaddubsw` pair is at most 2 · 63 · 127 < 2¹⁵: no saturation.
        let p = _mm256_maddubs_epi16(u, bcast(xq, 0));
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
    }

    #[inline(always)]
    unsafe fn dot1(u: __m256i, x: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1))
    }

    #[inline(always)]
    unsafe fn dot_n<const N: usize>(u: &[__m256i; N], xq: *const i8) -> __m256i {
        // Two i16 chains, one widening: N + (N - 1) + 1 instructions instead of 3N.
        let mut h = [_mm256_setzero_si256(); 2];
        for i in 0..N {
            let p = _mm256_maddubs_epi16(u[i], bcast(xq, i));
            h[i % 2] = if i < 2 {
                p
            } else {
                _mm256_add_epi16(h[i % 2], p)
            };
        }
        let h = if N > 1 {
            _mm256_add_epi16(h[0], h[1])
        } else {
            h[0]
        };
        _mm256_madd_epi16(h, _mm256_set1_epi16(1))
    }

    #[inline(always)]
    unsafe fn dot8(u: &[__m256i; 8], raw: &[__m256i; 8], signed: bool, xq: *const i8) -> __m256i {
        let ones = _mm256_set1_epi16(1);
        if signed {
            let mut s = [_mm256_setzero_si256(); 2];
            for i in 0..8 {
                let x = _mm256_sign_epi8(bcast(xq, i), raw[i]);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u[i], x), ones);
                s[i % 2] = _mm256_add_epi32(s[i % 2], p);
            }
            _mm256_add_epi32(s[0], s[1])
        } else {
            let mut h = [_mm256_setzero_si256(); 2];
            for i in 0..8 {
                let p = _mm256_maddubs_epi16(u[i], bcast(xq, i));
                h[i / 4] = _mm256_add_epi16(h[i / 4], p);
            }
            _mm256_add_epi32(_mm256_madd_epi16(h[0], ones), _mm256_madd_epi16(h[1], ones))
        }
    }
}

/// `vpdpbusd` (AVX-512 VNNI, 256-bit form); Q8_0's signed bytes biased by 128 to unsigned.
pub(super) struct VnniMac;

impl Mac for VnniMac {
    const Q8_OFFSET: i32 = 128;

    #[inline(always)]
    unsafe fn prep(signed: bool, raw: [__m256i; 8]) -> [__m256i; 8] {
        if signed {
            let mut u = raw;
            for v in &mut u {
                *v = _mm256_xor_si256(*v, _mm256_set1_epi8(-128));
            }
            u
        } else {
            raw
        }
    }

    #[inline(always)]
    unsafe fn fifth_bits(bits: u32) -> __m256i {
        // AVX-512BW/VL: the mask selects bytes directly.
        _mm256_maskz_mov_epi8(bits, _mm256_set1_epi8(0x10))
    }

    #[inline(always)]
    unsafe fn mac1(acc: __m256i, u: __m256i, xq: *const i8) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, bcast(xq, 0))
    }

    #[inline(always)]
    unsafe fn dot1(u: __m256i, x: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x)
    }

    #[inline(always)]
    unsafe fn dot8(u: &[__m256i; 8], _: &[__m256i; 8], _: bool, xq: *const i8) -> __m256i {
        let mut s = [_mm256_setzero_si256(); 2];
        for i in 0..8 {
            s[i % 2] = _mm256_dpbusd_epi32(s[i % 2], u[i], bcast(xq, i));
        }
        _mm256_add_epi32(s[0], s[1])
    }
}
