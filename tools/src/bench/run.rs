//! The load generator: connects to the router, builds the prompts, runs the warmup and the measured
//! phase, and gathers one [`RequestRecord`] per measured request.
//!
//! Closed loop (no `--request-rate`): `--concurrency` requests are in flight at all times until
//! all are sent. Open loop: request i is due at the i-th arrival of a Poisson process (exponential
//! gaps with mean 1 / rate, the first at 0 s) and is sent at that time or, when the concurrency
//! cap is reached, as soon as a slot frees up (late requests are then sent back to back).
//!
//! Every loop is bounded: exactly `--requests` (+ `--warmup`) requests, each under
//! `--timeout-secs`; every setup call (ModelInfo, Tokenize; with `--worker`: Health, Info,
//! opening the stream) has its own 30 s limit.
//!
//! With `--worker` ([`super::direct`]) every request goes on the one `Generate` stream of that
//! worker as the `AddRequest` the router would send for it (same prompt ids, sampling, seed,
//! `max_new_tokens`, no stop ids with `--ignore-eos`, else the worker's EOS ids); TTFT runs from
//! sending the Add to the arrival of the step message carrying its first token, ITL and E2E from
//! the arrivals of its step messages, under the same rules as through the router.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use inference_proto::public::{
    text_generation_client::TextGenerationClient, FinishReason, GenerateRequest, ModelInfoRequest,
    ModelInfoResponse, TokenizeRequest,
};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};

use inference_proto::worker::{AddRequest, SamplingParams, StopReason};

use super::direct::{self, Event, WorkerStream};
use super::openai::{self, Followed, HttpTokenizer, OpenAiServer};
use super::prompt::{build_prompts, PromptTokenizer};
use super::report::{inter_token_gaps, Report, RequestError, RequestRecord, Summary, SCHEMA};
use super::rng::{derive_seed, SplitMix64};
use super::BenchArgs;

/// A client of the router's public API.
type Client = TextGenerationClient<Channel>;

/// Where requests go.
#[derive(Clone)]
enum Target {
    /// The router's public `Generate`, spread over these connections.
    Router(Vec<Client>),
    /// One worker's `Generate` stream (`--worker`).
    Worker {
        stream: WorkerStream,
        /// Sent as `stop_token_ids` unless `--ignore-eos` (the worker's EOS ids, as the router
        /// does).
        eos_token_ids: Vec<u32>,
        /// The model's context (for the finish reason, as the router derives it).
        context_length: u32,
    },
    /// An OpenAI-compatible HTTP server (`--openai`).
    OpenAi(OpenAiServer),
}

/// Limit on each setup RPC (ModelInfo, Tokenize).
const SETUP_RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests in flight per HTTP/2 connection at most (servers commonly cap streams per
/// connection at 100-200); more concurrency opens more connections.
const STREAMS_PER_CONNECTION: usize = 100;

/// Prompts fitted at once (each fit is a sequence of `Tokenize` calls).
const PROMPT_BUILD_PARALLELISM: usize = 8;

/// Random stream numbers (with `--seed`) of the drawn lengths and the arrival times; prompts and
/// sampling seeds use the request index.
const LENGTHS_STREAM: u64 = 1 << 40;
const ARRIVALS_STREAM: u64 = (1 << 40) + 1;
const SAMPLING_STREAM: u64 = (1 << 40) + 2;

/// The settings stored in the report: the command line plus what was derived from it.
#[derive(Debug, Clone, Serialize)]
pub struct RunConfig {
    /// The command-line flags.
    #[serde(flatten)]
    pub args: BenchArgs,
    /// The cap on requests in flight actually used.
    pub effective_concurrency: usize,
    /// HTTP/2 connections to the router (with `--worker`: 1, one `Generate` stream).
    pub connections: usize,
    /// What was driven: `"router"` (its public `Generate`) or `"worker"` (`--worker`: one worker's
    /// `Generate` stream, directly).
    pub mode: &'static str,
}

/// Everything a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The report (`--json` writes it).
    pub report: Report<RunConfig>,
    /// Warmup requests that failed (not part of the summary).
    pub warmup_failed: usize,
}

