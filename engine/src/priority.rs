//! The scheduler's two orders by request priority: which waiting sequence is admitted next
//! ([`WaitQueue`]) and which running sequence is preempted first ([`RunningSet`]).
//!
//! A [`Priority`] has the Kubernetes Gateway API Inference Extension's meaning
//! (`InferenceObjective.priority`): higher is served first, 0 is the default, and a negative priority
//! marks the request *sheddable*.
//!
//! - **Admission** takes waiting sequences by (priority descending, arrival ascending), arrival being
//!   the sequence id (ids grow with arrival). A preempted sequence goes back with its own priority
//!   and arrival, so it is readmitted ahead of everything of its class that arrived after it.
//! - **Running** sequences are kept ordered by (priority descending, admission ascending); the last
//!   one, the lowest-priority most recently admitted sequence, is the first to be preempted. With
//!   every priority equal (the default) both orders are the engine's first come first served.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use crate::scheduler::SeqId;

/// A request's scheduling priority: higher first; negative = sheddable.
pub type Priority = i32;

/// True for a sheddable priority (negative): such a running sequence may be preempted by the
/// arrival of a higher-priority one that finds no KV blocks.
pub fn is_sheddable(priority: Priority) -> bool {
    priority < 0
}

/// Waiting sequences in admission order: priority descending, then arrival (sequence id) ascending.
#[derive(Debug, Default)]
pub struct WaitQueue {
    order: BTreeSet<(Reverse<Priority>, SeqId)>,
}

impl WaitQueue {
    /// Queues `id` at its place for `priority`.
    pub fn push(&mut self, id: SeqId, priority: Priority) {
        self.order.insert((Reverse(priority), id));
    }

    /// The next sequence to admit and its priority.
    pub fn front(&self) -> Option<(SeqId, Priority)> {
        self.order.first().map(|&(Reverse(p), id)| (id, p))
    }

    /// Removes the next sequence to admit.
    pub fn pop_front(&mut self) -> Option<(SeqId, Priority)> {
        self.order.pop_first().map(|(Reverse(p), id)| (id, p))
    }

    /// Forgets `id` (no-op when it is not queued).
    pub fn remove(&mut self, id: SeqId) {
        self.order.retain(|&(_, s)| s != id);
    }

    /// Number of waiting sequences.
    pub fn len(&self) -> usize {
        self.order.len()
    }
}

/// Running sequences ordered by priority descending, then admission ascending: the last entry is
/// the first to preempt.
#[derive(Debug, Default)]
pub struct RunningSet {
    entries: Vec<(SeqId, Priority)>,
}

impl RunningSet {
    /// Adds a just admitted sequence: after every running one of its priority or higher (it is the
    /// most recently admitted of its class), before every lower one.
    pub fn admit(&mut self, id: SeqId, priority: Priority) {
        let at = self.entries.partition_point(|&(_, p)| p >= priority);
        self.entries.insert(at, (id, priority));
    }

    /// Forgets `id`; returns its priority when it was running.
    pub fn remove(&mut self, id: SeqId) -> Option<Priority> {
        let at = self.entries.iter().position(|&(s, _)| s == id)?;
        Some(self.entries.remove(at).1)
    }

    /// The sequence to preempt first (lowest priority, most recently admitted) and its priority.
    pub fn last(&self) -> Option<(SeqId, Priority)> {
        self.entries.last().copied()
    }

    /// The `i`-th running sequence in the set's order and its priority.
    pub fn at(&self, i: usize) -> Option<(SeqId, Priority)> {
        self.entries.get(i).copied()
    }

    /// Running sequences in the set's order (highest priority, earliest admitted first).
    pub fn ids(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.entries.iter().map(|&(id, _)| id)
    }

