//! The block pool: which physical KV blocks are free, which sequence holds which, and which full
//! blocks are cached for reuse by later prompts with the same prefix.
//!
//! - A block is *used* while at least one sequence's table holds it (reference counted: prefix
//!   sharing puts one block in several tables).
//! - A block whose count drops to 0 goes back to the free list, unless it is a cached full block: then
//!   it stays addressable by its hash and becomes *evictable*; allocation takes truly free blocks first
//!   and then evicts cached ones least-recently-used.
//! - Only full blocks whose every token has been computed are ever cached, and a sequence only writes
//!   into its own blocks past the shared prefix, so a shared block is never written (no copy-on-write).
//! - With a draft model (speculative decoding, `crate::speculation::draft`), block `i` also holds
//!   the draft model's K/V of the same positions, in the draft's own storage. The pool remembers
//!   which blocks' draft part is complete (*draft-valid*): a block taken from the free list or
//!   evicted is not; a block becomes valid once a sequence's draft has computed all its positions
//!   ([`BlockPool::set_draft_computed`]). A prefix-cache hit on draft-valid blocks spares the draft
//!   its recomputation too. The draft may fill in the draft part of a shared block that is not
//!   draft-valid: the values it writes are bitwise those every sharer would write (same tokens,
//!   same positions, batch-invariant kernels), and the target part is never touched.

use std::collections::{BTreeSet, HashMap};

use super::cache_events::{CacheEvents, Journal};
use block_hash::chain_hash;

/// Not enough free blocks for an allocation; nothing was changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("KV cache full: {needed} blocks needed, {available} available")]
pub struct NoFreeBlocks {
    /// Blocks the request needed (including the watermark).
    pub needed: usize,
    /// Blocks that could have been had (free plus evictable).
    pub available: usize,
}

/// One sequence's block table. Returned to the pool with [`BlockPool::release`].
#[derive(Debug)]
pub struct SequenceBlocks {
    table: Vec<u32>,
    /// Leading blocks already hashed (registered in the prefix cache or matched from it).
    hashed: usize,
    /// Hash of block `hashed - 1`, or the chain's root (block 0's parent) while `hashed` is 0.
    parent: u64,
    /// Leading positions whose draft-model K/V is in the blocks (speculative decoding with a draft
    /// model; 0 without one).
    draft_computed: usize,
}

impl SequenceBlocks {
    /// Physical block ids; block `i` holds positions `i * block_size .. (i + 1) * block_size`.
    pub fn table(&self) -> &[u32] {
        &self.table
    }
}

/// Counters of the pool, in blocks unless noted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlockPoolStats {
    /// All blocks.
    pub total: usize,
    /// Blocks held by at least one sequence.
    pub used: usize,
    /// Blocks that can be allocated (never used, or cached and evictable).
    pub free: usize,
    /// Blocks currently addressable in the prefix cache (used or evictable).
    pub cached: usize,
    /// Prompt tokens looked up in the prefix cache.
    pub query_tokens: u64,
    /// Prompt tokens found in the prefix cache (not recomputed).
    pub hit_tokens: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
}

