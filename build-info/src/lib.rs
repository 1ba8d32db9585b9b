//! What a binary was built from, for `--version` and the `build_info` metric: the workspace's
//! package version and the git commit (12 hex digits, from `git rev-parse` at build time, the
//! `BUILD_GIT_COMMIT` environment variable when set, or `unknown` outside a git checkout).

/// The package version, e.g. `0.1.0`.
pub const PACKAGE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binary was built from, e.g. `b5164ce1a2b3`, or `unknown`.
pub const COMMIT: &str = env!("BUILD_GIT_COMMIT");

/// What `--version` prints after the binary's name, e.g. `0.1.0 (commit b5164ce1a2b3)`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("BUILD_GIT_COMMIT"),
    ")"
);

#[cfg(test)]
mod tests {
    #[test]
    fn version_names_the_package_and_the_commit() {
        assert!(super::VERSION.starts_with(super::PACKAGE_VERSION));
        assert!(super::VERSION.contains(super::COMMIT));
        assert!(!super::COMMIT.is_empty());
        assert!(super::COMMIT.chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
