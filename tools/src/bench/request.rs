//! One request: built from its [`Planned`] for the [`Target`], sent, its stream followed to the
//! end under `--timeout-secs`, and summed up as a [`RequestRecord`].
//!
//! With `--worker` ([`super::direct`]) the request goes on the one `Generate` stream of that
//! worker as the `AddRequest` the router would send for it (same prompt ids, sampling, seed,
//! `max_new_tokens`, constraint, no stop ids with `ignore_eos`, else the worker's EOS ids); TTFT
//! runs from sending the Add to the arrival of the step message carrying its first token, ITL and
//! E2E from the arrivals of its step messages, under the same rules as through the router.
//!
//! A constrained request's output (its streamed text; with `--worker` its ids decoded with the
//! worker's tokenizer, special tokens skipped) is checked with the run's
//! [`OutputCheck`](super::constraint::OutputCheck) when it succeeds.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use inference_proto::public::{FinishReason, GenerateRequest};
use inference_proto::status::code_name;
use inference_proto::worker::{AddRequest, SamplingParams, StopReason};

use super::constraint::OutputCheck;
use super::direct::{Event, WorkerStream};
use super::openai::{self, Followed, OpenAiServer};
use super::plan::Planned;
use super::report::{inter_token_gaps, RequestError, RequestRecord};
use super::target::{RouterClient, Target};
use super::tenant_mix::TenantLoad;
use super::BenchArgs;

/// Counters the progress line reads.
#[derive(Debug, Default)]
pub struct Progress {
    /// Requests sent.
    pub sent: AtomicUsize,
    /// Requests ended (well or not).
    pub done: AtomicUsize,
    /// Requests failed.
    pub failed: AtomicUsize,
    /// Tokens received.
    pub tokens: AtomicU64,
}

/// What one request needs besides its plan.
pub struct Context<'a> {
    /// Its index in the phase.
    pub index: usize,
    /// The `request_id` to send.
    pub request_id: String,
    /// When the phase began.
    pub phase_start: Instant,
    /// The phase's counters.
    pub progress: &'a Progress,
    /// The checker of constrained outputs (with `--constraint`).
    pub check: Option<&'a OutputCheck>,
    /// Its tenant (with `--tenant-mix`): the key and priority it is sent with.
    pub tenant: Option<&'a TenantLoad>,
}

/// Sends `plan` to `target` with the sampling settings of `args` and follows it to its end.
pub async fn send(
    target: &Target,
    args: &BenchArgs,
    plan: &Planned,
    cx: Context<'_>,
) -> RequestRecord {
    let timeout = Duration::from_secs(args.timeout_secs);
    let constraint = args.constraint.as_ref().filter(|_| plan.constrained);
    cx.progress.sent.fetch_add(1, Ordering::Relaxed);
    let sent = Instant::now();
    let (got, error) = match target {
        Target::Router(clients) => {
            let request = GenerateRequest {
                prompt: plan.prompt.clone(),
                max_new_tokens: Some(plan.max_new_tokens),
                temperature: args.temperature,
                top_k: args.top_k,
                top_p: args.top_p,
                seed: Some(plan.seed),
                ignore_eos: plan.ignore_eos(args),
                request_id: Some(cx.request_id.clone()),
                constraint: constraint.map(|c| c.to_proto()),
                priority: cx.tenant.and_then(|t| t.priority),
                ..Default::default()
            };
            let client = &clients[cx.index % clients.len()];
            let key = cx.tenant.map(|t| t.key.as_str());
            follow_router(client, request, key, sent, timeout, cx.progress).await
        }
        Target::OpenAi(server) => {
            let mut body = openai::body(
                &server.model,
                &plan.prompt,
                plan.max_new_tokens,
                args.temperature,
                args.top_p,
                args.top_k,
                plan.seed,
                plan.ignore_eos(args),
            );
            if let Some(c) = constraint {
                c.add_to_openai_body(&mut body);
            }
            follow_openai(server, &body, sent, timeout, cx.progress).await
        }
        Target::Worker {
            stream,
            eos_token_ids,
            context_length,
            ..
        } => {
            // What the router sends the worker for the same GenerateRequest
            // (`router/src/request.rs`).
            let add = AddRequest {
                request_id: cx.request_id.clone(),
                prompt_ids: plan.ids.clone(),
                sampling: Some(SamplingParams {
                    temperature: args.temperature,
                    top_k: args.top_k,
                    top_p: args.top_p.unwrap_or(1.0),
                    seed: plan.seed,
                    ..Default::default()
                }),
                max_new_tokens: plan.max_new_tokens,
                stop_token_ids: if plan.ignore_eos(args) {
                    Vec::new()
                } else {
                    eos_token_ids.clone()
                },
                constraint: constraint.map(|c| c.to_proto()),
                ..Default::default()
            };
            follow_worker(
                stream,
                add,
                plan,
                sent,
                timeout,
                *context_length,
                cx.progress,
            )
            .await
        }
    };
    let e2e = ms(sent.elapsed());
    let mut got = got;
    if let (Target::Worker { tokenizer, .. }, true) = (target, plan.constrained) {
        got.text = tokenizer.tokenizer.decode(&got.ids, true);
    }
    let valid = match (cx.check, &error) {
        (Some(check), None) if plan.constrained => Some(check.accepts(&got.text)),
        _ => None,
    };
    record(plan, &cx, ms(sent - cx.phase_start), e2e, got, error, valid)
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
    /// The streamed text (router and OpenAI; with `--worker` decoded from `ids` when needed).
    text: String,
    /// The streamed token ids (`--worker`).
    ids: Vec<u32>,
}

