//! One `Generate` call from validation to the last streamed message: tokenize (or render the chat
//! template), admit (send to a worker or queue, [`crate::pool`]), then turn each token into text
//! deltas through the incremental detokenizer and the stop-string matcher, and finish with the reason
//! and usage.
//!
//! The detokenizer and stop-string state live here, in the request's task, while the tokens come
//! from a [`Session`] that fails over between workers: a lost worker costs the client nothing.
//! The call's gRPC deadline is enforced here too: when it passes, the request is cancelled on its
//! worker (or leaves the queue) and the stream ends with `DEADLINE_EXCEEDED`.

use std::sync::Arc;
use std::time::Instant;

use inference_proto::public::{
    FinishReason, GenerateRequest, GenerateResponse, Token, TopLogprob, Usage,
};
use inference_proto::worker::{AddRequest, StopReason, TokenOutput};
use tokio::sync::mpsc;
use tonic::Status;
use tracing::Instrument as _;

use crate::config::Limits;
use crate::detokenizer::IncrementalDetokenizer;
use crate::model_context::ModelContext;
use crate::pool::{no_worker_status, Session, WorkerPool};
use crate::stop::StopMatcher;
use crate::validation::{check_constraint, check_prompt, check_request, check_vocab};

/// Messages sent to the client of one `Generate` call.
pub type ResponseSender = mpsc::Sender<Result<GenerateResponse, Status>>;

/// Validates `req`, admits it and returns the channel its responses arrive on. `deadline` is when
/// the call's gRPC deadline passes.
///
/// Errors (before any message is streamed): `INVALID_ARGUMENT` for bad input, `UNAVAILABLE` when no
/// worker is ready, `RESOURCE_EXHAUSTED` when the admission queue is full.
pub async fn start(
    pool: &Arc<WorkerPool>,
    limits: &Limits,
    req: GenerateRequest,
    deadline: Option<Instant>,
) -> Result<mpsc::Receiver<Result<GenerateResponse, Status>>, Status> {
    let arrival = Instant::now();
    let sampling = check_request(&req, limits)?;
    let model = pool
        .model()
        .ok_or_else(|| no_worker_status(pool.configured_workers()))?;
    let prompt_ids = tracing::info_span!("tokenize").in_scope(|| encode_prompt(&model, &req))?;
    let max_new_tokens = check_prompt(
        prompt_ids.len(),
        req.max_new_tokens,
        model.context_length,
        limits,
    )?;
    check_vocab(&sampling, model.vocab_size)?;
    if req.constraint.is_some() {
        // Compiling takes milliseconds (and waits for the model's compiler right after start).
        let (req, model) = (req.clone(), model.clone());
        let span = tracing::info_span!("constraint");
        tokio::task::spawn_blocking(move || span.in_scope(|| check_constraint(&req, &model)))
            .await
            .map_err(|e| Status::internal(format!("checking the constraint failed: {e}")))??;
    }
    let seed = req.seed.unwrap_or_else(rand::random);
    let stop_token_ids = if req.ignore_eos {
        Vec::new()
    } else {
        model.eos_token_ids.clone()
    };
    let prompt_tokens = prompt_ids.len() as u32;
    let request = AddRequest {
        request_id: String::new(),
        prompt_ids,
        sampling: Some(sampling.to_wire(seed)),
        max_new_tokens,
        stop_token_ids,
        generated_ids: Vec::new(),
        trace_context: observability::propagation::current_context(),
        constraint: req.constraint.clone(),
    };
    let ticket = pool.admit(request.clone())?;
    let session = Session::new(pool.clone(), request, ticket);
    let request_id = req
        .request_id
        .clone()
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| format!("{:016x}", rand::random::<u64>()));
    tracing::debug!(%request_id, prompt_tokens, "admitted");
    let (tx, rx) = mpsc::channel(64);
    let stream = TokenStream {
        detokenizer: IncrementalDetokenizer::new(
            model.tokenizer.clone(),
            !req.include_special_tokens,
        ),
        stops: StopMatcher::new(req.stop.clone()),
        model,
        request_id,
        seed,
        prompt_tokens,
        generated: 0,
        arrival,
        dispatched_at: None,
        failovers: 0,
        first_token_at: None,
    };
    tokio::spawn(stream.run(session, tx, deadline).in_current_span());
    Ok(rx)
}

/// Renders the chat template for `messages`, or takes `prompt` as is, and tokenizes it.
///
/// A raw `prompt` parses special-token text (`<|im_start|>` becomes the control token) unless
/// `prompt_as_plain_text` is set. Chat `messages` are rendered as pieces: special tokens count only
/// where the template writes them, and each message's content is plain text; a role holding
/// special-token text is `INVALID_ARGUMENT` (the template writes roles as its own text).
fn encode_prompt(model: &ModelContext, req: &GenerateRequest) -> Result<Vec<u32>, Status> {
    if req.messages.is_empty() {
        let tokenizer = &model.tokenizer;
        let ids = if req.prompt_as_plain_text {
            tokenizer.encode_plain(&req.prompt, true)
        } else {
            tokenizer.encode(&req.prompt, true)
        };
        return ids
            .map_err(|e| Status::invalid_argument(format!("cannot tokenize the prompt: {e}")));
    }
    let template = model.chat_template.as_ref().ok_or_else(|| {
        Status::invalid_argument(
            "this model has no chat template; send `prompt` instead of `messages`",
        )
    })?;
    // A role is written into the template's own text, where special tokens count: refuse one
    // that would add chat structure.
    if let Some(i) = req
        .messages
        .iter()
        .position(|m| model.tokenizer.contains_special_text(&m.role))
    {
        return Err(Status::invalid_argument(format!(
            "messages[{i}].role holds special-token text"
        )));
    }
    let pieces = template
        .render_pieces(&req.messages, true)
        .map_err(|e| Status::invalid_argument(format!("cannot render the chat template: {e}")))?;
    model
        .tokenizer
        .encode_pieces(&pieces)
        .map_err(|e| Status::invalid_argument(format!("cannot tokenize the chat prompt: {e}")))
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
    /// When the request first reached a worker.
    dispatched_at: Option<Instant>,
    /// Times the request moved to another worker.
    failovers: u32,
    first_token_at: Option<Instant>,
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
                    let _ = tx.send(Err(Status::deadline_exceeded(format!(
                        "the call's deadline passed after {} ms and {} generated tokens; the \
                         request was cancelled",
                        self.arrival.elapsed().as_millis(),
                        self.generated
                    )))).await;
                    return;
                }
            };
            self.dispatched_at = session.first_dispatch();
            self.failovers = session.failovers();
            let message = event.map(|token| self.on_token(token));
            let last = message.as_ref().map_or(true, |m| {
                m.finish_reason != FinishReason::Unspecified as i32
            });
            if tx.send(message).await.is_err() || last {
                return;
            }
        }
    }

    /// Turns one worker token into the client message for this step.
    fn on_token(&mut self, token: TokenOutput) -> GenerateResponse {
        let now = Instant::now();
        self.first_token_at.get_or_insert(now);
        self.generated += 1;
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
                top_logprobs: token
                    .top_logprobs
                    .iter()
                    .map(|alt| TopLogprob {
                        id: alt.token_id,
                        text: tokenizer.token_text(alt.token_id).unwrap_or_default(),
                        logprob: alt.logprob,
                    })
                    .collect(),
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
        }
    }
}
