//! The engine loop. Each iteration is one step in three verbs (the shape of vLLM's V1 engine core):
//! **schedule** (the [`Scheduler`] picks decodes, prefill chunks and admissions under the token
//! budget and allocates KV blocks), **execute** (one `forward_batch` over the whole flattened batch),
//! **update** (sample for sequences whose known tokens are all computed, apply stop rules, stream the
//! tokens per connection, free what finished). Commands (add, cancel, stats) are drained between steps.
//! After each command batch and each step (before its outputs go out) the engine publishes its state
//! ([`super::monitor`]).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use structured_output::ConstraintState;
use tokio::sync::mpsc;

use super::error::with_sources;
use super::masks::{self, MaskJobs};
use super::monitor::{EngineSnapshot, Publisher};
use super::prompt_logprobs;
use super::scheduler::{Chunk, Scheduler, SchedulerConfig, SeqId};
use super::sequence::{PromptScoring, Sequence};
use super::{
    CacheReport, Command, ConnId, EngineError, EngineErrorKind, EngineHandle, EngineLoad,
    EngineOutput, EngineRequest, EngineStats, GeneratedToken, OutputSink, RequestFailure,
    DECODE_HORIZON_TOKENS,
};
use crate::backend::{BatchEntry, BatchModel, Logits};
use crate::kv::BlockPool;
use crate::sampler::Sampler;
use crate::speculation::draft::{committed_draft_positions, Drafter};
use crate::speculation::draft_cost::DraftCosts;
use crate::speculation::{self, Proposer, SpeculationConfig};
use sampling_limits::MAX_TOP_LOGPROBS;

/// Engine settings.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the pool.
    pub num_blocks: usize,
    /// Reuse cached prompt-prefix blocks.
    pub prefix_caching: bool,
    /// Batch limits.
    pub scheduler: SchedulerConfig,
    /// Speculative decoding (validated by the caller, [`SpeculationConfig::validate`]).
    pub speculation: SpeculationConfig,
}

/// Starts the engine on its own thread and returns a handle to it.
pub fn spawn_engine<M: BatchModel>(model: M, config: EngineConfig) -> EngineHandle {
    spawn_engine_with_draft(model, None, config)
}

/// [`spawn_engine`] with a draft model for `speculation = draft` ([`crate::speculation::draft`]):
/// its K/V gets as many blocks as the target's pool (`config.num_blocks`, sized by the caller for
/// both models' bytes per token). The caller has checked that both models have the same
/// vocabulary.
pub fn spawn_engine_with_draft<M: BatchModel>(
    model: M,
    draft: Option<M>,
    config: EngineConfig,
) -> EngineHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    let (publisher, state) = Publisher::new(EngineSnapshot::starting(initial_stats(&config)));
    std::thread::Builder::new()
        .name("engine".into())
        // The publisher lives on the thread: when the thread ends (or a panic unwinds it), its drop
        // publishes `alive = false`.
        .spawn(move || Engine::new(model, draft, config, publisher).run(rx))
        .expect("spawning the engine thread");
    EngineHandle { tx, state }
}

/// The counters of an engine that has done nothing yet.
fn initial_stats(config: &EngineConfig) -> EngineStats {
    EngineStats {
        kv_block_size: config.block_size as u32,
        kv_tokens_capacity: (config.num_blocks * config.block_size) as u64,
        kv_blocks_total: config.num_blocks as u64,
        kv_blocks_free: config.num_blocks as u64,
        ..Default::default()
    }
}

struct Engine<M: BatchModel> {
    model: M,
    kv: M::Kv,
    /// The draft model of `speculation = draft`, with its K/V.
    drafter: Option<Drafter<M>>,
    /// The step's logits, written by the model and read by the sampler; kept from step to step.
    logits: Logits,
    pool: BlockPool,
    scheduler: Scheduler,
    speculation: SpeculationConfig,
    /// What speculation costs, as this worker measured it (see [`speculation::draft_cost`]).
    speculation_costs: DraftCosts,
    max_batch_tokens: usize,
    seqs: HashMap<SeqId, Sequence>,
    /// (connection, request id) -> sequence.
    ids: HashMap<(ConnId, String), SeqId>,
    next_seq: SeqId,
    outputs: HashMap<ConnId, Box<dyn OutputSink>>,
    stats: EngineStats,
    publisher: Publisher,
}

