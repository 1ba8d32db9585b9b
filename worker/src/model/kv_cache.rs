//! Paged key/value storage shared by every sequence (the PagedAttention layout of
//! Kwon et al., "Efficient Memory Management for Large Language Model Serving with
//! PagedAttention", SOSP 2023).
//!
//! The cache is a pool of `num_blocks` fixed-size blocks of `block_size` token slots. A sequence
//! owns a *block table* (kept by the engine, not here): logical block `i` of the sequence, holding
//! positions `i * block_size .. (i + 1) * block_size`, lives in physical block `block_table[i]`.
//! Position `pos` is therefore stored in slot
//! `block_table[pos / block_size] * block_size + pos % block_size`. Two sequences with a common
//! prefix can share the blocks holding it by listing the same block ids.

/// Keys and values of one layer for every slot of the pool.
///
/// Both are row-major `[num_blocks, block_size, kv_dim]` f32 (i.e. `[num_slots, kv_dim]`); keys
/// have RoPE applied. Slot `s` occupies `s * kv_dim .. (s + 1) * kv_dim`.
#[derive(Debug, Clone)]
pub struct PagedLayer {
    k: Vec<f32>,
    v: Vec<f32>,
}

impl PagedLayer {
    /// All keys, `[num_blocks * block_size, kv_dim]` row-major.
    pub fn keys(&self) -> &[f32] {
        &self.k
    }

    /// All values, `[num_blocks * block_size, kv_dim]` row-major.
    pub fn values(&self) -> &[f32] {
        &self.v
    }
}

/// The paged KV cache of a model: per layer, one preallocated key buffer and one value buffer of
/// `[num_blocks, block_size, kv_dim]` f32 each.
///
/// Memory: `2 * n_layers * num_blocks * block_size * kv_dim * 4` bytes, allocated zeroed up front
/// (46 KB per token slot for SmolLM2-135M: 30 layers, `kv_dim` 192). The cache does not know which
/// slots hold data; that is the block tables' business.
#[derive(Debug, Clone)]
pub struct PagedKvCache {
    layers: Vec<PagedLayer>,
    kv_dim: usize,
    num_blocks: usize,
    block_size: usize,
}

impl PagedKvCache {
    /// A zeroed pool of `num_blocks` blocks of `block_size` tokens for `n_layers` layers of width
    /// `kv_dim` (`n_kv_heads * head_dim`).
    ///
    /// Panics if `block_size` or `kv_dim` is 0, or if the buffer size overflows `usize`.
    pub fn new(
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
                k: vec![0.0; len],
                v: vec![0.0; len],
            })
            .collect();
        PagedKvCache {
            layers,
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
        2 * self.layers.len() * self.num_slots() * self.kv_dim * std::mem::size_of::<f32>()
    }

    /// Bytes one token slot takes over all layers, keys and values.
    pub fn bytes_per_token(&self) -> usize {
        2 * self.layers.len() * self.kv_dim * std::mem::size_of::<f32>()
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

    /// Keys of slot `slot` in layer `layer`, `[kv_dim]` (RoPE applied). Panics if out of range.
    pub fn key(&self, layer: usize, slot: usize) -> &[f32] {
        &self.layers[layer].k[slot * self.kv_dim..(slot + 1) * self.kv_dim]
    }

    /// Values of slot `slot` in layer `layer`, `[kv_dim]`. Panics if out of range.
    pub fn value(&self, layer: usize, slot: usize) -> &[f32] {
        &self.layers[layer].v[slot * self.kv_dim..(slot + 1) * self.kv_dim]
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
        let l = &mut self.layers[layer];
        l.k[slot * d..(slot + 1) * d].copy_from_slice(k);
        l.v[slot * d..(slot + 1) * d].copy_from_slice(v);
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
        assert_eq!(c.layer(1).keys().len(), 24);
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
        assert_eq!(c.layer(1).values()[12..16], [5.0, 6.0, 7.0, 8.0]);
    }
}
