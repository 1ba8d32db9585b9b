//! Worker settings: defaults < TOML file < environment (`WORKER_*`) < command-line flags.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

/// Command-line flags. Every flag is optional here so that the file and environment can supply it.
#[derive(Debug, Parser, Serialize)]
#[command(
    name = "worker",
    about = "Loads a GGUF model and serves it to routers over gRPC"
)]
pub struct Cli {
    /// TOML settings file (also `WORKER_CONFIG`).
    #[arg(long, env = "WORKER_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Path of the GGUF model file.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// Address to serve gRPC on, e.g. 127.0.0.1:50061.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Compute threads (0 = one per core).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
}

/// The worker's effective settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSettings {
    /// GGUF model file. Required.
    pub model: Option<PathBuf>,
    /// gRPC listen address.
    pub listen: SocketAddr,
    /// Compute threads; 0 means one per available core.
    pub threads: usize,
    /// Log filter in `tracing_subscriber::EnvFilter` syntax (also `RUST_LOG`).
    pub log: String,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            model: None,
            listen: "127.0.0.1:50061".parse().expect("valid default address"),
            threads: 0,
            log: "info".into(),
        }
    }
}

impl WorkerSettings {
    /// Merges defaults, the TOML file named by `cli.config`, `WORKER_*` variables and `cli`.
    ///
    /// Errors: an unreadable or invalid file, or a value of the wrong type (figment's message names
    /// the key and where it came from).
    pub fn load(cli: &Cli) -> Result<Self, Box<figment::Error>> {
        let mut figment = Figment::from(Serialized::defaults(Self::default()));
        if let Some(path) = &cli.config {
            figment = figment.merge(Toml::file_exact(path));
        }
        figment
            .merge(Env::prefixed("WORKER_").ignore(&["config"]))
            .merge(Serialized::defaults(cli))
            .extract()
            .map_err(Box::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure signature
    fn precedence_file_env_flags() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "w.toml",
                "listen = '127.0.0.1:7000'\nthreads = 3\nmodel = 'a.gguf'",
            )?;
            jail.set_env("WORKER_THREADS", "5");
            let cli = Cli::parse_from(["worker", "--config", "w.toml", "--model", "b.gguf"]);
            let s = WorkerSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.listen.port(), 7000);
            assert_eq!(s.threads, 5);
            assert_eq!(s.model, Some(PathBuf::from("b.gguf")));
            Ok(())
        });
    }
}
