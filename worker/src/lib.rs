//! The worker library.
pub mod arch;
pub mod backend;
pub mod config;
pub mod engine;
pub mod health;
pub mod inspect;
pub mod kv;
pub mod metrics;
pub mod model_info;
pub mod sampler;
pub mod service;
pub mod telemetry;
