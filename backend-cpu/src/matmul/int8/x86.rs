//! AVX2 (`vpmaddubsw` + `vpmaddwd`) and AVX-512 VNNI (`vpdpbusd` on 256-bit vectors) kernels of
//! the fast path: one weight row against `T` quantized activation rows, bitwise equal to
//! [`super::reference`].
//!
//! Blocks of 32: a group of 8 blocks is decoded once into 8 vectors of 32 unsigned codes
//! (Q8_0: their magnitudes, the activations taking the weights' signs, `vpsignb`), then for each
//! token the 8 products are multiplied into 8 vectors of i32 partial sums, reduced by a transposed
//! `vphaddd` tree into one vector of the 8 exact block sums, and the 8 block terms are computed
//! lane-wise with the reference's f32 operations (block `8g + l` in lane `l`); a row's last,
//! partial group runs the same code with masked loads, and the 8 lanes are reduced in registers
//! in [`super::reference::reduce8`]'s order. Super-blocks of
//! 256: 8 vectors of codes, each with its sub-block scales as i16 (`vpmaddwd` applies them), one
//! horizontal sum per token, the term in scalar code. The VNNI path uses `vpdpbusd` for the
//! 32-blocks and the AVX2 sequence for the k-quants, whose `vpmaddwd` applies the scales at no
//! extra cost. No product saturates: codes are at most 128 (Q8_0 magnitudes) and activations at
//! most 127 in magnitude, so a `vpmaddubsw` pair is at most 2 · 128 · 127 = 32 512 < 2¹⁵.

use std::arch::x86_64::*;

use super::acts::QRow;
use super::reference::{term_k, Fmt32, FmtK, KMeta};

/// Unsigned-by-signed byte products summed into 8 i32 lanes (exact; which lane holds which
/// partial differs between implementations, the total does not).
trait Mac {
    /// Lane partial sums of `u[i] * x[i]` (`u` unsigned, `x` signed bytes).
    unsafe fn dot(u: __m256i, x: __m256i) -> __m256i;
}

/// `vpmaddubsw` then `vpmaddwd` by ones.
struct Avx2Mac;

impl Mac for Avx2Mac {
    #[inline(always)]
    unsafe fn dot(u: __m256i, x: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1))
    }
}

/// `vpdpbusd` (AVX-512 VNNI, 256-bit form).
struct VnniMac;

impl Mac for VnniMac {
    #[inline(always)]
    unsafe fn dot(u: __m256i, x: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x)
    }
}

/// 32 bytes, `0xFF` where bit `i` of `bits` is set (ggml's `bytes_from_bits_32`).
#[inline(always)]
unsafe fn bytes_from_bits(bits: u32) -> __m256i {
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
unsafe fn codes32(f: Fmt32, p: *const u8) -> __m256i {
    match f {
        Fmt32::Q8_0 => _mm256_loadu_si256(p.add(2) as *const __m256i),
        Fmt32::Q4_0 => nibbles(p.add(2)),
        Fmt32::Q4_1 => nibbles(p.add(4)),
        Fmt32::Q5_0 => _mm256_or_si256(nibbles(p.add(6)), fifth_bits(p.add(2))),
        Fmt32::Q5_1 => _mm256_or_si256(nibbles(p.add(8)), fifth_bits(p.add(4))),
    }
}

/// Lane partial sums of block `j`'s codes (`u`, signs `raw` for Q8_0) times the activation codes
/// at `xq + 32 j`.
#[inline(always)]
unsafe fn block_dot<M: Mac>(
    u: &[__m256i; 8],
    raw: &[__m256i; 8],
    signed: bool,
    xq: *const i8,
    j: usize,
) -> __m256i {
    let xv = _mm256_loadu_si256(xq.add(32 * j) as *const __m256i);
    let xv = if signed {
        _mm256_sign_epi8(xv, raw[j])
    } else {
        xv
    };
    M::dot(u[j], xv)
}

/// Sum of the 8 i32 lanes (exact).
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// The i32 lanes `0..count` of `p` (`count` ≤ 8), zeros above: a full load for `count == 8`,
/// else a masked one that reads nothing past lane `count`.
#[inline(always)]
unsafe fn load8_i32(p: *const i32, count: usize) -> __m256i {
    if count == 8 {
        _mm256_loadu_si256(p as *const __m256i)
    } else {
        _mm256_maskload_epi32(p, lane_mask(count))
    }
}

/// [`load8_i32`] for f32 lanes.
#[inline(always)]
unsafe fn load8_f32(p: *const f32, count: usize) -> __m256 {
    if count == 8 {
        _mm256_loadu_ps(p)
    } else {
        _mm256_maskload_ps(p, lane_mask(count))
    }
}

/// All ones in the i32 lanes below `count`.
#[inline(always)]
unsafe fn lane_mask(count: usize) -> __m256i {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(count as i32), idx)
}

