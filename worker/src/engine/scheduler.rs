//! Builds each step's batch: which sequences run, and how many tokens of each.
//!
//! Policy, in this order, under a token budget (`max_batch_tokens`) and a sequence cap
//! (`max_num_seqs`):
//! 1. **Decodes first.** Every running sequence that is generating gets its one token, in admission
//!    order, so prefills never starve decodes. A decode that needs a new KV block and finds none
//!    preempts the most recently admitted running sequence (by recompute: its blocks are freed and it
//!    goes back to the head of the queue with its generated tokens kept), repeatedly, until the block
//!    is found or the sequence preempts itself.
//! 2. **Then running prefills continue**, in admission order: each gets as many of its remaining
//!    prompt tokens as the budget allows (chunked prefill: a long prompt takes several steps and never
//!    stalls everyone's decode for a whole prefill).
//! 3. **Then admission, first come first served**: the head of the queue is admitted only when the
//!    blocks for all its known tokens, plus a watermark, are available (leading blocks found in the
//!    prefix cache are reused, not recomputed); its first chunk runs in this step. Admission stops at
//!    the first request that does not fit (no overtaking).

use std::collections::{HashMap, VecDeque};

use super::sequence::Sequence;
use crate::kv::BlockPool;

/// Identifies a sequence inside the engine.
pub type SeqId = u64;

/// Scheduler limits.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Most tokens in one step's batch (prefill chunks plus one per decode).
    pub max_batch_tokens: usize,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Blocks that must stay free after an admission (headroom for running decodes).
    pub watermark_blocks: usize,
}

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// The sequence.
    pub seq: SeqId,
    /// Tokens to run, starting at the sequence's first uncomputed token.
    pub num_tokens: usize,
}

/// What one step runs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// The batch, decodes first.
    pub chunks: Vec<Chunk>,
    /// Sequences preempted while building it (their blocks are already freed).
    pub preempted: Vec<SeqId>,
}

/// Waiting and running sequences.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    waiting: VecDeque<SeqId>,
    running: Vec<SeqId>,
}

impl Scheduler {
    /// A scheduler with `config` limits (`max_batch_tokens` is raised to `max_num_seqs` if lower, so
    /// every running decode always fits).
    pub fn new(mut config: SchedulerConfig) -> Self {
        config.max_batch_tokens = config.max_batch_tokens.max(config.max_num_seqs).max(1);
        config.max_num_seqs = config.max_num_seqs.max(1);
        Self {
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    /// Queues a new sequence at the back.
    pub fn enqueue(&mut self, id: SeqId) {
        self.waiting.push_back(id);
    }

    /// Forgets a sequence (finished, failed or cancelled). The caller releases its blocks.
    pub fn remove(&mut self, id: SeqId) {
        self.running.retain(|&s| s != id);
        self.waiting.retain(|&s| s != id);
    }

    /// Sequences waiting for admission.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences admitted (holding KV blocks).
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// The sequence at the head of the queue.
    pub fn first_waiting(&self) -> Option<SeqId> {
        self.waiting.front().copied()
    }

    /// Builds the next step's batch (see the module docs for the policy). Allocates KV blocks for
    /// what it schedules and frees those of the sequences it preempts.
    pub fn schedule(
        &mut self,
        seqs: &mut HashMap<SeqId, Sequence>,
        pool: &mut BlockPool,
    ) -> Schedule {
        let mut out = Schedule::default();
        let mut budget = self.config.max_batch_tokens;

        // 1. Decodes, in admission order.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let seq = &seqs[&id];
            if seq.in_prefill() {
                i += 1;
                continue;
            }
            let need = seq.computed + 1;
            loop {
                let seq = seqs.get_mut(&id).expect("running sequence");
                let blocks = seq.blocks.as_mut().expect("running sequences hold blocks");
                if pool.ensure_capacity(blocks, need).is_ok() {
                    out.chunks.push(Chunk {
                        seq: id,
                        num_tokens: 1,
                    });
                    budget -= 1;
                    i += 1;
                    break;
                }
                let victim = *self.running.last().expect("at least this sequence runs");
                self.preempt(victim, seqs, pool, &mut out);
                if victim == id {
                    break;
                }
            }
        }

        // 2. Running prefills continue.
        for &id in &self.running {
            if budget == 0 {
                break;
            }
            let seq = &seqs[&id];
            if seq.in_prefill() {
                let n = seq.remaining().min(budget);
                out.chunks.push(Chunk {
                    seq: id,
                    num_tokens: n,
                });
                budget -= n;
            }
        }

        // 3. Admissions, first come first served.
        while budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let seq = seqs.get_mut(&id).expect("waiting sequence");
            let Ok((blocks, computed)) = pool.allocate(&seq.tokens, self.config.watermark_blocks)
            else {
                break;
            };
            seq.blocks = Some(blocks);
            seq.computed = computed;
            self.waiting.pop_front();
            self.running.push(id);
            let n = seq.remaining().min(budget);
            out.chunks.push(Chunk {
                seq: id,
                num_tokens: n,
            });
            budget -= n;
        }
        out
    }

    fn preempt(
        &mut self,
        id: SeqId,
        seqs: &mut HashMap<SeqId, Sequence>,
        pool: &mut BlockPool,
        out: &mut Schedule,
    ) {
        self.running.retain(|&s| s != id);
        let seq = seqs.get_mut(&id).expect("preempted sequence");
        if let Some(blocks) = seq.blocks.take() {
            pool.release(blocks);
        }
        seq.computed = 0;
        self.waiting.push_front(id);
        out.preempted.push(id);
    }
}
