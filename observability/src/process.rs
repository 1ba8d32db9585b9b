//! The shared `main` of the router and the worker: a multi-thread tokio runtime, logs and (when an
//! OTLP endpoint is set) span export, the service's future, and its result as the process exit code.

use std::future::Future;
use std::process::ExitCode;

use crate::telemetry::{init, TelemetrySettings};

/// Runs `service` on a new tokio runtime with telemetry initialised from `telemetry`.
///
/// `worker_threads` sizes the runtime (`None`: one per core). Exit codes: 0 when `service` returns
/// `Ok`, 1 when it returns an error (printed as `NAME: error`), 2 when that error is a [`BadInput`]
/// or when telemetry cannot be set up (e.g. an invalid log filter). Spans still buffered are flushed before the runtime stops.
pub fn run_service<F, Fut>(
    telemetry: TelemetrySettings,
    worker_threads: Option<usize>,
    service: F,
) -> ExitCode
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let name = telemetry.service_name;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        builder.worker_threads(n);
    }
    let runtime = builder
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    // The span exporter lives on `runtime`.
    let guard = {
        let _entered = runtime.enter();
        init(&telemetry)
    };
    let guard = match guard {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("{name}: invalid settings: {e:#}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(service());
    // Flushes the last spans while the runtime still runs.
    drop(guard);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            match e.downcast_ref::<BadInput>() {
                Some(_) => ExitCode::from(2),
                None => ExitCode::FAILURE,
            }
        }
    }
}

/// An error in what the service was given rather than in the service (a model file that cannot be
/// served, say): [`run_service`] exits with code 2 for it, as for invalid settings, instead of 1.
#[derive(Debug)]
pub struct BadInput(pub anyhow::Error);

impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for BadInput {}

/// Prints the effective settings as pretty JSON (the `--check-config` output) and returns exit code 0.
pub fn print_settings<S: serde::Serialize>(settings: &S) -> ExitCode {
    match serde_json::to_string_pretty(settings) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cannot print the settings: {e}");
            ExitCode::from(2)
        }
    }
}

/// The settings a binary starts with: `loaded` (defaults < file < environment < flags) that also pass
/// `validate`. Either error is printed as `NAME: invalid settings: ...` and becomes exit code 2.
pub fn checked_settings<S, L, V>(
    name: &str,
    loaded: Result<S, L>,
    validate: impl FnOnce(&S) -> Result<(), V>,
) -> Result<S, ExitCode>
where
    L: std::fmt::Display,
    V: std::fmt::Display,
{
    let invalid = |e: &dyn std::fmt::Display| {
        eprintln!("{name}: invalid settings: {e}");
        ExitCode::from(2)
    };
    let settings = loaded.map_err(|e| invalid(&e))?;
    validate(&settings).map_err(|e| invalid(&e))?;
    Ok(settings)
}
