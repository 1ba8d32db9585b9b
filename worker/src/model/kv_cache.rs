//! Per-sequence key/value cache.

/// Keys and values of one layer: row-major `[len, kv_dim]` each, RoPE already
/// applied to the keys.
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    /// Keys, `len * kv_dim` floats.
    pub k: Vec<f32>,
    /// Values, `len * kv_dim` floats.
    pub v: Vec<f32>,
}

/// The KV cache of one sequence: contiguous f32 keys and values per layer,
/// grown as tokens are appended (never preallocated to the full context).
///
/// Memory: `2 * n_layers * kv_dim * 4` bytes per token (46 KB for
/// SmolLM2-135M), plus `Vec` growth slack.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub(crate) layers: Vec<LayerCache>,
    pub(crate) kv_dim: usize,
    len: usize,
}

impl KvCache {
    /// An empty cache for `n_layers` layers of width `kv_dim` (`n_kv_heads * head_dim`).
    pub fn new(n_layers: usize, kv_dim: usize) -> KvCache {
        KvCache {
            layers: vec![LayerCache::default(); n_layers],
            kv_dim,
            len: 0,
        }
    }

    /// Number of cached tokens (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every token, keeping the allocations for reuse.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Keeps the first `len` tokens (no-op if `len >= self.len()`).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for l in &mut self.layers {
            l.k.truncate(len * self.kv_dim);
            l.v.truncate(len * self.kv_dim);
        }
        self.len = len;
    }

    /// Bytes of K/V data currently held (excluding growth slack).
    pub fn bytes(&self) -> usize {
        self.len * self.kv_dim * 2 * self.layers.len() * std::mem::size_of::<f32>()
    }

    /// Marks `n` more tokens as cached; every layer must already hold their K/V.
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self
            .layers
            .iter()
            .all(|l| l.k.len() == self.len * self.kv_dim && l.v.len() == l.k.len()));
    }

    /// Drops K/V appended past `len()` (used to roll back a failed forward).
    pub(crate) fn rollback(&mut self) {
        for l in &mut self.layers {
            l.k.truncate(self.len * self.kv_dim);
            l.v.truncate(self.len * self.kv_dim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grow_truncate_clear() {
        let mut c = KvCache::new(2, 4);
        assert!(c.is_empty());
        for l in &mut c.layers {
            l.k.extend_from_slice(&[1.0; 12]);
            l.v.extend_from_slice(&[2.0; 12]);
        }
        c.commit(3);
        assert_eq!(c.len(), 3);
        assert_eq!(c.bytes(), 3 * 4 * 2 * 2 * 4);
        c.truncate(1);
        assert_eq!(c.len(), 1);
        assert_eq!(c.layers[1].v.len(), 4);
        c.clear();
        assert!(c.is_empty() && c.layers[0].k.is_empty());
    }
}
