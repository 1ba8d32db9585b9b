//! [`Tiles`]: where the interleaved kernels read a group of 8 rows' blocks (the layout of
//! [`crate::kernels::Interleaved8`], already transposed: loads and nibble masks only).

use std::arch::x86_64::*;

use super::super::reference::Fmt32;
use super::lanes::Group8;
use super::mac::Mac;
use super::Blocks;

/// Fetches into L2 part `i` (`part` bytes, from `at + i * part`) of the weights that the next
/// kernel call reads. The interleaved layout keeps consecutive groups' tiles consecutive, so a
/// kernel that computes one super-block or block of its rows per iteration can fetch the next
/// rows' bytes evenly alongside: a sweep's first token tile reads the weights from memory, and
/// this keeps those reads ahead of the kernel (measured: Gemma 3 32-stream steps about 9 %
/// shorter on the VNNI path, BENCHMARKS.md 2026-12-06). A prefetch never faults, so past the
/// matrix's end it is only wasted; it changes no value.
#[inline(always)]
pub(super) unsafe fn prefetch_part(at: *const u8, part: usize, i: usize) {
    for line in (0..part).step_by(64) {
        _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(i * part + line) as *const i8);
    }
}

/// One group of 8 interleaved rows: `nb` tiles of `tile_bytes` from `tiles`.
pub(super) struct Tiles {
    pub(super) f: Fmt32,
    pub(super) tiles: *const u8,
    pub(super) tile_bytes: usize,
}

impl<M: Mac> Blocks<Group8<M>> for Tiles {
    #[inline(always)]
    unsafe fn prefetch_next(&self, b: usize, nb: usize) {
        prefetch_part(
            self.tiles.wrapping_add(nb * self.tile_bytes),
            self.tile_bytes,
            b,
        );
    }

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
                for (i, v) in raw.iter_mut().enumerate() {
                    let bits = std::ptr::read_unaligned(masks.add(i));
                    *v = _mm256_or_si256(*v, M::fifth_bits(bits));
                }
            }
        }
        (raw, dw, mw)
    }
}
