//! The scheduler's two orders by request priority: which waiting sequence is admitted next
//! ([`WaitQueue`]) and which running sequence is preempted first ([`RunningSet`]).
//!
//! A [`Priority`] has the Kubernetes Gateway API Inference Extension's meaning
//! (`InferenceObjective.priority`): higher is served first, 0 is the default, and a negative priority
//! marks the request *sheddable*.
//!
//! - **Admission** takes waiting sequences by (priority descending, tenant's fair-share rank,
//!   arrival ascending), arrival being the sequence id (ids grow with arrival); with one tenant
//!   (the default) that is (priority, arrival). A preempted sequence goes back with its own priority
//!   and arrival, so it is readmitted ahead of everything of its class that arrived after it.
//! - **Running** sequences are kept ordered by (priority descending, admission ascending); the last
//!   one, the lowest-priority most recently admitted sequence, is the first to be preempted. With
//!   every priority equal (the default) both orders are the engine's first come first served.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::Arc;

/// A request's scheduling priority: higher first; negative = sheddable.
pub type Priority = i32;

/// True for a sheddable priority (negative): such a running sequence may be preempted by the
/// arrival of a higher-priority one that finds no KV blocks.
pub fn is_sheddable(priority: Priority) -> bool {
    priority < 0
}

/// Waiting sequences in admission order: priority descending, then, inside a priority class, the
/// tenant served first by fair share (a rank the caller supplies: [`crate::tenant_share`]), then
/// arrival ascending (sequence ids, `Id`, grow with arrival).
#[derive(Debug)]
pub struct WaitQueue<Id> {
    classes: BTreeMap<Reverse<Priority>, BTreeMap<Arc<str>, BTreeSet<Id>>>,
    places: HashMap<Id, (Priority, Arc<str>)>,
}

impl<Id> Default for WaitQueue<Id> {
    fn default() -> Self {
        Self {
            classes: BTreeMap::new(),
            places: HashMap::new(),
        }
    }
}

impl<Id: Ord + Hash + Copy> WaitQueue<Id> {
    /// Queues `id` of `tenant` at its place for `priority` (a no-op when it is already queued).
    pub fn push(&mut self, id: Id, priority: Priority, tenant: Arc<str>) {
        if self.places.contains_key(&id) {
            return;
        }
        self.classes
            .entry(Reverse(priority))
            .or_default()
            .entry(tenant.clone())
            .or_default()
            .insert(id);
        self.places.insert(id, (priority, tenant));
    }

    /// The next sequence to admit and its priority: of the highest class, the oldest of the
    /// tenant with the least `rank` (ties: the oldest head).
    pub fn front(&self, rank: impl Fn(&str) -> usize) -> Option<(Id, Priority)> {
        let (&Reverse(priority), tenants) = self.classes.first_key_value()?;
        tenants
            .iter()
            .filter_map(|(t, ids)| Some((rank(t), *ids.first()?)))
            .min()
            .map(|(_, id)| (id, priority))
    }

    /// Removes the next sequence to admit (the one [`Self::front`] shows for `rank`).
    #[cfg(test)]
    pub fn pop_front(&mut self, rank: impl Fn(&str) -> usize) -> Option<(Id, Priority)> {
        let front = self.front(rank)?;
        self.remove(front.0);
        Some(front)
    }

    /// Forgets `id`; returns its priority (`None`, a no-op, when it is not queued).
    pub fn remove(&mut self, id: Id) -> Option<Priority> {
        let (priority, tenant) = self.places.remove(&id)?;
        let class = self
            .classes
            .get_mut(&Reverse(priority))
            .expect("placed class");
        let ids = class.get_mut(&tenant).expect("placed tenant");
        ids.remove(&id);
        if ids.is_empty() {
            class.remove(&tenant);
            if class.is_empty() {
                self.classes.remove(&Reverse(priority));
            }
        }
        Some(priority)
    }

    /// Number of waiting sequences.
    pub fn len(&self) -> usize {
        self.places.len()
    }
}

/// Running sequences ordered by priority descending, then admission ascending: the last entry is
/// the first to preempt.
#[derive(Debug)]
pub struct RunningSet<Id> {
    entries: Vec<(Id, Priority)>,
}

