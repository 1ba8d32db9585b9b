//! Runs the admitted choices of one request to the end: gathered into one response document, or
//! streamed as server-sent events (`data: {chunk}` lines, then `data: [DONE]`).
//!
//! Every choice is one sequence of [`crate::generate::launch`], so stop strings, holdback, UTF-8
//! and special tokens behave exactly as on gRPC. Dropping the response (the client went away)
//! drops the choices' channels, which cancels their sequences on the workers within a step.
//!
//! A request still running when the router's drain timeout passes ([`ActiveCall::cut_off`]) ends
//! with [`RouteError::DrainTimeout`] (503, `unavailable`): a whole response answers it as its
//! error, an event stream sends it as its last event before `[DONE]`; its choices are cancelled.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::Body;
use bytes::Bytes;
use futures::stream::{self, BoxStream, SelectAll, StreamExt as _};
use inference_proto::public::{FinishReason, GenerateResponse};
use serde_json::Value;
use tokio_stream::wrappers::ReceiverStream;

use super::echo::EchoPrompt;
use super::error::ApiError;
use super::reply::{finish_reason, usage, with_calls, ChoiceText, Reply};
use crate::drain::{ActiveCall, CutOff};
use crate::generate::ResponseReceiver;
use crate::metrics::RequestObserver;
use crate::route_error::RouteError;
use structured_output::tool_call::StreamingCalls;

/// One admitted choice: its index in the response, its messages and its metrics observer.
pub struct Choice {
    /// Index in `choices` (prompt index × `n` + choice number).
    pub index: usize,
    /// The sequence's messages.
    pub rx: ResponseReceiver,
    /// Records the sequence in the router's metrics.
    pub observer: Option<RequestObserver>,
    /// Completions' `echo`: the prompt to show first (not streamed).
    pub echo: Option<EchoPrompt>,
    /// The sequence's first message, already taken from `rx` by [`started`] (it comes first).
    pub first: Option<Result<GenerateResponse, RouteError>>,
}

/// Waits for the first message of every choice of a stream before its response starts, so that
/// a request that fails before it generates anything (it waited for a worker that did not come
/// back, `reconnect_grace_ms` or `failover_timeout_ms`; a higher class displaced it from the
/// queue; its worker refused it) is answered with its HTTP status (503, 429, 400...) and an
/// OpenAI error object, as a refusal at admission is, not with `200` and an error event that
/// clients do not retry. The messages are kept, to be streamed first.
///
/// Errors: the first error found (recorded by its choice's observer; dropping the choices cancels
/// the others), or [`RouteError::DrainTimeout`] when the router's drain cuts the call off.
pub async fn started(
    mut choices: Vec<Choice>,
    call: &ActiveCall,
) -> Result<Vec<Choice>, RouteError> {
    let mut cut_off = call.cut_off();
    for choice in &mut choices {
        let first = tokio::select! {
            biased;
            error = &mut cut_off => return Err(error),
            first = choice.rx.recv() => first,
        };
        if let Some(Err(e)) = first {
            if let Some(observer) = choice.observer.as_mut() {
                observer.on_item(&Err(e.clone()));
            }
            return Err(e);
        }
        choice.first = first;
    }
    Ok(choices)
}

type Item = (usize, Result<GenerateResponse, RouteError>);

/// The choices' messages, interleaved as they come.
fn merge(choices: Vec<Choice>) -> SelectAll<BoxStream<'static, Item>> {
    stream::select_all(choices.into_iter().map(|choice| {
        let Choice {
            index,
            rx,
            mut observer,
            echo: _,
            first,
        } = choice;
        stream::iter(first)
            .chain(ReceiverStream::new(rx))
            .map(move |item| {
                if let Some(observer) = observer.as_mut() {
                    observer.on_item(&item);
                }
                (index, item)
            })
            .boxed()
    }))
}

