//! Who a request is: the tenant of its API key.
//!
//! [`Callers`] joins the plain API keys ([`ApiKeys`]: `api_keys`, `api_keys_file`, whose keys are
//! the tenant `default`'s) and the tenants file (`tenants_file`, [`super::file`]), whose keys are
//! their tenants'. Keys are enforced when either source names a key at start (or an
//! `api_keys_file` is given); otherwise every request is the `default` tenant. A key is compared
//! with every configured digest in constant time, as [`crate::auth`] does.
//!
//! The tenants file is re-read every [`RELOAD_PERIOD`] by [`Callers::watch`]: a changed, valid
//! content replaces the tenants (keys, weights, priorities, limits) within about a second; an
//! unreadable, empty (caught mid-rewrite) or invalid one keeps the last good tenants and logs one
//! WARN (until it is good again, [`observability::reload::poll`], [`observability::reload::reread`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use super::caller::Caller;
use super::file::{parse, TenantFileError, TenantTable};
use super::quota::QuotaBook;
use super::tenant::Tenant;
use crate::auth::{bearer_key, ct_eq, digest, ApiKeys, Refusal, RELOAD_PERIOD};
use crate::validation::ValidationError;

/// The keys and tenants a request may present; shared by both fronts and the watcher.
#[derive(Debug)]
pub struct Callers {
    keys: Arc<ApiKeys>,
    file: Option<PathBuf>,
    enforced: bool,
    quotas: Arc<QuotaBook>,
    /// The file's last good content and its tenants.
    table: RwLock<(String, Arc<TenantTable>)>,
}

impl Callers {
    /// No keys, no tenants file: every request is the built-in `default` tenant.
    pub fn open() -> Arc<Self> {
        Self::load(ApiKeys::open(), None).expect("no file to read")
    }

    /// The plain `keys` (tenant `default`) and the tenants `file`, read now.
    ///
    /// Errors: the file cannot be read or is invalid ([`TenantFileError`], naming the field).
    pub fn load(keys: Arc<ApiKeys>, file: Option<&Path>) -> Result<Arc<Self>, TenantFileError> {
        let (text, table) = match file {
            Some(path) => {
                let text = read(path, observability::reload::read_settled)?;
                let table = parse(&text)?;
                (text, table)
            }
            None => (String::new(), TenantTable::builtin()),
        };
        Ok(Arc::new(Self {
            enforced: keys.enforced() || !table.keys.is_empty(),
            quotas: QuotaBook::new(),
            keys,
            file: file.map(Path::to_path_buf),
            table: RwLock::new((text, Arc::new(table))),
        }))
    }

    /// Whether requests need a key.
    pub fn enforced(&self) -> bool {
        self.enforced
    }

    /// The quotas of every tenant.
    pub fn quotas(&self) -> &Arc<QuotaBook> {
        &self.quotas
    }

    /// A request of `tenant` asking for `requested` priority.
    ///
    /// Errors: [`ValidationError::Invalid`] (`priority`) above the tenant's `max_priority`.
    pub fn caller(
        &self,
        tenant: Arc<Tenant>,
        requested: Option<i32>,
    ) -> Result<Caller, ValidationError> {
        Caller::new(tenant, requested, self.quotas.clone())
    }

    /// The current tenants.
    pub fn table(&self) -> Arc<TenantTable> {
        self.table.read().expect("tenants lock").1.clone()
    }

    /// The tenant of an `authorization` value (`None`: the request has none).
    ///
    /// Errors: the [`Refusal`] that says what is wrong (keys enforced, and none or a wrong one).
    pub fn identify(&self, authorization: Option<&[u8]>) -> Result<Arc<Tenant>, Refusal> {
        let table = self.table();
        if !self.enforced {
            return Ok(table.default.clone());
        }
        let presented = digest(bearer_key(authorization)?);
        // Every digest is compared, whatever matches.
        let owner = table.keys.iter().fold(None, |found, (d, index)| {
            if ct_eq(d, &presented) {
                Some(*index)
            } else {
                found
            }
        });
        let plain = self.keys.contains(&presented);
        match owner {
            Some(index) => Ok(table.tenants[index].clone()),
            None if plain => Ok(table.default.clone()),
            None => Err(Refusal::Wrong),
        }
    }

    /// Re-reads the tenants file once: a changed, valid content replaces the tenants (returns
    /// `true`); anything else keeps them.
    ///
    /// Errors: the file cannot be read, is empty, kept changing while read, or is invalid.
    pub fn reload(&self) -> Result<bool, TenantFileError> {
        let Some(path) = &self.file else {
            return Ok(false);
        };
        let text = read(path, observability::reload::reread)?;
        if self.table.read().expect("tenants lock").0 == text {
            return Ok(false);
        }
        let table = parse(&text)?;
        tracing::info!(
            path = %path.display(),
            tenants = table.tenants.len(),
            keys = table.keys.len(),
            "tenants file changed; tenants reloaded"
        );
        *self.table.write().expect("tenants lock") = (text, Arc::new(table));
        Ok(true)
    }

