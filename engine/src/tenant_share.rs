//! Fair share between tenants inside the worker: the Virtual Token Counter ([`fair_share`]; Sheng
//! et al., "Fairness in Serving Large Language Models", OSDI 2024) over the tokens this worker
//! computes, and the order it gives the scheduler inside a priority class.
//!
//! - A tenant is *active* while it has a sequence in the engine (waiting or running). Every token
//!   the scheduler puts in a step (prefill chunks and decodes) is charged to its sequence's tenant,
//!   divided by the tenant's weight, when the step is scheduled.
//! - A tenant that becomes active is lifted to the least counter of the other active tenants (or,
//!   with none, to the virtual time: the counter of the last charge), so idleness banks no credit.
//! - [`TenantShares::ranks`] orders the active tenants: least counter first, then (on a tie: a
//!   tenant just lifted to the least counter) the one with fewer sequences in the engine, then by
//!   name. The scheduler serves prefill work inside a priority class in this order, so a tenant's
//!   backlog on this worker does not delay another tenant's prompts, and the router replicas'
//!   traffic for a tenant is counted together (the worker sees all of it).
//!
//! Invariant (tested): while two tenants stay active with prefill work, their counters differ by
//! at most the largest charge of one step (the step budget divided by the smaller weight).
//! Memory: a counter per active tenant, plus idle ones whose counter is above the floor they would
//! be lifted to, at most [`MAX_IDLE_TENANTS`] (past it the idle ones are forgotten: a forgotten
//! tenant returns at the floor, which can give it back at most the credit it had over the floor).

use std::collections::HashMap;
use std::sync::Arc;

use fair_share::FairShare;

/// The tenant of a request that names none.
pub const DEFAULT_TENANT: &str = "default";

/// Most idle tenants whose counters are kept (see the module docs).
pub const MAX_IDLE_TENANTS: usize = 1024;

/// The tenants' fair-share counters and the count of sequences each has in the engine.
#[derive(Debug, Default)]
pub(crate) struct TenantShares {
    share: FairShare,
    active: HashMap<Arc<str>, usize>,
}

impl TenantShares {
    /// A sequence of `tenant` (fair-share `weight`, 0 counts as 1) enters the engine; a tenant
    /// that was idle is lifted to the floor first.
    pub(crate) fn arrive(&mut self, tenant: &Arc<str>, weight: u32) {
        self.share.set_weight(tenant, weight);
        if !self.active.contains_key(tenant) {
            let floor = self.floor();
            self.share.lift(tenant, floor);
        }
        *self.active.entry(tenant.clone()).or_insert(0) += 1;
    }

    /// A sequence of `tenant` leaves the engine (finished, failed or cancelled).
    pub(crate) fn leave(&mut self, tenant: &str) {
        let Some(n) = self.active.get_mut(tenant) else {
            return;
        };
        *n -= 1;
        if *n > 0 {
            return;
        }
        self.active.remove(tenant);
        if self.share.counter(tenant) <= self.floor() {
            self.share.forget(tenant);
        }
        if self.share.len() > self.active.len() + MAX_IDLE_TENANTS {
            let idle: Vec<Arc<str>> = self
                .share
                .counters()
                .filter(|(name, _)| !self.active.contains_key(*name))
                .map(|(name, _)| name.clone())
                .collect();
            for name in idle {
                self.share.forget(&name);
            }
        }
    }

    /// Charges `tokens` computed for `tenant` in a step.
    pub(crate) fn charge(&mut self, tenant: &str, tokens: usize) {
        self.share.on_dispatch(tenant, tokens as u64);
    }

    /// Where a tenant becoming active starts: the least counter of the active tenants, or the
    /// virtual time when none is.
    fn floor(&self) -> f64 {
        self.share.floor(self.active.keys().map(|t| &**t))
    }

