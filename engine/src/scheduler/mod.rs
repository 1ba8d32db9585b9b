//! Builds each step's batch: which sequences run, and how many tokens of each.
//!
//! Policy, in this order, under a token budget (`max_batch_tokens`) and a sequence cap
//! (`max_num_seqs`):
//! 0. **Priority** ([`crate::priority`]): running sequences are ordered by (priority descending,
//!    admission ascending) and waiting ones by (priority descending, tenant's fair-share rank,
//!    arrival ascending); "admission order" and "the head of the queue" below mean these orders.
//!    With equal priorities and one tenant (the default) they are first come first served.
//!    **Tenants** ([`crate::tenant_share`]): every token a step computes is charged to its
//!    sequence's tenant (the Virtual Token Counter), and inside a priority class the tenant with
//!    the least weighted service ranks first.
//! 1. **Decodes first.** Every running sequence that is generating gets its one token, in admission
//!    order, so prefills never starve decodes. A decode that needs a new KV block and finds none
//!    preempts the lowest-priority, most recently admitted running sequence (by recompute: its
//!    blocks are freed and it goes back to the queue, at its place by priority and arrival, with its
//!    generated tokens kept), repeatedly, until the block is found or the sequence preempts itself.
//! 2. **Then prefill work shares what is left of the budget**, running prefills and new admissions
//!    alike (chunked prefill: a long prompt takes several steps; the split is
//!    [`crate::prefill_budget`]):
//!    - *Strict priority between classes*: only the prefill candidates of the highest priority
//!      present get tokens in the step; lower classes wait for a step without higher-priority
//!      prefill work, so a higher-priority prompt's step is as short as its own work (and the
//!      decodes) allow. The rules below apply inside that class.
//!    - *Fair share between tenants*: inside that class, prefill candidates are served tenant by
//!      tenant in rank order; the rules below apply inside a tenant, on what the tenants ranked
//!      before it left.
//!    - *Shortest remaining prompt first*: prefill candidates are served in increasing order of the
//!      prompt tokens they still have to compute (ties: admission order, then queue order), so a short
//!      request that arrives while a long prompt prefills gets its whole first chunk in the next step
//!      instead of waiting behind thousands of tokens (head-of-line blocking).
//!    - *Aging*: the oldest running prefill is first guaranteed `max(1, budget / 4)` tokens (at most
//!      what it has left), so a stream of short arrivals can slow a long prompt down to a quarter of
//!      the prefill budget but never starve it; once it finishes, the next oldest gets the guarantee.
//!    - *Long-chunk cap when contended*: when the step also runs decodes or more than one prefill
//!      candidate exists, no sequence's chunk exceeds `long_prefill_token_threshold` tokens (0 = no
//!      cap; vLLM's setting of the same name). This bounds a step's length, hence the inter-token gap
//!      of running decodes and the wait of a new arrival for the step in progress. A prompt alone on
//!      the worker still takes the whole budget per step.
//!    - *Admission is first come first served*: the head of the queue is admitted only when the
//!      sequence cap allows, the blocks for all its known tokens plus a watermark (none for a
//!      sequence that already generated: preempted, held or resumed) are available
//!      (leading blocks found in the prefix cache are reused, not recomputed), and the ordering above
//!      gives it tokens in this step (judged on its whole prompt, before prefix-cache hits). Admission
//!      stops at the first request that does not qualify (no overtaking), so a request waiting at
//!      the head keeps its place and holds no blocks while it waits.
//!    - *Shedding*: a head that finds too few blocks preempts running sheddable sequences (negative
//!      priority, below its own), lowest priority and most recently admitted first, one at a time
//!      until its blocks are available; it preempts none when even all of them would not free
//!      enough. A preempted sequence's chunk of this step is dropped and its tokens go back to the
//!      budget.
//!
//! 3. **Held sequences sit out** ([`Scheduler::hold`]): a sequence whose client stopped reading is
//!    preempted by recompute and kept out of both the running set and the queue (no batch slot, no
//!    KV blocks, no step time) until [`Scheduler::resume`] queues it again at its place by
//!    priority and arrival; its full blocks stay in the prefix cache meanwhile, so a resume
//!    usually recomputes only the last partial block.
//!
//!    Every admitted prefill therefore progresses at least every step while it is the oldest, and a
//!    request of `n` prompt tokens reaches its first token within a bounded number of steps: the
//!    prefills shorter than it, plus its own `ceil(n / chunk)` steps.

