//! Row decoders: encoded GGUF rows to f32, per format and SIMD path.
//!
//! Block layouts as in `gguf::quant` (ggml's `ggml-common.h`): Q8_0 is an f16
//! `d` and 32 i8; Q4_0 an f16 `d` and 16 bytes; Q4_1 an f16 `d`, an f16 `m` and
//! 16 bytes, byte `j` holding element `j` (low nibble) and `j + 16` (high
//! nibble).

use gguf::GgmlType;

use super::SimdPath;

/// Decodes whole rows: `bytes` holds `out.len() / block_size` encoded blocks.
///
/// Callers guarantee the lengths match (checked by [`super::QMatrix`]).
pub(super) fn decode(path: SimdPath, format: GgmlType, bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if path == SimdPath::Avx512 && matches!(format, GgmlType::Q4_1 | GgmlType::Q8_0) {
        // SAFETY: `Avx512` is only constructed by `SimdPath::available`,
        // after detecting AVX-512F, AVX2, FMA and F16C.
        unsafe { avx512::decode(format, bytes, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if path != SimdPath::Portable {
        // SAFETY: non-portable paths are only constructed by
        // `SimdPath::available`, after detecting AVX2, FMA and F16C.
        unsafe { avx2::decode(format, bytes, out) };
        return;
    }
    let _ = path;
    gguf::dequantize(format, bytes, out.len(), out).expect("QMatrix validated the sizes");
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use gguf::GgmlType;

    /// The f16 at `p` as f32 (exact).
    #[inline(always)]
    unsafe fn f16_at(p: *const u8) -> f32 {
        let bits = u16::from_le_bytes([*p, *p.add(1)]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    /// Eight u8/i8 values widened to f32.
    #[inline(always)]
    unsafe fn u8x8(v: __m128i) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
    }

    /// AVX2 decoder; bitwise equal to `gguf::dequantize`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `bytes` must hold exactly the
    /// encoding of `out.len()` elements of `format`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn decode(format: GgmlType, bytes: &[u8], out: &mut [f32]) {
        let n = out.len();
        let src = bytes.as_ptr();
        let dst = out.as_mut_ptr();
        let mask = _mm_set1_epi8(0x0F);
        match format {
            GgmlType::Q4_1 => {
                for b in 0..n / 32 {
                    let p = src.add(b * 20);
                    let d = _mm256_set1_ps(f16_at(p));
                    let m = _mm256_set1_ps(f16_at(p.add(2)));
                    let q = _mm_loadu_si128(p.add(4) as *const __m128i);
                    let lo = _mm_and_si128(q, mask);
                    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
                    let o = dst.add(b * 32);
                    // q * d is exact, so fma(q, d, m) == q * d + m.
                    _mm256_storeu_ps(o, _mm256_fmadd_ps(u8x8(lo), d, m));
                    _mm256_storeu_ps(o.add(8), _mm256_fmadd_ps(u8x8(_mm_srli_si128(lo, 8)), d, m));
                    _mm256_storeu_ps(o.add(16), _mm256_fmadd_ps(u8x8(hi), d, m));
                    _mm256_storeu_ps(
                        o.add(24),
                        _mm256_fmadd_ps(u8x8(_mm_srli_si128(hi, 8)), d, m),
                    );
                }
            }
            GgmlType::Q4_0 => {
                let eight = _mm256_set1_epi32(8);
                let f = |v: __m128i| {
                    _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(v), eight))
                };
                for b in 0..n / 32 {
                    let p = src.add(b * 18);
                    let d = _mm256_set1_ps(f16_at(p));
                    let q = _mm_loadu_si128(p.add(2) as *const __m128i);
                    let lo = _mm_and_si128(q, mask);
                    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
                    let o = dst.add(b * 32);
                    _mm256_storeu_ps(o, _mm256_mul_ps(f(lo), d));
                    _mm256_storeu_ps(o.add(8), _mm256_mul_ps(f(_mm_srli_si128(lo, 8)), d));
                    _mm256_storeu_ps(o.add(16), _mm256_mul_ps(f(hi), d));
                    _mm256_storeu_ps(o.add(24), _mm256_mul_ps(f(_mm_srli_si128(hi, 8)), d));
                }
            }
            GgmlType::Q8_0 => {
                for b in 0..n / 32 {
                    let p = src.add(b * 34);
                    let d = _mm256_set1_ps(f16_at(p));
                    let o = dst.add(b * 32);
                    for j in 0..4 {
                        let q = _mm_loadl_epi64(p.add(2 + 8 * j) as *const __m128i);
                        let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                        _mm256_storeu_ps(o.add(8 * j), _mm256_mul_ps(v, d));
                    }
                }
            }
            GgmlType::F16 => {
                let body = n - n % 8;
                for i in (0..body).step_by(8) {
                    let h = _mm_loadu_si128(src.add(2 * i) as *const __m128i);
                    _mm256_storeu_ps(dst.add(i), _mm256_cvtph_ps(h));
                }
                for i in body..n {
                    *dst.add(i) = f16_at(src.add(2 * i));
                }
            }
            GgmlType::BF16 => {
                let body = n - n % 8;
                for i in (0..body).step_by(8) {
                    let h = _mm_loadu_si128(src.add(2 * i) as *const __m128i);
                    let w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
                    _mm256_storeu_ps(dst.add(i), _mm256_castsi256_ps(w));
                }
                gguf::dequantize(format, &bytes[2 * body..], n - body, &mut out[body..])
                    .expect("validated sizes");
            }
            _ => gguf::dequantize(format, bytes, n, out).expect("validated sizes"),
        }
    }
}

/// AVX-512 decoders for the two formats of SmolLM2's matrices (Q4_1 layers,
/// Q8_0 embedding/LM head), the scratch path's share of a batched step.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use gguf::GgmlType;

    /// AVX-512 decoder for Q4_1 and Q8_0; bitwise equal to `gguf::dequantize`.
    /// Q4_1 goes through the 16-entry table `fma(i, d, m)` (== `i * d + m`,
    /// the product being exact) indexed per nibble with `vpermps`; Q8_0 is
    /// `q * d` (exact).
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2, FMA and F16C; `format` is Q4_1 or
    /// Q8_0 and `bytes` holds exactly the encoding of `out.len()` elements.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn decode(format: GgmlType, bytes: &[u8], out: &mut [f32]) {
        let n = out.len();
        let src = bytes.as_ptr();
        let dst = out.as_mut_ptr();
        match format {
            GgmlType::Q4_1 => {
                let iota = _mm512_setr_ps(
                    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                    15.0,
                );
                for b in 0..n / 32 {
                    let p = src.add(b * 20);
                    let dm = _mm512_cvtph_ps(_mm256_set1_epi32((p as *const i32).read_unaligned()));
                    let table =
                        _mm512_fmadd_ps(iota, _mm512_moveldup_ps(dm), _mm512_movehdup_ps(dm));
                    let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(4) as *const __m128i));
                    let o = dst.add(b * 32);
                    _mm512_storeu_ps(o, _mm512_permutexvar_ps(q, table));
                    _mm512_storeu_ps(
                        o.add(16),
                        _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table),
                    );
                }
            }
            GgmlType::Q8_0 => {
                for b in 0..n / 32 {
                    let p = src.add(b * 34);
                    let d = _mm512_cvtph_ps(_mm256_set1_epi16((p as *const i16).read_unaligned()));
                    let o = dst.add(b * 32);
                    for j in 0..2 {
                        let q = _mm_loadu_si128(p.add(2 + 16 * j) as *const __m128i);
                        let v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
                        _mm512_storeu_ps(o.add(16 * j), _mm512_mul_ps(v, d));
                    }
                }
            }
            _ => unreachable!("avx512::decode handles Q4_1 and Q8_0 only"),
        }
    }
}