impl<M: BatchModel> Engine<M> {
    fn new(model: M, draft: Option<M>, config: EngineConfig, publisher: Publisher) -> Self {
        let kv = model.new_kv(config.num_blocks, config.block_size);
        let stats = initial_stats(&config);
        let drafter = draft.map(|d| Drafter::new(d, config.num_blocks, config.block_size));
        Self {
            model,
            kv,
            drafter,
            logits: Logits::new(),
            pool: BlockPool::new(config.num_blocks, config.block_size, config.prefix_caching),
            scheduler: Scheduler::new(config.scheduler),
            speculation: config.speculation,
            speculation_costs: DraftCosts::default(),
            max_batch_tokens: config.scheduler.max_batch_tokens,
            seqs: HashMap::new(),
            ids: HashMap::new(),
            next_seq: 1,
            outputs: HashMap::new(),
            stats,
            publisher,
        }
    }

    /// Publishes the engine's state; `stepped` when a step just finished.
    fn publish(&self, stepped: bool) {
        let has_work = self.scheduler.has_work();
        self.publisher
            .publish(Instant::now(), stepped, has_work, self.current_stats());
    }

    fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            let had_work = self.scheduler.has_work();
            if !had_work {
                // Idle (nothing runs or waits; held sequences wait for their resume): block until
                // something arrives.
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
            self.publish(false);
            if self.scheduler.has_work() {
                self.step();
            } else if had_work {
                self.report_idle();
            }
        }
    }

    /// The engine went idle between steps (cancels, holds or a closed connection took its last
    /// runnable sequences): every connection hears the load (nothing ahead) and the cache changes now.
    /// Without it a router would keep the last step's load report, which still counted those
    /// sequences, until the next step, however long the worker stays idle (a KV-aware router then
    /// routes around an idle worker).
    fn report_idle(&mut self) {
        let out = EngineOutput {
            load: Some(self.load()),
            cache: self.cache_changes(),
            ..Default::default()
        };
        self.send_to_all(out);
    }

    /// Delivers a copy of `out` to every connection.
    fn send_to_all(&mut self, out: EngineOutput) {
        let conns: Vec<ConnId> = self.outputs.keys().copied().collect();
        for conn in conns {
            self.deliver(conn, out.clone());
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Add {
                conn,
                request,
                constraint,
                out,
            } => {
                self.outputs.insert(conn, out);
                let request_id = request.request_id.clone();
                if let Err(error) = self.admit(conn, *request, constraint) {
                    self.stats.failed_requests += 1;
                    // With the load, so that a router that counted the request as sent to this
                    // worker (until the next report) stops counting it now.
                    let refused = EngineOutput {
                        errors: vec![RequestFailure { request_id, error }],
                        load: Some(self.load()),
                        ..Default::default()
                    };
                    self.deliver(conn, refused);
                }
            }
            Command::Connect { conn, out } => {
                // Changes not yet sent go to the connections that knew the cache before; the new
                // one starts from the snapshot.
                self.flush_cache_events();
                self.outputs.insert(conn, out);
                let snapshot = EngineOutput {
                    cache: Some(CacheReport {
                        snapshot: true,
                        events: crate::kv::CacheEvents {
                            stored: self.pool.cached_hashes(),
                            evicted: Vec::new(),
                        },
                    }),
                    load: Some(self.load()),
                    ..Default::default()
                };
                self.deliver(conn, snapshot);
            }
            Command::Cancel { conn, request_id } => {
                if let Some(id) = self.ids.get(&(conn, request_id)).copied() {
                    self.finish(id);
                    self.stats.cancelled_requests += 1;
                }
            }
            Command::Hold { conn, request_id } => {
                if let Some(id) = self.ids.get(&(conn, request_id)).copied() {
                    self.scheduler.hold(id, &mut self.seqs, &mut self.pool);
                }
            }
            Command::Resume { conn, request_id } => {
                if let Some(id) = self.ids.get(&(conn, request_id)).copied() {
                    self.scheduler.resume(id);
                }
            }
            Command::CloseConnection { conn } => self.close_connection(conn),
            Command::Stats(reply) => {
                let _ = reply.send(self.current_stats());
            }
            Command::CachedBlocks(reply) => {
                let mut hashes = self.pool.cached_hashes();
                hashes.sort_unstable();
                let _ = reply.send((hashes, self.pool.block_size()));
            }
        }
    }

    fn close_connection(&mut self, conn: ConnId) {
        let ids: Vec<SeqId> = self
            .ids
            .iter()
            .filter(|((c, _), _)| *c == conn)
            .map(|(_, &id)| id)
            .collect();
        self.stats.cancelled_requests += ids.len() as u64;
        for id in ids {
            self.finish(id);
        }
        self.outputs.remove(&conn);
    }

    /// Validates a request and queues it (with its compiled constraint, already advanced by its
    /// `generated_ids`).
    fn admit(
        &mut self,
        conn: ConnId,
        req: EngineRequest,
        constraint: Option<Box<ConstraintState>>,
    ) -> Result<(), EngineError> {
        let ctx = self.model.context_length();
        let vocab = self.model.vocab_size();
        if req.request_id.is_empty() {
            return Err(EngineError::invalid("request_id is empty"));
        }
        if self.ids.contains_key(&(conn, req.request_id.clone())) {
            return Err(EngineError::invalid(format!(
                "request_id {:?} is already running",
                req.request_id
            )));
        }
        if req.prompt_ids.is_empty() {
            return Err(EngineError::invalid("prompt has no tokens"));
        }
        if req.prompt_ids.len() >= ctx {
            return Err(EngineError::invalid(format!(
                "prompt is {} tokens; this model's context is {ctx} tokens",
                req.prompt_ids.len()
            )));
        }
        if let Some(bad) = req.prompt_ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::invalid(format!(
                "prompt token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        if req.max_new_tokens as usize <= req.generated_ids.len() {
            return Err(EngineError::invalid(format!(
                "max_new_tokens ({}) must exceed the {} tokens already generated",
                req.max_new_tokens,
                req.generated_ids.len()
            )));
        }
        let total = req.prompt_ids.len() + req.generated_ids.len();
        if total >= ctx {
            return Err(EngineError::invalid(format!(
                "prompt plus generated tokens is {total} tokens; this model's context is {ctx} tokens"
            )));
        }
        if let Some(bad) = req.generated_ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::invalid(format!(
                "generated token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        // The whole sequence must fit in the pool at once, or it could never finish.
        let longest = (req.prompt_ids.len() + req.max_new_tokens as usize).min(ctx);
        let blocks = self.pool.blocks_for(longest);
        if blocks > self.pool.num_blocks() {
            // Never servable here (not a momentary overload): a client must not retry it.
            return Err(EngineError::new(
                EngineErrorKind::ExceedsKvCache,
                format!(
                    "prompt ({} tokens) + max_new_tokens ({}) needs {blocks} KV blocks; this \
                     worker's KV cache has {} blocks of {} tokens",
                    req.prompt_ids.len(),
                    req.max_new_tokens,
                    self.pool.num_blocks(),
                    self.pool.block_size()
                ),
            ));
        }
        req.sampling
            .validate()
            .and_then(|()| req.sampling.check_vocab(vocab))
            .map_err(|e| EngineError::invalid(e.to_string()))?;
        if let Some(n) = req.prompt_logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            return Err(EngineError::invalid(format!(
                "prompt_logprobs is {n}; the limit is {MAX_TOP_LOGPROBS}"
            )));
        }
        let sampler = Sampler::new(req.sampling, req.seed);
        let id = self.next_seq;
        self.next_seq += 1;
        self.stats.prompt_tokens += req.prompt_ids.len() as u64;
        self.ids.insert((conn, req.request_id.clone()), id);
        let mut seq = Sequence::new(
            conn,
            req.request_id,
            req.prompt_ids,
            sampler,
            req.max_new_tokens as usize,
            req.stop_token_ids,
            ctx,
        );
        seq.tokens.extend_from_slice(&req.generated_ids);
        seq.constraint = constraint;
        seq.prefix_root = req.prefix_root;
        seq.prompt_scoring = req.prompt_logprobs.map(|n| PromptScoring {
            top_n: n as usize,
            scored: 0,
        });
        seq.speculation.enabled = !req.speculation_opt_out;
        self.seqs.insert(id, seq);
        self.scheduler
            .enqueue(id, req.priority, req.tenant, req.tenant_weight);
        Ok(())
    }

    /// Drops a sequence and returns its KV blocks to the pool.
    fn finish(&mut self, id: SeqId) {
        self.scheduler.remove(id);
        if let Some(mut seq) = self.seqs.remove(&id) {
            self.ids
                .remove(&(seq.conn, std::mem::take(&mut seq.request_id)));
            if let Some(blocks) = seq.blocks.take() {
                self.pool.release(blocks);
            }
        }
    }

    /// One step: schedule, execute, update.
    fn step(&mut self) {
        let schedule = self.scheduler.schedule(&mut self.seqs, &mut self.pool);
        let drafted_before = self.stats.speculative_draft_tokens;
        self.stats.preemptions += schedule.preempted.len() as u64;
        if schedule.chunks.is_empty() {
            // Nothing fits although nothing else runs: the head of the queue cannot be served.
            self.fail_unschedulable();
            self.publish(false);
            return;
        }
        // Speculative decoding: drafts for the decodes (empty when the step should not speculate).
        speculation::plan_drafts(
            &self.speculation,
            &schedule.chunks,
            &mut self.seqs,
            &mut self.pool,
            self.max_batch_tokens,
            &mut self.speculation_costs,
            self.drafter.as_mut(),
        );
        // Structured output: the constrained sequences' masks are computed during the forward pass.
        let jobs = MaskJobs::take(&schedule.chunks, &mut self.seqs);
        let lent = jobs.ids();
        let started = Instant::now();
        let (executed, outcomes) = jobs.overlap(|| self.execute(&schedule.chunks));
        let step_ok = executed.is_ok();
        masks::restore(outcomes, &lent, &mut self.seqs);
        let mut per_conn: HashMap<ConnId, EngineOutput> = HashMap::new();
        match executed {
            Ok(()) => {
                let logits = std::mem::take(&mut self.logits);
                self.update(&schedule.chunks, &logits, &mut per_conn);
                self.logits = logits;
            }
            Err(error) => {
                for chunk in &schedule.chunks {
                    self.fail(chunk.seq, error.clone(), &mut per_conn);
                }
            }
        }
        let drafted = self
            .stats
            .speculative_draft_tokens
            .saturating_sub(drafted_before) as usize;
        // Speculation's price is weighed against decode steps (prefill steps never speculate),
        // timed from the forward pass to the end of the sampling of every verified position.
        let decodes_only = schedule.chunks.iter().all(|c| c.num_tokens == 1);
        if self.speculation.proposer != Proposer::Off && decodes_only && step_ok {
            let tokens = schedule.chunks.len() + drafted;
            let secs = started.elapsed().as_secs_f64();
            self.speculation_costs.step.observe(tokens, secs);
        }
        self.stats.steps += 1;
        self.stats.last_batch_sequences = schedule.chunks.len() as u32;
        self.stats.last_batch_tokens = schedule
            .chunks
            .iter()
            .map(|c| c.num_tokens as u32)
            .sum::<u32>()
            + drafted as u32;
        let load = self.load();
        let cache = self.cache_changes();
        // Before the outputs: whoever sees a request finish reads counters that include it.
        self.publish(true);
        // Every connection hears the step's load and cache changes, also one without tokens in it
        // (its router routes by them).
        let conns: Vec<ConnId> = self.outputs.keys().copied().collect();
        for conn in conns {
            let mut out = per_conn.remove(&conn).unwrap_or_default();
            out.load = Some(load);
            out.step = self.stats.steps;
            out.cache = cache.clone();
            self.deliver(conn, out);
        }
    }

    /// The prefix cache's changes since they were last taken, `None` when there are none.
    fn cache_changes(&mut self) -> Option<CacheReport> {
        let events = self.pool.take_cache_events();
        (!events.is_empty()).then_some(CacheReport {
            snapshot: false,
            events,
        })
    }

    /// Sends the cache changes not yet sent (made outside a finished step) to every connection.
    fn flush_cache_events(&mut self) {
        let Some(cache) = self.cache_changes() else {
            return;
        };
        self.send_to_all(EngineOutput {
            cache: Some(cache),
            ..Default::default()
        });
    }

    /// Runs the batch, leaving in `self.logits` the logits of every chunk that ends its
    /// sequence's known tokens.
    ///
    /// Errors: [`EngineErrorKind::ModelFailed`] when the model fails (the message has its error and
    /// their sources) or panics.
    fn execute(&mut self, chunks: &[Chunk]) -> Result<(), EngineError> {
        // A decode with a draft runs its last token and the draft, all positions returning logits.
        let verify_inputs: Vec<Option<Vec<u32>>> = chunks
            .iter()
            .map(|c| {
                let seq = &self.seqs[&c.seq];
                let draft = &seq.speculation.draft;
                (!draft.is_empty()).then(|| {
                    let mut input = Vec::with_capacity(1 + draft.len());
                    input.push(seq.tokens[seq.computed]);
                    input.extend_from_slice(draft);
                    input
                })
            })
            .collect();
        let entries: Vec<BatchEntry<'_>> = chunks
            .iter()
            .zip(&verify_inputs)
            .map(|(c, verify)| {
                let seq = &self.seqs[&c.seq];
                let end = seq.computed + c.num_tokens;
                let block_table = seq.blocks.as_ref().expect("scheduled").table();
                match verify {
                    Some(input) => BatchEntry {
                        tokens: input,
                        start_pos: seq.computed,
                        block_table,
                        logit_tokens: input.len(),
                    },
                    None => BatchEntry {
                        tokens: &seq.tokens[seq.computed..end],
                        start_pos: seq.computed,
                        block_table,
                        logit_tokens: prompt_logprobs::logit_tokens(seq, seq.computed, end),
                    },
                }
            })
            .collect();
        let model = &self.model;
        let kv = &mut self.kv;
        let logits = &mut self.logits;
        match catch_unwind(AssertUnwindSafe(|| {
            model.forward_batch(&entries, kv, logits)
        })) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(EngineError::new(
                EngineErrorKind::ModelFailed,
                format!("model forward failed: {}", with_sources(&e)),
            )),
            Err(_) => Err(EngineError::new(
                EngineErrorKind::ModelFailed,
                "model forward panicked",
            )),
        }
    }

    fn update(
        &mut self,
        chunks: &[Chunk],
        logits: &Logits,
        per_conn: &mut HashMap<ConnId, EngineOutput>,
    ) {
        let mut logits = logits.iter();
        for chunk in chunks {
            let seq = self.seqs.get_mut(&chunk.seq).expect("scheduled sequence");
            // A decode with a draft gets its last token's row and one per draft token; any other
            // chunk the rows `prompt_logprobs::logit_tokens` asked for (prompt positions to score,
            // then the sampling row when the chunk ends the known tokens).
            let draft = std::mem::take(&mut seq.speculation.draft);
            let end = seq.computed + chunk.num_tokens;
            let rows: Vec<&[f32]> = if draft.is_empty() {
                let rows: Vec<&[f32]> = logits
                    .by_ref()
                    .take(prompt_logprobs::logit_tokens(seq, seq.computed, end))
                    .collect();
                let (scored, sampling_row) = prompt_logprobs::consume(seq, end, &rows);
                if let Some(scored) = scored {
                    per_conn
                        .entry(seq.conn)
                        .or_default()
                        .prompt_logprobs
                        .push(scored);
                }
                sampling_row.into_iter().collect()
            } else {
                logits.by_ref().take(draft.len() + 1).collect()
            };
            seq.computed = end;
            if seq.computed < seq.tokens.len() {
                // A prefill chunk that does not reach the end yet.
                if let Some(blocks) = seq.blocks.as_mut() {
                    self.pool
                        .register_full_blocks(blocks, &seq.tokens, seq.computed);
                }
                continue;
            }
            if rows.len() <= draft.len() {
                let message = "the model returned too few logits";
                let error = EngineError::new(EngineErrorKind::ModelFailed, message);
                self.fail(chunk.seq, error, per_conn);
                continue;
            }
            let verified = speculation::verify(seq, &draft, &rows);
            // Only committed, computed tokens are hashed; blocks that held only rejected
            // positions go back to the pool.
            let draft_written = seq.speculation.draft_written.take();
            if let Some(blocks) = seq.blocks.as_mut() {
                self.pool
                    .register_full_blocks(blocks, &seq.tokens, seq.computed);
                if let Some(written) = draft_written {
                    let positions = committed_draft_positions(written, seq.computed);
                    self.pool.set_draft_computed(blocks, positions);
                }
                self.pool.truncate(blocks, seq.computed);
            }
            if !draft.is_empty() {
                let forced = std::mem::take(&mut seq.speculation.forced);
                seq.speculation
                    .record(draft.len(), forced, verified.accepted);
                self.speculation_costs
                    .observe_acceptance(draft.len(), forced, verified.accepted);
                speculation::metrics::observe(
                    self.speculation.proposer,
                    draft.len(),
                    forced,
                    verified.accepted,
                );
                self.stats.speculative_draft_tokens += draft.len() as u64;
                self.stats.speculative_accepted_tokens += verified.accepted as u64;
                self.stats.speculative_verifications += 1;
                self.stats.speculative_forced_tokens += forced as u64;
                self.stats.speculative_forced_accepted_tokens +=
                    verified.accepted.min(forced) as u64;
            }
            let first_index = seq.generated().len() - verified.tokens.len();
            let mut stopped = false;
            for (i, (sampled, stop)) in verified.tokens.into_iter().enumerate() {
                self.stats.generated_tokens += 1;
                stopped |= stop.is_some();
                per_conn
                    .entry(seq.conn)
                    .or_default()
                    .tokens
                    .push(GeneratedToken {
                        request_id: seq.request_id.clone(),
                        token_id: sampled.token_id,
                        logprob: sampled.logprob,
                        stop,
                        index: (first_index + i) as u32,
                        top_logprobs: sampled.top_logprobs,
                        draft_tokens: seq.speculation.draft_tokens as u32,
                        accepted_draft_tokens: seq.speculation.accepted_draft_tokens as u32,
                    });
            }
            if let Some(e) = verified.error {
                // llguidance failed for this sequence: it fails, the engine goes on.
                let error = EngineError::new(EngineErrorKind::ConstraintFailed, e.to_string());
                self.fail(chunk.seq, error, per_conn);
            } else if stopped {
                self.stats.finished_requests += 1;
                self.finish(chunk.seq);
            }
        }
    }

    /// Fails sequence `id` with `error` (into its connection's output) and drops it.
    fn fail(
        &mut self,
        id: SeqId,
        error: EngineError,
        per_conn: &mut HashMap<ConnId, EngineOutput>,
    ) {
        if let Some(seq) = self.seqs.get(&id) {
            if error.kind.is_internal() {
                let message = &error.message;
                tracing::warn!(request_id = %seq.request_id, %message, "request failed");
            }
            per_conn
                .entry(seq.conn)
                .or_default()
                .errors
                .push(RequestFailure {
                    request_id: seq.request_id.clone(),
                    error,
                });
            self.stats.failed_requests += 1;
        }
        self.finish(id);
    }

    /// Fails the head of the queue when it cannot be admitted even with every block free.
    fn fail_unschedulable(&mut self) {
        let Some(id) = self.scheduler.first_waiting() else {
            return;
        };
        let seq = &self.seqs[&id];
        let message = format!(
            "sequence of {} tokens does not fit in this worker's KV cache ({} blocks of {} tokens)",
            seq.tokens.len(),
            self.pool.num_blocks(),
            self.pool.block_size()
        );
        let mut per_conn = HashMap::new();
        let error = EngineError::new(EngineErrorKind::NoKvRoom, message);
        self.fail(id, error, &mut per_conn);
        for (conn, out) in per_conn {
            self.deliver(conn, out);
        }
    }

    /// Sends `out` to its connection; a connection that is gone has its sequences dropped.
    fn deliver(&mut self, conn: ConnId, out: EngineOutput) {
        let delivered = self.outputs.get(&conn).is_some_and(|sink| sink.send(out));
        if !delivered {
            self.close_connection(conn);
        }
    }

    /// The load report sent with every step.
    fn load(&self) -> EngineLoad {
        let mut load = EngineLoad {
            running_sequences: self.scheduler.num_running() as u32,
            waiting_sequences: self.scheduler.num_waiting() as u32,
            free_kv_tokens: (self.pool.num_available() * self.pool.block_size()) as u64,
            ..EngineLoad::default()
        };
        // Held sequences hold no blocks and wait for their clients, not for the worker.
        let live = self
            .seqs
            .iter()
            .filter(|(id, _)| !self.scheduler.is_held(**id));
        for (_, s) in live {
            load.kv_demand_tokens += s.tokens.len() as u64;
            load.prefill_backlog_tokens += s.remaining() as u64;
            load.decode_horizon_tokens += s.tokens_left().min(DECODE_HORIZON_TOKENS) as u64;
        }
        load
    }

    fn current_stats(&self) -> EngineStats {
        let pool = self.pool.stats();
        let mut stats = self.stats;
        stats.running_sequences = self.scheduler.num_running() as u32;
        stats.waiting_sequences = self.scheduler.num_waiting() as u32;
        stats.held_sequences = self.scheduler.num_held() as u32;
        stats.kv_tokens_used = self.seqs.values().map(|s| s.computed as u64).sum();
        stats.kv_blocks_total = pool.total as u64;
        stats.kv_blocks_used = pool.used as u64;
        stats.kv_blocks_free = pool.free as u64;
        stats.prefix_cache_query_tokens = pool.query_tokens;
        stats.prefix_cache_hit_tokens = pool.hit_tokens;
        stats.prefix_cache_hit_rate = if pool.query_tokens == 0 {
            0.0
        } else {
            pool.hit_tokens as f64 / pool.query_tokens as f64
        };
        stats.prefix_cache_blocks = pool.cached as u64;
        stats
    }
}