impl Outcome {
    /// Whether every measured request succeeded.
    pub fn all_ok(&self) -> bool {
        self.report.summary.failed == 0
    }
}

/// One planned request.
#[derive(Debug, Clone)]
struct Planned {
    prompt: String,
    /// The prompt's token ids (what the router sends the worker for `prompt`).
    ids: Vec<u32>,
    prompt_tokens: u32,
    max_new_tokens: u32,
    seed: u64,
}

/// `Tokenize` through the router, with special tokens as `Generate` adds them.
#[derive(Clone)]
struct RpcTokenizer {
    client: Client,
    /// Calls made by this tokenizer and its clones.
    calls: Arc<AtomicUsize>,
}

impl PromptTokenizer for RpcTokenizer {
    async fn tokenize(&mut self, text: &str) -> anyhow::Result<Vec<u32>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let request = TokenizeRequest {
            text: text.to_string(),
            add_special_tokens: true,
        };
        let response = tokio::time::timeout(SETUP_RPC_TIMEOUT, self.client.tokenize(request))
            .await
            .context("Tokenize timed out")?
            .context("Tokenize failed")?;
        Ok(response.into_inner().ids)
    }
}

/// Counters the progress line reads.
#[derive(Debug, Default)]
struct Progress {
    sent: AtomicUsize,
    done: AtomicUsize,
    failed: AtomicUsize,
    tokens: AtomicU64,
}

/// Runs the benchmark `args` describe (validated by the caller) and returns its report.
/// Progress goes to stderr, about once a second.
///
/// Errors: the router cannot be reached or has no ready worker within `--wait-ready-secs`, the
/// settings do not fit the model's context, or the prompts cannot be built. Failed requests are not
/// errors: they are counted in the report.
pub async fn run(args: &BenchArgs) -> anyhow::Result<Outcome> {
    let concurrency = args.effective_concurrency();
    let (target, info, plans, connections) = match (&args.worker, &args.openai) {
        (Some(address), _) => connect_worker(args, address).await?,
        (None, Some(url)) => connect_openai(args, url).await?,
        (None, None) => connect_router(args, concurrency).await?,
    };
    let (warmup, measured) = plans.split_at(args.warmup);
    let mode = match target {
        Target::Router(_) => "router",
        Target::Worker { .. } => "worker",
        Target::OpenAi(_) => "openai",
    };

    let mut warmup_failed = 0;
    if !warmup.is_empty() {
        eprintln!("bench: warmup, {} requests", warmup.len());
        let records = run_phase(&target, warmup, None, concurrency, args, "warmup").await;
        let failures: Vec<&RequestError> =
            records.iter().filter_map(|r| r.error.as_ref()).collect();
        warmup_failed = failures.len();
        if let Some(first) = failures.first() {
            eprintln!(
                "bench: warning: {warmup_failed} of {} warmup requests failed (first: {} {})",
                warmup.len(),
                first.code,
                first.message
            );
        }
    }

    let arrivals = args.request_rate.map(|rate| {
        let mut rng = SplitMix64::new(derive_seed(args.seed, ARRIVALS_STREAM));
        let mut t = 0.0;
        (0..measured.len())
            .map(|i| {
                if i > 0 {
                    t += rng.exponential(rate);
                }
                Duration::from_secs_f64(t)
            })
            .collect::<Vec<_>>()
    });
    eprintln!(
        "bench: {} requests, {}",
        measured.len(),
        match args.request_rate {
            Some(rate) => format!("{rate} req/s Poisson arrivals, at most {concurrency} in flight"),
            None => format!("concurrency {concurrency}"),
        }
    );
    let started_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let phase_start = Instant::now();
    let records = run_phase(
        &target,
        measured,
        arrivals.as_deref(),
        concurrency,
        args,
        "measured",
    )
    .await;
    let duration_s = phase_start.elapsed().as_secs_f64();
    let summary = Summary::from_records(&records, duration_s);
    let report = Report {
        schema: SCHEMA,
        label: args.label.clone(),
        router: match (&args.worker, &args.openai) {
            (Some(_), _) => String::new(),
            (None, Some(url)) => url.clone(),
            (None, None) => args.router.clone(),
        },
        model: info.model_name.clone(),
        max_context_tokens: info.max_context_tokens,
        started_unix_ms,
        config: RunConfig {
            args: args.clone(),
            effective_concurrency: concurrency,
            connections,
            mode,
        },
        summary,
        requests: records,
    };
    Ok(Outcome {
        report,
        warmup_failed,
    })
}

