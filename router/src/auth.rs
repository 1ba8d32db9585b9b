//! Optional API keys on the public fronts (gRPC `authorization: Bearer KEY` metadata, HTTP
//! `Authorization: Bearer KEY` header).
//!
//! Keys come from the `api_keys` setting (a list, or `ROUTER_API_KEYS="k1,k2"`) and from the file
//! named by `api_keys_file` (one key per line; blank lines and lines starting with `#` are
//! ignored). Both may be given at once; a request passes when its key is any of them. With neither
//! given, every request passes (the fronts are open, as before). With a file given, keys are
//! enforced even while the file holds none.
//!
//! The file is re-read every [`RELOAD_PERIOD`] by [`ApiKeys::watch`]: a changed content replaces
//! the file's keys (a rotation takes effect within about a second, without a restart); a file that
//! becomes unreadable or empty (an in-place rewrite caught between its truncate and its write), or
//! that keeps changing while it is read, keeps the last good keys and logs one WARN until it is
//! good again ([`observability::reload::reread`]). A file of only `#` comments holds no keys.
//!
//! Keys are compared as SHA-256 digests in constant time ([`ct_eq`]: every byte of every
//! configured digest is looked at, whatever matches), so the time taken tells nothing about how
//! much of a key was right. Keys are never logged or echoed.
//!
//! The gRPC front checks them in [`crate::request_guard`], the HTTP front in its router
//! ([`crate::openai`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sha2::{Digest as _, Sha256};

/// How often [`ApiKeys::watch`] re-reads the key file.
pub const RELOAD_PERIOD: Duration = observability::reload::RELOAD_PERIOD;

/// SHA-256 of one key.
pub type KeyDigest = [u8; 32];

/// Why a request was refused. The messages never contain the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No `authorization` header / metadata.
    #[error("no API key: send it as `authorization: Bearer KEY`")]
    Missing,
    /// An `authorization` value that is not `Bearer KEY`.
    #[error("the authorization value is not `Bearer KEY`")]
    Malformed,
    /// A key that is not one of the configured keys.
    #[error("the API key is not valid")]
    Wrong,
    /// An `authorization` value longer than [`MAX_AUTHORIZATION_BYTES`].
    #[error("the authorization value is longer than {MAX_AUTHORIZATION_BYTES} bytes, the most an API key may have")]
    TooLong,
}

/// The longest `authorization` value looked at (bytes); a longer one is refused
/// ([`Refusal::TooLong`]) before it is parsed or hashed.
pub const MAX_AUTHORIZATION_BYTES: usize = 8 << 10;

/// The largest header list (HPACK-decoded, bytes; RFC 9113 `SETTINGS_MAX_HEADER_LIST_SIZE`) the
/// public gRPC port accepts on one request. hyper's default (16 KiB) makes h2 close the whole
/// connection (GOAWAY `ENHANCE_YOUR_CALM`, `header_list_way_too_large`) for a list over 4 times
/// that, failing every other stream on it. With this bound a request's headers up to 256 KiB reach
/// the service, whose checks answer that request alone (an `authorization` value over
/// [`MAX_AUTHORIZATION_BYTES`]: `UNAUTHENTICATED`); a list of 256 KiB to 1 MiB is refused by h2 for
/// that stream alone (HTTP 431); only one over 1 MiB still closes the connection.
pub const MAX_HEADER_LIST_BYTES: u32 = 256 << 10;

/// A key file that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the API key file {path}: {source}")]
pub struct KeyFileError {
    /// The file.
    pub path: PathBuf,
    /// The I/O error.
    #[source]
    pub source: std::io::Error,
}

/// The keys a request may present; cheap to share (`Arc`) between both fronts and the watcher.
#[derive(Debug)]
pub struct ApiKeys {
    /// Whether keys are checked at all (some source is configured).
    enforced: bool,
    /// Digests of the `api_keys` setting's keys.
    listed: Vec<KeyDigest>,
    /// The key file, when one is configured.
    file: Option<PathBuf>,
    /// The file's last good content and its keys' digests.
    from_file: RwLock<(String, Vec<KeyDigest>)>,
}

