//! The command line of `serve`.

use std::path::PathBuf;

use clap::Parser;

/// `serve MODEL [--port 8000] [--grpc-port 50051] [--host 127.0.0.1] [--served-model-name ID]
/// [--api-key KEY] [--threads N]`: every other worker and router setting comes from their settings
/// files and environment (`WORKER_*`, `ROUTER_*`), as when they run alone.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "serve",
    version = build_info::VERSION,
    about = "Serves a model with the OpenAI HTTP API and the gRPC API: starts a worker and a router \
             on 127.0.0.1 and stops both on SIGTERM or Ctrl-C (draining running requests)"
)]
pub struct ServeArgs {
    /// The model: a GGUF file or a Hugging Face model folder (the worker's `--model`).
    #[arg(required_unless_present = "model_flag", conflicts_with = "model_flag")]
    pub model: Option<PathBuf>,
    /// The model, as llama-server's `-m` (instead of the positional MODEL).
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model_flag: Option<PathBuf>,
    /// Port of the OpenAI-compatible HTTP API (`/v1/chat/completions`, ...).
    #[arg(long, default_value_t = 8000, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// Port of the public gRPC API (`inference.v1.TextGeneration`).
    #[arg(long, default_value_t = 50051, value_parser = clap::value_parser!(u16).range(1..))]
    pub grpc_port: u16,
    /// Address both public APIs listen on (`0.0.0.0` for every interface; set `--api-key` then).
    /// The worker always listens on 127.0.0.1.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    /// The id clients name in `model` (the worker's `--served-model-name`; default: the model's
    /// name made an id, which `GET /v1/models` lists).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// An API key requests must carry (`authorization: Bearer KEY`), as vLLM's `--api-key`; repeat
    /// it for several. Handed to the router in its environment (`ROUTER_API_KEYS`), not its
    /// command line.
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_keys: Vec<String>,
    /// The worker's compute threads (its `--threads`; 0 = one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seconds to wait for the router to report a ready worker after both parts started.
    #[arg(long, default_value_t = 120)]
    pub ready_timeout_secs: u64,
}

impl ServeArgs {
    /// The model path, from MODEL or `-m`.
    pub fn model_path(&self) -> &std::path::Path {
        self.model
            .as_deref()
            .or(self.model_flag.as_deref())
            .expect("clap requires MODEL or -m")
    }
}
