//! The KV-aware routing metrics, read from the pool at each scrape (encoded by
//! [`crate::metrics`]'s pool collector):
//!
//! - per worker (`worker="HOST:PORT"`): `router_worker_kv_index_blocks` (blocks in this router's
//!   index of its prefix cache), `router_worker_kv_index_fingerprint` (the low 52 bits of the XOR
//!   of those block hashes: with the count, a check that the index equals the worker's cache, whose
//!   hashes the worker's `KvCacheBlocks` RPC lists), `router_worker_kv_index_fresh` (0/1: the index
//!   is used for routing: a snapshot arrived on the open stream and it does not lag) and
//!   `router_worker_kv_load_tokens` (its load in tokens as `routing = kv_aware` sees it);
//! - `router_kv_event_anomalies_total{kind}`: cache events that did not fit a worker's index and were
//!   ignored: `kind="duplicate_store"` (a store of a block already held), `"unknown_evict"` (an
//!   evict of a block not held), `"over_capacity"` (a store beyond the worker's KV capacity).

use std::sync::atomic::Ordering;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::pool::{KvIndexState, PoolCounters, WorkerSnapshot};

/// Encodes the KV-aware routing metrics of `workers` and `counters`.
pub fn encode(
    e: &mut DescriptorEncoder,
    workers: &[WorkerSnapshot],
    counters: &PoolCounters,
) -> std::fmt::Result {
    type KvValue = fn(&KvIndexState) -> i64;
    let per_worker: [(&str, &str, KvValue); 4] = [
        (
            "worker_kv_index_blocks",
            "Blocks in this router's index of the worker's prefix cache",
            |k| k.blocks as i64,
        ),
        (
            "worker_kv_index_fingerprint",
            "Low 52 bits of the XOR of the block hashes in this router's index of the worker",
            |k| routing::index::metric_fingerprint(k.fingerprint) as i64,
        ),
        (
            "worker_kv_index_fresh",
            "Whether the worker's KV index is used for routing (snapshot received, stream not lagging)",
            |k| k.fresh as i64,
        ),
        (
            "worker_kv_load_tokens",
            "The worker's load in tokens for kv_aware routing (reported KV demand plus tokens sent since)",
            |k| k.load_tokens as i64,
        ),
    ];
    for (name, help, value) in per_worker {
        let mut family = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for w in workers {
            let labels = [("worker", w.address.as_str())];
            ConstGauge::new(value(&w.kv_index)).encode(family.encode_family(&labels)?)?;
        }
    }
    let mut family = e.encode_descriptor(
        "kv_event_anomalies",
        "Workers' KV cache events that did not fit this router's index (ignored)",
        None,
        MetricType::Counter,
    )?;
    for (kind, count) in [
        ("duplicate_store", &counters.kv_duplicate_stores),
        ("unknown_evict", &counters.kv_unknown_evicts),
        ("over_capacity", &counters.kv_over_capacity),
    ] {
        let labels = [("kind", kind)];
        ConstCounter::new(count.load(Ordering::Relaxed)).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}
