//! Per-tenant Prometheus series, with bounded labels: `tenant` is one of the configured tenant
//! names (the tenants file's, plus `default`); any other name is `other`, so a reload can never
//! make the label set grow without bound.
//!
//! Per request (recorded by [`TenantObserver`], inside the call's
//! [`crate::metrics::RequestObserver`]):
//! `router_tenant_requests_total{tenant, code, reason}` (the final gRPC code name; `reason` is the
//! finish reason for `OK`, the refusing limit for a tenant's refusal (`requests_per_second`,
//! `tokens_per_minute`, `max_concurrent`, `max_queued`), `displaced`, `queue_full`, else
//! `error`), `router_tenant_prompt_tokens_total{tenant}`,
//! `router_tenant_generated_tokens_total{tenant}` (as they stream), and the histograms (seconds)
//! `router_tenant_queue_duration_seconds{tenant}` and
//! `router_tenant_time_to_first_token_seconds{tenant}`.
//!
//! Read at each scrape: `router_tenant_queued_requests{tenant}` (waiting in the admission queue),
//! `router_tenant_running_requests{tenant}` (admitted, not waiting, not finished) and
//! `router_tenant_fair_share_virtual_tokens{tenant}` (the Virtual Token Counter: weighted tokens of
//! service, [`fair_share`]).

use std::sync::Arc;
use std::time::Instant;

use inference_proto::public::GenerateResponse;
use inference_proto::status::code_name;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tonic::Code;

use crate::admission::QueueFull;
use crate::pool::WorkerPool;
use crate::route_error::RouteError;
use crate::tenants::Callers;

/// The label of names that are not configured tenants.
pub const OTHER: &str = "other";

type TenantLabel = Vec<(&'static str, String)>;

/// Reads one per-tenant gauge by tenant name.
type TenantValue<'a> = dyn Fn(&str) -> i64 + 'a;

/// The per-tenant series; registered once into the router's registry.
#[derive(Debug)]
pub struct TenantMetrics {
    callers: Arc<Callers>,
    requests: Family<TenantLabel, Counter>,
    prompt_tokens: Family<TenantLabel, Counter>,
    generated_tokens: Family<TenantLabel, Counter>,
    queue: Family<TenantLabel, Histogram>,
    ttft: Family<TenantLabel, Histogram>,
}

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ])
}

impl TenantMetrics {
    /// Registers the series into `registry` (prefix `router`), labelled by the tenants of
    /// `callers`; the gauges read `pool` and the quota book at each scrape.
    pub fn register(
        registry: &mut Registry,
        pool: Arc<WorkerPool>,
        callers: Arc<Callers>,
    ) -> Arc<Self> {
        let m = Self {
            callers: callers.clone(),
            requests: Family::default(),
            prompt_tokens: Family::default(),
            generated_tokens: Family::default(),
            queue: Family::new_with_constructor(latency_histogram),
            ttft: Family::new_with_constructor(latency_histogram),
        };
        registry.register(
            "tenant_requests",
            "Generate calls per tenant, by final gRPC code and reason",
            m.requests.clone(),
        );
        registry.register(
            "tenant_prompt_tokens",
            "Prompt tokens of finished requests per tenant",
            m.prompt_tokens.clone(),
        );
        registry.register(
            "tenant_generated_tokens",
            "Tokens generated per tenant, counted as they stream",
            m.generated_tokens.clone(),
        );
        registry.register(
            "tenant_queue_duration_seconds",
            "From the call's arrival until a worker admitted it, per tenant",
            m.queue.clone(),
        );
        registry.register(
            "tenant_time_to_first_token_seconds",
            "From the call's arrival to its first token, per tenant",
            m.ttft.clone(),
        );
        registry.register_collector(Box::new(TenantCollector { pool, callers }));
        Arc::new(m)
    }

    /// The label of `tenant`: its name when configured, else [`OTHER`].
    pub fn label(&self, tenant: &str) -> String {
        bounded_label(&self.callers, tenant)
    }

    /// Starts observing one sequence of `tenant` that arrived now.
    pub fn observe(self: &Arc<Self>, tenant: &str) -> TenantObserver {
        TenantObserver {
            metrics: self.clone(),
            label: vec![("tenant", self.label(tenant))],
            arrival: Instant::now(),
            first_token_seen: false,
            counted_tokens: 0,
        }
    }

