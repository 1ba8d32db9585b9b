//! Speculation must not change a single output: every request's tokens, logprobs, alternatives,
//! indices and stop reasons with the n-gram proposer equal those with speculation off, alone and
//! batched, greedy and sampled (penalties, logit_bias), with stop tokens and max_new_tokens landing
//! inside accepted runs, constraints, several samples of one prompt, and forced preemption; the
//! block pool and prefix cache end as a plain run leaves them.
//!
//! The fake model repeats the token four positions back (so the n-gram proposer finds long runs
//! to accept) except where the sum of the sequence says otherwise (so proposals are also
//! rejected); it reads every earlier token back through the block table, so a wrong block table,
//! a stale rejected position or a bad rollback changes the output.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use structured_output::{ConstraintCompiler, ConstraintSpec, ConstraintState};
use tokio::sync::mpsc;

use super::{Proposer, SpeculationConfig, SpeculationConfigError};
use crate::backend::{BatchEntry, BatchModel, Logits, StepError};
use crate::kv::BlockPool;
use crate::sampler::SamplingConfig;
use crate::tests::letters_compiler;
use crate::{
    spawn_engine, spawn_engine_with_draft, Command, EngineConfig, EngineHandle, EngineOutput,
    EngineRequest, EngineStats, SchedulerConfig, StopReason,
};

pub(super) const VOCAB: usize = 50;
pub(super) const CONTEXT: usize = 96;

/// The fake model, over `vocab` ids.
pub(super) struct LoopModel {
    pub(super) vocab: usize,
    /// Where the sum rule applies instead of repeating: `sum % 7 == rule` (3 for the target; a
    /// draft model with another rule disagrees now and then).
    pub(super) rule: u32,
    /// What it did, for the tests to read.
    pub(super) counters: Arc<LoopCounters>,
    /// Keep every context it computed logits for in [`LoopCounters::reads`].
    pub(super) record_reads: bool,
    /// What a pass costs, in microseconds slept.
    pub(super) pass_micros: u64,
    /// What each token of a pass adds, in microseconds slept.
    pub(super) token_micros: u64,
}

/// Counts of a [`LoopModel`]'s work.
#[derive(Debug, Default)]
pub(super) struct LoopCounters {
    /// Tokens run (all passes).
    pub(super) tokens: AtomicUsize,
    /// Passes in which two tokens wrote one KV slot (a real backend refuses those).
    pub(super) slot_conflicts: AtomicUsize,
    /// The most tokens one pass ran.
    pub(super) most_pass_tokens: AtomicUsize,
    /// With `record_reads`: the tokens read back through the block table for every logits row.
    pub(super) reads: std::sync::Mutex<Vec<Vec<u32>>>,
}

impl LoopModel {
    /// The target model of these tests.
    pub(super) fn target(vocab: usize) -> LoopModel {
        LoopModel {
            vocab,
            rule: TARGET_RULE,
            counters: Arc::default(),
            record_reads: false,
            pass_micros: 300,
            token_micros: 0,
        }
    }
}

/// The target's [`LoopModel::rule`].
pub(super) const TARGET_RULE: u32 = 3;

pub(super) struct SlotKv {
    slots: Vec<Option<u32>>,
    block_size: usize,
}

/// The logits after `tokens` over `vocab` ids: a spread over the vocabulary plus a peak on the
/// token four back (or a sum-chosen one every few positions, where `sum % 7 == rule`).
fn loop_logits(tokens: &[u32], vocab: usize, rule: u32) -> Vec<f32> {
    let end = tokens.len();
    let sum: u32 = tokens.iter().sum();
    let peak = if end >= 4 && sum % 7 != rule {
        tokens[end - 4]
    } else {
        (sum + end as u32) % vocab as u32
    };
    let mut logits: Vec<f32> = (0..vocab as u32)
        .map(|i| ((i * 7 + sum) % 13) as f32 * 0.15)
        .collect();
    logits[peak as usize] += 4.0;
    logits
}

