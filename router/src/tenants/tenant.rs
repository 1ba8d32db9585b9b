//! One tenant's settings ([`Tenant`]) and the priority its requests may ask for.

use std::sync::Arc;

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
    /// Prefix-cache isolation: this tenant's requests share cached prompt blocks only with each
    /// other (their chains are salted with the tenant's name), never with another tenant's.
    pub isolate_prefix_cache: bool,
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
            isolate_prefix_cache: false,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_may_lower_its_priority_but_not_raise_it_above_the_maximum() {
        let tenant = Tenant {
            max_priority: 10,
            priority: 2,
            ..Tenant::builtin_default()
        };
        assert_eq!(tenant.request_priority(None), Ok(2));
        assert_eq!(tenant.request_priority(Some(10)), Ok(10));
        assert_eq!(tenant.request_priority(Some(-5)), Ok(-5));
        let e = tenant.request_priority(Some(11)).unwrap_err();
        assert_eq!(e.field(), "priority");
        assert_eq!(
            e.to_string(),
            "priority 11 is above the tenant \"default\"'s max_priority (10)"
        );
        let e = Tenant::builtin_default()
            .request_priority(Some(1))
            .unwrap_err();
        assert!(e.to_string().contains("max_priority (0)"), "{e}");
    }
}
