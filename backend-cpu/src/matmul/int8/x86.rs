//! AVX2 (`vpmaddubsw` + `vpmaddwd`) and AVX-512 VNNI (`vpdpbusd` on 256-bit vectors) kernels of
//! the fast path: one weight row against `T` quantized activation rows, bitwise equal to
//! [`super::reference`].
//!
//! Weights interleaved at load time ([`interleaved`], every format but Q5_K, every tile height):
//! the [`tile32`] arithmetic below on codes and scales loaded already transposed, and for Q4_K
//! and Q6_K a lane-wise super-block kernel. The row-major kernels that follow serve matrices
//! without the interleaved copy (and AVX2's Q8_0 tiles of 4+ tokens).
//!
//! Blocks of 32, tiles of 4 or more tokens ([`tile32`], prefill and batched decode): 8 weight
//! rows' block `b` is decoded once into 8 vectors of 32 codes and transposed (an 8 × 8 dword
//! transpose), so that vector `i` holds elements `4i..4i + 4` of each row, lane `r` = row `r`;
//! per token, 8 products with the activation dword `i` broadcast (`vpdpbusd`, or on AVX2
//! `vpmaddubsw` whose i16 pairs of 4 vectors add without overflow, then one `vpmaddwd`) give
//! the 8 rows' exact block sums in 8 lanes with no horizontal reduction, and the block term
//! (the reference's f32 operations, lane-wise) goes to accumulator `b % 8` of the token, the 8
//! reduced at the end in [`super::reference::reduce8`]'s order. Q8_0 weights are signed: the
//! VNNI path biases them by 128 (and subtracts `128 · Σq`, exact), the AVX2 path uses their
//! magnitudes and gives the broadcast activations their signs (`vpsignb`). Fewer than 4 tokens
//! ([`per_row`], single-stream decode): one row at a time, a `vphaddd` tree per group of 8
//! blocks, the same lanes and order. Super-blocks of
//! 256 row-major (Q5_K, the one k-quant without the interleaved copy): 8 vectors of codes, one
//! per group of 32 values; per token and group, `vpmaddwd` applies Q6_K's sub-block scales as
//! i16 (Q4_K/Q5_K's group is one sub-block, scaled in the term), one horizontal sum, the group's
//! term in scalar code (the AVX2 sequence on both paths). No product saturates: codes are at most 128
//! (Q8_0 magnitudes) and activations at most 127 in magnitude, so a `vpmaddubsw` pair is at most
//! 2 · 128 · 127 = 32 512 < 2¹⁵.

/// Which kernel a matrix of format `f` takes: the 32-block one ([`tile32`], [`rows32`]) or the
/// k-quant ones ([`rows_k`], and `tile_k` on interleaved rows). A constant at every call site
/// ([`with_kind!`]), so the matches on it fold away.
#[derive(Clone, Copy)]
enum Kind {
    B32(Fmt32),
    K(FmtK),
}

/// Runs `$body` with `$k` bound to the [`Kind`] of the [`GgmlType`] `$f`, a constant in each arm
/// (so the kernels are specialized per format); panics for a format without integer kernels.
macro_rules! with_kind {
    ($f:expr, $k:ident => $body:expr) => {
        match $f {
            GgmlType::Q4_0 => {
                let $k = Kind::B32(Fmt32::Q4_0);
                $body
            }
            GgmlType::Q4_1 => {
                let $k = Kind::B32(Fmt32::Q4_1);
                $body
            }
            GgmlType::Q5_0 => {
                let $k = Kind::B32(Fmt32::Q5_0);
                $body
            }
            GgmlType::Q5_1 => {
                let $k = Kind::B32(Fmt32::Q5_1);
                $body
            }
            GgmlType::Q8_0 => {
                let $k = Kind::B32(Fmt32::Q8_0);
                $body
            }
            GgmlType::Q4_K => {
                let $k = Kind::K(FmtK::Q4K);
                $body
            }
            GgmlType::Q5_K => {
                let $k = Kind::K(FmtK::Q5K);
                $body
            }
            GgmlType::Q6_K => {
                let $k = Kind::K(FmtK::Q6K);
                $body
            }
            other => unreachable!("int8: {other} has no integer kernel"),
        }
    };
}