use std::collections::HashMap;
use std::sync::Arc;

use super::prompt_logprobs;
use super::sequence::Sequence;
use crate::kv::{BlockPool, NoFreeBlocks};
use crate::prefill_budget::{share_prefill_budget, Candidate};
use crate::priority::{is_sheddable, Priority, RunningSet, WaitQueue};
use crate::tenant_share::TenantShares;

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
    /// Most tokens of one sequence's prefill chunk while the step is contended (decodes run, or
    /// more than one prefill candidate exists); 0 = no cap. See the module docs.
    pub long_prefill_token_threshold: usize,
    /// Most tokens sheddable (negative-priority) sequences take in one step, decodes and prefill
    /// chunks together; 0 = no cap. Bounds how long a step of sheddable work makes a
    /// higher-priority arrival wait. See the module docs.
    pub max_sheddable_batch_tokens: usize,
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

/// A sequence's tenant and fair-share weight (0 counts as 1).
#[derive(Debug, Clone)]
struct Member {
    tenant: Arc<str>,
    weight: u32,
}

/// Waiting and running sequences.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    waiting: WaitQueue<SeqId>,
    running: RunningSet<SeqId>,
    /// Each queued, running or held sequence's tenant and fair-share weight.
    tenant_of: HashMap<SeqId, Member>,
    /// Held sequences (see [`Self::hold`]) and the priority they resume with.
    held: HashMap<SeqId, Priority>,
    tenants: TenantShares,
}

impl Scheduler {
    /// A scheduler with `config` limits (`max_batch_tokens` is raised to `max_num_seqs` if lower, so
    /// every running decode always fits).
    pub fn new(mut config: SchedulerConfig) -> Self {
        config.max_batch_tokens = config.max_batch_tokens.max(config.max_num_seqs).max(1);
        config.max_num_seqs = config.max_num_seqs.max(1);
        Self {
            config,
            waiting: WaitQueue::default(),
            running: RunningSet::default(),
            tenant_of: HashMap::new(),
            held: HashMap::new(),
            tenants: TenantShares::default(),
        }
    }

    /// Queues a new sequence of `priority` (higher first; negative = sheddable) and of `tenant`
    /// (fair-share `weight`; 0 counts as 1) behind those of its priority or higher. `id`s must grow
    /// with arrival: they order a priority class.
    pub fn enqueue(&mut self, id: SeqId, priority: Priority, tenant: Arc<str>, weight: u32) {
        if self.tenant_of.contains_key(&id) {
            return;
        }
        self.tenants.arrive(&tenant, weight);
        self.waiting.push(id, priority, tenant.clone());
        self.tenant_of.insert(id, Member { tenant, weight });
    }

    /// Forgets a sequence (finished, failed or cancelled). The caller releases its blocks.
    pub fn remove(&mut self, id: SeqId) {
        self.running.remove(id);
        self.waiting.remove(id);
        // A held sequence already left its tenant's share.
        let held = self.held.remove(&id).is_some();
        if let Some(member) = self.tenant_of.remove(&id) {
            if !held {
                self.tenants.leave(&member.tenant);
            }
        }
    }

