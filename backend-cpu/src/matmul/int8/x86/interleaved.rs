//! The 32-block kernels on weights interleaved at load time ([`crate::kernels::Interleaved8`]):
//! [`super::tile32`]'s arithmetic, with the rows' codes and scales loaded already transposed
//! instead of decoded and transposed per block, for every tile height (single-stream decode
//! included, which then needs no horizontal reduction). Bitwise the row-major kernels' results.

use std::arch::x86_64::*;

use gguf::GgmlType;

use super::super::acts::QRow;
use super::super::reference::{Fmt32, FmtK};
use super::mac::{Avx2Mac, Mac, VnniMac};
use super::tiles::Tiles;
use super::{store_lanes, tile32, wide};

/// Which kernel a group of interleaved rows takes: the 32-block one ([`tile32`]) or the k-quant
/// one ([`tile_k`]). A constant at every call site, so the match folds away.
#[derive(Clone, Copy)]
enum Kind {
    B32(Fmt32),
    K(FmtK),
}

/// Every row of `out` (`out.len()` rows, at most `8 * groups` of the interleaved `tiles`, whose
/// groups of `nb` tiles of `tile_bytes` lie consecutive) against `xs`, 8 rows per kernel call.
#[inline(always)]
unsafe fn rows<M: Mac, const T: usize>(
    kind: Kind,
    tiles: &[u8],
    tile_bytes: usize,
    nb: usize,
    xs: &[QRow<'_>; T],
    out: &mut [[f32; T]],
) {
    let group = nb * tile_bytes;
    assert!(
        tiles.len() >= out.len().div_ceil(8) * group,
        "interleaved: too few groups"
    );
    for (g, o) in out.chunks_mut(8).enumerate() {
        let at = tiles.as_ptr().add(g * group);
        let acc = match kind {
            Kind::B32(f) => {
                let src = Tiles {
                    f,
                    tiles: at,
                    tile_bytes,
                };
                tile32::<M, Tiles, T>(f, &src, xs, nb)
            }
            Kind::K(f) => tile_k::<M, T>(f, at, tile_bytes, nb, xs),
        };
        store_lanes(&acc, o);
    }
}

/// [`rows`] on the VNNI path for the 32-block formats: pairs of groups through
/// [`wide::tile16`], a last lone group through the 8-row kernel. Same bits.
#[inline(always)]
unsafe fn rows16<const T: usize>(
    f: Fmt32,
    tiles: &[u8],
    tile_bytes: usize,
    nb: usize,
    xs: &[QRow<'_>; T],
    out: &mut [[f32; T]],
) {
    let group = nb * tile_bytes;
    assert!(
        tiles.len() >= out.len().div_ceil(8) * group,
        "interleaved: too few groups"
    );
    for (p, o) in out.chunks_mut(16).enumerate() {
        let at = 2 * p * group;
        if o.len() <= 8 {
            rows::<VnniMac, T>(Kind::B32(f), &tiles[at..], tile_bytes, nb, xs, o);
            continue;
        }
        let tiles_at = |g: usize| Tiles {
            f,
            tiles: tiles.as_ptr().add(at + g * group),
            tile_bytes,
        };
        let acc = wide::tile16::<T>(f, &tiles_at(0), &tiles_at(1), xs, nb);
        for t in 0..T {
            let mut lanes = [0.0f32; 16];
            _mm512_storeu_ps(lanes.as_mut_ptr(), acc[t]);
            for (r, o) in o.iter_mut().enumerate() {
                o[t] = lanes[r];
            }
        }
    }
}

/// 8 interleaved rows of a k-quant format `f` (Q4_K or Q6_K; `nsb` tiles of `tile_bytes` from
/// `tiles`, layout in [`crate::kernels::Interleaved8`]) against `T` activation rows: lane `r` of
/// entry `t` is [`super::super::reference::dot_k`] of row `r`, bitwise. Per super-block and
/// token the exact integer sums of every sub-block land in lane `r`, are scaled by the row's
/// integer sub-block scales (`vpmulld`) and summed in i32 (exact, any order), with Q4_K's min
/// correction beside them (Q6_K's `-32 · Σ scale · bsum` folded into its sub-block sums, the same
/// integer); then [`super::super::reference::term_k`]'s f32 operations run lane-wise and the
/// term is added to the token's accumulator in super-block order.
#[inline(always)]
unsafe fn tile_k<M: Mac, const T: usize>(
    f: FmtK,
    tiles: *const u8,
    tile_bytes: usize,
    nsb: usize,
    xs: &[QRow<'_>; T],
) -> [__m256; T] {
    let z = _mm256_setzero_si256();
    let m4 = _mm256_set1_epi8(0x0F);
    // Row r's byte j of the 8 bytes at `p`, as lane r's i32 (unsigned or signed).
    let bytes_u = |p: *const u8| _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
    let bytes_i = |p: *const u8| _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i));
    let mut acc = [_mm256_setzero_ps(); T];
    for sb in 0..nsb {
        let p = tiles.add(sb * tile_bytes);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let mut isum = [z; T];
        match f {
            FmtK::Q4K => {
                let dmw = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i));
                let mut corr = [z; T];
                for c in 0..4 {
                    let (mut lo, mut hi) = ([z; 8], [z; 8]);
                    for i in 0..8 {
                        let v = _mm256_loadu_si256(p.add(160 + 256 * c + 32 * i) as *const __m256i);
                        lo[i] = _mm256_and_si256(v, m4);
                        hi[i] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                    }
                    // Sub-blocks 2c (low nibbles) and 2c + 1 (high): scales, then mins.
                    let (sc_lo, sc_hi) = (bytes_u(p.add(32 + 16 * c)), bytes_u(p.add(40 + 16 * c)));
                    let (mn_lo, mn_hi) =
                        (bytes_u(p.add(96 + 16 * c)), bytes_u(p.add(104 + 16 * c)));
                    for t in 0..T {
                        let xq = xs[t].qs.as_ptr().add(256 * sb + 64 * c);
                        let (mut dl, mut dh) = ([z; 2], [z; 2]);
                        for i in 0..8 {
                            dl[i % 2] = M::mac1(dl[i % 2], lo[i], xq.add(4 * i));
                            dh[i % 2] = M::mac1(dh[i % 2], hi[i], xq.add(32 + 4 * i));
                        }
                        let dl = _mm256_add_epi32(dl[0], dl[1]);
                        let dh = _mm256_add_epi32(dh[0], dh[1]);
                        let scaled = _mm256_add_epi32(
                            _mm256_mullo_epi32(sc_lo, dl),
                            _mm256_mullo_epi32(sc_hi, dh),
                        );
                        isum[t] = _mm256_add_epi32(isum[t], scaled);
                        let bs = &xs[t].bsums[16 * sb + 4 * c..16 * sb + 4 * c + 4];
                        let b_lo = _mm256_set1_epi32(i32::from(bs[0]) + i32::from(bs[1]));
                        let b_hi = _mm256_set1_epi32(i32::from(bs[2]) + i32::from(bs[3]));
                        let mins = _mm256_add_epi32(
                            _mm256_mullo_epi32(mn_lo, b_lo),
                            _mm256_mullo_epi32(mn_hi, b_hi),
                        );
                        corr[t] = _mm256_add_epi32(corr[t], mins);
                    }
                }
                for t in 0..T {
                    // (dx * d) * isum - (dx * dmin) * corr, lane-wise.
                    let dx = _mm256_set1_ps(xs[t].d[sb]);
                    let a = _mm256_mul_ps(_mm256_mul_ps(dx, dw), _mm256_cvtepi32_ps(isum[t]));
                    let b = _mm256_mul_ps(_mm256_mul_ps(dx, dmw), _mm256_cvtepi32_ps(corr[t]));
                    acc[t] = _mm256_add_ps(acc[t], _mm256_sub_ps(a, b));
                }
            }
            FmtK::Q6K => {
                // 16 sub-blocks of 16 values (4 code chunks each), 4 at a time.
                for pass in 0..4 {
                    let mut v = [z; 16];
                    for (i, v) in v.iter_mut().enumerate() {
                        *v =
                            _mm256_loadu_si256(p.add(144 + 32 * (16 * pass + i)) as *const __m256i);
                    }
                    let sc: [__m256i; 4] =
                        std::array::from_fn(|k| bytes_i(p.add(16 + 8 * (4 * pass + k))));
                    for t in 0..T {
                        let xq = xs[t].qs.as_ptr().add(256 * sb + 64 * pass);
                        let bs = &xs[t].bsums[16 * sb + 4 * pass..16 * sb + 4 * pass + 4];
                        for k in 0..4 {
                            let mut d = [z; 2];
                            for i in 0..4 {
                                d[i % 2] = M::mac1(d[i % 2], v[4 * k + i], xq.add(16 * k + 4 * i));
                            }
                            // Σ c·q - 32 · Σ q: the sub-block's part of isum + corr.
                            let d = _mm256_sub_epi32(
                                _mm256_add_epi32(d[0], d[1]),
                                _mm256_set1_epi32(32 * i32::from(bs[k])),
                            );
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(sc[k], d));
                        }
                    }
                }
                for t in 0..T {
                    // (dx * d) * (isum + corr), lane-wise.
                    let dx = _mm256_set1_ps(xs[t].d[sb]);
                    let term = _mm256_mul_ps(_mm256_mul_ps(dx, dw), _mm256_cvtepi32_ps(isum[t]));
                    acc[t] = _mm256_add_ps(acc[t], term);
                }
            }
            FmtK::Q5K => unreachable!("int8: Q5_K is not interleaved"),
        }
    }
    acc
}

