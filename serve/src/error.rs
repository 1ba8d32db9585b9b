//! The errors of `serve`, each with the exit code it ends the process with.

use std::path::PathBuf;

/// Why `serve` stopped without a clean shutdown.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The path of the running executable could not be read (to find `worker` and `router`).
    #[error("cannot find the serve executable's folder: {0}")]
    OwnPath(#[source] std::io::Error),
    /// A part's binary is not next to `serve`.
    #[error("{} is missing: build the binaries together with `cargo build --release --bins`", .0.display())]
    MissingBinary(PathBuf),
    /// A part's process could not be started.
    #[error("cannot start the {part}: {source}")]
    Spawn {
        /// `worker` or `router`.
        part: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A part exited while `serve` needed it: before it was ready, or while serving.
    #[error("the {part} exited{}: {message}", exit_code_text(*.code))]
    PartFailed {
        /// `worker` or `router`.
        part: &'static str,
        /// Its exit code (`None`: killed by a signal, or unknown).
        code: Option<i32>,
        /// Its own error line, or its last output lines.
        message: String,
    },
    /// The router printed its ready line but its HTTP API did not report a ready worker in time.
    #[error("the router's HTTP API at {url} did not answer 200 within {seconds} s")]
    NotReady {
        /// The health URL asked.
        url: String,
        /// How long `serve` waited.
        seconds: u64,
    },
    /// A second signal arrived while the parts were stopping: they were killed, not drained.
    #[error("a second signal: the parts were killed without draining")]
    Killed,
    /// A signal handler could not be installed.
    #[error("installing the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
}

fn exit_code_text(code: Option<i32>) -> String {
    match code {
        Some(code) => format!(" with code {code}"),
        None => " (killed by a signal)".to_string(),
    }
}

impl ServeError {
    /// The exit code of `serve` for this error: a part's own non-zero code (2 for a model that
    /// cannot be served or invalid settings), else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            ServeError::PartFailed {
                code: Some(code), ..
            } if (1..=255).contains(code) => *code as u8,
            _ => 1,
        }
    }
}