mod codes;
mod interleaved;
mod lanes;
mod mac;
mod per_row;
mod tiles;
mod wide;

use std::arch::x86_64::*;

use gguf::GgmlType;

use super::acts::QRow;
use super::reference::{add_group_k, Fmt32, FmtK, KMeta};
use codes::codes32;
use lanes::{store_rows, Group8, Lanes};
use mac::{Avx2Mac, Mac, VnniMac};

pub(super) use interleaved::{interleaved_avx2, interleaved_vnni};
pub(super) use lanes::TILE_ROWS;

/// Sum of the 8 i32 lanes (exact).
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// The 8 × 8 dword transpose: lane `r` of output `i` is dword `i` of input `r` (so output `i`
/// holds elements `4i..4i + 4` of each of 8 rows' blocks).
#[inline(always)]
unsafe fn transpose8(v: [__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
    let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
    let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    let t4 = _mm256_unpacklo_epi32(v[4], v[5]);
    let t5 = _mm256_unpackhi_epi32(v[4], v[5]);
    let t6 = _mm256_unpacklo_epi32(v[6], v[7]);
    let t7 = _mm256_unpackhi_epi32(v[6], v[7]);
    // Dwords (0 | 4), (1 | 5), (2 | 6), (3 | 7) of rows 0-3, then of rows 4-7.
    let s0 = _mm256_unpacklo_epi64(t0, t2);
    let s1 = _mm256_unpackhi_epi64(t0, t2);
    let s2 = _mm256_unpacklo_epi64(t1, t3);
    let s3 = _mm256_unpackhi_epi64(t1, t3);
    let s4 = _mm256_unpacklo_epi64(t4, t6);
    let s5 = _mm256_unpackhi_epi64(t4, t6);
    let s6 = _mm256_unpacklo_epi64(t5, t7);
    let s7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256::<0x20>(s0, s4),
        _mm256_permute2x128_si256::<0x20>(s1, s5),
        _mm256_permute2x128_si256::<0x20>(s2, s6),
        _mm256_permute2x128_si256::<0x20>(s3, s7),
        _mm256_permute2x128_si256::<0x31>(s0, s4),
        _mm256_permute2x128_si256::<0x31>(s1, s5),
        _mm256_permute2x128_si256::<0x31>(s2, s6),
        _mm256_permute2x128_si256::<0x31>(s3, s7),
    ]
}

/// Where [`tile32`] gets its rows' blocks, as vectors of `L`: 8 rows of the file's row-major
/// blocks decoded and transposed per block ([`RowMajor`]), or the load-time layout that is already
/// transposed, one group of 8 rows ([`tiles::Tiles`]) or two ([`wide::Pair`]).
trait Blocks<L: Lanes> {
    /// Block `b` of the rows: the raw codes transposed (vector `i` holds, in lane `r`, dword `i`
    /// of row `r`'s 32 codes in element order; Q8_0's signed), then the rows' `d` and (formats
    /// with a minimum) `m` as f32 lanes.
    unsafe fn block(&self, b: usize) -> ([L::I; 8], L::F, L::F);

    /// Fetches part `b` of `nb` of the next rows' bytes ahead of their kernel call
    /// ([`tiles::prefetch_part`]); nothing for layouts whose next rows are not consecutive.
    #[inline(always)]
    unsafe fn prefetch_next(&self, _b: usize, _nb: usize) {}
}

/// `nrows` (1..=8) rows of a 32-block format in the file's layout, `rb` bytes apart from `rows`.
struct RowMajor {
    f: Fmt32,
    rows: *const u8,
    rb: usize,
    nrows: usize,
}