/// Runs `$body` with `$k` bound to the [`Kind`] of format `$f`, a constant in each arm (so the
/// kernels are specialized per format).
macro_rules! per_format {
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
            GgmlType::Q6_K => {
                let $k = Kind::K(FmtK::Q6K);
                $body
            }
            other => unreachable!("int8: {other} is not interleaved"),
        }
    };
}

/// `out[r][t] = Σ W_r·x_t` for the rows of `out` from interleaved groups `tiles` of format `f`
/// (a format with an interleaved layout; `nb` blocks per row, tiles of `tile_bytes`), AVX2 path.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; each `xs[t]` holds the quantized activations of
/// `32 * nb` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn interleaved_avx2<const T: usize>(
    f: GgmlType,
    tiles: &[u8],
    tile_bytes: usize,
    nb: usize,
    xs: &[QRow<'_>; T],
    out: &mut [[f32; T]],
) {
    per_format!(f, k => rows::<Avx2Mac, T>(k, tiles, tile_bytes, nb, xs, out))
}

/// [`interleaved_avx2`] on the VNNI path.
///
/// # Safety
/// As [`interleaved_avx2`], and the CPU must support AVX-512 VNNI, VL and BW.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(in super::super) unsafe fn interleaved_vnni<const T: usize>(
    f: GgmlType,
    tiles: &[u8],
    tile_bytes: usize,
    nb: usize,
    xs: &[QRow<'_>; T],
    out: &mut [[f32; T]],
) {
    // 512-bit vectors, 16 rows per kernel call, for the 32-block formats in tiles of 4+ tokens
    // (for fewer, joining two groups' codes costs more than it saves: single-stream Gemma 3
    // decode measured 20 % slower with it).
    per_format!(f, k => match k {
        Kind::B32(f) if T >= 4 => rows16::<T>(f, tiles, tile_bytes, nb, xs, out),
        _ => rows::<VnniMac, T>(k, tiles, tile_bytes, nb, xs, out),
    })
}
