//! AVX-512 register decoders of the block formats: each format decodes 16 weights at a time
//! into one `__m512`, bitwise equal to the scalar reference [`gguf::dequantize`] (ggml's
//! `dequantize_row_*`), so the scratch decoder ([`decode`]) and the fused matmul kernels
//! (`matmul::fused`, which never store the weights) share one decoder per format.
//!
//! How each value is formed (layouts in `gguf::quant` and `gguf::kquant`):
//! - Nibble formats (Q4_0, Q4_1, Q4_K) index a 16-entry table per block or sub-block with
//!   `vpermps`, which reads only the low 4 bits of each index lane: `table[i] = (i - 8) * d`
//!   (Q4_0), `fma(i, d, m)` (Q4_1), `fma(i, d·scale, -(dmin·min))` (Q4_K). Each product is
//!   exact in f32 (at most 4 + 17 significant bits), so the one rounding of the FMA gives the
//!   reference's `q * d + m` / `(d * scale) * q - dmin * min` bit for bit.
//! - 5-bit formats (Q5_0, Q5_1, Q5_K) index a 32-entry table held in two registers with
//!   `vpermt2ps` (5-bit indices): the low nibble masked to 4 bits, the fifth bit set from `qh`
//!   with a lane mask.
//! - Q8_0 and Q6_K convert the integer to f32 and multiply by the (exact) scale: `q * d`,
//!   `(d * scale) * (q - 32)`, both exact products.
//!
//! Safety of every `unsafe fn` here: the CPU must support AVX-512F, AVX2, FMA and F16C (the
//! `SimdPath::Avx512` path), and `p` must point at a whole block of the format.

use std::arch::x86_64::*;

use gguf::GgmlType;

/// A block format decoded in AVX-512 registers, 16 weights at a time.
pub(crate) trait Block512 {
    /// Weights per block (32, or 256 for the k-quant super-blocks).
    const WEIGHTS: usize;
    /// Bytes per block.
    const BYTES: usize;
    /// What a block's chunks share (scales, tables, loaded bytes), computed once per block.
    type State: Copy;
    /// The shared values of the block at `p`.
    ///
    /// # Safety
    /// See the module docs.
    unsafe fn state(p: *const u8) -> Self::State;
    /// Weights `16 c .. 16 c + 16` of the block at `p` (`c < WEIGHTS / 16`).
    ///
    /// # Safety
    /// See the module docs; `s` is `state(p)`.
    unsafe fn chunk(s: &Self::State, p: *const u8, c: usize) -> __m512;
}

/// `[0, 1, ..., 15]` as f32.
#[inline(always)]
unsafe fn iota() -> __m512 {
    _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    )
}

/// The f16 at `p` as f32 (exact).
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    half::f16::from_bits((p as *const u16).read_unaligned()).to_f32()
}

/// 16 bytes at `p` widened to 16 u32 lanes.
#[inline(always)]
unsafe fn bytes16(p: *const u8) -> __m512i {
    _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))
}

/// The little-endian u32 at `p`.
#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    (p as *const u32).read_unaligned()
}

/// Q8_0: f16 `d` | 32 i8; `x = q * d`.
pub(crate) struct Q8_0;
impl Block512 for Q8_0 {
    const WEIGHTS: usize = 32;
    const BYTES: usize = 34;
    type State = __m512;
    #[inline(always)]
    unsafe fn state(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_set1_epi16((p as *const i16).read_unaligned()))
    }
    #[inline(always)]
    unsafe fn chunk(d: &__m512, p: *const u8, c: usize) -> __m512 {
        let q = _mm_loadu_si128(p.add(2 + 16 * c) as *const __m128i);
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), *d)
    }
}

