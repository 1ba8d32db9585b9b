//! The engine loop: each iteration drains commands, runs every live sequence one step (prefill for new
//! ones, one decode token for the others), streams the sampled tokens per connection and drops finished
//! sequences, freeing their KV cache.
//!
//! Sequences run one after another inside a step here; batching all of them into one forward is the
//! scheduler's job in a later change. The loop shape (schedule, execute, update) stays the same.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use inference_proto::worker::{
    AddRequest, EngineStats, LoadReport, RequestError, StepOutput, StopReason as WireStopReason,
    TokenOutput,
};
use tokio::sync::mpsc;

use super::{Command, ConnId, EngineHandle, Sequence, SequenceModel, StopReason};
use crate::sampler::{Sampler, SamplingConfig};

/// gRPC status codes used in [`RequestError::code`].
const CODE_INVALID_ARGUMENT: i32 = 3;
const CODE_INTERNAL: i32 = 13;

/// Starts the engine on its own thread and returns a handle to it.
pub fn spawn_engine<M: SequenceModel>(model: M) -> EngineHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || Engine::new(model).run(rx))
        .expect("spawning the engine thread");
    EngineHandle { tx }
}

struct Engine<M: SequenceModel> {
    model: M,
    running: Vec<Sequence<M::Cache>>,
    outputs: HashMap<ConnId, mpsc::UnboundedSender<StepOutput>>,
    stats: EngineStats,
}

impl<M: SequenceModel> Engine<M> {
    fn new(model: M) -> Self {
        Self {
            model,
            running: Vec::new(),
            outputs: HashMap::new(),
            stats: EngineStats::default(),
        }
    }

    fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            if self.running.is_empty() {
                // Idle: block until something arrives.
                match rx.blocking_recv() {
                    Some(cmd) => self.handle(cmd),
                    None => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => return,
                }
            }
            if !self.running.is_empty() {
                self.step();
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Add { conn, request, out } => {
                self.outputs.insert(conn, out);
                if let Err(message) = self.admit(conn, request.clone()) {
                    self.send_error(conn, &request.request_id, CODE_INVALID_ARGUMENT, message);
                }
            }
            Command::Cancel { conn, request_id } => {
                let before = self.running.len();
                self.running
                    .retain(|s| !(s.conn == conn && s.request_id == request_id));
                self.stats.cancelled_requests += (before - self.running.len()) as u64;
            }
            Command::CloseConnection { conn } => self.close_connection(conn),
            Command::Stats(reply) => {
                let _ = reply.send(self.current_stats());
            }
        }
    }

    fn close_connection(&mut self, conn: ConnId) {
        let before = self.running.len();
        self.running.retain(|s| s.conn != conn);
        self.stats.cancelled_requests += (before - self.running.len()) as u64;
        self.outputs.remove(&conn);
    }

    fn admit(&mut self, conn: ConnId, req: AddRequest) -> Result<(), String> {
        let ctx = self.model.context_length();
        let vocab = self.model.vocab_size();
        if req.request_id.is_empty() {
            return Err("request_id is empty".into());
        }
        if self
            .running
            .iter()
            .any(|s| s.conn == conn && s.request_id == req.request_id)
        {
            return Err(format!(
                "request_id {:?} is already running",
                req.request_id
            ));
        }
        if req.prompt_ids.is_empty() {
            return Err("prompt has no tokens".into());
        }
        if req.prompt_ids.len() >= ctx {
            return Err(format!(
                "prompt is {} tokens; this model's context is {ctx} tokens",
                req.prompt_ids.len()
            ));
        }
        if let Some(bad) = req.prompt_ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(format!(
                "prompt token id {bad} is outside the vocabulary (size {vocab})"
            ));
        }
        if req.max_new_tokens == 0 {
            return Err("max_new_tokens must be at least 1".into());
        }
        let sampling = req.sampling.unwrap_or_default();
        if sampling.temperature.is_nan() || sampling.temperature < 0.0 {
            return Err(format!("temperature {} is negative", sampling.temperature));
        }
        if sampling.top_p.is_nan() || sampling.top_p <= 0.0 || sampling.top_p > 1.0 {
            return Err(format!("top_p {} is outside (0, 1]", sampling.top_p));
        }
        let sampler = Sampler::new(
            SamplingConfig {
                temperature: sampling.temperature,
                top_k: sampling.top_k,
                top_p: sampling.top_p,
            },
            sampling.seed,
        );
        self.stats.prompt_tokens += req.prompt_ids.len() as u64;
        self.running.push(Sequence::new(
            conn,
            req.request_id,
            req.prompt_ids,
            self.model.new_cache(),
            sampler,
            req.max_new_tokens as usize,
            req.stop_token_ids,
            ctx,
        ));
        Ok(())
    }

    /// Runs every live sequence one step and streams the results.
    fn step(&mut self) {
        let mut per_conn: HashMap<ConnId, StepOutput> = HashMap::new();
        let mut keep = Vec::with_capacity(self.running.len());
        for mut seq in std::mem::take(&mut self.running) {
            let model = &self.model;
            let result = catch_unwind(AssertUnwindSafe(|| {
                let tokens = seq.pending_tokens().to_vec();
                model.forward(&tokens, &mut seq.cache)
            }));
            let logits = match result {
                Ok(Ok(logits)) => logits,
                Ok(Err(e)) => {
                    per_conn
                        .entry(seq.conn)
                        .or_default()
                        .errors
                        .push(RequestError {
                            request_id: seq.request_id.clone(),
                            code: CODE_INTERNAL,
                            message: format!("model forward failed: {e:#}"),
                        });
                    continue;
                }
                Err(_) => {
                    per_conn
                        .entry(seq.conn)
                        .or_default()
                        .errors
                        .push(RequestError {
                            request_id: seq.request_id.clone(),
                            code: CODE_INTERNAL,
                            message: "model forward panicked".into(),
                        });
                    continue;
                }
            };
            let (sampled, stop) = seq.accept_logits(&logits);
            self.stats.generated_tokens += 1;
            per_conn
                .entry(seq.conn)
                .or_default()
                .tokens
                .push(TokenOutput {
                    request_id: seq.request_id.clone(),
                    token_id: sampled.token_id,
                    logprob: sampled.logprob,
                    finished: stop.is_some(),
                    stop_reason: wire_reason(stop) as i32,
                    index: (seq.generated.len() - 1) as u32,
                });
            if stop.is_some() {
                self.stats.finished_requests += 1;
            } else {
                keep.push(seq);
            }
        }
        self.running = keep;
        self.stats.steps += 1;
        let load = self.load();
        for (conn, mut out) in per_conn {
            out.load = Some(load);
            out.step = self.stats.steps;
            let delivered = self
                .outputs
                .get(&conn)
                .is_some_and(|tx| tx.send(out).is_ok());
            if !delivered {
                // The connection is gone: nobody will read its tokens, free its sequences now.
                self.close_connection(conn);
            }
        }
    }

    fn send_error(&mut self, conn: ConnId, request_id: &str, code: i32, message: String) {
        let out = StepOutput {
            errors: vec![RequestError {
                request_id: request_id.to_string(),
                code,
                message,
            }],
            load: Some(self.load()),
            ..Default::default()
        };
        if let Some(tx) = self.outputs.get(&conn) {
            let _ = tx.send(out);
        }
    }

    /// The load report sent with every step. Each sequence owns a contiguous cache that grows on
    /// demand, so there is no fixed KV capacity yet: `free_kv_tokens` stays 0 (unknown).
    fn load(&self) -> LoadReport {
        LoadReport {
            running_sequences: self.running.len() as u32,
            waiting_sequences: 0,
            free_kv_tokens: 0,
        }
    }

    fn current_stats(&self) -> EngineStats {
        let mut stats = self.stats;
        stats.running_sequences = self.running.len() as u32;
        stats.waiting_sequences = 0;
        stats.kv_tokens_used = self
            .running
            .iter()
            .map(|s| M::cache_len(&s.cache) as u64)
            .sum();
        stats
    }
}

fn wire_reason(reason: Option<StopReason>) -> WireStopReason {
    match reason {
        None => WireStopReason::Unspecified,
        Some(StopReason::StopToken) => WireStopReason::StopToken,
        Some(StopReason::Length) => WireStopReason::Length,
        Some(StopReason::ContextFull) => WireStopReason::ContextFull,
    }
}
