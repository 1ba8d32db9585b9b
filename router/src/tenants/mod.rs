//! Tenants: many services sharing one pool (issue 27).
//!
//! An API key belongs to a tenant; a tenant has a `weight` (its share of the pool when
//! backlogged), a default request `priority`, the `max_priority` a request may ask for, and
//! optional limits. Tenants come from the `tenants_file` setting ([`file`], TOML, re-read on
//! change by [`Callers`]); traffic without a tenant key (the plain keys of `api_keys` /
//! `api_keys_file`, or no keys at all) is the tenant `default`.
//!
//! - [`tenant`] ([`Tenant`]): one tenant's settings, and the priority its requests may ask for;
//! - [`caller`] ([`Caller`]): who one request is (tenant, resolved priority, quota book, cache
//!   salt);
//! - [`cache_salt`]: the salt of a request's prefix-cache chain (tenant isolation, `cache_salt`);
//! - [`file`]: the file's form and its checks;
//! - [`callers`] ([`Callers`]): who a request is (its key's tenant), reloaded on change;
//! - [`bucket`]: the token bucket behind the rate and token quotas;
//! - [`quota`] ([`QuotaBook`]): a tenant's quotas at admission (requests per second, tokens per
//!   minute, concurrent requests) and the [`quota::Lease`] that returns the unused part.
//!
//! Fair share and priority classes between tenants are the admission queue's
//! ([`crate::admission`]).

pub mod bucket;
pub mod cache_salt;
pub mod caller;
pub mod callers;
pub mod file;
pub mod quota;
pub mod tenant;

pub use caller::Caller;
pub use callers::Callers;
pub use quota::{QuotaBook, QuotaExceeded};
pub use tenant::{Tenant, TenantLimits, DEFAULT_TENANT};