/// Q4_0: f16 `d` | 16 bytes (byte `j`: value `j` low nibble, `j + 16` high); `x = (q - 8) * d`.
pub(crate) struct Q4_0;
impl Block512 for Q4_0 {
    const WEIGHTS: usize = 32;
    const BYTES: usize = 18;
    /// (table, nibble bytes).
    type State = (__m512, __m512i);
    #[inline(always)]
    unsafe fn state(p: *const u8) -> Self::State {
        let d = _mm512_set1_ps(f16_at(p));
        let table = _mm512_mul_ps(_mm512_sub_ps(iota(), _mm512_set1_ps(8.0)), d);
        (table, bytes16(p.add(2)))
    }
    #[inline(always)]
    unsafe fn chunk(s: &Self::State, _p: *const u8, c: usize) -> __m512 {
        let q = if c == 0 {
            s.1
        } else {
            _mm512_srli_epi32(s.1, 4)
        };
        _mm512_permutexvar_ps(q, s.0)
    }
}

/// Q4_1: f16 `d` | f16 `m` | 16 bytes; `x = q * d + m`.
pub(crate) struct Q4_1;
impl Block512 for Q4_1 {
    const WEIGHTS: usize = 32;
    const BYTES: usize = 20;
    type State = (__m512, __m512i);
    #[inline(always)]
    unsafe fn state(p: *const u8) -> Self::State {
        // [d, m, d, m, ...] from one 4-byte broadcast.
        let dm = _mm512_cvtph_ps(_mm256_set1_epi32((p as *const i32).read_unaligned()));
        let table = _mm512_fmadd_ps(iota(), _mm512_moveldup_ps(dm), _mm512_movehdup_ps(dm));
        (table, bytes16(p.add(4)))
    }
    #[inline(always)]
    unsafe fn chunk(s: &Self::State, _p: *const u8, c: usize) -> __m512 {
        let q = if c == 0 {
            s.1
        } else {
            _mm512_srli_epi32(s.1, 4)
        };
        _mm512_permutexvar_ps(q, s.0)
    }
}

/// The shared part of Q5_0 and Q5_1: the 32-entry table (values for q = 0..15, 16..31), the
/// nibble bytes and the fifth bits.
type Q5State = (__m512, __m512, __m512i, u32);

/// Value `16 c + l` of a Q5_0/Q5_1 block from its [`Q5State`]: the nibble of byte `l` (low for
/// `c = 0`, high for `c = 1`) with bit `16 c + l` of `qh` as its fifth bit.
#[inline(always)]
unsafe fn q5_chunk(s: &Q5State, c: usize) -> __m512 {
    let (lo, hi, q, qh) = *s;
    let nib = if c == 0 {
        _mm512_and_si512(q, _mm512_set1_epi32(0x0F))
    } else {
        _mm512_srli_epi32(q, 4)
    };
    _mm512_permutex2var_ps(lo, with_fifth_bit(nib, (qh >> (16 * c)) as u16), hi)
}

/// `nib | 16` in the lanes whose bit is set in `fifth`: 5-bit table indices.
#[inline(always)]
unsafe fn with_fifth_bit(nib: __m512i, fifth: __mmask16) -> __m512i {
    _mm512_mask_or_epi32(nib, fifth, nib, _mm512_set1_epi32(0x10))
}

/// Q5_0: f16 `d` | u32 `qh` | 16 bytes; `x = (q - 16) * d`.
pub(crate) struct Q5_0;
impl Block512 for Q5_0 {
    const WEIGHTS: usize = 32;
    const BYTES: usize = 22;
    type State = Q5State;
    #[inline(always)]
    unsafe fn state(p: *const u8) -> Q5State {
        let d = _mm512_set1_ps(f16_at(p));
        let lo = _mm512_mul_ps(_mm512_sub_ps(iota(), _mm512_set1_ps(16.0)), d);
        (
            lo,
            _mm512_mul_ps(iota(), d),
            bytes16(p.add(6)),
            u32_at(p.add(2)),
        )
    }
    #[inline(always)]
    unsafe fn chunk(s: &Q5State, _p: *const u8, c: usize) -> __m512 {
        q5_chunk(s, c)
    }
}

