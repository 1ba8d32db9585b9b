//! The worker's gRPC service (`inference.worker.v1.Worker`): turns each router stream into engine
//! commands and engine outputs back into stream messages.
//!
//! While the worker drains ([`Lifecycle`]) new `Add`s are refused with `UNAVAILABLE` (the router
//! fails them over) and `Health` says not ready; once the drain ends every stream is closed.
//! `Health` and `Info` answer from the engine's published state ([`crate::engine::EngineSnapshot`]),
//! so a long step never delays them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use inference_proto::worker::{
    router_message, worker_message, worker_server::Worker, HealthRequest, HealthResponse,
    InfoRequest, InfoResponse, RequestError, RouterMessage, StepOutput, WorkerMessage,
};
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use inference_proto::worker::AddRequest;
use structured_output::{ConstraintCompiler, ConstraintState};

use crate::engine::{Command, EngineHandle};
use crate::health::{health_response, Lifecycle};
use crate::telemetry::ConnectionSpans;

/// `google.rpc.Code` UNAVAILABLE, for requests refused while draining.
const CODE_UNAVAILABLE: i32 = 14;
/// `google.rpc.Code` INVALID_ARGUMENT, for a constraint that cannot be followed.
const CODE_INVALID_ARGUMENT: i32 = 3;

/// Stall timeout of a service built without [`WorkerService::with_stall_timeout`] (the default of
/// the `engine_stall_timeout_ms` setting).
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The worker gRPC service.
pub struct WorkerService {
    engine: EngineHandle,
    /// The static part of `Info` (model and tokenizer description); stats are filled per call.
    description: Arc<InfoResponse>,
    /// Health and drain state; `None` = never draining.
    lifecycle: Option<Arc<Lifecycle>>,
    /// `Health` says not ready when the engine has work and made no progress for this long.
    stall_timeout: Duration,
    /// Structured output over the model's vocabulary, or why this model cannot have it.
    constraints: Arc<Result<ConstraintCompiler, String>>,
}

impl WorkerService {
    /// Serves `engine`; `description` is the model's `Info` (its `stats` field is ignored). Builds
    /// the structured-output token environment of its vocabulary (once; a vocabulary that cannot
    /// have one is logged, and its constrained requests are refused).
    pub fn new(engine: EngineHandle, description: InfoResponse) -> Self {
        let started = Instant::now();
        let constraints = ConstraintCompiler::from_info(&description).map_err(|e| e.to_string());
        match &constraints {
            Ok(_) => tracing::info!(
                ms = started.elapsed().as_millis() as u64,
                "structured output ready"
            ),
            Err(reason) => tracing::warn!(%reason, "structured output unavailable for this model"),
        }
        Self {
            engine,
            description: Arc::new(description),
            lifecycle: None,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            constraints: Arc::new(constraints),
        }
    }

    /// `Health` reports not ready (`stalled`) when the engine has work and finished no step for
    /// `timeout`.
    pub fn with_stall_timeout(mut self, timeout: Duration) -> Self {
        self.stall_timeout = timeout;
        self
    }

    /// Follows `lifecycle`: refuses new requests while it drains and closes the streams when it
    /// stops.
    pub fn with_lifecycle(mut self, lifecycle: Arc<Lifecycle>) -> Self {
        self.lifecycle = Some(lifecycle);
        self
    }
}

/// The messages of `rx` until `stopped` resolves; then those already queued, and the end (once the
/// drain is over: the router fails over whatever is left, but gets every token already produced).
fn until_stopped<T: Send + 'static>(
    rx: tokio::sync::mpsc::UnboundedReceiver<T>,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> impl Stream<Item = T> + Send + 'static {
    let stopped: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(stopped);
    futures::stream::unfold(
        (rx, stopped, false),
        |(mut rx, mut stopped, mut flushing)| async move {
            if !flushing {
                tokio::select! {
                    biased;
                    message = rx.recv() => return message.map(|m| (m, (rx, stopped, false))),
                    () = &mut stopped => flushing = true,
                }
            }
            let message = rx.try_recv().ok()?;
            Some((message, (rx, stopped, flushing)))
        },
    )
}

