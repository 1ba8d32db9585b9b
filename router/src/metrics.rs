//! The router's Prometheus metrics, served as OpenMetrics text at `GET /metrics` on `metrics_listen`.
//!
//! Per request (recorded by [`RequestObserver`] as the response stream passes through the service):
//! `router_requests_total{code}` (final gRPC status: `OK`, `INVALID_ARGUMENT`, `UNAVAILABLE`,
//! `RESOURCE_EXHAUSTED`, `DEADLINE_EXCEEDED`, `CANCELLED` when the client went away, ...; an error
//! counts by the code of its [`RouteError`], on either front),
//! `router_finished_requests_total{finish_reason}` (`eos_token`, `max_new_tokens`, `stop_sequence`,
//! `context_length`), `router_prompt_tokens_total`, `router_generated_tokens_total` (counted as
//! tokens stream, so a rate shows the load of long requests while they run, and a cancelled or
//! failed call counts what it streamed; topped up to the request's `usage` when it finishes) and the
//! histograms (seconds) `router_time_to_first_token_seconds`, `router_inter_token_latency_seconds`,
//! `router_request_duration_seconds` (end to end) and `router_queue_duration_seconds`.
//!
//! Read from the pool at each scrape ([`PoolCollector`]): `router_queue_waiting_requests`,
//! `router_queue_waiting_tokens`, `router_workers_known`, `router_workers_ready`, per worker
//! (`worker="HOST:PORT"`) `router_worker_ready` (0/1), `router_worker_stalled` (0/1: out of rotation
//! for lack of progress), `router_worker_inflight` (this router's requests on it),
//! `router_worker_running_sequences`, `router_worker_waiting_sequences`,
//! `router_worker_free_kv_tokens` (its last load report), the counters `router_dispatched_total`,
//! `router_failovers_total`, `router_failovers_exhausted_total`, `router_rejected_total` (admission
//! queue full), `router_health_probe_misses_total` (probes without an answer in time),
//! `router_worker_stalls_total` (stall-rule removals), `router_worker_heartbeat_losses_total`
//! (streams dropped after `heartbeat_timeout_ms` of silence), and `router_draining` (0/1),
//! `router_active_calls`; and the KV-aware routing metrics of [`crate::kv_metrics`].
//!
//! The HTTP front: `router_http_requests_total{route, status}`, every response of its API routes
//! (`/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/tokenize`, ...), so that refusals
//! that never reach a worker (400, 401, 404 model, 413, 429) are counted too.
//!
//! Per tenant, with bounded labels: [`crate::tenant_metrics`]. Unprefixed: the standard `process_*`
//! metrics and `build_info{component="router",version,commit}` ([`process_metrics`]).

use std::sync::Arc;
use std::time::Instant;

use inference_proto::public::{FinishReason, GenerateResponse};
use inference_proto::status::code_name;
use observability::const_metrics::{counter, gauge};
use observability::process_metrics::{self, BuildInfo, ProcessMetrics};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;
use tonic::Code;

use crate::drain::Drain;
use crate::pool::WorkerPool;
use crate::route_error::RouteError;
use crate::telemetry;
use crate::tenant_metrics::{TenantMetrics, TenantObserver};
use crate::tenants::{Callers, DEFAULT_TENANT};

type Label = [(&'static str, &'static str); 1];

