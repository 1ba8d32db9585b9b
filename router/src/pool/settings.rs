//! The pool's settings ([`PoolSettings`]) and event counters ([`PoolCounters`]).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use crate::admission::AdmissionLimits;
use crate::affinity::AffinityPolicy;
use crate::model_choice::ModelNaming;
use crate::model_context::ChatTemplateFile;
use routing::kv_aware::KvAwarePolicy;
use routing::Routing;

/// How the pool connects, picks, queues and fails over.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// First and longest reconnect delay.
    pub backoff: (Duration, Duration),
    /// Period of the health probe (also its timeout; a probe without an answer changes nothing).
    pub health_interval: Duration,
    /// A worker with work (requests of this router in flight, or its health says `has_work`) that
    /// shows no progress for this long leaves rotation and its requests fail over.
    pub stall_timeout: Duration,
    /// A worker whose stream carried a `Heartbeat` and then carries nothing (no step, no
    /// heartbeat) for this long is taken for frozen or gone: the stream is dropped, the worker
    /// leaves rotation and its requests fail over (`None`: only the HTTP/2 keep-alive notices).
    pub heartbeat_timeout: Option<Duration>,
    /// A response stream whose client read none of its buffered messages for this long is
    /// cancelled ([`crate::route_error::RouteError::ClientTooSlow`]; see [`crate::generate`]).
    pub slow_client_timeout: Duration,
    /// Most requests this router has in flight on one worker.
    pub max_inflight_per_worker: usize,
    /// The admission queue's limits.
    pub admission: AdmissionLimits,
    /// Which policy picks a request's worker (the `routing` setting).
    pub routing: Routing,
    /// The affinity policy's settings (`routing = affinity`).
    pub affinity: AffinityPolicy,
    /// The KV-aware policy's settings (`routing = kv_aware`).
    pub kv_aware: KvAwarePolicy,
    /// How long a request waits for a ready worker when none is left (after its worker was lost, or
    /// while queued) before it fails
    /// ([`crate::route_error::RouteError::NoWorkerInTime`], `UNAVAILABLE`).
    pub failover_timeout: Duration,
    /// For this long after a ready worker lost its stream, a new request of its model that finds
    /// no worker ready waits for one (bounded by the end of this grace) instead of being refused
    /// at once ([`crate::route_error::RouteError::NoWorkerReady`]); zero = refuse at once.
    pub reconnect_grace: Duration,
    /// Most failovers of one request (a request that keeps losing workers fails).
    pub max_failovers: u32,
    /// The `chat_template` setting's template, which overrides the model's (see
    /// [`crate::model_context::ModelContext::from_info`]).
    pub chat_template: Option<Arc<ChatTemplateFile>>,
    /// TLS of the links to workers (the CA their certificates must chain to); `None` = plain.
    pub worker_tls: Option<tls_certs::ClientTls>,
    /// The default model and its public names (settings `default_model`, `served_model_name`,
    /// `model_aliases`; see [`crate::model_choice`]).
    pub naming: ModelNaming,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            backoff: (Duration::from_millis(100), Duration::from_secs(5)),
            health_interval: Duration::from_secs(2),
            stall_timeout: Duration::from_secs(60),
            heartbeat_timeout: Some(Duration::from_secs(2)),
            slow_client_timeout: Duration::from_secs(30),
            max_inflight_per_worker: 64,
            admission: AdmissionLimits {
                max_waiting_requests: 256,
                max_waiting_tokens: 262_144,
            },
            routing: Routing::KvAware,
            affinity: AffinityPolicy {
                prefix_tokens: 64,
                load_factor: 0.5,
            },
            kv_aware: KvAwarePolicy::default(),
            failover_timeout: Duration::from_secs(10),
            reconnect_grace: Duration::from_secs(2),
            max_failovers: 3,
            chat_template: None,
            worker_tls: None,
            naming: ModelNaming::default(),
        }
    }
}

/// Event counters (read by metrics).
#[derive(Debug, Default)]
pub struct PoolCounters {
    /// Requests sent to a worker (a failover counts again).
    pub dispatched: AtomicU64,
    /// Requests that resumed on another worker after theirs was lost.
    pub failovers: AtomicU64,
    /// Requests that failed because no worker was left to continue them.
    pub failovers_exhausted: AtomicU64,
    /// Requests refused by the admission queue ([`crate::route_error::RouteError::Overloaded`],
    /// `RESOURCE_EXHAUSTED`).
    pub rejected: AtomicU64,
    /// Health probes that got no answer in time (not taken as "down").
    pub health_probe_misses: AtomicU64,
    /// Times a worker was taken out of rotation by the stall rule.
    pub stalls: AtomicU64,
    /// Times a worker's stream fell silent for `heartbeat_timeout` and was dropped.
    pub heartbeat_losses: AtomicU64,
    /// KV cache events that did not fit a worker's index: stores of a block already held.
    pub kv_duplicate_stores: AtomicU64,
    /// KV cache events that did not fit a worker's index: evicts of a block not held.
    pub kv_unknown_evicts: AtomicU64,
    /// KV cache events that did not fit a worker's index: stores beyond its capacity.
    pub kv_over_capacity: AtomicU64,
}

impl PoolCounters {
    /// Counts a worker's KV event anomalies.
    pub fn count_kv_anomalies(&self, anomalies: routing::index::Anomalies) {
        use std::sync::atomic::Ordering::Relaxed;
        self.kv_duplicate_stores
            .fetch_add(anomalies.duplicate_stores, Relaxed);
        self.kv_unknown_evicts
            .fetch_add(anomalies.unknown_evicts, Relaxed);
        self.kv_over_capacity
            .fetch_add(anomalies.over_capacity, Relaxed);
    }
}
