//! The VNNI path's 32-block rows, 16 interleaved at a time ([`Pair`]): two consecutive groups of
//! 8 ([`Tiles`]) joined into 512-bit vectors, so that one `vpdpbusd` makes the block sums of 16
//! rows (lane `r` = row `r`) and every per-token instruction of [`super::tile32`] covers twice
//! the rows. The kernel is [`super::tile32`] on [`Group16`] lanes: the same integer sums and the
//! same f32 operations in the same order per lane, so the bits are those of 8 rows at a time.

use std::arch::x86_64::*;

use super::lanes::{Group16, Group8};
use super::mac::VnniMac;
use super::tiles::{prefetch_part, Tiles};
use super::Blocks;

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

/// Two consecutive groups of 8 interleaved rows: `lo` in lanes 0-7, `hi` in lanes 8-15.
pub(super) struct Pair {
    pub(super) lo: Tiles,
    pub(super) hi: Tiles,
}

impl Blocks<Group16> for Pair {
    #[inline(always)]
    unsafe fn prefetch_next(&self, b: usize, nb: usize) {
        // The next pair of groups follows these two.
        let next = self.hi.tiles.wrapping_add(nb * self.hi.tile_bytes);
        prefetch_part(next, 2 * self.hi.tile_bytes, b);
    }

    #[inline(always)]
    unsafe fn block(&self, b: usize) -> ([__m512i; 8], __m512, __m512) {
        let (ra, dwa, mwa) = <Tiles as Blocks<Group8<VnniMac>>>::block(&self.lo, b);
        let (rb, dwb, mwb) = <Tiles as Blocks<Group8<VnniMac>>>::block(&self.hi, b);
        let raw: [__m512i; 8] = [
            join(ra[0], rb[0]),
            join(ra[1], rb[1]),
            join(ra[2], rb[2]),
            join(ra[3], rb[3]),
            join(ra[4], rb[4]),
            join(ra[5], rb[5]),
            join(ra[6], rb[6]),
            join(ra[7], rb[7]),
        ];
        (raw, join_ps(dwa, dwb), join_ps(mwa, mwb))
    }
}
