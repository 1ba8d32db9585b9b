//! Tenants: many services sharing one pool (issue 27).
//!
//! An API key belongs to a tenant; a tenant has a `weight` (its share of the pool when
//! backlogged), a default request `priority`, the `max_priority` a request may ask for, and
//! optional limits. Tenants come from the `tenants_file` setting ([`file`], TOML, re-read on
//! change by [`Callers`]); traffic without a tenant key (the plain keys of `api_keys` /
//! `api_keys_file`, or no keys at all) is the tenant `default`.
//!
//! - [`file`]: the file's form and its checks;
//! - [`callers`] ([`Callers`]): who a request is (its key's tenant), reloaded on change;
//! - [`bucket`]: the token bucket behind the rate and token quotas;
//! - [`quota`] ([`QuotaBook`]): a tenant's quotas at admission (requests per second, tokens per
//!   minute, concurrent requests) and the [`quota::Lease`] that returns the unused part.
//!
//! Fair share and priority classes between tenants are the admission queue's
//! ([`crate::admission`]).

pub mod bucket;
pub mod callers;
pub mod file;
pub mod quota;

use std::sync::Arc;

pub use callers::Callers;
pub use quota::{QuotaBook, QuotaExceeded};

use crate::validation::ValidationError;

/// The name of the tenant of traffic without a tenant key.
pub const DEFAULT_TENANT: &str = "default";

/// A tenant's optional limits (`None` = no limit).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantLimits {
    /// Most requests admitted and not finished (waiting or running) at once.
    pub max_concurrent: Option<u32>,
    /// Most requests waiting in the router's admission queue.
    pub max_queued: Option<u32>,
    /// Requests per second (a bucket of that many, refilled continuously).
    pub requests_per_second: Option<f64>,
    /// Prompt plus generated tokens per minute (a bucket of that many, refilled continuously);
    /// a request reserves prompt + `max_new_tokens` at admission and returns the unused part.
    pub tokens_per_minute: Option<u64>,
}

/// One tenant's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// `[a-z0-9-]{1,32}`, unique.
    pub name: Arc<str>,
    /// Share of the pool when backlogged (at least 1).
    pub weight: u32,
    /// The priority of a request that asks for none.
    pub priority: i32,
    /// The highest priority a request may ask for.
    pub max_priority: i32,
    /// The optional limits.
    pub limits: TenantLimits,
}

impl Tenant {
    /// The `default` tenant when the file configures none: weight 1, priority 0, no limits.
    pub fn builtin_default() -> Self {
        Self {
            name: Arc::from(DEFAULT_TENANT),
            weight: 1,
            priority: 0,
            max_priority: 0,
            limits: TenantLimits::default(),
        }
    }

    /// The priority of a request that asks for `requested` (`None`: the tenant's default). A
    /// request may lower its priority (down to sheddable, below 0), never raise it above
    /// `max_priority`.
    ///
    /// Errors: [`ValidationError::Invalid`] for `priority` above the tenant's `max_priority`.
    pub fn request_priority(&self, requested: Option<i32>) -> Result<i32, ValidationError> {
        match requested {
            None => Ok(self.priority),
            Some(p) if p > self.max_priority => Err(ValidationError::invalid(
                "priority",
                format!(
                    "priority {p} is above the tenant {:?}'s max_priority ({})",
                    &*self.name, self.max_priority
                ),
            )),
            Some(p) => Ok(p),
        }
    }
}

/// Who a request is and how it is scheduled: its tenant (settings as of its arrival), its resolved
/// priority, and the quota book its sequences draw on.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The tenant.
    pub tenant: Arc<Tenant>,
    /// The request's priority (higher first; negative = sheddable).
    pub priority: i32,
    /// The quotas of every tenant.
    pub quotas: Arc<QuotaBook>,
}

impl Caller {
    /// `tenant`'s request asking for `requested` priority, drawing on `quotas`.
    ///
    /// Errors: those of [`Tenant::request_priority`].
    pub fn new(
        tenant: Arc<Tenant>,
        requested: Option<i32>,
        quotas: Arc<QuotaBook>,
    ) -> Result<Self, ValidationError> {
        let priority = tenant.request_priority(requested)?;
        Ok(Self {
            tenant,
            priority,
            quotas,
        })
    }

    /// The built-in `default` tenant at priority 0 with a book of its own (callers without a
    /// tenant context).
    pub fn default_tenant() -> Self {
        Self {
            tenant: Arc::new(Tenant::builtin_default()),
            priority: 0,
            quotas: QuotaBook::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_may_lower_its_priority_but_not_raise_it_above_the_maximum() {
        let tenant = Arc::new(Tenant {
            max_priority: 10,
            priority: 2,
            ..Tenant::builtin_default()
        });
        assert_eq!(tenant.request_priority(None), Ok(2));
        assert_eq!(tenant.request_priority(Some(10)), Ok(10));
        assert_eq!(tenant.request_priority(Some(-5)), Ok(-5));
        let e = tenant.request_priority(Some(11)).unwrap_err();
        assert_eq!(e.field(), "priority");
        assert_eq!(
            e.to_string(),
            "priority 11 is above the tenant \"default\"'s max_priority (10)"
        );
        let e = Caller::new(
            Arc::new(Tenant::builtin_default()),
            Some(1),
            QuotaBook::new(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("max_priority (0)"), "{e}");
    }
}
