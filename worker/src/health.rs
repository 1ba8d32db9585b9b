//! The worker's health and shutdown state.
//!
//! Health goes out over the standard `grpc.health.v1` service (for `""` and
//! `inference.worker.v1.Worker`) and the worker's own `Health` RPC (which the router probes):
//! `NOT_SERVING` until the model is loaded and the engine runs, `SERVING` while it does,
//! `NOT_SERVING` again if the engine thread stops, while the engine is stalled (it has work and
//! finished no step for `engine_stall_timeout_ms`; `SERVING` again once it moves), and from SIGTERM
//! on. Both read the state the engine publishes ([`EngineSnapshot`]), never waiting for a step: a
//! busy engine is not a down one.
//!
//! Graceful shutdown ([`Lifecycle::start_drain`], [`wait_idle`], [`Lifecycle::stop`]): once
//! draining, new `Add`s are refused with `UNAVAILABLE` (the router fails them over to another
//! worker) while running sequences finish, for up to `drain_timeout_ms`; then the open router
//! streams end and the process exits 0.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inference_proto::worker::HealthResponse;
use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use engine::{EngineHandle, EngineSnapshot};

/// Service names whose status the worker reports.
pub const SERVICES: [&str; 2] = ["", "inference.worker.v1.Worker"];

/// Longest period between two checks of the engine's published state.
const ENGINE_CHECK: Duration = Duration::from_secs(1);

/// Whether the worker serves, drains or stops; shared by the gRPC service and `main`.
#[derive(Debug)]
pub struct Lifecycle {
    reporter: HealthReporter,
    serving: AtomicBool,
    draining: AtomicBool,
    /// The engine has work and made no progress for the stall timeout.
    stalled: AtomicBool,
    stop: watch::Sender<bool>,
}

impl Lifecycle {
    /// A worker that is not serving yet, reporting through `reporter`.
    pub async fn new(reporter: HealthReporter) -> Arc<Self> {
        let lifecycle = Arc::new(Self {
            reporter,
            serving: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
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

    /// Reports `SERVING` (the engine runs), unless draining or stalled.
    pub async fn set_serving(&self) {
        self.serving.store(true, Ordering::Release);
        if self.is_serving() {
            self.report(ServingStatus::Serving).await;
        }
    }

    /// Records whether the engine is stalled: `NOT_SERVING` while it is, the previous status
    /// (`SERVING` unless stopped or draining) once it moves again.
    pub async fn set_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::Release);
        let status = if self.is_serving() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        self.report(status).await;
    }

    /// Whether the engine was found stalled at the last check.
    pub fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::Acquire)
    }

    /// Reports `NOT_SERVING` (e.g. the engine thread stopped).
    pub async fn set_not_serving(&self) {
        self.serving.store(false, Ordering::Release);
        self.report(ServingStatus::NotServing).await;
    }

    /// Whether the worker takes new requests: its engine runs and is not stalled, and it does not
    /// drain.
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Acquire) && !self.is_draining() && !self.is_stalled()
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

/// The answer to the worker's `Health` RPC from the engine's published state at `now`: not ready
/// while `draining`, when the engine thread has ended, or when the engine has had work without
/// progress for longer than `stall_timeout`.
pub fn health_response(
    snapshot: &EngineSnapshot,
    now: Instant,
    stall_timeout: Duration,
    draining: bool,
) -> HealthResponse {
    let stalled = snapshot.is_stalled(now, stall_timeout);
    let (ready, status) = if draining {
        (false, "draining")
    } else if !snapshot.alive {
        (false, "engine stopped")
    } else if stalled {
        (false, "engine stalled")
    } else {
        (true, "serving")
    };
    HealthResponse {
        ready,
        status: status.into(),
        engine_alive: snapshot.alive,
        has_work: snapshot.has_work,
        millis_since_progress: snapshot.since_progress(now).as_millis() as u64,
        steps: snapshot.stats.steps,
        running_sequences: snapshot.stats.running_sequences,
        waiting_sequences: snapshot.stats.waiting_sequences,
        stalled,
    }
}

