//! Router settings: defaults < TOML file < environment (`ROUTER_*`) < command-line flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Deserializer, Serialize};

/// Command-line flags. Every flag is optional here so that the file and environment can supply it.
#[derive(Debug, Parser, Serialize)]
#[command(
    name = "router",
    about = "Serves the public TextGeneration gRPC API over a set of workers"
)]
pub struct Cli {
    /// TOML settings file (also `ROUTER_CONFIG`).
    #[arg(long, env = "ROUTER_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Worker addresses, comma separated: HOST:PORT[,HOST:PORT...].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<String>,
    /// Address to serve the public gRPC API on, e.g. 127.0.0.1:50051.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
}

/// Validation limits applied to every request (all reported by `ModelInfo`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Most stop strings per request.
    pub max_stop_sequences: u32,
    /// Longest stop string, in characters.
    pub max_stop_sequence_chars: u32,
    /// Largest `max_new_tokens` a request may ask for, in tokens.
    pub max_new_tokens: u32,
    /// `max_new_tokens` when a request leaves it unset (capped by the room left in the context).
    pub default_max_new_tokens: u32,
    /// Longest prompt, in tokens; 0 means the model's context length minus one.
    pub max_input_tokens: u32,
    /// Largest encoded request, in bytes.
    pub max_request_bytes: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_stop_sequences: 8,
            max_stop_sequence_chars: 256,
            max_new_tokens: 4096,
            default_max_new_tokens: 256,
            max_input_tokens: 0,
            max_request_bytes: 1 << 20,
        }
    }
}

/// The router's effective settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouterSettings {
    /// Public gRPC listen address.
    pub listen: SocketAddr,
    /// Worker addresses (`HOST:PORT`). A comma-separated string is accepted too.
    #[serde(deserialize_with = "string_or_list")]
    pub workers: Vec<String>,
    /// First reconnect delay after a worker connection fails, in ms (doubles up to the max).
    pub reconnect_initial_ms: u64,
    /// Longest reconnect delay, in ms.
    pub reconnect_max_ms: u64,
    /// Request validation limits.
    pub limits: Limits,
    /// Log filter in `tracing_subscriber::EnvFilter` syntax (also `RUST_LOG`).
    pub log: String,
}

impl Default for RouterSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:50051".parse().expect("valid default address"),
            workers: Vec::new(),
            reconnect_initial_ms: 100,
            reconnect_max_ms: 5_000,
            limits: Limits::default(),
            log: "info".into(),
        }
    }
}

impl RouterSettings {
    /// Merges defaults, the TOML file named by `cli.config`, `ROUTER_*` variables (nested keys with
    /// `__`, e.g. `ROUTER_LIMITS__MAX_NEW_TOKENS`) and `cli`.
    ///
    /// Errors: an unreadable or invalid file, or a value of the wrong type.
    pub fn load(cli: &Cli) -> Result<Self, Box<figment::Error>> {
        let mut figment = Figment::from(Serialized::defaults(Self::default()));
        if let Some(path) = &cli.config {
            figment = figment.merge(Toml::file_exact(path));
        }
        figment
            .merge(Env::prefixed("ROUTER_").split("__").ignore(&["config"]))
            .merge(Serialized::defaults(cli))
            .extract()
            .map_err(Box::new)
    }

    /// The reconnect backoff bounds.
    pub fn backoff(&self) -> (Duration, Duration) {
        (
            Duration::from_millis(self.reconnect_initial_ms.max(1)),
            Duration::from_millis(self.reconnect_max_ms.max(self.reconnect_initial_ms.max(1))),
        )
    }
}

fn string_or_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        One(String),
        Many(Vec<String>),
    }
    let items = match Either::deserialize(d)? {
        Either::One(s) => s.split(',').map(str::to_string).collect(),
        Either::Many(v) => v,
    };
    Ok(items
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure signature
    fn precedence_file_env_flags() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "r.toml",
                "workers = ['a:1', 'b:2']\n[limits]\nmax_new_tokens = 10\nmax_stop_sequences = 2",
            )?;
            jail.set_env("ROUTER_LIMITS__MAX_NEW_TOKENS", "20");
            let cli = Cli::parse_from(["router", "--config", "r.toml", "--listen", "127.0.0.1:9"]);
            let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.workers, vec!["a:1", "b:2"]);
            assert_eq!(s.limits.max_new_tokens, 20);
            assert_eq!(s.limits.max_stop_sequences, 2);
            assert_eq!(s.listen.port(), 9);
            let cli = Cli::parse_from(["router", "--workers", "x:1, y:2"]);
            let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.workers, vec!["x:1", "y:2"]);
            Ok(())
        });
    }
}