    /// Takes a running or waiting sequence out of the schedule until [`Self::resume`] (its
    /// client stopped reading): a running one is preempted by recompute (its blocks are released
    /// to `pool`, whose prefix cache keeps the full ones, and `computed` restarts at 0), a waiting
    /// one leaves the queue. Its tokens, sampler and constraint stay as they are, so a resumed
    /// sequence continues exactly where it stopped. While held it leaves its tenant's fair share
    /// (a tenant whose only sequences wait for their clients is idle, and banks no credit); it
    /// rejoins on [`Self::resume`]. Returns false (and does nothing) for a sequence that is
    /// unknown or already held.
    pub fn hold(
        &mut self,
        id: SeqId,
        seqs: &mut HashMap<SeqId, Sequence>,
        pool: &mut BlockPool,
    ) -> bool {
        let Some(priority) = self.running.remove(id).or_else(|| self.waiting.remove(id)) else {
            return false;
        };
        if let Some(seq) = seqs.get_mut(&id) {
            if let Some(blocks) = seq.blocks.take() {
                pool.release(blocks);
            }
            seq.computed = 0;
        }
        self.tenants.leave(&self.tenant_of[&id].tenant);
        self.held.insert(id, priority);
        true
    }

    /// Queues a held sequence again, at its place by priority and arrival (as a preempted one).
    /// Returns false (and does nothing) for a sequence that is not held.
    pub fn resume(&mut self, id: SeqId) -> bool {
        let Some(priority) = self.held.remove(&id) else {
            return false;
        };
        let Member { tenant, weight } = self.tenant_of[&id].clone();
        self.tenants.arrive(&tenant, weight);
        self.waiting.push(id, priority, tenant);
        true
    }

    /// Whether `id` is held.
    pub fn is_held(&self, id: SeqId) -> bool {
        self.held.contains_key(&id)
    }

    /// Held sequences.
    pub fn num_held(&self) -> usize {
        self.held.len()
    }

