//! Why a request was refused or failed on its way through the router: one typed error for the whole
//! dispatch path (validation, drain, admission, waiting for a worker, failover, the worker's own
//! verdict, the deadline). It knows no transport: the gRPC front turns it into a `tonic::Status`
//! ([`crate::grpc_status`]), the HTTP front into OpenAI's error object
//! ([`crate::openai::error::ApiError::from_route`]), and the metrics count it by its gRPC code name
//! (`router_requests_total{code}`).
//!
//! Every message names the numbers behind the refusal (limits, counts, waits), so a client can act
//! on it; the texts are part of the API (clients and tests match them).

use std::time::Duration;

use inference_proto::worker::RequestError;

use crate::admission::QueueFull;
use crate::model_choice::ModelChoiceError;
use crate::tenants::quota::AdmissionRefusal;
use crate::tenants::QuotaExceeded;
use crate::validation::ValidationError;

/// Why a request did not start, or stopped before its last token.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RouteError {
    /// The request is invalid, or asks for a feature this build lacks.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The request's `model` names no served model, or names none where several are served.
    #[error(transparent)]
    Model(#[from] ModelChoiceError),
    /// The router is draining (shutting down) and takes no new requests.
    #[error("the router is shutting down and takes no new requests; retry on another router")]
    Draining,
    /// The router's drain timeout passed while the request was still running: it was cancelled
    /// (on its worker, or left the queue) so that the router can exit.
    #[error(
        "router shutting down: drain timeout expired after {timeout_ms} ms (drain_timeout_ms) \
         with the request still running; it was cancelled, retry on another replica"
    )]
    DrainTimeout {
        /// The `drain_timeout_ms` setting.
        timeout_ms: u64,
    },
    /// No worker is configured or discovered at all.
    #[error(
        "no workers are known (set --workers HOST:PORT, or discovery_dns to a name that resolves)"
    )]
    NoWorkersKnown,
    /// None of the `configured` workers is ready now (new requests are refused at once).
    #[error("no worker is ready (0 of {configured} known); retry shortly")]
    NoWorkerReady {
        /// Workers known to the router.
        configured: usize,
    },
    /// The admission queue is full (overload; the client may retry later), or the tenant's share
    /// of it, or a sheddable request was displaced from it.
    #[error(transparent)]
    Overloaded(#[from] QueueFull),
    /// The tenant is over one of its quotas (`max_concurrent`, `requests_per_second`,
    /// `tokens_per_minute`); the client may retry after [`RouteError::retry_after`].
    #[error(transparent)]
    Quota(#[from] QuotaExceeded),
    /// A queued request waited `waited_ms` (the failover timeout) without a ready worker.
    #[error("no worker is ready ({ready} of {configured} known); waited {waited_ms} ms for one")]
    NoWorkerInTime {
        /// Workers ready when it gave up.
        ready: usize,
        /// Workers known to the router.
        configured: usize,
        /// How long it waited, in milliseconds.
        waited_ms: u128,
    },
    /// The request lost its worker again after `max_failovers` failovers.
    #[error(
        "{reason}; the request already moved to another worker {failovers} times \
         (max_failovers = {max_failovers}), giving up after {generated} generated tokens"
    )]
    FailoversExhausted {
        /// Why the last worker was lost.
        reason: String,
        /// Failovers so far.
        failovers: u32,
        /// The `max_failovers` setting.
        max_failovers: u32,
        /// Tokens generated before it gave up.
        generated: usize,
    },
    /// The request lost its worker (`reason`) and no worker took it over (`cause`: why waiting for
    /// one failed).
    #[error(
        "{reason}, and no worker is left to continue the request: {cause} ({generated} tokens had \
         been generated)"
    )]
    NoWorkerLeft {
        /// Why the worker was lost.
        reason: String,
        /// Why no other worker continued it.
        cause: Box<RouteError>,
        /// Tokens generated before it was lost.
        generated: usize,
    },
    /// The call's deadline passed; the request was cancelled on its worker (or left the queue).
    #[error(
        "the call's deadline passed after {elapsed_ms} ms and {generated} generated tokens; the \
         request was cancelled"
    )]
    DeadlineExceeded {
        /// Milliseconds since the call arrived.
        elapsed_ms: u128,
        /// Tokens generated before the deadline.
        generated: u32,
    },
    /// The client read none of the `buffered` messages waiting for it within `waited_ms` (the
    /// `slow_client_timeout_ms` setting); the request was cancelled on its worker.
    #[error(
        "the client read nothing for {waited_ms} ms while {buffered} messages waited for it \
         (slow_client_timeout_ms); the request was cancelled after {generated} generated tokens"
    )]
    ClientTooSlow {
        /// How long the full buffer waited, in milliseconds.
        waited_ms: u128,
        /// Messages the stream held for the client.
        buffered: usize,
        /// Tokens generated before it was cancelled.
        generated: u32,
    },
    /// The worker refused or could not finish the request.
    #[error(transparent)]
    Worker(#[from] WorkerFailure),
    /// A fault of the router itself (a broken invariant, a task that panicked).
    #[error("{0}")]
    Internal(String),
}

