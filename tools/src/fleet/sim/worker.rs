//! A modelled worker: the engine's scheduler and block pool reduced to what decides time to first
//! token and prefix-cache hits.
//!
//! - **Steps.** Each step runs every running sequence's decode (one token each), then prefill
//!   chunks in admission order under the token budget (`max_batch_tokens`), then admits waiting
//!   requests first come first served while the sequence cap (`max_num_seqs`), the budget and the
//!   blocks allow. A step lasts [`CostModel::step_seconds`] of its tokens and sequences.
//! - **Blocks.** A request reserves blocks for its whole length (prompt plus `max_new_tokens`) at
//!   admission, reusing the leading blocks its prompt finds in the prefix cache. Its prompt's full
//!   blocks enter the cache when its prefill completes, its generated full blocks when it finishes;
//!   blocks nobody holds stay cached and are evicted least recently released first when an
//!   admission needs room (the worker's own order, `engine::kv::block_pool`).
//! - **Reports.** After each step the worker's cache events (hashes stored and evicted) and its load
//!   (running plus waiting sequences, and their KV demand in tokens) are what its stream would send.
//!
//! Simplified against the engine: no preemption (blocks are reserved up front), prefill chunks in
//! admission order (not shortest remaining first, no long-chunk cap), a generated token's hash is a
//! fresh random number (no later prompt resends generated tokens in these workloads).

use routing::kv_aware::request_work_tokens;
use std::collections::{BTreeSet, HashMap, VecDeque};

/// Step time as a linear function of the batch (fitted from real workers, see `fleet::calibrate`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostModel {
    /// Fixed cost of a step, in seconds.
    pub step_base_s: f64,
    /// Cost per token computed in the step (prefill and decode), in seconds.
    pub per_token_s: f64,
    /// Extra cost per decoding sequence in the step, in seconds.
    pub per_decode_s: f64,
}

impl CostModel {
    /// Seconds a step of `tokens` tokens with `decodes` decoding sequences takes.
    pub fn step_seconds(&self, tokens: usize, decodes: usize) -> f64 {
        self.step_base_s + self.per_token_s * tokens as f64 + self.per_decode_s * decodes as f64
    }
}

/// A worker's limits (the worker settings of the same names).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct WorkerLimits {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the pool.
    pub kv_blocks: usize,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens in one step.
    pub max_batch_tokens: usize,
}

/// A request handed to a worker.
#[derive(Debug, Clone)]
pub struct Job {
    /// The request's index in the workload.
    pub request: usize,
    /// The prompt's block chain (full blocks only).
    pub chain: Vec<u64>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens to generate.
    pub max_new_tokens: usize,
}

#[derive(Debug)]
struct Running {
    job: Job,
    /// Prompt tokens computed or found in the cache.
    computed: usize,
    generated: usize,
    /// Cached blocks this sequence holds a reference on.
    refs: Vec<u64>,
    /// Blocks held outside the cache.
    private: usize,
}

#[derive(Debug, Clone, Copy)]
struct Cached {
    refs: u32,
    released_at: u64,
}

/// What a step did, for the simulator.
#[derive(Debug, Default)]
pub struct StepOutcome {
    /// Requests whose first token this step produced.
    pub first_tokens: Vec<usize>,
    /// Requests that finished in this step.
    pub finished: Vec<usize>,
    /// Hashes that entered the prefix cache.
    pub stored: Vec<u64>,
    /// Hashes evicted from the prefix cache.
    pub evicted: Vec<u64>,
}

/// One modelled worker.
#[derive(Debug)]
pub struct SimWorker {
    limits: WorkerLimits,
    cache: HashMap<u64, Cached>,
    /// Cached blocks nobody holds, by (release tick, hash): first = least recently released.
    evictable: BTreeSet<(u64, u64)>,
    /// Blocks held by sequences outside the cache.
    private: usize,
    tick: u64,
    running: Vec<Running>,
    waiting: VecDeque<Job>,
    /// Stores and evictions since the last step ended (admissions evict).
    pending: StepOutcome,
    /// Prompt tokens looked up in the prefix cache.
    pub query_tokens: u64,
    /// Prompt tokens found there.
    pub hit_tokens: u64,
    /// Requests received.
    pub requests: u64,
    /// Source of generated tokens' hashes.
    fresh: u64,
}

impl SimWorker {
    /// An idle worker with an empty cache; `salt` makes its generated hashes its own.
    pub fn new(limits: WorkerLimits, salt: u64) -> Self {
        Self {
            limits,
            cache: HashMap::new(),
            evictable: BTreeSet::new(),
            private: 0,
            tick: 0,
            running: Vec::new(),
            waiting: VecDeque::new(),
            pending: StepOutcome::default(),
            query_tokens: 0,
            hit_tokens: 0,
            requests: 0,
            fresh: salt.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
        }
    }

