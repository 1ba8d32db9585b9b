//! One `Generate` call from validation to the last streamed message: tokenize (or render the chat
//! template), admit (send to a worker or queue, [`crate::pool`]), then turn each token into text
//! deltas through the incremental detokenizer and the stop-string matcher, and finish with the reason
//! and usage.
//!
//! The detokenizer and stop-string state live here, in the request's task, while the tokens come
//! from a [`Session`] that fails over between workers: a lost worker costs the client nothing.
//! The call's gRPC deadline is enforced here too: when it passes, the request is cancelled on its
//! worker (or leaves the queue) and the stream ends with [`RouteError::DeadlineExceeded`].
//!
//! Each sequence is admitted for its caller ([`Caller`]): its tenant's quotas first
//! ([`crate::tenants::quota`], the [`Lease`] held until the stream ends), then the pool's queue in
//! the request's priority class; each generated token is charged to the tenant's fair-share counter
//! as it streams ([`crate::admission`]).
//!
//! A client that stops reading holds back only its own stream: each sequence buffers at most
//! [`RESPONSE_BUFFER`] messages for its client (beside the HTTP/2 window of its stream); when they
//! stay full for the pool's `slow_client_timeout` the request is cancelled on its worker (its KV
//! blocks freed) and the stream ends with [`RouteError::ClientTooSlow`], which the last slot is
//! kept for. As soon as the buffer is full the worker holds the request ([`Session::hold`]: out of
//! its batch, generating nothing) until the client reads again ([`Session::resume`]), so a stuck
//! stream never costs the batch of others any step time, and the tokens waiting in the request's
//! event channel are at most those of the step or two in flight when the hold arrived.
//!
//! Errors are [`RouteError`]s throughout; each front maps them to its transport.

use std::sync::Arc;
use std::time::Instant;

use inference_proto::public::{
    FinishReason, GenerateRequest, GenerateResponse, PromptToken, Token, TopLogprob, Usage,
};
use inference_proto::worker::{
    AddRequest, PromptTokenLogprob, StopReason, TokenLogprob, TokenOutput,
};
use structured_output::tool_call::ToolSyntax;
use tokenizer::IncrementalDetokenizer;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tracing::Instrument as _;

use crate::admission::Placement;
use crate::model_context::ModelContext;
use crate::pool::{ServedModel, Session, WorkerPool};
use crate::request::GenerationRequest;
use crate::route_error::RouteError;
use crate::stop::StopMatcher;
use crate::tenants::quota::{CallPart, Lease};
use crate::tenants::Caller;
use crate::tool_request::ToolRequest;
use crate::validation::{check_request, sampling_params, validate, RequestLimits, ValidRequest};

/// Messages one sequence's stream holds for its client; the last slot is kept for the
/// [`RouteError::ClientTooSlow`] that ends a stream whose client stopped reading.
pub const RESPONSE_BUFFER: usize = 64;

/// Messages sent to the client of one `Generate` call.
pub type ResponseSender = mpsc::Sender<Result<GenerateResponse, RouteError>>;

/// The messages of one admitted sequence, in order; the last one carries `finish_reason` and
/// `usage`, or is an error. Dropping it cancels the sequence on its worker within a step.
pub type ResponseReceiver = mpsc::Receiver<Result<GenerateResponse, RouteError>>;

/// What one call brings to each of its sequences.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// When the call arrived (usage times count from it).
    pub arrival: Instant,
    /// When it must end ([`RouteError::DeadlineExceeded`]); `None`: no deadline.
    pub deadline: Option<Instant>,
    /// Who calls: tenant, priority, quotas.
    pub caller: Caller,
}

/// A gRPC `Generate` call once admitted.
#[derive(Debug)]
pub struct Started {
    /// The channel its responses arrive on.
    pub responses: ResponseReceiver,
    /// For a request whose tool calls are parsed (`tools` with a choice other than NONE): the
    /// served model's call syntax, which the gRPC edge splits the text with
    /// ([`crate::tool_call_stream`]).
    pub tool_calls: Option<ToolSyntax>,
}

