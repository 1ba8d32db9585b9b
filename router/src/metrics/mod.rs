//! The router's Prometheus metrics, served as OpenMetrics text at `GET /metrics` on `metrics_listen`.
//!
//! Per request (recorded by [`RequestObserver`] as the response stream passes through the service),
//! each labelled `model_name` (the public name of the model the request got, as vLLM labels its
//! metrics; empty for a request refused before its model was known, e.g. an unknown model):
//! `router_requests_total{code,model_name}` (final gRPC status: `OK`, `INVALID_ARGUMENT`, `UNAVAILABLE`,
//! `RESOURCE_EXHAUSTED`, `DEADLINE_EXCEEDED`, `CANCELLED` when the client went away, ...; an error
//! counts by the code of its [`RouteError`], on either front),
//! `router_finished_requests_total{finish_reason,model_name}` (`eos_token`, `max_new_tokens`, `stop_sequence`,
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

use observability::process_metrics::{self, BuildInfo, ProcessMetrics};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tonic::Code;

use crate::drain::Drain;
use crate::pool::WorkerPool;
use crate::tenant_metrics::TenantMetrics;
use crate::tenants::{Callers, DEFAULT_TENANT};

mod observer;
mod pool_collector;
mod series;

pub use observer::RequestObserver;
use pool_collector::PoolCollector;
pub use series::finish_reason_name;
use series::RequestSeries;

/// Labels of `router_http_requests_total`: the matched route (bounded by the front's routes) and
/// the status code.
type HttpLabel = [(&'static str, String); 2];

/// Request-level metrics plus the pool's state; shared by the service and the metrics endpoint.
#[derive(Debug)]
pub struct RouterMetrics {
    registry: Registry,
    series: Arc<RequestSeries>,
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
        let series = Arc::new(RequestSeries::register(&mut registry));
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
            series,
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

    /// Starts observing one `Generate` call of the `default` tenant for the model named
    /// `model_name` that arrived now; `span` is its request span.
    pub fn request(self: &Arc<Self>, span: tracing::Span, model_name: &str) -> RequestObserver {
        self.request_for(span, DEFAULT_TENANT, model_name)
    }

    /// Starts observing one `Generate` call of `tenant` for the model named `model_name` (its
    /// `model_name` label: see [`model_label`]) that arrived now; `span` is its request span.
    pub fn request_for(
        self: &Arc<Self>,
        span: tracing::Span,
        tenant: &str,
        model_name: &str,
    ) -> RequestObserver {
        RequestObserver::new(
            self.series.clone(),
            self.tenants.observe(tenant),
            span,
            Instant::now(),
            model_name.to_string(),
        )
    }

    /// Counts a `Generate` call refused before its handler ran (e.g. a message that does not decode
    /// or is above `max_request_bytes`; see [`crate::request_guard`]) in
    /// `router_requests_total{code}`.
    pub fn count_rejection(&self, code: Code) {
        self.series.count_status(code, "");
    }

    /// Counts one response of the HTTP front's route `route` (e.g. `/v1/completions`) with
    /// `status` in `router_http_requests_total{route, status}`.
    pub fn count_http(&self, route: &str, status: u16) {
        self.http
            .get_or_create(&[("route", route.to_string()), ("status", status.to_string())])
            .inc();
    }
}

/// The `model_name` label of a request naming `requested` (`None`: the default model): the public
/// name of the model it gets (as `/v1/models` lists it first), or empty when it gets none (an
/// unknown name, or no worker has described a model yet).
pub fn model_label(pool: &WorkerPool, requested: Option<&str>) -> String {
    let Ok(model) = pool.resolve_model(requested) else {
        return String::new();
    };
    pool.served_models()
        .into_iter()
        .find(|(m, _)| m.id == model.id)
        .and_then(|(_, names)| names.into_iter().next())
        .unwrap_or_else(|| model.id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolSettings;
    use crate::route_error::RouteError;
    use inference_proto::public::{FinishReason, GenerateResponse, Token, Usage};

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
        let mut ok = m.request(tracing::Span::none(), "m");
        for last in [false, false, true] {
            ok.on_item(&Ok(token_message(last)));
        }
        // Anything after the end changes nothing.
        ok.on_item(&Err(RouteError::Internal("late".into())));
        drop(ok);
        m.request(tracing::Span::none(), "m")
            .refused(&crate::validation::ValidationError::invalid("stop", "bad").into());
        m.request(tracing::Span::none(), "m")
            .refused(&crate::admission::QueueFull::Requests { waiting: 1, max: 1 }.into());
        m.request(tracing::Span::none(), "m")
            .refused(&RouteError::no_worker(0));
        let mut gone = m.request(tracing::Span::none(), "m");
        gone.on_item(&Ok(token_message(false)));
        drop(gone);
        // A name that is not configured is `other`.
        m.request_for(tracing::Span::none(), "stranger", "")
            .refused(&RouteError::no_worker(0));
        let text = m.render();
        for line in [
            "router_requests_total{code=\"OK\",model_name=\"m\"} 1",
            "router_requests_total{code=\"INVALID_ARGUMENT\",model_name=\"m\"} 1",
            "router_requests_total{code=\"RESOURCE_EXHAUSTED\",model_name=\"m\"} 1",
            "router_requests_total{code=\"UNAVAILABLE\",model_name=\"m\"} 1",
            // Refused before its model was known.
            "router_requests_total{code=\"UNAVAILABLE\",model_name=\"\"} 1",
            "router_tenant_requests_total{tenant=\"other\",code=\"UNAVAILABLE\",reason=\"error\"} 1",
            "router_requests_total{code=\"CANCELLED\",model_name=\"m\"} 1",
            "router_finished_requests_total{finish_reason=\"stop_sequence\",model_name=\"m\"} 1",
            "router_prompt_tokens_total{model_name=\"m\"} 4",
            // 3 streamed by the finished call (its usage says 3) and 1 by the cancelled one.
            "router_generated_tokens_total{model_name=\"m\"} 4",
            "router_time_to_first_token_seconds_count{model_name=\"m\"} 2",
            "router_inter_token_latency_seconds_count{model_name=\"m\"} 2",
            "router_request_duration_seconds_count{model_name=\"m\"} 1",
            "router_queue_duration_seconds_sum{model_name=\"m\"} 0.002",
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
