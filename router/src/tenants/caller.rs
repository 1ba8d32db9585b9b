//! Who one request is ([`Caller`]): its tenant, its resolved priority, and the quota book its
//! sequences draw on.

use std::sync::Arc;

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
}
