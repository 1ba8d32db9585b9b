//! Row decoders: encoded GGUF rows to f32, per format and SIMD path.
//!
//! Q5_0/Q5_1 and the k-quants (Q4_K, Q5_K, Q6_K) follow `gguf::kquant`'s layouts; their AVX2
//! decoders widen eight bytes at a time to 32-bit lanes, take nibbles and high bits with shifts
//! and masks, and repeat the reference's float operations in its order.
//!
//! Block layouts as in `gguf::quant` (ggml's `ggml-common.h`): Q8_0 is an f16
//! `d` and 32 i8; Q4_0 an f16 `d` and 16 bytes; Q4_1 an f16 `d`, an f16 `m` and
//! 16 bytes, byte `j` holding element `j` (low nibble) and `j + 16` (high
//! nibble).

use gguf::GgmlType;

use super::simd_path::SimdPath;

/// Decodes whole rows: `bytes` holds `out.len() / block_size` encoded blocks.
///
/// Callers guarantee the lengths match (checked by [`super::QMatrix`]).
pub(super) fn decode(path: SimdPath, format: GgmlType, bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if path == SimdPath::Avx512 && super::blocks512::supports(format) {
        // SAFETY: `Avx512` is only constructed by `SimdPath::available`,
        // after detecting AVX-512F, AVX2, FMA and F16C; the caller checked the lengths.
        unsafe { super::blocks512::decode(format, bytes, out) };
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
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                // Q5_0: d | qh | qs, values q - 16; Q5_1: d | m | qh | qs, values q (plus m).
                let q5_1 = format == GgmlType::Q5_1;
                let (bpb, qh_at, offset) = if q5_1 { (24, 4, 0) } else { (22, 2, 16) };
                for b in 0..n / 32 {
                    let p = src.add(b * bpb);
                    let m = q5_1.then(|| f16_at(p.add(2)));
                    let qh = read_u32(p.add(qh_at));
                    q5_block(p.add(qh_at + 4), qh, offset, f16_at(p), m, dst.add(b * 32));
                }
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let five = format == GgmlType::Q5_K;
                let bpb = if five { 176 } else { 144 };
                for b in 0..n / 256 {
                    let p = src.add(b * bpb);
                    let d = f16_at(p);
                    let dmin = f16_at(p.add(2));
                    let scales = std::slice::from_raw_parts(p.add(4), 12);
                    let (qh, qs) = if five {
                        (p.add(16), p.add(48))
                    } else {
                        (std::ptr::null(), p.add(16))
                    };
                    for c in 0..4 {
                        for half in 0..2 {
                            let (sc, m) = gguf::kquant::scale_min_k4(2 * c + half, scales);
                            let scale = _mm256_set1_ps(d * sc as f32);
                            let min = _mm256_set1_ps(dmin * m as f32);
                            for g in 0..4 {
                                let l = 8 * g;
                                let mut q = widen8(qs.add(32 * c + l));
                                q = _mm256_and_si256(
                                    _mm256_srlv_epi32(q, _mm256_set1_epi32(4 * half as i32)),
                                    _mm256_set1_epi32(0x0F),
                                );
                                if five {
                                    let h = _mm256_srlv_epi32(
                                        widen8(qh.add(l)),
                                        _mm256_set1_epi32((2 * c + half) as i32),
                                    );
                                    let h = _mm256_and_si256(h, _mm256_set1_epi32(1));
                                    q = _mm256_or_si256(q, _mm256_slli_epi32(h, 4));
                                }
                                // (d * scale) * q - dmin * min, rounded as the reference.
                                let y =
                                    _mm256_sub_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(q)), min);
                                _mm256_storeu_ps(dst.add(b * 256 + 64 * c + 32 * half + l), y);
                            }
                        }
                    }
                }
            }
            GgmlType::Q6_K => {
                for b in 0..n / 256 {
                    let p = src.add(b * 210);
                    let d = f16_at(p.add(208));
                    for half in 0..2 {
                        let ql = p.add(64 * half);
                        let qh = p.add(128 + 32 * half);
                        let sc = p.add(192 + 8 * half) as *const i8;
                        let y = dst.add(b * 256 + 128 * half);
                        for g in 0..4 {
                            let l = 8 * g;
                            let is = l / 16;
                            let lo = widen8(ql.add(l));
                            let lo32 = widen8(ql.add(l + 32));
                            let h = widen8(qh.add(l));
                            let nib = _mm256_set1_epi32(0x0F);
                            let two = _mm256_set1_epi32(3);
                            let parts = [
                                (_mm256_and_si256(lo, nib), 0, 0),
                                (_mm256_and_si256(lo32, nib), 2, 2),
                                (_mm256_srli_epi32(lo, 4), 4, 4),
                                (_mm256_srli_epi32(lo32, 4), 6, 6),
                            ];
                            for (k, (low, shift, sc_off)) in parts.into_iter().enumerate() {
                                let high = _mm256_and_si256(
                                    _mm256_srlv_epi32(h, _mm256_set1_epi32(shift)),
                                    two,
                                );
                                let q = _mm256_sub_epi32(
                                    _mm256_or_si256(low, _mm256_slli_epi32(high, 4)),
                                    _mm256_set1_epi32(32),
                                );
                                let scale = _mm256_set1_ps(d * *sc.add(is + sc_off) as f32);
                                let v = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(q));
                                _mm256_storeu_ps(y.add(32 * k + l), v);
                            }
                        }
                    }
                }
            }
            _ => gguf::dequantize(format, bytes, n, out).expect("validated sizes"),
        }
    }

    /// Eight bytes at `p` widened to eight u32 lanes.
    #[inline(always)]
    unsafe fn widen8(p: *const u8) -> __m256i {
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
    }

    /// The little-endian u32 at `p`.
    #[inline(always)]
    unsafe fn read_u32(p: *const u8) -> u32 {
        (p as *const u32).read_unaligned()
    }

    /// One 32-value Q5_0 / Q5_1 block from its 16 nibble bytes `qs` and fifth bits `qh`: value `j`
    /// is `(nibble | bit << 4) - offset`, times `d`, plus `m` for Q5_1 (the reference's
    /// `q * d + m`, two roundings).
    #[inline(always)]
    unsafe fn q5_block(qs: *const u8, qh: u32, offset: i32, d: f32, m: Option<f32>, out: *mut f32) {
        let bits = _mm256_set1_epi32(qh as i32);
        let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let d = _mm256_set1_ps(d);
        for g in 0..4 {
            // Values 8g..8g+8: nibbles of bytes (8g % 16).., low half first, high half second.
            let byte0 = (8 * g) % 16;
            let q = widen8(qs.add(byte0));
            let q = if g < 2 {
                _mm256_and_si256(q, _mm256_set1_epi32(0x0F))
            } else {
                _mm256_srli_epi32(q, 4)
            };
            let pos = _mm256_add_epi32(iota, _mm256_set1_epi32(8 * g as i32));
            let h = _mm256_and_si256(_mm256_srlv_epi32(bits, pos), _mm256_set1_epi32(1));
            let q = _mm256_sub_epi32(
                _mm256_or_si256(q, _mm256_slli_epi32(h, 4)),
                _mm256_set1_epi32(offset),
            );
            let mut v = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
            if let Some(m) = m {
                v = _mm256_add_ps(v, _mm256_set1_ps(m));
            }
            _mm256_storeu_ps(out.add(8 * g), v);
        }
    }
}
