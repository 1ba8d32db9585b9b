//! The process's `tracing` subscriber: formatted log lines filtered by the `log` setting, plus, when
//! an OTLP endpoint is set, an OpenTelemetry layer that exports this crate family's spans over OTLP
//! gRPC (batched, on a background thread).
//!
//! Only spans from the `router` and `worker` crates at INFO or above are exported (never the
//! transport's own: the exporter's gRPC calls must not trace themselves). The exporter honours the
//! standard `OTEL_*` variables it reads (e.g. `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Crates whose spans are exported.
const TRACED_CRATES: [&str; 3] = ["router", "worker", "observability"];

static TRACING_ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (an OTLP endpoint is set). Callers skip building spans that exist
/// only for traces when it is not.
pub fn tracing_enabled() -> bool {
    TRACING_ENABLED.load(Ordering::Relaxed)
}

/// What [`init`] sets up.
#[derive(Debug, Clone)]
pub struct TelemetrySettings {
    /// `service.name` of the exported spans (unless `OTEL_SERVICE_NAME` says otherwise).
    pub service_name: &'static str,
    /// Log filter in `EnvFilter` syntax; `RUST_LOG` wins when set.
    pub log_filter: String,
    /// OTLP gRPC endpoint, e.g. `http://127.0.0.1:4317`; empty = no span export.
    pub otlp_endpoint: String,
}

/// Flushes and stops the span exporter when dropped. Drop it while the tokio runtime that built it
/// still runs (the exporter's connection lives there), and after the last span closed.
#[must_use = "dropping the guard stops span export"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            TRACING_ENABLED.store(false, Ordering::Relaxed);
            if let Err(e) = provider.shutdown_with_timeout(Duration::from_secs(5)) {
                eprintln!("flushing spans failed: {e}");
            }
        }
    }
}

/// Installs the global subscriber (and the W3C trace-context propagator). Must run inside a tokio
/// runtime when an OTLP endpoint is set (the exporter's gRPC channel is created there).
///
/// Errors: an invalid log filter or OTLP endpoint, or a subscriber already installed.
pub fn init(settings: &TelemetrySettings) -> anyhow::Result<TelemetryGuard> {
    let filter = match EnvFilter::try_from_default_env() {
        Ok(filter) => filter,
        Err(_) => EnvFilter::try_new(&settings.log_filter)
            .with_context(|| format!("invalid log filter {:?}", settings.log_filter))?,
    };
    // Logs go to stderr (stdout carries the binaries' `ready` lines); colours only on a terminal.
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    let endpoint = settings.otlp_endpoint.trim();
    if endpoint.is_empty() {
        tracing_subscriber::registry()
            .with(fmt)
            .try_init()
            .context("installing the tracing subscriber")?;
        return Ok(TelemetryGuard { provider: None });
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(Duration::from_secs(5))
        .build()
        .with_context(|| format!("building the OTLP exporter for {endpoint:?}"))?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(settings.service_name);
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer(settings.service_name);
    let traced = TRACED_CRATES.iter().fold(Targets::new(), |t, krate| {
        t.with_target(*krate, LevelFilter::INFO)
    });
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_filter(traced);
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init()
        .context("installing the tracing subscriber")?;
    TRACING_ENABLED.store(true, Ordering::Relaxed);
    tracing::info!(endpoint, "exporting spans over OTLP gRPC");
    Ok(TelemetryGuard {
        provider: Some(provider),
    })
}
