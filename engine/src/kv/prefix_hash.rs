//! Content addresses of full KV blocks: `hash(parent block's hash, this block's token ids)`, so equal
//! hashes mean equal token prefixes (up to hash collisions, which 64-bit SipHash makes negligible).

use std::hash::{Hash, Hasher};

/// Hash of a full block of `tokens` whose preceding blocks hash to `parent` (`None` for block 0).
///
/// Uses SipHash-1-3 with fixed keys (`std::hash::DefaultHasher::new()`), stable within a process.
pub fn chain_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// Hashes of every full block of `tokens` (`tokens.len() / block_size` of them), chained from block 0.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut parent = None;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            let h = chain_hash(parent, block);
            parent = Some(h);
            h
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_the_whole_prefix() {
        let a = block_hashes(&[1, 2, 3, 4, 5, 6, 7], 2);
        let b = block_hashes(&[1, 2, 3, 4, 9, 9], 2);
        let c = block_hashes(&[0, 2, 3, 4], 2);
        assert_eq!(a.len(), 3);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // Same tokens in block 1 but a different block 0: different hash.
        assert_ne!(a[1], c[1]);
        assert_eq!(a[0], chain_hash(None, &[1, 2]));
        assert_eq!(a[1], chain_hash(Some(a[0]), &[3, 4]));
    }
}
