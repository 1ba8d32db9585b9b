//! The CPU llama model: config, weights, KV cache and the f32 forward pass.
//!
//! Entry point: [`LlamaModel::load`], then [`LlamaModel::forward`] with a
//! per-sequence [`KvCache`] from [`LlamaModel::new_cache`].

mod attention;
mod config;
mod error;
mod kv_cache;
mod llama;
pub mod matmul;
pub mod ops;
mod sequence_model;
mod weights;

pub use attention::{attention, HeadShape};
pub use config::LlamaConfig;
pub use error::ModelError;
pub use kv_cache::{KvCache, LayerCache};
pub use llama::LlamaModel;
pub use weights::{LayerWeights, Matrix, ModelWeights};
