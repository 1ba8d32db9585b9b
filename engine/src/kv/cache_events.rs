//! The journal of the prefix cache's changes: which block hashes it stored and evicted since the
//! journal was last taken, reduced to the net change ([`CacheEvents`]).

use std::collections::HashMap;

/// The net change of the prefix cache over some steps: blocks it holds now and did not before
/// (`stored`), and blocks it held before and does not now (`evicted`). The two are disjoint; a block
/// stored and evicted in between (or evicted and stored again) appears in neither.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheEvents {
    /// Hashes now cached that were not, in the order they were first stored.
    pub stored: Vec<u64>,
    /// Hashes cached before that are not now, in the order they were evicted.
    pub evicted: Vec<u64>,
}

impl CacheEvents {
    /// No change.
    pub fn is_empty(&self) -> bool {
        self.stored.is_empty() && self.evicted.is_empty()
    }
}

/// Records stores and evictions in order and reduces them to their net effect when taken.
#[derive(Debug, Default)]
pub(super) struct Journal {
    /// (hash, stored) in the order they happened.
    entries: Vec<(u64, bool)>,
}

impl Journal {
    pub(super) fn stored(&mut self, hash: u64) {
        self.entries.push((hash, true));
    }

    pub(super) fn evicted(&mut self, hash: u64) {
        self.entries.push((hash, false));
    }

    /// The net change since the last call, and an empty journal.
    pub(super) fn take(&mut self) -> CacheEvents {
        // Per hash: (held before the first entry, held after the last one, position of the first).
        let mut net: HashMap<u64, (bool, bool, usize)> = HashMap::new();
        for (at, &(hash, stored)) in self.entries.iter().enumerate() {
            net.entry(hash)
                .and_modify(|e| e.1 = stored)
                .or_insert((!stored, stored, at));
        }
        let mut changes: Vec<(usize, u64, bool)> = net
            .into_iter()
            .filter(|(_, (before, after, _))| before != after)
            .map(|(hash, (_, after, at))| (at, hash, after))
            .collect();
        changes.sort_unstable();
        self.entries.clear();
        let mut events = CacheEvents::default();
        for (_, hash, now_held) in changes {
            if now_held {
                events.stored.push(hash);
            } else {
                events.evicted.push(hash);
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduces_to_the_net_change_in_order() {
        let mut j = Journal::default();
        j.stored(1);
        j.stored(2);
        j.evicted(1); // stored then evicted: no change
        j.evicted(3); // held before
        j.stored(3); // and again: no change
        j.evicted(4);
        j.stored(5);
        let e = j.take();
        assert_eq!(e.stored, vec![2, 5]);
        assert_eq!(e.evicted, vec![4]);
        assert!(j.take().is_empty());
    }
}
