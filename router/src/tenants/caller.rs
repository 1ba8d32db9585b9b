//! Who one request is ([`Caller`]): its tenant, its resolved priority, and the quota book its
//! sequences draw on.

use std::sync::Arc;

use super::cache_salt::prefix_cache_salt;
use super::quota::QuotaBook;
use super::tenant::Tenant;
use crate::validation::ValidationError;

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
    /// The salt of its prefix-cache chain (empty = none), as sent in `AddRequest.cache_salt`:
    /// see [`prefix_cache_salt`].
    pub cache_salt: String,
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
        let cache_salt = prefix_cache_salt(&tenant, None)?;
        Ok(Self {
            tenant,
            priority,
            quotas,
            cache_salt,
        })
    }

    /// The caller with the request's own `cache_salt` (`None`: none) mixed into its salt.
    ///
    /// Errors: those of [`prefix_cache_salt`].
    pub fn with_cache_salt(mut self, requested: Option<&str>) -> Result<Self, ValidationError> {
        self.cache_salt = prefix_cache_salt(&self.tenant, requested)?;
        Ok(self)
    }
}
