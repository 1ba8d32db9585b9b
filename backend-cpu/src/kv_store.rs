//! The CPU backend's K/V store: the K/V values of the paged blocks in host memory, shared by every
//! sequence (the PagedAttention layout of Kwon et al., "Efficient Memory Management for Large
//! Language Model Serving with PagedAttention", SOSP 2023; the CUDA backend's `kv_store` holds them
//! in device memory, `engine::kv` decides which block holds what).
//!
//! The cache is a pool of `num_blocks` fixed-size blocks of `block_size` token slots. A sequence
//! owns a *block table* (kept by the engine, not here): logical block `i` of the sequence, holding
//! positions `i * block_size .. (i + 1) * block_size`, lives in physical block `block_table[i]`.
//! Position `pos` is therefore stored in slot
//! `block_table[pos / block_size] * block_size + pos % block_size`. Two sequences with a common
//! prefix can share the blocks holding it by listing the same block ids.

use super::zeroed::ZeroedPages;

/// Element type of the KV cache (setting `kv_cache_dtype`: `"f32"` or `"f16"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    /// float32: keys and values exactly as computed (the default; keeps the
    /// model's float32 behaviour).
    #[default]
    F32,
    /// IEEE float16 (round to nearest even on write, exact widening on read):
    /// half the cache memory and bandwidth; attention then sees rounded keys
    /// and values (relative error ≤ 2⁻¹¹), so greedy output may leave the
    /// float32 reference.
    F16,
}

impl KvDtype {
    /// Bytes per stored element (4 or 2).
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

/// One layer's keys or values for every slot, in the cache's element type.
#[derive(Debug, Clone)]
enum Rows {
    /// Page aligned, so with `kv_dim` and `head_dim` multiples of 16 every head row is 64-byte
    /// aligned.
    F32(ZeroedPages<f32>),
    F16(ZeroedPages<half::f16>),
}

impl Rows {
    fn zeroed(dtype: KvDtype, len: usize) -> Rows {
        match dtype {
            KvDtype::F32 => Rows::F32(ZeroedPages::new(len)),
            KvDtype::F16 => Rows::F16(ZeroedPages::new(len)),
        }
    }

    /// Elements `off..off + buf.len()` as f32: a slice of the storage for
    /// F32, else widened into `buf` (exact) and `buf` returned.
    #[inline]
    fn read<'a>(&'a self, off: usize, buf: &'a mut [f32]) -> &'a [f32] {
        match self {
            Rows::F32(v) => &v[off..off + buf.len()],
            Rows::F16(_) => {
                self.read_into(off, buf);
                buf
            }
        }
    }

    /// Elements `off..off + buf.len()` copied (widened for F16, exact) into `buf`.
    fn read_into(&self, off: usize, buf: &mut [f32]) {
        match self {
            Rows::F32(v) => buf.copy_from_slice(&v[off..off + buf.len()]),
            Rows::F16(v) => {
                use half::slice::HalfFloatSliceExt;
                v[off..off + buf.len()].convert_to_f32_slice(buf)
            }
        }
    }

    fn write(&mut self, off: usize, src: &[f32]) {
        match self {
            Rows::F32(v) => v[off..off + src.len()].copy_from_slice(src),
            Rows::F16(v) => {
                use half::slice::HalfFloatSliceExt;
                v[off..off + src.len()].convert_from_f32_slice(src)
            }
        }
    }

    fn copy_within(&mut self, src: std::ops::Range<usize>, dst: usize) {
        match self {
            Rows::F32(v) => v.copy_within(src, dst),
            Rows::F16(v) => v.copy_within(src, dst),
        }
    }

    fn to_f32(&self) -> Vec<f32> {
        match self {
            Rows::F32(v) => v.to_vec(),
            Rows::F16(v) => v.iter().map(|h| h.to_f32()).collect(),
        }
    }
}

/// Keys and values of one layer for every slot of the pool.
///
/// Both are row-major `[num_blocks, block_size, kv_dim]` (i.e. `[num_slots, kv_dim]`) in the
/// cache's [`KvDtype`]; keys have RoPE applied. Slot `s` occupies `s * kv_dim .. (s + 1) * kv_dim`.
#[derive(Debug, Clone)]
pub struct PagedLayer {
    k: Rows,
    v: Rows,
}

impl PagedLayer {
    /// Key elements `off..off + buf.len()` (of the flat `[num_slots, kv_dim]` array) as f32:
    /// borrowed from an f32 cache, widened into `buf` from an f16 one.
    #[inline]
    pub fn key_row<'a>(&'a self, off: usize, buf: &'a mut [f32]) -> &'a [f32] {
        self.k.read(off, buf)
    }

