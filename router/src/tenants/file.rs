//! The tenants file (`tenants_file`, `--tenants-file`): TOML, one `[[tenant]]` table per tenant.
//!
//! ```toml
//! [[tenant]]
//! name = "search"              # [a-z0-9-]{1,32}, unique
//! keys = ["sk-search-1"]       # API keys of this tenant (Bearer)
//! weight = 3                   # share of the pool when backlogged (default 1)
//! priority = 0                 # default request priority (default 0)
//! max_priority = 10            # highest priority a request may ask for (default 0)
//! max_concurrent = 64          # optional limits, absent = none
//! max_queued = 32
//! requests_per_second = 20
//! tokens_per_minute = 200000
//! isolate_prefix_cache = true  # share cached prompt blocks with no other tenant (default false)
//! ```
//!
//! [`parse`] checks everything a typo could break and names the tenant and the field in its
//! error: unknown keys, a bad or duplicate name, a key given twice, a weight or limit that is zero
//! or negative, a `priority` above `max_priority`. A tenant named `default` configures the traffic
//! that carries no tenant's key (plain keys of `api_keys` / `api_keys_file`, or no key at all).

use std::collections::HashMap;
use std::sync::Arc;

use figment::providers::{Format as _, Toml};
use serde::Deserialize;

use super::tenant::{Tenant, TenantLimits, DEFAULT_TENANT};
use crate::auth::{digest, KeyDigest};

/// Why a tenants file cannot be used; every message names the tenant and the field.
#[derive(Debug, thiserror::Error)]
pub enum TenantFileError {
    /// The file cannot be read.
    #[error("cannot read the tenants file {path}: {source}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, an unknown key, or a value of the wrong type (figment's message names the key).
    #[error("the tenants file is not valid: {0}")]
    Syntax(Box<figment::Error>),
    /// A field with a value out of its range.
    #[error("tenant {tenant:?}: {field} {message}")]
    Field {
        /// The tenant's name (or its position, `#N`, when the name itself is at fault).
        tenant: String,
        /// The field at fault.
        field: &'static str,
        /// What is wrong, with the value.
        message: String,
    },
}

/// One `[[tenant]]` table as written (wide integer types, so a negative value is reported as
/// such, naming the field, rather than as a type error).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    name: String,
    #[serde(default)]
    keys: Vec<String>,
    weight: Option<i64>,
    priority: Option<i64>,
    max_priority: Option<i64>,
    max_concurrent: Option<i64>,
    max_queued: Option<i64>,
    requests_per_second: Option<f64>,
    tokens_per_minute: Option<i64>,
    isolate_prefix_cache: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    #[serde(default)]
    tenant: Vec<TenantEntry>,
}

/// The tenants of one file and the digests of their keys.
#[derive(Debug, Clone)]
pub struct TenantTable {
    /// The tenants, in file order.
    pub tenants: Vec<Arc<Tenant>>,
    /// `(key digest, index in tenants)` of every key.
    pub keys: Vec<(KeyDigest, usize)>,
    /// The tenant of traffic without a tenant key: the file's `default`, or the built-in one.
    pub default: Arc<Tenant>,
}

impl TenantTable {
    /// No file: only the built-in `default` tenant.
    pub fn builtin() -> Self {
        Self {
            tenants: Vec::new(),
            keys: Vec::new(),
            default: Arc::new(Tenant::builtin_default()),
        }
    }

    /// The configured tenant names (the bounded label set of the per-tenant metrics), `default`
    /// included.
    pub fn names(&self) -> Vec<Arc<str>> {
        let mut names: Vec<Arc<str>> = self.tenants.iter().map(|t| t.name.clone()).collect();
        if !names.iter().any(|n| &**n == DEFAULT_TENANT) {
            names.push(self.default.name.clone());
        }
        names
    }
}

