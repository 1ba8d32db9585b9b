//! The scheduler's step-by-step simulation ([`Sim`]) and its policy tests.

use super::*;
use crate::sampler::{Sampler, SamplingConfig};

fn chunk(seq: SeqId, num_tokens: usize) -> Chunk {
    Chunk { seq, num_tokens }
}

/// A scheduler, its sequences and a block pool, stepped as the engine would (every chunk
/// computed; a sequence whose known tokens are all computed samples one more token and
/// finishes after `max_new` of them).
pub(crate) struct Sim {
    pub(crate) scheduler: Scheduler,
    pub(crate) seqs: HashMap<SeqId, Sequence>,
    pub(crate) pool: BlockPool,
    next: SeqId,
    /// Step at which each sequence produced its first token.
    pub(crate) first_token: HashMap<SeqId, usize>,
    max_new: HashMap<SeqId, usize>,
    step: usize,
}

impl Sim {
    fn new(max_batch_tokens: usize, threshold: usize) -> Self {
        Self::with_blocks(max_batch_tokens, threshold, 4096)
    }

    /// A simulation over a pool of `num_blocks` blocks of 16 tokens.
    pub(crate) fn with_blocks(
        max_batch_tokens: usize,
        threshold: usize,
        num_blocks: usize,
    ) -> Self {
        Self {
            scheduler: Scheduler::new(SchedulerConfig {
                max_batch_tokens,
                max_num_seqs: 64,
                watermark_blocks: 0,
                long_prefill_token_threshold: threshold,
                max_sheddable_batch_tokens: 0,
            }),
            seqs: HashMap::new(),
            pool: BlockPool::new(num_blocks, 16, false),
            next: 1,
            first_token: HashMap::new(),
            max_new: HashMap::new(),
            step: 0,
        }
    }

    /// Caps the tokens sheddable sequences take per step (`max_sheddable_batch_tokens`).
    pub(crate) fn cap_sheddable(mut self, tokens: usize) -> Self {
        self.scheduler.config.max_sheddable_batch_tokens = tokens;
        self
    }

    fn add(&mut self, prompt_len: usize, max_new: usize) -> SeqId {
        self.add_with_priority(prompt_len, max_new, 0)
    }

    /// Queues a sequence of `priority` with a prompt of `prompt_len` tokens.
    pub(crate) fn add_with_priority(
        &mut self,
        prompt_len: usize,
        max_new: usize,
        priority: Priority,
    ) -> SeqId {
        self.add_for(crate::DEFAULT_TENANT, 1, prompt_len, max_new, priority)
    }

    /// Queues a sequence of `tenant` (fair-share `weight`) and `priority` with a prompt of
    /// `prompt_len` tokens.
    pub(crate) fn add_for(
        &mut self,
        tenant: &str,
        weight: u32,
        prompt_len: usize,
        max_new: usize,
        priority: Priority,
    ) -> SeqId {
        let id = self.next;
        self.next += 1;
        let prompt = (0..prompt_len).map(|i| (i % 50) as u32).collect();
        let sampler = Sampler::new(SamplingConfig::default(), 0);
        let seq = Sequence::new(0, id.to_string(), prompt, sampler, max_new, [], 1 << 20);
        self.seqs.insert(id, seq);
        self.max_new.insert(id, max_new);
        self.scheduler.enqueue(id, priority, tenant.into(), weight);
        id
    }

    pub(crate) fn step(&mut self) -> Schedule {
        self.step += 1;
        let schedule = self.scheduler.schedule(&mut self.seqs, &mut self.pool);
        let total: usize = schedule.chunks.iter().map(|c| c.num_tokens).sum();
        assert!(total <= self.scheduler.config.max_batch_tokens);
        for chunk in &schedule.chunks {
            assert!(chunk.num_tokens > 0);
            let seq = self.seqs.get_mut(&chunk.seq).unwrap();
            seq.computed += chunk.num_tokens;
            assert!(seq.computed <= seq.tokens.len());
            if seq.computed == seq.tokens.len() {
                self.first_token.entry(chunk.seq).or_insert(self.step);
                seq.tokens.push(7);
                if seq.generated().len() >= self.max_new[&chunk.seq] {
                    let seq = self.seqs.remove(&chunk.seq).unwrap();
                    self.scheduler.remove(chunk.seq);
                    if let Some(blocks) = seq.blocks {
                        self.pool.release(blocks);
                    }
                }
            }
        }
        schedule
    }
}

#[test]
fn a_short_request_starts_in_the_next_step_while_a_long_prompt_prefills() {
    let mut sim = Sim::new(512, 256);
    let long = sim.add(6000, 4);
    for _ in 0..3 {
        sim.step();
    }
    // Alone, the long prompt took the whole budget each step.
    assert_eq!(sim.seqs[&long].computed, 3 * 512);
    let short = sim.add(16, 4);
    let s = sim.step();
    // The long chunk is capped (contended) and the short prompt is admitted and runs whole.
    assert_eq!(s.chunks, [chunk(long, 256), chunk(short, 16)]);
    assert_eq!(sim.first_token[&short], 4);
    // Then the short one decodes beside the capped long chunk.
    let s = sim.step();
    assert_eq!(s.chunks[..2], [chunk(short, 1), chunk(long, 256)]);
}

