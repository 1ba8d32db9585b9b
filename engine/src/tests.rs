//! Engine loop tests with a fake model whose next token depends on the whole sequence as read back
//! through its block table, so wrong block tables, bad prefix sharing or a broken recompute after
//! preemption all change the output.

use std::time::Duration;

// The structured-output crate compiles the wire's `Constraint`: only the constraint test builds one.
use structured_output::{ConstraintCompiler, ConstraintSpec, ConstraintState};
use tokio::sync::mpsc;

use super::*;
use crate::backend::{BatchEntry, BatchModel, Logits, ModelError, StepError};
use crate::sampler::SamplingConfig;

const VOCAB: u32 = 50;
const CONTEXT: usize = 64;

/// Fake model: its KV "cache" stores each position's token in its slot; the next token after a
/// sequence is `(sum of all its tokens + position) % 50`. 2 ms per forward.
struct SumModel;

struct SlotKv {
    slots: Vec<Option<u32>>,
    block_size: usize,
}

impl BatchModel for SumModel {
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
        std::thread::sleep(Duration::from_millis(2));
        let bs = kv.block_size;
        let slot = |table: &[u32], pos: usize| table[pos / bs] as usize * bs + pos % bs;
        out.clear(VOCAB as usize);
        for (entry, e) in batch.iter().enumerate() {
            if e.tokens.is_empty() {
                return Err(ModelError::EmptyInput { entry }.into());
            }
            for (i, &t) in e.tokens.iter().enumerate() {
                kv.slots[slot(e.block_table, e.start_pos + i)] = Some(t);
            }
            let last = e.start_pos + e.tokens.len();
            for end in last + 1 - e.logit_tokens..=last {
                let sum: u32 = (0..end)
                    .map(|p| kv.slots[slot(e.block_table, p)].expect("position computed"))
                    .sum();
                let mut logits = vec![0.0; VOCAB as usize];
                logits[((sum + end as u32) % VOCAB) as usize] = 10.0;
                out.push_row(&logits);
            }
        }
        Ok(())
    }
    fn context_length(&self) -> usize {
        CONTEXT
    }
    fn vocab_size(&self) -> usize {
        VOCAB as usize
    }
}

/// What [`SumModel`] generates greedily after `prompt`.
fn expected(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    for _ in 0..n {
        let sum: u32 = tokens.iter().sum();
        tokens.push((sum + tokens.len() as u32) % VOCAB);
    }
    tokens[prompt.len()..].to_vec()
}

fn config(num_blocks: usize, max_batch_tokens: usize, prefix_caching: bool) -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_blocks,
        prefix_caching,
        scheduler: SchedulerConfig {
            max_batch_tokens,
            max_num_seqs: max_batch_tokens.min(16),
            watermark_blocks: 0,
            long_prefill_token_threshold: 0,
            max_sheddable_batch_tokens: 0,
        },
        speculation: Default::default(),
    }
}

fn add(id: &str, prompt: Vec<u32>, max_new: u32, stops: Vec<u32>) -> EngineRequest {
    EngineRequest {
        request_id: id.into(),
        prompt_ids: prompt,
        sampling: SamplingConfig::default(),
        seed: 1,
        max_new_tokens: max_new,
        stop_token_ids: stops,
        ..Default::default()
    }
}

/// A request's tokens and stop reason, or its error.
type Outcome = Result<(Vec<u32>, StopReason), EngineError>;

struct Client {
    engine: EngineHandle,
    conn: ConnId,
    tx: mpsc::UnboundedSender<EngineOutput>,
    rx: mpsc::UnboundedReceiver<EngineOutput>,
    /// Request ids in the order [`Client::collect`] saw them finish.
    finished: Vec<String>,
}