    /// Whether a step has anything to run: a running or a waiting sequence (held ones do not
    /// count).
    pub fn has_work(&self) -> bool {
        self.running.len() + self.waiting.len() > 0
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
        let ranks = self.tenants.ranks();
        self.waiting.front(rank_in(&ranks)).map(|(id, _)| id)
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
        let mut sheddable_left = match self.config.max_sheddable_batch_tokens {
            0 => usize::MAX,
            t => t,
        };
        // Sheddable decodes yield the step to a higher-priority prefill (decided here from what
        // waits and runs; checked again below against what the step really carries).
        let yielding = self.higher_prefill_pending(seqs);
        let ranks = self.tenants.ranks();

        // 1. Decodes, in admission order.
        let mut decodes = DecodePass {
            out: &mut out,
            budget: &mut budget,
            sheddable_left: &mut sheddable_left,
        };
        let first = if yielding {
            Decodes::NotSheddable
        } else {
            Decodes::All
        };
        self.schedule_decodes(seqs, pool, &mut decodes, &mut Vec::new(), first);
        // 2. Prefill work: running prefills and admissions share the rest of the budget.
        let prefilling: Vec<Candidate<SeqId>> = self
            .running
            .iter()
            .filter(|(id, _)| seqs[id].in_prefill())
            .map(|(id, priority)| Candidate {
                seq: id,
                remaining: seqs[&id].remaining(),
                priority,
                rank: self.rank_of(&ranks, id),
            })
            .collect();
        let contended = !out.chunks.is_empty() || prefilling.len() + self.waiting.len() > 1;
        let cap = match self.config.long_prefill_token_threshold {
            0 => usize::MAX,
            t if contended => t,
            _ => usize::MAX,
        };
        let mut candidates = prefilling;
        // Admissions, by priority then arrival, while the head would get tokens in this step.
        while budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some((id, priority)) = self.waiting.front(rank_in(&ranks)) else {
                break;
            };
            let rank = self.rank_of(&ranks, id);
            let estimate = Candidate {
                seq: id,
                remaining: seqs[&id].tokens.len(),
                priority,
                rank,
            };
            let mut trial = candidates.clone();
            trial.push(estimate);
            if share_prefill_budget(&trial, budget, cap, sheddable_left)[trial.len() - 1] == 0 {
                break;
            }
            let allocated = loop {
                let seq = &seqs[&id];
                let reusable = prompt_logprobs::reusable_prefix(seq);
                // The watermark is headroom kept from new prompts for the running decodes; a
                // sequence that already generated (preempted, held, resumed after a failover) had
                // its room and must find it again, else one that grew to within the watermark of
                // the whole cache could never come back.
                let watermark = if seq.tokens.len() > seq.prompt_len {
                    0
                } else {
                    self.config.watermark_blocks
                };
                match pool.allocate(&seq.tokens, seq.prefix_root, reusable, watermark) {
                    Ok(allocated) => break Some(allocated),
                    Err(short) => {
                        let mut step = StepState {
                            out: &mut out,
                            candidates: &mut candidates,
                            budget: &mut budget,
                        };
                        if !self.shed_for(priority, short, seqs, pool, &mut step) {
                            break None;
                        }
                    }
                }
            };
            let Some((blocks, computed)) = allocated else {
                break;
            };
            let seq = seqs.get_mut(&id).expect("waiting sequence");
            seq.blocks = Some(blocks);
            seq.computed = computed;
            self.waiting.remove(id);
            self.running.admit(id, priority);
            candidates.push(Candidate {
                seq: id,
                remaining: seq.remaining(),
                priority,
                rank,
            });
        }
        if yielding && candidates.iter().all(|c| is_sheddable(c.priority)) {
            // The higher-priority prefill did not make it in (no blocks or no room for its
            // sequence): the sheddable decodes take the step as usual, ahead of the prefill.
            let mut decodes = DecodePass {
                out: &mut out,
                budget: &mut budget,
                sheddable_left: &mut sheddable_left,
            };
            self.schedule_decodes(
                seqs,
                pool,
                &mut decodes,
                &mut candidates,
                Decodes::Sheddable,
            );
        }
        let shares = share_prefill_budget(&candidates, budget, cap, sheddable_left);
        for (c, n) in candidates.iter().zip(shares) {
            if n > 0 {
                out.chunks.push(Chunk {
                    seq: c.seq,
                    num_tokens: n,
                });
            }
        }
        for chunk in &out.chunks {
            self.tenants
                .charge(&self.tenant_of[&chunk.seq].tenant, chunk.num_tokens);
        }
        out
    }

    /// The fair-share rank (in `ranks`) of `id`'s tenant.
    fn rank_of(&self, ranks: &HashMap<Arc<str>, usize>, id: SeqId) -> usize {
        rank_in(ranks)(&self.tenant_of[&id].tenant)
    }

    /// True when a non-sheddable sequence may prefill in this step: one running in prefill, or a
    /// non-sheddable head of the queue with room for one more sequence.
    fn higher_prefill_pending(&self, seqs: &HashMap<SeqId, Sequence>) -> bool {
        let running = self
            .running
            .iter()
            .any(|(id, p)| !is_sheddable(p) && seqs[&id].in_prefill());
        let head = self
            .waiting
            .front(|_| 0)
            .is_some_and(|(_, p)| !is_sheddable(p))
            && self.running.len() < self.config.max_num_seqs;
        running || head
    }

    /// Adds one decode token for every running sequence of the `which` classes that is
    /// generating, in admission order, while the budget (and, for sheddable ones, their token
    /// cap) lasts. Called before any prefill chunk is in `pass.out`, so decodes stay first. A
    /// decode that needs a new KV block and finds none preempts the lowest-priority, most recently
    /// admitted sequence (dropping it from the prefill `candidates`), repeatedly, until the block
    /// is found or it preempts itself.
    fn schedule_decodes(
        &mut self,
        seqs: &mut HashMap<SeqId, Sequence>,
        pool: &mut BlockPool,
        pass: &mut DecodePass<'_>,
        candidates: &mut Vec<Candidate<SeqId>>,
        which: Decodes,
    ) {
        let mut i = 0;
        while i < self.running.len() && *pass.budget > 0 {
            let (id, priority) = self.running.at(i).expect("index checked");
            let seq = &seqs[&id];
            let shed = is_sheddable(priority);
            let skip =
                seq.in_prefill() || !which.includes(shed) || (shed && *pass.sheddable_left == 0);
            if skip {
                i += 1;
                continue;
            }
            let need = seq.computed + 1;
            loop {
                let seq = seqs.get_mut(&id).expect("running sequence");
                let blocks = seq.blocks.as_mut().expect("running sequences hold blocks");
                if pool.ensure_capacity(blocks, need).is_ok() {
                    pass.out.chunks.push(Chunk {
                        seq: id,
                        num_tokens: 1,
                    });
                    *pass.budget -= 1;
                    if shed {
                        *pass.sheddable_left -= 1;
                    }
                    i += 1;
                    break;
                }
                let (victim, _) = self.running.last().expect("at least this sequence runs");
                candidates.retain(|c| c.seq != victim);
                self.preempt(victim, seqs, pool, pass.out);
                if victim == id {
                    break;
                }
            }
        }
    }

    fn preempt(
        &mut self,
        id: SeqId,
        seqs: &mut HashMap<SeqId, Sequence>,
        pool: &mut BlockPool,
        out: &mut Schedule,
    ) {
        let priority = self.running.remove(id).expect("a running sequence");
        let seq = seqs.get_mut(&id).expect("preempted sequence");
        if let Some(blocks) = seq.blocks.take() {
            pool.release(blocks);
        }
        seq.computed = 0;
        self.waiting
            .push(id, priority, self.tenant_of[&id].tenant.clone());
        out.preempted.push(id);
    }

    /// Preempts the last running sequence for a head of `priority` that lacks blocks (`short`),
    /// when it is sheddable and below `priority` and when the sheddable sequences below `priority`
    /// together hold enough blocks to cover the shortfall. Its chunk of this step, if any, is
    /// dropped and its tokens returned to the budget. Returns whether it preempted.
    fn shed_for(
        &mut self,
        priority: Priority,
        short: NoFreeBlocks,
        seqs: &mut HashMap<SeqId, Sequence>,
        pool: &mut BlockPool,
        step: &mut StepState<'_>,
    ) -> bool {
        let sheds = |p: Priority| is_sheddable(p) && p < priority;
        let Some((victim, victim_priority)) = self.running.last() else {
            return false;
        };
        if !sheds(victim_priority) {
            return false;
        }
        // Blocks the sheddable tail holds (an upper bound of what preempting it frees: shared
        // prefix blocks stay held by their other sequences).
        let sheddable_blocks: usize = (0..self.running.len())
            .rev()
            .map_while(|i| {
                let (id, p) = self.running.at(i)?;
                sheds(p).then(|| seqs[&id].blocks.as_ref().map_or(0, |b| b.table().len()))
            })
            .sum();
        if short.available + sheddable_blocks < short.needed {
            return false;
        }
        if let Some(at) = step.out.chunks.iter().position(|c| c.seq == victim) {
            *step.budget += step.out.chunks.remove(at).num_tokens;
        }
        step.candidates.retain(|c| c.seq != victim);
        self.preempt(victim, seqs, pool, step.out);
        true
    }
}

