//! Weights of the 32-value block formats Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (and the k-quants Q4_K
//! and Q6_K, [`KLayout`]) re-laid out for the 8-bit activation
//! kernels of `fast` numerics: 8 rows interleaved per block, so that one 32-byte load holds the
//! same 4 codes of 8 rows ([`Interleaved8`]).
//!
//! Row-major blocks make a SIMD kernel either reduce 8 lanes per row and block (single-stream
//! decode: a `vphaddd` tree) or decode and transpose 8 rows' blocks per token tile (8 × 8 dwords)
//! before the integer multiply-adds put one row per lane. Done once at load time, the transpose
//! costs nothing per step, and the kernel runs only loads, nibble masks and `vpdpbusd` /
//! `vpmaddubsw`: the layout llama.cpp's repacked CPU GEMMs use (its `block_q4_0x8`), here with the
//! scales and codes of a block of 8 rows side by side. The bytes are the same count as the
//! original's (8 blocks' worth per tile), so a step reads no more memory.
//!
//! A tile (8 rows × one block of 32 values), in order:
//! - the 8 rows' `d` (f16, 16 bytes), then for Q4_1 and Q5_1 their `m` (f16, 16 bytes);
//! - for Q5_0 and Q5_1, the fifth bits as 8 little-endian u32 masks, mask `i` holding in bits
//!   `4r..4r + 4` the fifth bits of elements `4i..4i + 4` of row `r` (so that one mask turns into
//!   the 32 bytes of code vector `i`, see below);
//! - codes in chunks of 32 bytes, chunk `i` holding in its dword lane `r` the bytes `4i..4i + 4` of
//!   row `r`'s code bytes: for the 4- and 5-bit formats four chunks of nibble bytes (byte `j` holds
//!   element `j` in its low nibble, element `j + 16` in its high one, as in the file), so the low
//!   nibbles of chunk `i` are elements `4i..4i + 4` (code vector `i`) and the high ones elements
//!   `16 + 4i..16 + 4i + 4` (code vector `i + 4`); for Q8_0 eight chunks of the signed codes
//!   (elements `4i..4i + 4`).
//!
//! Tiles are stored group by group (rows `8g..8g + 8`), each group's `nb` blocks consecutive; a
//! last group of fewer than 8 rows is padded with zero bytes (its lanes are computed and dropped).
//! Source: llama.cpp `ggml-cpu/repack.cpp` (`make_block_q4_0x8`), read for the idea only.

use gguf::GgmlType;

/// Rows per interleaved group.
pub const GROUP_ROWS: usize = 8;

/// A matrix's blocks re-laid out 8 rows at a time (module docs); built by [`Interleaved8::new`].
#[derive(Debug, Clone)]
pub struct Interleaved8 {
    format: GgmlType,
    bytes: Vec<u8>,
    /// Blocks per row.
    nb: usize,
    /// Bytes of one tile (8 rows × one block).
    tile_bytes: usize,
}

/// Where a format's parts lie in its block: scale `d`, minimum `m` and the code bytes.
struct BlockParts {
    bytes: usize,
    min: Option<usize>,
    /// Offset of the fifth bits (a little-endian u32, bit `j` for element `j`).
    qh: Option<usize>,
    codes: usize,
    code_bytes: usize,
}

fn parts(format: GgmlType) -> Option<BlockParts> {
    Some(match format {
        GgmlType::Q4_0 => BlockParts {
            bytes: 18,
            min: None,
            qh: None,
            codes: 2,
            code_bytes: 16,
        },
        GgmlType::Q4_1 => BlockParts {
            bytes: 20,
            min: Some(2),
            qh: None,
            codes: 4,
            code_bytes: 16,
        },
        GgmlType::Q5_0 => BlockParts {
            bytes: 22,
            min: None,
            qh: Some(2),
            codes: 6,
            code_bytes: 16,
        },
        GgmlType::Q5_1 => BlockParts {
            bytes: 24,
            min: Some(2),
            qh: Some(4),
            codes: 8,
            code_bytes: 16,
        },
        GgmlType::Q8_0 => BlockParts {
            bytes: 34,
            min: None,
            qh: None,
            codes: 2,
            code_bytes: 32,
        },
        _ => return None,
    })
}

