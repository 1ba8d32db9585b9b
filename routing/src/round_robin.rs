//! Round-robin: each request goes to the next worker with room, in address order (the baseline
//! the other policies are compared with).

use std::sync::atomic::{AtomicUsize, Ordering};

/// The turn counter of round-robin picking (shared by every request of a router).
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl RoundRobin {
    /// Index into `addresses` of the next worker with room (`has_room[i]`), taking turns in
    /// address order whatever the candidates' order; `None` when none has room.
    ///
    /// `addresses` and `has_room` have the same length.
    pub fn pick(&self, addresses: &[&str], has_room: &[bool]) -> Option<usize> {
        let mut order: Vec<usize> = (0..addresses.len()).filter(|&i| has_room[i]).collect();
        if order.is_empty() {
            return None;
        }
        order.sort_unstable_by_key(|&i| addresses[i]);
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        Some(order[turn % order.len()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_turns_over_workers_with_room() {
        let rr = RoundRobin::default();
        let addrs = ["b:1", "a:1", "c:1"];
        let picks: Vec<_> = (0..6)
            .map(|_| rr.pick(&addrs, &[true; 3]).unwrap())
            .collect();
        assert_eq!(picks, vec![1, 0, 2, 1, 0, 2]);
        assert_eq!(rr.pick(&addrs, &[false, true, false]), Some(1));
        assert_eq!(rr.pick(&addrs, &[false; 3]), None);
    }
}