impl ApiKeys {
    /// No keys: every request passes.
    pub fn open() -> Arc<Self> {
        Self::load(&[], None).expect("no file to read")
    }

    /// Keys from the `listed` keys (blank entries ignored) and the key `file`.
    ///
    /// Errors: the file cannot be read.
    pub fn load(listed: &[String], file: Option<&Path>) -> Result<Arc<Self>, KeyFileError> {
        let listed: Vec<KeyDigest> = listed
            .iter()
            .map(|k| k.trim())
            .filter(|k| !k.is_empty())
            .map(digest)
            .collect();
        let from_file = match file {
            Some(path) => {
                let text = read_key_file(path, observability::reload::read_settled)?;
                let digests = parse_key_file(&text).map(digest).collect();
                (text, digests)
            }
            None => (String::new(), Vec::new()),
        };
        Ok(Arc::new(Self {
            enforced: !listed.is_empty() || file.is_some(),
            listed,
            file: file.map(Path::to_path_buf),
            from_file: RwLock::new(from_file),
        }))
    }

    /// Whether keys are checked (a key list or a key file is configured).
    pub fn enforced(&self) -> bool {
        self.enforced
    }

    /// Checks an `authorization` value (`None`: the request has none).
    ///
    /// Errors: the [`Refusal`] that says what is wrong.
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<(), Refusal> {
        if !self.enforced {
            return Ok(());
        }
        if self.contains(&digest(bearer_key(authorization)?)) {
            Ok(())
        } else {
            Err(Refusal::Wrong)
        }
    }

    /// Whether `presented` is the digest of one of the keys (compared in constant time).
    pub fn contains(&self, presented: &KeyDigest) -> bool {
        let from_file = self.from_file.read().expect("key lock poisoned");
        // No early exit: every configured digest is compared.
        self.listed
            .iter()
            .chain(from_file.1.iter())
            .fold(false, |found, d| found | ct_eq(d, presented))
    }

    /// Re-reads the key file once: a changed content replaces the file's keys (returns `true`);
    /// an unreadable or empty file keeps the last good keys.
    ///
    /// Errors: the file cannot be read, is empty, or kept changing while read.
    pub fn reload(&self) -> Result<bool, KeyFileError> {
        let Some(path) = &self.file else {
            return Ok(false);
        };
        let text = read_key_file(path, observability::reload::reread)?;
        let mut from_file = self.from_file.write().expect("key lock poisoned");
        if from_file.0 == text {
            return Ok(false);
        }
        let digests: Vec<KeyDigest> = parse_key_file(&text).map(digest).collect();
        tracing::info!(path = %path.display(), keys = digests.len(), "API key file changed; keys reloaded");
        *from_file = (text, digests);
        Ok(true)
    }

    /// Spawns the task that re-reads the key file every [`RELOAD_PERIOD`]; `None` without a file.
    pub fn watch(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        self.file.as_ref()?;
        let keys = self.clone();
        Some(observability::reload::poll(
            "API keys",
            RELOAD_PERIOD,
            move || keys.reload(),
        ))
    }
}

/// The keys of a key file's text: one per line, trimmed; blank lines and `#` comments skipped.
pub fn parse_key_file(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
}

/// The key file's text as `read` reads it ([`observability::reload`]'s readers).
fn read_key_file(
    path: &Path,
    read: fn(&Path) -> std::io::Result<Vec<u8>>,
) -> Result<String, KeyFileError> {
    read(path)
        .and_then(observability::reload::utf8)
        .map_err(|source| KeyFileError {
            path: path.to_path_buf(),
            source,
        })
}

/// The key of an `authorization` value `Bearer KEY` (`None`: the request has none).
///
/// Errors: [`Refusal::Missing`] without a value, [`Refusal::TooLong`] over
/// [`MAX_AUTHORIZATION_BYTES`], [`Refusal::Malformed`] for anything but `Bearer KEY`.
pub fn bearer_key(authorization: Option<&[u8]>) -> Result<&str, Refusal> {
    let value = authorization.ok_or(Refusal::Missing)?;
    if value.len() > MAX_AUTHORIZATION_BYTES {
        return Err(Refusal::TooLong);
    }
    let value = std::str::from_utf8(value).map_err(|_| Refusal::Malformed)?;
    let (scheme, key) = value.trim().split_once(' ').ok_or(Refusal::Malformed)?;
    let key = key.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || key.is_empty() {
        return Err(Refusal::Malformed);
    }
    Ok(key)
}