/// The k-quant layouts (super-blocks of 256 values; tile = 8 rows × one super-block):
///
/// - Q4_K (1,184 bytes, 8 × 144 + 32): `d` and `dmin` of the 8 rows (f16, 16 bytes each); the
///   6-bit scales then the mins of the 8 sub-blocks of 32 as bytes `[j][r]` (64 bytes each); the
///   nibble bytes in 32 chunks of 32, chunk `8c + i` holding in lane `r` the bytes
///   `32c + 4i..32c + 4i + 4` of row `r`'s 128 (low nibbles: elements `64c + 4i..`, sub-block
///   `2c`; high nibbles: elements `64c + 32 + 4i..`, sub-block `2c + 1`).
/// - Q6_K (2,192 bytes, 8 × 210 + 512): `d` of the 8 rows (f16, 16 bytes); the signed scales of
///   the 16 sub-blocks of 16 as bytes `[g][r]` (128 bytes); the 6-bit codes decoded to bytes
///   ([`gguf::kquant::q6_k_codes`]) in 64 chunks of 32, chunk `i` holding in lane `r` elements
///   `4i..4i + 4` of row `r`. Decoded codes cost 30 % more bytes than the file's, for these
///   tensors only, and save the kernel the 6-bit unpacking.
#[derive(Debug, Clone, Copy)]
enum KLayout {
    Q4K,
    Q6K,
}

impl KLayout {
    fn of(format: GgmlType) -> Option<KLayout> {
        match format {
            GgmlType::Q4_K => Some(KLayout::Q4K),
            GgmlType::Q6_K => Some(KLayout::Q6K),
            _ => None,
        }
    }

    /// (file bytes per super-block, tile bytes)
    fn sizes(self) -> (usize, usize) {
        match self {
            KLayout::Q4K => (144, 1184),
            KLayout::Q6K => (210, 2192),
        }
    }

    /// Row `r`'s super-block `block` into `tile`.
    fn put(self, block: &[u8], r: usize, tile: &mut [u8]) {
        let lane =
            |tile: &mut [u8], at: usize, i: usize, bytes: &[u8]| put_lane(tile, at, i, r, bytes);
        match self {
            KLayout::Q4K => {
                tile[2 * r..2 * r + 2].copy_from_slice(&block[0..2]);
                tile[16 + 2 * r..18 + 2 * r].copy_from_slice(&block[2..4]);
                for j in 0..8 {
                    let (sc, mn) = gguf::kquant::scale_min_k4(j, &block[4..16]);
                    tile[32 + 8 * j + r] = sc;
                    tile[96 + 8 * j + r] = mn;
                }
                for i in 0..32 {
                    lane(tile, 160, i, &block[16 + 4 * i..20 + 4 * i]);
                }
            }
            KLayout::Q6K => {
                tile[2 * r..2 * r + 2].copy_from_slice(&block[208..210]);
                for g in 0..16 {
                    tile[16 + 8 * g + r] = block[192 + g];
                }
                let codes = gguf::kquant::q6_k_codes(block);
                for i in 0..64 {
                    lane(tile, 144, i, &codes[4 * i..4 * i + 4]);
                }
            }
        }
    }
}

/// Dword lane `r` of the 32-byte chunk `i` of the chunks at `at` in `tile` gets the 4 `bytes`.
fn put_lane(tile: &mut [u8], at: usize, i: usize, r: usize, bytes: &[u8]) {
    let dst = at + 32 * i + 4 * r;
    tile[dst..dst + 4].copy_from_slice(bytes);
}

/// Lays `rows` encoded rows (`encoded`, each `nb` blocks of `block_bytes`) out in groups of
/// [`GROUP_ROWS`], each group's `nb` tiles of `tile_bytes` consecutive: `put(block, r, tile)`
/// writes row `r`'s block into its group's tile. Padding rows stay zero.
///
/// Panics if `encoded` is not `rows * nb` blocks.
fn build(
    format: GgmlType,
    rows: usize,
    nb: usize,
    (block_bytes, tile_bytes): (usize, usize),
    encoded: &[u8],
    put: impl Fn(&[u8], usize, &mut [u8]),
) -> Interleaved8 {
    let row_bytes = nb * block_bytes;
    assert_eq!(encoded.len(), rows * row_bytes, "interleave: wrong size");
    let groups = rows.div_ceil(GROUP_ROWS);
    let mut bytes = vec![0u8; groups * nb * tile_bytes];
    for (g, group) in bytes.chunks_exact_mut(nb * tile_bytes).enumerate() {
        for (b, tile) in group.chunks_exact_mut(tile_bytes).enumerate() {
            for r in 0..(rows - GROUP_ROWS * g).min(GROUP_ROWS) {
                let at = (GROUP_ROWS * g + r) * row_bytes + b * block_bytes;
                put(&encoded[at..at + block_bytes], r, tile);
            }
        }
    }
    Interleaved8 {
        format,
        bytes,
        nb,
        tile_bytes,
    }
}