/// Sends one request to the router and follows its stream to the end.
async fn follow_router(
    client: &RouterClient,
    request: GenerateRequest,
    key: Option<&str>,
    sent: Instant,
    timeout: Duration,
    progress: &Progress,
) -> (Received, Option<RequestError>) {
    let mut got = Received::default();
    let follow = async {
        let mut grpc = client.client.clone();
        let mut stream = grpc
            .generate(client.request_with_key(request, key))
            .await?
            .into_inner();
        while let Some(message) = stream.message().await? {
            let at = ms(sent.elapsed());
            got.messages += 1;
            got.text.push_str(&message.text);
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
    let error = error.or_else(|| {
        got.usage.is_none().then(|| RequestError {
            code: "INTERNAL".into(),
            message: "the stream ended without its final message (no usage)".into(),
        })
    });
    (got, error)
}

/// Sends one request to an OpenAI server (`--openai`) and follows its events to `[DONE]`.
async fn follow_openai(
    server: &OpenAiServer,
    body: &serde_json::Value,
    sent: Instant,
    timeout: Duration,
    progress: &Progress,
) -> (Received, Option<RequestError>) {
    let mut followed = Followed::default();
    let follow = openai::follow(server, body, sent, &mut followed, |k| {
        progress.tokens.fetch_add(k as u64, Ordering::Relaxed);
    });
    let error = within(timeout, follow, "no end of stream").await;
    let got = Received {
        messages: followed.messages,
        streamed_tokens: followed
            .completion_tokens
            .unwrap_or(followed.streamed_tokens),
        first_token_ms: followed.first_token_ms,
        arrivals: followed.arrivals,
        finish_reason: followed.finish_reason,
        usage: None,
        text: followed.text,
        ids: Vec::new(),
    };
    (got, error)
}

/// Sends one request on the worker's stream (`--worker`) and follows its tokens to the last.
/// Times are taken when the step message carrying the tokens arrived on the stream.
async fn follow_worker(
    stream: &WorkerStream,
    add: AddRequest,
    plan: &Planned,
    sent: Instant,
    timeout: Duration,
    context_length: u32,
    progress: &Progress,
) -> (Received, Option<RequestError>) {
    let request_id = add.request_id.clone();
    let mut got = Received::default();
    let follow = async {
        let mut events = stream.add(add).map_err(|why| RequestError {
            code: "UNAVAILABLE".into(),
            message: why.to_string(),
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
                    got.ids.extend(tokens.iter().map(|t| t.token_id));
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
                Event::Failed { code, message } => {
                    return Err(RequestError {
                        code: code_name(code).into(),
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
    // A request that did not finish may still be running on the worker.
    stream.close(&request_id, error.is_some());
    (got, error)
}

/// The record of one request that ended (`e2e`: ms from sent to its end; `valid`: whether its
/// constrained output satisfies the constraint), counted in the progress.
fn record(
    plan: &Planned,
    cx: &Context<'_>,
    sent_at_ms: f64,
    e2e: f64,
    got: Received,
    error: Option<RequestError>,
    valid: Option<bool>,
) -> RequestRecord {
    cx.progress.done.fetch_add(1, Ordering::Relaxed);
    if error.is_some() {
        cx.progress.failed.fetch_add(1, Ordering::Relaxed);
    }
    let usage = got.usage.filter(|_| error.is_none());
    RequestRecord {
        index: cx.index,
        tenant: cx.tenant.map(|t| t.name.clone()),
        prompt_tokens: plan.prompt_tokens,
        max_new_tokens: plan.max_new_tokens,
        seed: plan.seed,
        constrained: plan.constrained,
        output_valid: valid,
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
        server_draft_tokens: usage.map(|u| (u.draft_tokens, u.accepted_draft_tokens)),
        error,
        itl_ms: inter_token_gaps(&got.arrivals),
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
