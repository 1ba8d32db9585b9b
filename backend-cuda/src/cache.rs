//! On-disk cache of compiled kernel modules, keyed by (source, architecture, numeric mode), so that a
//! worker compiles its kernels once per machine and version, and a host without NVRTC can run from a
//! cache filled elsewhere (the CUBINs depend only on the key).
//!
//! Default folder: `$XDG_CACHE_HOME/smollm-serve/cuda`, else `$HOME/.cache/smollm-serve/cuda` (the
//! `cuda_cache_dir` setting overrides it). Files are `<file stem>-<key>.cubin`, written atomically
//! (temporary file, then rename), so concurrent workers never read a partial module.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::compile::{compile, compile_options};
use super::error::CudaError;
use super::kernels::KernelFile;
use super::numerics::Numerics;

/// Bumped when the cache's format or the meaning of a key changes.
const CACHE_FORMAT: &str = "smollm-serve-cuda-cubin-v1";

/// The cache key of `file` compiled for `arch` in `numerics`: hex SHA-256 over the cache format, the
/// NVRTC options (architecture and mode included) and the full source (prelude and file).
pub fn cache_key(file: &KernelFile, arch: &str, numerics: Numerics) -> String {
    let mut h = Sha256::new();
    h.update(CACHE_FORMAT.as_bytes());
    h.update([0]);
    for o in compile_options(arch, numerics, false) {
        h.update(o.as_bytes());
        h.update([0]);
    }
    h.update(file.full_source().as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The cache folder: `configured` when non-empty, else the XDG default (see the module docs).
pub fn cache_dir(configured: &str) -> PathBuf {
    if !configured.trim().is_empty() {
        return PathBuf::from(configured.trim());
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("smollm-serve").join("cuda")
}

/// A folder of compiled modules.
#[derive(Debug, Clone)]
pub struct ModuleCache {
    dir: PathBuf,
}

impl ModuleCache {
    /// The cache in `dir` (created on the first store).
    pub fn new(dir: impl Into<PathBuf>) -> ModuleCache {
        ModuleCache { dir: dir.into() }
    }

    /// The cache folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the module of `file` under `key`.
    pub fn path(&self, file: &KernelFile, key: &str) -> PathBuf {
        let stem = file.name.trim_end_matches(".cu");
        self.dir.join(format!("{stem}-{key}.cubin"))
    }

    /// The cached CUBIN of `file` for `arch` / `numerics`, compiling and storing it on a miss.
    /// Returns the image and whether it came from the cache. A cache that cannot be written only
    /// logs a warning.
    ///
    /// Errors: a miss with NVRTC unavailable, or a compile error (see [`compile`]).
    pub fn load_or_compile(
        &self,
        file: &KernelFile,
        arch: &str,
        numerics: Numerics,
    ) -> Result<(Vec<u8>, bool), CudaError> {
        let path = self.path(file, &cache_key(file, arch, numerics));
        if let Ok(bytes) = std::fs::read(&path) {
            if !bytes.is_empty() {
                return Ok((bytes, true));
            }
        }
        let module = compile(file, arch, numerics, false)?;
        if let Err(e) = self.store(&path, &module.cubin) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the CUDA module cache");
        }
        Ok((module.cubin, false))
    }

    fn store(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    }

    /// Stores `bytes` as the module of `file` for `arch` / `numerics` (used to fill a cache ahead of
    /// time on a machine with NVRTC, see `scripts/gpu-check`).
    pub fn put(
        &self,
        file: &KernelFile,
        arch: &str,
        numerics: Numerics,
        bytes: &[u8],
    ) -> std::io::Result<PathBuf> {
        let path = self.path(file, &cache_key(file, arch, numerics));
        self.store(&path, bytes)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::FILES;
    use super::*;

    #[test]
    fn keys_differ_by_source_arch_and_mode() {
        let f = &FILES[0];
        let k = cache_key(f, "sm_90", Numerics::Exact);
        assert_eq!(k.len(), 64);
        assert_eq!(k, cache_key(f, "sm_90", Numerics::Exact));
        assert_ne!(k, cache_key(f, "sm_80", Numerics::Exact));
        assert_ne!(k, cache_key(f, "sm_90", Numerics::Fast));
        assert_ne!(k, cache_key(&FILES[1], "sm_90", Numerics::Exact));
        let edited = KernelFile {
            source: "// edited\n",
            ..*f
        };
        assert_ne!(k, cache_key(&edited, "sm_90", Numerics::Exact));
    }

    #[test]
    fn hit_needs_no_compiler() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ModuleCache::new(dir.path().join("c"));
        let f = &FILES[2];
        let path = cache.put(f, "sm_90", Numerics::Fast, b"cubin").unwrap();
        assert!(path.starts_with(cache.dir()));
        assert!(path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("rope-"));
        let (bytes, hit) = cache.load_or_compile(f, "sm_90", Numerics::Fast).unwrap();
        assert_eq!((bytes.as_slice(), hit), (&b"cubin"[..], true));
    }

    #[test]
    fn default_dir_follows_xdg() {
        assert_eq!(cache_dir(" /x/y "), PathBuf::from("/x/y"));
        assert!(cache_dir("").ends_with("smollm-serve/cuda"));
    }
}
