//! One worker's KV block index ([`BlockIndex`]): the set of block hashes its prefix cache holds, as
//! its cache events report them, and the longest cached prefix of a prompt's block chain.
//!
//! # Memory
//!
//! A block is its 8-byte hash in an open-addressing hash set (std's SwissTable) keyed by the hash
//! itself (the hashes are already uniform, [`PassThrough`]): 8 bytes plus 1 control byte per
//! bucket, with 7/8 of the buckets usable and bucket counts powers of two, so 10.3 to 20.6 bytes per
//! block (11.8 bytes at 100k blocks: 131,072 buckets). For 1,000 workers x 100k blocks that is
//! 1.18 GB of router memory (100 M blocks). The set never holds more than the worker's KV capacity
//! in blocks (`capacity`, from its `Info`): a store beyond it is refused and counted, so a faulty
//! worker cannot grow the router without bound.
//!
//! # Events
//!
//! A snapshot replaces the whole set ([`BlockIndex::from_snapshot`]); a batch of events removes its
//! `evicted` hashes and adds its `stored` ones ([`BlockIndex::apply`]). Events that do not fit the
//! set (a store of a block already held, an evict of a block not held, a store beyond capacity) are
//! counted in [`Anomalies`] and otherwise ignored; nothing panics.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for keys that are already uniform 64-bit hashes: returns the key itself.
#[derive(Debug, Default, Clone, Copy)]
pub struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used for `u64` keys; fold anything else in (never on the hot path).
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Events that did not fit the index, by kind (counted, otherwise ignored).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Anomalies {
    /// Stores of a block the index already held (also a hash listed twice in a snapshot).
    pub duplicate_stores: u64,
    /// Evictions of a block the index did not hold (never stored, or already evicted).
    pub unknown_evicts: u64,
    /// Stores refused because the index already held the worker's capacity in blocks.
    pub over_capacity: u64,
}

impl Anomalies {
    /// All anomalies.
    pub fn total(&self) -> u64 {
        self.duplicate_stores + self.unknown_evicts + self.over_capacity
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: Anomalies) {
        self.duplicate_stores += other.duplicate_stores;
        self.unknown_evicts += other.unknown_evicts;
        self.over_capacity += other.over_capacity;
    }
}

/// The block hashes one worker's prefix cache holds, as far as its events tell.
#[derive(Debug, Clone, Default)]
pub struct BlockIndex {
    blocks: HashSet<u64, BuildHasherDefault<PassThrough>>,
    /// Most blocks held (the worker's KV capacity in blocks).
    capacity: usize,
    /// XOR of every hash held ([`BlockIndex::fingerprint`]).
    xor: u64,
}

impl BlockIndex {
    /// An empty index that holds at most `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Self {
            blocks: HashSet::default(),
            capacity,
            xor: 0,
        }
    }

    /// The index a snapshot describes: exactly `hashes` (at most `capacity` of them), with the
    /// snapshot's anomalies (hashes listed twice, hashes beyond capacity). Built without touching
    /// any live index, so that a router swaps it in at once.
    pub fn from_snapshot(capacity: usize, hashes: &[u64]) -> (Self, Anomalies) {
        let mut index = Self::new(capacity);
        index.blocks.reserve(hashes.len().min(capacity));
        let anomalies = index.apply(hashes, &[]);
        (index, anomalies)
    }

    /// Applies one batch of events: removes `evicted`, then adds `stored` (the worker reports the net
    /// change since its previous message, so the two are disjoint). Returns what did not fit.
    pub fn apply(&mut self, stored: &[u64], evicted: &[u64]) -> Anomalies {
        let mut anomalies = Anomalies::default();
        for h in evicted {
            if self.blocks.remove(h) {
                self.xor ^= h;
            } else {
                anomalies.unknown_evicts += 1;
            }
        }
        for &h in stored {
            if self.blocks.contains(&h) {
                anomalies.duplicate_stores += 1;
            } else if self.blocks.len() >= self.capacity {
                anomalies.over_capacity += 1;
            } else {
                self.blocks.insert(h);
                self.xor ^= h;
            }
        }
        anomalies
    }

    /// How many leading blocks of `chain` (a prompt's block hashes, block 0 first) the worker
    /// holds: the length of its longest cached prefix, in blocks. Stops at the first block it does
    /// not hold (the worker's cache reuses only a contiguous prefix).
    pub fn prefix_blocks(&self, chain: &[u64]) -> usize {
        chain.iter().take_while(|h| self.blocks.contains(h)).count()
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Holds no block.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Most blocks held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The XOR of every hash held, kept as events arrive: with [`BlockIndex::len`], a cheap check
    /// that two views of a cache agree (the router's metrics expose [`metric_fingerprint`] of it).
    pub fn fingerprint(&self) -> u64 {
        self.xor
    }

    /// Every hash held, sorted (for the debug view and tests).
    pub fn sorted_hashes(&self) -> Vec<u64> {
        let mut all: Vec<u64> = self.blocks.iter().copied().collect();
        all.sort_unstable();
        all
    }
}