/// Runs `choices` (of the running `call`) to their ends and returns the whole response.
/// `prompt_tokens` is the usage's prompt count (each prompt once, whatever `n`).
///
/// Errors: the first error of any choice (the others are cancelled), or
/// [`RouteError::DrainTimeout`] when the call is cut off, mapped by [`ApiError::from_route`].
pub async fn gather(
    reply: &Reply,
    choices: Vec<Choice>,
    prompt_tokens: u64,
    call: &ActiveCall,
) -> Result<Value, ApiError> {
    let count = choices.len();
    let mut texts = vec![ChoiceText::default(); count];
    let mut reasons: Vec<Option<&'static str>> = vec![None; count];
    let mut echoes: Vec<Option<EchoPrompt>> = choices.iter().map(|c| c.echo.clone()).collect();
    // `max_tokens: 0` with echo: the one token the worker ran is not shown.
    let hidden: Vec<bool> = echoes
        .iter()
        .map(|e| e.as_ref().is_some_and(|e| !e.generate))
        .collect();
    let mut completion_tokens = 0u64;
    let mut merged = merge(choices);
    let mut cut_off = call.cut_off();
    loop {
        let (index, item) = tokio::select! {
            biased;
            error = &mut cut_off => (0, Err(error)),
            next = merged.next() => match next {
                Some(next) => next,
                None => break,
            },
        };
        let message = item.map_err(|e| ApiError::from_route(e, Some(reply.endpoint)))?;
        // The first message of an echoing choice carries the prompt's tokens.
        if let Some(echo) = echoes[index].take() {
            texts[index].push_prompt(&echo.text, &message.prompt_tokens);
        }
        let generate = !hidden[index];
        if generate {
            texts[index].push(&message);
        }
        if let Some(reason) = finished(&message) {
            // `max_tokens: 0` with echo: the hidden token ran out the budget.
            reasons[index] = Some(if generate { reason } else { "length" });
            if generate {
                completion_tokens += message
                    .usage
                    .as_ref()
                    .map_or(0, |u| u.generated_tokens.into());
            }
        }
    }
    let mut out = Vec::with_capacity(count);
    for (index, (text, reason)) in texts.iter().zip(&reasons).enumerate() {
        let reason = reason.ok_or_else(|| {
            ApiError::from_route(
                RouteError::Internal(format!("choice {index} ended without a finish reason")),
                Some(reply.endpoint),
            )
        })?;
        out.push(reply.choice(index, text, reason));
    }
    Ok(reply.response(out, usage(prompt_tokens, completion_tokens)))
}

/// OpenAI's finish reason when `message` is its sequence's last.
fn finished(message: &GenerateResponse) -> Option<&'static str> {
    (message.finish_reason() != FinishReason::Unspecified)
        .then(|| finish_reason(message.finish_reason()))
}

/// State of one event stream.
struct EventStream {
    reply: Reply,
    merged: SelectAll<BoxStream<'static, Item>>,
    texts: Vec<ChoiceText>,
    /// Chat with tools: each choice's call parser.
    calls: Vec<Option<StreamingCalls>>,
    pending: VecDeque<Bytes>,
    prompt_tokens: u64,
    completion_tokens: u64,
    done: bool,
    /// Counts the request as running (for the drain) until the stream is dropped.
    _call: ActiveCall,
    /// Ends the stream when the drain timeout passes.
    cut_off: CutOff,
}

impl EventStream {
    fn event(&mut self, data: &Value) {
        self.pending
            .push_back(Bytes::from(format!("data: {data}\n\n")));
    }

