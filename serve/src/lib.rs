//! `serve MODEL [--port 8000] [--grpc-port 50051]`: one command that serves a model with the OpenAI
//! HTTP API and the gRPC API on 127.0.0.1.
//!
//! It runs the `worker` and `router` binaries that sit next to it as child processes rather than
//! linking both into one process: each part keeps its own settings (files and `WORKER_*` /
//! `ROUTER_*` environment), logs, exit codes and drain on SIGTERM exactly as when run alone, and a
//! crash or abort of one is seen as that part's exit with its own message instead of taking down
//! the other silently.

pub mod args;
pub mod error;
pub mod part;
pub mod supervise;
