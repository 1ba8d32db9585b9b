//! What this router knows of one worker's KV cache and load in tokens ([`KvView`]), for
//! `routing = kv_aware`: the worker's block index (fed by the `kv_events` of its stream), whether
//! that index can be trusted, and its load in tokens.
//!
//! # Locking
//!
//! The index sits behind its own `RwLock`, apart from the link's state. The stream task holds the
//! write lock only to apply one step's events (the net change of one engine step: a few hashes) or
//! to swap in a snapshot's index, which it builds before taking the lock; a request's lookup takes
//! the read lock for one longest-prefix walk. Neither waits on the link's lock nor on the other's
//! I/O.
//!
//! # Freshness
//!
//! - A snapshot arrives first on every stream and replaces the index; when a stream breaks or a
//!   new one opens, the old entries are dropped at once (a restarted worker has an empty cache).
//! - The worker sends every step's message to every router, so the last step number read on the
//!   stream follows the worker's step counter. When a health probe finds that the stream has not
//!   yet delivered a step the worker had finished at the previous probe (one health interval
//!   earlier), the stream is lagging: the worker is routed by load only until the stream catches
//!   up (the stream is ordered, so nothing was lost) or a new stream's snapshot arrives.
//!
//! # Anomalies
//!
//! Events that do not fit the index (duplicate stores, evicts of blocks never stored, stores beyond
//! the worker's capacity) are counted in the pool's `kv_event_anomalies` (metric
//! `router_kv_event_anomalies_total{kind}`) and logged at most once per worker per minute.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use inference_proto::worker::{KvCacheEvents, LoadReport};
use routing::index::{Anomalies, BlockIndex};

/// How often one worker's anomalies are logged at most.
const ANOMALY_LOG_EVERY: Duration = Duration::from_secs(60);

/// The index's state as the metrics show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvIndexState {
    /// Blocks in the index.
    pub blocks: usize,
    /// XOR of the hashes in the index.
    pub fingerprint: u64,
    /// The index is used for routing (a snapshot arrived on the open stream, which is not lagging).
    pub fresh: bool,
    /// The worker's load in tokens as the policy sees it.
    pub load_tokens: u64,
}

/// A worker's load as this router sees it: its last load report, plus what this router sent it
/// since.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Load {
    /// The report's work ahead in tokens ([`reported_work_tokens`]).
    reported_tokens: u64,
    /// The report's running plus waiting sequences.
    reported_sequences: u64,
    /// Work in tokens of the requests this router sent since the report.
    sent_tokens: u64,
    /// Requests this router sent since the report.
    sent_requests: u64,
}

/// This router's view of one worker's KV cache and load in tokens.
#[derive(Debug, Default)]
pub struct KvView {
    index: RwLock<BlockIndex>,
    /// Tokens per block of the worker's hash chain (from its `Info`); 0 before it connected.
    block_size: AtomicU64,
    /// A snapshot arrived on the open stream.
    synced: AtomicBool,
    /// The stream delivers steps later than the health probes show them (see the module docs).
    lagging: AtomicBool,
    /// The last step number read on the stream.
    stream_step: AtomicU64,
    /// The worker's step counter at the previous health probe.
    probe_step: Mutex<Option<u64>>,
    /// The last report's load and what this router sent since.
    load: Mutex<Load>,
    /// When this worker's anomalies were last logged.
    logged_at: Mutex<Option<Instant>>,
}

impl KvView {
    /// A new stream opened to a worker with `capacity` blocks of `block_size` tokens: the old
    /// entries go at once, the snapshot that comes first on the stream fills the index.
    pub(super) fn reset(&self, block_size: usize, capacity: usize) {
        *self.index.write().expect("kv index lock") = BlockIndex::new(capacity);
        self.block_size.store(block_size as u64, Ordering::Relaxed);
        self.synced.store(false, Ordering::Relaxed);
        self.lagging.store(false, Ordering::Relaxed);
        self.stream_step.store(0, Ordering::Relaxed);
        *self.probe_step.lock().expect("kv probe lock") = None;
        *self.load.lock().expect("kv load lock") = Load::default();
    }

    /// The stream ended: nothing it said counts any more.
    pub(super) fn disconnected(&self) {
        let capacity = self.index.read().expect("kv index lock").capacity();
        self.reset(self.block_size(), capacity);
    }

