//! KV-aware routing: the worker whose real KV cache and real load make the request cheapest.
//!
//! # Cost
//!
//! For a prompt of `P` tokens whose block chain ([`PromptChain`]) a worker holds for its first `c`
//! blocks of `B` tokens (from its [`crate::index::BlockIndex`]), a worker load of `L` tokens and
//! `n` sequences, and a request that may generate `m` tokens:
//!
//! ```text
//! cached(w)  = min(c, (P - 1) / B) * B      tokens it will not prefill (it always computes the last)
//! prefill(w) = P - cached(w)                tokens it must prefill
//! decode(w)  = min(m, 128) * n(w)           tokens of its batch-mates in its decode steps
//! cost(w)    = a * prefill(w) + L(w) + d * decode(w)
//!              a = prefill_weight (router `kv_prefill_weight`, 4)
//!              d = decode_weight (router `kv_decode_weight`, 1)
//! ```
//!
//! `L` is the work ahead of the worker in tokens, from its last load report (which counts every
//! router's requests): the tokens of its running and waiting sequences not yet computed
//! (`prefill_backlog_tokens`: prompts to prefill, recomputes, each decode's next token) plus the
//! tokens they may still generate, each sequence's capped at [`DECODE_HORIZON_TOKENS`]
//! (`decode_horizon_tokens`); plus [`request_work_tokens`] of each request this router sent it
//! since that report. A prefill token and a decode token cost the worker about the same compute
//! (one row of every matrix product), and both delay the request's first token and share its
//! steps, so `prefill + L` is a first-order estimate of its time to first token in tokens of work.
//!
//! That estimate is the request's own wait. A miss also costs the fleet the tokens it recomputes:
//! every request behind it on that worker waits for them, and the prefix now takes KV space on two
//! workers. With `a = 1` a holder loses a request as soon as its work ahead exceeds another
//! worker's by the tokens the hit would save; at high load that spreads a shared prefix over every
//! worker and the extra prefill feeds the load that caused it (measured in `bench fleet`'s
//! simulator at W = 4, 80 % load, 16 shared prompts: hit rate 56 % against 68 % with `a = 4`, TTFT
//! p50 1.04 s against 0.17 s; BENCHMARKS.md). The weight `a` makes a holder keep the request until
//! its work ahead exceeds another's by `a` times the tokens saved; the load bound below still
//! caps how far a hit may load a worker.
//!
//! `a * prefill + L` prices the wait for the first token only. After it, each of the request's
//! decode steps also computes one token for every sequence running beside it, and those run as
//! long as the request does: `n` sequences make its `m` decode steps `m * n` tokens of work longer
//! (a first-order estimate, as `L`: it assumes they keep running), capped like `L` at
//! [`DECODE_HORIZON_TOKENS`] per sequence. Without this term a worker running many short decodes
//! looks nearly idle (each counts only the few tokens it has left), so the holder of popular
//! prefixes collects sequences and its steps slow down for all of them: in `bench fleet`'s
//! simulator (multi-turn, 64 new tokens, W = 1,024, 80 % load) `d = 0` gave ITL p50 114 ms and
//! end-to-end latency p50 7.9 s against `round_robin`'s 39 ms and 4.4 s; `d = 1` gave 64 ms and
//! 4.7 s, and a higher hit rate (82 against 78 %). With real processes (4 workers, 2 routers, 64
//! new tokens) `d = 0` put every conversation on one worker in 2 of 3 sittings, `d = 1` in none;
//! single sittings vary by up to 2x, so the real end-to-end effect is not yet measured
//! (BENCHMARKS.md, 2026-12-07). The price: where prompts share short prefixes and requests
//! generate long answers, hits spread over more workers (simulated shared-prefix, 128 new tokens,
//! W = 1,024: hit rate 71 -> 51 %, end-to-end latency within 2 %, p99 7 % lower).
//! `kv_decode_weight = 0` restores the old cost.
//!
//! An earlier form took `L` as the KV demand (prompt plus generated tokens of every sequence): a
//! worker holding the prompt's prefix while it ran one similar request then cost more than an idle
//! worker, and hits spilled under load (measured in `bench fleet`, see BENCHMARKS.md). KV held is
//! not work to do; a prompt already prefilled costs nothing more.
//!
//! # Choice
//!
//! 1. Only workers with room (`has_room`) are eligible.
//! 2. **Load bound**: a worker whose load exceeds `(1 + load_factor) * average load + P` (the
//!    average over all candidates) has its cache ignored (`cached = 0`): a hit never sends a
//!    request to an overloaded worker (as in [`crate::affinity`], with loads in tokens).
//! 3. The lowest cost wins. With no hit anywhere every cost is `a * P + L + d * decode`, so a miss
//!    goes to the least loaded worker, by work ahead and by sequences (not the emptiest cache).
//! 4. Ties go to the highest rendezvous score of the prompt's key ([`PromptChain::key`]: its first
//!    block's hash, or a hash of the whole prompt when it is shorter than a block), so that equal
//!    choices spread over the workers by prompt, and the same prefix prefers the same worker.
//!
//! A worker whose index cannot be trusted (its events stalled, or its block size differs from the
//! chain's) is given `cached_blocks = 0` by the caller: it is routed by load only.

