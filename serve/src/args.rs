//! The command line of `serve`.

use std::path::PathBuf;

use clap::Parser;

/// `serve MODEL [--port 8000] [--grpc-port 50051]`: every other worker and router setting comes from
/// their settings files and environment (`WORKER_*`, `ROUTER_*`), as when they run alone.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "serve",
    version = build_info::VERSION,
    about = "Serves a model with the OpenAI HTTP API and the gRPC API: starts a worker and a router \
             on 127.0.0.1 and stops both on SIGTERM or Ctrl-C (draining running requests)"
)]
pub struct ServeArgs {
    /// The model: a GGUF file or a Hugging Face model folder (the worker's `--model`).
    pub model: PathBuf,
    /// Port of the OpenAI-compatible HTTP API on 127.0.0.1 (`/v1/chat/completions`, ...).
    #[arg(long, default_value_t = 8000, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// Port of the public gRPC API (`inference.v1.TextGeneration`) on 127.0.0.1.
    #[arg(long, default_value_t = 50051, value_parser = clap::value_parser!(u16).range(1..))]
    pub grpc_port: u16,
    /// Seconds to wait for the router to report a ready worker after both parts started.
    #[arg(long, default_value_t = 120)]
    pub ready_timeout_secs: u64,
}
