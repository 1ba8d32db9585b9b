//! The Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language Models", OSDI
//! 2024): fair share measured in weighted tokens of service, not in requests.
//!
//! Each tenant has a counter of the service it received, in tokens divided by the tenant's weight.
//! A scheduler serves the backlogged tenant with the least counter, and lifts a tenant that
//! returns from idle to the least counter of the backlogged tenants (or, with none, to the
//! [`FairShare::virtual_time`]: the counter of the last dispatch), so idleness banks no credit.
//! Invariant (the paper's Theorem 4.4): while two tenants stay backlogged, their counters differ by
//! at most the largest single charge (a request's prompt, or one step's tokens), so their weighted
//! service differs by a bounded amount whatever their arrival rates.
//!
//! Two schedulers keep such counters:
//! - the router's admission queue (`router::admission`) charges a request's prompt tokens when it
//!   dispatches it and each generated token as it streams;
//! - the worker's scheduler (`engine::scheduler`) charges every token it computes (prefill chunks
//!   and decodes, of every router's requests) when it schedules them, and orders the prefill work
//!   inside a priority class by these counters.
//!
//! This type only keeps the counters; it has no I/O and no clock. Names are the tenants'
//! (`Arc<str>`, so the scheduler's sequences share them).

use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, Clone, Copy)]
struct Share {
    /// Weighted service received (tokens / weight).
    counter: f64,
    /// The tenant's weight (at least 1).
    weight: f64,
}

/// The counters of every tenant seen (bounded by the configured tenants).
#[derive(Debug, Default)]
pub struct FairShare {
    shares: HashMap<Arc<str>, Share>,
    virtual_time: f64,
}

impl FairShare {
    /// The counter of `tenant` (0 for one never seen).
    pub fn counter(&self, tenant: &str) -> f64 {
        self.shares.get(tenant).map_or(0.0, |s| s.counter)
    }

    /// The counter (before its charge) of the last dispatched request: where a tenant returning
    /// from idle starts when no tenant is backlogged.
    pub fn virtual_time(&self) -> f64 {
        self.virtual_time
    }

    /// Records `tenant`'s weight (settings may change between requests).
    pub fn set_weight(&mut self, tenant: &Arc<str>, weight: u32) {
        let weight = f64::from(weight.max(1));
        self.shares
            .entry(tenant.clone())
            .and_modify(|s| s.weight = weight)
            .or_insert(Share {
                counter: 0.0,
                weight,
            });
    }

    /// Where a tenant returning from idle starts: the least counter of the `backlogged` tenants,
    /// or the [`Self::virtual_time`] when there is none.
    pub fn floor<'a>(&self, backlogged: impl IntoIterator<Item = &'a str>) -> f64 {
        backlogged
            .into_iter()
            .map(|t| self.counter(t))
            .min_by(f64::total_cmp)
            .unwrap_or(self.virtual_time)
    }

    /// Raises `tenant`'s counter to at least `floor` (a tenant returning from idle).
    pub fn lift(&mut self, tenant: &Arc<str>, floor: f64) {
        if let Some(share) = self.shares.get_mut(tenant) {
            share.counter = share.counter.max(floor);
        }
    }

    /// Charges `tokens` of service to `tenant` (divided by its weight).
    pub fn charge(&mut self, tenant: &str, tokens: u64) {
        if let Some(share) = self.shares.get_mut(tenant) {
            share.counter += tokens as f64 / share.weight;
        }
    }

    /// A request of `tenant` with `prompt_tokens` is dispatched: the virtual time moves to its
    /// counter, then the prompt is charged.
    pub fn on_dispatch(&mut self, tenant: &str, prompt_tokens: u64) {
        self.virtual_time = self.virtual_time.max(self.counter(tenant));
        self.charge(tenant, prompt_tokens);
    }

    /// Forgets `tenant` (one that went idle: when it returns it starts again at the floor it
    /// would be lifted to, so forgetting one whose counter is at or below that floor loses
    /// nothing). Bounds the memory of a scheduler that sees tenants come and go.
    pub fn forget(&mut self, tenant: &str) {
        self.shares.remove(tenant);
    }

    /// Number of tenants with a counter.
    pub fn len(&self) -> usize {
        self.shares.len()
    }

    /// True when no tenant has a counter.
    pub fn is_empty(&self) -> bool {
        self.shares.is_empty()
    }

    /// Every tenant's counter.
    pub fn counters(&self) -> impl Iterator<Item = (&Arc<str>, f64)> {
        self.shares.iter().map(|(name, s)| (name, s.counter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_weighted_tokens_and_lifting_never_lowers() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut share = FairShare::default();
        share.set_weight(&a, 1);
        share.set_weight(&b, 4);
        share.charge("a", 100);
        share.charge("b", 100);
        assert_eq!((share.counter("a"), share.counter("b")), (100.0, 25.0));
        share.lift(&b, 60.0);
        share.lift(&a, 60.0);
        assert_eq!((share.counter("a"), share.counter("b")), (100.0, 60.0));
        share.on_dispatch("b", 8);
        assert_eq!((share.virtual_time(), share.counter("b")), (60.0, 62.0));
        assert_eq!(share.floor(["a", "b"]), 62.0);
        assert_eq!(share.floor(Vec::<&str>::new()), 60.0);
        // Unknown tenants are not charged; a weight of 0 counts as 1.
        share.charge("c", 5);
        assert_eq!(share.counter("c"), 0.0);
        let c: Arc<str> = "c".into();
        share.set_weight(&c, 0);
        share.charge("c", 5);
        assert_eq!(share.counter("c"), 5.0);
        assert_eq!(share.len(), 3);
        share.forget("c");
        assert_eq!((share.len(), share.counter("c")), (2, 0.0));
        assert!(!share.is_empty());
    }
}
