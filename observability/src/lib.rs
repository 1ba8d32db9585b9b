//! Operations plumbing shared by the `router` and `worker` binaries.
//!
//! - [`telemetry`]: the `tracing` subscriber (log lines, plus OpenTelemetry spans exported over OTLP
//!   gRPC when an endpoint is set).
//! - [`propagation`]: W3C trace context (`traceparent`) into and out of string maps and gRPC
//!   metadata, so a request's spans on the router and on its worker form one trace.
//! - [`metrics_http`]: the Prometheus text endpoint (`GET /metrics`), OpenMetrics or, for clients
//!   that do not ask for it, the 0.0.4 text format ([`text_format`]).
//! - [`process_metrics`]: the standard `process_*` metrics and `build_info`.
//! - [`grpc`]: the standard gRPC reflection service.
//! - [`reload`]: re-reads a file-backed setting (API keys, TLS certificates) on change.

pub mod const_metrics;
pub mod grpc;
pub mod metrics_http;
pub mod process;
pub mod process_metrics;
pub mod propagation;
pub mod reload;
pub mod telemetry;
pub mod text_format;
