//! The VNNI path's 32-block kernel on 16 interleaved rows at a time: two consecutive groups of
//! 8 ([`Tiles`]) joined into 512-bit vectors, so that one `vpdpbusd` makes
//! the block sums of 16 rows (lane `r` = row `r`) and every per-token instruction of
//! [`super::tile32`] covers twice the rows. The arithmetic is [`super::tile32`]'s, lane for lane
//! (the same integer sums, the same f32 operations in the same order), so the bits are too.

use std::arch::x86_64::*;

use super::super::acts::QRow;
use super::super::reference::Fmt32;
use super::mac::{Mac, VnniMac};
use super::tiles::{prefetch_part, Tiles};
use super::Tile8;

/// `a` in lanes 0-7, `b` in lanes 8-15.
#[inline(always)]
unsafe fn join(a: __m256i, b: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
}

/// [`join`] for f32 lanes (AVX-512F only: through the f64 insert).
#[inline(always)]
unsafe fn join_ps(a: __m256, b: __m256) -> __m512 {
    let lo = _mm512_castps_pd(_mm512_castps256_ps512(a));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_castps_pd(b)))
}

/// 16 rows (groups `lo` and `hi`) of format `f` against `T` tokens: lane `r` of entry `t` is
/// `Σ W_r · x_t`, accumulated as [`super::tile32`] does (block `b` into accumulator `b % 8`, the
/// 8 reduced in [`super::super::reference::reduce8`]'s order).
#[inline(always)]
pub(super) unsafe fn tile16<const T: usize>(
    f: Fmt32,
    lo: &Tiles,
    hi: &Tiles,
    xs: &[QRow<'_>; T],
    nb: usize,
) -> [__m512; T] {
    let signed = f == Fmt32::Q8_0;
    let offset = if signed {
        VnniMac::Q8_OFFSET
    } else {
        f.offset()
    };
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    // The next pair of groups follows these two ([`prefetch_part`]).
    let next = hi.tiles.wrapping_add(nb * lo.tile_bytes);
    for b in 0..nb {
        prefetch_part(next, 2 * lo.tile_bytes, b);
        let (ra, dwa, mwa) = lo.block::<VnniMac>(b);
        let (rb, dwb, mwb) = hi.block::<VnniMac>(b);
        let (ua, ub) = (VnniMac::prep(signed, ra), VnniMac::prep(signed, rb));
        let u: [__m512i; 8] = std::array::from_fn(|i| join(ua[i], ub[i]));
        let (dw, mw) = (join_ps(dwa, dwb), join_ps(mwa, mwb));
        for t in 0..T {
            let x = &xs[t];
            let xq = x.qs.as_ptr().add(32 * b) as *const i32;
            let mut s = [_mm512_setzero_si512(); 2];
            for i in 0..8 {
                let xv = _mm512_set1_epi32(std::ptr::read_unaligned(xq.add(i)));
                s[i % 2] = _mm512_dpbusd_epi32(s[i % 2], u[i], xv);
            }
            let mut s = _mm512_add_epi32(s[0], s[1]);
            if offset != 0 {
                s = _mm512_sub_epi32(s, _mm512_set1_epi32(offset * x.sums[b]));
            }
            let dx = _mm512_set1_ps(x.d[b]);
            let mut term = _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(s));
            if f.has_min() {
                term = _mm512_add_ps(term, _mm512_mul_ps(mw, _mm512_set1_ps(x.dsums[b])));
            }
            acc[t][b % 8] = _mm512_add_ps(acc[t][b % 8], term);
        }
    }
    let mut out = [_mm512_setzero_ps(); T];
    for t in 0..T {
        let a = &acc[t];
        let even = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
        let odd = _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
        out[t] = _mm512_add_ps(even, odd);
    }
    out
}
