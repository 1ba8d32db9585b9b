//! [`PoolCollector`]: the pool's queue, workers and counters and the drain state, read at each
//! scrape.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use observability::const_metrics::{counter, gauge};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

use crate::drain::Drain;
use crate::pool::WorkerPool;

/// Reads one per-worker gauge from a worker's snapshot.
type WorkerValue = fn(&crate::pool::WorkerSnapshot) -> i64;

/// Reads the pool's queue, workers and counters, and the drain state, at each scrape.
pub(super) struct PoolCollector {
    pub(super) pool: Arc<WorkerPool>,
    pub(super) drain: Arc<Drain>,
}

impl std::fmt::Debug for PoolCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolCollector").finish_non_exhaustive()
    }
}

impl Collector for PoolCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let (waiting, waiting_tokens) = self.pool.queue_depth();
        gauge(
            &mut e,
            "queue_waiting_requests",
            "Requests waiting in the admission queue",
            waiting as i64,
        )?;
        gauge(
            &mut e,
            "queue_waiting_tokens",
            "Tokens of the requests waiting in the admission queue",
            waiting_tokens as i64,
        )?;
        let workers = self.pool.workers();
        gauge(
            &mut e,
            "workers_known",
            "Workers known (static and discovered)",
            workers.len() as i64,
        )?;
        let ready = workers.iter().filter(|w| w.ready()).count();
        gauge(
            &mut e,
            "workers_ready",
            "Workers connected and healthy",
            ready as i64,
        )?;
        let per_worker: [(&str, &str, WorkerValue); 6] = [
            (
                "worker_ready",
                "Whether the worker takes requests (connected and healthy)",
                |w| w.ready() as i64,
            ),
            (
                "worker_stalled",
                "Whether the worker is out of rotation for lack of progress (stall_timeout_ms)",
                |w| w.stalled as i64,
            ),
            (
                "worker_inflight",
                "This router's requests running on the worker",
                |w| w.inflight as i64,
            ),
            (
                "worker_running_sequences",
                "Sequences running on the worker (its last load report)",
                |w| w.reported.map_or(0, |r| r.running_sequences.into()),
            ),
            (
                "worker_waiting_sequences",
                "Sequences waiting on the worker (its last load report)",
                |w| w.reported.map_or(0, |r| r.waiting_sequences.into()),
            ),
            (
                "worker_free_kv_tokens",
                "KV cache tokens free on the worker (its last load report, however old; 0 before the first)",
                |w| w.last_report.map_or(0, |r| r.free_kv_tokens as i64),
            ),
        ];
        for (name, help, value) in per_worker {
            let mut family = e.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for w in &workers {
                let labels = [("worker", w.address.as_str())];
                ConstGauge::new(value(w)).encode(family.encode_family(&labels)?)?;
            }
        }
        crate::kv_metrics::encode(&mut e, &workers, self.pool.counters())?;
        let c = self.pool.counters();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        counter(
            &mut e,
            "dispatched",
            "Requests sent to a worker (a failover counts again)",
            load(&c.dispatched),
        )?;
        counter(
            &mut e,
            "failovers",
            "Requests that resumed on another worker after theirs was lost",
            load(&c.failovers),
        )?;
        counter(
            &mut e,
            "health_probe_misses",
            "Worker health probes without an answer in time (a busy worker is not taken out)",
            load(&c.health_probe_misses),
        )?;
        counter(
            &mut e,
            "worker_stalls",
            "Times a worker with work and no progress for stall_timeout_ms left rotation",
            load(&c.stalls),
        )?;
        counter(
            &mut e,
            "worker_heartbeat_losses",
            "Times a worker's stream carried no heartbeat for heartbeat_timeout_ms and was dropped",
            load(&c.heartbeat_losses),
        )?;
        counter(
            &mut e,
            "failovers_exhausted",
            "Requests that failed because no worker was left to continue them",
            load(&c.failovers_exhausted),
        )?;
        counter(
            &mut e,
            "rejected",
            "Requests refused with RESOURCE_EXHAUSTED by the admission queue",
            load(&c.rejected),
        )?;
        gauge(
            &mut e,
            "draining",
            "Whether the router is draining (SIGTERM received)",
            self.drain.is_draining() as i64,
        )?;
        gauge(
            &mut e,
            "active_calls",
            "Generate calls running now",
            self.drain.active() as i64,
        )?;
        Ok(())
    }
}
