//! [`RequestObserver`]: one `Generate` call's metrics, recorded as its response stream passes.

use std::sync::Arc;
use std::time::Instant;

use inference_proto::public::GenerateResponse;
use tonic::Code;

use super::series::{finish_reason_name, RequestSeries};
use crate::route_error::RouteError;
use crate::telemetry;
use crate::tenant_metrics::TenantObserver;

/// Follows one `Generate` call's messages and records it when it ends: OK with its finish reason,
/// an error status, or `CANCELLED` when it is dropped before either (the client went away).
#[derive(Debug)]
pub struct RequestObserver {
    metrics: Arc<RequestSeries>,
    span: tracing::Span,
    arrival: Instant,
    last_token_at: Option<Instant>,
    /// Tokens already added to `router_generated_tokens_total` for this call.
    counted_tokens: u64,
    done: bool,
    /// The same call in its tenant's series.
    tenant: TenantObserver,
    /// Its `model_name` label.
    model: [(&'static str, String); 1],
}

impl RequestObserver {
    /// Observes a call of `tenant` for the model named `model_name` that arrived at `arrival`.
    pub(super) fn new(
        metrics: Arc<RequestSeries>,
        tenant: TenantObserver,
        span: tracing::Span,
        arrival: Instant,
        model_name: String,
    ) -> Self {
        Self {
            metrics,
            span,
            arrival,
            last_token_at: None,
            counted_tokens: 0,
            done: false,
            tenant,
            model: [("model_name", model_name)],
        }
    }

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
            m.generated_tokens
                .get_or_create(&self.model)
                .inc_by(message.tokens.len() as u64);
            self.counted_tokens += message.tokens.len() as u64;
            match self.last_token_at {
                None => {
                    m.ttft
                        .get_or_create(&self.model)
                        .observe(now.duration_since(self.arrival).as_secs_f64());
                    telemetry::record_request_id(&self.span, &message.request_id);
                }
                Some(last) => {
                    let gap = now.duration_since(last).as_secs_f64() / message.tokens.len() as f64;
                    let itl = m.itl.get_or_create(&self.model);
                    for _ in &message.tokens {
                        itl.observe(gap);
                    }
                }
            }
            self.last_token_at = Some(now);
        }
        let Some(usage) = &message.usage else {
            return;
        };
        self.done = true;
        let model_name = &self.model[0].1;
        m.count_status(Code::Ok, model_name);
        let reason = finish_reason_name(message.finish_reason());
        m.finished
            .get_or_create(&[
                ("finish_reason", reason.to_string()),
                ("model_name", model_name.clone()),
            ])
            .inc();
        m.prompt_tokens
            .get_or_create(&self.model)
            .inc_by(usage.prompt_tokens.into());
        // Tokens the model generated but the stream held back (e.g. a stop sequence's own tokens).
        let total = u64::from(usage.generated_tokens);
        m.generated_tokens
            .get_or_create(&self.model)
            .inc_by(total.saturating_sub(self.counted_tokens));
        self.counted_tokens = self.counted_tokens.max(total);
        m.duration
            .get_or_create(&self.model)
            .observe(now.duration_since(self.arrival).as_secs_f64());
        m.queue
            .get_or_create(&self.model)
            .observe(usage.queue_ms / 1e3);
        telemetry::record_finish(&self.span, message, reason);
    }

    fn on_error(&mut self, error: &RouteError) {
        if self.done {
            return;
        }
        self.done = true;
        self.tenant.on_error(error);
        self.metrics
            .count_status(error.grpc_code(), &self.model[0].1);
        telemetry::record_error(&self.span, error);
    }
}

impl Drop for RequestObserver {
    fn drop(&mut self) {
        if !self.done {
            self.tenant.on_cancelled();
            self.metrics.count_status(Code::Cancelled, &self.model[0].1);
        }
    }
}
