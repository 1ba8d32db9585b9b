//! The router's bounded admission queue: per tenant, by priority class, fair share by tokens.
//!
//! # What waits, and the limits
//!
//! A request is **in flight** on a worker from the moment the router sends it there until its last
//! token, its error, its cancellation or the loss of the worker. Each worker takes at most
//! `max_inflight_per_worker` requests from this router at once (the worker queues and batches those
//! itself and reports them as running/waiting sequences).
//!
//! A request is **waiting** when it was accepted (valid, tokenized, within its tenant's quotas) but
//! no ready worker has room for it yet. Waiting requests are bounded by
//! - `max_waiting_requests`: requests in the queue, and
//! - `max_waiting_tokens`: the sum over the queue of each request's prompt tokens plus the tokens it
//!   already generated (failover), i.e. the prefill work the queue holds;
//! - per tenant, its `max_queued` ([`Placement::max_queued`]).
//!
//! A new request that would take the queue past a limit is refused at once with [`QueueFull`]
//! (`RESOURCE_EXHAUSTED` / HTTP 429) naming the limit, unless the queue holds a **sheddable**
//! request (priority below 0) of a lower class than the new one: then the newest request of the
//! lowest such class is displaced (it gets [`QueueFull::Displaced`]) and the new one takes its place
//! (the Kubernetes Gateway API Inference Extension's rule: sheddable work goes first under
//! saturation); a request never displaces one of its own class or a higher one. A request goes
//! straight to a worker, without queueing or counting against the limits, when the queue is empty
//! and a worker has room.
//!
//! # Which request goes next
//!
//! When a worker has room, the next request is
//! 1. a resumed one (failover), oldest first: it was already admitted;
//! 2. else one of the **highest priority class** present (higher `priority` first);
//! 3. within the class, the oldest request of the backlogged tenant with the **least weighted
//!    service received** ([`fair_share`], the Virtual Token Counter of Sheng et al., OSDI 2024:
//!    prompt tokens charged at dispatch, generated tokens as they stream, each divided by the
//!    tenant's weight); ties go to the older request.
//!
//! A tenant with nothing waiting that queues a request starts at `max(its counter, the least
//! counter of the backlogged tenants)` (with none backlogged, the counter of the last dispatch), so
//! idleness banks no credit.
//!
//! **Invariant** (tested below): at each dispatch of a new request, its tenant's counter is the
//! least among the tenants with requests waiting in the chosen class; a tenant never joins the
//! backlog below the least backlogged counter. Hence two tenants that stay backlogged in one class
//! keep counters within one request's charge of each other (prompt + generated tokens of one
//! request, divided by the weight, plus what their in-flight requests stream meanwhile), so over a
//! long window their served tokens split in the ratio of their weights.
//!
//! Requests resuming after a worker failure (failover) go ahead of new requests (after earlier
//! failovers) and are never refused for the limits, though they count against them while they
//! wait. Memory is bounded either way: failovers are at most the requests that were in flight.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

pub use fair_share::FairShare;

/// The queue limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Most requests waiting.
    pub max_waiting_requests: usize,
    /// Most tokens (prompt plus already generated) over all waiting requests.
    pub max_waiting_tokens: u64,
}

/// Where a new request belongs: its tenant, the tenant's weight and queue limit, and the
/// request's priority class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The tenant's name.
    pub tenant: Arc<str>,
    /// The tenant's weight (share when backlogged; at least 1).
    pub weight: u32,
    /// The request's priority: higher first; below 0 = sheddable.
    pub priority: i32,
    /// The tenant's `max_queued` (`None`: only the queue's limits).
    pub max_queued: Option<u32>,
}

impl Placement {
    /// The built-in `default` tenant at priority 0, without a queue limit of its own.
    pub fn default_tenant() -> Self {
        Self {
            tenant: Arc::from(crate::tenants::DEFAULT_TENANT),
            weight: 1,
            priority: 0,
            max_queued: None,
        }
    }
}

