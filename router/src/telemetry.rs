//! The router's spans. Each `Generate` call gets a `generate` span (an OTLP server span, child of the
//! caller's `traceparent` when it sends one; its `tenant` attribute names the caller's tenant) with children `tokenize`, `queue` (each wait for a
//! worker, failovers included) and `generation` (each worker attempt). The span's W3C context goes
//! to the worker in `AddRequest.trace_context`, where the request's `prefill` and `decode` spans
//! hang under it. Spans are exported only when `otlp_endpoint` is set ([`observability::telemetry`]).

use inference_proto::public::GenerateResponse;
use inference_proto::status::code_name;
use tracing::field::Empty;

use crate::route_error::RouteError;

/// A new `generate` span for a call with `metadata` (its `traceparent`, if any, becomes the parent).
pub fn request_span(metadata: &tonic::metadata::MetadataMap) -> tracing::Span {
    let span = tracing::info_span!(
        "generate",
        otel.kind = "server",
        otel.status_code = Empty,
        otel.status_description = Empty,
        rpc.grpc.status_code = Empty,
        request_id = Empty,
        tenant = Empty,
        prompt_tokens = Empty,
        generated_tokens = Empty,
        finish_reason = Empty,
        failovers = Empty,
    );
    observability::propagation::set_parent_from_metadata(&span, metadata);
    span
}

/// Records the request id (known once the first message is out).
pub fn record_request_id(span: &tracing::Span, request_id: &str) {
    span.record("request_id", request_id);
}

/// Records a finished request's outcome on its span.
pub fn record_finish(span: &tracing::Span, last: &GenerateResponse, finish_reason: &str) {
    span.record("rpc.grpc.status_code", 0);
    span.record("finish_reason", finish_reason);
    if let Some(usage) = &last.usage {
        span.record("prompt_tokens", usage.prompt_tokens);
        span.record("generated_tokens", usage.generated_tokens);
        span.record("failovers", usage.failovers);
    }
}

/// Records a failed request's error on its span, with the gRPC code it is answered with.
pub fn record_error(span: &tracing::Span, error: &RouteError) {
    let code = error.grpc_code();
    span.record("rpc.grpc.status_code", code as i32);
    span.record("otel.status_code", "ERROR");
    span.record(
        "otel.status_description",
        format!("{}: {error}", code_name(code)).as_str(),
    );
}