impl BatchModel for LoopModel {
    type Kv = SlotKv;
    fn kv_bytes_per_token(&self) -> usize {
        4
    }
    fn new_kv(&self, num_blocks: usize, block_size: usize) -> SlotKv {
        SlotKv {
            slots: vec![None; num_blocks * block_size],
            block_size,
        }
    }
    fn forward_batch(
        &self,
        batch: &[BatchEntry<'_>],
        kv: &mut SlotKv,
        out: &mut Logits,
    ) -> Result<(), StepError> {
        let tokens: usize = batch.iter().map(|e| e.tokens.len()).sum();
        let micros = self.pass_micros + self.token_micros * tokens as u64;
        std::thread::sleep(Duration::from_micros(micros));
        let bs = kv.block_size;
        let slot = |table: &[u32], pos: usize| table[pos / bs] as usize * bs + pos % bs;
        out.clear(self.vocab);
        let written: Vec<usize> = batch
            .iter()
            .flat_map(|e| (0..e.tokens.len()).map(|i| slot(e.block_table, e.start_pos + i)))
            .collect();
        let distinct: HashSet<usize> = written.iter().copied().collect();
        if distinct.len() < written.len() {
            self.counters.slot_conflicts.fetch_add(1, Ordering::Relaxed);
        }
        self.counters
            .tokens
            .fetch_add(written.len(), Ordering::Relaxed);
        self.counters
            .most_pass_tokens
            .fetch_max(written.len(), Ordering::Relaxed);
        for e in batch {
            for (i, &t) in e.tokens.iter().enumerate() {
                kv.slots[slot(e.block_table, e.start_pos + i)] = Some(t);
            }
            let last = e.start_pos + e.tokens.len();
            for end in last + 1 - e.logit_tokens..=last {
                let seen: Vec<u32> = (0..end)
                    .map(|p| kv.slots[slot(e.block_table, p)].expect("position computed"))
                    .collect();
                out.push_row(&loop_logits(&seen, self.vocab, self.rule));
                if self.record_reads {
                    self.counters.reads.lock().unwrap().push(seen);
                }
            }
        }
        Ok(())
    }
    fn context_length(&self) -> usize {
        CONTEXT
    }
    fn vocab_size(&self) -> usize {
        self.vocab
    }
}

pub(super) fn config(num_blocks: usize, proposer: Proposer, prefix_caching: bool) -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_blocks,
        prefix_caching,
        scheduler: SchedulerConfig {
            max_batch_tokens: 64,
            max_num_seqs: 32,
            watermark_blocks: 0,
            long_prefill_token_threshold: 0,
            max_sheddable_batch_tokens: 0,
        },
        speculation: SpeculationConfig {
            proposer,
            ..Default::default()
        },
    }
}

/// Everything a client sees of one token (the draft counters aside, which differ by design): id,
/// logprob bits, alternatives, stop reason, index.
pub(super) type Seen = (u32, u32, Vec<(u32, u32)>, Option<StopReason>, u32);

/// A test request: id, prompt, its settings and its constraint.
#[derive(Clone)]
pub(super) struct Case {
    pub(super) request: EngineRequest,
    pub(super) constraint: Option<ConstraintSpec<'static>>,
}

/// The vocabulary of a run: the model's width and the constraints' compiler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Vocab {
    /// 50 ids: `<eos>`, then `a`, `b`, ... ([`letters_compiler`]).
    Letters,
    /// 95 ids: `<eos>`, then every printable ASCII character but the space, id `c - 0x20`
    /// ([`chars_compiler`]): JSON fits.
    Chars,
}

impl Vocab {
    fn size(self) -> usize {
        match self {
            Vocab::Letters => VOCAB,
            Vocab::Chars => 95,
        }
    }

    fn compiler(self) -> ConstraintCompiler {
        match self {
            Vocab::Letters => letters_compiler(),
            Vocab::Chars => chars_compiler(),
        }
    }
}

/// [`Vocab::Chars`]'s compiler.
pub(super) fn chars_compiler() -> ConstraintCompiler {
    structured_output::testing::single_char_compiler((0x21u8..=0x7e).map(char::from))
}

pub(super) fn case(id: &str, prompt: Vec<u32>, max_new: u32) -> Case {
    Case {
        request: EngineRequest {
            request_id: id.into(),
            prompt_ids: prompt,
            max_new_tokens: max_new,
            seed: 7,
            ..Default::default()
        },
        constraint: None,
    }
}