/// Validates `req` (a gRPC `Generate` call), admits it for `call` and returns the channel its
/// responses arrive on.
///
/// Errors (before any message is streamed): those of [`prepare`] and [`launch`].
pub async fn start(
    pool: &Arc<WorkerPool>,
    limits: &RequestLimits,
    req: GenerateRequest,
    call: &CallContext,
) -> Result<Started, RouteError> {
    let requested = req.model.clone();
    let req = GenerationRequest::try_from(req)?;
    let parses_calls = req.tools.as_ref().is_some_and(ToolRequest::parses_calls);
    let (model, valid) = prepare(pool, limits, requested.as_deref(), req).await?;
    let request_id = valid.request_id.clone().unwrap_or_else(new_request_id);
    let tool_calls = parses_calls.then_some(model.context.tool_syntax);
    let responses = launch(
        pool,
        model,
        &valid,
        valid.choice_seed(0),
        request_id,
        call,
        CallPart::First,
    )?;
    Ok(Started {
        responses,
        tool_calls,
    })
}

/// A fresh request id (16 hex digits).
pub fn new_request_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Runs [`validate`] for the model the request names (`requested`, the request's `model`; `None`:
/// the default model, see [`crate::model_choice`]) on a blocking thread (tokenization and
/// chat-template rendering stay off the async runtime's threads).
///
/// Errors: [`RouteError::Invalid`]; [`RouteError::Model`] for a model that is not served;
/// [`RouteError::NoWorkersKnown`] / [`RouteError::NoWorkerReady`] while no worker has described a
/// model (after the checks that need no model, so bad input is reported as such either way).
pub async fn prepare(
    pool: &Arc<WorkerPool>,
    limits: &RequestLimits,
    requested: Option<&str>,
    req: GenerationRequest,
) -> Result<(Arc<ServedModel>, ValidRequest), RouteError> {
    let model = match pool.resolve_model(requested) {
        Ok(model) => model,
        Err(e) => {
            check_request(&req, limits)?;
            return Err(e);
        }
    };
    let limits = limits.clone();
    let context = model.context.clone();
    let span = tracing::Span::current();
    let valid =
        tokio::task::spawn_blocking(move || span.in_scope(|| validate(req, &context, &limits)))
            .await
            .map_err(|e| RouteError::Internal(format!("request validation failed: {e}")))??;
    Ok((model, valid))
}

/// Admits one sequence of `valid` with sampler `seed` for `call` and streams it: the returned
/// channel gets one message per engine step. Several calls with the same prompt (the choices of an
/// OpenAI `n`) share its KV blocks through the workers' prefix cache and the pool's prefix
/// affinity; the call counts once against its tenant's call quotas (`part`: see
/// [`crate::tenants::quota`]), and each choice reserves its own tokens.
///
/// Errors: [`RouteError::Quota`] (or [`RouteError::Invalid`] for a request larger than the
/// tenant's whole token quota) from the tenant's quotas; those of [`WorkerPool::admit`] (no worker
/// ready, admission queue or the tenant's share of it full).
pub fn launch(
    pool: &Arc<WorkerPool>,
    served: Arc<ServedModel>,
    valid: &ValidRequest,
    seed: u64,
    request_id: String,
    call: &CallContext,
    part: CallPart,
) -> Result<ResponseReceiver, RouteError> {
    let prompt_tokens = valid.prompt_ids.len() as u32;
    let caller = &call.caller;
    let tenant = &caller.tenant;
    let lease = caller.quotas.acquire(
        tenant,
        part,
        prompt_tokens.into(),
        valid.max_new_tokens.into(),
        Instant::now(),
    )?;
    let request = AddRequest {
        request_id: String::new(),
        prompt_ids: valid.prompt_ids.clone(),
        sampling: Some(sampling_params(&valid.sampling, seed)),
        max_new_tokens: valid.max_new_tokens,
        stop_token_ids: valid.stop_token_ids.clone(),
        generated_ids: Vec::new(),
        trace_context: observability::propagation::current_context(),
        constraint: valid.constraint.clone(),
        priority: caller.priority,
        cache_salt: caller.cache_salt.clone(),
        tenant: tenant.name.to_string(),
        tenant_weight: tenant.weight,
        prompt_logprobs: valid.prompt_logprobs,
        speculation: valid.speculation,
    };
    let placement = Placement {
        tenant: tenant.name.clone(),
        weight: tenant.weight,
        priority: caller.priority,
        max_queued: tenant.limits.max_queued,
    };
    let ticket = match pool.admit(&served, request.clone(), placement) {
        Ok(ticket) => ticket,
        Err(e) => {
            lease.refund();
            return Err(e);
        }
    };
    let session = Session::new(pool.clone(), request, ticket);
    let model = served.context.clone();
    tracing::debug!(%request_id, prompt_tokens, tenant = &*tenant.name, priority = caller.priority, "admitted");
    let (tx, rx) = mpsc::channel(RESPONSE_BUFFER);
    let stream = TokenStream {
        detokenizer: IncrementalDetokenizer::new(
            model.tokenizer.clone(),
            !valid.include_special_tokens,
        ),
        stops: StopMatcher::new(valid.stop.clone()),
        model,
        request_id,
        seed,
        prompt_tokens,
        generated: 0,
        arrival: call.arrival,
        service: Service {
            pool: pool.clone(),
            tenant: tenant.name.clone(),
            lease,
        },
        dispatched_at: None,
        failovers: 0,
        first_token_at: None,
        prompt: valid.prompt_logprobs.map(|_| valid.prompt_ids.clone()),
        drafts: (0, 0),
        earlier_drafts: (0, 0),
    };
    tokio::spawn(stream.run(session, tx, call.deadline).in_current_span());
    Ok(rx)
}

/// Slots a held stream's client must free before its request resumes: half the buffer, so that a
/// client reading slower than the worker generates makes one hold and one resume per half buffer,
/// not one per message (each resume recomputes the sequence's last partial KV block).
const RESUME_AFTER: usize = RESPONSE_BUFFER / 2;

/// Waits, while the request is held, until the client has freed [`RESUME_AFTER`] slots of `tx`,
/// each within `timeout` of the one before; returns their permits (none when the client went
/// away), or `Err` when the client read nothing for `timeout` (the permits are given back, so
/// the error fits).
async fn drain(
    tx: &ResponseSender,
    timeout: std::time::Duration,
) -> Result<Vec<mpsc::Permit<'_, Result<GenerateResponse, RouteError>>>, ()> {
    let mut permits = Vec::with_capacity(RESUME_AFTER);
    while permits.len() < RESUME_AFTER {
        match tokio::time::timeout(timeout, tx.reserve()).await {
            Ok(Ok(permit)) => permits.push(permit),
            Ok(Err(_)) => return Ok(Vec::new()),
            Err(_) => return Err(()),
        }
    }
    Ok(permits)
}

