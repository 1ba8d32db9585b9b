//! A tenant's quotas at admission: `requests_per_second` and `tokens_per_minute` token buckets
//! ([`TokenBucket`]) and `max_concurrent` requests. A request over one is refused at once with
//! [`QuotaExceeded`] (`RESOURCE_EXHAUSTED` / HTTP 429 `rate_limit_exceeded`) and, for the buckets,
//! a retry hint computed from the bucket: the wait after which both buckets hold what the request
//! needs. Only that tenant is refused; the others' buckets are their own.
//!
//! The token bucket counts prompt plus generated tokens: a request reserves its prompt plus its
//! `max_new_tokens` at admission, and its [`Lease`] gives back the part it did not generate when
//! it ends (finished, cancelled or failed). A request whose prompt plus `max_new_tokens` is more
//! than the whole bucket could never pass: it is refused as invalid (`max_new_tokens`), not told to
//! retry.
//!
//! A call counts once against the call quotas (`requests_per_second`, `max_concurrent`), however
//! many sequences it runs (an OpenAI request's `n` choices, or its list of prompts): its first
//! sequence takes the request token and the concurrency slot ([`CallPart::First`]), the others
//! ([`CallPart::Further`]) only reserve their tokens. So `n` above `requests_per_second` or
//! `max_concurrent` is served, not told to retry a refusal that could never pass.
//!
//! Limits are read from the tenant's settings at each admission, so a changed tenants file takes
//! effect with the next request ([`TokenBucket::reconfigure`]: a raised limit at once).
//!
//! Each router replica keeps its own buckets (no shared store). With the replicas known
//! ([`QuotaBook::set_replicas`], from `replica_discovery_dns`: the count of the router replicas'
//! addresses in DNS), each replica enforces `1/N` of every limit (`max_concurrent` rounded up, at
//! least 1), so N replicas behind a load balancer that spreads a tenant's calls evenly let it
//! through about its limits in all. Unknown (the default, 1), N replicas let a tenant through up
//! to N times its limits. What this cannot give: a tenant whose calls land unevenly is refused
//! early on the busier replica, and a change in N takes a re-resolution to show; a shared store
//! (Envoy's rate-limit service with Redis) counts exactly, at a network round trip per call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::bucket::TokenBucket;
use super::tenant::{Tenant, TenantLimits};
use crate::validation::ValidationError;

/// Why a tenant's request was refused by its quotas. The messages name the tenant, the limit and
/// its value, and the retry hint.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuotaExceeded {
    /// `max_concurrent` requests of the tenant are admitted and not finished.
    #[error(
        "tenant {tenant:?} has {active} requests in progress (max_concurrent = {max}{}); retry \
         when one finishes",
        share_note(*replicas)
    )]
    Concurrent {
        /// The tenant.
        tenant: Arc<str>,
        /// Its requests admitted here and not finished.
        active: u32,
        /// The `max_concurrent` limit this router enforces (its share).
        max: u32,
        /// The router replicas the limit is shared by.
        replicas: u32,
    },
    /// The tenant's `requests_per_second` bucket is empty (it holds one second's worth, at least
    /// one request).
    #[error(
        "tenant {tenant:?} is over its requests_per_second quota ({limit}{}); retry after {} ms",
        share_note(*replicas),
        retry_after.as_millis()
    )]
    Requests {
        /// The tenant.
        tenant: Arc<str>,
        /// The `requests_per_second` limit this router enforces (its share).
        limit: f64,
        /// The router replicas the limit is shared by.
        replicas: u32,
        /// When both buckets will hold what the request needs.
        retry_after: Duration,
    },
    /// The tenant's `tokens_per_minute` bucket holds less than the request reserves.
    #[error(
        "tenant {tenant:?} is over its tokens_per_minute quota ({limit}{}): the request reserves \
         {reserving} tokens (prompt + max_new_tokens) and {available} are left; retry after {} ms",
        share_note(*replicas),
        retry_after.as_millis()
    )]
    Tokens {
        /// The tenant.
        tenant: Arc<str>,
        /// The `tokens_per_minute` limit this router enforces (its share).
        limit: u64,
        /// The router replicas the limit is shared by.
        replicas: u32,
        /// Prompt plus `max_new_tokens` of the request.
        reserving: u64,
        /// Tokens in the bucket now (rounded down).
        available: u64,
        /// When both buckets will hold what the request needs.
        retry_after: Duration,
    },
}

/// What a refusal message adds when the limit is shared by several router replicas.
fn share_note(replicas: u32) -> String {
    if replicas > 1 {
        format!(" on this router: its share as 1 of {replicas} router replicas")
    } else {
        String::new()
    }
}

