//! The small-tile kernel of the 32-block formats: one weight row at a time against `T` (at most
//! 3) activation rows, for single-stream decode, where [`super::tile32`]'s decoding and
//! transposing of 8 rows per block would be spent on one token only.
//!
//! A group of 8 blocks is decoded once into 8 vectors of codes; per token the 8 products become
//! 8 vectors of i32 partial sums, a transposed `vphaddd` tree puts the 8 exact block sums in 8
//! lanes, and the 8 block terms are computed lane-wise (the [`super::tile32`] formula, the same
//! f32 operations on the same values). The terms are then added to the row's sum one lane at a
//! time in block order, so the result is bitwise the tile kernel's and the reference's. A row's
//! last, partial group runs the same code with masked loads.

use std::arch::x86_64::*;

use super::super::acts::QRow;
use super::super::reference::Fmt32;
use super::codes::codes32;
use super::mac::Mac;

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

/// The group of `count` (1..=8) blocks of format `f` at `p0`, blocks `8 g..8 g + count` of the
/// row, against `T` activation rows: block `8 g + l`'s term added to lane `l` of `acc[t]`.
#[inline(always)]
unsafe fn group<M: Mac, const T: usize>(
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
        for j in 0..count {
            let xv = _mm256_loadu_si256(xq.add(32 * j) as *const __m256i);
            let xv = if signed {
                _mm256_sign_epi8(xv, raw[j])
            } else {
                xv
            };
            d[j] = M::dot1(u[j], xv);
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

/// One weight row of a 32-block format `f` (`nb` blocks) against `T` activation rows.
#[inline(always)]
pub(super) unsafe fn row32<M: Mac, const T: usize>(
    f: Fmt32,
    row: &[u8],
    xs: &[QRow<'_>; T],
    nb: usize,
) -> [f32; T] {
    let mut acc = [_mm256_setzero_ps(); T];
    let groups = nb / 8;
    for g in 0..groups {
        group::<M, T>(f, row.as_ptr().add(8 * g * f.bytes()), xs, g, 8, &mut acc);
    }
    if !nb.is_multiple_of(8) {
        let p0 = row.as_ptr().add(8 * groups * f.bytes());
        group::<M, T>(f, p0, xs, groups, nb % 8, &mut acc);
    }
    let mut out = [0.0f32; T];
    for t in 0..T {
        out[t] = reduce8_ps(acc[t]);
    }
    out
}

/// [`super::super::reference::reduce8`] of the 8 lanes of `v`: the same additions in the same
/// order.
#[inline(always)]
unsafe fn reduce8_ps(v: __m256) -> f32 {
    // [a0+a4, a1+a5, a2+a6, a3+a7]
    let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    // [(a0+a4)+(a2+a6), (a1+a5)+(a3+a7), ..]
    let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)))
}