/// The rank of a tenant in `ranks` (one the map lacks goes last).
fn rank_in(ranks: &HashMap<Arc<str>, usize>) -> impl Fn(&str) -> usize + '_ {
    |tenant| ranks.get(tenant).copied().unwrap_or(usize::MAX)
}

/// Which running sequences a decode pass serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decodes {
    /// Every class.
    All,
    /// All but the sheddable ones (they yield the step to a higher-priority prefill).
    NotSheddable,
    /// Only the sheddable ones (the second pass, when that prefill did not make it in).
    Sheddable,
}

impl Decodes {
    /// Whether the pass serves a sequence that is `sheddable` or not.
    fn includes(self, sheddable: bool) -> bool {
        match self {
            Decodes::All => true,
            Decodes::NotSheddable => !sheddable,
            Decodes::Sheddable => sheddable,
        }
    }
}

/// The parts of the step being built that a decode pass changes.
struct DecodePass<'a> {
    out: &'a mut Schedule,
    budget: &'a mut usize,
    /// Tokens sheddable sequences may still take in this step.
    sheddable_left: &'a mut usize,
}

/// The parts of the step being built that shedding changes.
struct StepState<'a> {
    out: &'a mut Schedule,
    candidates: &'a mut Vec<Candidate<SeqId>>,
    budget: &'a mut usize,
}

#[cfg(test)]
pub(crate) mod tests;