/// The step message that refuses `request_id` with `code` and `message`.
fn refusal(request_id: String, code: i32, message: String) -> StepOutput {
    StepOutput {
        errors: vec![RequestError {
            request_id,
            code,
            message,
        }],
        ..Default::default()
    }
}

/// The request's constraint compiled and advanced by its `generated_ids` (`None` when it has
/// none). Errors (the request's `INVALID_ARGUMENT` message): no structured output for this model,
/// no stop token to end a complete output with, an invalid constraint, or generated tokens the
/// constraint does not allow.
fn compile_constraint(
    constraints: &Result<ConstraintCompiler, String>,
    request: &AddRequest,
) -> Result<Option<Box<ConstraintState>>, String> {
    let Some(constraint) = &request.constraint else {
        return Ok(None);
    };
    let compiler = constraints
        .as_ref()
        .map_err(|reason| format!("structured output is not available for this model: {reason}"))?;
    if request.stop_token_ids.is_empty() {
        return Err(
            "a constrained request needs stop_token_ids (they end a complete output)".into(),
        );
    }
    let mut state = compiler.compile(constraint).map_err(|e| e.to_string())?;
    state
        .replay(&request.generated_ids)
        .map_err(|e| format!("generated_ids do not follow the constraint: {e}"))?;
    Ok(Some(Box::new(state)))
}

