//! The worker's side of the router stream: arbitrary [`RouterMessage`] sequences through the
//! worker's own message handling ([`worker::service::router_stream`]: the drain check, constraint
//! compilation, the conversion to the engine's request, and the engine's validation, scheduling and
//! cancelling) against a real engine on the tiny random-weight model ([`engine_worker`]), one
//! router stream per input, as the gRPC handler opens it for a router.
//!
//! Properties, checked on the wire's step messages once every message is handled and the engine is
//! idle:
//! - no panic, and the engine thread is alive;
//! - every request is answered: each `add` gets exactly one answer for its id, a request error
//!   (with a message and a refusal's code) or a token marked `finished`, unless a `cancel` of its
//!   id followed it (a `hold` only delays the answer: every id is resumed at the end); nothing is
//!   answered that was not asked, nor answered twice;
//! - no KV block leaks: once every request has finished or been cancelled and the engine is idle,
//!   `kv_blocks_used` is 0 (and still 0 after the stream closes).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use engine::backend::BatchModel as _;
use engine::EngineHandle;
use inference_proto::public::{constraint::Kind, ChoiceList, Constraint};
use inference_proto::worker::{
    router_message, AddRequest, CancelRequest, HoldRequest, ResumeRequest, RouterMessage,
    SamplingParams, StepOutput,
};
use prost::Message as _;
use tokio::sync::mpsc::UnboundedReceiver;
use tonic::Code;
use worker::service::WorkerService;

use crate::input::Input;

/// Most operations one input runs (the rest of a longer input is ignored).
const MAX_OPS: usize = 48;

/// KV blocks of the engine: 32 blocks of 16 tokens, two whole 256-token contexts, so that a few
/// concurrent requests fill the pool (preemption, `RESOURCE_EXHAUSTED`).
const KV_BLOCKS: usize = 32;

/// How long an input's requests may take to be answered once every message is sent.
const IDLE_TIMEOUT: Duration = Duration::from_secs(8);

/// The request ids an input uses: few, so that adds, duplicates and cancels meet.
const IDS: [&str; 6] = ["r0", "r1", "r2", "r3", "r4", ""];

/// Float values for sampling fields: valid, edge and invalid (negative, NaN, infinite).
const FLOATS: [f32; 16] = [
    0.0,
    1.0,
    0.5,
    0.7,
    2.0,
    -1.0,
    1e-30,
    1e30,
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    -0.0,
    100.0,
    1.5,
    f32::MIN_POSITIVE,
    f32::MAX,
];

/// A worker as the binary builds it, on the tiny model: engine thread, service, and the runtime
/// the service's async code runs on (built once per process; every input opens its own stream).
pub struct EngineWorker {
    runtime: tokio::runtime::Runtime,
    service: WorkerService,
    engine: EngineHandle,
    vocab: u32,
    context: u32,
}

/// The shared worker (built on first use: writes the tiny model, loads it with the CPU backend,
/// starts the engine with [`KV_BLOCKS`] blocks and builds the service with the model's `Info`).
pub fn engine_worker() -> &'static EngineWorker {
    static WORKER: OnceLock<EngineWorker> = OnceLock::new();
    WORKER.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fuzz-router-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary folder for the tiny model");
        let path = dir.join("tiny.gguf");
        gguf::testing::write_tiny_llama(&path, 1).expect("the tiny model is written");
        let file = model_files::open(&path).expect("the tiny model opens");
        let model = backend_cpu::CpuModel::from_source(&file).expect("the tiny model loads");
        let (context, vocab) = (model.context_length(), model.vocab_size());
        let description = worker::model_info::model_info(&path, &file, context, vocab)
            .expect("the tiny model's Info");
        drop(file);
        // The model keeps its memory map; the file's name is not needed any more.
        let _ = std::fs::remove_dir_all(&dir);
        let settings = worker::config::WorkerSettings {
            kv_cache_blocks: KV_BLOCKS,
            ..Default::default()
        };
        let config = settings
            .engine_config(model.kv_bytes_per_token())
            .expect("the engine settings");
        let engine = engine::spawn_engine(model, config);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let service = WorkerService::new(engine.clone(), description);
        EngineWorker {
            runtime,
            service,
            engine,
            vocab: vocab as u32,
            context: context as u32,
        }
    })
}

/// `router-stream`. The input is a sequence of operations, each chosen by a byte (modulo 8):
/// 0-2 an `add` ([`add`]), 3 a `cancel` of one of [`IDS`], 4 a raw message (a length byte, then
/// that many bytes through the protobuf decoder; what does not decode is dropped, as tonic drops
/// it), 5 a message of no kind, 6 a pause until the engine has applied every command sent, 7 a
/// `hold` or a `resume` (the next byte's low bit) of one of [`IDS`]. After the last operation
/// every id is resumed (a client that reads again), so every held request has its answer.
pub fn router_stream(data: &[u8]) {
    let worker = engine_worker();
    worker.runtime.block_on(run(worker, data));
}