/// The fingerprint of a cache holding `hashes` (any order): the XOR of them all, what
/// [`BlockIndex::fingerprint`] keeps for the same set.
pub fn fingerprint_of(hashes: &[u64]) -> u64 {
    hashes.iter().fold(0, |xor, h| xor ^ h)
}

/// What the router's `router_worker_kv_index_fingerprint` gauge shows for `fingerprint`: its low
/// 52 bits, which a Prometheus gauge (an f64) holds exactly. A tool or test that knows a worker's
/// cache compares `metric_fingerprint(fingerprint_of(cache))` with the gauge.
pub fn metric_fingerprint(fingerprint: u64) -> u64 {
    fingerprint & ((1 << 52) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_and_longest_prefix() {
        let (mut index, anomalies) = BlockIndex::from_snapshot(10, &[1, 2, 3]);
        assert_eq!(anomalies, Anomalies::default());
        assert_eq!(index.prefix_blocks(&[1, 2, 3, 4]), 3);
        assert_eq!(index.prefix_blocks(&[1, 9, 3]), 1, "a gap ends the prefix");
        assert_eq!(index.prefix_blocks(&[9, 1]), 0);
        assert_eq!(index.apply(&[4], &[2]), Anomalies::default());
        assert_eq!(index.prefix_blocks(&[1, 2, 3, 4]), 1);
        assert_eq!(index.sorted_hashes(), vec![1, 3, 4]);
        assert_eq!(index.fingerprint(), 1 ^ 3 ^ 4);
        assert_eq!(index.fingerprint(), fingerprint_of(&[4, 3, 1]));
    }

    #[test]
    fn the_metric_fingerprint_is_the_low_52_bits() {
        assert_eq!(metric_fingerprint(u64::MAX), (1 << 52) - 1);
        assert_eq!(metric_fingerprint(1 << 52 | 5), 5);
        assert_eq!(fingerprint_of(&[]), 0);
    }

    #[test]
    fn malformed_events_are_counted_and_change_nothing_else() {
        let (mut index, _) = BlockIndex::from_snapshot(4, &[1, 2]);
        let a = index.apply(&[2, 5], &[7, 8]);
        assert_eq!(
            a,
            Anomalies {
                duplicate_stores: 1,
                unknown_evicts: 2,
                over_capacity: 0
            }
        );
        assert_eq!(index.sorted_hashes(), vec![1, 2, 5]);
        assert_eq!(index.fingerprint(), 1 ^ 2 ^ 5);
        // Capacity 4: one more fits, the next is refused.
        let a = index.apply(&[6, 7], &[]);
        assert_eq!(a.over_capacity, 1);
        assert_eq!(index.len(), 4);
        // A snapshot listing a hash twice and beyond capacity.
        let (snap, a) = BlockIndex::from_snapshot(2, &[1, 1, 2, 3]);
        assert_eq!((a.duplicate_stores, a.over_capacity, a.total()), (1, 1, 2));
        assert_eq!(snap.sorted_hashes(), vec![1, 2]);
    }

    #[test]
    fn a_snapshot_replaces_everything() {
        let (mut index, _) = BlockIndex::from_snapshot(8, &[1, 2, 3]);
        index.apply(&[4], &[]);
        let (fresh, _) = BlockIndex::from_snapshot(8, &[]);
        index = fresh;
        assert!(index.is_empty());
        assert_eq!(index.prefix_blocks(&[1]), 0);
    }
}
