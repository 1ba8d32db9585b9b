//! The worker library.
pub mod config;
pub mod describe;
pub mod engine;
pub mod model;
pub mod sampler;
pub mod service;