async fn run(worker: &EngineWorker, data: &[u8]) {
    let (stream, mut steps) = worker.service.open_stream(None).expect("the engine runs");
    let mut ledger = Ledger::default();
    let mut input = Input::new(data);
    for _ in 0..MAX_OPS {
        if input.is_empty() {
            break;
        }
        let message = match input.byte() % 8 {
            0..=2 => Some(add(&mut input, worker)),
            3 => Some(RouterMessage {
                kind: Some(router_message::Kind::Cancel(CancelRequest {
                    request_id: id(&mut input).into(),
                })),
            }),
            4 => {
                let len = input.byte() as usize;
                RouterMessage::decode(input.bytes(len)).ok()
            }
            5 => Some(RouterMessage { kind: None }),
            7 => {
                let hold = input.byte().is_multiple_of(2);
                Some(flow_control(hold, id(&mut input)))
            }
            _ => {
                worker
                    .engine
                    .stats()
                    .await
                    .expect("the engine thread is alive");
                None
            }
        };
        if let Some(message) = message {
            ledger.sent(&message);
            assert!(stream.handle(message).await, "the engine thread stopped");
        }
        ledger.read(&mut steps);
    }
    // Every client reads again.
    for id in IDS {
        assert!(
            stream.handle(flow_control(false, id)).await,
            "the engine thread stopped"
        );
    }
    // Every request is answered (or cancelled) and the engine is idle.
    let deadline = Instant::now() + IDLE_TIMEOUT;
    loop {
        let stats = worker
            .engine
            .stats()
            .await
            .expect("the engine thread is alive");
        // The outputs of every step before the stats' answer are queued by now.
        ledger.read(&mut steps);
        if stats.running_sequences + stats.waiting_sequences + stats.held_sequences == 0 {
            assert_eq!(
                stats.kv_blocks_used, 0,
                "KV blocks leaked: every request finished or was cancelled: {stats:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the engine is not idle {IDLE_TIMEOUT:?} after the last message: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    ledger.check();
    stream.close();
    let stats = worker
        .engine
        .stats()
        .await
        .expect("the engine thread is alive");
    assert_eq!(stats.kv_blocks_used, 0, "KV blocks leaked: {stats:?}");
    assert_eq!(
        stats.running_sequences + stats.waiting_sequences + stats.held_sequences,
        0,
        "{stats:?}"
    );
}

/// A `hold` (or a `resume`) of `request_id`.
fn flow_control(hold: bool, request_id: &str) -> RouterMessage {
    let request_id = request_id.to_string();
    let kind = if hold {
        router_message::Kind::Hold(HoldRequest { request_id })
    } else {
        router_message::Kind::Resume(ResumeRequest { request_id })
    };
    RouterMessage { kind: Some(kind) }
}

/// One of [`IDS`].
fn id(input: &mut Input) -> &'static str {
    IDS[input.byte() as usize % IDS.len()]
}

/// A token id: mostly inside the vocabulary, sometimes at or past its end.
fn token(input: &mut Input, vocab: u32) -> u32 {
    match input.byte() {
        b @ 0..=239 => u32::from(b) % vocab,
        240 => vocab - 1,
        241 => vocab,
        242 => vocab + 1,
        243 => u32::MAX,
        244 => 1 << 31,
        _ => u32::from(input.u16()),
    }
}

/// A count: small from the byte, or an edge of the context, or huge.
fn count(input: &mut Input, context: u32) -> u32 {
    match input.byte() {
        b @ 0..=199 => u32::from(b % 32),
        200 => context - 1,
        201 => context,
        202 => context + 1,
        203 => 4096,
        204 => 100_000,
        205 => u32::MAX,
        b => u32::from(b) + u32::from(input.u16()) % 256,
    }
}

fn float(input: &mut Input) -> f32 {
    FLOATS[input.byte() as usize % FLOATS.len()]
}

/// An `add`: a flags byte chooses which optional parts follow (bit 0 sampling parameters, 1
/// generated ids, 2 stop token ids, 3 a constraint, 4 prompt logprobs, 5 priority and speculation,
/// 6 a cache salt, 7 a huge prompt); then the id, the prompt (a count, then one [`token`] each, or
/// for a huge prompt a count of ids in the vocabulary and one chosen id at a chosen place),
/// `max_new_tokens` (a [`count`]) and the parts the flags chose.
fn add(input: &mut Input, worker: &EngineWorker) -> RouterMessage {
    let (vocab, context) = (worker.vocab, worker.context);
    let flags = input.byte();
    let request_id = id(input).to_string();
    let prompt_ids = if flags & 0x80 != 0 {
        let len = count(input, context).min(200_000) as usize + context as usize;
        let mut ids: Vec<u32> = (0..len as u32).map(|i| i % vocab).collect();
        let (at, bad) = (input.u16() as usize, token(input, vocab));
        if let Some(slot) = ids.get_mut(at) {
            *slot = bad;
        }
        ids
    } else {
        let len = count(input, context).min(1024);
        (0..len).map(|_| token(input, vocab)).collect()
    };
    let max_new_tokens = count(input, context);
    let sampling = (flags & 1 != 0).then(|| sampling(input, vocab));
    let generated_ids = match flags & 2 {
        0 => Vec::new(),
        _ => (0..input.byte() % 8).map(|_| token(input, vocab)).collect(),
    };
    let stop_token_ids = match flags & 4 {
        0 => Vec::new(),
        _ => (0..input.byte() % 4).map(|_| token(input, vocab)).collect(),
    };
    let constraint = (flags & 8 != 0).then(|| constraint(input));
    let prompt_logprobs = (flags & 16 != 0).then(|| u32::from(input.byte() % 32));
    let (priority, speculation) = match flags & 32 {
        0 => (0, None),
        _ => {
            let priority = [0, 1, -1, 10, i32::MAX, i32::MIN][input.byte() as usize % 6];
            (
                priority,
                [None, Some(true), Some(false)][input.byte() as usize % 3],
            )
        }
    };
    let (cache_salt, tenant, tenant_weight) = match flags & 64 {
        0 => (String::new(), String::new(), 0),
        _ => {
            let salt = format!("salt-{}", input.byte() % 4);
            let tenant = ["", "a", "b", "default"][input.byte() as usize % 4];
            let weight = [0, 1, 3, u32::MAX][input.byte() as usize % 4];
            (salt, tenant.to_string(), weight)
        }
    };
    RouterMessage {
        kind: Some(router_message::Kind::Add(AddRequest {
            request_id,
            prompt_ids,
            sampling,
            max_new_tokens,
            stop_token_ids,
            generated_ids,
            trace_context: HashMap::new(),
            constraint,
            priority,
            cache_salt,
            tenant,
            tenant_weight,
            prompt_logprobs,
            speculation,
        })),
    }
}

/// Sampling parameters: a byte chooses greedy (valid), seeded sampling (valid) or every field
/// from [`FLOATS`] and the bytes (mostly invalid), with up to 3 logit biases.
fn sampling(input: &mut Input, vocab: u32) -> SamplingParams {
    let seed = u64::from(input.u16());
    match input.byte() % 4 {
        0 => SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            seed,
            ..Default::default()
        },
        1 => SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            seed,
            top_logprobs: u32::from(input.byte() % 8),
            ..Default::default()
        },
        _ => SamplingParams {
            temperature: float(input),
            top_k: [0, 1, 5, 50, u32::MAX][input.byte() as usize % 5],
            top_p: float(input),
            seed,
            min_p: float(input),
            repetition_penalty: float(input),
            frequency_penalty: float(input),
            presence_penalty: float(input),
            logit_bias: (0..input.byte() % 4)
                .map(|_| (token(input, vocab), float(input)))
                .collect(),
            top_logprobs: u32::from(input.byte() % 32),
        },
    }
}