    fn on_message(&mut self, index: usize, message: GenerateResponse) {
        if self.calls[index].is_some() {
            return self.on_tool_message(index, message);
        }
        let text = &mut self.texts[index];
        text.push(&message);
        let show = !text.text.is_empty() || (self.reply.logprobs && !text.is_empty());
        let step = text.take();
        if show {
            let chunk = self
                .reply
                .chunk(vec![self.reply.delta_choice(index, &step)], None);
            self.event(&chunk);
        }
        if let Some(reason) = finished(&message) {
            self.completion_tokens += message
                .usage
                .as_ref()
                .map_or(0, |u| u.generated_tokens.into());
            let chunk = self
                .reply
                .chunk(vec![self.reply.finish_choice(index, reason)], None);
            self.event(&chunk);
        }
    }

    /// [`Self::on_message`] for a chat choice with tools: content and calls as they parse.
    fn on_tool_message(&mut self, index: usize, message: GenerateResponse) {
        let Some(parser) = self.calls[index].as_mut() else {
            return;
        };
        let mut deltas = parser.push(&message.text);
        let reason = finished(&message);
        if reason.is_some() {
            deltas.extend(parser.finish());
        }
        // At the end only: `tool_calls` only with a complete call, as the whole response and
        // gRPC say; a call cut by the length limit or a stop string leaves its fragments in the
        // stream, not a call.
        let made_calls = reason.is_some() && parser.has_complete_calls();
        for delta in deltas {
            let chunk = self
                .reply
                .chunk(vec![self.reply.tool_delta_choice(index, &delta)], None);
            self.event(&chunk);
        }
        if let Some(reason) = reason {
            self.completion_tokens += message
                .usage
                .as_ref()
                .map_or(0, |u| u.generated_tokens.into());
            let chunk = self.reply.chunk(
                vec![self
                    .reply
                    .finish_choice(index, with_calls(reason, made_calls))],
                None,
            );
            self.event(&chunk);
        }
    }

    fn end(&mut self) {
        if self.reply.include_usage {
            let chunk = self.reply.chunk(
                Vec::new(),
                Some(usage(self.prompt_tokens, self.completion_tokens)),
            );
            self.event(&chunk);
        }
        self.pending
            .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.done = true;
    }
}

/// Streams `choices` as server-sent events: (chat) a role chunk per choice, then a chunk per
/// step with new text, one finish chunk per choice, the usage chunk with empty `choices` when
/// `include_usage` is set, and `data: [DONE]`. An error of any choice, or the call's cut-off by
/// the drain timeout, is sent as one `data: {"error": ...}` event before `[DONE]`, and cancels
/// the (other) choices.
pub fn events(reply: Reply, choices: Vec<Choice>, prompt_tokens: u64, call: ActiveCall) -> Body {
    let count = choices.len();
    let mut state = EventStream {
        merged: merge(choices),
        texts: vec![ChoiceText::default(); count],
        calls: vec![reply.tool_syntax.map(StreamingCalls::new); count],
        pending: VecDeque::new(),
        prompt_tokens,
        completion_tokens: 0,
        done: false,
        cut_off: call.cut_off(),
        _call: call,
        reply,
    };
    if state.reply.endpoint == super::error::Endpoint::Chat {
        for index in 0..count {
            let chunk = state
                .reply
                .chunk(vec![state.reply.role_choice(index)], None);
            state.event(&chunk);
        }
    }
    let body = stream::unfold(state, |mut state| async move {
        loop {
            if let Some(bytes) = state.pending.pop_front() {
                return Some((Ok::<_, Infallible>(bytes), state));
            }
            if state.done {
                return None;
            }
            let next = tokio::select! {
                biased;
                error = &mut state.cut_off => Err(error),
                next = state.merged.next() => Ok(next),
            };
            match next {
                Ok(Some((index, Ok(message)))) => state.on_message(index, message),
                Ok(Some((_, Err(e)))) | Err(e) => {
                    state.merged = SelectAll::new();
                    let error = ApiError::from_route(e, Some(state.reply.endpoint)).body();
                    state.event(&error);
                    state
                        .pending
                        .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    state.done = true;
                }
                Ok(None) => state.end(),
            }
        }
    });
    Body::from_stream(body)
}
