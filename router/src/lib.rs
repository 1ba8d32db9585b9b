//! The router library.

pub mod bench;
pub mod chat_template;
pub mod config;
pub mod detokenizer;
pub mod generate;
pub mod model_context;
pub mod pool;
pub mod service;
pub mod stop;
pub mod tokenizer;
pub mod validation;
