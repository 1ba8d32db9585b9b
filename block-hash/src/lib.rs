//! The content address of a full KV block, shared by the worker's prefix cache (`engine::kv`) and the
//! router's KV-aware index (`routing`). It is a wire contract (documented in
//! `proto/inference/worker/v1/worker.proto`, message `KvCacheEvents`), so that another router can
//! compute the same chain from a prompt:
//!
//! ```text
//! hash(block i) = u64_le(SHA-256(u64_le(parent) ++ u32_le(token_0) ++ ... ++ u32_le(token_{B-1}))[0..8])
//! parent        = hash(block i - 1), or SEED (0) for block 0
//! ```
//!
//! where `B` is the worker's block size (`Info.stats.kv_block_size`) and only full blocks are
//! hashed.
//!
//! **Cache salt** (prefix-cache isolation, `AddRequest.cache_salt`): a request with a non-empty salt
//! `S` starts its chain from a salted root instead of `SEED`:
//!
//! ```text
//! parent of block 0 = u64_le(SHA-256("cache_salt\0" ++ utf8(S))[0..8])      (salted_seed)
//! ```
//!
//! so its blocks hash apart from every unsalted or differently salted prompt with the same tokens:
//! it neither hits nor can be hit by them. An empty salt is no salt (root `SEED`). SHA-256 (FIPS 180-4) is used, truncated to its first 8 bytes read little-endian, because
//! a prompt's author must not be able to make a block collide with another user's cached block (the
//! worker would reuse the wrong K/V): a second preimage of a 64-bit truncation costs ~2^64 work.
//! Equal hashes mean equal token prefixes up to that collision probability.

use sha2::{Digest, Sha256};

/// The parent hash of block 0.
pub const SEED: u64 = 0;

/// The root of the chain of a request salted with `salt`: the parent hash of its block 0 (see the
/// crate docs); [`SEED`] for the empty salt.
pub fn salted_seed(salt: &str) -> u64 {
    if salt.is_empty() {
        return SEED;
    }
    let mut sha = Sha256::new();
    sha.update(b"cache_salt\0");
    sha.update(salt.as_bytes());
    let digest = sha.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// Hash of a full block of `tokens` whose preceding blocks hash to `parent` (`None` for block 0,
/// which hashes as if its parent were [`SEED`]).
pub fn chain_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut sha = Sha256::new();
    sha.update(parent.unwrap_or(SEED).to_le_bytes());
    // One `update` for the whole block: the ids' little-endian bytes, back to back.
    let mut bytes = [0u8; 4 * 64];
    for chunk in tokens.chunks(64) {
        for (i, id) in chunk.iter().enumerate() {
            bytes[4 * i..4 * i + 4].copy_from_slice(&id.to_le_bytes());
        }
        sha.update(&bytes[..4 * chunk.len()]);
    }
    let digest = sha.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// Hashes of every full block of `tokens` (`tokens.len() / block_size` of them), chained from
/// block 0. `block_size` 0 yields no blocks.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    block_hashes_from(SEED, tokens, block_size)
}

/// Hashes of every full block of `tokens`, chained from `root` as block 0's parent ([`SEED`], or
/// [`salted_seed`] of the request's cache salt). `block_size` 0 yields no blocks.
pub fn block_hashes_from(root: u64, tokens: &[u32], block_size: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut parent = Some(root);
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
        assert!(block_hashes(&[1, 2], 0).is_empty());
    }

    /// The documented bytes, hashed by hand: pins the function so that it never changes silently
    /// (another router implements it from the proto's description).
    #[test]
    fn matches_the_documented_bytes() {
        let tokens: Vec<u32> = (0..70).map(|i| i * 1000 + 7).collect();
        let parent = 0x0123_4567_89ab_cdef_u64;
        let mut input = parent.to_le_bytes().to_vec();
        for t in &tokens {
            input.extend_from_slice(&t.to_le_bytes());
        }
        let digest = Sha256::digest(&input);
        let expected = u64::from_le_bytes(digest[..8].try_into().unwrap());
        assert_eq!(chain_hash(Some(parent), &tokens), expected);
        let root = Sha256::digest(
            [0u8; 8]
                .iter()
                .chain(&5u32.to_le_bytes())
                .copied()
                .collect::<Vec<u8>>(),
        );
        assert_eq!(
            chain_hash(None, &[5]),
            u64::from_le_bytes(root[..8].try_into().unwrap())
        );
    }

    /// A fixed vector computed outside Rust (Python's `hashlib.sha256` over 8 zero bytes then the
    /// ids 1, 2, 3, 4 as u32 little-endian, first 8 bytes read little-endian), so that any change of
    /// the function fails here.
    #[test]
    fn a_salt_changes_every_block_and_the_empty_salt_is_none() {
        let tokens: Vec<u32> = (0..8).collect();
        let plain = block_hashes(&tokens, 4);
        assert_eq!(block_hashes_from(salted_seed(""), &tokens, 4), plain);
        let a = block_hashes_from(salted_seed("tenant-a"), &tokens, 4);
        let b = block_hashes_from(salted_seed("tenant-b"), &tokens, 4);
        for i in 0..2 {
            assert!(a[i] != plain[i] && b[i] != plain[i] && a[i] != b[i]);
        }
        assert_eq!(a, block_hashes_from(salted_seed("tenant-a"), &tokens, 4));
        let mut input = b"cache_salt\0".to_vec();
        input.extend_from_slice(b"tenant-a");
        let digest = Sha256::digest(&input);
        assert_eq!(
            salted_seed("tenant-a"),
            u64::from_le_bytes(digest[..8].try_into().unwrap())
        );
    }

    #[test]
    fn known_vector() {
        assert_eq!(chain_hash(None, &[1, 2, 3, 4]), 0x3023_8dd4_b4b1_3f9c);
    }
}
