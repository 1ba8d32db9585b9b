//! One part of `serve`: a `worker` or `router` child process started from the binary next to
//! `serve`, in its own process group (so that a terminal's Ctrl-C reaches `serve` alone, which
//! stops the parts in order), with its output passed on to `serve`'s standard error and its last
//! lines kept for the message when it fails.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::error::ServeError;

/// How many of a part's last output lines are kept for its failure message.
const TAIL_LINES: usize = 20;

/// How long the output of a part that exited is still read (a process it started could hold the
/// pipes open).
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// A running part.
pub struct Part {
    name: &'static str,
    child: Child,
    pid: u32,
    tail: Arc<Mutex<VecDeque<String>>>,
    /// The tasks copying its standard output and error.
    readers: Vec<JoinHandle<()>>,
    /// Receives each line the part prints on its standard output.
    stdout_lines: mpsc::UnboundedReceiver<String>,
}

/// The path of the binary `name` next to the running executable.
///
/// Errors: [`ServeError::MissingBinary`] when it is not there (the binaries are built together with
/// `cargo build --release --bins`).
pub fn sibling_binary(name: &str) -> Result<PathBuf, ServeError> {
    let exe = std::env::current_exe().map_err(ServeError::OwnPath)?;
    let path = exe
        .parent()
        .map(|dir| dir.join(name))
        .unwrap_or_else(|| PathBuf::from(name));
    match path.is_file() {
        true => Ok(path),
        false => Err(ServeError::MissingBinary(path)),
    }
}

impl Part {
    /// Starts `bin args...` as part `name` (its environment is `serve`'s own plus `env`).
    ///
    /// Errors: [`ServeError::Spawn`] when the process cannot be started.
    pub fn spawn(
        name: &'static str,
        bin: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<Part, ServeError> {
        let mut child = Command::new(bin)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ServeError::Spawn { part: name, source })?;
        let pid = child.id().expect("a child just spawned has an id");
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
        let (tx, stdout_lines) = mpsc::unbounded_channel();
        let mut readers = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            readers.push(tokio::spawn(pass_on(stdout, tail.clone(), Some(tx))));
        }
        if let Some(stderr) = child.stderr.take() {
            readers.push(tokio::spawn(pass_on(stderr, tail.clone(), None)));
        }
        Ok(Part {
            name,
            child,
            pid,
            tail,
            readers,
            stdout_lines,
        })
    }

    /// The part's name (`worker` or `router`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Waits for the part to print a line starting with `prefix` on its standard output and returns
    /// that line.
    ///
    /// Errors: [`ServeError::PartFailed`] when the part exits first.
    pub async fn ready_line(&mut self, prefix: &str) -> Result<String, ServeError> {
        loop {
            tokio::select! {
                line = self.stdout_lines.recv() => match line {
                    Some(line) if line.starts_with(prefix) => return Ok(line),
                    Some(_) => continue,
                    // Its standard output closed: it is exiting.
                    None => {
                        let status = self.child.wait().await.ok();
                        return Err(self.failure(status).await);
                    }
                },
                status = self.child.wait() => {
                    let status = status.ok();
                    return Err(self.failure(status).await);
                }
            }
        }
    }

    /// Waits for the part to exit.
    pub async fn exited(&mut self) -> Option<ExitStatus> {
        self.child.wait().await.ok()
    }

    /// Asks the part to stop gracefully (SIGTERM: it drains, then exits 0).
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Stops the part at once (SIGKILL).
    pub fn kill(&self) {
        self.signal(libc::SIGKILL);
    }

    fn signal(&self, signal: libc::c_int) {
        let Ok(pid) = libc::pid_t::try_from(self.pid) else {
            return;
        };
        // SAFETY: kill(2) only sends a signal. `pid` is our own child, not yet reaped while `self`
        // holds it unwaited (after it exits and is reaped the call fails with ESRCH, or could reach
        // a process that reused the id; `serve` signals a part only before waiting for it).
        unsafe {
            libc::kill(pid, signal);
        }
    }

    /// The error for this part having exited with `status` (`None`: its status is unknown): its
    /// exit code and its own error line (the last line starting with `NAME:`), else its last lines.
    /// Reads the rest of its output first.
    pub async fn failure(&mut self, status: Option<ExitStatus>) -> ServeError {
        for reader in self.readers.drain(..) {
            let _ = tokio::time::timeout(OUTPUT_GRACE, reader).await;
        }
        let tail = self.tail.lock().expect("tail lock");
        let own = format!("{}:", self.name);
        let message = match tail.iter().rev().find(|line| line.starts_with(&own)) {
            Some(line) => line.clone(),
            None => tail.iter().cloned().collect::<Vec<_>>().join("\n"),
        };
        ServeError::PartFailed {
            part: self.name,
            code: status.and_then(|s| s.code()),
            message,
        }
    }
}

/// Copies each line of `from` to `serve`'s standard error, keeps the last [`TAIL_LINES`] in `tail`,
/// and sends each to `lines` while someone listens.
async fn pass_on(
    from: impl AsyncRead + Unpin,
    tail: Arc<Mutex<VecDeque<String>>>,
    lines: Option<mpsc::UnboundedSender<String>>,
) {
    let mut reader = BufReader::new(from).lines();
    while let Ok(Some(line)) = reader.next_line().await {
        eprintln!("{line}");
        {
            let mut tail = tail.lock().expect("tail lock");
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line.clone());
        }
        if let Some(lines) = &lines {
            let _ = lines.send(line);
        }
    }
}