/// Why a new request was refused, or a waiting one displaced (answered with `RESOURCE_EXHAUSTED` /
/// HTTP 429; the message names the limit and its value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueFull {
    /// `max_waiting_requests` requests already wait.
    #[error(
        "the router is at capacity: {waiting} requests are already waiting for a worker \
         (max_waiting_requests = {max}); retry later"
    )]
    Requests {
        /// Requests waiting.
        waiting: usize,
        /// The `max_waiting_requests` limit.
        max: usize,
    },
    /// The request's tokens would take the waiting tokens past `max_waiting_tokens`.
    #[error(
        "the router is at capacity: {waiting} tokens are waiting for a worker and this request \
         adds {adding} (max_waiting_tokens = {max}); retry later"
    )]
    Tokens {
        /// Tokens waiting.
        waiting: u64,
        /// The request's tokens (prompt plus already generated).
        adding: u64,
        /// The `max_waiting_tokens` limit.
        max: u64,
    },
    /// The tenant already has `max_queued` requests waiting.
    #[error(
        "tenant {tenant:?} has {waiting} requests waiting for a worker (max_queued = {max}); retry \
         later"
    )]
    TenantQueue {
        /// The tenant.
        tenant: Arc<str>,
        /// Its requests waiting.
        waiting: usize,
        /// Its `max_queued` limit.
        max: u32,
    },
    /// A waiting sheddable request was displaced from the full queue by one of a higher class.
    #[error(
        "the router is at capacity and this sheddable request (priority {priority}) was displaced \
         from the queue by a request of priority {by}; retry later"
    )]
    Displaced {
        /// The displaced request's priority (below 0).
        priority: i32,
        /// The priority of the request that took its place.
        by: i32,
    },
}

/// One waiting request.
#[derive(Debug)]
pub struct Entry<T> {
    /// The queue's id for it.
    pub id: u64,
    /// Its prompt plus already generated tokens.
    pub tokens: u64,
    /// Whether it resumes a request that was already running (failover).
    pub resumed: bool,
    /// Its tenant and class (`None` for resumed requests).
    pub placement: Option<Placement>,
    /// What the owner keeps with it.
    pub item: T,
}

/// The queue seen per tenant (for the metrics).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantQueues {
    /// New requests waiting, per tenant with any.
    pub waiting: Vec<(Arc<str>, usize)>,
    /// Every tenant's fair-share counter (weighted tokens of service).
    pub counters: Vec<(Arc<str>, f64)>,
}

/// A new request in the queue: its id, and the sheddable request it displaced, if any (whose
/// owner must be told, with [`QueueFull::Displaced`]).
#[derive(Debug)]
pub struct Pushed<T> {
    /// The new request's id.
    pub id: u64,
    /// The displaced request.
    pub displaced: Option<Entry<T>>,
}

/// The admission queue: resumed requests first, then by priority class and fair share (see the
/// module docs). Requests are kept per priority class and tenant, first come first served inside
/// each, so choosing the next one costs O(classes + tenants), not O(waiting requests); finding,
/// taking and removing one by id cost O(log waiting).
#[derive(Debug)]
pub struct AdmissionQueue<T> {
    limits: AdmissionLimits,
    entries: BTreeMap<u64, Entry<T>>,
    /// Resumed requests' ids (ids grow with queueing: oldest first).
    resumed: BTreeSet<u64>,
    /// New requests' ids per priority class (highest first) and tenant, oldest first.
    classes: BTreeMap<Reverse<i32>, BTreeMap<Arc<str>, BTreeSet<u64>>>,
    /// New requests waiting per tenant (tenants with none are absent).
    waiting: HashMap<Arc<str>, usize>,
    tokens: u64,
    next_id: u64,
    share: FairShare,
}

impl<T> AdmissionQueue<T> {
    /// An empty queue with `limits`.
    pub fn new(limits: AdmissionLimits) -> Self {
        Self {
            limits,
            entries: BTreeMap::new(),
            resumed: BTreeSet::new(),
            classes: BTreeMap::new(),
            waiting: HashMap::new(),
            tokens: 0,
            next_id: 1,
            share: FairShare::default(),
        }
    }