/// [`super::reference::reduce8`] of the 8 lanes of `v`, the same additions in the same order.
#[inline(always)]
unsafe fn reduce8_ps(v: __m256) -> f32 {
    // [a0+a4, a1+a5, a2+a6, a3+a7]
    let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    // [(a0+a4)+(a2+a6), (a1+a5)+(a3+a7), ..]
    let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)))
}

/// One group of `count` (1..=8) blocks of a 32-block format `f` from `p0`, its first block `8 g`
/// of the row, against `T` activation rows, each block's term added to lane `b % 8` of `acc[t]`.
/// The missing blocks of a partial group read nothing and add `+0.0` to their lanes, which
/// changes no lane: a lane starts at `+0.0` and a sum with a `+0.0` start is never `-0.0`.
#[inline(always)]
unsafe fn group32<M: Mac, const T: usize>(
    f: Fmt32,
    p0: *const u8,
    xs: &[QRow<'_>; T],
    g: usize,
    count: usize,
    acc: &mut [__m256; T],
) {
    let bytes = f.bytes();
    let signed = f == Fmt32::Q8_0;
    let mut u = [_mm256_setzero_si256(); 8];
    let mut raw = [_mm256_setzero_si256(); 8];
    let (mut dh, mut mh) = ([0u16; 8], [0u16; 8]);
    for j in 0..count {
        let p = p0.add(j * bytes);
        dh[j] = std::ptr::read_unaligned(p as *const u16);
        if f.has_min() {
            mh[j] = std::ptr::read_unaligned(p.add(2) as *const u16);
        }
        raw[j] = codes32(f, p);
        u[j] = if signed {
            _mm256_abs_epi8(raw[j])
        } else {
            raw[j]
        };
    }
    let dw = _mm256_cvtph_ps(_mm_loadu_si128(dh.as_ptr() as *const __m128i));
    let mw = _mm256_cvtph_ps(_mm_loadu_si128(mh.as_ptr() as *const __m128i));
    for t in 0..T {
        let xq = xs[t].qs.as_ptr().add(256 * g);
        let mut d = [_mm256_setzero_si256(); 8];
        for (j, d) in d.iter_mut().enumerate().take(count) {
            *d = block_dot::<M>(&u, &raw, signed, xq, j);
        }
        let h01 = _mm256_hadd_epi32(d[0], d[1]);
        let h23 = _mm256_hadd_epi32(d[2], d[3]);
        let h45 = _mm256_hadd_epi32(d[4], d[5]);
        let h67 = _mm256_hadd_epi32(d[6], d[7]);
        let (h0123, h4567) = (_mm256_hadd_epi32(h01, h23), _mm256_hadd_epi32(h45, h67));
        let mut s = _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(h0123, h4567),
            _mm256_permute2x128_si256::<0x31>(h0123, h4567),
        );
        if f.offset() != 0 {
            let sums = load8_i32(xs[t].sums.as_ptr().add(8 * g), count);
            let off = _mm256_mullo_epi32(sums, _mm256_set1_epi32(f.offset()));
            s = _mm256_sub_epi32(s, off);
        }
        let dx = load8_f32(xs[t].d.as_ptr().add(8 * g), count);
        let mut term = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(s));
        if f.has_min() {
            let dsum = load8_f32(xs[t].dsums.as_ptr().add(8 * g), count);
            term = _mm256_add_ps(term, _mm256_mul_ps(mw, dsum));
        }
        acc[t] = _mm256_add_ps(acc[t], term);
    }
}