/// Parses and checks a tenants file's text.
///
/// Errors: [`TenantFileError::Syntax`] (not TOML, unknown key, wrong type) or
/// [`TenantFileError::Field`] naming the tenant and the field (see the module docs).
pub fn parse(text: &str) -> Result<TenantTable, TenantFileError> {
    let doc: Document = figment::Figment::from(Toml::string(text))
        .extract()
        .map_err(|e| TenantFileError::Syntax(Box::new(e)))?;
    let mut tenants = Vec::with_capacity(doc.tenant.len());
    let mut keys = Vec::new();
    let mut key_owner: HashMap<KeyDigest, String> = HashMap::new();
    for (index, entry) in doc.tenant.into_iter().enumerate() {
        let tenant = check_entry(index, &entry)?;
        if tenants.iter().any(|t: &Arc<Tenant>| t.name == tenant.name) {
            return Err(field_error(
                &entry.name,
                "name",
                "is given to two tenants; names must be unique",
            ));
        }
        for key in &entry.keys {
            let key = key.trim();
            if key.is_empty() {
                return Err(field_error(&entry.name, "keys", "has an empty key"));
            }
            let d = digest(key);
            if let Some(owner) = key_owner.insert(d, entry.name.clone()) {
                return Err(field_error(
                    &entry.name,
                    "keys",
                    format!("has a key that tenant {owner:?} has too; a key belongs to one tenant"),
                ));
            }
            keys.push((d, tenants.len()));
        }
        tenants.push(Arc::new(tenant));
    }
    let default = tenants
        .iter()
        .find(|t| &*t.name == DEFAULT_TENANT)
        .cloned()
        .unwrap_or_else(|| Arc::new(Tenant::builtin_default()));
    Ok(TenantTable {
        tenants,
        keys,
        default,
    })
}

fn field_error(tenant: &str, field: &'static str, message: impl Into<String>) -> TenantFileError {
    TenantFileError::Field {
        tenant: tenant.to_string(),
        field,
        message: message.into(),
    }
}

fn valid_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A positive limit that fits `u32`.
fn positive(
    name: &str,
    field: &'static str,
    value: Option<i64>,
) -> Result<Option<u32>, TenantFileError> {
    match value {
        None => Ok(None),
        Some(v) if v < 1 => Err(field_error(
            name,
            field,
            format!("must be at least 1, got {v}"),
        )),
        Some(v) => u32::try_from(v).map(Some).map_err(|_| {
            field_error(
                name,
                field,
                format!("must be at most {}, got {v}", u32::MAX),
            )
        }),
    }
}

fn priority(name: &str, field: &'static str, value: Option<i64>) -> Result<i32, TenantFileError> {
    let v = value.unwrap_or(0);
    i32::try_from(v).map_err(|_| {
        field_error(
            name,
            field,
            format!("must be in [{}, {}], got {v}", i32::MIN, i32::MAX),
        )
    })
}