/// Follows the engine's published state until the process exits: `NOT_SERVING` for good when the
/// engine thread stops, `NOT_SERVING` while it is stalled (work, and no progress for
/// `stall_timeout`) and `SERVING` again once it moves. Checks every `stall_timeout / 4` (at most
/// every second, at least every 10 ms).
pub async fn watch_engine(
    lifecycle: Arc<Lifecycle>,
    engine: EngineHandle,
    stall_timeout: Duration,
) {
    let period = (stall_timeout / 4).clamp(Duration::from_millis(10), ENGINE_CHECK);
    loop {
        tokio::time::sleep(period).await;
        let snapshot = engine.snapshot();
        if !snapshot.alive {
            tracing::error!("the engine thread stopped; reporting NOT_SERVING");
            lifecycle.set_not_serving().await;
            return;
        }
        let stalled = snapshot.is_stalled(Instant::now(), stall_timeout);
        if stalled != lifecycle.is_stalled() {
            let since_progress_ms = snapshot.since_progress(Instant::now()).as_millis() as u64;
            let (running, waiting) = (
                snapshot.stats.running_sequences,
                snapshot.stats.waiting_sequences,
            );
            if stalled {
                tracing::warn!(
                    since_progress_ms,
                    stall_timeout_ms = stall_timeout.as_millis() as u64,
                    running,
                    waiting,
                    steps = snapshot.stats.steps,
                    "the engine has work but finished no step within the stall timeout; reporting \
                     NOT_SERVING"
                );
            } else {
                tracing::info!(
                    steps = snapshot.stats.steps,
                    "the engine moves again; serving"
                );
            }
            lifecycle.set_stalled(stalled).await;
        }
    }
}