impl BlockParts {
    /// Row `r`'s block `block` into `tile` (module docs).
    fn put(&self, block: &[u8], r: usize, tile: &mut [u8]) {
        tile[2 * r..2 * r + 2].copy_from_slice(&block[..2]);
        let mut codes_at = 16;
        if let Some(m) = self.min {
            tile[16 + 2 * r..18 + 2 * r].copy_from_slice(&block[m..m + 2]);
            codes_at = 32;
        }
        if let Some(qh) = self.qh {
            let bits = u32::from_le_bytes(block[qh..qh + 4].try_into().unwrap());
            for i in 0..8 {
                let at = codes_at + 4 * i;
                let mask = u32::from_le_bytes(tile[at..at + 4].try_into().unwrap())
                    | (((bits >> (4 * i)) & 0xF) << (4 * r));
                tile[at..at + 4].copy_from_slice(&mask.to_le_bytes());
            }
            codes_at += 32;
        }
        for i in 0..self.code_bytes / 4 {
            let src = self.codes + 4 * i;
            put_lane(tile, codes_at, i, r, &block[src..src + 4]);
        }
    }
}

impl Interleaved8 {
    /// The `rows` encoded rows `encoded` (each `cols / 32` blocks of `format`, or `cols / 256`
    /// super-blocks for the k-quants) interleaved, or
    /// `None` for a format without this layout. Takes about as long as reading the matrix once.
    ///
    /// Panics if `encoded` is not `rows` whole rows of `cols` values.
    pub fn new(format: GgmlType, rows: usize, cols: usize, encoded: &[u8]) -> Option<Interleaved8> {
        if let Some(k) = KLayout::of(format) {
            assert!(cols.is_multiple_of(256), "interleave: partial super-block");
            let put = |block: &[u8], r, tile: &mut [u8]| k.put(block, r, tile);
            return Some(build(format, rows, cols / 256, k.sizes(), encoded, put));
        }
        let p = parts(format)?;
        assert!(cols.is_multiple_of(32), "interleave: partial block");
        let sizes = (p.bytes, GROUP_ROWS * p.bytes);
        let put = |block: &[u8], r, tile: &mut [u8]| p.put(block, r, tile);
        Some(build(format, rows, cols / 32, sizes, encoded, put))
    }

    /// The format of the blocks.
    pub fn format(&self) -> GgmlType {
        self.format
    }

    /// Bytes of one tile (8 rows × one block): 8 times the format's block (more for the
    /// k-quants, see [`KLayout`]).
    pub fn tile_bytes(&self) -> usize {
        self.tile_bytes
    }

    /// Blocks (super-blocks for the k-quants) per row.
    pub fn blocks(&self) -> usize {
        self.nb
    }

    /// The `nb` tiles of groups `g0..g0 + count`, consecutive (`count * nb * tile_bytes` bytes).
    ///
    /// Panics if the groups are out of range.
    pub fn groups(&self, g0: usize, count: usize) -> &[u8] {
        let group = self.nb * self.tile_bytes;
        &self.bytes[g0 * group..(g0 + count) * group]
    }