impl Client {
    fn new(config: EngineConfig) -> Self {
        let engine = spawn_engine(SumModel, config);
        let conn = engine.new_connection();
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            engine,
            conn,
            tx,
            rx,
            finished: Vec::new(),
        }
    }

    fn add(&self, request: EngineRequest) {
        self.add_constrained(request, None);
    }

    fn add_constrained(&self, request: EngineRequest, constraint: Option<Box<ConstraintState>>) {
        let out = Box::new(self.tx.clone());
        assert!(self.engine.send(Command::Add {
            conn: self.conn,
            request: Box::new(request),
            constraint,
            out
        }));
    }

    /// Collects outputs until every id in `ids` finished or failed.
    async fn collect(&mut self, ids: &[&str]) -> Vec<Outcome> {
        let mut results: Vec<Option<Outcome>> = vec![None; ids.len()];
        let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); ids.len()];
        while results.iter().any(Option::is_none) {
            let step = tokio::time::timeout(Duration::from_secs(10), self.rx.recv())
                .await
                .expect("engine output within 10 s")
                .expect("engine alive");
            for e in &step.errors {
                if let Some(i) = ids.iter().position(|id| *id == e.request_id) {
                    results[i] = Some(Err(e.error.clone()));
                }
            }
            for t in &step.tokens {
                if let Some(i) = ids.iter().position(|id| *id == t.request_id) {
                    tokens[i].push(t.token_id);
                    if let Some(reason) = t.stop {
                        self.finished.push(t.request_id.clone());
                        results[i] = Some(Ok((tokens[i].clone(), reason)));
                    }
                }
            }
        }
        results.into_iter().map(Option::unwrap).collect()
    }

    async fn stats(&self) -> EngineStats {
        self.engine.stats().await.expect("engine alive")
    }
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 3 + salt) % VOCAB).collect()
}

#[tokio::test]
async fn generates_until_each_stop_condition() {
    let mut c = Client::new(config(64, 64, true));
    let p = prompt(5, 1);
    c.add(add("len", p.clone(), 4, vec![]));
    assert_eq!(
        c.collect(&["len"]).await[0],
        Ok((expected(&p, 4), StopReason::Length))
    );
    let want = expected(&p, 10);
    c.add(add("eos", p.clone(), 10, vec![want[2]]));
    assert_eq!(
        c.collect(&["eos"]).await[0],
        Ok((want[..3].to_vec(), StopReason::StopToken))
    );
    // Prompt of 62 in a context of 64: tokens at positions 62 and 63, then the context is full.
    let long = prompt(62, 2);
    c.add(add("ctx", long.clone(), 10, vec![]));
    assert_eq!(
        c.collect(&["ctx"]).await[0],
        Ok((expected(&long, 2), StopReason::ContextFull))
    );
    let stats = c.stats().await;
    assert_eq!((stats.running_sequences, stats.finished_requests), (0, 3));
    assert_eq!(stats.kv_blocks_used, 0);
}

/// A refused request's answer carries the worker's load, so that a router that counted it as sent
/// (until the next report) stops counting it at once, even on an idle worker that sends no step.
#[tokio::test]
async fn a_refusal_carries_the_load() {
    let mut c = Client::new(config(8, 64, true));
    c.add(add("empty", vec![], 4, vec![]));
    let out = tokio::time::timeout(Duration::from_secs(10), c.rx.recv())
        .await
        .expect("engine output within 10 s")
        .expect("engine alive");
    assert_eq!(out.errors.len(), 1);
    let load = out.load.expect("the load with the refusal");
    assert_eq!((load.running_sequences, load.waiting_sequences), (0, 0));
}