    /// Tokens per block of the worker's chain (0 = unknown).
    pub fn block_size(&self) -> usize {
        self.block_size.load(Ordering::Relaxed) as usize
    }

    /// Applies one stream message's events; returns what did not fit (also to be counted).
    pub(super) fn apply(&self, events: &KvCacheEvents) -> Anomalies {
        if events.snapshot {
            let capacity = self.index.read().expect("kv index lock").capacity();
            let (fresh, anomalies) = BlockIndex::from_snapshot(capacity, &events.stored);
            *self.index.write().expect("kv index lock") = fresh;
            self.synced.store(true, Ordering::Relaxed);
            return anomalies;
        }
        self.index
            .write()
            .expect("kv index lock")
            .apply(&events.stored, &events.evicted)
    }

    /// Whether this worker's anomalies should be logged now (at most once per minute), and records
    /// that they were.
    pub(super) fn should_log_anomalies(&self, now: Instant) -> bool {
        let mut last = self.logged_at.lock().expect("kv log lock");
        if last.is_some_and(|at| now.duration_since(at) < ANOMALY_LOG_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// A step message arrived: its step number (0 for messages sent between steps) and its load
    /// report, if it has one.
    pub(super) fn on_step(&self, step: u64, report: Option<&LoadReport>) {
        if step > 0 {
            self.stream_step.fetch_max(step, Ordering::Relaxed);
            let caught_up = self
                .probe_step
                .lock()
                .expect("kv probe lock")
                .is_none_or(|p| step >= p);
            if caught_up {
                self.lagging.store(false, Ordering::Relaxed);
            }
        }
        if let Some(report) = report {
            *self.load.lock().expect("kv load lock") = Load {
                reported_tokens: reported_work_tokens(report),
                reported_sequences: u64::from(report.running_sequences)
                    + u64::from(report.waiting_sequences),
                ..Load::default()
            };
        }
    }

    /// A health probe answered with the worker's step counter `steps`: the stream lags when it has
    /// not delivered the step the previous probe saw. Returns whether it lags now.
    pub(super) fn on_probe(&self, steps: u64) -> bool {
        let mut previous = self.probe_step.lock().expect("kv probe lock");
        let behind = previous.is_some_and(|p| self.stream_step.load(Ordering::Relaxed) < p);
        *previous = Some(steps);
        self.lagging.store(behind, Ordering::Relaxed);
        behind
    }

    /// This router sent the worker a request of `tokens` tokens of work
    /// ([`routing::kv_aware::request_work_tokens`]).
    pub(super) fn on_dispatch(&self, tokens: u64) {
        let mut load = self.load.lock().expect("kv load lock");
        load.sent_tokens += tokens;
        load.sent_requests += 1;
    }

    /// The index is used for routing: a snapshot arrived and the stream does not lag.
    pub fn fresh(&self) -> bool {
        self.synced.load(Ordering::Relaxed) && !self.lagging.load(Ordering::Relaxed)
    }

    /// Leading blocks of `chain` the worker holds, 0 when the index is not fresh or its block size
    /// is not `block_size`.
    pub fn prefix_blocks(&self, chain: &[u64], block_size: usize) -> usize {
        if !self.fresh() || self.block_size() != block_size {
            return 0;
        }
        self.index
            .read()
            .expect("kv index lock")
            .prefix_blocks(chain)
    }

    /// The worker's load as `(work in tokens, sequences)`, read under one lock: its last
    /// report's work ahead and running plus waiting sequences, each plus what this router sent
    /// since (so that requests sent between two reports count at once). The report counts until
    /// the next one, however old: a worker reports at the end of every step (which may take
    /// seconds on a CPU) and when it goes idle, and answers a refused request with its load.
    pub fn load(&self) -> (u64, u64) {
        let load = *self.load.lock().expect("kv load lock");
        (
            load.reported_tokens + load.sent_tokens,
            load.reported_sequences + load.sent_requests,
        )
    }

    /// The worker's load in tokens ([`Self::load`]'s first part).
    pub fn load_tokens(&self) -> u64 {
        self.load().0
    }

    /// The index's state for the metrics.
    pub fn state(&self) -> KvIndexState {
        let index = self.index.read().expect("kv index lock");
        KvIndexState {
            blocks: index.len(),
            fingerprint: index.fingerprint(),
            fresh: self.fresh(),
            load_tokens: self.load_tokens(),
        }
    }
}

/// The work ahead of a worker in tokens from its load report: `prefill_backlog_tokens +
/// decode_horizon_tokens`, or `kv_demand_tokens` from a worker that predates those fields.
pub(super) fn reported_work_tokens(report: &LoadReport) -> u64 {
    match (report.prefill_backlog_tokens, report.decode_horizon_tokens) {
        (Some(backlog), Some(horizon)) => backlog + horizon,
        _ => report.kv_demand_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(snapshot: bool, stored: &[u64], evicted: &[u64]) -> KvCacheEvents {
        KvCacheEvents {
            snapshot,
            stored: stored.to_vec(),
            evicted: evicted.to_vec(),
        }
    }

    #[test]
    fn snapshot_then_events_and_a_new_stream_drops_everything() {
        let view = KvView::default();
        view.reset(16, 100);
        assert!(!view.fresh(), "not before the snapshot");
        assert_eq!(
            view.apply(&events(true, &[1, 2, 3], &[])),
            Anomalies::default()
        );
        assert!(view.fresh());
        assert_eq!(view.prefix_blocks(&[1, 2, 3, 4], 16), 3);
        assert_eq!(
            view.prefix_blocks(&[1, 2, 3, 4], 32),
            0,
            "another block size"
        );
        let a = view.apply(&events(false, &[4, 4], &[9]));
        assert_eq!(
            (a.duplicate_stores, a.unknown_evicts),
            (1, 1),
            "4 listed twice, 9 unknown"
        );
        assert_eq!(view.prefix_blocks(&[1, 2, 3, 4], 16), 4);
        view.disconnected();
        assert_eq!(view.state().blocks, 0);
        assert_eq!(view.prefix_blocks(&[1], 16), 0);
    }

    #[test]
    fn a_lagging_stream_routes_by_load_only_until_it_catches_up() {
        let view = KvView::default();
        view.reset(4, 10);
        view.apply(&events(true, &[7], &[]));
        view.on_step(5, Some(&LoadReport::default()));
        assert!(
            !view.on_probe(6),
            "the first probe has nothing to compare with"
        );
        // The next probe: the stream never delivered step 6 that the previous probe saw.
        assert!(view.on_probe(9));
        assert!(!view.fresh());
        assert_eq!(view.prefix_blocks(&[7], 4), 0);
        view.on_step(9, Some(&LoadReport::default()));
        assert!(view.fresh());
        assert_eq!(view.prefix_blocks(&[7], 4), 1);
    }

    #[test]
    fn load_is_the_report_plus_what_was_sent_since() {
        let view = KvView::default();
        view.reset(4, 10);
        let report = |work: u64, running: u32, waiting: u32| LoadReport {
            prefill_backlog_tokens: Some(work),
            decode_horizon_tokens: Some(0),
            running_sequences: running,
            waiting_sequences: waiting,
            ..Default::default()
        };
        view.on_step(1, Some(&report(100, 2, 1)));
        assert_eq!(view.load(), (100, 3));
        view.on_dispatch(30);
        view.on_dispatch(5);
        assert_eq!(view.load(), (135, 5));
        view.on_step(2, Some(&report(120, 4, 0)));
        assert_eq!(view.load(), (120, 4));
        view.on_step(0, None);
        assert_eq!(view.load(), (120, 4));
        view.disconnected();
        assert_eq!(view.load(), (0, 0));
    }

    #[test]
    fn anomalies_are_logged_once_a_minute() {
        let view = KvView::default();
        let t = Instant::now();
        assert!(view.should_log_anomalies(t));
        assert!(!view.should_log_anomalies(t + Duration::from_secs(59)));
        assert!(view.should_log_anomalies(t + Duration::from_secs(61)));
    }

    #[test]
    fn the_reported_work_is_backlog_plus_horizon_or_an_old_workers_kv_demand() {
        let mut report = LoadReport {
            kv_demand_tokens: 500,
            ..Default::default()
        };
        assert_eq!(reported_work_tokens(&report), 500);
        report.prefill_backlog_tokens = Some(40);
        report.decode_horizon_tokens = Some(70);
        assert_eq!(reported_work_tokens(&report), 110);
    }
}
