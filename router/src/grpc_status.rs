//! The gRPC edge of the router's errors: each [`RouteError`] (and [`ValidationError`]) becomes a
//! `tonic::Status` with the error's message, only where a gRPC call answers.
//!
//! | error | gRPC code |
//! |---|---|
//! | [`ValidationError::Invalid`], worker [`WorkerFailureKind::Rejected`] | `INVALID_ARGUMENT` |
//! | [`ValidationError::Unsupported`] | `UNIMPLEMENTED` |
//! | draining (a new call, or one cut off by the drain timeout), no worker (known, ready, in time, left), failovers exhausted, worker [`WorkerFailureKind::HandedBack`] | `UNAVAILABLE` |
//! | admission queue full, tenant quota or queue share, displaced sheddable request, worker [`WorkerFailureKind::DoesNotFit`] | `RESOURCE_EXHAUSTED` |
//! | deadline passed | `DEADLINE_EXCEEDED` |
//! | worker [`WorkerFailureKind::Failed`], router fault | `INTERNAL` |
//! | worker [`WorkerFailureKind::Other`] | the worker's code |
//!
//! A refusal with a retry hint ([`RouteError::retry_after`], a tenant's bucket quota) carries it
//! as `retry-after-ms` metadata (whole milliseconds, rounded up).
//!
//! The same code names label `router_requests_total{code}` ([`crate::metrics`]).

use tonic::{Code, Status};

use crate::model_choice::ModelChoiceError;
use crate::route_error::{RouteError, WorkerFailureKind};
use crate::validation::ValidationError;

impl ValidationError {
    /// The gRPC code this error is answered with.
    pub fn grpc_code(&self) -> Code {
        match self {
            ValidationError::Invalid { .. } => Code::InvalidArgument,
            ValidationError::Unsupported { .. } => Code::Unimplemented,
        }
    }
}

impl RouteError {
    /// The gRPC code this error is answered with (see the module table).
    pub fn grpc_code(&self) -> Code {
        match self {
            RouteError::Invalid(e) => e.grpc_code(),
            RouteError::Model(ModelChoiceError::Unknown { .. }) => Code::NotFound,
            RouteError::Model(ModelChoiceError::Unnamed { .. }) => Code::InvalidArgument,
            RouteError::Draining
            | RouteError::DrainTimeout { .. }
            | RouteError::NoWorkersKnown
            | RouteError::NoWorkerReady { .. }
            | RouteError::NoWorkerInTime { .. }
            | RouteError::FailoversExhausted { .. }
            | RouteError::NoWorkerLeft { .. } => Code::Unavailable,
            RouteError::Overloaded(_) | RouteError::Quota(_) | RouteError::ClientTooSlow { .. } => {
                Code::ResourceExhausted
            }
            RouteError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
            RouteError::Worker(failure) => match failure.kind {
                WorkerFailureKind::Rejected => Code::InvalidArgument,
                WorkerFailureKind::DoesNotFit => Code::ResourceExhausted,
                WorkerFailureKind::Failed => Code::Internal,
                WorkerFailureKind::HandedBack => Code::Unavailable,
                WorkerFailureKind::Other(code) => Code::from(code),
            },
            RouteError::Internal(_) => Code::Internal,
        }
    }
}

impl From<ValidationError> for Status {
    fn from(e: ValidationError) -> Self {
        Status::new(e.grpc_code(), e.to_string())
    }
}