    /// As [`Self::key_row`] for values.
    #[inline]
    pub fn value_row<'a>(&'a self, off: usize, buf: &'a mut [f32]) -> &'a [f32] {
        self.v.read(off, buf)
    }

    /// All keys then all values as f32 (a copy, for tests and checks).
    pub fn to_f32(&self) -> (Vec<f32>, Vec<f32>) {
        (self.k.to_f32(), self.v.to_f32())
    }
}

/// The paged KV cache of a model: per layer, one preallocated key buffer and one value buffer of
/// `[num_blocks, block_size, kv_dim]` each, f32 or f16 ([`KvDtype`]).
///
/// Memory: `2 * n_layers * num_blocks * block_size * kv_dim * dtype.bytes()` bytes, allocated
/// zeroed up front (46 KB per token slot in f32 for SmolLM2-135M: 30 layers, `kv_dim` 192; 23 KB
/// in f16). The cache does not know which
/// slots hold data; that is the block tables' business.
#[derive(Debug, Clone)]
pub struct PagedKvCache {
    layers: Vec<PagedLayer>,
    dtype: KvDtype,
    kv_dim: usize,
    num_blocks: usize,
    block_size: usize,
}

impl PagedKvCache {
    /// A zeroed f32 pool of `num_blocks` blocks of `block_size` tokens for `n_layers` layers of
    /// width `kv_dim` (`n_kv_heads * head_dim`).
    ///
    /// Panics if `block_size` or `kv_dim` is 0, or if the buffer size overflows `usize`.
    pub fn new(
        n_layers: usize,
        kv_dim: usize,
        num_blocks: usize,
        block_size: usize,
    ) -> PagedKvCache {
        PagedKvCache::with_dtype(KvDtype::F32, n_layers, kv_dim, num_blocks, block_size)
    }

    /// As [`Self::new`] with elements of type `dtype`.
    pub fn with_dtype(
        dtype: KvDtype,
        n_layers: usize,
        kv_dim: usize,
        num_blocks: usize,
        block_size: usize,
    ) -> PagedKvCache {
        assert!(block_size > 0, "PagedKvCache: block_size must be positive");
        assert!(kv_dim > 0, "PagedKvCache: kv_dim must be positive");
        let len = num_blocks
            .checked_mul(block_size)
            .and_then(|s| s.checked_mul(kv_dim))
            .expect("PagedKvCache: size overflows usize");
        let layers = (0..n_layers)
            .map(|_| PagedLayer {
                k: Rows::zeroed(dtype, len),
                v: Rows::zeroed(dtype, len),
            })
            .collect();
        PagedKvCache {
            layers,
            dtype,
            kv_dim,
            num_blocks,
            block_size,
        }
    }

    /// Number of layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Width of one token's keys (or values) in one layer, in floats (`n_kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Number of blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Total token slots (`num_blocks * block_size`).
    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// Bytes of K/V storage held (all layers, keys and values).
    pub fn bytes(&self) -> usize {
        2 * self.layers.len() * self.num_slots() * self.kv_dim * self.dtype.bytes()
    }

    /// Bytes one token slot takes over all layers, keys and values.
    pub fn bytes_per_token(&self) -> usize {
        2 * self.layers.len() * self.kv_dim * self.dtype.bytes()
    }

    /// The storage of layer `layer`. Panics if `layer >= n_layers()`.
    pub fn layer(&self, layer: usize) -> &PagedLayer {
        &self.layers[layer]
    }