/// SHA-256 of `key`.
pub fn digest(key: &str) -> KeyDigest {
    Sha256::digest(key.as_bytes()).into()
}

/// Constant-time equality of two digests: the time does not depend on where they differ.
pub fn ct_eq(a: &KeyDigest, b: &KeyDigest) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_keys_let_everything_pass() {
        let keys = ApiKeys::open();
        assert!(!keys.enforced());
        assert_eq!(keys.check(None), Ok(()));
        assert_eq!(keys.check(Some(b"Bearer whatever")), Ok(()));
    }

    #[test]
    fn listed_and_file_keys_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, "# team a\n\n  file-key-1  \nfile-key-2\n").unwrap();
        let keys = ApiKeys::load(&["listed".into(), " ".into()], Some(&path)).unwrap();
        assert!(keys.enforced());
        for good in ["Bearer listed", "bearer file-key-1", "Bearer  file-key-2 "] {
            assert_eq!(keys.check(Some(good.as_bytes())), Ok(()), "{good}");
        }
        assert_eq!(keys.check(None), Err(Refusal::Missing));
        for malformed in ["listed", "Basic listed", "Bearer "] {
            assert_eq!(
                keys.check(Some(malformed.as_bytes())),
                Err(Refusal::Malformed),
                "{malformed}"
            );
        }
        assert_eq!(
            keys.check(Some(&b"Bearer \xff"[..])),
            Err(Refusal::Malformed)
        );
        for wrong in ["Bearer listedx", "Bearer # team a", "Bearer file-key"] {
            assert_eq!(
                keys.check(Some(wrong.as_bytes())),
                Err(Refusal::Wrong),
                "{wrong}"
            );
        }
        assert!(!Refusal::Wrong.to_string().contains("file-key"));
        let long = format!("Bearer {}", "k".repeat(MAX_AUTHORIZATION_BYTES));
        assert_eq!(keys.check(Some(long.as_bytes())), Err(Refusal::TooLong));
        assert!(Refusal::TooLong.to_string().contains("8192 bytes"));
        let at_limit = format!("Bearer {}", "k".repeat(MAX_AUTHORIZATION_BYTES - 7));
        assert_eq!(keys.check(Some(at_limit.as_bytes())), Err(Refusal::Wrong));
    }

    #[test]
    fn a_rewritten_file_replaces_its_keys_and_an_unreadable_one_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, "old\n").unwrap();
        let keys = ApiKeys::load(&[], Some(&path)).unwrap();
        assert!(!keys.reload().unwrap());
        std::fs::write(&path, "new\n").unwrap();
        assert!(keys.reload().unwrap());
        assert_eq!(keys.check(Some(b"Bearer new")), Ok(()));
        assert_eq!(keys.check(Some(b"Bearer old")), Err(Refusal::Wrong));
        std::fs::remove_file(&path).unwrap();
        assert!(keys
            .reload()
            .unwrap_err()
            .to_string()
            .contains("cannot read the API key file"));
        assert_eq!(keys.check(Some(b"Bearer new")), Ok(()));
        // Truncated by an in-place rewrite (or emptied): the last good keys stay.
        std::fs::write(&path, "").unwrap();
        assert!(keys
            .reload()
            .unwrap_err()
            .to_string()
            .contains("the file is empty"));
        assert_eq!(keys.check(Some(b"Bearer new")), Ok(()));
        // A file of comments only: keys stay enforced, nobody passes.
        std::fs::write(&path, "# none\n").unwrap();
        assert!(keys.reload().unwrap());
        assert_eq!(keys.check(Some(b"Bearer new")), Err(Refusal::Wrong));
    }

    #[test]
    fn a_missing_file_is_an_error_at_load() {
        let err = ApiKeys::load(&[], Some(Path::new("/nonexistent/keys"))).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/keys"), "{err}");
    }
}
