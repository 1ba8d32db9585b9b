//! [`RequestSeries`]: the per-request series of the router's metrics, each labelled `model_name`
//! (see the parent module's docs).

use inference_proto::public::FinishReason;
use inference_proto::status::code_name;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tonic::Code;

/// Labels of a per-model series: `model_name`.
type ModelLabel = [(&'static str, String); 1];

/// Labels of a per-model series of an outcome: `code` or `finish_reason`, and `model_name`.
type OutcomeLabel = [(&'static str, String); 2];

/// A per-model histogram family (each series with the family's buckets).
type Histograms = Family<ModelLabel, Histogram, fn() -> Histogram>;

/// Buckets (seconds) of the time to first token and the queue time.
const LATENCY_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Buckets (seconds) of the inter-token latency.
const ITL_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// Buckets (seconds) of a request's duration.
const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// The per-request series, registered in the router's registry.
#[derive(Debug)]
pub(super) struct RequestSeries {
    pub(super) requests: Family<OutcomeLabel, Counter>,
    pub(super) finished: Family<OutcomeLabel, Counter>,
    pub(super) prompt_tokens: Family<ModelLabel, Counter>,
    pub(super) generated_tokens: Family<ModelLabel, Counter>,
    pub(super) ttft: Histograms,
    pub(super) itl: Histograms,
    pub(super) duration: Histograms,
    pub(super) queue: Histograms,
}

impl RequestSeries {
    /// The series, registered in `registry` (prefixed `router_`).
    pub(super) fn register(registry: &mut Registry) -> Self {
        let requests = Family::<OutcomeLabel, Counter>::default();
        let finished = Family::<OutcomeLabel, Counter>::default();
        let prompt_tokens = Family::<ModelLabel, Counter>::default();
        let generated_tokens = Family::<ModelLabel, Counter>::default();
        let ttft: Histograms = Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS));
        let itl: Histograms = Family::new_with_constructor(|| Histogram::new(ITL_BUCKETS));
        let duration: Histograms =
            Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS));
        let queue: Histograms = Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS));
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
        Self {
            requests,
            finished,
            prompt_tokens,
            generated_tokens,
            ttft,
            itl,
            duration,
            queue,
        }
    }

    /// Counts one call that ended with `code` in `router_requests_total{code,model_name}`.
    pub(super) fn count_status(&self, code: Code, model_name: &str) {
        self.requests
            .get_or_create(&[
                ("code", code_name(code).to_string()),
                ("model_name", model_name.to_string()),
            ])
            .inc();
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
        FinishReason::ToolCalls => "tool_calls",
    }
}
