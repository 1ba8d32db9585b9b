//! One request across workers: failover that loses nothing.
//!
//! A [`Session`] keeps the request as first sent (prompt ids, sampling parameters with the seed,
//! `max_new_tokens`, stop ids) and every token id received so far. When its worker is lost (the
//! stream broke, the link was removed, or the worker handed the request back with `UNAVAILABLE`), it
//! queues the same request again, ahead of new ones, with `generated_ids` set to the tokens received:
//! the next worker recomputes them as context, counts them against `max_new_tokens` and continues the
//! sampler's random stream at that index, so greedy and seeded requests continue exactly as an
//! uninterrupted run would. Tokens are passed on by their index, so none is repeated or skipped.
//!
//! The caller (the response stream, which holds the detokenizer and stop-string state) sees only a
//! continuous sequence of tokens. It gets an error from the pool only when no worker became ready
//! within the failover timeout ([`RouteError::NoWorkerLeft`]), or after `max_failovers` failovers of
//! this request ([`RouteError::FailoversExhausted`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use inference_proto::worker::{AddRequest, PromptTokenLogprob, TokenOutput};
use tracing::Instrument as _;

use super::{Dispatched, Ticket, WorkerEvent, WorkerPool};
use crate::route_error::RouteError;

/// A request's life across workers.
pub struct Session {
    pool: Arc<WorkerPool>,
    /// The id of the request's model: a failover goes only to its workers.
    model: Arc<str>,
    request: AddRequest,
    generated: Vec<u32>,
    ticket: Option<Ticket>,
    current: Option<Dispatched>,
    failovers: u32,
    first_dispatch: Option<Instant>,
    /// Why the last worker was lost (for the error when no worker is left).
    lost_reason: Option<String>,
    /// When the last worker was lost, until the first token after it arrives.
    lost_at: Option<Instant>,
    /// The `generation` span of the current worker attempt (traces); closes when the attempt ends.
    attempt_span: Option<tracing::Span>,
    /// Prompt logprobs received, by prompt index (index 0 never has one); a worker that takes
    /// over before the first token scores the prompt again and overwrites them.
    prompt_scores: Vec<Option<PromptTokenLogprob>>,
}

impl Session {
    /// A session for `request`, admitted as `ticket`.
    pub fn new(pool: Arc<WorkerPool>, request: AddRequest, ticket: Ticket) -> Self {
        Self {
            pool,
            model: ticket.model().clone(),
            request,
            generated: Vec::new(),
            ticket: Some(ticket),
            current: None,
            failovers: 0,
            first_dispatch: None,
            lost_reason: None,
            lost_at: None,
            attempt_span: None,
            prompt_scores: Vec::new(),
        }
    }

    /// When the request first reached a worker.
    pub fn first_dispatch(&self) -> Option<Instant> {
        self.first_dispatch
    }

    /// How many times the request moved to another worker.
    pub fn failovers(&self) -> u32 {
        self.failovers
    }

    /// The scored prompt tokens received so far, by prompt index (`None` at index 0 and where none
    /// came), taken once: call it at the first token, when a request with prompt logprobs has
    /// all of them.
    pub fn take_prompt_scores(&mut self) -> Vec<Option<PromptTokenLogprob>> {
        std::mem::take(&mut self.prompt_scores)
    }

    /// The worker serving the request now, if any.
    pub fn worker_address(&self) -> Option<&str> {
        self.current.as_ref().map(Dispatched::worker_address)
    }

    /// Flow control: the client stopped reading; the current worker (if any) holds the request
    /// until [`Self::resume`]. A failover in between starts unheld on the next worker.
    pub fn hold(&self) {
        if let Some(current) = &self.current {
            current.hold();
        }
    }

    /// Flow control: the client reads again.
    pub fn resume(&self) {
        if let Some(current) = &self.current {
            current.resume();
        }
    }

