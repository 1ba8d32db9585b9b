//! [`EngineStats`]: the engine's counters, published after every step and command batch (see
//! `monitor`) and read by health, `Info` and metrics.

/// The engine's counters. Counts are since the engine started; sequence and KV figures are as of
/// the last step or command batch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    /// Sequences in the running batch.
    pub running_sequences: u32,
    /// Sequences waiting for admission.
    pub waiting_sequences: u32,
    /// Sequences held because their clients stopped reading ([`crate::Command::Hold`]): no batch
    /// slot, no KV blocks, until resumed.
    pub held_sequences: u32,
    /// Steps run.
    pub steps: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// KV cache tokens held by live sequences.
    pub kv_tokens_used: u64,
    /// KV cache capacity, in tokens.
    pub kv_tokens_capacity: u64,
    /// Requests that finished (a stop token, the length limit, the context, a complete constraint).
    pub finished_requests: u64,
    /// Requests cancelled (by the caller, or by its connection closing).
    pub cancelled_requests: u64,
    /// Tokens per KV block.
    pub kv_block_size: u32,
    /// KV blocks in the pool.
    pub kv_blocks_total: u64,
    /// KV blocks held by sequences.
    pub kv_blocks_used: u64,
    /// KV blocks free.
    pub kv_blocks_free: u64,
    /// Sequences preempted (to be recomputed) because the KV cache was full.
    pub preemptions: u64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_cache_query_tokens: u64,
    /// Prompt tokens found in the prefix cache (not recomputed).
    pub prefix_cache_hit_tokens: u64,
    /// `prefix_cache_hit_tokens / prefix_cache_query_tokens` (0 when nothing was looked up).
    pub prefix_cache_hit_rate: f64,
    /// Full blocks addressable in the prefix cache.
    pub prefix_cache_blocks: u64,
    /// Requests refused or failed by the engine.
    pub failed_requests: u64,
    /// Tokens in the last step's batch.
    pub last_batch_tokens: u32,
    /// Sequences in the last step's batch.
    pub last_batch_sequences: u32,
    /// Speculative decoding: draft tokens proposed (all sequences, all proposers).
    pub speculative_draft_tokens: u64,
    /// Draft tokens accepted (committed without a step of their own).
    pub speculative_accepted_tokens: u64,
    /// Verifications: one sequence's draft checked in one step.
    pub speculative_verifications: u64,
    /// Of the draft tokens, those a structured-output constraint forced (its mask allowed only
    /// them); not on the wire (the worker's metrics count them under `proposer="grammar"`).
    pub speculative_forced_tokens: u64,
    /// Of the forced draft tokens, those accepted (all of them unless the sequence ended first).
    pub speculative_forced_accepted_tokens: u64,
}