/// `--worker`: connects to the worker, checks the settings against its context and builds the
/// prompts with its tokenizer.
async fn connect_worker(
    args: &BenchArgs,
    address: &str,
) -> anyhow::Result<(Target, ModelInfoResponse, Vec<Planned>, usize)> {
    let worker = direct::connect(address, Duration::from_secs(args.wait_ready_secs)).await?;
    let info = ModelInfoResponse {
        model_name: worker.info.model_name.clone(),
        max_context_tokens: worker.info.context_length,
        ..Default::default()
    };
    check_fits(args, &info)?;
    let tokenizer = worker.tokenizer.clone();
    let plans = plan(args, tokenizer.clone(), "local tokenizations", || {
        tokenizer.calls.load(Ordering::Relaxed)
    })
    .await?;
    let target = Target::Worker {
        stream: worker.stream,
        eos_token_ids: worker.info.eos_token_ids.clone(),
        context_length: worker.info.context_length,
    };
    Ok((target, info, plans, 1))
}

/// `--openai`: waits for the server to list a model and builds the prompts with its `/tokenize`.
/// The context is not checked here (OpenAI servers do not report it uniformly): a request that
/// does not fit fails with the server's error.
async fn connect_openai(
    args: &BenchArgs,
    url: &str,
) -> anyhow::Result<(Target, ModelInfoResponse, Vec<Planned>, usize)> {
    let wait = Duration::from_secs(args.wait_ready_secs);
    let server = openai::connect(url, args.openai_model.as_deref(), wait).await?;
    let info = ModelInfoResponse {
        model_name: server.model.clone(),
        ..Default::default()
    };
    let tokenizer = HttpTokenizer {
        server: server.clone(),
        calls: Arc::default(),
    };
    let plans = plan(args, tokenizer.clone(), "/tokenize calls", || {
        tokenizer.calls.load(Ordering::Relaxed)
    })
    .await?;
    Ok((Target::OpenAi(server), info, plans, 1))
}

/// Connects to the router, waits for a ready worker, checks the settings and builds the prompts
/// with the router's `Tokenize`.
async fn connect_router(
    args: &BenchArgs,
    concurrency: usize,
) -> anyhow::Result<(Target, ModelInfoResponse, Vec<Planned>, usize)> {
    let connections = concurrency.div_ceil(STREAMS_PER_CONNECTION).clamp(1, 16);
    let endpoint = Endpoint::from_shared(format!("http://{}", args.router))
        .with_context(|| format!("bad router address {:?}", args.router))?
        .connect_timeout(Duration::from_secs(10));
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("connecting to the router at {}", args.router))?;
        clients.push(TextGenerationClient::new(channel));
    }
    let info = wait_ready(&mut clients[0], Duration::from_secs(args.wait_ready_secs)).await?;
    check_fits(args, &info)?;
    let tokenizer = RpcTokenizer {
        client: clients[0].clone(),
        calls: Arc::default(),
    };
    let plans = plan(args, tokenizer.clone(), "Tokenize calls", || {
        tokenizer.calls.load(Ordering::Relaxed)
    })
    .await?;
    Ok((Target::Router(clients), info, plans, connections))
}