use crate::affinity::{rendezvous_score, AffinityPolicy};
use block_hash::{block_hashes_from, SEED};

/// The cap on one sequence's remaining generation in a worker's load (the worker's
/// `LoadReport.decode_horizon_tokens` uses the same): most requests end well before their
/// `max_new_tokens`, so a sequence allowed thousands more tokens weighs like one with 128 left.
pub const DECODE_HORIZON_TOKENS: usize = 128;

/// Work in tokens a request brings to a worker, as its load report will count it: `known_tokens`
/// (prompt plus any already generated, to prefill) plus `tokens_left` (what it may still generate)
/// capped at [`DECODE_HORIZON_TOKENS`].
pub fn request_work_tokens(known_tokens: usize, tokens_left: usize) -> u64 {
    (known_tokens + tokens_left.min(DECODE_HORIZON_TOKENS)) as u64
}

/// A prompt's block chain, computed once per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptChain {
    /// Prompt tokens (`P`).
    pub tokens: usize,
    /// Tokens per block (`B`) of the chain.
    pub block_size: usize,
    /// Hashes of the prompt's full blocks, block 0 first (`block-hash`'s chain).
    pub hashes: Vec<u64>,
    /// The rendezvous key of the ties.
    pub key: u64,
}

impl PromptChain {
    /// The chain of `prompt_ids` in blocks of `block_size` tokens (no blocks when `block_size` is 0).
    pub fn new(prompt_ids: &[u32], block_size: usize) -> Self {
        Self::rooted(SEED, prompt_ids, block_size)
    }

    /// The chain of `prompt_ids` rooted at `root` (block 0's parent hash: `block_hash::SEED`, or
    /// `block_hash::salted_seed` of the request's cache salt, as the worker computes it).
    pub fn rooted(root: u64, prompt_ids: &[u32], block_size: usize) -> Self {
        let hashes = block_hashes_from(root, prompt_ids, block_size);
        let whole_prompt = AffinityPolicy {
            prefix_tokens: usize::MAX,
            load_factor: 0.0,
        };
        let key = hashes
            .first()
            .copied()
            .or_else(|| whole_prompt.key(prompt_ids))
            .unwrap_or(0);
        Self {
            tokens: prompt_ids.len(),
            block_size,
            hashes,
            key,
        }
    }

    /// Tokens a worker holding the first `cached_blocks` blocks does not prefill.
    pub fn cached_tokens(&self, cached_blocks: usize) -> usize {
        if self.block_size == 0 || self.tokens == 0 {
            return 0;
        }
        cached_blocks.min((self.tokens - 1) / self.block_size) * self.block_size
    }
}

/// One ready worker as the KV-aware policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCandidate<'a> {
    /// The worker's address (its identity for rendezvous hashing).
    pub address: &'a str,
    /// Whether it may take another request (below `max_inflight_per_worker`).
    pub has_room: bool,
    /// Leading blocks of the prompt's chain it holds (0 when its index cannot be trusted).
    pub cached_blocks: usize,
    /// Its load in tokens (`L`, see the module docs).
    pub load_tokens: u64,
    /// Its running and waiting sequences (`n`, see the module docs): its last report's plus the
    /// requests this router sent since, or this router's own in flight there when more.
    pub sequences: usize,
}