    /// Every active tenant's rank (0 = served first; see the module docs).
    pub(crate) fn ranks(&self) -> HashMap<Arc<str>, usize> {
        let mut order: Vec<(&Arc<str>, f64, usize)> = self
            .active
            .iter()
            .map(|(t, &n)| (t, self.share.counter(t), n))
            .collect();
        order.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.2.cmp(&b.2)).then(a.0.cmp(b.0)));
        order
            .into_iter()
            .enumerate()
            .map(|(rank, (t, _, _))| (t.clone(), rank))
            .collect()
    }

    /// `tenant`'s counter (weighted tokens computed for it; 0 when unknown).
    #[cfg(test)]
    pub(crate) fn counter(&self, tenant: &str) -> f64 {
        self.share.counter(tenant)
    }

    /// Number of tenants with a counter (active or remembered).
    #[cfg(test)]
    pub(crate) fn remembered(&self) -> usize {
        self.share.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Arc<str> {
        s.into()
    }

    #[test]
    fn a_returning_tenant_starts_at_the_least_active_counter_and_goes_first_on_a_tie() {
        let mut t = TenantShares::default();
        let (a, b) = (name("a"), name("b"));
        for _ in 0..5 {
            t.arrive(&a, 1);
        }
        t.charge("a", 400);
        t.arrive(&b, 1);
        assert_eq!(t.counter("b"), 400.0);
        let ranks = t.ranks();
        assert_eq!(
            (ranks[&b], ranks[&a]),
            (0, 1),
            "fewer sequences wins the tie"
        );
        t.charge("b", 10);
        assert_eq!(t.ranks()[&a], 0);
        // b leaves above the floor: remembered, and not lowered when it returns.
        t.leave("b");
        assert_eq!(t.remembered(), 2);
        t.arrive(&b, 1);
        assert_eq!(t.counter("b"), 410.0);
    }

    #[test]
    fn weights_scale_the_charges_and_idle_tenants_are_bounded() {
        let mut t = TenantShares::default();
        let (a, b) = (name("a"), name("b"));
        t.arrive(&a, 3);
        t.arrive(&b, 1);
        t.charge("a", 300);
        t.charge("b", 100);
        assert_eq!((t.counter("a"), t.counter("b")), (100.0, 100.0));
        // A tenant leaving at or below the floor is forgotten (it would be lifted there anyway).
        t.leave("a");
        assert_eq!(t.remembered(), 1);
        t.arrive(&a, 3);
        assert_eq!(t.counter("a"), 100.0);
        // Many tenants that leave above the floor: at most MAX_IDLE_TENANTS stay remembered.
        for i in 0..MAX_IDLE_TENANTS + 10 {
            let x = name(&format!("t{i}"));
            t.arrive(&x, 1);
            t.charge(&x, 1000);
            t.leave(&x);
        }
        assert!(t.remembered() <= 2 + MAX_IDLE_TENANTS);
        assert_eq!(t.ranks().len(), 2);
    }

    #[test]
    fn serving_the_least_counter_keeps_backlogged_counters_within_one_charge() {
        // Three tenants, weights 1, 2 and 3, always backlogged; each step serves 64 tokens of the
        // first-ranked tenant. Their counters stay within one step's charge (64 / weight 1).
        let mut t = TenantShares::default();
        let names = [name("x"), name("y"), name("z")];
        for (i, n) in names.iter().enumerate() {
            t.arrive(n, i as u32 + 1);
        }
        let mut served = [0usize; 3];
        for _ in 0..3000 {
            let ranks = t.ranks();
            let first = (0..3).find(|&i| ranks[&names[i]] == 0).unwrap();
            t.charge(&names[first], 64);
            served[first] += 64;
            let counters: Vec<f64> = names.iter().map(|n| t.counter(n)).collect();
            let spread = counters.iter().cloned().fold(f64::MIN, f64::max)
                - counters.iter().cloned().fold(f64::MAX, f64::min);
            assert!(spread <= 64.0, "spread {spread}");
        }
        // Service splits 1:2:3 within one step's tokens per tenant.
        let unit = served[0] as f64;
        assert!((served[1] as f64 / unit - 2.0).abs() < 0.05);
        assert!((served[2] as f64 / unit - 3.0).abs() < 0.05);
    }
}
