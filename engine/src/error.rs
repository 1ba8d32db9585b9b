//! [`EngineError`]: why the engine refused or failed one request, as a kind the caller can act on
//! and a message for a person. The gRPC service maps the kinds to status codes.

/// What went wrong with a request, by whose fault and whether it could ever succeed here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineErrorKind {
    /// The request breaks a rule (an empty id or prompt, an id already running, a token id outside
    /// the vocabulary, too long for the context, `max_new_tokens` too small, a sampling parameter
    /// out of range): sending it again fails again.
    InvalidRequest,
    /// The whole sequence (prompt plus `max_new_tokens`) needs more KV blocks than this worker's
    /// cache has, so it can never run here (not a momentary overload: it must not be retried here).
    ExceedsKvCache,
    /// The sequence could not be scheduled although nothing else ran: it does not fit in the KV
    /// cache now.
    NoKvRoom,
    /// The model's step failed or panicked, or returned too few logits: the engine's or the
    /// device's fault, not the request's.
    ModelFailed,
    /// Structured output failed for this sequence (llguidance could not compute its mask or
    /// advance its state): the sequence ends, the engine goes on.
    ConstraintFailed,
}

impl EngineErrorKind {
    /// Whether the engine or the model is at fault (the request was fine); such failures are
    /// logged as warnings.
    pub fn is_internal(self) -> bool {
        matches!(self, Self::ModelFailed | Self::ConstraintFailed)
    }
}

/// One request refused or failed by the engine: its kind and a message naming the cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct EngineError {
    /// What went wrong.
    pub kind: EngineErrorKind,
    /// For a person, e.g. `prompt has no tokens`.
    pub message: String,
}

impl EngineError {
    /// An error of `kind` saying `message`.
    pub fn new(kind: EngineErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// An [`EngineErrorKind::InvalidRequest`] saying `message`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(EngineErrorKind::InvalidRequest, message)
    }
}

/// `error`'s message followed by those of its sources, each after `": "` (what `anyhow`'s `{:#}`
/// prints).
pub(crate) fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{ModelError, StepError};

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_failed_step_reads_with_its_sources_as_anyhow_printed_it() {
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(with_sources(&e), "outer: inner");
        // The step error is transparent: its message and sources are the backend's.
        let step = StepError::Device(Box::new(Outer(std::io::Error::other("inner"))));
        assert_eq!(with_sources(&step), "outer: inner");
        let step = StepError::from(ModelError::EmptyInput { entry: 2 });
        assert_eq!(with_sources(&step), "batch entry 2 has no tokens");
    }

    #[test]
    fn only_the_model_and_the_constraint_failing_are_internal() {
        use EngineErrorKind::*;
        for kind in [InvalidRequest, ExceedsKvCache, NoKvRoom] {
            assert!(!kind.is_internal(), "{kind:?}");
        }
        for kind in [ModelFailed, ConstraintFailed] {
            assert!(kind.is_internal(), "{kind:?}");
        }
    }
}