    /// Spawns the tasks that re-read the key file and the tenants file every [`RELOAD_PERIOD`].
    pub fn watch(self: &Arc<Self>) {
        self.keys.watch();
        if self.file.is_some() {
            let callers = self.clone();
            observability::reload::poll("tenants", RELOAD_PERIOD, move || callers.reload());
        }
    }
}

/// The tenants file's text as `read` reads it ([`observability::reload`]'s readers).
fn read(
    path: &Path,
    read: fn(&Path) -> std::io::Result<Vec<u8>>,
) -> Result<String, TenantFileError> {
    read(path)
        .and_then(observability::reload::utf8)
        .map_err(|source| TenantFileError::Read {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(key: &str) -> Vec<u8> {
        format!("Bearer {key}").into_bytes()
    }

    #[test]
    fn without_keys_everyone_is_default() {
        let callers = Callers::open();
        assert!(!callers.enforced());
        assert_eq!(&*callers.identify(None).unwrap().name, "default");
    }

    #[test]
    fn tenant_keys_and_plain_keys_identify_their_tenants() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.toml");
        std::fs::write(
            &path,
            "[[tenant]]\nname = \"search\"\nkeys = [\"sk-s\"]\nweight = 3\n\
             [[tenant]]\nname = \"default\"\nmax_queued = 4\n",
        )
        .unwrap();
        let keys = ApiKeys::load(&["plain".into()], None).unwrap();
        let callers = Callers::load(keys, Some(&path)).unwrap();
        assert!(callers.enforced());
        let search = callers.identify(Some(&bearer("sk-s"))).unwrap();
        assert_eq!((&*search.name, search.weight), ("search", 3));
        let plain = callers.identify(Some(&bearer("plain"))).unwrap();
        assert_eq!(
            (&*plain.name, plain.limits.max_queued),
            ("default", Some(4))
        );
        assert_eq!(callers.identify(Some(&bearer("nope"))), Err(Refusal::Wrong));
        assert_eq!(callers.identify(None), Err(Refusal::Missing));
        assert_eq!(callers.identify(Some(b"sk-s")), Err(Refusal::Malformed));
    }

    #[test]
    fn a_changed_file_replaces_the_tenants_and_a_broken_one_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.toml");
        std::fs::write(&path, "[[tenant]]\nname = \"a\"\nkeys = [\"k\"]\n").unwrap();
        let callers = Callers::load(ApiKeys::open(), Some(&path)).unwrap();
        assert!(!callers.reload().unwrap());
        std::fs::write(
            &path,
            "[[tenant]]\nname = \"a\"\nkeys = [\"k\"]\nweight = 5\n",
        )
        .unwrap();
        assert!(callers.reload().unwrap());
        assert_eq!(callers.identify(Some(&bearer("k"))).unwrap().weight, 5);
        std::fs::write(
            &path,
            "[[tenant]]\nname = \"a\"\nkeys = [\"k\"]\nweight = 0\n",
        )
        .unwrap();
        let e = callers.reload().unwrap_err();
        assert!(e.to_string().contains("weight must be at least 1"), "{e}");
        assert_eq!(callers.identify(Some(&bearer("k"))).unwrap().weight, 5);
        // Truncated by an in-place rewrite: an empty file is no tenants, not the last good ones.
        std::fs::write(&path, "").unwrap();
        let e = callers.reload().unwrap_err();
        assert!(e.to_string().contains("the file is empty"), "{e}");
        assert_eq!(callers.identify(Some(&bearer("k"))).unwrap().weight, 5);
        std::fs::remove_file(&path).unwrap();
        assert!(callers.reload().is_err());
        assert_eq!(callers.identify(Some(&bearer("k"))).unwrap().weight, 5);
    }

    #[test]
    fn a_bad_file_at_load_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.toml");
        std::fs::write(&path, "[[tenant]]\nname = \"a\"\nmax_concurrent = 0\n").unwrap();
        let e = Callers::load(ApiKeys::open(), Some(&path)).unwrap_err();
        assert!(
            e.to_string().contains("tenant \"a\": max_concurrent"),
            "{e}"
        );
        let e = Callers::load(ApiKeys::open(), Some(Path::new("/nonexistent/t.toml"))).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/t.toml"), "{e}");
    }
}