#[tokio::test]
async fn rejects_bad_requests_and_keeps_serving() {
    let mut c = Client::new(config(8, 64, true));
    let invalid = EngineErrorKind::InvalidRequest;
    let cases = [
        (add("empty", vec![], 4, vec![]), "no tokens", invalid),
        (
            add("long", vec![1; CONTEXT], 4, vec![]),
            "context is 64",
            invalid,
        ),
        (
            add("oov", vec![99], 4, vec![]),
            "outside the vocabulary",
            invalid,
        ),
        (add("zero", vec![1], 0, vec![]), "max_new_tokens", invalid),
        (
            add("huge", vec![1; 30], 20, vec![]),
            "needs 13 KV blocks",
            EngineErrorKind::ExceedsKvCache,
        ),
    ];
    for (request, needle, kind) in cases {
        let id = request.request_id.clone();
        c.add(request);
        let err = c.collect(&[&id]).await.remove(0).unwrap_err();
        assert!(err.message.contains(needle), "{id}: {err}");
        assert_eq!(err.kind, kind, "{id}: {err}");
    }
    let mut bad_sampling = add("temp", vec![1], 2, vec![]);
    bad_sampling.sampling.temperature = -1.0;
    c.add(bad_sampling);
    let err = c.collect(&["temp"]).await.remove(0).unwrap_err();
    assert_eq!(
        (err.kind, err.message.as_str()),
        (
            invalid,
            "temperature must be a finite number >= 0 (0 = greedy), got -1"
        )
    );
    c.add(add("ok", vec![1], 2, vec![]));
    assert_eq!(
        c.collect(&["ok"]).await[0],
        Ok((expected(&[1], 2), StopReason::Length))
    );
    assert_eq!(c.stats().await.kv_blocks_used, 0);
}

#[tokio::test]
async fn cancel_and_closed_connections_free_every_block() {
    let mut c = Client::new(config(64, 64, true));
    c.add(add("a", prompt(3, 0), 50, vec![]));
    c.add(add("b", prompt(3, 1), 50, vec![]));
    c.rx.recv().await.unwrap();
    c.engine.send(Command::Cancel {
        conn: c.conn,
        request_id: "a".into(),
    });
    c.engine.send(Command::CloseConnection { conn: c.conn });
    let stats = c.stats().await;
    assert_eq!(stats.running_sequences + stats.waiting_sequences, 0);
    assert_eq!(stats.cancelled_requests, 2);
    assert_eq!(stats.kv_blocks_used, 0);
    assert_eq!(stats.kv_blocks_free, 64);

    // A connection whose receiver is dropped is cleaned up by the engine on its next send.
    let conn2 = c.engine.new_connection();
    let (tx2, rx2) = mpsc::unbounded_channel::<EngineOutput>();
    c.engine.send(Command::Add {
        conn: conn2,
        request: Box::new(add("c", vec![1], 50, vec![])),
        constraint: None,
        out: Box::new(tx2),
    });
    drop(rx2);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stats = c.stats().await;
    assert_eq!(stats.running_sequences, 0);
    assert_eq!(stats.kv_blocks_used, 0);
}

#[tokio::test]
async fn cancel_in_the_middle_of_a_chunked_prefill_frees_everything() {
    // Budget 4 tokens a step: a 40-token prompt takes 10 steps to prefill.
    let c = Client::new(config(64, 4, true));
    c.add(add("long", prompt(40, 3), 5, vec![]));
    tokio::time::sleep(Duration::from_millis(8)).await;
    let stats = c.stats().await;
    assert_eq!(stats.running_sequences, 1);
    assert!(stats.kv_blocks_used >= 10, "{stats:?}");
    c.engine.send(Command::Cancel {
        conn: c.conn,
        request_id: "long".into(),
    });
    let stats = c.stats().await;
    assert_eq!(
        stats.generated_tokens, 0,
        "cancelled before its prefill ended"
    );
    assert_eq!((stats.running_sequences, stats.kv_blocks_used), (0, 0));
}