/// The service one sequence receives, charged to its tenant as tokens stream: each token goes to
/// the tenant's fair-share counter and uses up the quota reservation (the rest is given back when
/// the stream ends, by the [`Lease`]).
struct Service {
    pool: Arc<WorkerPool>,
    tenant: Arc<str>,
    lease: Lease,
}

impl Service {
    fn on_token(&mut self) {
        self.pool.charge(&self.tenant, 1);
        self.lease.on_generated(1);
    }
}

/// State of one response stream.
struct TokenStream {
    model: Arc<ModelContext>,
    detokenizer: IncrementalDetokenizer,
    stops: StopMatcher,
    request_id: String,
    seed: u64,
    prompt_tokens: u32,
    generated: u32,
    arrival: Instant,
    service: Service,
    /// When the request first reached a worker.
    dispatched_at: Option<Instant>,
    /// Times the request moved to another worker.
    failovers: u32,
    first_token_at: Option<Instant>,
    /// The prompt's ids while its scored tokens are still to be sent (requests with prompt
    /// logprobs, until the first message).
    prompt: Option<Vec<u32>>,
    /// Speculative decoding: (draft, accepted) tokens reported by the current worker so far, and
    /// by the workers before it (a failover restarts the worker's counts).
    drafts: (u32, u32),
    earlier_drafts: (u32, u32),
}

