//! The 32 codes of a block of a 32-value format, decoded into one vector.

use std::arch::x86_64::*;

use super::super::reference::Fmt32;

/// 32 bytes, `0xFF` where bit `i` of `bits` is set (ggml's `bytes_from_bits_32`).
#[inline(always)]
pub(super) unsafe fn bytes_from_bits(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    let shuf = _mm256_setr_epi64x(
        0x0000_0000_0000_0000,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let v = _mm256_shuffle_epi8(v, shuf);
    let v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1))
}

/// The 32 codes of 16 bytes of nibbles at `qs`: low nibbles (elements 0..16), then high.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> __m256i {
    let q = _mm_loadu_si128(qs as *const __m128i);
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(q, m);
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    _mm256_set_m128i(hi, lo)
}

/// The fifth bits (`0x10` where set) of the 32 elements from the little-endian u32 at `qh`.
#[inline(always)]
unsafe fn fifth_bits(qh: *const u8) -> __m256i {
    let bits = u32::from_le_bytes(std::ptr::read_unaligned(qh as *const [u8; 4]));
    _mm256_and_si256(bytes_from_bits(bits), _mm256_set1_epi8(0x10))
}

/// The 32 codes of the block at `p` in element order: unsigned codes, or for Q8_0 the raw signed
/// bytes (made magnitudes by the caller). No closures in the kernels: a closure would be compiled
/// without the caller's target features, and its intrinsics would not be inlined.
#[inline(always)]
pub(super) unsafe fn codes32(f: Fmt32, p: *const u8) -> __m256i {
    match f {
        Fmt32::Q8_0 => _mm256_loadu_si256(p.add(2) as *const __m256i),
        Fmt32::Q4_0 => nibbles(p.add(2)),
        Fmt32::Q4_1 => nibbles(p.add(4)),
        Fmt32::Q5_0 => _mm256_or_si256(nibbles(p.add(6)), fifth_bits(p.add(2))),
        Fmt32::Q5_1 => _mm256_or_si256(nibbles(p.add(8)), fifth_bits(p.add(4))),
    }
}