/// The KV-aware policy's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvAwarePolicy {
    /// Slack of the load bound above the average load (0.5 = 50 % above average, plus the prompt).
    pub load_factor: f64,
    /// Weight of the tokens to prefill against the load in the cost (`a` in the module docs; at
    /// least 0; [`DEFAULT_PREFILL_WEIGHT`] by default).
    pub prefill_weight: f64,
    /// Weight of the batch-mates' tokens in the request's decode steps (`d` in the module docs;
    /// at least 0; [`DEFAULT_DECODE_WEIGHT`] by default).
    pub decode_weight: f64,
}

/// The default of [`KvAwarePolicy::prefill_weight`] (router setting `kv_prefill_weight`).
pub const DEFAULT_PREFILL_WEIGHT: f64 = 4.0;

/// The default of [`KvAwarePolicy::decode_weight`] (router setting `kv_decode_weight`).
pub const DEFAULT_DECODE_WEIGHT: f64 = 1.0;

impl Default for KvAwarePolicy {
    fn default() -> Self {
        Self {
            load_factor: 0.5,
            prefill_weight: DEFAULT_PREFILL_WEIGHT,
            decode_weight: DEFAULT_DECODE_WEIGHT,
        }
    }
}

/// A candidate's evaluation (for tests, metrics and the simulator's reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evaluation {
    /// Tokens it would not prefill (0 when beyond the load bound).
    pub cached_tokens: usize,
    /// `prefill_weight x prefill + load + decode_weight x decode`, in tokens.
    pub cost: u64,
}

impl KvAwarePolicy {
    /// Each candidate's cached tokens and cost for `chain` and a request that may still generate
    /// `new_tokens` (`m`; see the module docs), in order.
    pub fn evaluate(
        &self,
        chain: &PromptChain,
        new_tokens: usize,
        candidates: &[KvCandidate<'_>],
    ) -> Vec<Evaluation> {
        let bound = self.load_bound(chain, candidates);
        let decode_per_sequence =
            new_tokens.min(DECODE_HORIZON_TOKENS) as f64 * self.decode_weight.max(0.0);
        candidates
            .iter()
            .map(|c| {
                let cached = if c.load_tokens as f64 > bound {
                    0
                } else {
                    chain.cached_tokens(c.cached_blocks)
                };
                let prefill = (chain.tokens - cached) as f64 * self.prefill_weight.max(0.0);
                let decode = c.sequences as f64 * decode_per_sequence;
                Evaluation {
                    cached_tokens: cached,
                    // `as` saturates (a huge weight gives u64::MAX, never a wrap).
                    cost: ((prefill + decode).round() as u64).saturating_add(c.load_tokens),
                }
            })
            .collect()
    }

    /// Index of the worker to use among `candidates` for `chain` and a request that may still
    /// generate `new_tokens`, `None` when none has room.
    pub fn pick(
        &self,
        chain: &PromptChain,
        new_tokens: usize,
        candidates: &[KvCandidate<'_>],
    ) -> Option<usize> {
        let evaluations = self.evaluate(chain, new_tokens, candidates);
        candidates
            .iter()
            .zip(&evaluations)
            .enumerate()
            .filter(|(_, (c, _))| c.has_room)
            .min_by(|(_, (a, ea)), (_, (b, eb))| {
                ea.cost.cmp(&eb.cost).then_with(|| {
                    rendezvous_score(chain.key, b.address)
                        .cmp(&rendezvous_score(chain.key, a.address))
                })
            })
            .map(|(i, _)| i)
    }

    /// `(1 + load_factor) * average load + P`, in tokens.
    fn load_bound(&self, chain: &PromptChain, candidates: &[KvCandidate<'_>]) -> f64 {
        if candidates.is_empty() {
            return f64::INFINITY;
        }
        let total: u64 = candidates.iter().map(|c| c.load_tokens).sum();
        let average = total as f64 / candidates.len() as f64;
        (1.0 + self.load_factor.max(0.0)) * average + chain.tokens as f64
    }
}

#[cfg(test)]
mod tests;
