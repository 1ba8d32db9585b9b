//! The salt of a request's prefix-cache chain (`AddRequest.cache_salt`): prefix-cache isolation.
//!
//! The worker roots a salted request's block-hash chain at `block_hash::salted_seed(salt)`
//! instead of 0, so its cached prompt blocks are shared only with requests of the same salt, and
//! another caller can neither hit them nor time them. The router's KV index computes the same
//! salted chain (`routing::kv_aware::PromptChain::rooted`). The salt sent is:
//!
//! | tenant `isolate_prefix_cache` | request `cache_salt` | salt sent                     |
//! |-------------------------------|----------------------|-------------------------------|
//! | false                         | none                 | empty (shared by all)         |
//! | false                         | `S`                  | `salt:S`                      |
//! | true                          | none                 | `tenant:NAME`                 |
//! | true                          | `S`                  | `tenant:NAME` `\n` `salt:S`   |
//!
//! The forms never collide: a tenant's form starts with `tenant:` and its name
//! (`[a-z0-9-]{1,32}`) ends at the first newline, so no request salt, whatever its bytes, can
//! reproduce an isolated tenant's salt, nor one tenant another's.

use super::tenant::Tenant;
use crate::validation::ValidationError;

/// The salt to send for a request of `tenant` carrying `requested` (its `cache_salt`, `None` when
/// absent); empty = no salt.
///
/// Errors: [`ValidationError::Invalid`] (`cache_salt`) for an empty `requested` salt (as vLLM:
/// a salt must be a non-empty string when given).
pub fn prefix_cache_salt(
    tenant: &Tenant,
    requested: Option<&str>,
) -> Result<String, ValidationError> {
    if requested == Some("") {
        return Err(ValidationError::invalid(
            "cache_salt",
            "cache_salt must be a non-empty string when given",
        ));
    }
    Ok(match (tenant.isolate_prefix_cache, requested) {
        (false, None) => String::new(),
        (false, Some(salt)) => format!("salt:{salt}"),
        (true, None) => format!("tenant:{}", tenant.name),
        (true, Some(salt)) => format!("tenant:{}\nsalt:{salt}", tenant.name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn tenant(name: &str, isolate: bool) -> Tenant {
        Tenant {
            name: Arc::from(name),
            isolate_prefix_cache: isolate,
            ..Tenant::builtin_default()
        }
    }

    #[test]
    fn each_combination_has_its_own_salt() {
        let open = tenant("a", false);
        let closed = tenant("b", true);
        assert_eq!(prefix_cache_salt(&open, None).unwrap(), "");
        assert_eq!(prefix_cache_salt(&open, Some("x")).unwrap(), "salt:x");
        assert_eq!(prefix_cache_salt(&closed, None).unwrap(), "tenant:b");
        assert_eq!(
            prefix_cache_salt(&closed, Some("x")).unwrap(),
            "tenant:b\nsalt:x"
        );
        // A request salt cannot impersonate an isolated tenant.
        assert_ne!(
            prefix_cache_salt(&open, Some("tenant:b")).unwrap(),
            prefix_cache_salt(&closed, None).unwrap()
        );
        let err = prefix_cache_salt(&open, Some("")).unwrap_err();
        assert!(err.to_string().contains("cache_salt"), "{err}");
    }
}