impl TokenStream {
    /// Streams until the request finishes, fails, passes its deadline or the client goes away.
    /// Returning drops `session`, which cancels the request on its worker if it is still running
    /// there (or takes it out of the queue).
    async fn run(mut self, mut session: Session, tx: ResponseSender, deadline: Option<Instant>) {
        let expired = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expired);
        loop {
            let event = tokio::select! {
                event = session.next() => event,
                _ = tx.closed() => {
                    tracing::debug!(request_id = %self.request_id, "client went away; cancelling");
                    return;
                }
                () = &mut expired => {
                    tracing::debug!(request_id = %self.request_id, "deadline passed; cancelling");
                    let _ = tx.send(Err(RouteError::DeadlineExceeded {
                        elapsed_ms: self.arrival.elapsed().as_millis(),
                        generated: self.generated,
                    })).await;
                    return;
                }
            };
            self.dispatched_at = session.first_dispatch();
            self.failovers = session.failovers();
            let message = event.map(|token| {
                let mut message = self.on_token(token);
                if let Some(prompt) = self.prompt.take() {
                    message.prompt_tokens =
                        prompt_tokens(&self.model, &prompt, session.take_prompt_scores());
                }
                message
            });
            let last = message.as_ref().map_or(true, |m| {
                m.finish_reason != FinishReason::Unspecified as i32
            });
            // Sent only while a second slot is free, so that the error below always fits. A full
            // buffer holds the request on its worker until the client has drained half of it.
            let slow_client_timeout = self.service.pool.settings().slow_client_timeout;
            let drained = match tx.try_reserve_many(2) {
                Ok(mut permits) => Ok(vec![permits.next().expect("two permits")]),
                Err(TrySendError::Closed(())) => return, // the client went away
                Err(TrySendError::Full(())) => {
                    session.hold();
                    let drained = drain(&tx, slow_client_timeout).await;
                    if drained.as_ref().is_ok_and(|permits| !permits.is_empty()) {
                        session.resume();
                    }
                    drained
                }
            };
            let permit = match drained {
                Ok(mut permits) => match permits.pop() {
                    Some(permit) => permit,
                    None => return, // the client went away
                },
                Err(()) => {
                    tracing::info!(
                        request_id = %self.request_id,
                        generated = self.generated,
                        "the client read nothing for slow_client_timeout_ms; cancelling"
                    );
                    let _ = tx.try_send(Err(RouteError::ClientTooSlow {
                        waited_ms: slow_client_timeout.as_millis(),
                        buffered: RESPONSE_BUFFER - 1,
                        generated: self.generated,
                    }));
                    return;
                }
            };
            permit.send(message);
            if last {
                return;
            }
        }
    }

    /// Turns one worker token into the client message for this step.
    fn on_token(&mut self, token: TokenOutput) -> GenerateResponse {
        let now = Instant::now();
        self.first_token_at.get_or_insert(now);
        self.generated += 1;
        self.service.on_token();
        let drafts = (token.draft_tokens, token.accepted_draft_tokens);
        if drafts.0 < self.drafts.0 {
            // Another worker's counts: keep the earlier workers' sums.
            self.earlier_drafts.0 += self.drafts.0;
            self.earlier_drafts.1 += self.drafts.1;
        }
        self.drafts = drafts;
        let tokenizer = &self.model.tokenizer;
        let id = token.token_id;
        let ended_by_eos = token.finished && token.stop_reason() == StopReason::StopToken;
        let mut text = String::new();
        let mut finish = None;
        let mut stop_sequence = String::new();
        // The EOS token's text is never emitted.
        if !ended_by_eos {
            let outcome = self.stops.push(&self.detokenizer.push(id));
            text = outcome.emit;
            if let Some(stop) = outcome.matched {
                finish = Some(FinishReason::StopSequence);
                stop_sequence = stop;
            }
        }
        if finish.is_none() && token.finished {
            let outcome = self.stops.push(&self.detokenizer.finish());
            text.push_str(&outcome.emit);
            if let Some(stop) = outcome.matched {
                finish = Some(FinishReason::StopSequence);
                stop_sequence = stop;
            } else {
                text.push_str(&self.stops.finish());
                finish = Some(self.worker_finish_reason(token.stop_reason()));
            }
        }
        let mut response = GenerateResponse {
            text,
            tokens: vec![Token {
                id,
                text: tokenizer.token_text(id).unwrap_or_default(),
                logprob: token.logprob,
                special: tokenizer.is_special(id),
                top_logprobs: top_logprobs(&self.model, &token.top_logprobs),
            }],
            request_id: self.request_id.clone(),
            ..Default::default()
        };
        if let Some(reason) = finish {
            response.finish_reason = reason as i32;
            response.stop_sequence = stop_sequence;
            response.seed = self.seed;
            response.usage = Some(self.usage(now));
        }
        response
    }

    fn worker_finish_reason(&self, reason: StopReason) -> FinishReason {
        let total = self.prompt_tokens + self.generated;
        match reason {
            StopReason::StopToken => FinishReason::EosToken,
            StopReason::ContextFull => FinishReason::ContextLength,
            StopReason::ConstraintComplete => FinishReason::ConstraintComplete,
            // The default budget is capped by the context; when that cap is what bound, say so.
            StopReason::Length if total >= self.model.context_length => FinishReason::ContextLength,
            StopReason::Length | StopReason::Unspecified => FinishReason::MaxNewTokens,
        }
    }

    fn usage(&self, now: Instant) -> Usage {
        let ms = |from: Instant, to: Instant| to.duration_since(from).as_secs_f64() * 1e3;
        Usage {
            prompt_tokens: self.prompt_tokens,
            generated_tokens: self.generated,
            queue_ms: ms(self.arrival, self.dispatched_at.unwrap_or(now)),
            time_to_first_token_ms: ms(self.arrival, self.first_token_at.unwrap_or(now)),
            total_ms: ms(self.arrival, now),
            failovers: self.failovers,
            draft_tokens: self.earlier_drafts.0 + self.drafts.0,
            accepted_draft_tokens: self.earlier_drafts.1 + self.drafts.1,
        }
    }
}