    /// Number of running sequences.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_is_by_priority_then_arrival() {
        let mut q = WaitQueue::default();
        q.push(1, 0);
        q.push(2, -1);
        q.push(3, 10);
        q.push(4, 0);
        q.push(5, 10);
        let order: Vec<_> = std::iter::from_fn(|| q.pop_front()).collect();
        assert_eq!(order, [(3, 10), (5, 10), (1, 0), (4, 0), (2, -1)]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn a_requeued_sequence_keeps_its_place_by_arrival() {
        let mut q = WaitQueue::default();
        q.push(7, 0);
        q.push(8, 0);
        q.push(3, 0); // preempted: arrived before 7 and 8
        assert_eq!(q.front(), Some((3, 0)));
        q.remove(3);
        q.remove(42);
        assert_eq!((q.front(), q.len()), (Some((7, 0)), 2));
    }

    #[test]
    fn the_lowest_priority_most_recently_admitted_is_preempted_first() {
        let mut r = RunningSet::default();
        r.admit(1, -1);
        r.admit(2, 0);
        r.admit(3, -1);
        r.admit(4, 10);
        r.admit(5, 0);
        assert_eq!(r.ids().collect::<Vec<_>>(), [4, 2, 5, 1, 3]);
        assert_eq!(r.last(), Some((3, -1)));
        assert_eq!(r.remove(3), Some(-1));
        assert_eq!(r.last(), Some((1, -1)));
        assert_eq!(r.remove(1), Some(-1));
        assert_eq!(r.last(), Some((5, 0)));
        assert_eq!(r.remove(9), None);
        assert_eq!((r.len(), r.at(0)), (3, Some((4, 10))));
        assert!(is_sheddable(-1) && !is_sheddable(0));
    }

    /// The scheduler applying both orders, stepped as the engine would (`Sim`: blocks of 16 tokens,
    /// every sequence generates until its `max_new`).
    mod in_the_scheduler {
        use crate::scheduler::tests::Sim;
        use crate::scheduler::Chunk;

        fn chunk(seq: u64, num_tokens: usize) -> Chunk {
            Chunk { seq, num_tokens }
        }

        /// Steps until every sequence finished; returns the steps taken.
        fn run_to_end(sim: &mut Sim) -> usize {
            let mut steps = 0;
            while !sim.seqs.is_empty() {
                sim.step();
                steps += 1;
                assert!(steps < 10_000, "the simulation does not end");
            }
            assert_eq!(sim.pool.stats().used, 0);
            steps
        }

        #[test]
        fn a_later_higher_priority_request_is_admitted_first() {
            let mut sim = Sim::with_blocks(512, 0, 4096);
            let low = sim.add_with_priority(300, 1, -1);
            let mid = sim.add_with_priority(300, 1, 0);
            let high = sim.add_with_priority(300, 1, 10);
            let s = sim.step();
            // The budget covers high and part of mid; low, first to arrive, waits.
            assert_eq!(s.chunks, [chunk(high, 300), chunk(mid, 212)]);
            assert!(sim.seqs[&low].blocks.is_none());
            assert_eq!(sim.scheduler.first_waiting(), Some(low));
            run_to_end(&mut sim);
        }

        #[test]
        fn a_higher_priority_arrival_sheds_the_most_recent_sheddable_sequence() {
            // 12 blocks: three sheddable 60-token prompts take 4 blocks each, the whole pool.
            let mut sim = Sim::with_blocks(512, 0, 12);
            let shed: Vec<u64> = (0..3).map(|_| sim.add_with_priority(60, 30, -1)).collect();
            sim.step();
            assert_eq!(sim.pool.num_available(), 0);
            let high = sim.add_with_priority(20, 5, 10);
            let s = sim.step();
            // The most recently admitted sheddable sequence makes room; its decode is dropped.
            assert_eq!(s.preempted, [shed[2]]);
            assert_eq!(
                s.chunks,
                [chunk(shed[0], 1), chunk(shed[1], 1), chunk(high, 20)]
            );
            assert_eq!(sim.first_token[&high], 2);
            assert_eq!(sim.scheduler.first_waiting(), Some(shed[2]));
            run_to_end(&mut sim);
            assert!(sim.first_token.contains_key(&shed[2]));
        }

        #[test]
        fn only_sheddable_sequences_below_the_arrival_are_shed() {
            for (running, arriving) in [(0, 10), (-1, -1), (-2, 0)] {
                let mut sim = Sim::with_blocks(512, 0, 12);
                for _ in 0..3 {
                    sim.add_with_priority(60, 30, running);
                }
                sim.step();
                let late = sim.add_with_priority(20, 5, arriving);
                let s = sim.step();
                if running < 0 && running < arriving {
                    assert_eq!(s.preempted.len(), 1, "{running} {arriving}");
                } else {
                    assert!(s.preempted.is_empty(), "{running} {arriving}");
                    assert!(sim.seqs[&late].blocks.is_none());
                }
                run_to_end(&mut sim);
            }
        }

        #[test]
        fn nothing_is_shed_when_shedding_could_not_make_enough_room() {
            let mut sim = Sim::with_blocks(512, 0, 12);
            let keep = sim.add_with_priority(120, 30, 0); // 8 blocks
            let shed = sim.add_with_priority(60, 30, -1); // 4 blocks
            sim.step();
            // 13 blocks: more than the sheddable 4 plus the 0 free.
            let big = sim.add_with_priority(200, 1, 10);
            let s = sim.step();
            assert!(s.preempted.is_empty());
            assert_eq!(s.chunks, [chunk(keep, 1), chunk(shed, 1)]);
            assert!(sim.seqs[&big].blocks.is_none());
        }

        #[test]
        fn a_decode_short_of_blocks_preempts_the_lowest_priority_first() {
            // 8 blocks: two 63-token prompts of 4 blocks each; the 65th token needs a fifth block.
            let mut sim = Sim::with_blocks(512, 0, 8);
            let sheddable = sim.add_with_priority(63, 10, -1);
            let normal = sim.add_with_priority(63, 10, 0);
            sim.step();
            sim.step();
            let s = sim.step();
            // The earlier admitted but sheddable sequence goes, not the later normal one.
            assert_eq!(s.preempted, [sheddable]);
            assert_eq!(s.chunks, [chunk(normal, 1)]);
            run_to_end(&mut sim);
        }
    }
}