    /// The next generated token (the last one has `finished` set), waiting in the queue or for a
    /// failover first when needed.
    ///
    /// Errors: the worker's own error for the request ([`RouteError::Worker`]), or one that says no
    /// worker is left to continue it (see the module docs).
    pub async fn next(&mut self) -> Result<TokenOutput, RouteError> {
        loop {
            if self.current.is_none() {
                let ticket = self.ticket.as_mut().ok_or_else(|| {
                    RouteError::Internal(
                        "the request has neither a worker nor a place in the queue".into(),
                    )
                })?;
                let queue_span = tracing::info_span!("queue", resumed_at = self.generated.len());
                let dispatched = ticket
                    .wait()
                    .instrument(queue_span)
                    .await
                    .map_err(|cause| self.no_worker(cause))?;
                self.ticket = None;
                self.first_dispatch.get_or_insert_with(Instant::now);
                tracing::debug!(
                    worker = dispatched.worker_address(),
                    resumed_at = self.generated.len(),
                    "dispatched"
                );
                self.attempt_span = Some(tracing::info_span!(
                    "generation",
                    worker = dispatched.worker_address(),
                    resumed_at = self.generated.len()
                ));
                self.current = Some(dispatched);
            }
            let current = self.current.as_mut().expect("dispatched");
            let reason = match current.events.recv().await {
                Some(WorkerEvent::Token(token)) => {
                    if (token.index as usize) < self.generated.len() {
                        continue; // already passed on (cannot happen with a well-behaved worker)
                    }
                    self.generated.push(token.token_id);
                    if let Some(lost_at) = self.lost_at.take() {
                        tracing::info!(
                            worker = current.worker_address(),
                            stall_ms = lost_at.elapsed().as_millis() as u64,
                            carried_over = self.generated.len() - 1,
                            "request resumed after failover"
                        );
                    }
                    return Ok(token);
                }
                Some(WorkerEvent::Prompt(scored)) => {
                    let first = scored.first_index as usize;
                    let end = first + scored.tokens.len();
                    if self.prompt_scores.len() < end {
                        self.prompt_scores.resize(end, None);
                    }
                    for (slot, token) in self.prompt_scores[first..].iter_mut().zip(scored.tokens) {
                        *slot = Some(token);
                    }
                    continue;
                }
                Some(WorkerEvent::Failed(failure)) => return Err(failure.into()),
                Some(WorkerEvent::Lost(reason)) => reason,
                None => format!("worker {} dropped the request", current.worker_address()),
            };
            self.fail_over(reason)?;
        }
    }

    /// Queues the request again with the tokens generated so far.
    fn fail_over(&mut self, reason: String) -> Result<(), RouteError> {
        self.current = None;
        self.attempt_span = None;
        let counters = self.pool.counters();
        if self.failovers >= self.pool.settings().max_failovers {
            counters.failovers_exhausted.fetch_add(1, Ordering::Relaxed);
            return Err(RouteError::FailoversExhausted {
                reason,
                failovers: self.failovers,
                max_failovers: self.pool.settings().max_failovers,
                generated: self.generated.len(),
            });
        }
        self.failovers += 1;
        counters.failovers.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            generated = self.generated.len(),
            failover = self.failovers,
            "{reason}; failing over to another worker"
        );
        let mut request = self.request.clone();
        request.generated_ids = self.generated.clone();
        if !self.generated.is_empty() {
            // The prompt's scores went out with the first token.
            request.prompt_logprobs = None;
        }
        self.ticket = Some(self.pool.resume(&self.model, request));
        self.lost_reason = Some(reason);
        self.lost_at.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// The error when waiting for a worker failed, with the failover context when there is one.
    fn no_worker(&self, cause: RouteError) -> RouteError {
        let Some(reason) = &self.lost_reason else {
            return cause;
        };
        self.pool
            .counters()
            .failovers_exhausted
            .fetch_add(1, Ordering::Relaxed);
        RouteError::NoWorkerLeft {
            reason: reason.clone(),
            cause: Box::new(cause),
            generated: self.generated.len(),
        }
    }
}