impl<Id> Default for RunningSet<Id> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<Id: Eq + Copy> RunningSet<Id> {
    /// Adds a just admitted sequence: after every running one of its priority or higher (it is the
    /// most recently admitted of its class), before every lower one.
    pub fn admit(&mut self, id: Id, priority: Priority) {
        let at = self.entries.partition_point(|&(_, p)| p >= priority);
        self.entries.insert(at, (id, priority));
    }

    /// Forgets `id`; returns its priority when it was running.
    pub fn remove(&mut self, id: Id) -> Option<Priority> {
        let at = self.entries.iter().position(|&(s, _)| s == id)?;
        Some(self.entries.remove(at).1)
    }

    /// The sequence to preempt first (lowest priority, most recently admitted) and its priority.
    pub fn last(&self) -> Option<(Id, Priority)> {
        self.entries.last().copied()
    }

    /// The `i`-th running sequence in the set's order and its priority.
    pub fn at(&self, i: usize) -> Option<(Id, Priority)> {
        self.entries.get(i).copied()
    }

    /// Running sequences and their priorities, in the set's order (highest priority, earliest
    /// admitted first).
    pub fn iter(&self) -> impl Iterator<Item = (Id, Priority)> + '_ {
        self.entries.iter().copied()
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
        let t: Arc<str> = "t".into();
        for (id, p) in [(1, 0), (2, -1), (3, 10), (4, 0), (5, 10)] {
            q.push(id, p, t.clone());
        }
        q.push(4, 0, t.clone()); // already queued: no-op
        let order: Vec<_> = std::iter::from_fn(|| q.pop_front(|_| 0)).collect();
        assert_eq!(order, [(3, 10), (5, 10), (1, 0), (4, 0), (2, -1)]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn a_requeued_sequence_keeps_its_place_by_arrival() {
        let mut q = WaitQueue::default();
        let t: Arc<str> = "t".into();
        q.push(7, 0, t.clone());
        q.push(8, 0, t.clone());
        q.push(3, 0, t); // preempted: arrived before 7 and 8
        assert_eq!(q.front(|_| 0), Some((3, 0)));
        q.remove(3);
        q.remove(42);
        assert_eq!((q.front(|_| 0), q.len()), (Some((7, 0)), 2));
    }

    #[test]
    fn inside_a_class_the_tenant_ranked_first_goes_first() {
        let mut q = WaitQueue::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        for id in 1..=4 {
            q.push(id, 0, a.clone());
        }
        q.push(5, 0, b.clone());
        q.push(6, -1, b.clone());
        let b_first = |t: &str| usize::from(t != "b");
        assert_eq!(q.front(b_first), Some((5, 0)));
        assert_eq!(q.front(|t| usize::from(t != "a")), Some((1, 0)));
        // Equal ranks: the oldest head.
        assert_eq!(q.front(|_| 0), Some((1, 0)));
        assert_eq!(q.pop_front(b_first), Some((5, 0)));
        // b has nothing left in class 0: a's oldest, and the sheddable one only at the end.
        let order: Vec<_> = std::iter::from_fn(|| q.pop_front(b_first)).collect();
        assert_eq!(order, [(1, 0), (2, 0), (3, 0), (4, 0), (6, -1)]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn the_lowest_priority_most_recently_admitted_is_preempted_first() {
        let mut r = RunningSet::default();
        r.admit(1, -1);
        r.admit(2, 0);
        r.admit(3, -1);
        r.admit(4, 10);
        r.admit(5, 0);
        assert_eq!(
            r.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            [4, 2, 5, 1, 3]
        );
        assert_eq!(r.last(), Some((3, -1)));
        assert_eq!(r.remove(3), Some(-1));
        assert_eq!(r.last(), Some((1, -1)));
        assert_eq!(r.remove(1), Some(-1));
        assert_eq!(r.last(), Some((5, 0)));
        assert_eq!(r.remove(9), None);
        assert_eq!((r.len(), r.at(0)), (3, Some((4, 10))));
        assert!(is_sheddable(-1) && !is_sheddable(0));
    }
}