/// `limits` as one of `replicas` router replicas enforces them: every limit divided by the
/// replicas (`max_concurrent` rounded up; at least 1). `max_queued` is per router already.
pub fn replica_share(limits: &TenantLimits, replicas: u32) -> TenantLimits {
    let n = replicas.max(1);
    TenantLimits {
        max_concurrent: limits.max_concurrent.map(|m| m.div_ceil(n).max(1)),
        max_queued: limits.max_queued,
        requests_per_second: limits.requests_per_second.map(|r| r / f64::from(n)),
        tokens_per_minute: limits.tokens_per_minute.map(|t| (t / u64::from(n)).max(1)),
    }
}

impl QuotaExceeded {
    /// The wait after which the request would pass (the buckets' refill), if the limit is a bucket.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Concurrent { .. } => None,
            Self::Requests { retry_after, .. } | Self::Tokens { retry_after, .. } => {
                Some(*retry_after)
            }
        }
    }

    /// The limit that refused (the setting's name).
    pub fn limit_name(&self) -> &'static str {
        match self {
            Self::Concurrent { .. } => "max_concurrent",
            Self::Requests { .. } => "requests_per_second",
            Self::Tokens { .. } => "tokens_per_minute",
        }
    }
}

/// A refusal at admission: over a quota, or a request too large for the token quota ever.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmissionRefusal {
    /// Over a quota now.
    #[error(transparent)]
    Quota(#[from] QuotaExceeded),
    /// Never fits (`max_new_tokens` at fault).
    #[error(transparent)]
    Invalid(#[from] ValidationError),
}

#[derive(Debug, Default)]
struct Usage {
    requests: Option<TokenBucket>,
    tokens: Option<TokenBucket>,
    active: u32,
}

/// Makes `bucket` match a limit of `per_window` per `window_s` seconds (`None`: no bucket): a
/// bucket of one window's worth, at least `min_capacity` (a request must fit in it).
fn sync_bucket(
    bucket: &mut Option<TokenBucket>,
    per_window: Option<f64>,
    window_s: f64,
    min_capacity: f64,
    now: Instant,
) {
    let Some(per_window) = per_window else {
        *bucket = None;
        return;
    };
    let (capacity, rate) = (per_window.max(min_capacity), per_window / window_s);
    match bucket.as_mut() {
        None => *bucket = Some(TokenBucket::new(capacity, rate, now)),
        Some(b) if b.capacity() != capacity || b.rate_per_s() != rate => {
            b.reconfigure(capacity, rate, now)
        }
        Some(_) => {}
    }
}

/// Every tenant's quota state in this router (keyed by tenant name: bounded by the configured
/// tenants).
#[derive(Debug, Default)]
pub struct QuotaBook {
    usage: Mutex<HashMap<Arc<str>, Usage>>,
    /// The router replicas the limits are shared by (0 or 1: this router alone).
    replicas: AtomicU32,
}

impl QuotaBook {
    /// An empty book.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Shares every tenant's limits among `replicas` router replicas from the next admission on
    /// (see the module doc; 0 counts as 1).
    pub fn set_replicas(&self, replicas: u32) {
        self.replicas.store(replicas.max(1), Ordering::Relaxed);
    }

    /// The router replicas the limits are shared by (at least 1).
    pub fn replicas(&self) -> u32 {
        self.replicas.load(Ordering::Relaxed).max(1)
    }

    /// Admits one request of `tenant` with `prompt_tokens` and `max_new_tokens` at `now`: counts
    /// it against `max_concurrent`, takes one request token and reserves prompt + `max_new_tokens`
    /// tokens. The [`Lease`] returns the unused part when dropped.
    ///
    /// Errors: [`AdmissionRefusal::Quota`] over a limit (nothing is taken);
    /// [`AdmissionRefusal::Invalid`] when prompt + `max_new_tokens` exceed `tokens_per_minute`.
    pub fn acquire(
        self: &Arc<Self>,
        tenant: &Tenant,
        part: CallPart,
        prompt_tokens: u64,
        max_new_tokens: u64,
        now: Instant,
    ) -> Result<Lease, AdmissionRefusal> {
        let counts_call = part == CallPart::First;
        let replicas = self.replicas();
        let limits = &replica_share(&tenant.limits, replicas);
        let mut all = self.usage.lock().expect("quota lock");
        let usage = all.entry(tenant.name.clone()).or_default();
        // Below one request per second, the bucket still holds one request.
        sync_bucket(
            &mut usage.requests,
            limits.requests_per_second,
            1.0,
            1.0,
            now,
        );
        let tokens_per_minute = limits.tokens_per_minute.map(|t| t as f64);
        sync_bucket(&mut usage.tokens, tokens_per_minute, 60.0, 0.0, now);
        let over_concurrent = limits.max_concurrent.filter(|&max| usage.active >= max);
        if let Some(max) = over_concurrent.filter(|_| counts_call) {
            return Err(QuotaExceeded::Concurrent {
                tenant: tenant.name.clone(),
                active: usage.active,
                max,
                replicas,
            }
            .into());
        }
        let reserving = prompt_tokens + max_new_tokens;
        let requests_wait = match usage.requests.as_mut().filter(|_| counts_call) {
            Some(b) => b.wait_for(1.0, now).unwrap_or(Duration::MAX),
            None => Duration::ZERO,
        };
        let tokens_wait = match usage.tokens.as_mut() {
            Some(b) => b.wait_for(reserving as f64, now).ok_or_else(|| {
                ValidationError::invalid(
                    "max_new_tokens",
                    format!(
                        "the prompt ({prompt_tokens} tokens) plus max_new_tokens ({max_new_tokens}) \
                         is more than the tenant {:?}'s whole tokens_per_minute quota ({}); ask \
                         for fewer tokens",
                        &*tenant.name,
                        b.capacity()
                    ),
                )
            })?,
            None => Duration::ZERO,
        };
        let retry_after = requests_wait.max(tokens_wait);
        if !retry_after.is_zero() {
            let refusal = if tokens_wait >= requests_wait {
                let bucket = usage.tokens.as_mut().expect("waited on it");
                QuotaExceeded::Tokens {
                    tenant: tenant.name.clone(),
                    limit: limits.tokens_per_minute.unwrap_or_default(),
                    replicas,
                    reserving,
                    available: bucket.level(now).max(0.0) as u64,
                    retry_after,
                }
            } else {
                QuotaExceeded::Requests {
                    tenant: tenant.name.clone(),
                    limit: limits.requests_per_second.unwrap_or_default(),
                    replicas,
                    retry_after,
                }
            };
            return Err(refusal.into());
        }
        if let Some(b) = usage.requests.as_mut().filter(|_| counts_call) {
            b.take(1.0, now).expect("checked above");
        }
        if let Some(b) = usage.tokens.as_mut() {
            b.take(reserving as f64, now).expect("checked above");
        }
        if counts_call {
            usage.active += 1;
        }
        Ok(Lease {
            book: self.clone(),
            tenant: tenant.name.clone(),
            counts_call,
            prompt_tokens,
            reserved: max_new_tokens,
            generated: 0,
            admitted: true,
        })
    }

    /// Requests of `tenant` admitted and not finished.
    pub fn active(&self, tenant: &str) -> u32 {
        let all = self.usage.lock().expect("quota lock");
        all.get(tenant).map_or(0, |u| u.active)
    }

    fn release(&self, lease: &Lease, now: Instant) {
        let mut all = self.usage.lock().expect("quota lock");
        let Some(usage) = all.get_mut(&lease.tenant) else {
            return;
        };
        if lease.counts_call {
            usage.active = usage.active.saturating_sub(1);
        }
        let mut unused = lease.reserved.saturating_sub(lease.generated);
        if !lease.admitted {
            unused += lease.prompt_tokens;
            if let Some(b) = usage.requests.as_mut().filter(|_| lease.counts_call) {
                b.give_back(1.0, now);
            }
        }
        if let Some(b) = usage.tokens.as_mut() {
            b.give_back(unused as f64, now);
        }
    }
}

/// Which sequence of a call is being admitted (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallPart {
    /// The call's first sequence: counts against `requests_per_second` and `max_concurrent`.
    First,
    /// Another sequence of an admitted call (a further OpenAI choice or prompt): reserves tokens only.
    Further,
}

