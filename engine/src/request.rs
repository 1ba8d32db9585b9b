//! [`EngineRequest`]: a request to generate, in the engine's terms (the gRPC service builds it from
//! the wire's `AddRequest`).

use std::sync::Arc;

use crate::sampler::SamplingConfig;

/// Identifies one router connection (one bidirectional stream); every request belongs to one.
pub type ConnId = u64;

/// A request to generate tokens after a prompt. The engine checks everything here before admitting
/// it (a bad request is refused with [`EngineErrorKind::InvalidRequest`](super::EngineErrorKind)).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EngineRequest {
    /// The caller's id for the request: non-empty, unique among its connection's open requests.
    pub request_id: String,
    /// Prompt token ids: non-empty, shorter than the model's context, inside the vocabulary.
    pub prompt_ids: Vec<u32>,
    /// Tokens already generated for this request elsewhere (a failover): recomputed as context,
    /// counted against `max_new_tokens`, and the sampler's random stream continues at index
    /// `generated_ids.len()`, so the continuation equals an uninterrupted run.
    pub generated_ids: Vec<u32>,
    /// Most tokens to generate, `generated_ids` included (must exceed their number).
    pub max_new_tokens: u32,
    /// Token ids that end the sequence (EOS ids unless the caller asked to ignore them).
    pub stop_token_ids: Vec<u32>,
    /// How to pick each token (checked by [`SamplingConfig::validate`] and
    /// [`SamplingConfig::check_vocab`] before admission).
    pub sampling: SamplingConfig,
    /// Seed of the request's random stream: draw `n` is a pure function of `(seed, n)`.
    pub seed: u64,
    /// Scheduling priority ([`crate::Priority`]): higher is admitted first and preempted last;
    /// negative = sheddable (preempted for a higher-priority arrival that finds no KV blocks).
    pub priority: i32,
    /// The tenant the request belongs to ([`crate::DEFAULT_TENANT`] when the caller names none):
    /// inside a priority class the scheduler serves prefill work tenant by tenant, least weighted
    /// service first (the scheduler, `engine/src/scheduler/`).
    pub tenant: Arc<str>,
    /// The tenant's fair-share weight (at least 1; 0 counts as 1).
    pub tenant_weight: u32,
    /// Prefix-cache isolation: the root of the request's block-hash chain
    /// ([`block_hash::salted_seed`] of its cache salt, [`block_hash::SEED`] without one). Only
    /// requests with the same root share cached blocks.
    pub prefix_root: u64,
    /// Score the prompt's tokens ([`PromptLogprobs`](super::PromptLogprobs) outputs) with this many
    /// most likely alternatives each (at most 20); `None`: no prompt logprobs. Such a request reuses
    /// the prefix cache only up to its first prompt position to score.
    pub prompt_logprobs: Option<u32>,
    /// The request opted out of speculative decoding (its tokens are the same either way; only
    /// the speed differs).
    pub speculation_opt_out: bool,
}
