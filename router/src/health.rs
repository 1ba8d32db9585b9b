//! The router's readiness over the standard `grpc.health.v1` service: `SERVING` (for `""` and
//! `inference.v1.TextGeneration`) while at least one worker is ready and the router is not
//! draining, `NOT_SERVING` otherwise (at start, until a worker connects; when every worker is lost;
//! from SIGTERM on).

use std::sync::Arc;
use std::time::Duration;

use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::drain::Drain;
use crate::pool::WorkerPool;

/// Service names whose status the router reports.
pub const SERVICES: [&str; 2] = ["", "inference.v1.TextGeneration"];

/// How often the drain flag is re-read (ready-worker changes are seen at once).
const POLL: Duration = Duration::from_millis(200);

/// Sets every reported service to `status`.
pub async fn set_all(reporter: &HealthReporter, status: ServingStatus) {
    for service in SERVICES {
        reporter.set_service_status(service, status).await;
    }
}

/// The status the router should report now.
pub fn current_status(pool: &WorkerPool, drain: &Drain) -> ServingStatus {
    if pool.ready_workers() > 0 && !drain.is_draining() {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// Keeps the reported status current until the process exits: reacts to ready-worker changes at
/// once and to a drain within [`POLL`]. Reports `NOT_SERVING` before it returns the first time.
pub async fn maintain(reporter: HealthReporter, pool: Arc<WorkerPool>, drain: Arc<Drain>) {
    let mut ready = pool.ready_watch();
    let mut reported = None;
    loop {
        let status = current_status(&pool, &drain);
        if reported != Some(status) {
            set_all(&reporter, status).await;
            tracing::info!(?status, ready_workers = pool.ready_workers(), "readiness");
            reported = Some(status);
        }
        tokio::select! {
            changed = ready.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(POLL) => {}
        }
    }
}
