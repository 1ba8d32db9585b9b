//! The worker library: the gRPC service and what the binary wires around the engine (settings,
//! health, metrics, telemetry, model inspection). The engine, the model description and the
//! backends are crates of their own (`engine`, `model-desc`, `backend-cpu`, `backend-cuda`).
pub mod config;
pub mod draft_vocabulary;
pub mod gie_metrics;
pub mod health;
pub mod inspect;
pub mod metrics;
pub mod model_info;
pub mod service;
pub mod speculation_setting;
pub mod telemetry;