/// A prompt that repeats a 4-token pattern (so n-gram lookup has something to find).
pub(super) fn looping_prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 1 + (i % 4 * 11 + salt) % 49)
        .collect()
}

/// Greedy, sampled with penalties and logit_bias, top logprobs, stop tokens inside the loop,
/// max_new_tokens, three samples of one prompt, a constraint: 12 requests.
pub(super) fn cases() -> Vec<Case> {
    let mut all = Vec::new();
    for i in 0..3u32 {
        all.push(case(
            &format!("greedy{i}"),
            looping_prompt(9 + i as usize, i),
            40,
        ));
    }
    let mut stop = case("stop", looping_prompt(10, 5), 60);
    // A token of the loop: it ends the sequence inside an accepted run.
    stop.request.stop_token_ids = vec![looping_prompt(10, 5)[6]];
    all.push(stop);
    all.push(case("length", looping_prompt(8, 9), 13));
    for n in 0..3u64 {
        let mut s = case(&format!("sample{n}"), looping_prompt(12, 3), 45);
        s.request.seed = 100 + n;
        s.request.sampling = SamplingConfig {
            temperature: 0.7,
            top_k: 20,
            top_p: 0.95,
            repetition_penalty: 1.1,
            frequency_penalty: 0.2,
            presence_penalty: 0.1,
            logit_bias: vec![(3, 1.5), (17, -2.0)],
            top_logprobs: 3,
            ..Default::default()
        };
        all.push(s);
    }
    let mut logprobs = case("logprobs", looping_prompt(7, 11), 30);
    logprobs.request.sampling.top_logprobs = 5;
    all.push(logprobs);
    let mut constrained = case("constrained", looping_prompt(9, 2), 40);
    constrained.request.stop_token_ids = vec![0];
    constrained.constraint = Some(ConstraintSpec::Regex("(abcd){3}[a-e]{5}(xy|z)"));
    all.push(constrained);
    let mut opted_out = case("opt-out", looping_prompt(9, 0), 30);
    opted_out.request.speculation_opt_out = true;
    all.push(opted_out);
    let mut near_context = case("context", looping_prompt(CONTEXT - 12, 4), 40);
    near_context.request.max_new_tokens = 40;
    all.push(near_context);
    all
}

/// One run's outputs by request id, its end stats and its prefix cache.
pub(super) struct Run {
    pub(super) outputs: HashMap<String, Vec<Seen>>,
    pub(super) stats: EngineStats,
    cached: Vec<u64>,
}

fn constraint(
    compiler: &ConstraintCompiler,
    spec: Option<ConstraintSpec<'_>>,
) -> Option<Box<ConstraintState>> {
    Some(Box::new(
        compiler.compile(spec?).expect("constraint compiles"),
    ))
}

/// Runs `cases`, `at_once` at a time, on a fresh engine over `vocab`; returns every request's
/// tokens.
async fn run(vocab: Vocab, config: EngineConfig, cases: &[Case], at_once: usize) -> Run {
    run_with_draft(vocab, config, None, cases, at_once).await
}

/// [`run`] with `draft` as the draft model (for `speculation = draft`).
pub(super) async fn run_with_draft(
    vocab: Vocab,
    config: EngineConfig,
    draft: Option<LoopModel>,
    cases: &[Case],
    at_once: usize,
) -> Run {
    let groups: Vec<&[Case]> = cases.chunks(at_once).collect();
    run_groups(vocab, config, draft, &groups).await
}

