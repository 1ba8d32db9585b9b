//! The 32-block kernels on weights interleaved at load time ([`crate::kernels::Interleaved8`]):
//! [`super::tile32`]'s arithmetic, with the rows' codes and scales loaded already transposed
//! instead of decoded and transposed per block, for every tile height (single-stream decode
//! included, which then needs no horizontal reduction). Bitwise the row-major kernels' results.

use std::arch::x86_64::*;

use super::super::acts::QRow;
use super::super::reference::Fmt32;
use super::codes::bytes_from_bits;
use super::mac::{Avx2Mac, Mac, VnniMac};
use super::{store_lanes, tile32, Tile8};

/// One group of 8 interleaved rows: `nb` tiles of `tile_bytes` from `tiles`.
struct Tiles {
    f: Fmt32,
    tiles: *const u8,
    tile_bytes: usize,
}

impl Tile8 for Tiles {
    #[inline(always)]
    unsafe fn block(&self, b: usize) -> ([__m256i; 8], __m256, __m256) {
        let p = self.tiles.add(b * self.tile_bytes);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let (mw, codes) = if self.f.has_min() {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i)),
                p.add(32),
            )
        } else {
            (_mm256_setzero_ps(), p.add(16))
        };
        let fifth = matches!(self.f, Fmt32::Q5_0 | Fmt32::Q5_1);
        let (masks, codes) = (
            codes as *const u32,
            if fifth { codes.add(32) } else { codes },
        );
        let mut raw = [_mm256_setzero_si256(); 8];
        if self.f == Fmt32::Q8_0 {
            for (i, v) in raw.iter_mut().enumerate() {
                *v = _mm256_loadu_si256(codes.add(32 * i) as *const __m256i);
            }
        } else {
            // Chunk i: low nibbles are dword i of the codes, high nibbles dword i + 4.
            let m4 = _mm256_set1_epi8(0x0F);
            for i in 0..4 {
                let c = _mm256_loadu_si256(codes.add(32 * i) as *const __m256i);
                raw[i] = _mm256_and_si256(c, m4);
                raw[i + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(c), m4);
            }
            if fifth {
                // Mask i: the fifth bits of code vector i, 4 per row (module docs of the layout).
                let bit = _mm256_set1_epi8(0x10);
                for (i, v) in raw.iter_mut().enumerate() {
                    let set = bytes_from_bits(std::ptr::read_unaligned(masks.add(i)));
                    *v = _mm256_or_si256(*v, _mm256_and_si256(set, bit));
                }
            }
        }
        (raw, dw, mw)
    }
}

/// Every row of `out` (`out.len()` rows, at most `8 * groups` of the interleaved `tiles`, whose
/// groups of `nb` tiles of `tile_bytes` lie consecutive) against `xs`.
#[inline(always)]
unsafe fn rows<M: Mac, const T: usize>(
    f: Fmt32,
    tiles: &[u8],
    tile_bytes: usize,
    nb: usize,
    xs: [QRow<'_>; T],
    out: &mut [[f32; T]],
) {
    let group = nb * tile_bytes;
    assert!(
        tiles.len() >= out.len().div_ceil(8) * group,
        "interleaved: too few groups"
    );
    for (g, o) in out.chunks_mut(8).enumerate() {
        let src = Tiles {
            f,
            tiles: tiles.as_ptr().add(g * group),
            tile_bytes,
        };
        let acc = tile32::<M, Tiles, T>(f, &src, &xs, nb);
        store_lanes(&acc, o);
    }
}

/// Dispatches on the format with it a constant in each arm (so the kernel is specialized).
macro_rules! dispatch {
    ($mac:ty, $f:expr, $tiles:expr, $tile_bytes:expr, $nb:expr, $xs:expr, $out:expr) => {
        match $f {
            Fmt32::Q4_0 => rows::<$mac, T>(Fmt32::Q4_0, $tiles, $tile_bytes, $nb, $xs, $out),
            Fmt32::Q4_1 => rows::<$mac, T>(Fmt32::Q4_1, $tiles, $tile_bytes, $nb, $xs, $out),
            Fmt32::Q5_0 => rows::<$mac, T>(Fmt32::Q5_0, $tiles, $tile_bytes, $nb, $xs, $out),
            Fmt32::Q5_1 => rows::<$mac, T>(Fmt32::Q5_1, $tiles, $tile_bytes, $nb, $xs, $out),
            Fmt32::Q8_0 => rows::<$mac, T>(Fmt32::Q8_0, $tiles, $tile_bytes, $nb, $xs, $out),
        }
    };
}

/// `out[r][t] = Σ W_r·x_t` for the rows of `out` from interleaved groups `tiles` of format `f`
/// (any 32-block format; `nb` blocks per row, tiles of `tile_bytes`), AVX2 path.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; each `xs[t]` holds the quantized activations of
/// `32 * nb` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn interleaved_avx2<const T: usize>(
    f: Fmt32,
    tiles: &[u8],
    tile_bytes: usize,
    nb: usize,
    xs: [QRow<'_>; T],
    out: &mut [[f32; T]],
) {
    dispatch!(Avx2Mac, f, tiles, tile_bytes, nb, xs, out)
}

/// [`interleaved_avx2`] on the VNNI path.
///
/// # Safety
/// As [`interleaved_avx2`], and the CPU must support AVX-512 VNNI, VL and BW.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(in super::super) unsafe fn interleaved_vnni<const T: usize>(
    f: Fmt32,
    tiles: &[u8],
    tile_bytes: usize,
    nb: usize,
    xs: [QRow<'_>; T],
    out: &mut [[f32; T]],
) {
    dispatch!(VnniMac, f, tiles, tile_bytes, nb, xs, out)
}