    /// Heap bytes held.
    pub fn size_bytes(&self) -> usize {
        self.bytes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte of every row lands where the module docs say, and padding rows are zero.
    #[test]
    fn tiles_hold_each_rows_scales_and_code_dwords() {
        for format in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
        ] {
            let p = parts(format).unwrap();
            let (rows, cols) = (11, 64);
            let encoded = gguf::testing::random_encoding(format, rows * cols, 5);
            let il = Interleaved8::new(format, rows, cols, &encoded).unwrap();
            assert_eq!(il.tile_bytes(), 8 * p.bytes);
            assert_eq!(il.size_bytes(), 2 * 2 * 8 * p.bytes);
            for g in 0..2 {
                for b in 0..2 {
                    let tile = &il.groups(g, 1)[b * il.tile_bytes()..][..il.tile_bytes()];
                    for r in 0..8 {
                        let row = 8 * g + r;
                        let block = (row < rows).then(|| {
                            let at = row * 2 * p.bytes + b * p.bytes;
                            &encoded[at..at + p.bytes]
                        });
                        let want = |i: usize| block.map_or(0, |bl| bl[i]);
                        assert_eq!(tile[2 * r], want(0));
                        assert_eq!(tile[2 * r + 1], want(1));
                        let mut codes_at = if let Some(m) = p.min {
                            assert_eq!(tile[16 + 2 * r], want(m));
                            assert_eq!(tile[17 + 2 * r], want(m + 1));
                            32
                        } else {
                            16
                        };
                        if let Some(qh) = p.qh {
                            for e in 0..32 {
                                let bit = (want(qh + e / 8) >> (e % 8)) & 1;
                                let (i, k) = (e / 4, e % 4);
                                let mask = tile[codes_at + 4 * i + r / 2];
                                let got = (mask >> (4 * (r % 2) + k)) & 1;
                                assert_eq!(got, bit, "{format} g{g} b{b} r{r} element {e}");
                            }
                            codes_at += 32;
                        }
                        for j in 0..p.code_bytes {
                            let got = tile[codes_at + 32 * (j / 4) + 4 * r + j % 4];
                            assert_eq!(got, want(p.codes + j), "{format} g{g} b{b} r{r} j{j}");
                        }
                    }
                }
            }
        }
        assert!(Interleaved8::new(GgmlType::Q5_K, 1, 256, &[0; 176]).is_none());
    }

    /// The k-quant tiles: each row's scales, mins and codes where [`KLayout`] says.
    #[test]
    fn k_quant_tiles_hold_each_rows_constants_and_codes() {
        let (rows, cols) = (9, 512);
        for format in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let encoded = gguf::testing::random_encoding(format, rows * cols, 8);
            let il = Interleaved8::new(format, rows, cols, &encoded).unwrap();
            let (bytes, tb) = KLayout::of(format).unwrap().sizes();
            assert_eq!(il.size_bytes(), 2 * 2 * tb);
            for row in 0..16 {
                let (g, r) = (row / 8, row % 8);
                for b in 0..2 {
                    let tile = &il.groups(g, 1)[b * tb..(b + 1) * tb];
                    let lane =
                        |at: usize, i: usize| &tile[at + 32 * i + 4 * r..at + 32 * i + 4 * r + 4];
                    let Some(block) =
                        (row < rows).then(|| &encoded[(row * 2 + b) * bytes..][..bytes])
                    else {
                        let codes_at = if format == GgmlType::Q4_K { 160 } else { 144 };
                        assert_eq!(lane(codes_at, 1), [0; 4], "padding row {row}");
                        assert_eq!(&tile[2 * r..2 * r + 2], [0; 2], "padding row {row}");
                        continue;
                    };
                    if format == GgmlType::Q4_K {
                        assert_eq!(&tile[2 * r..2 * r + 2], &block[0..2]);
                        assert_eq!(&tile[16 + 2 * r..18 + 2 * r], &block[2..4]);
                        for j in 0..8 {
                            let (sc, mn) = gguf::kquant::scale_min_k4(j, &block[4..16]);
                            assert_eq!((tile[32 + 8 * j + r], tile[96 + 8 * j + r]), (sc, mn));
                        }
                        for i in 0..32 {
                            assert_eq!(lane(160, i), &block[16 + 4 * i..20 + 4 * i]);
                        }
                    } else {
                        assert_eq!(&tile[2 * r..2 * r + 2], &block[208..210]);
                        let codes = gguf::kquant::q6_k_codes(block);
                        for i in 0..64 {
                            assert_eq!(lane(144, i), &codes[4 * i..4 * i + 4]);
                        }
                        for g in 0..16 {
                            assert_eq!(tile[16 + 8 * g + r], block[192 + g]);
                        }
                    }
                }
            }
        }
    }
}