/// Runs each group of cases at once, one group after the other, on one fresh engine.
pub(super) async fn run_groups(
    vocab: Vocab,
    config: EngineConfig,
    draft: Option<LoopModel>,
    groups: &[&[Case]],
) -> Run {
    let compiler = vocab.compiler();
    let engine: EngineHandle =
        spawn_engine_with_draft(LoopModel::target(vocab.size()), draft, config);
    let conn = engine.new_connection();
    let (tx, mut rx) = mpsc::unbounded_channel::<EngineOutput>();
    let mut outputs: HashMap<String, Vec<Seen>> = HashMap::new();
    for &group in groups {
        for c in group {
            assert!(engine.send(Command::Add {
                conn,
                request: Box::new(c.request.clone()),
                constraint: constraint(&compiler, c.constraint),
                out: Box::new(tx.clone()),
            }));
        }
        let mut open = group.len();
        while open > 0 {
            let step = tokio::time::timeout(Duration::from_secs(20), rx.recv())
                .await
                .expect("engine output within 20 s")
                .expect("engine alive");
            assert!(step.errors.is_empty(), "{:?}", step.errors);
            for t in step.tokens {
                if t.stop.is_some() {
                    open -= 1;
                }
                let alternatives = t
                    .top_logprobs
                    .iter()
                    .map(|&(id, lp)| (id, lp.to_bits()))
                    .collect();
                outputs.entry(t.request_id).or_default().push((
                    t.token_id,
                    t.logprob.to_bits(),
                    alternatives,
                    t.stop,
                    t.index,
                ));
            }
        }
    }
    let stats = engine.stats().await.expect("engine alive");
    let (cached, _) = engine.cached_blocks().await.expect("engine alive");
    Run {
        outputs,
        stats,
        cached,
    }
}

/// Runs `cases` with speculation off and with n-gram, asserts equal outputs and end states, and
/// returns the n-gram run's stats.
async fn assert_same(num_blocks: usize, cases: &[Case], at_once: usize) -> EngineStats {
    assert_same_on(Vocab::Letters, num_blocks, cases, at_once)
        .await
        .stats
}

/// [`assert_same`] over `vocab`; returns the n-gram run.
pub(super) async fn assert_same_on(
    vocab: Vocab,
    num_blocks: usize,
    cases: &[Case],
    at_once: usize,
) -> Run {
    assert_same_with(vocab, num_blocks, cases, at_once, Proposer::Ngram, None).await
}

/// Runs `cases` with speculation off and with `proposer` (and `draft` as the draft model), asserts
/// equal outputs and end states, and returns the speculating run.
pub(super) async fn assert_same_with(
    vocab: Vocab,
    num_blocks: usize,
    cases: &[Case],
    at_once: usize,
    proposer: Proposer,
    draft: Option<LoopModel>,
) -> Run {
    let off = run(
        vocab,
        config(num_blocks, Proposer::Off, true),
        cases,
        at_once,
    )
    .await;
    let ngram = run_with_draft(
        vocab,
        config(num_blocks, proposer, true),
        draft,
        cases,
        at_once,
    )
    .await;
    assert_eq!(off.outputs.len(), cases.len());
    for c in cases {
        let id = &c.request.request_id;
        assert_eq!(
            off.outputs[id], ngram.outputs[id],
            "{id}: {num_blocks} blocks, {at_once} at once"
        );
    }
    // Every block is free; without preemptions the prefix cache ends as the plain run leaves it
    // (with them, which blocks a preempted sequence left cached depends on the schedule, and
    // speculation finishes in fewer steps).
    for s in [&off.stats, &ngram.stats] {
        assert_eq!((s.kv_blocks_used, s.running_sequences), (0, 0));
        assert_eq!(s.kv_blocks_free, s.kv_blocks_total);
    }
    if off.stats.preemptions + ngram.stats.preemptions == 0 {
        assert_eq!(off.cached, ngram.cached, "cached blocks");
        assert_eq!(
            off.stats.prefix_cache_blocks,
            ngram.stats.prefix_cache_blocks
        );
    }
    assert_eq!(off.stats.generated_tokens, ngram.stats.generated_tokens);
    assert_eq!(off.stats.speculative_draft_tokens, 0);
    assert_eq!(off.stats.speculative_forced_tokens, 0);
    ngram
}

#[tokio::test]
async fn ngram_outputs_equal_plain_decoding_alone() {
    let stats = assert_same(256, &cases(), 1).await;
    // It speculated, accepted much and rejected some.
    assert!(stats.speculative_accepted_tokens > 100, "{stats:?}");
    assert!(
        stats.speculative_accepted_tokens < stats.speculative_draft_tokens,
        "{stats:?}"
    );
    // Fewer steps than tokens: accepted runs saved steps.
    assert!(stats.steps < stats.generated_tokens, "{stats:?}");
}