impl From<RouteError> for Status {
    fn from(e: RouteError) -> Self {
        let mut status = Status::new(e.grpc_code(), e.to_string());
        if let Some(wait) = e.retry_after() {
            let ms = wait.as_micros().div_ceil(1000).to_string();
            if let Ok(value) = ms.parse() {
                status.metadata_mut().insert("retry-after-ms", value);
            }
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::QueueFull;
    use crate::route_error::WorkerFailure;

    fn worker(kind: WorkerFailureKind) -> RouteError {
        RouteError::Worker(WorkerFailure {
            kind,
            message: "worker says no".into(),
        })
    }

    /// Every variant, with the code and message a gRPC client sees.
    fn cases() -> Vec<(RouteError, Code, &'static str)> {
        vec![
            (
                ValidationError::invalid("stop", "too many stop sequences").into(),
                Code::InvalidArgument,
                "too many stop sequences",
            ),
            (
                ValidationError::Unsupported {
                    field: "constraint",
                    message: "no structured output here".into(),
                }
                .into(),
                Code::Unimplemented,
                "no structured output here",
            ),
            (
                ModelChoiceError::Unknown {
                    requested: "gpt-4o".into(),
                    served: vec!["a".into(), "b".into()],
                }
                .into(),
                Code::NotFound,
                "the model `gpt-4o` does not exist; this router serves `a`, `b`",
            ),
            (
                ModelChoiceError::Unnamed {
                    served: vec!["a".into(), "b".into()],
                }
                .into(),
                Code::InvalidArgument,
                "the request names no model and this router serves several (`a`, `b`); set \
                 `model` to one of them",
            ),
            (
                RouteError::Draining,
                Code::Unavailable,
                "the router is shutting down and takes no new requests; retry on another router",
            ),
            (
                RouteError::DrainTimeout { timeout_ms: 1500 },
                Code::Unavailable,
                "router shutting down: drain timeout expired after 1500 ms (drain_timeout_ms) with \
                 the request still running; it was cancelled, retry on another replica",
            ),
            (
                RouteError::NoWorkersKnown,
                Code::Unavailable,
                "no workers are known (set --workers HOST:PORT, or discovery_dns to a name that \
                 resolves)",
            ),
            (
                RouteError::NoWorkerReady { configured: 2 },
                Code::Unavailable,
                "no worker is ready (0 of 2 known); retry shortly",
            ),
            (
                QueueFull::Requests { waiting: 4, max: 4 }.into(),
                Code::ResourceExhausted,
                "the router is at capacity: 4 requests are already waiting for a worker \
                 (max_waiting_requests = 4); retry later",
            ),
            (
                QueueFull::Tokens {
                    waiting: 90,
                    adding: 20,
                    max: 100,
                }
                .into(),
                Code::ResourceExhausted,
                "the router is at capacity: 90 tokens are waiting for a worker and this request \
                 adds 20 (max_waiting_tokens = 100); retry later",
            ),
            (
                RouteError::NoWorkerInTime {
                    ready: 0,
                    configured: 1,
                    waited_ms: 500,
                },
                Code::Unavailable,
                "no worker is ready (0 of 1 known); waited 500 ms for one",
            ),
            (
                RouteError::FailoversExhausted {
                    reason: "worker w disconnected".into(),
                    failovers: 3,
                    max_failovers: 3,
                    generated: 7,
                },
                Code::Unavailable,
                "worker w disconnected; the request already moved to another worker 3 times \
                 (max_failovers = 3), giving up after 7 generated tokens",
            ),
            (
                RouteError::NoWorkerLeft {
                    reason: "worker w disconnected".into(),
                    cause: Box::new(RouteError::NoWorkerInTime {
                        ready: 0,
                        configured: 1,
                        waited_ms: 500,
                    }),
                    generated: 7,
                },
                Code::Unavailable,
                "worker w disconnected, and no worker is left to continue the request: no worker \
                 is ready (0 of 1 known); waited 500 ms for one (7 tokens had been generated)",
            ),
            (
                RouteError::DeadlineExceeded {
                    elapsed_ms: 250,
                    generated: 3,
                },
                Code::DeadlineExceeded,
                "the call's deadline passed after 250 ms and 3 generated tokens; the request was \
                 cancelled",
            ),
            (
                RouteError::ClientTooSlow {
                    waited_ms: 750,
                    buffered: 63,
                    generated: 90,
                },
                Code::ResourceExhausted,
                "the client read nothing for 750 ms while 63 messages waited for it \
                 (slow_client_timeout_ms); the request was cancelled after 90 generated tokens",
            ),
            (
                worker(WorkerFailureKind::Rejected),
                Code::InvalidArgument,
                "worker says no",
            ),
            (
                worker(WorkerFailureKind::DoesNotFit),
                Code::ResourceExhausted,
                "worker says no",
            ),
            (
                worker(WorkerFailureKind::Failed),
                Code::Internal,
                "worker says no",
            ),
            (
                worker(WorkerFailureKind::HandedBack),
                Code::Unavailable,
                "worker says no",
            ),
            (
                worker(WorkerFailureKind::Other(Code::NotFound as i32)),
                Code::NotFound,
                "worker says no",
            ),
            (
                RouteError::Internal("the ticket was already used".into()),
                Code::Internal,
                "the ticket was already used",
            ),
        ]
    }

    #[test]
    fn every_error_becomes_its_status() {
        for (error, code, message) in cases() {
            let status = Status::from(error.clone());
            assert_eq!(status.code(), code, "{error:?}");
            assert_eq!(status.message(), message, "{error:?}");
        }
    }
}
