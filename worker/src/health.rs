//! The worker's health and shutdown state.
//!
//! Health goes out over the standard `grpc.health.v1` service (for `""` and
//! `inference.worker.v1.Worker`) and the worker's own `Health` RPC (which the router probes):
//! `NOT_SERVING` until the model is loaded and the engine runs, `SERVING` while it does,
//! `NOT_SERVING` again if the engine thread stops or from SIGTERM on.
//!
//! Graceful shutdown ([`Lifecycle::start_drain`], [`wait_idle`], [`Lifecycle::stop`]): once
//! draining, new `Add`s are refused with `UNAVAILABLE` (the router fails them over to another
//! worker) while running sequences finish, for up to `drain_timeout_ms`; then the open router
//! streams end and the process exits 0.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::engine::EngineHandle;

/// Service names whose status the worker reports.
pub const SERVICES: [&str; 2] = ["", "inference.worker.v1.Worker"];

/// How often the engine thread is checked for life.
const ENGINE_CHECK: Duration = Duration::from_secs(1);

/// Whether the worker serves, drains or stops; shared by the gRPC service and `main`.
#[derive(Debug)]
pub struct Lifecycle {
    reporter: HealthReporter,
    serving: AtomicBool,
    draining: AtomicBool,
    stop: watch::Sender<bool>,
}

impl Lifecycle {
    /// A worker that is not serving yet, reporting through `reporter`.
    pub async fn new(reporter: HealthReporter) -> Arc<Self> {
        let lifecycle = Arc::new(Self {
            reporter,
            serving: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            stop: watch::Sender::new(false),
        });
        lifecycle.report(ServingStatus::NotServing).await;
        lifecycle
    }

    async fn report(&self, status: ServingStatus) {
        for service in SERVICES {
            self.reporter.set_service_status(service, status).await;
        }
    }

    /// Reports `SERVING` (the engine runs), unless draining.
    pub async fn set_serving(&self) {
        if !self.is_draining() {
            self.serving.store(true, Ordering::Release);
            self.report(ServingStatus::Serving).await;
        }
    }

    /// Reports `NOT_SERVING` (e.g. the engine thread stopped).
    pub async fn set_not_serving(&self) {
        self.serving.store(false, Ordering::Release);
        self.report(ServingStatus::NotServing).await;
    }

    /// Whether the worker takes new requests.
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Acquire) && !self.is_draining()
    }

    /// Whether SIGTERM was received: new requests are refused.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Starts draining: reports `NOT_SERVING` and refuses new requests from now on.
    pub async fn start_drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.set_not_serving().await;
    }

    /// Ends every open router stream (after the drain).
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Resolves once [`Lifecycle::stop`] was called.
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.stop.subscribe();
        async move {
            // An error means the sender is gone: the process is ending anyway.
            let _ = rx.wait_for(|stopped| *stopped).await;
        }
    }
}

/// Reports `NOT_SERVING` when the engine thread stops (checked every second) until the process
/// exits.
pub async fn watch_engine(lifecycle: Arc<Lifecycle>, engine: EngineHandle) {
    loop {
        tokio::time::sleep(ENGINE_CHECK).await;
        if lifecycle.is_serving() && engine.stats().await.is_none() {
            tracing::error!("the engine thread stopped; reporting NOT_SERVING");
            lifecycle.set_not_serving().await;
            return;
        }
    }
}

/// Waits until the engine has no running or waiting sequence, or `timeout` passes; returns whether
/// it went idle.
pub async fn wait_idle(engine: &EngineHandle, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let busy = match engine.stats().await {
            Some(stats) => stats.running_sequences + stats.waiting_sequences,
            None => return true,
        };
        if busy == 0 {
            return true;
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                sequences = busy,
                "drain timeout passed with sequences still running"
            );
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