#[tokio::test]
async fn batched_chunked_preempted_and_cached_runs_equal_solo_runs() {
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| prompt(5 + 3 * i, i as u32)).collect();
    let ids = ["p0", "p1", "p2", "p3", "p4", "p5"];
    let want: Vec<_> = prompts.iter().map(|p| expected(p, 20)).collect();
    // Plenty of blocks; tiny blocks budget (chunked prefill); a pool too small for all (preemption).
    for (blocks, budget, caching) in [
        (128, 64, false),
        (128, 6, true),
        (12, 64, true),
        (12, 7, false),
    ] {
        let mut c = Client::new(config(blocks, budget, caching));
        for (id, p) in ids.iter().zip(&prompts) {
            c.add(add(id, p.clone(), 20, vec![]));
        }
        let got = c.collect(&ids).await;
        for (i, g) in got.iter().enumerate() {
            assert_eq!(
                g,
                &Ok((want[i].clone(), StopReason::Length)),
                "{blocks} {budget} {i}"
            );
        }
        let stats = c.stats().await;
        if blocks == 12 {
            assert!(stats.preemptions > 0, "expected preemptions: {stats:?}");
        }
        assert_eq!(stats.kv_blocks_used, 0, "{stats:?}");
        assert_eq!(stats.kv_blocks_free, blocks as u64);
    }
}

#[tokio::test]
async fn prefix_cache_reuses_shared_blocks() {
    let shared = prompt(12, 7);
    let mut a = shared.clone();
    a.extend([1, 2, 3]);
    let mut b = shared.clone();
    b.extend([4, 5]);
    let mut c = Client::new(config(64, 64, true));
    c.add(add("a", a.clone(), 3, vec![]));
    assert_eq!(
        c.collect(&["a"]).await[0],
        Ok((expected(&a, 3), StopReason::Length))
    );
    c.add(add("b", b.clone(), 3, vec![]));
    assert_eq!(
        c.collect(&["b"]).await[0],
        Ok((expected(&b, 3), StopReason::Length))
    );
    let stats = c.stats().await;
    assert_eq!(stats.prefix_cache_hit_tokens, 12, "{stats:?}");
    assert_eq!(stats.prefix_cache_query_tokens, (a.len() + b.len()) as u64);
    assert!(stats.prefix_cache_hit_rate > 0.4);
    assert_eq!(stats.kv_blocks_used, 0);
}