/// Q5_1: f16 `d` | f16 `m` | u32 `qh` | 16 bytes; `x = q * d + m`.
pub(crate) struct Q5_1;
impl Block512 for Q5_1 {
    const WEIGHTS: usize = 32;
    const BYTES: usize = 24;
    type State = Q5State;
    #[inline(always)]
    unsafe fn state(p: *const u8) -> Q5State {
        let (d, m) = (_mm512_set1_ps(f16_at(p)), _mm512_set1_ps(f16_at(p.add(2))));
        let lo = _mm512_fmadd_ps(iota(), d, m);
        let hi = _mm512_fmadd_ps(_mm512_add_ps(iota(), _mm512_set1_ps(16.0)), d, m);
        (lo, hi, bytes16(p.add(8)), u32_at(p.add(4)))
    }
    #[inline(always)]
    unsafe fn chunk(s: &Q5State, _p: *const u8, c: usize) -> __m512 {
        q5_chunk(s, c)
    }
}

/// The eight sub-block scales `d * scale` and offsets `dmin * min` of a Q4_K/Q5_K super-block
/// (`p` at its start: f16 `d`, f16 `dmin`, 12 packed scale bytes).
#[inline(always)]
unsafe fn k4_scales(p: *const u8) -> ([f32; 8], [f32; 8]) {
    let (d, dmin) = (f16_at(p), f16_at(p.add(2)));
    let packed = std::slice::from_raw_parts(p.add(4), 12);
    let mut scale = [0.0; 8];
    let mut min = [0.0; 8];
    for j in 0..8 {
        let (sc, m) = gguf::kquant::scale_min_k4(j, packed);
        scale[j] = d * sc as f32;
        min[j] = dmin * m as f32;
    }
    (scale, min)
}

/// The 16 nibbles (u32 lanes, 4 bits) of chunk `c` of a Q4_K/Q5_K super-block whose nibble
/// bytes start at `qs`: chunk `c` is half of sub-block `c / 2`, whose nibbles are the low (even
/// sub-block) or high (odd) halves of bytes `32 (c / 4) ..`.
#[inline(always)]
unsafe fn k_nibbles(qs: *const u8, c: usize) -> __m512i {
    let sub = c / 2;
    let q = bytes16(qs.add(32 * (sub / 2) + 16 * (c % 2)));
    if sub.is_multiple_of(2) {
        _mm512_and_si512(q, _mm512_set1_epi32(0x0F))
    } else {
        _mm512_srli_epi32(q, 4)
    }
}

/// `fma(i + offset, d·scale, -(dmin·min))` for `i = 0..16`: sub-block `sub`'s values of
/// `q = i + offset` (the reference's `(d * scale) * q - dmin * min`, the product exact).
#[inline(always)]
unsafe fn k_table(s: &([f32; 8], [f32; 8]), sub: usize, offset: f32) -> __m512 {
    let q = _mm512_add_ps(iota(), _mm512_set1_ps(offset));
    _mm512_fmadd_ps(q, _mm512_set1_ps(s.0[sub]), _mm512_set1_ps(-s.1[sub]))
}

/// Q4_K: f16 `d` | f16 `dmin` | 12 scale bytes | 128 bytes `qs`: 256 values in eight
/// sub-blocks of 32 (see [`k_nibbles`]).
pub(crate) struct Q4K;
impl Block512 for Q4K {
    const WEIGHTS: usize = 256;
    const BYTES: usize = 144;
    type State = ([f32; 8], [f32; 8]);
    #[inline(always)]
    unsafe fn state(p: *const u8) -> Self::State {
        k4_scales(p)
    }
    #[inline(always)]
    unsafe fn chunk(s: &Self::State, p: *const u8, c: usize) -> __m512 {
        _mm512_permutexvar_ps(k_nibbles(p.add(16), c), k_table(s, c / 2, 0.0))
    }
}

/// Q5_K: as Q4_K with 32 bytes `qh` before `qs`; value `l` of sub-block `s` takes bit `s` of
/// `qh[l]` as its fifth bit.
pub(crate) struct Q5K;
impl Block512 for Q5K {
    const WEIGHTS: usize = 256;
    const BYTES: usize = 176;
    type State = ([f32; 8], [f32; 8]);
    #[inline(always)]
    unsafe fn state(p: *const u8) -> Self::State {
        k4_scales(p)
    }
    #[inline(always)]
    unsafe fn chunk(s: &Self::State, p: *const u8, c: usize) -> __m512 {
        let sub = c / 2;
        let qh = bytes16(p.add(16 + 16 * (c % 2)));
        let fifth = _mm512_test_epi32_mask(qh, _mm512_set1_epi32(1 << sub));
        let idx = with_fifth_bit(k_nibbles(p.add(48), c), fifth);
        _mm512_permutex2var_ps(k_table(s, sub, 0.0), idx, k_table(s, sub, 16.0))
    }
}