    fn count(&self, label: &TenantLabel, code: Code, reason: &str) {
        let mut labels = label.clone();
        labels.push(("code", code_name(code).to_string()));
        labels.push(("reason", reason.to_string()));
        self.requests.get_or_create(&labels).inc();
    }
}

fn bounded_label(callers: &Callers, tenant: &str) -> String {
    let configured = callers.table().names().iter().any(|n| &**n == tenant);
    if configured {
        tenant.to_string()
    } else {
        OTHER.to_string()
    }
}

/// The `reason` label of a failed or refused call.
fn error_reason(error: &RouteError) -> &'static str {
    match error {
        RouteError::Quota(q) => q.limit_name(),
        RouteError::Overloaded(QueueFull::TenantQueue { .. }) => "max_queued",
        RouteError::Overloaded(QueueFull::Displaced { .. }) => "displaced",
        RouteError::Overloaded(_) => "queue_full",
        _ => "error",
    }
}

/// Follows one sequence of a tenant (inside its call's request observer).
#[derive(Debug)]
pub struct TenantObserver {
    metrics: Arc<TenantMetrics>,
    label: TenantLabel,
    arrival: Instant,
    first_token_seen: bool,
    counted_tokens: u64,
}

impl TenantObserver {
    /// Records one message: tokens as they stream; at the last (with `finish_reason`, its label),
    /// the outcome, prompt and queue time.
    pub fn on_message(&mut self, message: &GenerateResponse, finish_reason: &str) {
        let m = &self.metrics;
        if !message.tokens.is_empty() {
            if !self.first_token_seen {
                self.first_token_seen = true;
                m.ttft
                    .get_or_create(&self.label)
                    .observe(self.arrival.elapsed().as_secs_f64());
            }
            let n = message.tokens.len() as u64;
            m.generated_tokens.get_or_create(&self.label).inc_by(n);
            self.counted_tokens += n;
        }
        let Some(usage) = &message.usage else {
            return;
        };
        m.count(&self.label, Code::Ok, finish_reason);
        m.prompt_tokens
            .get_or_create(&self.label)
            .inc_by(usage.prompt_tokens.into());
        let total = u64::from(usage.generated_tokens);
        m.generated_tokens
            .get_or_create(&self.label)
            .inc_by(total.saturating_sub(self.counted_tokens));
        m.queue
            .get_or_create(&self.label)
            .observe(usage.queue_ms / 1e3);
    }

    /// Records the call's error (once; the request observer calls it only for its first end).
    pub fn on_error(&mut self, error: &RouteError) {
        self.metrics
            .count(&self.label, error.grpc_code(), error_reason(error));
    }

    /// Records a call dropped before it ended (the client went away).
    pub fn on_cancelled(&mut self) {
        self.metrics
            .count(&self.label, Code::Cancelled, "cancelled");
    }
}

/// Reads queued and running requests and the fair-share counters at each scrape.
struct TenantCollector {
    pool: Arc<WorkerPool>,
    callers: Arc<Callers>,
}

impl std::fmt::Debug for TenantCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantCollector").finish_non_exhaustive()
    }
}

impl Collector for TenantCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let queues = self.pool.tenant_queues();
        let names = self.callers.table().names();
        let queued = |name: &str| {
            queues
                .waiting
                .iter()
                .filter(|(t, _)| bounded_label(&self.callers, t) == name)
                .map(|(_, n)| *n as i64)
                .sum::<i64>()
        };
        let quotas = self.callers.quotas();
        let series: [(&str, &str, &TenantValue); 2] = [
            (
                "tenant_queued_requests",
                "Requests of the tenant waiting in the admission queue",
                &queued,
            ),
            (
                "tenant_running_requests",
                "Requests of the tenant admitted, not waiting and not finished",
                &|name: &str| (i64::from(quotas.active(name)) - queued(name)).max(0),
            ),
        ];
        for (name, help, value) in series {
            let mut family = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for tenant in &names {
                let labels = [("tenant", &**tenant)];
                ConstGauge::new(value(tenant)).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = e.encode_descriptor(
            "tenant_fair_share_virtual_tokens",
            "Weighted tokens of service the tenant received (Virtual Token Counter)",
            None,
            MetricType::Gauge,
        )?;
        for tenant in &names {
            let counter = queues
                .counters
                .iter()
                .find(|(t, _)| t == tenant)
                .map_or(0.0, |(_, c)| *c);
            let labels = [("tenant", &**tenant)];
            ConstGauge::new(counter).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
