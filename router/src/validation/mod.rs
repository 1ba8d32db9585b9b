//! Request validation: the limits a request is checked against ([`RequestLimits`]), the checks, and
//! [`validate`], the one pass that checks a [`crate::request::GenerationRequest`] against the
//! limits and the served model, tokenizes it (or renders its chat template) and yields a
//! [`ValidRequest`] ready for admission.
//!
//! Each check returns a [`ValidationError`] naming the field, with a message that gives the
//! numbers. The fronts map it to their transport at the edge: `INVALID_ARGUMENT` / `UNIMPLEMENTED`
//! on gRPC ([`crate::grpc_status`]), HTTP 400 / 501 with an OpenAI error object on the HTTP front.
//!
//! - `checks`: the checks, in two phases: [`check_request`] before tokenization (shape, ranges,
//!   stop strings, size) and, once the model is known, [`check_prompt`] (prompt length against the
//!   context and the limits), [`check_prompt_ids`] and [`check_vocab`] (token ids against the
//!   vocabulary), [`check_constraint`] (structured output against the vocabulary). The sampling
//!   parameters are `inference_proto::sampling_limits::SamplingConfig`, checked by its own
//!   `validate` (which the worker runs again) and refused here in the API's wording.
//! - `validate`: the gRPC request's conversion (`GenerationRequest::try_from`, which refuses
//!   `prompt` and `messages` together), [`validate`], [`ValidRequest`] and [`sampling_params`]
//!   (the sampling parameters on the worker protocol).

mod checks;
#[cfg(test)]
mod tests;
mod tools;
mod validate;

pub use checks::{check_constraint, check_prompt, check_prompt_ids, check_request, check_vocab};
pub use validate::{encode_prompt, sampling_params, validate, ValidRequest};

/// Why a request was refused before any work. `field` is the request field at fault, as the gRPC
/// API names it (`max_new_tokens`, `stop`, `logit_bias`, `prompt`, `messages`, `constraint`, ...).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    /// A value is out of range, malformed or does not fit the model (gRPC `INVALID_ARGUMENT`).
    #[error("{message}")]
    Invalid {
        /// The field at fault.
        field: &'static str,
        /// What is wrong, with the numbers.
        message: String,
    },
    /// A feature this build does not provide (gRPC `UNIMPLEMENTED`).
    #[error("{message}")]
    Unsupported {
        /// The field that asks for it.
        field: &'static str,
        /// What is missing.
        message: String,
    },
}

impl ValidationError {
    /// An [`ValidationError::Invalid`] for `field`.
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            field,
            message: message.into(),
        }
    }

    /// The field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Invalid { field, .. } | Self::Unsupported { field, .. } => field,
        }
    }
}

/// The limits every request is checked against (`ModelInfo` reports them all). This is also the
/// router's `limits` settings table as it is read (every key optional, defaults from [`Default`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RequestLimits {
    /// Most stop strings per request.
    pub max_stop_sequences: u32,
    /// Longest stop string, in characters.
    pub max_stop_sequence_chars: u32,
    /// Largest `max_new_tokens` a request may ask for, in tokens.
    pub max_new_tokens: u32,
    /// `max_new_tokens` when a request leaves it unset, before the caps of
    /// [`RequestLimits::default_new_tokens`] and of the room left in the context.
    pub default_max_new_tokens: u32,
    /// Longest prompt, in tokens; 0 means the model's context length minus one.
    pub max_input_tokens: u32,
    /// Largest encoded request, in bytes.
    pub max_request_bytes: u32,
}

impl Default for RequestLimits {
    /// The defaults of the `limits` settings (README: Settings).
    fn default() -> Self {
        Self {
            max_stop_sequences: 8,
            max_stop_sequence_chars: 256,
            max_new_tokens: 4096,
            default_max_new_tokens: 256,
            max_input_tokens: 0,
            max_request_bytes: 1 << 20,
        }
    }
}

impl RequestLimits {
    /// The `max_new_tokens` of a request that leaves it unset, before the context's room:
    /// `min(default_max_new_tokens, max_new_tokens)` (so lowering the maximum alone lowers it too).
    pub fn default_new_tokens(&self) -> u32 {
        self.default_max_new_tokens.min(self.max_new_tokens)
    }
}