/// The pool of KV blocks.
#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    prefix_caching: bool,
    ref_counts: Vec<u32>,
    /// Hash of each block registered in the prefix cache.
    block_hash: Vec<Option<u64>>,
    /// Whether each block's draft-model part holds all its positions (see the module docs).
    draft_valid: Vec<bool>,
    /// Last release tick of each evictable block (its key in `evictable`).
    released_at: Vec<u64>,
    /// Blocks with no references and no hash.
    free: Vec<u32>,
    /// Cached blocks with no references, by (release tick, block): first = least recently used.
    evictable: BTreeSet<(u64, u32)>,
    /// Prefix cache: hash -> block.
    cached: HashMap<u64, u32>,
    /// Stores and evictions of the prefix cache since [`BlockPool::take_cache_events`].
    journal: Journal,
    tick: u64,
    query_tokens: u64,
    hit_tokens: u64,
    evictions: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks of `block_size` tokens each.
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        Self {
            block_size,
            prefix_caching,
            ref_counts: vec![0; num_blocks],
            block_hash: vec![None; num_blocks],
            draft_valid: vec![false; num_blocks],
            released_at: vec![0; num_blocks],
            free: (0..num_blocks as u32).rev().collect(),
            evictable: BTreeSet::new(),
            cached: HashMap::new(),
            journal: Journal::default(),
            tick: 0,
            query_tokens: 0,
            hit_tokens: 0,
            evictions: 0,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Total number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks that an allocation can take now (free plus evictable).
    pub fn num_available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Allocates a table for a sequence whose known tokens are `tokens` (its prompt, or prompt plus
    /// generated tokens when it resumes after a preemption), reusing cached leading blocks of the
    /// chain rooted at `root` (block 0's parent hash: `block_hash::SEED`, or the salted seed of the
    /// request's cache salt, so that only requests of the same salt share blocks).
    ///
    /// Returns the table and how many leading tokens are already computed (a multiple of the block
    /// size, always less than `tokens.len()` so that the last token is computed and yields logits,
    /// and at most `reusable`: the positions from `reusable` on must be computed, e.g. because
    /// their logits are wanted). `reserve` extra blocks must stay available afterwards (the
    /// admission watermark).
    ///
    /// Errors: [`NoFreeBlocks`] when the blocks (plus `reserve`) are not available; nothing changes.
    pub fn allocate(
        &mut self,
        tokens: &[u32],
        root: u64,
        reusable: usize,
        reserve: usize,
    ) -> Result<(SequenceBlocks, usize), NoFreeBlocks> {
        let needed_total = self.blocks_for(tokens.len());
        let lookup = &tokens[..reusable.saturating_add(1).min(tokens.len())];
        let hits = self.cached_prefix(lookup, root);
        let evictable_hits = hits
            .iter()
            .filter(|&&(_, b)| self.ref_counts[b as usize] == 0)
            .count();
        let available = self.num_available() - evictable_hits;
        let needed = needed_total - hits.len() + reserve;
        if needed > available {
            return Err(NoFreeBlocks { needed, available });
        }
        let mut seq = SequenceBlocks {
            table: Vec::with_capacity(needed_total),
            hashed: 0,
            parent: root,
            draft_computed: 0,
        };
        for &(hash, block) in &hits {
            self.take_ref(block);
            seq.table.push(block);
            seq.parent = hash;
        }
        seq.hashed = hits.len();
        while seq.table.len() < needed_total {
            let block = self.pop_free().expect("availability checked above");
            seq.table.push(block);
        }
        let computed = hits.len() * self.block_size;
        if self.prefix_caching {
            self.query_tokens += tokens.len() as u64;
            self.hit_tokens += computed as u64;
        }
        Ok((seq, computed))
    }

    /// Grows `seq`'s table to hold `num_tokens` tokens.
    ///
    /// Errors: [`NoFreeBlocks`] when a needed block is not available; nothing changes.
    pub fn ensure_capacity(
        &mut self,
        seq: &mut SequenceBlocks,
        num_tokens: usize,
    ) -> Result<(), NoFreeBlocks> {
        let needed = self.blocks_for(num_tokens).saturating_sub(seq.table.len());
        if needed > self.num_available() {
            return Err(NoFreeBlocks {
                needed,
                available: self.num_available(),
            });
        }
        for _ in 0..needed {
            let block = self.pop_free().expect("availability checked above");
            seq.table.push(block);
        }
        Ok(())
    }

    /// Grows `seq`'s table towards `num_tokens` tokens with truly free blocks only (never evicting a
    /// cached block, so speculative room never changes the prefix cache) and returns the tokens the
    /// table holds afterwards (at least its old capacity, at most what `num_tokens` needs).
    pub fn grow_from_free(&mut self, seq: &mut SequenceBlocks, num_tokens: usize) -> usize {
        while seq.table.len() < self.blocks_for(num_tokens) {
            let Some(block) = self.free.pop() else {
                break;
            };
            self.ref_counts[block as usize] = 1;
            self.draft_valid[block as usize] = false;
            seq.table.push(block);
        }
        seq.table.len() * self.block_size
    }

    /// Leading positions of `seq` whose draft-model K/V is in its blocks: what its own draft
    /// computed, extended over following full blocks that are draft-valid (filled by a sharer).
    pub fn draft_computed(&self, seq: &SequenceBlocks) -> usize {
        let own = self.draft_valid_prefix(seq, seq.draft_computed);
        own.max(self.draft_valid_prefix(seq, 0))
    }

    /// Records that `seq`'s draft model has computed its first `positions` positions (the caller
    /// passes at most its computed committed tokens), and marks the blocks they fill draft-valid.
    pub fn set_draft_computed(&mut self, seq: &mut SequenceBlocks, positions: usize) {
        let full = (positions / self.block_size).min(seq.table.len());
        for &block in &seq.table[..full] {
            self.draft_valid[block as usize] = true;
        }
        seq.draft_computed = positions;
    }

    /// `from` extended by whole draft-valid blocks of `seq` while it ends a block.
    fn draft_valid_prefix(&self, seq: &SequenceBlocks, from: usize) -> usize {
        let mut n = from;
        while n.is_multiple_of(self.block_size)
            && seq
                .table
                .get(n / self.block_size)
                .is_some_and(|&b| self.draft_valid[b as usize])
        {
            n += self.block_size;
        }
        n
    }

    /// Shrinks `seq`'s table to the blocks that `num_tokens` tokens need, returning the tail blocks
    /// to the free list last-allocated first (undoing [`BlockPool::grow_from_free`]). The tail must
    /// hold no hashed block: only blocks past the computed tokens are cut (rejected speculative
    /// positions), and those are never full of computed tokens.
    pub fn truncate(&mut self, seq: &mut SequenceBlocks, num_tokens: usize) {
        let keep = self.blocks_for(num_tokens);
        debug_assert!(seq.hashed <= keep, "truncating a hashed block");
        while seq.table.len() > keep {
            let block = seq.table.pop().expect("len > keep");
            let b = block as usize;
            self.ref_counts[b] -= 1;
            if self.ref_counts[b] == 0 {
                self.free.push(block);
            }
        }
    }

    /// Registers in the prefix cache every full block of `seq` whose tokens are all computed.
    /// `tokens` are the sequence's known tokens; `computed` how many have K/V in the cache.
    pub fn register_full_blocks(
        &mut self,
        seq: &mut SequenceBlocks,
        tokens: &[u32],
        computed: usize,
    ) {
        if !self.prefix_caching {
            return;
        }
        let full = (computed.min(tokens.len()) / self.block_size).min(seq.table.len());
        while seq.hashed < full {
            let i = seq.hashed;
            let block_tokens = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let hash = chain_hash(Some(seq.parent), block_tokens);
            let block = seq.table[i];
            if self.block_hash[block as usize].is_none() && !self.cached.contains_key(&hash) {
                self.cached.insert(hash, block);
                self.block_hash[block as usize] = Some(hash);
                self.journal.stored(hash);
            }
            seq.hashed += 1;
            seq.parent = hash;
        }
    }

    /// Returns `seq`'s blocks to the pool. Cached blocks become evictable, tail blocks first (so a
    /// shared prefix outlives the suffixes that hang off it).
    pub fn release(&mut self, seq: SequenceBlocks) {
        for &block in seq.table.iter().rev() {
            let b = block as usize;
            debug_assert!(self.ref_counts[b] > 0, "double free of block {block}");
            self.ref_counts[b] -= 1;
            if self.ref_counts[b] > 0 {
                continue;
            }
            if self.block_hash[b].is_some() {
                self.tick += 1;
                self.released_at[b] = self.tick;
                self.evictable.insert((self.tick, block));
            } else {
                self.free.push(block);
            }
        }
    }

    /// The pool's counters.
    pub fn stats(&self) -> BlockPoolStats {
        let used = self.ref_counts.iter().filter(|&&r| r > 0).count();
        BlockPoolStats {
            total: self.num_blocks(),
            used,
            free: self.num_available(),
            cached: self.cached.len(),
            query_tokens: self.query_tokens,
            hit_tokens: self.hit_tokens,
            evictions: self.evictions,
        }
    }

    /// The prefix cache's net change since the last call (stored and evicted block hashes).
    pub fn take_cache_events(&mut self) -> CacheEvents {
        self.journal.take()
    }

    /// Every block hash the prefix cache holds now (used and evictable), in no particular order.
    pub fn cached_hashes(&self) -> Vec<u64> {
        self.cached.keys().copied().collect()
    }

    /// Cached leading full blocks of `tokens` in the chain rooted at `root`, as (hash, block); at
    /// most `(len - 1) / block_size` so that at least one token is left to compute.
    fn cached_prefix(&self, tokens: &[u32], root: u64) -> Vec<(u64, u32)> {
        if !self.prefix_caching || tokens.is_empty() {
            return Vec::new();
        }
        let max_blocks = (tokens.len() - 1) / self.block_size;
        let mut hits = Vec::new();
        let mut parent = root;
        for block_tokens in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let hash = chain_hash(Some(parent), block_tokens);
            match self.cached.get(&hash) {
                Some(&block) => hits.push((hash, block)),
                None => break,
            }
            parent = hash;
        }
        hits
    }

    fn take_ref(&mut self, block: u32) {
        let b = block as usize;
        if self.ref_counts[b] == 0 {
            self.evictable.remove(&(self.released_at[b], block));
        }
        self.ref_counts[b] += 1;
    }

    /// A block with no references and no hash: a free one, else the least recently used cached one.
    fn pop_free(&mut self) -> Option<u32> {
        let block = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, block) = self.evictable.pop_first()?;
                if let Some(hash) = self.block_hash[block as usize].take() {
                    self.cached.remove(&hash);
                    self.journal.evicted(hash);
                }
                self.evictions += 1;
                block
            }
        };
        self.ref_counts[block as usize] = 1;
        self.draft_valid[block as usize] = false;
        Some(block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use block_hash::SEED;
    use rand::{Rng, SeedableRng};

    fn toks(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    #[test]
    fn allocate_grow_release() {
        let mut pool = BlockPool::new(8, 4, false);
        let (mut seq, computed) = pool.allocate(&toks(5, 0), SEED, usize::MAX, 0).unwrap();
        assert_eq!((seq.table().len(), computed), (2, 0));
        pool.ensure_capacity(&mut seq, 9).unwrap();
        assert_eq!(seq.table().len(), 3);
        assert_eq!(pool.stats().used, 3);
        assert_eq!(
            pool.ensure_capacity(&mut seq, 40),
            Err(NoFreeBlocks {
                needed: 7,
                available: 5
            })
        );
        pool.release(seq);
        assert_eq!(pool.stats().free, 8);
        assert_eq!(pool.stats().used, 0);
    }

    #[test]
    fn watermark_and_failure_change_nothing() {
        let mut pool = BlockPool::new(4, 4, true);
        let err = pool
            .allocate(&toks(13, 0), SEED, usize::MAX, 1)
            .unwrap_err();
        assert_eq!(
            err,
            NoFreeBlocks {
                needed: 5,
                available: 4
            }
        );
        assert_eq!(pool.stats().free, 4);
        assert!(pool.allocate(&toks(12, 0), SEED, usize::MAX, 1).is_ok());
    }

    #[test]
    fn prefix_blocks_are_shared_and_last_token_recomputed() {
        let mut pool = BlockPool::new(16, 4, true);
        let prompt = toks(10, 1);
        let (mut a, computed) = pool.allocate(&prompt, SEED, usize::MAX, 0).unwrap();
        assert_eq!(computed, 0);
        pool.register_full_blocks(&mut a, &prompt, 10);
        assert_eq!(pool.stats().cached, 2);
        // Same first 8 tokens, different tail: shares 2 blocks.
        let mut other = prompt[..8].to_vec();
        other.extend([500, 501, 502]);
        let (b, computed) = pool.allocate(&other, SEED, usize::MAX, 0).unwrap();
        assert_eq!(computed, 8);
        assert_eq!(b.table()[..2], a.table()[..2]);
        assert_ne!(b.table()[2], a.table()[2]);
        // A prompt of exactly the 8 cached tokens reuses only the first block.
        let (c, computed) = pool.allocate(&prompt[..8], SEED, usize::MAX, 0).unwrap();
        assert_eq!(computed, 4);
        assert_eq!(c.table()[0], a.table()[0]);
        assert_ne!(c.table()[1], a.table()[1]);
        let stats = pool.stats();
        assert_eq!((stats.query_tokens, stats.hit_tokens), (10 + 11 + 8, 12));
        for s in [a, b, c] {
            pool.release(s);
        }
        assert_eq!(pool.stats().used, 0);
        assert_eq!(pool.stats().free, 16);
    }

    #[test]
    fn evicts_least_recently_released_cached_blocks_tails_first() {
        let mut pool = BlockPool::new(4, 2, true);
        let p = toks(4, 3);
        let (mut a, _) = pool.allocate(&p, SEED, usize::MAX, 0).unwrap();
        pool.register_full_blocks(&mut a, &p, 4);
        let first = a.table()[0];
        pool.release(a);
        assert_eq!(pool.stats().cached, 2);
        // Needs 3 blocks: 2 free ones, then evicts the tail block of `p`, keeping its first block.
        let (d, _) = pool.allocate(&toks(6, 100), SEED, usize::MAX, 0).unwrap();
        assert_eq!(pool.stats().evictions, 1);
        assert!(!d.table().contains(&first));
        pool.release(d);
        let (e, computed) = pool.allocate(&p, SEED, usize::MAX, 0).unwrap();
        assert_eq!(computed, 2, "the root block survived");
        assert_eq!(e.table()[0], first);
        pool.release(e);
        assert_eq!(pool.stats().free, 4);
    }

    #[test]
    fn caching_off_never_shares() {
        let mut pool = BlockPool::new(8, 2, false);
        let p = toks(5, 0);
        let (mut a, _) = pool.allocate(&p, SEED, usize::MAX, 0).unwrap();
        pool.register_full_blocks(&mut a, &p, 5);
        let (b, computed) = pool.allocate(&p, SEED, usize::MAX, 0).unwrap();
        assert_eq!(computed, 0);
        assert!(a.table().iter().all(|x| !b.table().contains(x)));
        pool.release(a);
        pool.release(b);
        assert_eq!(pool.stats().free, 8);
    }

    /// Property: under random admissions, growth, completions and cancellations with shared
    /// prefixes, reference counts stay consistent, every block comes back, and the journal of
    /// stores and evictions replayed on an empty set equals the prefix cache at every step.
    #[test]
    fn no_leak_under_random_traffic() {
        for seed in 0..20u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut pool = BlockPool::new(32, 4, seed % 2 == 0);
            let mut live: Vec<(SequenceBlocks, Vec<u32>)> = Vec::new();
            // What a router learns from the journal: must equal the cache after every step.
            let mut mirror = std::collections::BTreeSet::new();
            for _ in 0..400 {
                match rng.random_range(0..4) {
                    0 | 1 => {
                        let shared = rng.random_range(0..3u32);
                        let mut t = toks(rng.random_range(1..12), shared);
                        t.truncate(rng.random_range(1..=t.len()));
                        if let Ok((mut s, computed)) = pool.allocate(&t, SEED, usize::MAX, 1) {
                            assert!(computed < t.len());
                            pool.register_full_blocks(&mut s, &t, t.len());
                            live.push((s, t));
                        }
                    }
                    2 if !live.is_empty() => {
                        let i = rng.random_range(0..live.len());
                        let (s, t) = &mut live[i];
                        t.push(rng.random_range(0..50));
                        if pool.ensure_capacity(s, t.len()).is_ok() {
                            pool.register_full_blocks(s, t, t.len());
                        } else {
                            let (s, _) = live.swap_remove(i);
                            pool.release(s);
                        }
                    }
                    _ if !live.is_empty() => {
                        let i = rng.random_range(0..live.len());
                        let (s, _) = live.swap_remove(i);
                        pool.release(s);
                    }
                    _ => {}
                }
                let events = pool.take_cache_events();
                for h in &events.evicted {
                    assert!(
                        mirror.remove(h),
                        "seed {seed}: evicted {h} was never stored"
                    );
                }
                for &h in &events.stored {
                    assert!(mirror.insert(h), "seed {seed}: stored {h} twice");
                }
                let mut now: Vec<u64> = pool.cached_hashes();
                now.sort_unstable();
                assert_eq!(
                    now,
                    mirror.iter().copied().collect::<Vec<_>>(),
                    "seed {seed}"
                );
                let held: usize = live.iter().map(|(s, _)| s.table().len()).sum();
                let refs: u32 = pool.ref_counts.iter().sum();
                assert_eq!(refs as usize, held, "seed {seed}");
                assert_eq!(pool.stats().used + pool.stats().free, 32, "seed {seed}");
            }
            for (s, _) in live.drain(..) {
                pool.release(s);
            }
            assert_eq!(pool.stats().free, 32, "seed {seed}");
            assert_eq!(pool.stats().used, 0, "seed {seed}");
        }
    }
}