/// Polls `ModelInfo` until the router reports a ready worker or `budget` has passed.
async fn wait_ready(client: &mut Client, budget: Duration) -> anyhow::Result<ModelInfoResponse> {
    let deadline = Instant::now() + budget;
    loop {
        let answer =
            tokio::time::timeout(SETUP_RPC_TIMEOUT, client.model_info(ModelInfoRequest {})).await;
        let why = match answer {
            Ok(Ok(info)) if info.get_ref().ready_workers > 0 => return Ok(info.into_inner()),
            Ok(Ok(_)) => "no ready worker".to_string(),
            Ok(Err(status)) => format!("{}: {}", code_name(status.code()), status.message()),
            Err(_) => "ModelInfo timed out".to_string(),
        };
        if Instant::now() >= deadline {
            bail!("the router has no ready worker after {budget:?}: {why}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Fails early when a request could not fit the model's context or input limit.
fn check_fits(args: &BenchArgs, info: &ModelInfoResponse) -> anyhow::Result<()> {
    let prompt = args.prompt_tokens_upper();
    let new = args.max_new_tokens_upper() as usize;
    let ctx = info.max_context_tokens as usize;
    if prompt + new > ctx {
        bail!(
            "prompts of up to {prompt} tokens + up to {new} new tokens exceed the model's context \
             of {ctx} tokens"
        );
    }
    if let Some(limits) = &info.limits {
        let max_input = limits.max_input_tokens as usize;
        if max_input > 0 && prompt > max_input {
            bail!(
                "prompts of up to {prompt} tokens exceed the router's input limit of {max_input}"
            );
        }
        if limits.max_new_tokens > 0 && new > limits.max_new_tokens as usize {
            bail!(
                "up to {new} new tokens exceed the router's max_new_tokens limit of {}",
                limits.max_new_tokens
            );
        }
    }
    Ok(())
}

/// Draws the lengths and seeds of the warmup and measured requests and builds their prompts.
async fn plan<T: PromptTokenizer + Clone>(
    args: &BenchArgs,
    tokenizer: T,
    calls_name: &str,
    calls: impl Fn() -> usize,
) -> anyhow::Result<Vec<Planned>> {
    let total = args.warmup + args.requests;
    let mut rng = SplitMix64::new(derive_seed(args.seed, LENGTHS_STREAM));
    let lengths: Vec<(usize, u32)> = (0..total)
        .map(|_| {
            let p = rng.between(args.prompt_tokens as u64, args.prompt_tokens_upper() as u64);
            let m = rng.between(
                args.max_new_tokens as u64,
                args.max_new_tokens_upper() as u64,
            );
            (p as usize, m as u32)
        })
        .collect();
    let targets: Vec<usize> = lengths.iter().map(|&(p, _)| p).collect();
    let started = Instant::now();
    let prompts = build_prompts(
        &tokenizer,
        &targets,
        args.shared_prefix_tokens,
        args.seed,
        PROMPT_BUILD_PARALLELISM,
    )
    .await
    .context("building the prompts")?;
    eprintln!(
        "bench: built {total} prompts of {} tokens in {:.2} s ({} {calls_name})",
        if args.prompt_tokens_upper() > args.prompt_tokens {
            format!("{}..={}", args.prompt_tokens, args.prompt_tokens_upper())
        } else {
            args.prompt_tokens.to_string()
        },
        started.elapsed().as_secs_f64(),
        calls()
    );
    let sampling_seed = derive_seed(args.seed, SAMPLING_STREAM);
    Ok(prompts
        .into_iter()
        .zip(lengths)
        .enumerate()
        .map(|(i, (p, (_, m)))| Planned {
            prompt_tokens: p.ids.len() as u32,
            prompt: p.text,
            ids: p.ids,
            max_new_tokens: m,
            seed: derive_seed(sampling_seed, i as u64),
        })
        .collect())
}

/// Sends `plans` (at `arrivals` offsets from the phase start when given) with at most
/// `concurrency` in flight, and returns their records in index order.
async fn run_phase(
    target: &Target,
    plans: &[Planned],
    arrivals: Option<&[Duration]>,
    concurrency: usize,
    args: &BenchArgs,
    phase: &'static str,
) -> Vec<RequestRecord> {
    let progress = Arc::new(Progress::default());
    let phase_start = Instant::now();
    let ticker = tokio::spawn(report_progress(
        progress.clone(),
        plans.len(),
        phase,
        phase_start,
    ));
    let slots = Arc::new(Semaphore::new(concurrency));
    let timeout = Duration::from_secs(args.timeout_secs);
    let mut tasks = JoinSet::new();
    for (index, plan) in plans.iter().enumerate() {
        if let Some(at) = arrivals.and_then(|a| a.get(index)) {
            tokio::time::sleep_until((phase_start + *at).into()).await;
        }
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let request_id = format!("bench-{phase}-{index}");
        let plan = plan.clone();
        let progress = progress.clone();
        match target {
            Target::Router(clients) => {
                let client = clients[index % clients.len()].clone();
                let request = GenerateRequest {
                    prompt: plan.prompt.clone(),
                    max_new_tokens: Some(plan.max_new_tokens),
                    temperature: args.temperature,
                    top_k: args.top_k,
                    top_p: args.top_p,
                    seed: Some(plan.seed),
                    ignore_eos: args.ignore_eos,
                    request_id: Some(request_id),
                    ..Default::default()
                };
                tasks.spawn(async move {
                    let record = run_one(
                        client,
                        request,
                        &plan,
                        index,
                        timeout,
                        phase_start,
                        &progress,
                    )
                    .await;
                    drop(permit);
                    record
                });
            }
            Target::OpenAi(server) => {
                let body = openai::body(
                    &server.model,
                    &plan.prompt,
                    plan.max_new_tokens,
                    args.temperature,
                    args.top_p,
                    args.top_k,
                    plan.seed,
                    args.ignore_eos,
                );
                let server = server.clone();
                tasks.spawn(async move {
                    let record = run_one_openai(
                        &server,
                        &body,
                        &plan,
                        index,
                        timeout,
                        phase_start,
                        &progress,
                    )
                    .await;
                    drop(permit);
                    record
                });
            }
            Target::Worker {
                stream,
                eos_token_ids,
                context_length,
            } => {
                // What the router sends the worker for the same GenerateRequest
                // (`router/src/generate.rs`, `Sampling::to_wire`).
                let add = AddRequest {
                    request_id,
                    prompt_ids: plan.ids.clone(),
                    sampling: Some(SamplingParams {
                        temperature: args.temperature,
                        top_k: args.top_k,
                        top_p: args.top_p.unwrap_or(1.0),
                        seed: plan.seed,
                        ..Default::default()
                    }),
                    max_new_tokens: plan.max_new_tokens,
                    stop_token_ids: if args.ignore_eos {
                        Vec::new()
                    } else {
                        eos_token_ids.clone()
                    },
                    ..Default::default()
                };
                let stream = stream.clone();
                let context_length = *context_length;
                tasks.spawn(async move {
                    let record = run_one_direct(
                        &stream,
                        add,
                        &plan,
                        index,
                        timeout,
                        phase_start,
                        context_length,
                        &progress,
                    )
                    .await;
                    drop(permit);
                    record
                });
            }
        }
    }
    let mut records = Vec::with_capacity(plans.len());
    while let Some(joined) = tasks.join_next().await {
        records.push(joined.expect("request tasks do not panic"));
    }
    ticker.abort();
    records.sort_by_key(|r| r.index);
    records
}

/// Prints a progress line to stderr every second until aborted.
async fn report_progress(progress: Arc<Progress>, total: usize, phase: &str, start: Instant) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tick.tick().await;
        let elapsed = start.elapsed().as_secs_f64();
        let done = progress.done.load(Ordering::Relaxed);
        let tokens = progress.tokens.load(Ordering::Relaxed);
        eprintln!(
            "bench: {phase} {done}/{total} done, {} failed, {} in flight, {elapsed:.1} s, \
             {:.1} tokens/s",
            progress.failed.load(Ordering::Relaxed),
            progress.sent.load(Ordering::Relaxed) - done,
            tokens as f64 / elapsed.max(1e-9),
        );
    }
}

/// Milliseconds in `d`.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What one stream delivered before it ended or failed.
#[derive(Default)]
struct Received {
    messages: u32,
    streamed_tokens: u32,
    first_token_ms: Option<f64>,
    arrivals: Vec<(f64, usize)>,
    finish_reason: Option<String>,
    usage: Option<inference_proto::public::Usage>,
}

/// Sends one request and follows its stream to the end.
async fn run_one(
    mut client: Client,
    request: GenerateRequest,
    plan: &Planned,
    index: usize,
    timeout: Duration,
    phase_start: Instant,
    progress: &Progress,
) -> RequestRecord {
    progress.sent.fetch_add(1, Ordering::Relaxed);
    let sent = Instant::now();
    let mut got = Received::default();
    let follow = async {
        let mut stream = client.generate(request).await?.into_inner();
        while let Some(message) = stream.message().await? {
            let at = ms(sent.elapsed());
            got.messages += 1;
            let k = message.tokens.len();
            if k > 0 {
                got.first_token_ms.get_or_insert(at);
                got.arrivals.push((at, k));
                got.streamed_tokens += k as u32;
                progress.tokens.fetch_add(k as u64, Ordering::Relaxed);
            }
            if message.usage.is_some() {
                got.finish_reason = Some(
                    FinishReason::try_from(message.finish_reason)
                        .map_or("UNKNOWN", |r| r.as_str_name())
                        .to_string(),
                );
                got.usage = message.usage;
            }
        }
        Ok::<(), tonic::Status>(())
    };
    let follow = async {
        follow.await.map_err(|status| RequestError {
            code: code_name(status.code()).into(),
            message: status.message().to_string(),
        })
    };
    let error = within(timeout, follow, "no end of stream").await;
    let e2e = ms(sent.elapsed());
    let error = error.or_else(|| {
        got.usage.is_none().then(|| RequestError {
            code: "INTERNAL".into(),
            message: "the stream ended without its final message (no usage)".into(),
        })
    });
    record(
        plan,
        index,
        ms(sent - phase_start),
        e2e,
        got,
        error,
        progress,
    )
}

/// Sends one request to an OpenAI server (`--openai`) and follows its events to `[DONE]`.
async fn run_one_openai(
    server: &OpenAiServer,
    body: &serde_json::Value,
    plan: &Planned,
    index: usize,
    timeout: Duration,
    phase_start: Instant,
    progress: &Progress,
) -> RequestRecord {
    progress.sent.fetch_add(1, Ordering::Relaxed);
    let sent = Instant::now();
    let mut followed = Followed::default();
    let follow = openai::follow(server, body, sent, &mut followed, |k| {
        progress.tokens.fetch_add(k as u64, Ordering::Relaxed);
    });
    let error = within(timeout, follow, "no end of stream").await;
    let e2e = ms(sent.elapsed());
    let got = Received {
        messages: followed.messages,
        streamed_tokens: followed
            .completion_tokens
            .unwrap_or(followed.streamed_tokens),
        first_token_ms: followed.first_token_ms,
        arrivals: followed.arrivals,
        finish_reason: followed.finish_reason,
        usage: None,
    };
    record(
        plan,
        index,
        ms(sent - phase_start),
        e2e,
        got,
        error,
        progress,
    )
}

/// Sends one request on the worker's stream (`--worker`) and follows its tokens to the last.
/// Times are taken when the step message carrying the tokens arrived on the stream.
#[allow(clippy::too_many_arguments)]
async fn run_one_direct(
    stream: &WorkerStream,
    add: AddRequest,
    plan: &Planned,
    index: usize,
    timeout: Duration,
    phase_start: Instant,
    context_length: u32,
    progress: &Progress,
) -> RequestRecord {
    progress.sent.fetch_add(1, Ordering::Relaxed);
    let request_id = add.request_id.clone();
    let sent = Instant::now();
    let mut got = Received::default();
    let follow = async {
        let mut events = stream.add(add).map_err(|why| RequestError {
            code: "UNAVAILABLE".into(),
            message: why,
        })?;
        while let Some(event) = events.recv().await {
            match event {
                Event::Tokens(at, tokens) => {
                    let at = ms(at.saturating_duration_since(sent));
                    got.messages += 1;
                    let k = tokens.len();
                    got.first_token_ms.get_or_insert(at);
                    got.arrivals.push((at, k));
                    got.streamed_tokens += k as u32;
                    progress.tokens.fetch_add(k as u64, Ordering::Relaxed);
                    if let Some(last) = tokens.iter().find(|t| t.finished) {
                        let total = plan.prompt_tokens + got.streamed_tokens;
                        let reason = match last.stop_reason() {
                            StopReason::StopToken => FinishReason::EosToken,
                            StopReason::ContextFull => FinishReason::ContextLength,
                            StopReason::ConstraintComplete => FinishReason::ConstraintComplete,
                            StopReason::Length if total >= context_length => {
                                FinishReason::ContextLength
                            }
                            StopReason::Length | StopReason::Unspecified => {
                                FinishReason::MaxNewTokens
                            }
                        };
                        got.finish_reason = Some(reason.as_str_name().to_string());
                        return Ok(());
                    }
                }
                Event::Failed(code, message) => {
                    return Err(RequestError {
                        code: code_name(tonic::Code::from_i32(code)).into(),
                        message,
                    })
                }
                Event::Lost(why) => {
                    return Err(RequestError {
                        code: "UNAVAILABLE".into(),
                        message: why,
                    })
                }
            }
        }
        Err(RequestError {
            code: "INTERNAL".into(),
            message: "the request's events ended without its last token".into(),
        })
    };
    let error = within(timeout, follow, "no last token").await;
    let e2e = ms(sent.elapsed());
    // A request that did not finish may still be running on the worker.
    stream.close(&request_id, error.is_some());
    record(
        plan,
        index,
        ms(sent - phase_start),
        e2e,
        got,
        error,
        progress,
    )
}

/// The record of one request that ended (`e2e`: ms from sent to its end), counted in `progress`.
fn record(
    plan: &Planned,
    index: usize,
    sent_at_ms: f64,
    e2e: f64,
    got: Received,
    error: Option<RequestError>,
    progress: &Progress,
) -> RequestRecord {
    progress.done.fetch_add(1, Ordering::Relaxed);
    if error.is_some() {
        progress.failed.fetch_add(1, Ordering::Relaxed);
    }
    let usage = got.usage.filter(|_| error.is_none());
    RequestRecord {
        index,
        prompt_tokens: plan.prompt_tokens,
        max_new_tokens: plan.max_new_tokens,
        seed: plan.seed,
        sent_at_ms,
        ttft_ms: got.first_token_ms,
        e2e_ms: error.is_none().then_some(e2e),
        generated_tokens: usage.map_or(got.streamed_tokens, |u| u.generated_tokens),
        streamed_tokens: got.streamed_tokens,
        messages: got.messages,
        finish_reason: got.finish_reason.filter(|_| error.is_none()),
        server_prompt_tokens: usage.map(|u| u.prompt_tokens),
        server_queue_ms: usage.map(|u| u.queue_ms),
        server_ttft_ms: usage.map(|u| u.time_to_first_token_ms),
        server_total_ms: usage.map(|u| u.total_ms),
        error,
        itl_ms: inter_token_gaps(&got.arrivals),
    }
}

/// The canonical name of a gRPC status code (`"UNAVAILABLE"`, ...).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Runs `follow` for at most `timeout`: its error, or `DEADLINE_EXCEEDED` saying "`what` within
/// N s" when the time ran out; `None` when it ended well.
async fn within(
    timeout: Duration,
    follow: impl std::future::Future<Output = Result<(), RequestError>>,
    what: &str,
) -> Option<RequestError> {
    match tokio::time::timeout(timeout, follow).await {
        Err(_) => Some(RequestError {
            code: "DEADLINE_EXCEEDED".into(),
            message: format!("{what} within {} s (--timeout-secs)", timeout.as_secs()),
        }),
        Ok(Err(error)) => Some(error),
        Ok(Ok(())) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn code_names_are_canonical() {
        assert_eq!(code_name(tonic::Code::Unavailable), "UNAVAILABLE");
        assert_eq!(code_name(tonic::Code::InvalidArgument), "INVALID_ARGUMENT");
        assert_eq!(
            code_name(tonic::Code::ResourceExhausted),
            "RESOURCE_EXHAUSTED"
        );
    }

    #[test]
    fn context_check() {
        let args = BenchArgs::try_parse_from([
            "bench",
            "--prompt-tokens",
            "100",
            "--prompt-tokens-max",
            "200",
            "--max-new-tokens",
            "50",
        ])
        .unwrap();
        let info = |ctx| ModelInfoResponse {
            max_context_tokens: ctx,
            ..Default::default()
        };
        assert!(check_fits(&args, &info(250)).is_ok());
        assert!(check_fits(&args, &info(249)).is_err());
    }
}