#[test]
fn a_long_prompt_is_not_starved_by_a_stream_of_short_arrivals() {
    let mut sim = Sim::new(512, 256);
    let long = sim.add(4000, 1);
    let mut steps = 0;
    while !sim.first_token.contains_key(&long) {
        // Eight new 60-token requests every step: more prefill work than the budget.
        for _ in 0..8 {
            sim.add(60, 1);
        }
        sim.step();
        steps += 1;
        assert!(steps <= 4000 / 128 + 1, "the long prompt starved");
    }
}

#[test]
fn admission_stays_first_come_first_served() {
    // Without the cap the first long prompt takes the whole budget.
    let mut sim = Sim::new(512, 0);
    let a = sim.add(3000, 4);
    let b = sim.add(3000, 4);
    let c = sim.add(10, 4);
    let s = sim.step();
    // b gets nothing this step, so neither it nor c behind it is admitted (no overtaking).
    assert_eq!(s.chunks, [chunk(a, 512)]);
    assert!(sim.seqs[&b].blocks.is_none() && sim.seqs[&c].blocks.is_none());
    assert_eq!(sim.scheduler.num_waiting(), 2);
    // With the cap, both long prompts share the budget, and the short one still runs whole.
    let mut sim = Sim::new(512, 256);
    let a = sim.add(3000, 4);
    let b = sim.add(3000, 4);
    let c = sim.add(10, 4);
    let s = sim.step();
    assert_eq!(s.chunks, [chunk(a, 256), chunk(b, 246), chunk(c, 10)]);
}

#[test]
fn decodes_keep_priority_and_cap_the_long_chunk() {
    let mut sim = Sim::new(512, 256);
    let short = sim.add(8, 100);
    sim.step(); // prefill and first token of the short request
    let long = sim.add(6000, 1);
    for _ in 0..5 {
        let s = sim.step();
        assert_eq!(s.chunks[..2], [chunk(short, 1), chunk(long, 256)]);
    }
    // Once the decode finishes, the long prompt is alone again and takes the whole budget.
    let mut sim = Sim::new(512, 256);
    let long = sim.add(6000, 1);
    let s = sim.step();
    assert_eq!(s.chunks, [chunk(long, 512)]);
}

/// The tenants with a sequence in the engine (waiting or running), sorted.
fn active_tenants(sim: &Sim) -> Vec<String> {
    let mut active: Vec<String> = sim
        .scheduler
        .tenants
        .ranks()
        .keys()
        .map(|t| t.to_string())
        .collect();
    active.sort();
    active
}

#[test]
fn a_held_sequence_leaves_its_tenants_share_until_it_resumes() {
    let mut sim = Sim::new(512, 0);
    let a1 = sim.add_for("a", 1, 32, 1000, 0);
    let a2 = sim.add_for("a", 1, 32, 1000, 0);
    sim.add_for("b", 1, 32, 1000, 0);
    sim.step();
    assert_eq!(active_tenants(&sim), ["a", "b"]);
    // Both of a's sequences held: a is idle while b is served alone...
    for id in [a1, a2] {
        assert!(sim.scheduler.hold(id, &mut sim.seqs, &mut sim.pool));
    }
    assert_eq!(active_tenants(&sim), ["b"]);
    // (a was charged 64 prompt tokens, b 32 and then one a step: b passes a.)
    for _ in 0..40 {
        sim.step();
    }
    // ...and banked no credit: it comes back at b's counter, not below it.
    assert!(sim.scheduler.resume(a1));
    assert_eq!(active_tenants(&sim), ["a", "b"]);
    let (a, b) = (
        sim.scheduler.tenants.counter("a"),
        sim.scheduler.tenants.counter("b"),
    );
    assert_eq!(a, b, "a resumed at {a}, b is at {b}");
    // A sequence removed while held leaves its tenant once: a stays active with a1.
    sim.seqs.remove(&a2);
    sim.scheduler.remove(a2);
    assert_eq!(active_tenants(&sim), ["a", "b"]);
    sim.seqs.remove(&a1);
    sim.scheduler.remove(a1);
    assert_eq!(active_tenants(&sim), ["b"]);
}

#[test]
fn a_held_sequence_that_grew_near_the_whole_cache_comes_back() {
    // 8 blocks of 16 tokens, 2 of them kept from new prompts as the watermark.
    let mut sim = Sim::with_blocks(512, 0, 8);
    sim.scheduler.config.watermark_blocks = 2;
    let id = sim.add_for("t", 1, 80, 1000, 0);
    while sim.seqs[&id].tokens.len() < 7 * 16 {
        sim.step();
    }
    assert_eq!(sim.pool.stats().used, 7);
    assert!(sim.scheduler.hold(id, &mut sim.seqs, &mut sim.pool));
    assert!(sim.scheduler.resume(id));
    // 7 blocks plus the watermark would not fit; a sequence that already generated needs none.
    let s = sim.step();
    assert!(
        s.chunks.iter().any(|c| c.seq == id),
        "the resumed sequence was not admitted: {s:?}"
    );
}