    /// The limits.
    pub fn limits(&self) -> AdmissionLimits {
        self.limits
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Tokens held by the waiting requests.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The fair-share counters.
    pub fn fair_share(&self) -> &FairShare {
        &self.share
    }

    /// New requests waiting per tenant, and every tenant's fair-share counter.
    pub fn tenant_queues(&self) -> TenantQueues {
        let mut waiting: Vec<(Arc<str>, usize)> =
            self.waiting.iter().map(|(t, &n)| (t.clone(), n)).collect();
        waiting.sort();
        let counters = self.share.counters().map(|(t, c)| (t.clone(), c)).collect();
        TenantQueues { waiting, counters }
    }

    fn waiting_of(&self, tenant: &str) -> usize {
        self.waiting.get(tenant).copied().unwrap_or(0)
    }

    /// Where a tenant returning from idle starts: the least counter of the backlogged tenants,
    /// or the virtual time when none is.
    fn floor(&self) -> f64 {
        self.share.floor(self.waiting.keys().map(|t| &**t))
    }

    fn over_limits(&self, len: usize, tokens: u64, adding: u64) -> Option<QueueFull> {
        let l = self.limits;
        if len >= l.max_waiting_requests {
            return Some(QueueFull::Requests {
                waiting: len,
                max: l.max_waiting_requests,
            });
        }
        (tokens + adding > l.max_waiting_tokens).then_some(QueueFull::Tokens {
            waiting: tokens,
            adding,
            max: l.max_waiting_tokens,
        })
    }

    /// The sheddable request a new one of `priority` may displace: the newest of the lowest class
    /// below both 0 and `priority`.
    fn victim(&self, priority: i32) -> Option<u64> {
        let (&Reverse(lowest), tenants) = self.classes.last_key_value()?;
        if lowest >= 0 || lowest >= priority {
            return None;
        }
        tenants.values().filter_map(|ids| ids.last().copied()).max()
    }

    /// Queues a new request of `placement` holding `tokens`.
    ///
    /// Errors: [`QueueFull`] when it would take the queue (or its tenant's share of it) past a
    /// limit and no sheddable request of a lower class can make room.
    pub fn push_new(
        &mut self,
        tokens: u64,
        placement: Placement,
        item: T,
    ) -> Result<Pushed<T>, QueueFull> {
        let waiting = self.waiting_of(&placement.tenant);
        if let Some(max) = placement.max_queued.filter(|&m| waiting >= m as usize) {
            return Err(QueueFull::TenantQueue {
                tenant: placement.tenant.clone(),
                waiting,
                max,
            });
        }
        let mut displaced = None;
        if let Some(full) = self.over_limits(self.entries.len(), self.tokens, tokens) {
            let victim = self.victim(placement.priority).filter(|id| {
                let freed = self.entries[id].tokens;
                self.over_limits(self.entries.len() - 1, self.tokens - freed, tokens)
                    .is_none()
            });
            let Some(id) = victim else {
                return Err(full);
            };
            displaced = Some(self.remove(id).expect("victim exists"));
        }
        self.share.set_weight(&placement.tenant, placement.weight);
        if self.waiting_of(&placement.tenant) == 0 {
            let floor = self.floor();
            self.share.lift(&placement.tenant, floor);
        }
        let id = self.insert(tokens, Some(placement), item);
        Ok(Pushed { id, displaced })
    }

    /// Queues a resumed request after earlier resumed ones and before every new one, whatever the
    /// limits; returns its id.
    pub fn push_resumed(&mut self, tokens: u64, item: T) -> u64 {
        self.insert(tokens, None, item)
    }

    fn insert(&mut self, tokens: u64, placement: Option<Placement>, item: T) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.tokens += tokens;
        match &placement {
            None => {
                self.resumed.insert(id);
            }
            Some(p) => {
                (self.classes.entry(Reverse(p.priority)).or_default())
                    .entry(p.tenant.clone())
                    .or_default()
                    .insert(id);
                *self.waiting.entry(p.tenant.clone()).or_default() += 1;
            }
        }
        self.entries.insert(
            id,
            Entry {
                id,
                tokens,
                resumed: placement.is_none(),
                placement,
                item,
            },
        );
        id
    }

