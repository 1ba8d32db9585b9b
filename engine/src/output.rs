//! What the engine sends a connection: [`EngineOutput`] (one step's tokens and failures, with the
//! engine's [`EngineLoad`]), through the connection's [`OutputSink`].

use tokio::sync::mpsc;

use super::{EngineError, StopReason};
use crate::kv::CacheEvents;
use crate::sampler::SampledToken;

/// Everything one engine step produced for one connection; or, sent between steps (`step` 0), the
/// refusal of a request the engine could not admit (`load` `None`), the prefix cache's snapshot or
/// changes, or the load of an engine that cancels just left idle.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineOutput {
    /// The tokens generated for the connection's sequences, in batch order.
    pub tokens: Vec<GeneratedToken>,
    /// Prompt tokens scored in this step for the connection's sequences that asked for prompt
    /// logprobs, in batch order; a request's come before its first generated token (in this
    /// output's `tokens` or a later output's).
    pub prompt_logprobs: Vec<PromptLogprobs>,
    /// The connection's requests refused or failed; each is no longer active.
    pub errors: Vec<RequestFailure>,
    /// The engine's load after the step.
    pub load: Option<EngineLoad>,
    /// The engine's step counter when this output was produced (1-based, increasing).
    pub step: u64,
    /// The prefix cache's changes since the previous output (every connection gets them, batched
    /// per step), or its snapshot on a connection's first output; `None` when nothing changed.
    pub cache: Option<CacheReport>,
}

/// What the prefix cache holds or changed, by block hash (`block-hash`'s chain).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheReport {
    /// `events.stored` is every block held now and replaces what the connection knew (its first
    /// output); otherwise `events` is the net change since the connection's previous output.
    pub snapshot: bool,
    /// The blocks stored and evicted (or, in a snapshot, held).
    pub events: CacheEvents,
}

/// One generated token of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedToken {
    /// The request's id.
    pub request_id: String,
    /// The token.
    pub token_id: u32,
    /// log p(token) under the model's raw distribution (temperature 1), in nats.
    pub logprob: f32,
    /// Why the sequence ended with this token; `None` while it goes on. When set, the engine has
    /// freed the sequence.
    pub stop: Option<StopReason>,
    /// Index of this token among the request's generated tokens (0-based).
    pub index: u32,
    /// The request's `top_logprobs` most likely `(token id, logprob)` at this position under the
    /// same distribution as `logprob`, most likely first (ties: lower id first); empty when it asked
    /// for none.
    pub top_logprobs: Vec<(u32, f32)>,
    /// Speculative decoding: the request's draft tokens proposed so far, up to this token's step
    /// (its final stats on the last token).
    pub draft_tokens: u32,
    /// Of those, the tokens accepted.
    pub accepted_draft_tokens: u32,
}

/// Consecutive prompt tokens of one request, scored (see the `prompt_logprobs` module): each
/// token's logprob and top alternatives under the model's raw distribution at the position before
/// it, bitwise what the same token would report if it had been generated there.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprobs {
    /// The request's id.
    pub request_id: String,
    /// Index in the prompt of `tokens[0]` (at least 1: the first prompt token has no logprob).
    pub first_index: u32,
    /// The prompt's length in tokens (the scoring is complete once index `prompt_len - 1` came).
    pub prompt_len: u32,
    /// The scored prompt tokens: `token_id`, `logprob`, and the request's number of most likely
    /// alternatives (most likely first, ties lower id first).
    pub tokens: Vec<SampledToken>,
}

/// A request the engine refused or could not finish.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestFailure {
    /// The request's id.
    pub request_id: String,
    /// Why.
    pub error: EngineError,
}

/// The engine's load, reported with every step's outputs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineLoad {
    /// Sequences in the running batch.
    pub running_sequences: u32,
    /// Sequences waiting for admission.
    pub waiting_sequences: u32,
    /// KV cache capacity left, in tokens.
    pub free_kv_tokens: u64,
    /// KV demand of the running and waiting sequences: their known tokens (prompt plus generated
    /// so far), summed.
    pub kv_demand_tokens: u64,
    /// Known tokens of the running and waiting sequences not yet in the KV cache (prompts to
    /// prefill, preempted sequences' recompute, each decoding sequence's next token), summed.
    pub prefill_backlog_tokens: u64,
    /// Tokens the running and waiting sequences may still generate, each capped at
    /// [`DECODE_HORIZON_TOKENS`], summed.
    pub decode_horizon_tokens: u64,
}

/// The cap on one sequence's remaining generation in [`EngineLoad::decode_horizon_tokens`]: a
/// router weighs a sequence that may still generate thousands of tokens like one with 128 left,
/// since most requests end well before their `max_new_tokens` (the wire contract's value,
/// `LoadReport.decode_horizon_tokens`).
pub const DECODE_HORIZON_TOKENS: usize = 128;

/// Where the engine sends one connection's outputs (a channel, or the gRPC service's stream in its
/// wire format).
pub trait OutputSink: Send + 'static {
    /// Sends `output`; false when the connection is gone (the engine then drops its sequences).
    fn send(&self, output: EngineOutput) -> bool;
}

impl OutputSink for mpsc::UnboundedSender<EngineOutput> {
    fn send(&self, output: EngineOutput) -> bool {
        mpsc::UnboundedSender::send(self, output).is_ok()
    }
}