/// Waits until the engine has no running or waiting sequence, or `timeout` passes; returns whether
/// it went idle. Asks the engine itself (not its published state), so requests whose `Add` was
/// sent before the drain began are counted. Held sequences (`HoldRequest`: their clients stopped
/// reading) are not waited for, since a client may never read again: when the worker stops, each
/// continues on another worker with the tokens it has once its client reads again (the router's
/// failover, as for any stream of a worker that goes away).
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use engine::backend::{BatchEntry, BatchModel, Logits, StepError};
    use engine::{spawn_engine, Command, EngineRequest, EngineStats};

    /// A model whose steps wait while `closed` is set (a hung engine), else take 1 ms.
    struct GateModel {
        closed: Arc<AtomicBool>,
    }

    impl BatchModel for GateModel {
        type Kv = ();
        fn kv_bytes_per_token(&self) -> usize {
            4
        }
        fn new_kv(&self, _num_blocks: usize, _block_size: usize) {}
        fn forward_batch(
            &self,
            batch: &[BatchEntry<'_>],
            _kv: &mut (),
            logits: &mut Logits,
        ) -> Result<(), StepError> {
            std::thread::sleep(Duration::from_millis(1));
            while self.closed.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
            logits.clear(4);
            for _ in 0..batch.iter().map(|e| e.logit_tokens).sum::<usize>() {
                logits.push_row(&[1.0, 0.0, 0.0, 0.0]);
            }
            Ok(())
        }
        fn context_length(&self) -> usize {
            100_000
        }
        fn vocab_size(&self) -> usize {
            4
        }
    }

    async fn wait_for(what: &str, check: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hung_engine_turns_not_serving_and_serving_again_when_it_moves() {
        let closed = Arc::new(AtomicBool::new(false));
        // The default settings with a small pool (built from the settings, so the engine config
        // stays whole when settings are added).
        let settings = crate::config::WorkerSettings {
            kv_cache_blocks: 64,
            ..Default::default()
        };
        let engine = spawn_engine(
            GateModel {
                closed: closed.clone(),
            },
            settings.engine_config(4).unwrap(),
        );
        let (reporter, _service) = tonic_health::server::health_reporter();
        let lifecycle = Lifecycle::new(reporter).await;
        lifecycle.set_serving().await;
        let stall = Duration::from_millis(150);
        let watcher = tokio::spawn(watch_engine(lifecycle.clone(), engine.clone(), stall));
        // Idle for longer than the stall timeout: still serving.
        tokio::time::sleep(stall * 3).await;
        assert!(lifecycle.is_serving() && !lifecycle.is_stalled());
        let (out, _rx) = tokio::sync::mpsc::unbounded_channel::<engine::EngineOutput>();
        let conn = engine.new_connection();
        assert!(engine.send(Command::Add {
            conn,
            request: Box::new(EngineRequest {
                request_id: "a".into(),
                prompt_ids: vec![1, 2, 3],
                max_new_tokens: 1_000,
                ..Default::default()
            }),
            constraint: None,
            out: Box::new(out),
        }));
        // Busy with steps: serving. Then its steps hang: NOT_SERVING after the stall timeout.
        wait_for("steps run", || engine.snapshot().stats.steps > 5).await;
        assert!(lifecycle.is_serving());
        closed.store(true, Ordering::Release);
        let hung_at = Instant::now();
        wait_for("stalled", || lifecycle.is_stalled()).await;
        assert!(
            hung_at.elapsed() >= stall,
            "stalled after {:?}",
            hung_at.elapsed()
        );
        assert!(!lifecycle.is_serving());
        let answer = health_response(&engine.snapshot(), Instant::now(), stall, false);
        assert!(
            !answer.ready && answer.stalled && answer.has_work,
            "{answer:?}"
        );
        // It moves again: serving.
        closed.store(false, Ordering::Release);
        wait_for("moving again", || lifecycle.is_serving()).await;
        assert!(!lifecycle.is_stalled());
        engine.send(Command::CloseConnection { conn });
        wait_for("idle", || !engine.snapshot().has_work).await;
        watcher.abort();
    }

    fn busy_snapshot(last_step_at: Instant) -> EngineSnapshot {
        EngineSnapshot {
            alive: true,
            has_work: true,
            last_step_at: Some(last_step_at),
            work_since: Some(last_step_at),
            stats: EngineStats {
                steps: 7,
                running_sequences: 2,
                waiting_sequences: 3,
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_busy_engine_is_ready_until_the_stall_timeout() {
        let t0 = Instant::now();
        let s = busy_snapshot(t0);
        let timeout = Duration::from_secs(5);
        let h = health_response(&s, t0 + Duration::from_secs(4), timeout, false);
        assert_eq!(
            h,
            HealthResponse {
                ready: true,
                status: "serving".into(),
                engine_alive: true,
                has_work: true,
                millis_since_progress: 4_000,
                steps: 7,
                running_sequences: 2,
                waiting_sequences: 3,
                stalled: false,
            }
        );
        let h = health_response(&s, t0 + Duration::from_secs(6), timeout, false);
        assert!(!h.ready && h.stalled, "{h:?}");
        assert_eq!(h.status, "engine stalled");
        assert_eq!(h.millis_since_progress, 6_000);
    }

    #[test]
    fn an_idle_engine_is_ready_however_old_its_last_step() {
        let t0 = Instant::now();
        let mut s = busy_snapshot(t0);
        s.has_work = false;
        s.work_since = None;
        let h = health_response(
            &s,
            t0 + Duration::from_secs(3600),
            Duration::from_secs(1),
            false,
        );
        assert!(h.ready && !h.stalled && !h.has_work, "{h:?}");
        assert_eq!(h.millis_since_progress, 0);
    }

    #[test]
    fn draining_and_a_stopped_engine_are_not_ready() {
        let t0 = Instant::now();
        let mut s = busy_snapshot(t0);
        let h = health_response(&s, t0, Duration::from_secs(1), true);
        assert_eq!((h.ready, h.status.as_str()), (false, "draining"));
        s.alive = false;
        let h = health_response(
            &s,
            t0 + Duration::from_secs(9),
            Duration::from_secs(1),
            false,
        );
        assert_eq!((h.ready, h.status.as_str()), (false, "engine stopped"));
        assert!(!h.engine_alive && !h.stalled);
    }
}
