//! The sampling parameters and their accepted ranges (`GenerateRequest` and the worker protocol's
//! `SamplingParams`): the router checks requests against them, and the worker's engine checks again
//! because it does not trust its callers. One definition, so the two can never disagree.
//!
//! - The `MAX_*` constants: the ranges.
//! - [`SamplingConfig`] (`params.rs`): one request's parameters, the one shape the router's
//!   validation yields and the engine's sampler reads, with [`SamplingConfig::validate`], the range
//!   check both run, and its [`SamplingError`].
//!
//! A crate of its own, with no dependencies, so that the engine can share the parameters without
//! depending on the wire format (`inference-proto` re-exports it as `sampling_limits`).

mod params;
#[cfg(test)]
mod tests;

pub use params::{SamplingConfig, SamplingError};

/// Largest accepted `min_p` (a probability ratio).
pub const MAX_MIN_P: f32 = 1.0;
/// Largest accepted `repetition_penalty` (CTRL; 1 = off).
pub const MAX_REPETITION_PENALTY: f32 = 10.0;
/// Largest accepted magnitude of `frequency_penalty` and `presence_penalty` (OpenAI's range).
pub const MAX_ABS_PENALTY: f32 = 2.0;
/// Largest accepted magnitude of a `logit_bias` value (OpenAI's range).
pub const MAX_ABS_LOGIT_BIAS: f32 = 100.0;
/// Most `logit_bias` entries per request (OpenAI's limit).
pub const MAX_LOGIT_BIAS_ENTRIES: usize = 300;
/// Largest accepted `top_logprobs` (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;