    /// Queues a request.
    pub fn submit(&mut self, job: Job) {
        self.requests += 1;
        self.waiting.push_back(job);
    }

    /// Has running or waiting sequences.
    pub fn busy(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// `(running + waiting sequences, work ahead in tokens)`: the load report of its stream, with
    /// the work counted as the real worker counts it (`prefill_backlog_tokens +
    /// decode_horizon_tokens`: uncomputed prompt tokens, or the next token of a decoding sequence,
    /// plus the tokens left to generate capped at [`routing::kv_aware::DECODE_HORIZON_TOKENS`]).
    pub fn load(&self) -> (usize, u64) {
        let running = self.running.iter().map(|r| {
            let backlog = r.job.prompt_tokens.saturating_sub(r.computed).max(1);
            request_work_tokens(backlog, r.job.max_new_tokens.saturating_sub(r.generated))
        });
        let waiting = self
            .waiting
            .iter()
            .map(|j| request_work_tokens(j.prompt_tokens, j.max_new_tokens));
        (
            self.running.len() + self.waiting.len(),
            running.chain(waiting).sum(),
        )
    }

    /// Blocks the cache holds (used or evictable).
    pub fn cached_blocks(&self) -> usize {
        self.cache.len()
    }

    /// Every hash the cache holds, sorted (to compare with a router's index).
    pub fn sorted_hashes(&self) -> Vec<u64> {
        let mut all: Vec<u64> = self.cache.keys().copied().collect();
        all.sort_unstable();
        all
    }

    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.limits.block_size)
    }

    /// Plans a step: admits what fits and returns `(tokens, decodes, per-sequence prefill chunk)`.
    /// `None` when there is nothing to run.
    pub fn plan_step(&mut self) -> Option<(usize, usize, Vec<usize>)> {
        let mut budget = self.limits.max_batch_tokens;
        let mut chunks = Vec::with_capacity(self.running.len() + 1);
        let mut decodes = 0;
        for r in &self.running {
            if r.computed >= r.job.prompt_tokens {
                chunks.push(0);
                decodes += 1;
            } else {
                chunks.push(usize::MAX); // prefill, sized below
            }
        }
        budget = budget.saturating_sub(decodes);
        for (r, chunk) in self.running.iter().zip(chunks.iter_mut()) {
            if *chunk == usize::MAX {
                let n = (r.job.prompt_tokens - r.computed).min(budget);
                budget -= n;
                *chunk = n;
            }
        }
        while budget > 0 && self.running.len() < self.limits.max_num_seqs {
            let Some(job) = self.waiting.front() else {
                break;
            };
            let Some(admitted) = self.admit(job.clone()) else {
                break;
            };
            self.waiting.pop_front();
            let n = (admitted.job.prompt_tokens - admitted.computed).min(budget);
            budget -= n;
            chunks.push(n);
            self.running.push(admitted);
        }
        let tokens = self.limits.max_batch_tokens - budget;
        (tokens > 0).then_some((tokens, decodes, chunks))
    }

    /// Admits `job` when its blocks fit (evicting as needed), `None` otherwise (nothing changed).
    fn admit(&mut self, job: Job) -> Option<Running> {
        let usable = (job.prompt_tokens.saturating_sub(1)) / self.limits.block_size;
        let hits = job.chain[..usable.min(job.chain.len())]
            .iter()
            .take_while(|h| self.cache.contains_key(h))
            .count();
        let needed = self
            .blocks_for(job.prompt_tokens + job.max_new_tokens)
            .saturating_sub(hits);
        let used = self.private + self.cache.len() - self.evictable.len();
        let hit_evictable = job.chain[..hits]
            .iter()
            .filter(|h| self.cache[h].refs == 0)
            .count();
        if used + hit_evictable + needed > self.limits.kv_blocks {
            return None;
        }
        for h in &job.chain[..hits] {
            let c = self.cache.get_mut(h).expect("hit block");
            if c.refs == 0 {
                self.evictable.remove(&(c.released_at, *h));
            }
            c.refs += 1;
        }
        while self.private + self.cache.len() + needed > self.limits.kv_blocks {
            let (_, h) = self.evictable.pop_first().expect("room was checked");
            self.cache.remove(&h);
            self.pending.evicted.push(h);
        }
        self.private += needed;
        self.query_tokens += job.prompt_tokens as u64;
        self.hit_tokens += (hits * self.limits.block_size) as u64;
        Some(Running {
            computed: hits * self.limits.block_size,
            refs: job.chain[..hits].to_vec(),
            private: needed,
            generated: 0,
            job,
        })
    }

    /// Moves one private block of `r` into the cache under `hash` (unless already cached).
    fn register(&mut self, r_private: &mut usize, refs: &mut Vec<u64>, hash: u64) {
        if self.cache.contains_key(&hash) || *r_private == 0 {
            return;
        }
        self.cache.insert(
            hash,
            Cached {
                refs: 1,
                released_at: 0,
            },
        );
        self.private -= 1;
        *r_private -= 1;
        refs.push(hash);
        self.pending.stored.push(hash);
    }

    /// Ends the step planned with `chunks`: advances every sequence and returns what happened.
    pub fn finish_step(&mut self, chunks: &[usize]) -> StepOutcome {
        let mut running = std::mem::take(&mut self.running);
        let mut kept = Vec::with_capacity(running.len());
        for (mut r, &chunk) in running.drain(..).zip(chunks) {
            if r.computed >= r.job.prompt_tokens {
                r.generated += 1;
            } else if chunk > 0 {
                r.computed += chunk;
                if r.computed >= r.job.prompt_tokens {
                    // Prefill done: the first token; the prompt's full blocks enter the cache.
                    r.generated = 1;
                    self.pending.first_tokens.push(r.job.request);
                    let chain = r.job.chain.clone();
                    for h in chain.into_iter().skip(r.refs.len()) {
                        self.register(&mut r.private, &mut r.refs, h);
                    }
                }
            }
            if r.generated >= r.job.max_new_tokens.max(1) && r.computed >= r.job.prompt_tokens {
                self.release(r);
            } else {
                kept.push(r);
            }
        }
        self.running = kept;
        self.tick += 1;
        std::mem::take(&mut self.pending)
    }

    /// A finished sequence: its generated full blocks enter the cache, then every block is released.
    fn release(&mut self, mut r: Running) {
        let total = r.job.prompt_tokens + r.generated;
        let full = total / self.limits.block_size;
        for _ in r.job.chain.len()..full {
            self.fresh = self
                .fresh
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let h = self.fresh ^ (self.fresh >> 29);
            self.register(&mut r.private, &mut r.refs, h);
        }
        self.private -= r.private;
        for h in r.refs {
            let c = self.cache.get_mut(&h).expect("held block");
            c.refs -= 1;
            if c.refs == 0 {
                c.released_at = self.tick;
                self.evictable.insert((self.tick, h));
            }
        }
        self.pending.finished.push(r.job.request);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: WorkerLimits = WorkerLimits {
        block_size: 4,
        kv_blocks: 8,
        max_num_seqs: 4,
        max_batch_tokens: 64,
    };

    fn job(request: usize, tokens: &[u32], new: usize) -> Job {
        Job {
            request,
            chain: routing::block_hashes(tokens, 4),
            prompt_tokens: tokens.len(),
            max_new_tokens: new,
        }
    }

    fn run(w: &mut SimWorker) -> Vec<StepOutcome> {
        let mut out = Vec::new();
        while let Some((_, _, chunks)) = w.plan_step() {
            out.push(w.finish_step(&chunks));
        }
        out
    }

    #[test]
    fn a_repeated_prefix_hits_and_lru_evicts() {
        let mut w = SimWorker::new(LIMITS, 1);
        let a: Vec<u32> = (0..9).collect(); // 2 full blocks + 1 token
        w.submit(job(0, &a, 2));
        let steps = run(&mut w);
        assert_eq!(steps[0].first_tokens, vec![0]);
        assert_eq!(steps[0].stored.len(), 2);
        assert_eq!(steps.last().unwrap().finished, vec![0]);
        assert_eq!(
            w.cached_blocks(),
            2,
            "9 + 2 tokens: no generated full block"
        );
        w.submit(job(1, &a, 2));
        run(&mut w);
        assert_eq!((w.query_tokens, w.hit_tokens), (18, 8));
        // A 28-token prompt (7 blocks + 1 for its output) needs every block: the cache is evicted.
        let b: Vec<u32> = (100..128).collect();
        w.submit(job(2, &b, 1));
        let steps = run(&mut w);
        assert_eq!(steps[0].evicted.len(), 2);
        assert!(!w.busy());
        assert_eq!(w.load(), (0, 0));
    }

    #[test]
    fn admission_waits_for_blocks() {
        let mut w = SimWorker::new(LIMITS, 1);
        let a: Vec<u32> = (0..20).collect(); // 5 blocks + 1 for output
        let b: Vec<u32> = (50..70).collect();
        w.submit(job(0, &a, 4));
        w.submit(job(1, &b, 4));
        let (_, _, chunks) = w.plan_step().unwrap();
        assert_eq!(chunks.len(), 1, "the second request does not fit yet");
        // Work ahead: each has its 20 prompt tokens to prefill and 4 to generate.
        assert_eq!(w.load(), (2, 48));
        let steps = run(&mut w);
        let finished: Vec<usize> = steps.iter().flat_map(|s| s.finished.clone()).collect();
        assert_eq!(finished, vec![0, 1]);
    }
}
