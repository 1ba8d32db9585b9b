//! The router library.

pub mod admission;
pub mod auth;
pub mod chat_template;
pub mod config;
pub mod deadline;
pub mod discovery;
pub mod drain;
pub mod generate;
pub mod grpc_frames;
pub mod grpc_status;
pub mod health;
pub mod kv_metrics;
pub mod metrics;
pub mod model_choice;
pub mod model_context;
pub mod openai;
pub mod pool;
pub mod request;
pub mod request_guard;
pub mod route_error;
pub mod service;
pub mod stop;
pub mod telemetry;
pub mod tenant_metrics;
pub mod tenants;
pub mod tool_call_stream;
pub mod tool_request;
pub mod validation;

/// The affinity policy lives in the `routing` crate (shared with the fleet simulator).
pub use routing::affinity;