type WorkerStream = Pin<Box<dyn Stream<Item = Result<WorkerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Worker for WorkerService {
    type GenerateStream = WorkerStream;

    async fn generate(
        &self,
        request: Request<Streaming<RouterMessage>>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let mut inbound = request.into_inner();
        let engine = self.engine.clone();
        let conn = engine.new_connection();
        let (out_tx, out_rx) = tokio::sync::mpsc::unbounded_channel();
        tracing::info!(conn, "router stream opened");
        let spans = ConnectionSpans::new_if_enabled().map(Arc::new);
        let inbound_spans = spans.clone();
        let lifecycle = self.lifecycle.clone();
        let constraints = self.constraints.clone();
        let draining = {
            let lifecycle = lifecycle.clone();
            move || lifecycle.as_ref().is_some_and(|l| l.is_draining())
        };
        tokio::spawn(async move {
            loop {
                let message = match inbound.next().await {
                    Some(Ok(m)) => m,
                    // The router going away (shutdown, broken pipe, reset) is an ordinary close.
                    Some(Err(status)) if observability::grpc::peer_went_away(&status) => {
                        tracing::info!(conn, reason = %status.message(), "router went away");
                        break;
                    }
                    Some(Err(status)) => {
                        tracing::warn!(conn, %status, "router stream failed");
                        break;
                    }
                    None => break,
                };
                let command = match message.kind {
                    Some(router_message::Kind::Add(request)) => {
                        if draining() {
                            let message = "the worker is shutting down and takes no new requests";
                            let refused =
                                refusal(request.request_id, CODE_UNAVAILABLE, message.into());
                            let _ = out_tx.send(refused);
                            continue;
                        }
                        let constraint = match compile_constraint(&constraints, &request) {
                            Ok(constraint) => constraint,
                            Err(message) => {
                                let refused =
                                    refusal(request.request_id, CODE_INVALID_ARGUMENT, message);
                                let _ = out_tx.send(refused);
                                continue;
                            }
                        };
                        if let Some(spans) = &inbound_spans {
                            spans.on_add(&request);
                        }
                        Command::Add {
                            conn,
                            request: Box::new(request),
                            constraint,
                            out: out_tx.clone(),
                        }
                    }
                    Some(router_message::Kind::Cancel(cancel)) => {
                        if let Some(spans) = &inbound_spans {
                            spans.on_cancel(&cancel.request_id);
                        }
                        Command::Cancel {
                            conn,
                            request_id: cancel.request_id,
                        }
                    }
                    None => continue,
                };
                if !engine.send(command) {
                    break;
                }
            }
            tracing::info!(conn, "router stream closed; cancelling its requests");
            engine.send(Command::CloseConnection { conn });
        });
        let stopped = match &lifecycle {
            Some(lifecycle) => futures::future::Either::Left(lifecycle.stopped()),
            None => futures::future::Either::Right(std::future::pending()),
        };
        let outbound = until_stopped(out_rx, stopped).map(move |step| {
            if let Some(spans) = &spans {
                spans.on_step(&step);
            }
            Ok(WorkerMessage {
                kind: Some(worker_message::Kind::Step(step)),
            })
        });
        Ok(Response::new(Box::pin(outbound)))
    }

    async fn info(&self, _request: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
        let snapshot = self.engine.snapshot();
        if !snapshot.alive {
            return Err(Status::unavailable("the engine has stopped"));
        }
        let mut info = (*self.description).clone();
        info.stats = Some(snapshot.stats);
        Ok(Response::new(info))
    }

    async fn health(
        &self,
        _request: Request<HealthRequest>,
    ) -> Result<Response<HealthResponse>, Status> {
        let draining = self.lifecycle.as_ref().is_some_and(|l| l.is_draining());
        Ok(Response::new(health_response(
            &self.engine.snapshot(),
            Instant::now(),
            self.stall_timeout,
            draining,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stopped_stream_still_delivers_what_was_queued_then_ends() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let mut stream = Box::pin(until_stopped(rx, async {
            let _ = stop_rx.await;
        }));
        tx.send(1).unwrap();
        assert_eq!(stream.next().await, Some(1));
        tx.send(2).unwrap();
        tx.send(3).unwrap();
        stop_tx.send(()).unwrap();
        // The sender is still open: only the stop ends the stream, after the queued messages.
        assert_eq!(stream.next().await, Some(2));
        assert_eq!(stream.next().await, Some(3));
        assert_eq!(stream.next().await, None);
        drop(tx);
    }

    /// A compiler over the vocabulary `<eos>` (control, id 0), `a`, `b`, `c`.
    fn abc() -> Result<ConstraintCompiler, String> {
        let tokens: Vec<String> = ["<eos>", "a", "b", "c"].map(String::from).to_vec();
        Ok(ConstraintCompiler::new(structured_output::VocabSource {
            model: "gpt2",
            tokens: &tokens,
            token_types: &[3, 1, 1, 1],
            vocab_size: 4,
            eos_token_ids: &[0],
        })
        .unwrap())
    }

    fn regex_request(regex: &str, generated: Vec<u32>, stops: Vec<u32>) -> AddRequest {
        use inference_proto::public::{constraint::Kind, Constraint};
        AddRequest {
            request_id: "r".into(),
            prompt_ids: vec![1],
            max_new_tokens: 10,
            stop_token_ids: stops,
            generated_ids: generated,
            constraint: Some(Constraint {
                kind: Some(Kind::Regex(regex.into())),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn constraints_compile_and_replay_generated_ids_or_are_refused_with_the_reason() {
        let compiler = abc();
        let unconstrained = AddRequest::default();
        assert!(compile_constraint(&compiler, &unconstrained)
            .unwrap()
            .is_none());
        // Resumed after "ab": only "c" may follow, then the output is complete.
        let mut state = compile_constraint(&compiler, &regex_request("abc", vec![1, 2], vec![0]))
            .unwrap()
            .unwrap();
        assert_eq!(state.generated(), 2);
        let mask = state.compute_mask().unwrap();
        assert!(mask.allows(3) && mask.num_allowed() == 1);
        let refused = |request: AddRequest| compile_constraint(&compiler, &request).unwrap_err();
        let e = refused(regex_request("abc", vec![2], vec![0]));
        assert!(
            e.starts_with(
                "generated_ids do not follow the constraint: token 2 at generated index 0"
            ),
            "{e}"
        );
        let e = refused(regex_request("abc", vec![], vec![]));
        assert!(e.contains("needs stop_token_ids"), "{e}");
        let e = refused(regex_request("(", vec![], vec![0]));
        assert!(e.starts_with("constraint.regex is invalid"), "{e}");
        let unavailable: Result<ConstraintCompiler, String> = Err("no tokenizer".into());
        let e = compile_constraint(&unavailable, &regex_request("a", vec![], vec![0])).unwrap_err();
        assert_eq!(
            e,
            "structured output is not available for this model: no tokenizer"
        );
    }
}