/// One admitted request's hold on its tenant's quotas: counted in `max_concurrent` and holding
/// its token reservation until dropped, which gives back the tokens it did not generate.
#[derive(Debug)]
pub struct Lease {
    book: Arc<QuotaBook>,
    tenant: Arc<str>,
    /// Holds the call's request token and concurrency slot ([`CallPart::First`]).
    counts_call: bool,
    prompt_tokens: u64,
    reserved: u64,
    generated: u64,
    admitted: bool,
}

impl Lease {
    /// Counts `tokens` generated (they use the reservation up).
    pub fn on_generated(&mut self, tokens: u64) {
        self.generated += tokens;
    }

    /// The request was not admitted after all (the queue refused it): gives back everything,
    /// its request token and its prompt tokens included.
    pub fn refund(mut self) {
        self.admitted = false;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.book.release(self, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::TenantLimits;

    fn tenant(limits: TenantLimits) -> Tenant {
        Tenant {
            name: Arc::from("a"),
            limits,
            ..Tenant::builtin_default()
        }
    }

    #[test]
    fn requests_per_second_refuses_with_the_bucket_wait() {
        let book = QuotaBook::new();
        let a = tenant(TenantLimits {
            requests_per_second: Some(2.0),
            ..Default::default()
        });
        let t0 = Instant::now();
        let _l1 = book.acquire(&a, CallPart::First, 1, 1, t0).unwrap();
        let _l2 = book.acquire(&a, CallPart::First, 1, 1, t0).unwrap();
        let refusal = book.acquire(&a, CallPart::First, 1, 1, t0).unwrap_err();
        let AdmissionRefusal::Quota(q) = refusal else {
            panic!("{refusal:?}")
        };
        assert_eq!(q.limit_name(), "requests_per_second");
        assert_eq!(q.retry_after(), Some(Duration::from_millis(500)));
        assert!(q.to_string().contains("retry after 500 ms"), "{q}");
        // Honoured, it passes; another tenant was never limited.
        let _l3 = book
            .acquire(&a, CallPart::First, 1, 1, t0 + Duration::from_millis(500))
            .unwrap();
        let other = Tenant::builtin_default();
        for _ in 0..10 {
            drop(book.acquire(&other, CallPart::First, 1, 1, t0).unwrap());
        }
    }

    #[test]
    fn replicas_share_every_limit() {
        let limits = TenantLimits {
            max_concurrent: Some(5),
            max_queued: Some(7),
            requests_per_second: Some(4.0),
            tokens_per_minute: Some(1000),
        };
        let half = replica_share(&limits, 2);
        assert_eq!(half.max_concurrent, Some(3), "rounded up");
        assert_eq!(half.max_queued, Some(7), "per router already");
        assert_eq!(half.requests_per_second, Some(2.0));
        assert_eq!(half.tokens_per_minute, Some(500));
        assert_eq!(replica_share(&limits, 0), limits);
        assert_eq!(replica_share(&limits, 1), limits);
        assert_eq!(replica_share(&limits, 64).max_concurrent, Some(1));

        // A book shared by 4 replicas: 1 of the 4 requests per second, and the refusal says so.
        let book = QuotaBook::new();
        assert_eq!(book.replicas(), 1);
        book.set_replicas(4);
        assert_eq!(book.replicas(), 4);
        let a = tenant(limits);
        let t0 = Instant::now();
        let _l1 = book.acquire(&a, CallPart::First, 1, 1, t0).unwrap();
        let refusal = book.acquire(&a, CallPart::First, 1, 1, t0).unwrap_err();
        let AdmissionRefusal::Quota(q) = refusal else {
            panic!("{refusal:?}")
        };
        assert_eq!(q.retry_after(), Some(Duration::from_secs(1)));
        assert!(
            q.to_string()
                .contains("(1 on this router: its share as 1 of 4"),
            "{q}"
        );
        // Back to one replica: the whole limit at the next admission.
        book.set_replicas(1);
        let _l2 = book.acquire(&a, CallPart::First, 1, 1, t0).unwrap();
    }

    #[test]
    fn tokens_are_reserved_and_the_unused_part_returned() {
        let book = QuotaBook::new();
        let a = tenant(TenantLimits {
            tokens_per_minute: Some(600), // 10 per second
            ..Default::default()
        });
        let t0 = Instant::now();
        let mut lease = book.acquire(&a, CallPart::First, 100, 400, t0).unwrap();
        // 100 left: a request reserving 150 waits 5 s for 50 more.
        let AdmissionRefusal::Quota(q) =
            book.acquire(&a, CallPart::First, 50, 100, t0).unwrap_err()
        else {
            panic!()
        };
        assert_eq!(q.retry_after(), Some(Duration::from_secs(5)));
        assert!(q.to_string().contains("reserves 150 tokens"), "{q}");
        assert!(q.to_string().contains("100 are left"), "{q}");
        // It generated 100 of its 400: 300 come back.
        lease.on_generated(100);
        drop(lease);
        assert!(book.acquire(&a, CallPart::First, 50, 100, t0).is_ok());
        // More than the whole bucket: invalid, naming max_new_tokens.
        let AdmissionRefusal::Invalid(e) =
            book.acquire(&a, CallPart::First, 100, 501, t0).unwrap_err()
        else {
            panic!()
        };
        assert_eq!(e.field(), "max_new_tokens");
    }

    #[test]
    fn a_call_counts_once_however_many_choices_it_runs() {
        let book = QuotaBook::new();
        let a = tenant(TenantLimits {
            requests_per_second: Some(1.0),
            max_concurrent: Some(1),
            tokens_per_minute: Some(100),
            ..Default::default()
        });
        let t0 = Instant::now();
        // `n = 3` on an idle tenant with one request per second and one call at a time: served.
        let first = book.acquire(&a, CallPart::First, 10, 10, t0).unwrap();
        let second = book.acquire(&a, CallPart::Further, 10, 10, t0).unwrap();
        let third = book.acquire(&a, CallPart::Further, 10, 10, t0).unwrap();
        assert_eq!(book.active(&a.name), 1);
        // Every choice reserved its tokens: 60 of 100 are held, so a fourth of 20 fits, not 50.
        assert!(book.acquire(&a, CallPart::Further, 10, 10, t0).is_ok());
        let AdmissionRefusal::Quota(q) =
            book.acquire(&a, CallPart::Further, 25, 25, t0).unwrap_err()
        else {
            panic!("the token bucket still applies to further choices")
        };
        assert_eq!(q.limit_name(), "tokens_per_minute");
        // The next call is held by max_concurrent until the first call's first sequence ends.
        let AdmissionRefusal::Quota(q) = book.acquire(&a, CallPart::First, 1, 1, t0).unwrap_err()
        else {
            panic!("max_concurrent counts calls")
        };
        assert_eq!(q.limit_name(), "max_concurrent");
        drop((second, third));
        assert_eq!(book.active(&a.name), 1);
        drop(first);
        assert_eq!(book.active(&a.name), 0);
        // One second later the request bucket holds the next call again.
        assert!(book
            .acquire(&a, CallPart::First, 1, 1, t0 + Duration::from_secs(1))
            .is_ok());
    }

    #[test]
    fn max_concurrent_counts_leases_and_a_refund_returns_everything() {
        let book = QuotaBook::new();
        let a = tenant(TenantLimits {
            max_concurrent: Some(1),
            requests_per_second: Some(1.0),
            tokens_per_minute: Some(60),
            ..Default::default()
        });
        let t0 = Instant::now();
        let lease = book.acquire(&a, CallPart::First, 10, 10, t0).unwrap();
        assert_eq!(book.active("a"), 1);
        let AdmissionRefusal::Quota(q) = book.acquire(&a, CallPart::First, 1, 1, t0).unwrap_err()
        else {
            panic!()
        };
        assert_eq!(q.limit_name(), "max_concurrent");
        assert_eq!(q.retry_after(), None);
        lease.refund();
        assert_eq!(book.active("a"), 0);
        // The request token and all 20 tokens came back.
        let lease = book.acquire(&a, CallPart::First, 30, 30, t0).unwrap();
        drop(lease);
    }

    #[test]
    fn below_one_request_per_second_one_request_fits() {
        let book = QuotaBook::new();
        let a = tenant(TenantLimits {
            requests_per_second: Some(0.2),
            ..Default::default()
        });
        let t0 = Instant::now();
        drop(book.acquire(&a, CallPart::First, 1, 1, t0).unwrap());
        let AdmissionRefusal::Quota(q) = book.acquire(&a, CallPart::First, 1, 1, t0).unwrap_err()
        else {
            panic!()
        };
        assert_eq!(q.retry_after(), Some(Duration::from_secs(5)));
    }

    #[test]
    fn a_changed_limit_applies_to_the_next_request() {
        let book = QuotaBook::new();
        let t0 = Instant::now();
        let slow = tenant(TenantLimits {
            requests_per_second: Some(1.0),
            ..Default::default()
        });
        drop(book.acquire(&slow, CallPart::First, 1, 1, t0).unwrap());
        assert!(book.acquire(&slow, CallPart::First, 1, 1, t0).is_err());
        let fast = tenant(TenantLimits {
            requests_per_second: Some(100.0),
            ..Default::default()
        });
        for _ in 0..50 {
            drop(book.acquire(&fast, CallPart::First, 1, 1, t0).unwrap());
        }
        let unlimited = tenant(TenantLimits::default());
        for _ in 0..500 {
            drop(book.acquire(&unlimited, CallPart::First, 1, 1, t0).unwrap());
        }
    }
}
