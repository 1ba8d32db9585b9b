//! The router's workers: one bidirectional stream per worker, kept open with reconnect and backoff,
//! and dispatch of requests to the least loaded ready worker.
//!
//! Each worker has a [`WorkerLink`]: a background task connects, fetches `Info` (the first worker to
//! answer defines the [`ModelContext`]), opens the `Generate` stream and routes the worker's step
//! messages to the requests in flight. When the stream breaks, every request in flight on it fails
//! with `UNAVAILABLE` and the task reconnects with exponential backoff.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use inference_proto::worker::{
    router_message, worker_client::WorkerClient, worker_message, AddRequest, CancelRequest,
    InfoRequest, RouterMessage, TokenOutput,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Status;
use worker_message::Kind as WorkerMessageKind;

use crate::model_context::ModelContext;

/// What a request hears from its worker.
#[derive(Debug)]
pub enum WorkerEvent {
    /// One generated token (the last one has `finished` set).
    Token(TokenOutput),
    /// The worker rejected or lost the request; nothing more follows.
    Failed(Status),
}

#[derive(Default)]
struct LinkState {
    /// Outbound half of the stream; `None` while disconnected.
    sender: Option<mpsc::UnboundedSender<RouterMessage>>,
    /// Requests in flight on this worker, by the router's internal request id.
    inflight: HashMap<String, mpsc::UnboundedSender<WorkerEvent>>,
    /// Running sequences the worker last reported.
    reported_running: u32,
}

/// One worker: its address and connection state.
pub struct WorkerLink {
    /// `HOST:PORT` of the worker.
    pub address: String,
    state: Mutex<LinkState>,
}

impl WorkerLink {
    fn is_ready(&self) -> bool {
        self.state.lock().expect("link lock").sender.is_some()
    }

    /// Load used to pick a worker: requests in flight from this router.
    fn load(&self) -> usize {
        self.state.lock().expect("link lock").inflight.len()
    }

    fn cancel(&self, request_id: &str) {
        let mut state = self.state.lock().expect("link lock");
        if state.inflight.remove(request_id).is_some() {
            if let Some(sender) = &state.sender {
                let _ = sender.send(RouterMessage {
                    kind: Some(router_message::Kind::Cancel(CancelRequest {
                        request_id: request_id.to_string(),
                    })),
                });
            }
        }
    }

    fn fail_all(&self, status: &Status) {
        let mut state = self.state.lock().expect("link lock");
        state.sender = None;
        for (_, tx) in state.inflight.drain() {
            let _ = tx.send(WorkerEvent::Failed(status.clone()));
        }
    }
}

/// A request dispatched to a worker. Dropping it before the worker finished the request cancels the
/// request on the worker (client gone, stop string matched, deadline passed).
pub struct Dispatched {
    /// Events from the worker for this request.
    pub events: mpsc::UnboundedReceiver<WorkerEvent>,
    link: Arc<WorkerLink>,
    internal_id: String,
}

impl Dispatched {
    /// The worker serving the request.
    pub fn worker_address(&self) -> &str {
        &self.link.address
    }
}

impl Drop for Dispatched {
    fn drop(&mut self) {
        // No-op when the worker already finished the request (its entry is gone).
        self.link.cancel(&self.internal_id);
    }
}

/// All workers of this router.
pub struct WorkerPool {
    links: Vec<Arc<WorkerLink>>,
    model: RwLock<Option<Arc<ModelContext>>>,
    next_id: AtomicU64,
}

impl WorkerPool {
    /// Creates the pool and starts one connection task per address (on the current tokio runtime).
    /// Connections are made in the background: the pool is usable at once and reports no ready
    /// worker until one connects.
    pub fn start(addresses: &[String], backoff: (Duration, Duration)) -> Arc<Self> {
        let links = addresses
            .iter()
            .map(|a| {
                Arc::new(WorkerLink {
                    address: a.clone(),
                    state: Mutex::new(LinkState::default()),
                })
            })
            .collect::<Vec<_>>();
        let pool = Arc::new(Self {
            links,
            model: RwLock::new(None),
            next_id: AtomicU64::new(1),
        });
        for link in &pool.links {
            tokio::spawn(maintain_link(pool.clone(), link.clone(), backoff));
        }
        pool
    }

    /// The served model, once a worker has described it.
    pub fn model(&self) -> Option<Arc<ModelContext>> {
        self.model.read().expect("model lock").clone()
    }