/// Q6_K: 128 bytes `ql` | 64 bytes `qh` | 16 i8 scales | f16 `d`. Chunk `c` lies in half `c / 8`;
/// within it, group `g = (c % 8) / 2` takes low (`g < 2`) or high nibbles of `ql[32 (g % 2) + l]`
/// and bits `2 g, 2 g + 1` of `qh[l]`, for `l = 16 (c % 2) ..`; its scale is `scales[c]`.
pub(crate) struct Q6K;
impl Block512 for Q6K {
    const WEIGHTS: usize = 256;
    const BYTES: usize = 210;
    type State = f32;
    #[inline(always)]
    unsafe fn state(p: *const u8) -> f32 {
        f16_at(p.add(208))
    }
    #[inline(always)]
    unsafe fn chunk(d: &f32, p: *const u8, c: usize) -> __m512 {
        let (half, g, l0) = (c / 8, (c % 8) / 2, 16 * (c % 2));
        let ql = bytes16(p.add(64 * half + 32 * (g % 2) + l0));
        let nib = if g < 2 {
            _mm512_and_si512(ql, _mm512_set1_epi32(0x0F))
        } else {
            _mm512_srli_epi32(ql, 4)
        };
        let qh = bytes16(p.add(128 + 32 * half + l0));
        let high = _mm512_and_si512(
            _mm512_srlv_epi32(qh, _mm512_set1_epi32(2 * g as i32)),
            _mm512_set1_epi32(3),
        );
        let q = _mm512_sub_epi32(
            _mm512_or_si512(nib, _mm512_slli_epi32(high, 4)),
            _mm512_set1_epi32(32),
        );
        let scale = *d * (*p.add(192 + c) as i8) as f32;
        _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(scale))
    }
}

/// Whether `format` has a [`Block512`] decoder.
pub(crate) fn supports(format: GgmlType) -> bool {
    matches!(
        format,
        GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
    )
}

/// Decodes whole blocks of `F` from `bytes` into `out` (`out.len() / F::WEIGHTS` blocks).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C; `bytes` holds at least
/// `out.len() / F::WEIGHTS` blocks and `out.len()` is a multiple of `F::WEIGHTS`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn decode_blocks<F: Block512>(bytes: &[u8], out: &mut [f32]) {
    let (src, dst) = (bytes.as_ptr(), out.as_mut_ptr());
    for b in 0..out.len() / F::WEIGHTS {
        let p = src.add(F::BYTES * b);
        let s = F::state(p);
        for c in 0..F::WEIGHTS / 16 {
            _mm512_storeu_ps(dst.add(F::WEIGHTS * b + 16 * c), F::chunk(&s, p, c));
        }
    }
}

/// Decodes `out.len()` values of `format` (one [`supports`]) from `bytes`; bitwise equal to
/// `gguf::dequantize`.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C; `bytes` holds exactly the encoding of
/// `out.len()` values of `format`.
pub(crate) unsafe fn decode(format: GgmlType, bytes: &[u8], out: &mut [f32]) {
    match format {
        GgmlType::Q8_0 => decode_blocks::<Q8_0>(bytes, out),
        GgmlType::Q4_0 => decode_blocks::<Q4_0>(bytes, out),
        GgmlType::Q4_1 => decode_blocks::<Q4_1>(bytes, out),
        GgmlType::Q5_0 => decode_blocks::<Q5_0>(bytes, out),
        GgmlType::Q5_1 => decode_blocks::<Q5_1>(bytes, out),
        GgmlType::Q4_K => decode_blocks::<Q4K>(bytes, out),
        GgmlType::Q5_K => decode_blocks::<Q5K>(bytes, out),
        GgmlType::Q6_K => decode_blocks::<Q6K>(bytes, out),
        _ => unreachable!("blocks512::decode: {format} has no AVX-512 decoder"),
    }
}