    /// The slot holding position `pos` of a sequence with `block_table`:
    /// `block_table[pos / block_size] * block_size + pos % block_size`.
    ///
    /// Panics if the table is too short for `pos`.
    pub fn slot(&self, block_table: &[u32], pos: usize) -> usize {
        block_table[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }

    /// Keys of slot `slot` in layer `layer` as f32, `[kv_dim]` (RoPE applied; a copy). Panics if
    /// out of range.
    pub fn key(&self, layer: usize, slot: usize) -> Vec<f32> {
        let mut row = vec![0.0; self.kv_dim];
        self.layers[layer].k.read_into(slot * self.kv_dim, &mut row);
        row
    }

    /// Values of slot `slot` in layer `layer` as f32, `[kv_dim]` (a copy). Panics if out of range.
    pub fn value(&self, layer: usize, slot: usize) -> Vec<f32> {
        let mut row = vec![0.0; self.kv_dim];
        self.layers[layer].v.read_into(slot * self.kv_dim, &mut row);
        row
    }

    /// The element type.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Copies every layer's keys and values of block `src` into block `dst` (copy-on-write of a
    /// shared, partly filled block). Panics if either id is `>= num_blocks()`.
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let (src, dst) = (src as usize, dst as usize);
        assert!(
            src < self.num_blocks && dst < self.num_blocks,
            "copy_block: block id out of range"
        );
        let n = self.block_size * self.kv_dim;
        for l in &mut self.layers {
            l.k.copy_within(src * n..(src + 1) * n, dst * n);
            l.v.copy_within(src * n..(src + 1) * n, dst * n);
        }
    }

    /// Writes one token's keys and values (`[kv_dim]` each) of layer `layer` into slot `slot`.
    pub(crate) fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        assert!(
            k.len() == d && v.len() == d,
            "PagedKvCache::write: row width"
        );
        let l = &mut self.layers[layer];
        l.k.write(slot * d, k);
        l.v.write(slot * d, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_slots_and_copy() {
        let mut c = PagedKvCache::new(2, 4, 3, 2);
        assert_eq!(
            (c.n_layers(), c.kv_dim(), c.num_blocks(), c.block_size()),
            (2, 4, 3, 2)
        );
        assert_eq!(c.num_slots(), 6);
        assert_eq!(c.bytes(), 2 * 2 * 6 * 4 * 4);
        assert_eq!(c.bytes_per_token(), 2 * 2 * 4 * 4);
        assert_eq!(c.layer(1).to_f32().0.len(), 24);
        // Sequence with blocks [2, 0]: positions 0,1 -> slots 4,5; 2,3 -> slots 0,1.
        let table = [2u32, 0];
        assert_eq!(
            (0..4).map(|p| c.slot(&table, p)).collect::<Vec<_>>(),
            [4, 5, 0, 1]
        );
        c.write(1, 5, &[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0]);
        assert_eq!(c.key(1, 5), &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(c.value(1, 5), &[5.0, 6.0, 7.0, 8.0]);
        assert_eq!(c.key(0, 5), &[0.0; 4]);
        c.copy_block(2, 1);
        assert_eq!(c.key(1, 3), &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(c.value(1, 3), &[5.0, 6.0, 7.0, 8.0]);
        assert_eq!(c.layer(1).to_f32().1[12..16], [5.0, 6.0, 7.0, 8.0]);
    }

    #[test]
    fn f16_rounds_on_write_and_halves_memory() {
        let mut c = PagedKvCache::with_dtype(KvDtype::F16, 1, 2, 2, 2);
        assert_eq!(c.dtype(), KvDtype::F16);
        assert_eq!(c.bytes_per_token(), 2 * 2 * 2);
        assert_eq!(c.bytes(), 2 * 4 * 2 * 2);
        let third = 1.0f32 / 3.0;
        c.write(0, 3, &[third, 65504.0], &[-2.5, 1e-8]);
        let want = half::f16::from_f32(third).to_f32();
        assert_eq!(c.key(0, 3), [want, 65504.0]);
        assert_ne!(want, third);
        assert_eq!(c.value(0, 3)[0], -2.5);
        let mut buf = [0.0; 2];
        assert_eq!(c.layer(0).key_row(6, &mut buf), &[want, 65504.0]);
        c.copy_block(1, 0);
        assert_eq!(c.key(0, 1), [want, 65504.0]);
    }
}