impl RouteError {
    /// The refusal while no worker is ready, given the number of known workers:
    /// [`RouteError::NoWorkersKnown`] or [`RouteError::NoWorkerReady`].
    pub fn no_worker(configured: usize) -> Self {
        if configured == 0 {
            Self::NoWorkersKnown
        } else {
            Self::NoWorkerReady { configured }
        }
    }

    /// How long the client should wait before retrying, when the refusal says (a tenant's bucket
    /// quota: computed from the bucket's refill).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Quota(q) => q.retry_after(),
            _ => None,
        }
    }
}

impl From<AdmissionRefusal> for RouteError {
    fn from(refusal: AdmissionRefusal) -> Self {
        match refusal {
            AdmissionRefusal::Quota(q) => Self::Quota(q),
            AdmissionRefusal::Invalid(e) => Self::Invalid(e),
        }
    }
}

/// A request error reported by a worker (`StepOutput.errors`), with the worker's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct WorkerFailure {
    /// What kind of failure the worker reported.
    pub kind: WorkerFailureKind,
    /// The worker's message.
    pub message: String,
}

/// The kind of a worker's request error, from its wire code (a `google.rpc.Code` value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerFailureKind {
    /// The worker rejected the request (`INVALID_ARGUMENT`): e.g. prompt plus `max_new_tokens`
    /// need more KV blocks than the worker has, or a constraint that does not compile.
    Rejected,
    /// The sequence does not fit in the worker's KV cache even with every block free
    /// (`RESOURCE_EXHAUSTED`).
    DoesNotFit,
    /// The worker failed while running the request (`INTERNAL`): the model or the constraint
    /// failed for this sequence.
    Failed,
    /// The worker handed the request back (`UNAVAILABLE`, e.g. it is draining): the pool fails it
    /// over to another worker, so a client hears of it only as the reason of a later failure.
    HandedBack,
    /// Any other code the worker sent, kept as it came.
    Other(i32),
}

impl WorkerFailureKind {
    /// The kind of a worker error's wire `code`.
    pub fn from_wire(code: i32) -> Self {
        match tonic::Code::from(code) {
            tonic::Code::InvalidArgument => Self::Rejected,
            tonic::Code::ResourceExhausted => Self::DoesNotFit,
            tonic::Code::Internal => Self::Failed,
            tonic::Code::Unavailable => Self::HandedBack,
            _ => Self::Other(code),
        }
    }
}

impl From<RequestError> for WorkerFailure {
    fn from(error: RequestError) -> Self {
        Self {
            kind: WorkerFailureKind::from_wire(error.code),
            message: error.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_wire_codes_become_kinds_and_keep_the_message() {
        for (code, kind) in [
            (3, WorkerFailureKind::Rejected),
            (8, WorkerFailureKind::DoesNotFit),
            (13, WorkerFailureKind::Failed),
            (14, WorkerFailureKind::HandedBack),
            (5, WorkerFailureKind::Other(5)),
            (99, WorkerFailureKind::Other(99)),
        ] {
            let failure = WorkerFailure::from(RequestError {
                request_id: "r1".into(),
                code,
                message: "why".into(),
            });
            assert_eq!(failure.kind, kind, "code {code}");
            assert_eq!(failure.message, "why");
        }
    }

    #[test]
    fn no_worker_distinguishes_none_known_from_none_ready() {
        assert_eq!(RouteError::no_worker(0), RouteError::NoWorkersKnown);
        assert_eq!(
            RouteError::no_worker(3),
            RouteError::NoWorkerReady { configured: 3 }
        );
    }
}