    /// Number of configured worker addresses.
    pub fn configured_workers(&self) -> usize {
        self.links.len()
    }

    /// Number of workers with an open stream.
    pub fn ready_workers(&self) -> usize {
        self.links.iter().filter(|l| l.is_ready()).count()
    }

    /// Sends `request` to the least loaded ready worker. `request.request_id` is replaced with a
    /// router-unique id.
    ///
    /// Errors: `UNAVAILABLE` when no worker is ready.
    pub fn dispatch(&self, mut request: AddRequest) -> Result<Dispatched, Status> {
        let internal_id = format!("r{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        request.request_id = internal_id.clone();
        let mut candidates: Vec<_> = self.links.iter().filter(|l| l.is_ready()).collect();
        candidates.sort_by_key(|l| l.load());
        for link in candidates {
            let mut state = link.state.lock().expect("link lock");
            let Some(sender) = state.sender.clone() else {
                continue;
            };
            let (tx, rx) = mpsc::unbounded_channel();
            state.inflight.insert(internal_id.clone(), tx);
            let message = RouterMessage {
                kind: Some(router_message::Kind::Add(request.clone())),
            };
            if sender.send(message).is_err() {
                state.inflight.remove(&internal_id);
                continue;
            }
            drop(state);
            return Ok(Dispatched {
                events: rx,
                link: link.clone(),
                internal_id,
            });
        }
        Err(no_worker_status(self.links.len()))
    }
}

/// The `UNAVAILABLE` status returned while no worker is ready.
pub fn no_worker_status(configured: usize) -> Status {
    if configured == 0 {
        Status::unavailable("no workers are configured (set --workers HOST:PORT)")
    } else {
        Status::unavailable(format!(
            "no worker is ready (0 of {configured} connected); retry shortly"
        ))
    }
}

async fn maintain_link(
    pool: Arc<WorkerPool>,
    link: Arc<WorkerLink>,
    backoff: (Duration, Duration),
) {
    let (initial, max) = backoff;
    let mut delay = initial;
    loop {
        match run_link(&pool, &link).await {
            Ok(()) => {
                tracing::warn!(worker = %link.address, "worker stream ended");
                delay = initial;
            }
            Err(e) => tracing::debug!(worker = %link.address, error = %e, "worker unreachable"),
        }
        link.fail_all(&Status::unavailable(format!(
            "worker {} disconnected while the request was running",
            link.address
        )));
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(max);
    }
}

/// Connects once and serves the stream until it ends. Returns `Err` when the worker could not be
/// reached or described, `Ok` when an established stream ended.
async fn run_link(pool: &WorkerPool, link: &WorkerLink) -> anyhow::Result<()> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", link.address))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
    let channel = endpoint.connect().await?;
    let mut client = WorkerClient::new(channel).max_decoding_message_size(64 << 20);
    let info = client.info(InfoRequest {}).await?.into_inner();
    {
        let mut model = pool.model.write().expect("model lock");
        match model.as_ref() {
            Some(existing) if !existing.same_model(&info) => {
                anyhow::bail!(
                    "worker {} serves {:?}, but this router serves {:?}",
                    link.address,
                    info.model_name,
                    existing.model_name
                );
            }
            Some(_) => {}
            None => *model = Some(Arc::new(ModelContext::from_info(&info)?)),
        }
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let mut inbound = client
        .generate(UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    link.state.lock().expect("link lock").sender = Some(tx);
    tracing::info!(worker = %link.address, model = %info.model_name, "worker connected");
    while let Some(message) = inbound.message().await.transpose() {
        let Ok(WorkerMessageKind::Step(step)) = message
            .map(|m| m.kind)
            .and_then(|k| k.ok_or_else(|| Status::internal("empty worker message")))
        else {
            break;
        };
        let mut state = link.state.lock().expect("link lock");
        if let Some(load) = step.load {
            state.reported_running = load.running_sequences;
        }
        for error in step.errors {
            if let Some(tx) = state.inflight.remove(&error.request_id) {
                let status = Status::new(tonic::Code::from(error.code), error.message);
                let _ = tx.send(WorkerEvent::Failed(status));
            }
        }
        for token in step.tokens {
            let finished = token.finished;
            let id = token.request_id.clone();
            if let Some(tx) = state.inflight.get(&id) {
                let _ = tx.send(WorkerEvent::Token(token));
            }
            if finished {
                state.inflight.remove(&id);
            }
        }
    }
    Ok(())
}
