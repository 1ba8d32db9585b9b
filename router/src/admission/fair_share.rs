//! The Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language Models", OSDI
//! 2024): fair share measured in weighted tokens of service, not in requests.
//!
//! Each tenant has a counter of the service it received: the prompt tokens of each of its
//! requests when the request is dispatched, plus each generated token as it streams, divided by
//! the tenant's weight. The admission queue ([`super::AdmissionQueue`]) dispatches from the
//! backlogged tenant with the least counter, and lifts a tenant that returns from idle to the
//! least counter of the backlogged tenants (or, with none, to the [`FairShare::virtual_time`]:
//! the counter of the last dispatch), so idleness banks no credit.
//!
//! This type only keeps the counters; it has no I/O and no clock.

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

    /// Every tenant's counter.
    pub fn counters(&self) -> impl Iterator<Item = (&Arc<str>, f64)> {
        self.shares.iter().map(|(name, s)| (name, s.counter))
    }
}
