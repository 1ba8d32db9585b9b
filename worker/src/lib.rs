//! The worker library.
pub mod arch;
pub mod config;
pub mod cuda;
pub mod describe;
pub mod engine;
pub mod health;
pub mod inspect;
pub mod kv;
pub mod metrics;
pub mod model;
pub mod sampler;
pub mod service;
pub mod telemetry;
