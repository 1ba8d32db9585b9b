//! gRPC status codes as text.

use tonic::Code;

/// The canonical upper-case name of a gRPC status code (`INVALID_ARGUMENT`, as `google.rpc.Code`
/// spells it). These strings are metric label values (`router_requests_total{code}`, the bench
/// tool's error counts): they never change.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_are_canonical() {
        assert_eq!(code_name(Code::Unavailable), "UNAVAILABLE");
        assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
        assert_eq!(code_name(Code::ResourceExhausted), "RESOURCE_EXHAUSTED");
        assert_eq!(code_name(Code::Unauthenticated), "UNAUTHENTICATED");
    }
}
