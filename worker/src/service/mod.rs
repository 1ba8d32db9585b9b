//! The worker's gRPC service (`inference.worker.v1.Worker`): turns each router stream into engine
//! commands and engine outputs back into stream messages.
//!
//! While the worker drains ([`Lifecycle`]) new `Add`s are refused with `UNAVAILABLE` (the router
//! fails them over) and `Health` says not ready; once the drain ends every stream is closed.
//! `Health` and `Info` answer from the engine's published state ([`engine::EngineSnapshot`]),
//! so a long step never delays them.
//!
//! The wire's types stop here: [`convert`] turns each `AddRequest` into the engine's request and
//! the engine's outputs, errors and counters into wire messages; [`constraint`] compiles a
//! request's structured-output constraint off the async runtime before it goes to the engine;
//! [`router_stream`] handles each message a router sends ([`WorkerService::open_stream`]).
//! Every stream also carries a liveness [`heartbeat`] from a timer outside the engine loop.

pub mod backlog;
mod constraint;
mod convert;
pub mod heartbeat;
pub mod router_stream;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use inference_proto::worker::{
    worker_message, worker_server::Worker, HealthRequest, HealthResponse, InfoRequest,
    InfoResponse, KvCacheBlocksRequest, KvCacheBlocksResponse, RouterMessage, WorkerMessage,
};
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::health::{health_response, Lifecycle};
use crate::telemetry::ConnectionSpans;
use constraint::{compiler_from_info, Constraints};
use convert::wire_stats;
use engine::EngineHandle;

/// Stall timeout of a service built without [`WorkerService::with_stall_timeout`] (the default of
/// the `engine_stall_timeout_ms` setting).
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Most bytes of step messages one router stream may leave unread by default (the worker setting
/// `router_backlog_kib`, 65,536 KiB): minutes of a busy worker's steps, far more than a router's
/// pause, bounded all the same.
pub const DEFAULT_ROUTER_BACKLOG_BYTES: usize = 64 << 20;

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
    constraints: Arc<Constraints>,
    /// Most bytes of step messages one router stream may leave unread (0 = no limit; [`backlog`]).
    router_backlog_bytes: usize,
}

impl WorkerService {
    /// Serves `engine`; `description` is the model's `Info` (its `stats` field is ignored). Builds
    /// the structured-output token environment of its vocabulary (once; a vocabulary that cannot
    /// have one is logged, and its constrained requests are refused).
    pub fn new(engine: EngineHandle, description: InfoResponse) -> Self {
        let started = Instant::now();
        let constraints = compiler_from_info(&description);
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
            router_backlog_bytes: DEFAULT_ROUTER_BACKLOG_BYTES,
        }
    }

    /// `Health` reports not ready (`stalled`) when the engine has work and finished no step for
    /// `timeout`.
    pub fn with_stall_timeout(mut self, timeout: Duration) -> Self {
        self.stall_timeout = timeout;
        self
    }

    /// Closes a router's stream (cancelling its requests) once it leaves more than `bytes` of step
    /// messages unread (0 = no limit; [`backlog`]).
    pub fn with_router_backlog(mut self, bytes: usize) -> Self {
        self.router_backlog_bytes = bytes;
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

type WorkerStream = Pin<Box<dyn Stream<Item = Result<WorkerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Worker for WorkerService {
    type GenerateStream = WorkerStream;

    async fn generate(
        &self,
        request: Request<Streaming<RouterMessage>>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let mut inbound = request.into_inner();
        let spans = ConnectionSpans::new_if_enabled().map(Arc::new);
        // The stream's first message is the prefix cache's snapshot; every step's load and cache
        // changes follow, before any request of this router.
        let (stream, out_rx) = self.open_stream(spans.clone())?;
        let conn = stream.conn();
        let backlog = stream.backlog();
        tracing::info!(conn, "router stream opened");
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
                if !stream.handle(message).await {
                    break;
                }
            }
            tracing::info!(conn, "router stream closed; cancelling its requests");
            stream.close();
        });
        let stopped = match &self.lifecycle {
            Some(lifecycle) => futures::future::Either::Left(lifecycle.stopped()),
            None => futures::future::Either::Right(std::future::pending()),
        };
        let reader = backlog.clone();
        let steps = until_stopped(out_rx, stopped).map(move |step| {
            reader.read(prost::Message::encoded_len(&step));
            if let Some(spans) = &spans {
                spans.on_step(&step);
            }
            WorkerMessage {
                kind: Some(worker_message::Kind::Step(step)),
            }
        });
        let outbound = heartbeat::with_heartbeats(steps, heartbeat::HEARTBEAT_INTERVAL).map(Ok);
        let outbound = backlog::ending_on_overflow(outbound, backlog);
        Ok(Response::new(Box::pin(outbound)))
    }

    async fn info(&self, _request: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
        let snapshot = self.engine.snapshot();
        if !snapshot.alive {
            return Err(Status::unavailable("the engine has stopped"));
        }
        let mut info = (*self.description).clone();
        info.stats = Some(wire_stats(snapshot.stats));
        Ok(Response::new(info))
    }

    async fn kv_cache_blocks(
        &self,
        _request: Request<KvCacheBlocksRequest>,
    ) -> Result<Response<KvCacheBlocksResponse>, Status> {
        let (block_hashes, block_size) = self
            .engine
            .cached_blocks()
            .await
            .ok_or_else(|| Status::unavailable("the engine has stopped"))?;
        Ok(Response::new(KvCacheBlocksResponse {
            block_hashes,
            block_size: block_size as u32,
        }))
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
}
