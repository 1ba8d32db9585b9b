//! The 32-block kernels on weights interleaved at load time ([`crate::kernels::Interleaved8`]):
//! [`super::tile32`]'s arithmetic, with the rows' codes and scales loaded already transposed
//! instead of decoded and transposed per block, for every tile height (single-stream decode
//! included, which then needs no horizontal reduction). Bitwise the row-major kernels' results.

use gguf::GgmlType;

use super::super::acts::QRow;
use super::super::reference::{Fmt32, FmtK};
use super::lanes::{store_tokens, Group16, Group8, Lanes, TokenTile, TILE_ROWS};
use super::mac::{Avx2Mac, Mac, VnniMac};
use super::tiles::{prefetch_part, Tiles};
use super::{tile32, wide, Kind};

/// The first `n_rows` rows (at most `8 * groups` of the interleaved `tiles`, whose groups of `nb`
/// tiles of `tile_bytes` lie consecutive; at most [`TILE_ROWS`]) against `xs`, 8 rows per kernel
/// call, into `tile` token by token.
#[inline(always)]
unsafe fn rows<M: Mac, const T: usize>(
    kind: Kind,
    tiles: &[u8],
    tile_bytes: usize,
    nb: usize,
    xs: &[QRow<'_>; T],
    n_rows: usize,
    tile: &mut TokenTile<T>,
) {
    let group = nb * tile_bytes;
    assert!(n_rows <= TILE_ROWS, "interleaved: more rows than a tile");
    assert!(
        tiles.len() >= n_rows.div_ceil(8) * group,
        "interleaved: too few groups"
    );
    for g in 0..n_rows.div_ceil(8) {
        let at = tiles.as_ptr().add(g * group);
        let acc = match kind {
            Kind::B32(f) => {
                let src = Tiles {
                    f,
                    tiles: at,
                    tile_bytes,
                };
                tile32::<Group8<M>, Tiles, T>(f, &src, xs, nb)
            }
            Kind::K(f) => {
                let l = Group8::<M>::new();
                tile_k::<Group8<M>, T>(f, &l, at, tile_bytes, nb, xs)
            }
        };
        store_tokens::<Group8<M>, T>(&acc, tile, 8 * g);
    }
}

/// [`rows`] on the VNNI path: a pair of groups in 512-bit vectors ([`tile32`] on a
/// [`wide::Pair`] for the 32-block formats, [`tile_k`] on [`Group16`] for the k-quants), a lone
/// group (8 rows or fewer) through the 8-row kernel. Same bits.
#[inline(always)]
unsafe fn rows16<const T: usize>(
    kind: Kind,
    tiles: &[u8],
    tile_bytes: usize,
    nb: usize,
    xs: &[QRow<'_>; T],
    n_rows: usize,
    tile: &mut TokenTile<T>,
) {
    let group = nb * tile_bytes;
    assert!(n_rows <= TILE_ROWS, "interleaved: more rows than a tile");
    assert!(
        tiles.len() >= n_rows.div_ceil(8) * group,
        "interleaved: too few groups"
    );
    if n_rows <= 8 {
        return rows::<VnniMac, T>(kind, tiles, tile_bytes, nb, xs, n_rows, tile);
    }
    let acc = match kind {
        Kind::B32(f) => {
            let tiles_at = |g: usize| Tiles {
                f,
                tiles: tiles.as_ptr().add(g * group),
                tile_bytes,
            };
            let pair = wide::Pair {
                lo: tiles_at(0),
                hi: tiles_at(1),
            };
            tile32::<Group16, wide::Pair, T>(f, &pair, xs, nb)
        }
        Kind::K(f) => {
            let l = Group16 { group };
            tile_k::<Group16, T>(f, &l, tiles.as_ptr(), tile_bytes, nb, xs)
        }
    };
    store_tokens::<Group16, T>(&acc, tile, 0);
}

/// `L::ROWS` interleaved rows (one group, or two for [`Group16`]) of a k-quant format `f` (Q4_K
/// or Q6_K; `nsb` tiles of `tile_bytes` from `tiles`, layout in
/// [`crate::kernels::Interleaved8`]) against `T` activation rows: lane `r` of entry `t` is
/// [`super::super::reference::dot_k`] of row `r`, bitwise. Per group of 32 values and token the
/// exact integer sums land in lane `r` ([`Lanes::dot_n`]: on AVX2 Q4_K's 8 products per group,
/// Q6_K's pairs, add in i16 before one `vpmaddwd`; Q6_K's two sub-blocks are each scaled by the
/// row's integer scale, `vpmulld`, with their `-32 · Σq` folded in); then
/// [`super::super::reference::add_group_k`]'s f32 operations run lane-wise (the rows' `d · scale`
/// and `dmin · min` once per super-block for all tokens) and the term is added to the token's
/// accumulator in group order.
#[inline(always)]
unsafe fn tile_k<L: Lanes, const T: usize>(
    f: FmtK,
    l: &L,
    tiles: *const u8,
    tile_bytes: usize,
    nsb: usize,
    xs: &[QRow<'_>; T],
) -> [L::F; T] {
    let z = L::zero();
    let mut acc = [L::fzero(); T];
    // The next `L::ROWS` rows' tiles follow these ([`prefetch_part`]).
    let span = L::ROWS / 8 * tile_bytes;
    let next = tiles.wrapping_add(nsb * span);
    for sb in 0..nsb {
        prefetch_part(next, span, sb);
        let p = tiles.add(sb * tile_bytes);
        let dw = l.f16(p);
        match f {
            FmtK::Q4K => {
                let dmw = l.f16(p.add(16));
                for c in 0..4 {
                    let (mut lo, mut hi) = ([z; 8], [z; 8]);
                    for i in 0..8 {
                        (lo[i], hi[i]) = L::nibbles(l.load(p.add(160 + 256 * c + 32 * i)));
                    }
                    // Groups 2c (low nibbles) and 2c + 1 (high): d · scale and dmin · min.
                    // (No closure: closures do not inherit the caller's target features.)
                    let ds_lo = L::fmul(dw, L::to_f(l.bytes(p.add(32 + 16 * c), false)));
                    let ds_hi = L::fmul(dw, L::to_f(l.bytes(p.add(40 + 16 * c), false)));
                    let dm_lo = L::fmul(dmw, L::to_f(l.bytes(p.add(96 + 16 * c), false)));
                    let dm_hi = L::fmul(dmw, L::to_f(l.bytes(p.add(104 + 16 * c), false)));
                    let b = 8 * sb + 2 * c;
                    for t in 0..T {
                        let x = &xs[t];
                        let xq = x.qs.as_ptr().add(256 * sb + 64 * c);
                        // 4-bit codes: 8 products sum exactly in i16 ([`Lanes::dot_n`]).
                        let dl = L::dot_n::<8>(&lo, xq);
                        let dh = L::dot_n::<8>(&hi, xq.add(32));
                        // fma(dx, ds * gsum, acc), then fma(-dm, dsum, acc), lane-wise.
                        let halves = [(dl, ds_lo, dm_lo), (dh, ds_hi, dm_hi)];
                        for (h, (g, ds, dm)) in halves.into_iter().enumerate() {
                            let a = L::fmul(ds, L::to_f(g));
                            let v = L::fmadd(L::fset1(x.d[b + h]), a, acc[t]);
                            acc[t] = L::fnmadd(dm, L::fset1(x.dsums[b + h]), v);
                        }
                    }
                }
            }
            FmtK::Q6K => {
                // 16 sub-blocks of 16 values (4 code chunks each), 4 at a time: groups 2·pass
                // and 2·pass + 1.
                for pass in 0..4 {
                    let mut v = [z; 16];
                    for (i, v) in v.iter_mut().enumerate() {
                        *v = l.load(p.add(144 + 32 * (16 * pass + i)));
                    }
                    let sc: [L::I; 4] =
                        std::array::from_fn(|k| l.bytes(p.add(16 + 8 * (4 * pass + k)), true));
                    for t in 0..T {
                        let x = &xs[t];
                        let xq = x.qs.as_ptr().add(256 * sb + 64 * pass);
                        let bs = &x.bsums[16 * sb + 4 * pass..16 * sb + 4 * pass + 4];
                        for half in 0..2 {
                            let mut gsum = z;
                            for k in 2 * half..2 * half + 2 {
                                // 6-bit codes: pairs of products sum exactly in i16.
                                let xk = xq.add(16 * k);
                                let d0 = L::dot_n::<2>(&[v[4 * k], v[4 * k + 1]], xk);
                                let d1 = L::dot_n::<2>(&[v[4 * k + 2], v[4 * k + 3]], xk.add(8));
                                // scale · (Σ c·q - 32 · Σ q) of the sub-block.
                                let d = L::sub(L::add(d0, d1), L::set1(32 * i32::from(bs[k])));
                                gsum = L::add(gsum, L::mullo(sc[k], d));
                            }
                            // fma(dx * d, gsum, acc), lane-wise.
                            let dx = L::fset1(x.d[8 * sb + 2 * pass + half]);
                            acc[t] = L::fmadd(L::fmul(dx, dw), L::to_f(gsum), acc[t]);
                        }
                    }
                }
            }
            FmtK::Q5K => unreachable!("int8: Q5_K is not interleaved"),
        }
    }
    acc
}

/// `tile[t][r] = Σ W_r·x_t` for the first `n_rows` rows (at most [`TILE_ROWS`]) of the
/// interleaved groups `tiles` of format `f` (a format with an interleaved layout; `nb` blocks per
/// row, tiles of `tile_bytes`), AVX2 path. Entries of rows past `n_rows` are left unspecified.
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
    n_rows: usize,
    tile: &mut TokenTile<T>,
) {
    with_kind!(f, k => rows::<Avx2Mac, T>(k, tiles, tile_bytes, nb, xs, n_rows, tile))
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
    n_rows: usize,
    tile: &mut TokenTile<T>,
) {
    // 512-bit vectors, 16 rows per kernel call, for the 32-block formats in tiles of 4+ tokens
    // (for fewer, joining two groups' codes costs more than it saves: single-stream Gemma 3
    // decode measured 20 % slower with it).
    with_kind!(f, k => if T >= 4 {
        rows16::<T>(k, tiles, tile_bytes, nb, xs, n_rows, tile)
    } else {
        rows::<VnniMac, T>(k, tiles, tile_bytes, nb, xs, n_rows, tile)
    })
}