fn check_entry(index: usize, e: &TenantEntry) -> Result<Tenant, TenantFileError> {
    if !valid_name(&e.name) {
        return Err(field_error(
            &format!("#{}", index + 1),
            "name",
            format!("{:?} must match [a-z0-9-]{{1,32}}", e.name),
        ));
    }
    let name = e.name.as_str();
    let weight = positive(name, "weight", e.weight)?.unwrap_or(1);
    let default_priority = priority(name, "priority", e.priority)?;
    let max_priority = priority(name, "max_priority", e.max_priority)?;
    if default_priority > max_priority {
        return Err(field_error(
            name,
            "priority",
            format!("({default_priority}) is above max_priority ({max_priority})"),
        ));
    }
    let requests_per_second = match e.requests_per_second {
        Some(v) if !(v.is_finite() && v > 0.0) => {
            return Err(field_error(
                name,
                "requests_per_second",
                format!("must be above 0, got {v}"),
            ))
        }
        other => other,
    };
    let tokens_per_minute = match e.tokens_per_minute {
        Some(v) if v < 1 => {
            return Err(field_error(
                name,
                "tokens_per_minute",
                format!("must be at least 1, got {v}"),
            ))
        }
        other => other.map(|v| v as u64),
    };
    Ok(Tenant {
        name: Arc::from(name),
        weight,
        priority: default_priority,
        max_priority,
        isolate_prefix_cache: e.isolate_prefix_cache.unwrap_or(false),
        limits: TenantLimits {
            max_concurrent: positive(name, "max_concurrent", e.max_concurrent)?,
            max_queued: positive(name, "max_queued", e.max_queued)?,
            requests_per_second,
            tokens_per_minute,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[[tenant]]
name = "search"              # [a-z0-9-]{1,32}, unique
keys = ["sk-search-1"]       # API keys of this tenant (Bearer, as today)
weight = 3                   # share of the pool when backlogged
priority = 0                 # default request priority
max_priority = 10            # highest priority a request may ask for
max_concurrent = 64          # optional limits, absent = none
requests_per_second = 20
tokens_per_minute = 200000

[[tenant]]
name = "batch"
keys = ["sk-batch-1", "sk-batch-2"]
priority = -1
max_queued = 8
isolate_prefix_cache = true
"#;

    #[test]
    fn the_issue_example_parses_with_defaults() {
        let table = parse(GOOD).unwrap();
        assert_eq!(table.tenants.len(), 2);
        let search = &table.tenants[0];
        assert_eq!(&*search.name, "search");
        assert_eq!(
            (search.weight, search.priority, search.max_priority),
            (3, 0, 10)
        );
        assert_eq!(
            search.limits,
            TenantLimits {
                max_concurrent: Some(64),
                max_queued: None,
                requests_per_second: Some(20.0),
                tokens_per_minute: Some(200_000),
            }
        );
        let batch = &table.tenants[1];
        assert_eq!(
            (batch.weight, batch.priority, batch.max_priority),
            (1, -1, 0)
        );
        assert_eq!(batch.limits.max_queued, Some(8));
        assert!(batch.isolate_prefix_cache && !search.isolate_prefix_cache);
        assert_eq!(table.keys.len(), 3);
        assert_eq!(table.keys[0], (digest("sk-search-1"), 0));
        assert_eq!(table.keys[2], (digest("sk-batch-2"), 1));
        // No `default` table: the built-in one.
        assert_eq!(*table.default, Tenant::builtin_default());
        let names: Vec<String> = table.names().iter().map(|n| n.to_string()).collect();
        assert_eq!(names, ["search", "batch", "default"]);
    }

    #[test]
    fn a_default_table_configures_keyless_traffic() {
        let table = parse("[[tenant]]\nname = \"default\"\nrequests_per_second = 2\n").unwrap();
        assert_eq!(&*table.default.name, "default");
        assert_eq!(table.default.limits.requests_per_second, Some(2.0));
        assert!(parse("").unwrap().tenants.is_empty());
    }

    fn error_of(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn bad_files_are_refused_naming_the_tenant_and_field() {
        let cases = [
            ("[[tenant]]\nname = \"Search\"\n", "tenant \"#1\": name \"Search\" must match"),
            ("[[tenant]]\nname = \"\"\n", "name \"\" must match"),
            (
                "[[tenant]]\nname = \"a\"\n[[tenant]]\nname = \"a\"\n",
                "tenant \"a\": name is given to two tenants",
            ),
            (
                "[[tenant]]\nname = \"a\"\nkeys = [\"k\"]\n[[tenant]]\nname = \"b\"\nkeys = [\"k\"]\n",
                "tenant \"b\": keys has a key that tenant \"a\" has too",
            ),
            ("[[tenant]]\nname = \"a\"\nweight = 0\n", "tenant \"a\": weight must be at least 1, got 0"),
            (
                "[[tenant]]\nname = \"a\"\nmax_concurrent = -3\n",
                "tenant \"a\": max_concurrent must be at least 1, got -3",
            ),
            ("[[tenant]]\nname = \"a\"\nmax_queued = 0\n", "max_queued must be at least 1, got 0"),
            (
                "[[tenant]]\nname = \"a\"\nrequests_per_second = 0\n",
                "tenant \"a\": requests_per_second must be above 0, got 0",
            ),
            (
                "[[tenant]]\nname = \"a\"\ntokens_per_minute = -5\n",
                "tenant \"a\": tokens_per_minute must be at least 1, got -5",
            ),
            (
                "[[tenant]]\nname = \"a\"\npriority = 5\nmax_priority = 3\n",
                "tenant \"a\": priority (5) is above max_priority (3)",
            ),
            ("[[tenant]]\nname = \"a\"\nkeys = [\" \"]\n", "tenant \"a\": keys has an empty key"),
        ];
        for (text, expected) in cases {
            let e = error_of(text);
            assert!(e.contains(expected), "{text:?}: {e}");
        }
        // Unknown keys and wrong types: figment's message names the key.
        let e = error_of("[[tenant]]\nname = \"a\"\nweigth = 2\n");
        assert!(e.contains("weigth"), "{e}");
        let e = error_of("[[tenant]]\nname = \"a\"\nweight = \"x\"\n");
        assert!(e.contains("weight"), "{e}");
        let e = error_of("[[tenant]\n");
        assert!(e.starts_with("the tenants file is not valid"), "{e}");
    }
}