/// One weight row of a 32-block format `f` (`nb` blocks) against `T` activation rows: whole
/// groups of 8 blocks, then the partial group in the same vector code, then [`reduce8_ps`].
#[inline(always)]
unsafe fn rows32<M: Mac, const T: usize>(
    f: Fmt32,
    row: &[u8],
    xs: [QRow<'_>; T],
    nb: usize,
) -> [f32; T] {
    let groups = nb / 8;
    let mut acc = [_mm256_setzero_ps(); T];
    for g in 0..groups {
        group32::<M, T>(f, row.as_ptr().add(8 * g * f.bytes()), &xs, g, 8, &mut acc);
    }
    if !nb.is_multiple_of(8) {
        let p0 = row.as_ptr().add(8 * groups * f.bytes());
        group32::<M, T>(f, p0, &xs, groups, nb % 8, &mut acc);
    }
    let mut out = [0.0f32; T];
    for t in 0..T {
        out[t] = reduce8_ps(acc[t]);
    }
    out
}

/// `0x10` in each byte of `qh` whose bit `bit` is set.
#[inline(always)]
unsafe fn bit_as_fifth(qh: __m256i, bit: usize) -> __m256i {
    let b = _mm256_set1_epi8((1u8 << bit) as i8);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, b), b);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Bits `2i..2i + 2` of each byte of `qh` as bits 4-5 (Q6_K's high bits of code vector `i`).
#[inline(always)]
unsafe fn q6_high(qh: __m256i, i: usize, m3: __m256i) -> __m256i {
    let v = match i {
        0 => qh,
        1 => _mm256_srli_epi16(qh, 2),
        2 => _mm256_srli_epi16(qh, 4),
        _ => _mm256_srli_epi16(qh, 6),
    };
    _mm256_slli_epi16(_mm256_and_si256(v, m3), 4)
}

/// One weight row of a k-quant format `f` (`nsb` super-blocks) against `T` activation rows.
#[inline(always)]
unsafe fn rows_k<const T: usize>(f: FmtK, row: &[u8], xs: [QRow<'_>; T], nsb: usize) -> [f32; T] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(3);
    let mut acc = [0.0f32; T];
    let mut codes = [_mm256_setzero_si256(); 8];
    let mut scales = [_mm256_setzero_si256(); 8];
    for sb in 0..nsb {
        let block = &row[sb * f.bytes()..(sb + 1) * f.bytes()];
        let p = block.as_ptr();
        let m = KMeta::read(f, block);
        match f {
            FmtK::Q4K | FmtK::Q5K => {
                let qs = p.add(if f == FmtK::Q5K { 48 } else { 16 });
                let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
                for c in 0..4 {
                    let q = _mm256_loadu_si256(qs.add(32 * c) as *const __m256i);
                    let mut lo = _mm256_and_si256(q, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    if f == FmtK::Q5K {
                        lo = _mm256_or_si256(lo, bit_as_fifth(qh, 2 * c));
                        hi = _mm256_or_si256(hi, bit_as_fifth(qh, 2 * c + 1));
                    }
                    codes[2 * c] = lo;
                    codes[2 * c + 1] = hi;
                    scales[2 * c] = _mm256_set1_epi16(m.scales[2 * c] as i16);
                    scales[2 * c + 1] = _mm256_set1_epi16(m.scales[2 * c + 1] as i16);
                }
            }
            FmtK::Q6K => {
                for h in 0..2 {
                    let ql0 = _mm256_loadu_si256(p.add(64 * h) as *const __m256i);
                    let ql1 = _mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i);
                    let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
                    let low = [
                        _mm256_and_si256(ql0, m4),
                        _mm256_and_si256(ql1, m4),
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    ];
                    for (i, lo) in low.into_iter().enumerate() {
                        codes[4 * h + i] = _mm256_or_si256(lo, q6_high(qh, i, m3));
                        let g = 8 * h + 2 * i;
                        scales[4 * h + i] = _mm256_set_m128i(
                            _mm_set1_epi16(m.scales[g + 1] as i16),
                            _mm_set1_epi16(m.scales[g] as i16),
                        );
                    }
                }
            }
        }
        for t in 0..T {
            let xq = xs[t].qs.as_ptr().add(256 * sb);
            let mut s = _mm256_setzero_si256();
            for i in 0..8 {
                let xv = _mm256_loadu_si256(xq.add(32 * i) as *const __m256i);
                let prod = _mm256_maddubs_epi16(codes[i], xv);
                s = _mm256_add_epi32(s, _mm256_madd_epi16(prod, scales[i]));
            }
            let corr = m.correction(f, &xs[t].bsums[16 * sb..16 * sb + 16]);
            acc[t] += term_k(f, &m, xs[t].d[sb], hsum_i32(s), corr);
        }
    }
    acc
}

/// Runs every row of `rows` (consecutive encoded rows of `k` values) through [`rows32`] with
/// `$mac` or [`rows_k`], the format a constant in each arm, into `out` (one entry per row).
macro_rules! dispatch {
    ($mac:ty, $f32:expr, $fk:expr, $rows:expr, $xs:expr, $k:expr, $out:expr) => {{
        let rb = $rows.len() / $out.len();
        let xs = $xs;
        macro_rules! each {
            ($call:expr) => {
                for (r, o) in $out.iter_mut().enumerate() {
                    let row = &$rows[r * rb..(r + 1) * rb];
                    *o = $call(row);
                }
            };
        }
        match ($f32, $fk) {
            (Some(Fmt32::Q8_0), _) => each!(|row| rows32::<$mac, T>(Fmt32::Q8_0, row, xs, $k / 32)),
            (Some(Fmt32::Q4_0), _) => each!(|row| rows32::<$mac, T>(Fmt32::Q4_0, row, xs, $k / 32)),
            (Some(Fmt32::Q4_1), _) => each!(|row| rows32::<$mac, T>(Fmt32::Q4_1, row, xs, $k / 32)),
            (Some(Fmt32::Q5_0), _) => each!(|row| rows32::<$mac, T>(Fmt32::Q5_0, row, xs, $k / 32)),
            (Some(Fmt32::Q5_1), _) => each!(|row| rows32::<$mac, T>(Fmt32::Q5_1, row, xs, $k / 32)),
            (None, Some(FmtK::Q4K)) => each!(|row| rows_k::<T>(FmtK::Q4K, row, xs, $k / 256)),
            (None, Some(FmtK::Q5K)) => each!(|row| rows_k::<T>(FmtK::Q5K, row, xs, $k / 256)),
            (None, Some(FmtK::Q6K)) => each!(|row| rows_k::<T>(FmtK::Q6K, row, xs, $k / 256)),
            (None, None) => unreachable!("int8: format without an integer kernel"),
        }
    }};
}

/// `out[r][t] = Σ W_r·x_t` for the consecutive encoded rows `rows` (`out.len()` rows of `k`
/// values, AVX2 path); `f32`/`fk` name the format (one is `Some`).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `rows` holds `out.len()` rows of `k` values of the
/// format, each `xs[t]` the matching quantized activations of `k` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_avx2<const T: usize>(
    f32: Option<Fmt32>,
    fk: Option<FmtK>,
    rows: &[u8],
    xs: [QRow<'_>; T],
    k: usize,
    out: &mut [[f32; T]],
) {
    dispatch!(Avx2Mac, f32, fk, rows, xs, k, out)
}

/// [`rows_avx2`] on the VNNI path.
///
/// # Safety
/// As [`rows_avx2`], and the CPU must support AVX-512 VNNI, VL and BW.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn rows_vnni<const T: usize>(
    f32: Option<Fmt32>,
    fk: Option<FmtK>,
    rows: &[u8],
    xs: [QRow<'_>; T],
    k: usize,
    out: &mut [[f32; T]],
) {
    dispatch!(VnniMac, f32, fk, rows, xs, k, out)
}
