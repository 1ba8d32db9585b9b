//! W3C trace context (`traceparent`, `tracestate`) between processes.
//!
//! The router puts the context of a request's span into the request's `AddRequest.trace_context`
//! map (one worker stream carries many requests, so per-request gRPC metadata is not available);
//! the worker makes its spans children of it. Incoming public calls may carry a `traceparent`
//! header, which becomes the parent of the router's request span.
//!
//! Everything here is a no-op while span export is off ([`crate::telemetry::tracing_enabled`]).

use std::collections::HashMap;

use opentelemetry::propagation::Extractor;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::telemetry::tracing_enabled;

/// The trace context of `span` as W3C headers (`traceparent`, ...); empty when span export is off.
pub fn context_of(span: &tracing::Span) -> HashMap<String, String> {
    let mut map = HashMap::new();
    if tracing_enabled() {
        let cx = span.context();
        opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut map));
    }
    map
}

/// The trace context of the current span (see [`context_of`]).
pub fn current_context() -> HashMap<String, String> {
    context_of(&tracing::Span::current())
}

/// Makes the remote span described by `headers` (W3C `traceparent`, ...) the parent of `span`.
/// Call it right after creating `span`. Does nothing when the map holds no valid context.
pub fn set_parent_from_map(span: &tracing::Span, headers: &HashMap<String, String>) {
    if tracing_enabled() && !headers.is_empty() {
        set_parent(span, headers);
    }
}

/// Makes the remote span described by a call's gRPC metadata (`traceparent` header) the parent of
/// `span`. Does nothing when the call carries none.
pub fn set_parent_from_metadata(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    if tracing_enabled() && metadata.contains_key("traceparent") {
        set_parent(span, &MetadataExtractor(metadata));
    }
}

fn set_parent(span: &tracing::Span, carrier: &dyn Extractor) {
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(carrier));
    // Fails only when the span is disabled or already started; either way it stays a root.
    let _ = span.set_parent(cx);
}

struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}
