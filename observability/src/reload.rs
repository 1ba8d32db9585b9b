//! Re-reading a file-backed setting on change, without a restart: one task per watched thing that
//! calls its `reload` every [`RELOAD_PERIOD`]. Used by the router's API key file and tenants file,
//! the router's worker CA file, and the TLS certificate files of the router and the worker.
//!
//! `reload` returns `Ok(true)` when it took a new content, `Ok(false)` when nothing changed, `Err`
//! when the new content is unusable (unreadable, invalid): the caller keeps its last good value,
//! and this loop logs one WARN per failing streak (not one per period) and one INFO when the file
//! is good again.
//!
//! Every watched file is read with [`read_settled`]: a file that changes while it is read (its
//! size, modification time or inode differ before and after, or the bytes read are not its size)
//! is read again, so a reader never takes half of an in-place rewrite. A re-read also goes through
//! [`reread`], which refuses an empty file (nothing but whitespace): an in-place rewrite
//! (`open("w")`, `>`) truncates the file before it writes it, and a read in between must not replace
//! the last good content with nothing. The safe way to change a watched file is still an atomic
//! replace (write a temporary file in the same folder, then rename it over the old one), as
//! Kubernetes does for Secret and ConfigMap volumes.

use std::fmt::Display;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// How often a watched file is re-read.
pub const RELOAD_PERIOD: Duration = Duration::from_secs(1);

/// Spawns the task that calls `reload` every `period` until the process exits; `what` names the
/// content in the logs (e.g. "API keys": "keeping the last good API keys").
pub fn poll<E, F>(
    what: &'static str,
    period: Duration,
    mut reload: F,
) -> tokio::task::JoinHandle<()>
where
    E: Display,
    F: FnMut() -> Result<bool, E> + Send + 'static,
{
    tokio::spawn(async move {
        let mut failing = false;
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match reload() {
                Ok(_) => {
                    if failing {
                        tracing::info!("the file of the {what} is usable again");
                    }
                    failing = false;
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "keeping the last good {what}");
                    }
                    failing = true;
                }
            }
        }
    })
}

/// How many times [`read_settled`] reads a file that keeps changing before it gives up.
pub const SETTLE_ATTEMPTS: usize = 5;

/// Why a watched file's content was not taken (carried inside the [`io::Error`] the readers
/// return, kind `InvalidData`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnsettledFile {
    /// The file changed during each of [`SETTLE_ATTEMPTS`] reads.
    #[error("the file changed while it was read, {0} times in a row (replace it atomically: write a temporary file, then rename it)")]
    KeptChanging(usize),
    /// A re-read found the file empty (say, truncated by an in-place rewrite not yet written).
    #[error("the file is empty (caught between the truncate and the write of an in-place rewrite?); replace it atomically: write a temporary file, then rename it")]
    Empty,
}

/// What identifies one version of a file: size, modification time and (on Unix) inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

fn stamp(path: &Path) -> io::Result<Stamp> {
    let meta = std::fs::metadata(path)?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Ok(Stamp {
        len: meta.len(),
        modified: meta.modified().ok(),
        inode,
    })
}

/// The whole content of `path`, read again (up to [`SETTLE_ATTEMPTS`] times) while the file
/// changes during the read (see the module docs).
///
/// Errors: the file cannot be read, or kept changing ([`UnsettledFile::KeptChanging`] inside an
/// `InvalidData` error).
pub fn read_settled(path: &Path) -> io::Result<Vec<u8>> {
    for _ in 0..SETTLE_ATTEMPTS {
        let before = stamp(path)?;
        let bytes = std::fs::read(path)?;
        let after = stamp(path)?;
        if before == after && bytes.len() as u64 == after.len {
            return Ok(bytes);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        UnsettledFile::KeptChanging(SETTLE_ATTEMPTS),
    ))
}

/// [`read_settled`] for a re-read: an empty file (nothing but whitespace) is refused, so that the
/// caller keeps its last good content.
///
/// Errors: as [`read_settled`], and [`UnsettledFile::Empty`] inside an `InvalidData` error.
pub fn reread(path: &Path) -> io::Result<Vec<u8>> {
    let bytes = read_settled(path)?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            UnsettledFile::Empty,
        ));
    }
    Ok(bytes)
}

/// `bytes` as UTF-8 text.
///
/// Errors: not UTF-8 (an `InvalidData` error, as [`std::fs::read_to_string`] gives).
pub fn utf8(bytes: Vec<u8>) -> io::Result<String> {
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_reread_is_refused_and_a_plain_read_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, " \n").unwrap();
        assert_eq!(read_settled(&path).unwrap(), b" \n");
        let err = reread(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("the file is empty"), "{err}");
        std::fs::write(&path, "key\n").unwrap();
        assert_eq!(reread(&path).unwrap(), b"key\n");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(reread(&path).unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_file_rewritten_in_place_during_reads_is_never_taken_truncated() {
        // A writer rewrites the file in place (truncate, then write) as fast as it can; every read
        // that is taken must be the whole file (a plain `std::fs::read` takes empty and partial
        // contents here). Most reads find it changing every time, and are refused.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let whole = "a".repeat(256 << 10);
        std::fs::write(&path, &whole).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (path, whole, stop) = (path.clone(), whole.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::fs::write(&path, &whole).unwrap();
                }
            })
        };
        let (mut taken, mut refused) = (0, 0);
        for _ in 0..2000 {
            match reread(&path) {
                Ok(bytes) => {
                    assert_eq!(bytes.len(), whole.len(), "a truncated file was taken");
                    taken += 1;
                }
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
                    refused += 1;
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        assert_eq!(taken + refused, 2000);
        // Once the writer is done, the file is taken whole.
        assert_eq!(reread(&path).unwrap().len(), whole.len());
    }
}