    /// The request to serve next.
    pub fn front(&self) -> Option<&Entry<T>> {
        self.entries.get(self.heads().first()?)
    }

    /// Removes and returns the request to serve next (the one [`Self::front`] shows), charging
    /// its prompt to its tenant's fair-share counter.
    pub fn pop_front(&mut self) -> Option<Entry<T>> {
        let id = *self.heads().first()?;
        self.take(id)
    }

    /// A new request of `placement` went to a worker without waiting (the queue was empty): its
    /// tenant is lifted as a returning one and charged its prompt.
    pub fn dispatched_directly(&mut self, placement: &Placement, tokens: u64) {
        self.share.set_weight(&placement.tenant, placement.weight);
        if self.waiting_of(&placement.tenant) == 0 {
            let floor = self.floor();
            self.share.lift(&placement.tenant, floor);
        }
        self.share.on_dispatch(&placement.tenant, tokens);
    }

    /// Charges `tokens` generated for `tenant` to its fair-share counter.
    pub fn charge(&mut self, tenant: &str, tokens: u64) {
        self.share.charge(tenant, tokens);
    }

    /// The ids of the requests that may go next, in the order they go (the first is
    /// [`Self::front`]): every resumed one, oldest first; then, class by class (higher priority
    /// first), the oldest request of each tenant with requests waiting in the class, the tenant
    /// with the least fair-share counter first (ties: the older request). A request behind its
    /// tenant's oldest in a class goes only after it. The dispatcher tries them in this order and
    /// sends the first one a worker has room for ([`Self::take`]): a worker's room depends on the
    /// request's class and tenant, so one that cannot go does not hold back another tenant's or
    /// class's. Costs O(resumed + classes x tenants).
    pub fn heads(&self) -> Vec<u64> {
        let mut heads: Vec<u64> = self.resumed.iter().copied().collect();
        for tenants in self.classes.values() {
            let mut class: Vec<(f64, u64)> = tenants
                .iter()
                .filter_map(|(t, ids)| Some((self.share.counter(t), *ids.first()?)))
                .collect();
            class.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            heads.extend(class.into_iter().map(|(_, id)| id));
        }
        heads
    }

    /// The waiting request `id`.
    pub fn get(&self, id: u64) -> Option<&Entry<T>> {
        self.entries.get(&id)
    }

    /// Removes and returns request `id` to send it, charging its prompt to its tenant's
    /// fair-share counter (as [`Self::pop_front`] does for the front).
    pub fn take(&mut self, id: u64) -> Option<Entry<T>> {
        let entry = self.remove(id)?;
        if let Some(p) = &entry.placement {
            self.share.on_dispatch(&p.tenant, entry.tokens);
        }
        Some(entry)
    }

    /// Removes request `id` (it gave up waiting); `None` when it is no longer queued.
    pub fn remove(&mut self, id: u64) -> Option<Entry<T>> {
        let entry = self.entries.remove(&id)?;
        self.tokens -= entry.tokens;
        match &entry.placement {
            None => {
                self.resumed.remove(&id);
            }
            Some(p) => {
                let class = (self.classes.get_mut(&Reverse(p.priority))).expect("queued class");
                let ids = class.get_mut(&p.tenant).expect("queued tenant");
                ids.remove(&id);
                if ids.is_empty() {
                    class.remove(&p.tenant);
                    if class.is_empty() {
                        self.classes.remove(&Reverse(p.priority));
                    }
                }
                let n = self.waiting.get_mut(&p.tenant).expect("waiting tenant");
                *n -= 1;
                if *n == 0 {
                    self.waiting.remove(&p.tenant);
                }
            }
        }
        Some(entry)
    }
}

#[cfg(test)]
mod tests;