/// Labels of `router_http_requests_total`: the matched route (bounded by the front's routes) and
/// the status code.
type HttpLabel = [(&'static str, String); 2];

/// Reads one per-worker gauge from a worker's snapshot.
type WorkerValue = fn(&crate::pool::WorkerSnapshot) -> i64;

/// Request-level metrics plus the pool's state; shared by the service and the metrics endpoint.
#[derive(Debug)]
pub struct RouterMetrics {
    registry: Registry,
    requests: Family<Label, Counter>,
    finished: Family<Label, Counter>,
    prompt_tokens: Counter,
    generated_tokens: Counter,
    ttft: Histogram,
    itl: Histogram,
    duration: Histogram,
    queue: Histogram,
    tenants: Arc<TenantMetrics>,
    http: Family<HttpLabel, Counter>,
    process: ProcessMetrics,
}

impl RouterMetrics {
    /// Metrics over `pool` and `drain` (read at each scrape), without tenants (all `default`).
    pub fn new(pool: Arc<WorkerPool>, drain: Arc<Drain>) -> Arc<Self> {
        Self::with_tenants(pool, drain, Callers::open())
    }

    /// Metrics over `pool` and `drain` (read at each scrape), per tenant of `callers`.
    pub fn with_tenants(
        pool: Arc<WorkerPool>,
        drain: Arc<Drain>,
        callers: Arc<Callers>,
    ) -> Arc<Self> {
        let mut registry = Registry::with_prefix("router");
        let requests = Family::<Label, Counter>::default();
        let finished = Family::<Label, Counter>::default();
        let prompt_tokens = Counter::default();
        let generated_tokens = Counter::default();
        let latency = [
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0,
        ];
        let ttft = Histogram::new(latency);
        let itl = Histogram::new([
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        ]);
        let duration = Histogram::new([
            0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
        ]);
        let queue = Histogram::new(latency);
        registry.register(
            "requests",
            "Generate calls by final gRPC status code",
            requests.clone(),
        );
        registry.register(
            "finished_requests",
            "Generate calls that finished, by finish reason",
            finished.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens of finished requests",
            prompt_tokens.clone(),
        );
        registry.register(
            "generated_tokens",
            "Tokens generated, counted as they stream (topped up to usage at the finish)",
            generated_tokens.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "From the call's arrival to its first token",
            ttft.clone(),
        );
        registry.register(
            "inter_token_latency_seconds",
            "Between consecutive tokens of a request",
            itl.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "From the call's arrival to its last message (finished requests)",
            duration.clone(),
        );
        registry.register(
            "queue_duration_seconds",
            "From the call's arrival until a worker admitted it (finished requests)",
            queue.clone(),
        );
        let http = Family::<HttpLabel, Counter>::default();
        registry.register(
            "http_requests",
            "Responses of the OpenAI HTTP front's API routes by route and status, refusals \
             (4xx: bad input, unknown model, missing key, quota) included",
            http.clone(),
        );
        let tenants = TenantMetrics::register(&mut registry, pool.clone(), callers);
        registry.register_collector(Box::new(PoolCollector { pool, drain }));
        Arc::new(Self {
            registry,
            requests,
            finished,
            prompt_tokens,
            generated_tokens,
            ttft,
            itl,
            duration,
            queue,
            tenants,
            http,
            process: ProcessMetrics::new(BuildInfo {
                component: "router",
                version: build_info::PACKAGE_VERSION,
                commit: build_info::COMMIT,
            }),
        })
    }

    /// The OpenMetrics text of every metric, the process metrics and `build_info` included.
    pub fn render(&self) -> String {
        process_metrics::render(&self.registry, &self.process)
    }

    /// Starts observing one `Generate` call of the `default` tenant that arrived now; `span` is
    /// its request span.
    pub fn request(self: &Arc<Self>, span: tracing::Span) -> RequestObserver {
        self.request_for(span, DEFAULT_TENANT)
    }

    /// Starts observing one `Generate` call of `tenant` that arrived now; `span` is its request
    /// span.
    pub fn request_for(self: &Arc<Self>, span: tracing::Span, tenant: &str) -> RequestObserver {
        RequestObserver {
            tenant: self.tenants.observe(tenant),
            metrics: self.clone(),
            span,
            arrival: Instant::now(),
            last_token_at: None,
            counted_tokens: 0,
            done: false,
        }
    }

    /// Counts a `Generate` call refused before its handler ran (e.g. a message that does not decode
    /// or is above `max_request_bytes`; see [`crate::request_guard`]) in
    /// `router_requests_total{code}`.
    pub fn count_rejection(&self, code: Code) {
        self.count_status(code);
    }

    /// Counts one response of the HTTP front's route `route` (e.g. `/v1/completions`) with
    /// `status` in `router_http_requests_total{route, status}`.
    pub fn count_http(&self, route: &str, status: u16) {
        self.http
            .get_or_create(&[("route", route.to_string()), ("status", status.to_string())])
            .inc();
    }

    fn count_status(&self, code: Code) {
        self.requests
            .get_or_create(&[("code", code_name(code))])
            .inc();
    }
}

/// Follows one `Generate` call's messages and records it when it ends: OK with its finish reason,
/// an error status, or `CANCELLED` when it is dropped before either (the client went away).
#[derive(Debug)]
pub struct RequestObserver {
    metrics: Arc<RouterMetrics>,
    span: tracing::Span,
    arrival: Instant,
    last_token_at: Option<Instant>,
    /// Tokens already added to `router_generated_tokens_total` for this call.
    counted_tokens: u64,
    done: bool,
    /// The same call in its tenant's series.
    tenant: TenantObserver,
}

impl RequestObserver {
    /// Records a call refused before its stream started.
    pub fn refused(mut self, error: &RouteError) {
        self.on_error(error);
    }

    /// Records one item of the response stream.
    pub fn on_item(&mut self, item: &Result<GenerateResponse, RouteError>) {
        match item {
            Ok(message) => self.on_message(message),
            Err(error) => self.on_error(error),
        }
    }

    fn on_message(&mut self, message: &GenerateResponse) {
        if self.done {
            return;
        }
        self.tenant
            .on_message(message, finish_reason_name(message.finish_reason()));
        let now = Instant::now();
        let m = &self.metrics;
        if !message.tokens.is_empty() {
            m.generated_tokens.inc_by(message.tokens.len() as u64);
            self.counted_tokens += message.tokens.len() as u64;
            match self.last_token_at {
                None => {
                    m.ttft
                        .observe(now.duration_since(self.arrival).as_secs_f64());
                    telemetry::record_request_id(&self.span, &message.request_id);
                }
                Some(last) => {
                    let gap = now.duration_since(last).as_secs_f64() / message.tokens.len() as f64;
                    for _ in &message.tokens {
                        m.itl.observe(gap);
                    }
                }
            }
            self.last_token_at = Some(now);
        }
        let Some(usage) = &message.usage else {
            return;
        };
        self.done = true;
        m.count_status(Code::Ok);
        let reason = finish_reason_name(message.finish_reason());
        m.finished.get_or_create(&[("finish_reason", reason)]).inc();
        m.prompt_tokens.inc_by(usage.prompt_tokens.into());
        // Tokens the model generated but the stream held back (e.g. a stop sequence's own tokens).
        let total = u64::from(usage.generated_tokens);
        m.generated_tokens
            .inc_by(total.saturating_sub(self.counted_tokens));
        self.counted_tokens = self.counted_tokens.max(total);
        m.duration
            .observe(now.duration_since(self.arrival).as_secs_f64());
        m.queue.observe(usage.queue_ms / 1e3);
        telemetry::record_finish(&self.span, message, reason);
    }

    fn on_error(&mut self, error: &RouteError) {
        if self.done {
            return;
        }
        self.done = true;
        self.tenant.on_error(error);
        self.metrics.count_status(error.grpc_code());
        telemetry::record_error(&self.span, error);
    }
}

impl Drop for RequestObserver {
    fn drop(&mut self) {
        if !self.done {
            self.tenant.on_cancelled();
            self.metrics.count_status(Code::Cancelled);
        }
    }
}

/// The metric label of a finish reason.
pub fn finish_reason_name(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Unspecified => "unspecified",
        FinishReason::EosToken => "eos_token",
        FinishReason::MaxNewTokens => "max_new_tokens",
        FinishReason::StopSequence => "stop_sequence",
        FinishReason::ContextLength => "context_length",
        FinishReason::ConstraintComplete => "constraint_complete",
    }
}

/// Reads the pool's queue, workers and counters, and the drain state, at each scrape.
struct PoolCollector {
    pool: Arc<WorkerPool>,
    drain: Arc<Drain>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolSettings;
    use inference_proto::public::{Token, Usage};

    fn metrics() -> Arc<RouterMetrics> {
        RouterMetrics::new(
            WorkerPool::start(PoolSettings::default(), &[]),
            Drain::new(),
        )
    }

    fn token_message(last: bool) -> GenerateResponse {
        GenerateResponse {
            tokens: vec![Token::default()],
            finish_reason: if last {
                FinishReason::StopSequence as i32
            } else {
                0
            },
            usage: last.then_some(Usage {
                prompt_tokens: 4,
                generated_tokens: 3,
                queue_ms: 2.0,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_call_is_counted_once_by_its_outcome() {
        let m = metrics();
        let mut ok = m.request(tracing::Span::none());
        for last in [false, false, true] {
            ok.on_item(&Ok(token_message(last)));
        }
        // Anything after the end changes nothing.
        ok.on_item(&Err(RouteError::Internal("late".into())));
        drop(ok);
        m.request(tracing::Span::none())
            .refused(&crate::validation::ValidationError::invalid("stop", "bad").into());
        m.request(tracing::Span::none())
            .refused(&crate::admission::QueueFull::Requests { waiting: 1, max: 1 }.into());
        m.request(tracing::Span::none())
            .refused(&RouteError::no_worker(0));
        let mut gone = m.request(tracing::Span::none());
        gone.on_item(&Ok(token_message(false)));
        drop(gone);
        // A name that is not configured is `other`.
        m.request_for(tracing::Span::none(), "stranger")
            .refused(&RouteError::no_worker(0));
        let text = m.render();
        for line in [
            "router_requests_total{code=\"OK\"} 1",
            "router_requests_total{code=\"INVALID_ARGUMENT\"} 1",
            "router_requests_total{code=\"RESOURCE_EXHAUSTED\"} 1",
            "router_requests_total{code=\"UNAVAILABLE\"} 2",
            "router_tenant_requests_total{tenant=\"other\",code=\"UNAVAILABLE\",reason=\"error\"} 1",
            "router_requests_total{code=\"CANCELLED\"} 1",
            "router_finished_requests_total{finish_reason=\"stop_sequence\"} 1",
            "router_prompt_tokens_total 4",
            // 3 streamed by the finished call (its usage says 3) and 1 by the cancelled one.
            "router_generated_tokens_total 4",
            "router_time_to_first_token_seconds_count 2",
            "router_inter_token_latency_seconds_count 2",
            "router_request_duration_seconds_count 1",
            "router_queue_duration_seconds_sum 0.002",
            "router_workers_known 0",
            "router_draining 0",
            "router_tenant_requests_total{tenant=\"default\",code=\"OK\",reason=\"stop_sequence\"} 1",
            "router_tenant_requests_total{tenant=\"default\",code=\"CANCELLED\",reason=\"cancelled\"} 1",
            "router_tenant_requests_total{tenant=\"default\",code=\"RESOURCE_EXHAUSTED\",reason=\"queue_full\"} 1",
            "router_tenant_generated_tokens_total{tenant=\"default\"} 4",
            "router_tenant_prompt_tokens_total{tenant=\"default\"} 4",
            "router_tenant_queued_requests{tenant=\"default\"} 0",
            "router_tenant_fair_share_virtual_tokens{tenant=\"default\"} 0.0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }
}