/// A constraint, valid or not, from a small table.
fn constraint(input: &mut Input) -> Constraint {
    let choice = |choices: &[&str]| {
        Kind::Choice(ChoiceList {
            choices: choices.iter().map(|s| s.to_string()).collect(),
        })
    };
    let kind = match input.byte() % 9 {
        0 => choice(&["yes", "no"]),
        1 => Kind::Regex("[a-c]{1,4}".into()),
        2 => Kind::JsonObject(true),
        3 => Kind::JsonSchema(r#"{"type": "integer"}"#.into()),
        4 => Kind::Lark("start: \"a\" | \"b\"".into()),
        5 => choice(&[]),
        6 => Kind::Regex("(".into()),
        7 => Kind::JsonSchema("{".into()),
        _ => Kind::Lark("start: ".into()),
    };
    Constraint { kind: Some(kind) }
}

/// What was asked and answered on the stream, by request id.
#[derive(Default)]
struct Ledger {
    /// `add`s sent.
    adds: HashMap<String, u32>,
    /// `cancel`s sent while an `add` of the id was open (not yet answered, as far as the answers
    /// read so far tell, nor already cancelled): only those excuse a missing answer.
    cancels: HashMap<String, u32>,
    /// Request errors and finishing tokens received.
    answers: HashMap<String, u32>,
}

impl Ledger {
    fn sent(&mut self, message: &RouterMessage) {
        match &message.kind {
            Some(router_message::Kind::Add(add)) => {
                *self.adds.entry(add.request_id.clone()).or_default() += 1;
            }
            Some(router_message::Kind::Cancel(cancel)) if self.open(&cancel.request_id) => {
                *self.cancels.entry(cancel.request_id.clone()).or_default() += 1;
            }
            Some(
                router_message::Kind::Cancel(_)
                | router_message::Kind::Hold(_)
                | router_message::Kind::Resume(_),
            )
            | None => {}
        }
    }

    /// Whether an `add` of `id` is still open: more adds than answers read and cancels counted.
    fn open(&self, id: &str) -> bool {
        let count = |m: &HashMap<String, u32>| m.get(id).copied().unwrap_or(0);
        count(&self.adds) > count(&self.answers) + count(&self.cancels)
    }

    /// Takes every step message queued so far.
    fn read(&mut self, steps: &mut UnboundedReceiver<StepOutput>) {
        while let Ok(step) = steps.try_recv() {
            self.step(&step);
        }
    }

    fn step(&mut self, step: &StepOutput) {
        for error in &step.errors {
            let code = Code::from(error.code);
            assert!(
                matches!(
                    code,
                    Code::InvalidArgument
                        | Code::ResourceExhausted
                        | Code::Internal
                        | Code::Unavailable
                ),
                "a refusal with code {code:?}: {error:?}"
            );
            assert!(
                !error.message.is_empty(),
                "a refusal without a message: {error:?}"
            );
            self.answer(&error.request_id, "an error");
        }
        for token in &step.tokens {
            assert!(
                self.adds.contains_key(&token.request_id),
                "a token for {:?}, which was never added",
                token.request_id
            );
            if token.finished {
                self.answer(&token.request_id, "a finished token");
            }
        }
    }

    fn answer(&mut self, id: &str, what: &str) {
        let asked = self.adds.get(id).copied().unwrap_or(0);
        let answered = self.answers.entry(id.to_string()).or_default();
        *answered += 1;
        assert!(
            *answered <= asked,
            "{what} for {id:?}: answer {answered} to {asked} adds"
        );
        // A cancel counted while this answer was on its way came too late: it excuses nothing.
        let answered = *answered;
        if let Some(cancels) = self.cancels.get_mut(id) {
            if answered + *cancels > asked {
                *cancels -= 1;
            }
        }
    }

    /// Every `add` not cancelled has its answer.
    fn check(&self) {
        for (id, &asked) in &self.adds {
            let answered = self.answers.get(id).copied().unwrap_or(0);
            let cancelled = self.cancels.get(id).copied().unwrap_or(0);
            assert!(
                answered + cancelled >= asked,
                "{id:?}: {asked} adds, {answered} answers, {cancelled} cancels: a request was \
                 neither answered nor cancelled"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inference_proto::worker::TokenOutput;

    fn add(id: &str) -> RouterMessage {
        RouterMessage {
            kind: Some(router_message::Kind::Add(AddRequest {
                request_id: id.into(),
                ..Default::default()
            })),
        }
    }

    fn cancel(id: &str) -> RouterMessage {
        RouterMessage {
            kind: Some(router_message::Kind::Cancel(CancelRequest {
                request_id: id.into(),
            })),
        }
    }

    fn finished(id: &str) -> StepOutput {
        StepOutput {
            tokens: vec![TokenOutput {
                request_id: id.into(),
                finished: true,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn passes(ledger: &Ledger) -> bool {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ledger.check())).is_ok()
    }

    #[test]
    fn a_cancel_excuses_only_an_add_that_was_still_open() {
        // Cancelled while open: excused.
        let mut l = Ledger::default();
        l.sent(&add("x"));
        l.sent(&cancel("x"));
        assert!(passes(&l));
        // Answered, then cancelled: the cancel excuses nothing, so a second add without an
        // answer is a lost request.
        let mut l = Ledger::default();
        l.sent(&add("x"));
        l.step(&finished("x"));
        l.sent(&cancel("x"));
        assert!(passes(&l));
        l.sent(&add("x"));
        assert!(!passes(&l));
        // A cancel overtaken by the answer (counted, then the answer arrived) excuses nothing
        // either; a later add cancelled while open is excused.
        let mut l = Ledger::default();
        l.sent(&add("x"));
        l.sent(&cancel("x"));
        l.step(&finished("x"));
        l.sent(&add("x"));
        assert!(!passes(&l));
        l.sent(&cancel("x"));
        assert!(passes(&l));
        // Cancels of ids never added are ignored.
        let mut l = Ledger::default();
        l.sent(&cancel("y"));
        l.sent(&add("y"));
        assert!(!passes(&l));
    }
}