impl<M: Mac> Blocks<Group8<M>> for RowMajor {
    #[inline(always)]
    unsafe fn block(&self, b: usize) -> ([__m256i; 8], __m256, __m256) {
        let f = self.f;
        let mut codes = [_mm256_setzero_si256(); 8];
        let (mut dh, mut mh) = ([0u16; 8], [0u16; 8]);
        for r in 0..self.nrows {
            let p = self.rows.add(r * self.rb + b * f.bytes());
            dh[r] = std::ptr::read_unaligned(p as *const u16);
            if f.has_min() {
                mh[r] = std::ptr::read_unaligned(p.add(2) as *const u16);
            }
            codes[r] = codes32(f, p);
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(dh.as_ptr() as *const __m128i));
        let mw = _mm256_cvtph_ps(_mm_loadu_si128(mh.as_ptr() as *const __m128i));
        (transpose8(codes), dw, mw)
    }
}

/// `L::ROWS` weight rows of a 32-block format `f` (`nb` blocks each, from `src`) against `T`
/// activation rows: lane `r` of entry `t` is `Σ W_r · x_t`. Per token, block `b`'s exact integer
/// sums land in lane `r`, and the block's term ([`super::reference::term32`], lane-wise) is added
/// to accumulator `b % 8` in increasing block order, the 8 reduced at the end as
/// [`super::reference::reduce8`] does. Every operation is lane-wise, so a row's bits do not depend
/// on the vector width. Lanes of missing rows are garbage.
#[inline(always)]
unsafe fn tile32<L: Lanes, S: Blocks<L>, const T: usize>(
    f: Fmt32,
    src: &S,
    xs: &[QRow<'_>; T],
    nb: usize,
) -> [L::F; T] {
    let signed = f == Fmt32::Q8_0;
    let offset = if signed { L::Q8_OFFSET } else { f.offset() };
    // Block `b` into accumulator `b % 8` of each token, as the reference's lanes.
    let mut acc = [[L::fzero(); 8]; T];
    for b in 0..nb {
        src.prefetch_next(b, nb);
        let (raw, dw, mw) = src.block(b);
        let u = L::prep(signed, raw);
        for t in 0..T {
            let x = xs[t];
            let mut s = L::dot8(&u, &raw, signed, x.qs.as_ptr().add(32 * b));
            if offset != 0 {
                s = L::sub(s, L::set1(offset * x.sums[b]));
            }
            let dx = L::fset1(x.d[b]);
            let mut term = L::fmul(L::fmul(dw, dx), L::to_f(s));
            if f.has_min() {
                term = L::fadd(term, L::fmul(mw, L::fset1(x.dsums[b])));
            }
            acc[t][b % 8] = L::fadd(acc[t][b % 8], term);
        }
    }
    let mut out = [L::fzero(); T];
    for t in 0..T {
        // [`super::reference::reduce8`]'s order, lane-wise.
        let a = &acc[t];
        let even = L::fadd(L::fadd(a[0], a[4]), L::fadd(a[2], a[6]));
        let odd = L::fadd(L::fadd(a[1], a[5]), L::fadd(a[3], a[7]));
        out[t] = L::fadd(even, odd);
    }
    out
}

/// Every row of `rows` (`out.len()` rows of `rb` bytes, format `f`, `nb` blocks) against `xs`
/// through [`tile32`], 8 rows at a time, or for tiles of fewer than 4 tokens one row at a time
/// through [`per_row::row32`] (the same bits).
#[inline(always)]
unsafe fn rows32<M: Mac, const T: usize>(
    f: Fmt32,
    rows: &[u8],
    xs: [QRow<'_>; T],
    nb: usize,
    out: &mut [[f32; T]],
) {
    let rb = rows.len() / out.len();
    if T < 4 {
        for (r, o) in out.iter_mut().enumerate() {
            *o = per_row::row32::<M, T>(f, &rows[r * rb..(r + 1) * rb], &xs, nb);
        }
        return;
    }
    for (c, o) in out.chunks_mut(8).enumerate() {
        let rows = rows.as_ptr().add(8 * c * rb);
        // A constant 8 unrolls the decoding loop (codes and scales in registers).
        let acc = if o.len() == 8 {
            tile32::<Group8<M>, RowMajor, T>(
                f,
                &RowMajor {
                    f,
                    rows,
                    rb,
                    nrows: 8,
                },
                &xs,
                nb,
            )
        } else {
            let nrows = o.len();
            tile32::<Group8<M>, RowMajor, T>(f, &RowMajor { f, rows, rb, nrows }, &xs, nb)
        };
        store_rows::<Group8<M>, T>(&acc, o);
    }
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
        let ones = _mm256_set1_epi16(1);
        for t in 0..T {
            let xq = xs[t].qs.as_ptr().add(256 * sb);
            let x = xs[t];
            // A loop, not a closure: closures do not inherit the caller's target features.
            for j in 0..8 {
                let b = 8 * sb + j;
                let xv = _mm256_loadu_si256(xq.add(32 * j) as *const __m256i);
                let prod = _mm256_maddubs_epi16(codes[j], xv);
                let gsum = match f {
                    FmtK::Q4K | FmtK::Q5K => hsum_i32(_mm256_madd_epi16(prod, ones)),
                    FmtK::Q6K => {
                        let (g, bs) = (2 * j, &x.bsums[2 * b..2 * b + 2]);
                        let offset =
                            m.scales[g] * i32::from(bs[0]) + m.scales[g + 1] * i32::from(bs[1]);
                        hsum_i32(_mm256_madd_epi16(prod, scales[j])) - 32 * offset
                    }
                };
                acc[t] = add_group_k(f, &m, j, (x.d[b], x.dsums[b]), gsum, acc[t]);
            }
        }
    }
    acc
}

/// Every row of `rows` (consecutive encoded rows of `k` values, `out.len()` of them) against `xs`
/// through [`rows32`] with `M` or [`rows_k`], into `out` (one entry per row); `kind` a constant.
#[inline(always)]
unsafe fn rows_of<M: Mac, const T: usize>(
    kind: Kind,
    rows: &[u8],
    xs: [QRow<'_>; T],
    k: usize,
    out: &mut [[f32; T]],
) {
    match kind {
        Kind::B32(f) => rows32::<M, T>(f, rows, xs, k / 32, out),
        Kind::K(f) => {
            let rb = rows.len() / out.len();
            for (r, o) in out.iter_mut().enumerate() {
                *o = rows_k::<T>(f, &rows[r * rb..(r + 1) * rb], xs, k / 256);
            }
        }
    }
}

/// `out[r][t] = Σ W_r·x_t` for the consecutive encoded rows `rows` (`out.len()` rows of `k`
/// values of `format`, a format with integer kernels; AVX2 path).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `rows` holds `out.len()` rows of `k` values of the
/// format, each `xs[t]` the matching quantized activations of `k` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_avx2<const T: usize>(
    format: GgmlType,
    rows: &[u8],
    xs: [QRow<'_>; T],
    k: usize,
    out: &mut [[f32; T]],
) {
    with_kind!(format, kind => rows_of::<Avx2Mac, T>(kind, rows, xs, k, out))
}

/// [`rows_avx2`] on the VNNI path.
///
/// # Safety
/// As [`rows_avx2`], and the CPU must support AVX-512 VNNI, VL and BW.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn rows_vnni<const T: usize>(
    format: GgmlType,
    rows: &[u8],
    xs: [QRow<'_>; T],
    k: usize,
    out: &mut [[f32; T]],
) {
    with_kind!(format, kind => rows_of::<VnniMac, T>(kind, rows, xs, k, out))
}
