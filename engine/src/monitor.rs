//! The state the engine thread publishes for health checks, `Info` and metrics.
//!
//! The engine thread owns everything it computes with, and a step can take seconds (a long prefill
//! on a CPU). Readers that must answer at once (the `Health` RPC the router probes, the worker's
//! `grpc.health.v1` status, `Info`, `/metrics`) therefore never ask the engine: it publishes an
//! [`EngineSnapshot`] into a `tokio::sync::watch` cell after every command batch and every step
//! (before the step's outputs are sent, so a client that saw a request finish reads counters that
//! include it), and readers clone the latest one.
//!
//! Progress is judged the way vLLM's hung-engine reports (vllm-project/vllm#40926: health 200 while
//! nothing moves) suggest: an engine is *stalled* when it has work and has finished no step for a
//! configured time, counted from its last finished step or from the moment work arrived while it
//! was idle, whichever is later. An idle engine is never stalled. When the engine thread ends (its
//! channel closed, or a panic unwinds it) the snapshot says so ([`EngineSnapshot::alive`] false).

use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::EngineStats;

/// The engine's state as of its last step or command batch.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSnapshot {
    /// The engine thread runs.
    pub alive: bool,
    /// Sequences are running or waiting.
    pub has_work: bool,
    /// When the last step finished (`None` before the first).
    pub last_step_at: Option<Instant>,
    /// When the engine last went from idle to having work (`None` while idle).
    pub work_since: Option<Instant>,
    /// The engine's counters (running and waiting sequences, steps, KV blocks, ...).
    pub stats: EngineStats,
}

impl EngineSnapshot {
    /// The snapshot of an engine that starts: alive, idle, no step yet.
    pub fn starting(stats: EngineStats) -> Self {
        Self {
            alive: true,
            has_work: false,
            last_step_at: None,
            work_since: None,
            stats,
        }
    }

    /// When the engine last made progress while it had work: the later of its last finished step
    /// and the moment work arrived. `None` while it has no work.
    pub fn progress_at(&self) -> Option<Instant> {
        if !self.has_work {
            return None;
        }
        match (self.last_step_at, self.work_since) {
            (Some(step), Some(work)) => Some(step.max(work)),
            (step, work) => step.or(work),
        }
    }

    /// Time since the engine last made progress, at `now`; zero while it has no work.
    pub fn since_progress(&self, now: Instant) -> Duration {
        self.progress_at()
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at))
    }

    /// Whether the engine runs, has work, and has made no progress for longer than `timeout`.
    pub fn is_stalled(&self, now: Instant, timeout: Duration) -> bool {
        self.alive && self.has_work && self.since_progress(now) > timeout
    }
}

/// The engine thread's side of the cell. Dropping it (the thread returns or unwinds from a panic)
/// publishes `alive = false`.
pub(super) struct Publisher {
    tx: watch::Sender<EngineSnapshot>,
}

impl Publisher {
    /// A cell holding `initial`, and a receiver of it.
    pub(super) fn new(initial: EngineSnapshot) -> (Self, watch::Receiver<EngineSnapshot>) {
        let (tx, rx) = watch::channel(initial);
        (Self { tx }, rx)
    }

    /// Publishes the engine's state at `now`: `has_work` and `stats` as given, `last_step_at` set
    /// when `stepped`, and `work_since` set when work arrived on an idle engine (cleared when idle).
    pub(super) fn publish(&self, now: Instant, stepped: bool, has_work: bool, stats: EngineStats) {
        self.tx.send_modify(|s| {
            if stepped {
                s.last_step_at = Some(now);
            }
            s.work_since = match (has_work, s.work_since) {
                (false, _) => None,
                (true, None) => Some(now),
                (true, since) => since,
            };
            s.has_work = has_work;
            s.stats = stats;
        });
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.tx.send_modify(|s| s.alive = false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(steps: u64) -> EngineStats {
        EngineStats {
            steps,
            ..Default::default()
        }
    }

    #[test]
    fn an_idle_engine_is_never_stalled() {
        let (publisher, rx) = Publisher::new(EngineSnapshot::starting(stats(0)));
        let t0 = Instant::now();
        publisher.publish(t0, false, false, stats(0));
        let s = rx.borrow().clone();
        assert_eq!(s.progress_at(), None);
        assert_eq!(
            s.since_progress(t0 + Duration::from_secs(3600)),
            Duration::ZERO
        );
        assert!(!s.is_stalled(t0 + Duration::from_secs(3600), Duration::from_secs(1)));
    }

    #[test]
    fn progress_counts_from_work_arriving_then_from_each_step() {
        let (publisher, rx) = Publisher::new(EngineSnapshot::starting(stats(0)));
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // An old step, then idle for a long time: the age restarts when work arrives.
        publisher.publish(t0, true, false, stats(1));
        publisher.publish(t0 + ms(10_000), false, true, stats(1));
        let s = rx.borrow().clone();
        assert_eq!(s.progress_at(), Some(t0 + ms(10_000)));
        assert_eq!(s.since_progress(t0 + ms(10_500)), ms(500));
        assert!(!s.is_stalled(t0 + ms(10_500), ms(1_000)));
        assert!(s.is_stalled(t0 + ms(11_001), ms(1_000)));
        // More commands while busy keep the start of the work; a step moves progress on.
        publisher.publish(t0 + ms(10_800), false, true, stats(1));
        assert_eq!(rx.borrow().work_since, Some(t0 + ms(10_000)));
        publisher.publish(t0 + ms(10_900), true, true, stats(2));
        let s = rx.borrow().clone();
        assert_eq!(s.progress_at(), Some(t0 + ms(10_900)));
        assert!(!s.is_stalled(t0 + ms(11_500), ms(1_000)));
        assert!(s.is_stalled(t0 + ms(12_000), ms(1_000)));
        assert_eq!(s.stats.steps, 2);
        // Idle again: work_since is cleared, nothing is stalled.
        publisher.publish(t0 + ms(11_000), true, false, stats(3));
        let s = rx.borrow().clone();
        assert_eq!((s.has_work, s.work_since), (false, None));
        assert!(!s.is_stalled(t0 + ms(99_000), ms(1_000)));
    }

    #[test]
    fn a_dead_engine_thread_is_published_even_when_it_panics() {
        let (publisher, rx) = Publisher::new(EngineSnapshot::starting(stats(0)));
        assert!(rx.borrow().alive);
        let thread = std::thread::spawn(move || {
            let _publisher = publisher;
            panic!("engine thread panics");
        });
        assert!(thread.join().is_err());
        assert!(!rx.borrow().alive);
        // A dead engine is not "stalled": it is stopped, which readers report on its own.
        assert!(!rx.borrow().is_stalled(Instant::now(), Duration::ZERO));
    }
}