#[tokio::test]
async fn ngram_outputs_equal_plain_decoding_batched() {
    // 6 at a time speculate together; 32 at a time (all of them, twice over) do not speculate
    // while the batch is large, and do as it drains.
    let stats = assert_same(256, &cases(), 6).await;
    assert!(stats.speculative_accepted_tokens > 0, "{stats:?}");
    let mut many = cases();
    many.extend(cases().into_iter().map(|mut c| {
        c.request.request_id.push_str("-again");
        c
    }));
    many.extend(cases().into_iter().map(|mut c| {
        c.request.request_id.push_str("-more");
        c.request.seed += 1;
        c
    }));
    assert_same(512, &many[..32], 32).await;
}

#[tokio::test]
async fn ngram_outputs_equal_plain_decoding_under_preemption() {
    // 20 blocks of 4 tokens for 6 sequences of up to 70 tokens: decodes preempt each other.
    let stats = assert_same(20, &cases()[..10], 6).await;
    assert!(stats.preemptions > 0, "{stats:?}");
}

#[tokio::test]
async fn per_request_counters_reach_the_last_token() {
    let engine = spawn_engine(LoopModel::target(VOCAB), config(64, Proposer::Ngram, false));
    let conn = engine.new_connection();
    let (tx, mut rx) = mpsc::unbounded_channel::<EngineOutput>();
    let c = case("r", looping_prompt(9, 1), 30);
    assert!(engine.send(Command::Add {
        conn,
        request: Box::new(c.request),
        constraint: None,
        out: Box::new(tx),
    }));
    loop {
        let step = rx.recv().await.expect("engine alive");
        if let Some(last) = step.tokens.iter().find(|t| t.stop.is_some()) {
            let stats = engine.stats().await.unwrap();
            assert_eq!(last.draft_tokens as u64, stats.speculative_draft_tokens);
            assert_eq!(
                last.accepted_draft_tokens as u64,
                stats.speculative_accepted_tokens
            );
            assert!(
                last.accepted_draft_tokens > 0 && last.draft_tokens >= last.accepted_draft_tokens
            );
            break;
        }
    }
}

#[test]
fn grow_then_truncate_restores_the_pool() {
    // Random speculative growths and rollbacks on random tables leave the pool's counters, the
    // table and the prefix cache as they were before the growth.
    let mut rng = 0x2545_f491_u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for _ in 0..300 {
        let mut pool = BlockPool::new(16, 4, true);
        let len = 1 + next(30) as usize;
        let tokens: Vec<u32> = (0..len as u32).collect();
        let Ok((mut blocks, _)) = pool.allocate(&tokens, block_hash::SEED, usize::MAX, 0) else {
            continue;
        };
        pool.register_full_blocks(&mut blocks, &tokens, len);
        let before = (pool.stats(), blocks.table().to_vec(), pool.cached_hashes());
        let room = pool.grow_from_free(&mut blocks, len + 1 + next(12) as usize);
        assert!(room >= len);
        pool.truncate(&mut blocks, len);
        let after = (pool.stats(), blocks.table().to_vec(), pool.cached_hashes());
        assert_eq!(before, after);
        pool.release(blocks);
        assert_eq!(pool.stats().used, 0);
    }
}

#[test]
fn bad_settings_name_the_setting() {
    let bad = |f: fn(&mut SpeculationConfig)| {
        let mut c = SpeculationConfig::default();
        f(&mut c);
        c.validate().unwrap_err()
    };
    let zero = bad(|c| c.num_speculative_tokens = 0);
    assert_eq!(zero, SpeculationConfigError::NumSpeculativeTokens(0));
    assert!(zero
        .to_string()
        .starts_with("num_speculative_tokens must be in 1..=16"));
    assert!(bad(|c| c.num_speculative_tokens = 17)
        .to_string()
        .contains("got 17"));
    assert!(bad(|c| c.ngram_min = 0).to_string().contains("ngram_min"));
    assert!(bad(|c| {
        c.ngram_min = 4;
        c.ngram_max = 3
    })
    .to_string()
    .contains("ngram_min = 4, ngram_max = 3"));
    assert_eq!(SpeculationConfig::default().validate(), Ok(()));
}
