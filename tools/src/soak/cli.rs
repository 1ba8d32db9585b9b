//! `bench soak`'s command line.

use std::path::PathBuf;

use clap::Parser;

/// `bench soak` command line (`scripts/soak` passes the model and the run's folder).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "bench soak",
    about = "Soak with faults: 3 workers and 2 routers on 127.0.0.1 under a mixed load on both \
             fronts while workers are killed, stopped and a router restarted; checks that every \
             request is answered, greedy outputs are unchanged, memory is flat, KV blocks return \
             to 0 and busy workers stay ready",
    after_help = "Exit status: 0 when every target holds, 1 when one fails (or the run could not \
                  be carried out), 2 for a bad command line. The last line is the summary."
)]
pub struct SoakArgs {
    /// The model every worker serves (GGUF file or Hugging Face folder).
    #[arg(long)]
    pub model: PathBuf,
    /// Seconds of load (at least 60); the faults are spread over it.
    #[arg(long, default_value_t = 1800)]
    pub duration: u64,
    /// Steady closed-loop clients (the burst adds 4x as many).
    #[arg(long, default_value_t = 3)]
    pub clients: usize,
    /// Seconds between samples.
    #[arg(long, default_value_t = 30)]
    pub sample_secs: u64,
    /// A request with no answer (message or status) for this many seconds is hung.
    #[arg(long, default_value_t = 120)]
    pub hang_secs: u64,
    /// Each worker's KV cache, MiB.
    #[arg(long, default_value_t = 256)]
    pub kv_cache_mib: u32,
    /// Seed of the prompts and the request mix.
    #[arg(long, default_value_t = 31)]
    pub seed: u64,
    /// Folder for the processes' logs and the records (`records.jsonl`); default: a new folder
    /// under the system's temporary folder.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

impl SoakArgs {
    /// Checks the settings.
    ///
    /// Errors: a message naming the offending flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        use anyhow::ensure;
        ensure!(self.duration >= 60, "--duration must be at least 60 s");
        ensure!(self.clients >= 1, "--clients must be at least 1");
        ensure!(self.sample_secs >= 1, "--sample-secs must be at least 1");
        ensure!(self.hang_secs >= 10, "--hang-secs must be at least 10");
        ensure!(
            self.kv_cache_mib >= 64,
            "--kv-cache-mib must be at least 64"
        );
        Ok(())
    }
}