#[tokio::test]
async fn the_published_snapshot_is_current_when_outputs_arrive_and_marks_a_dead_engine() {
    let mut c = Client::new(config(64, 64, true));
    let before = c.engine.snapshot();
    assert!(before.alive && !before.has_work && before.last_step_at.is_none());
    let p = prompt(5, 1);
    c.add(add("a", p.clone(), 6, vec![]));
    assert_eq!(
        c.collect(&["a"]).await[0],
        Ok((expected(&p, 6), StopReason::Length))
    );
    // Published before the last output went out: it already counts the finished request.
    let snapshot = c.engine.snapshot();
    assert!(snapshot.alive && !snapshot.has_work, "{snapshot:?}");
    assert!(snapshot.last_step_at.is_some());
    assert_eq!(snapshot.stats, c.stats().await);
    assert_eq!(snapshot.stats.finished_requests, 1);
    assert_eq!(snapshot.stats.kv_blocks_used, 0);
    // Every handle gone: the command channel closes, the engine thread returns, and the snapshot
    // says so.
    let state = c.engine.state.clone();
    drop(c);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while state.borrow().alive {
        assert!(
            std::time::Instant::now() < deadline,
            "the engine thread did not end"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// [`SumModel`]'s vocabulary as text: id 0 is the control token `<eos>`, ids 1.. are the letters
/// `a`, `b`, ... (so id `i` is the byte `b'a' + i - 1`).
pub(crate) fn letters_compiler() -> ConstraintCompiler {
    structured_output::testing::single_char_compiler(
        (1..VOCAB).map(|i| char::from(b'a' + (i - 1) as u8)),
    )
}

fn letters(ids: &[u32]) -> String {
    ids.iter()
        .map(|&i| char::from(b'a' + (i - 1) as u8))
        .collect()
}

#[tokio::test]
async fn constrained_sequences_follow_their_constraint_alone_batched_and_preempted() {
    let compiler = letters_compiler();
    let regex = |r: &str| {
        Some(Box::new(
            compiler.compile(ConstraintSpec::Regex(r)).unwrap(),
        ))
    };
    let prompts: Vec<Vec<u32>> = (0..5).map(|i| prompt(5 + 3 * i, 1 + i as u32)).collect();
    let ids = ["c0", "u1", "u2", "u3", "u4"];
    let mut solo = Client::new(config(128, 64, false));
    solo.add_constrained(
        add("c0", prompts[0].clone(), 20, vec![0]),
        regex("[a-e]{6}(xy|z)"),
    );
    let alone = solo.collect(&["c0"]).await.remove(0);
    let (tokens, reason) = alone.clone().expect("constrained run");
    assert_eq!(reason, StopReason::ConstraintComplete, "{tokens:?}");
    let text = letters(&tokens);
    assert!(
        text.len() >= 7 && text[..6].bytes().all(|b| (b'a'..=b'e').contains(&b)),
        "{text}"
    );
    assert!(text.ends_with("xy") || text.ends_with('z'), "{text}");
    // Beside unconstrained sequences, with chunked prefills and with preemptions: the same tokens,
    // and the unconstrained ones exactly their own.
    for (blocks, budget) in [(128, 64), (128, 6), (12, 7)] {
        let mut c = Client::new(config(blocks, budget, false));
        for (id, p) in ids.iter().zip(&prompts).skip(1) {
            c.add(add(id, p.clone(), 20, vec![]));
        }
        // Admitted last: the first a full pool preempts.
        c.add_constrained(
            add("c0", prompts[0].clone(), 20, vec![0]),
            regex("[a-e]{6}(xy|z)"),
        );
        let got = c.collect(&ids).await;
        assert_eq!(got[0], alone, "{blocks} {budget}");
        for i in 1..ids.len() {
            assert_eq!(
                got[i],
                Ok((expected(&prompts[i], 20), StopReason::Length)),
                "{blocks} {budget} {i}"
            );
        }
        if blocks == 12 {
            assert!(c.stats().await.preemptions > 0);
        }
    }
    // Resumed elsewhere (a failover) after 3 tokens, with the state replayed from them: the same
    // continuation.
    let mut resumed = Client::new(config(128, 64, false));
    let mut request = add("c0", prompts[0].clone(), 20, vec![0]);
    request.generated_ids = tokens[..3].to_vec();
    let mut state = regex("[a-e]{6}(xy|z)").unwrap();
    state.replay(&tokens[..3]).unwrap();
    resumed.add_constrained(request, Some(state));
    let rest = resumed.collect(&["c0"]).await.remove(0).unwrap();
    assert_eq!(rest, (tokens[3..].to_vec(), StopReason::ConstraintComplete));
    // A constraint that cannot be complete within max_new_tokens ends with `length`.
    let mut c = Client::new(config(128, 64, false));
    c.add_constrained(add("long", prompts[1].clone(), 4, vec![0]), regex("a{10}"));
    let got = c.collect(&["long"]).await.remove(0).unwrap();
    assert_eq!(got, (vec![1; 4], StopReason::Length));
}

/// A model whose every step fails (`panics`: by panicking, else with a device error).
struct BrokenModel {
    panics: bool,
}

impl BatchModel for BrokenModel {
    type Kv = ();
    fn kv_bytes_per_token(&self) -> usize {
        4
    }
    fn new_kv(&self, _num_blocks: usize, _block_size: usize) {}
    fn forward_batch(
        &self,
        _batch: &[BatchEntry<'_>],
        _kv: &mut (),
        _logits: &mut Logits,
    ) -> Result<(), StepError> {
        assert!(!self.panics, "the device caught fire");
        Err(StepError::Device(Box::new(std::io::Error::other(
            "device lost",
        ))))
    }
    fn context_length(&self) -> usize {
        CONTEXT
    }
    fn vocab_size(&self) -> usize {
        VOCAB as usize
    }
}

#[tokio::test]
async fn a_failing_model_fails_the_step_s_requests_as_internal_and_keeps_serving() {
    for (panics, message) in [
        (false, "model forward failed: device lost"),
        (true, "model forward panicked"),
    ] {
        let engine = spawn_engine(BrokenModel { panics }, config(64, 64, true));
        let (tx, rx) = mpsc::unbounded_channel::<EngineOutput>();
        let mut c = Client {
            conn: engine.new_connection(),
            engine,
            tx,
            rx,
            finished: Vec::new(),
        };
        c.add(add("a", vec![1, 2], 4, vec![]));
        c.add(add("b", vec![3], 4, vec![]));
        let want = Err(EngineError::new(EngineErrorKind::ModelFailed, message));
        assert_eq!(c.collect(&["a", "b"]).await, [want.clone(), want]);
        let stats = c.stats().await;
        assert_eq!((stats.failed_requests, stats.kv_blocks_used), (2, 0));
        assert!(c.engine.snapshot().alive);
    }
}

/// A connection's first output is the prefix cache's snapshot; its later outputs' cache changes,
/// replayed on that snapshot, equal the cache at every point, also under evictions (a small pool)
/// and for a second connection that joined later with no requests of its own.
#[tokio::test]
async fn cache_events_replayed_on_the_snapshot_equal_the_cache() {
    use std::collections::BTreeSet;
    fn replay(set: &mut BTreeSet<u64>, out: &EngineOutput) -> usize {
        let Some(cache) = &out.cache else {
            return 0;
        };
        {
            if cache.snapshot {
                set.clear();
            }
            for h in &cache.events.evicted {
                assert!(set.remove(h), "evict of a block never stored");
            }
            for &h in &cache.events.stored {
                assert!(set.insert(h), "duplicate store");
            }
        }
        cache.events.evicted.len()
    }
    let mut c = Client::new(config(12, 64, true));
    assert!(c.engine.send(Command::Connect {
        conn: c.conn,
        out: Box::new(c.tx.clone()),
    }));
    let first = c.rx.recv().await.unwrap();
    assert!(first
        .cache
        .as_ref()
        .is_some_and(|r| r.snapshot && r.events.stored.is_empty()));
    let mut seen = BTreeSet::new();
    let mut evicted = 0;
    let (tx2, mut rx2) = mpsc::unbounded_channel();
    let mut seen2 = BTreeSet::new();
    for round in 0..8u32 {
        if round == 3 {
            let conn2 = c.engine.new_connection();
            assert!(c.engine.send(Command::Connect {
                conn: conn2,
                out: Box::new(tx2.clone())
            }));
        }
        let ids: Vec<String> = (0..3).map(|i| format!("r{round}-{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            c.add(add(id, prompt(9 + i, round * 7 + i as u32), 4, vec![]));
        }
        // Collect while replaying every output of the first connection.
        let mut done = 0;
        while done < ids.len() {
            let out = c.rx.recv().await.unwrap();
            evicted += replay(&mut seen, &out);
            done += out.tokens.iter().filter(|t| t.stop.is_some()).count() + out.errors.len();
        }
        let (cached, block_size) = c.engine.cached_blocks().await.unwrap();
        assert_eq!(block_size, 4);
        // Outputs sent before the answer are all queued: drain them.
        while let Ok(out) = c.rx.try_recv() {
            evicted += replay(&mut seen, &out);
        }
        assert_eq!(
            seen.iter().copied().collect::<Vec<_>>(),
            cached,
            "round {round}"
        );
        if round >= 3 {
            while let Ok(out) = rx2.try_recv() {
                assert!(out.tokens.is_empty());
                replay(&mut seen2, &out);
            }
            assert_eq!(seen2, seen, "round {round}: the idle connection agrees");
        }
    }
    // 24 requests of 13 to 15 tokens through 12 blocks of 4: the cache evicted.
    assert!(evicted > 0);
}

mod hold;
mod load_report;
mod priority_and_salt;
mod prompt_logprobs;
mod scheduler_priority;
mod scheduler_tenants;