/// The public message's prompt tokens for the `prompt` ids and their `scores` by prompt index
/// (the first token has none; a missing score leaves `logprob` unset).
fn prompt_tokens(
    model: &ModelContext,
    prompt: &[u32],
    scores: Vec<Option<PromptTokenLogprob>>,
) -> Vec<PromptToken> {
    let tokenizer = &model.tokenizer;
    let mut scores = scores.into_iter();
    prompt
        .iter()
        .map(|&id| {
            let score = scores.next().flatten();
            PromptToken {
                id,
                text: tokenizer.token_text(id).unwrap_or_default(),
                logprob: score.as_ref().map(|s| s.logprob),
                special: tokenizer.is_special(id),
                top_logprobs: score
                    .map(|s| top_logprobs(model, &s.top_logprobs))
                    .unwrap_or_default(),
            }
        })
        .collect()
}

/// The public alternatives for the worker's.
fn top_logprobs(model: &ModelContext, alternatives: &[TokenLogprob]) -> Vec<TopLogprob> {
    alternatives
        .iter()
        .map(|alt| TopLogprob {
            id: alt.token_id,
            text: model.tokenizer.token_text(alt.token_id).unwrap_or_default(),
            logprob: alt.logprob,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A response channel with every slot but one taken, as the stream loop leaves it when full.
    fn full() -> (
        ResponseSender,
        mpsc::Receiver<Result<GenerateResponse, RouteError>>,
    ) {
        let (tx, rx) = mpsc::channel(RESPONSE_BUFFER);
        for _ in 0..RESPONSE_BUFFER - 1 {
            tx.try_send(Ok(GenerateResponse::default())).unwrap();
        }
        (tx, rx)
    }

    #[tokio::test]
    async fn a_held_stream_resumes_only_after_its_client_read_half_the_buffer() {
        let (tx, mut rx) = full();
        let reader = tokio::spawn(async move {
            // One message every 5 ms: within the timeout each time.
            for _ in 0..RESUME_AFTER {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let _ = rx.recv().await.expect("a message");
            }
            rx
        });
        let started = std::time::Instant::now();
        let permits = drain(&tx, Duration::from_secs(1)).await.unwrap();
        assert_eq!(permits.len(), RESUME_AFTER);
        // The first permit was free at once; the other RESUME_AFTER - 1 waited for a read each.
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(5 * (RESUME_AFTER as u64 - 1)),
            "{waited:?}"
        );
        drop(permits);
        drop(reader.await.unwrap());
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_while_held_times_out_and_the_error_fits() {
        let (tx, mut rx) = full();
        // The client reads 3 messages, then nothing.
        for _ in 0..3 {
            let _ = rx.recv().await.expect("a message");
        }
        assert!(drain(&tx, Duration::from_millis(50)).await.is_err());
        // The permits taken while waiting were given back: the error has a slot.
        assert!(tx.try_send(Ok(GenerateResponse::default())).is_ok());
    }

    #[tokio::test]
    async fn a_client_gone_while_held_gives_no_permit() {
        let (tx, rx) = full();
        drop(rx);
        // Duration::MAX: `slow_client_timeout_ms = 0`, never cancel.
        assert!(drain(&tx, Duration::MAX).await.unwrap().is_empty());
    }
}
