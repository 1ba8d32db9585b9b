//! Whether a worker has room for one more request from this router: the `max_inflight_per_worker`
//! cap, applied by priority class and by tenant.
//!
//! - A **sheddable** request (negative priority) counts every request in flight on the worker.
//! - Any other request counts only the non-sheddable ones: sheddable work holding a worker's slots
//!   never keeps a higher-priority request in the router's queue (the worker's scheduler then
//!   serves it first: its prefill takes a step without sheddable work, and it preempts sheddable
//!   sequences when KV blocks run out).
//! - Past the cap, a request of a tenant that holds less than its **share of the cap** on the
//!   worker (`cap / n`, `n` = the tenants with non-sheddable requests in flight there, counting
//!   its own) still goes. A tenant that floods a worker thus cannot make another wait for one of
//!   its requests to finish: with equal prompts and lengths a flood's requests run in lockstep and
//!   free their slots together, so that wait is up to a whole request's lifetime.
//!
//! Bound: past `2 x cap` non-sheddable requests nothing more goes, so a worker holds at most
//! `2 x cap` non-sheddable requests from one router, and at most `cap` sheddable ones.

use std::sync::Arc;

/// The requests one router has in flight on one worker, as the cap counts them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Occupancy {
    /// All requests in flight.
    pub total: usize,
    /// Of those, the sheddable ones.
    pub sheddable: usize,
    /// Non-sheddable requests in flight per tenant (tenants with none are absent; requests
    /// without a known tenant, such as failovers, are counted in `total` only).
    pub by_tenant: Vec<(Arc<str>, usize)>,
}

impl Occupancy {
    /// Counts one more request in flight.
    pub fn add(&mut self, sheddable: bool, tenant: Option<&Arc<str>>) {
        self.total += 1;
        if sheddable {
            self.sheddable += 1;
            return;
        }
        let Some(tenant) = tenant else {
            return;
        };
        match self.by_tenant.iter_mut().find(|(t, _)| t == tenant) {
            Some((_, n)) => *n += 1,
            None => self.by_tenant.push((tenant.clone(), 1)),
        }
    }

    /// Whether a request that is `sheddable` or not, of `tenant` (when known), may go to the
    /// worker under `cap` (see the module docs).
    pub fn has_room(&self, cap: usize, sheddable: bool, tenant: Option<&str>) -> bool {
        if sheddable {
            return self.total < cap;
        }
        if self.total - self.sheddable < cap {
            return true;
        }
        let Some(tenant) = tenant else {
            return false;
        };
        let mine = (self.by_tenant.iter())
            .find(|(t, _)| &**t == tenant)
            .map_or(0, |&(_, n)| n);
        let tenants = self.by_tenant.len() + usize::from(mine == 0);
        self.total - self.sheddable < 2 * cap && mine < cap / tenants
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn occupancy(sheddable: usize, tenants: &[(&str, usize)]) -> Occupancy {
        let mut o = Occupancy::default();
        for _ in 0..sheddable {
            o.add(true, None);
        }
        for &(t, n) in tenants {
            let t: Arc<str> = t.into();
            for _ in 0..n {
                o.add(false, Some(&t));
            }
        }
        o
    }

    #[test]
    fn sheddable_work_counts_only_against_sheddable_requests() {
        let o = occupancy(4, &[]);
        assert!(!o.has_room(4, true, Some("a")));
        assert!(o.has_room(4, false, Some("a")));
        assert!(o.has_room(4, false, None));
        let o = occupancy(1, &[("a", 3)]);
        assert!(!o.has_room(4, true, None));
        assert!(o.has_room(4, false, None));
    }

    #[test]
    fn a_tenant_below_its_share_goes_past_a_flood() {
        // Tenant a holds all 8 slots: b (nothing in flight, share 8 / 2 = 4) still goes, a and
        // an unknown tenant (a failover) wait.
        let o = occupancy(0, &[("a", 8)]);
        assert!(!o.has_room(8, false, Some("a")));
        assert!(!o.has_room(8, false, None));
        assert!(o.has_room(8, false, Some("b")));
        // b goes up to its share, then waits like a.
        assert!(occupancy(0, &[("a", 8), ("b", 3)]).has_room(8, false, Some("b")));
        assert!(!occupancy(0, &[("a", 8), ("b", 4)]).has_room(8, false, Some("b")));
        // A third tenant's share is 8 / 3 = 2.
        let o = occupancy(0, &[("a", 8), ("b", 4)]);
        assert!(o.has_room(8, false, Some("c")));
        assert!(!occupancy(0, &[("a", 8), ("b", 4), ("c", 2)]).has_room(8, false, Some("c")));
    }

    #[test]
    fn the_non_sheddable_requests_stay_under_twice_the_cap() {
        // Tenants arrive one request at a time, in every order, while any has room.
        for cap in 1..=16 {
            for tenants in 1..=6 {
                let names: Vec<Arc<str>> = (0..tenants).map(|i| format!("t{i}").into()).collect();
                let mut o = Occupancy::default();
                while let Some(t) = names.iter().find(|t| o.has_room(cap, false, Some(t))) {
                    o.add(false, Some(&t.clone()));
                    assert!(o.total <= 2 * cap, "cap {cap}, {tenants} tenants: {o:?}");
                }
                assert!(o.total >= cap);
            }
        }
    }
}
