//! The worker's spans for each request, children of the router's request span (its W3C context
//! arrives in `AddRequest.trace_context`): `worker.request` from `Add` to the last token, error or
//! cancel, with children `prefill` (until the first token: the prompt, and on a failover the tokens
//! already generated, go through the model) and `decode` (the remaining tokens).
//!
//! The spans are built from what the service sees pass (the `Add`, the step messages going out), so
//! the engine needs no hook. Nothing is tracked unless spans are exported
//! ([`observability::telemetry::tracing_enabled`]).

use std::collections::HashMap;
use std::sync::Mutex;

use inference_proto::worker::{AddRequest, StepOutput};
use tracing::field::Empty;

/// One request's open spans.
struct RequestSpans {
    request: tracing::Span,
    /// `prefill` until the first token, then `decode`.
    phase: tracing::Span,
    decoding: bool,
    tokens: u32,
}

/// The open spans of one router stream's requests, by request id.
#[derive(Default)]
pub struct ConnectionSpans {
    requests: Mutex<HashMap<String, RequestSpans>>,
}

impl ConnectionSpans {
    /// A tracker for a new stream, or `None` when spans are not exported.
    pub fn new_if_enabled() -> Option<Self> {
        observability::telemetry::tracing_enabled().then(Self::default)
    }

    /// Opens the spans of a request the router just added.
    pub fn on_add(&self, add: &AddRequest) {
        let request = tracing::info_span!(
            "worker.request",
            otel.kind = "server",
            otel.status_code = Empty,
            otel.status_description = Empty,
            request_id = %add.request_id,
            prompt_tokens = add.prompt_ids.len(),
            resumed_tokens = add.generated_ids.len(),
            max_new_tokens = add.max_new_tokens,
            generated_tokens = Empty,
            outcome = Empty,
        );
        observability::propagation::set_parent_from_map(&request, &add.trace_context);
        let phase = tracing::info_span!(
            parent: &request,
            "prefill",
            tokens = add.prompt_ids.len() + add.generated_ids.len()
        );
        let spans = RequestSpans {
            request,
            phase,
            decoding: false,
            tokens: 0,
        };
        self.lock().insert(add.request_id.clone(), spans);
    }

    /// Closes the spans of a request the router cancelled.
    pub fn on_cancel(&self, request_id: &str) {
        if let Some(spans) = self.lock().remove(request_id) {
            spans.request.record("outcome", "cancelled");
            spans.request.record("generated_tokens", spans.tokens);
        }
    }

    /// Advances the spans of the requests in one outgoing step message.
    pub fn on_step(&self, step: &StepOutput) {
        let mut requests = self.lock();
        for token in &step.tokens {
            let Some(spans) = requests.get_mut(&token.request_id) else {
                continue;
            };
            spans.tokens += 1;
            if !spans.decoding && !token.finished {
                spans.decoding = true;
                spans.phase = tracing::info_span!(parent: &spans.request, "decode", tokens = Empty);
            }
            if token.finished {
                let spans = requests.remove(&token.request_id).expect("present");
                if spans.decoding {
                    spans.phase.record("tokens", spans.tokens - 1);
                }
                spans.request.record("outcome", "finished");
                spans.request.record("generated_tokens", spans.tokens);
            }
        }
        for error in &step.errors {
            if let Some(spans) = requests.remove(&error.request_id) {
                spans.request.record("outcome", "error");
                spans.request.record("generated_tokens", spans.tokens);
                spans.request.record("otel.status_code", "ERROR");
                spans.request.record(
                    "otel.status_description",
                    format!("code {}: {}", error.code, error.message).as_str(),
                );
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, RequestSpans>> {
        self.requests.lock().expect("span map lock")
    }
}
