//! One worker link: a background task connects, checks health, fetches `Info` (the first worker to
//! answer defines the [`ModelContext`]), opens the `Generate` stream and routes the worker's step
//! messages to the requests in flight. A health probe runs beside the stream.
//!
//! When the stream breaks (process killed, connection cut, worker shut down), the link leaves
//! rotation at once, every request in flight on it hears [`WorkerEvent::Lost`] (and fails over), and
//! the task reconnects with exponential backoff. A worker whose `Health` says not ready (or does not
//! answer within the probe interval) stays connected but takes no new requests until a probe says
//! ready again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inference_proto::worker::{
    router_message, worker_client::WorkerClient, worker_message, AddRequest, CancelRequest,
    HealthRequest, InfoRequest, LoadReport, RouterMessage, StepOutput, TokenOutput,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;
use tonic::Status;

use super::WorkerPool;
use crate::affinity::LOAD_REPORT_TTL;
use crate::model_context::ModelContext;

/// What a request hears from its worker.
#[derive(Debug)]
pub enum WorkerEvent {
    /// One generated token (the last one has `finished` set).
    Token(TokenOutput),
    /// The worker rejected or could not finish the request; nothing more follows.
    Failed(Status),
    /// The worker went away (or handed the request back) while the request ran; the request may
    /// continue elsewhere. Holds the reason.
    Lost(String),
}

/// How the router learned of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// From the `workers` setting; never removed.
    Static,
    /// From DNS discovery; removed when its address leaves the resolved set.
    Discovered,
}

#[derive(Default)]
struct LinkState {
    /// Outbound half of the stream; `None` while disconnected.
    sender: Option<mpsc::UnboundedSender<RouterMessage>>,
    /// The last health probe said ready.
    healthy: bool,
    /// The link was removed from the pool; it never becomes ready again.
    removed: bool,
    /// Requests in flight on this worker, by the router's internal request id.
    inflight: HashMap<String, mpsc::UnboundedSender<WorkerEvent>>,
    /// The worker's last load report and when it arrived.
    reported: Option<(LoadReport, Instant)>,
}

/// A worker's state at one moment (for picking, metrics and health reporting).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSnapshot {
    /// `HOST:PORT`.
    pub address: String,
    /// Static or discovered.
    pub origin: Origin,
    /// Its stream is open.
    pub connected: bool,
    /// Its last health probe said ready.
    pub healthy: bool,
    /// Requests this router has in flight on it.
    pub inflight: usize,
    /// The load used for picking (see [`crate::affinity`]).
    pub load: usize,
    /// The worker's last load report, if recent.
    pub reported: Option<LoadReport>,
}

impl WorkerSnapshot {
    /// Connected and healthy: it may take requests.
    pub fn ready(&self) -> bool {
        self.connected && self.healthy
    }
}

/// One worker: its address and connection state.
pub struct WorkerLink {
    /// `HOST:PORT` of the worker.
    pub address: String,
    /// How the router learned of it.
    pub origin: Origin,
    state: Mutex<LinkState>,
}

impl WorkerLink {
    pub(super) fn new(address: String, origin: Origin) -> Self {
        Self {
            address,
            origin,
            state: Mutex::new(LinkState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkState> {
        self.state.lock().expect("link lock")
    }

    /// The link's state now.
    pub fn snapshot(&self) -> WorkerSnapshot {
        let state = self.lock();
        let reported = state
            .reported
            .filter(|(_, at)| at.elapsed() <= LOAD_REPORT_TTL)
            .map(|(r, _)| r);
        let reported_load = reported.map_or(0, |r| r.running_sequences + r.waiting_sequences);
        WorkerSnapshot {
            address: self.address.clone(),
            origin: self.origin,
            connected: state.sender.is_some() && !state.removed,
            healthy: state.healthy,
            inflight: state.inflight.len(),
            load: state.inflight.len().max(reported_load as usize),
            reported,
        }
    }

    /// Sends `request` (whose id is `request.request_id`) when the link is ready and has fewer than
    /// `cap` requests in flight; returns the request's event channel.
    pub(super) fn try_send(
        &self,
        request: &AddRequest,
        cap: usize,
    ) -> Option<mpsc::UnboundedReceiver<WorkerEvent>> {
        let mut state = self.lock();
        if state.removed || !state.healthy || state.inflight.len() >= cap {
            return None;
        }
        let sender = state.sender.clone()?;
        let message = RouterMessage {
            kind: Some(router_message::Kind::Add(request.clone())),
        };
        if sender.send(message).is_err() {
            // The stream is closing; the link task will notice and reconnect.
            state.sender = None;
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        state.inflight.insert(request.request_id.clone(), tx);
        Some(rx)
    }

    /// Cancels a request on the worker; returns whether it was still in flight (a slot was freed).
    pub(super) fn cancel(&self, request_id: &str) -> bool {
        let mut state = self.lock();
        if state.inflight.remove(request_id).is_none() {
            return false;
        }
        if let Some(sender) = &state.sender {
            let _ = sender.send(RouterMessage {
                kind: Some(router_message::Kind::Cancel(CancelRequest {
                    request_id: request_id.to_string(),
                })),
            });
        }
        true
    }

    /// Takes the link out of rotation and tells every request in flight that it was lost.
    /// Returns how many there were.
    pub(super) fn fail_all(&self, reason: &str) -> usize {
        let mut state = self.lock();
        state.sender = None;
        let n = state.inflight.len();
        for (_, tx) in state.inflight.drain() {
            let _ = tx.send(WorkerEvent::Lost(reason.to_string()));
        }
        n
    }

    /// Marks the link removed from the pool and fails its requests over.
    pub(super) fn remove(&self, reason: &str) -> usize {
        self.lock().removed = true;
        self.fail_all(reason)
    }

    /// Records a health probe's answer; returns whether it changed.
    fn set_healthy(&self, healthy: bool) -> bool {
        let mut state = self.lock();
        std::mem::replace(&mut state.healthy, healthy) != healthy
    }

    /// Routes one step message to its requests; returns how many requests ended (slots freed).
    fn on_step(&self, step: StepOutput) -> usize {
        let mut state = self.lock();
        let before = state.inflight.len();
        if let Some(load) = step.load {
            state.reported = Some((load, Instant::now()));
        }
        for error in step.errors {
            if let Some(tx) = state.inflight.remove(&error.request_id) {
                let event = if error.code == tonic::Code::Unavailable as i32 {
                    // The worker hands the request back (e.g. it is draining): fail over, and take
                    // the worker out of rotation at once (before the request is re-dispatched)
                    // until its health probe says ready again.
                    state.healthy = false;
                    WorkerEvent::Lost(format!(
                        "worker {} handed the request back: {}",
                        self.address, error.message
                    ))
                } else {
                    WorkerEvent::Failed(Status::new(tonic::Code::from(error.code), error.message))
                };
                let _ = tx.send(event);
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
        before - state.inflight.len()
    }
}

/// Keeps `link` connected until the task is aborted (the link was removed).
pub(super) async fn maintain(pool: Arc<WorkerPool>, link: Arc<WorkerLink>) {
    let (initial, max) = pool.settings().backoff;
    let mut delay = initial;
    loop {
        match run(&pool, &link).await {
            Ok(()) => {
                tracing::warn!(worker = %link.address, "worker stream ended");
                delay = initial;
            }
            Err(e) => tracing::debug!(worker = %link.address, error = %e, "worker unreachable"),
        }
        let lost = link.fail_all(&format!(
            "worker {} disconnected while the request was running",
            link.address
        ));
        link.set_healthy(false);
        pool.refresh_ready();
        if lost > 0 {
            tracing::warn!(worker = %link.address, requests = lost, "worker lost with requests in flight; failing them over");
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(max);
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Connects once and serves the stream until it ends. Returns `Err` when the worker could not be
/// reached or described, `Ok` when an established stream ended.
async fn run(pool: &Arc<WorkerPool>, link: &Arc<WorkerLink>) -> anyhow::Result<()> {
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
    let healthy = probe(&mut client.clone(), pool.settings().health_interval).await;
    let (tx, rx) = mpsc::unbounded_channel();
    let mut inbound = client
        .generate(UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    {
        let mut state = link.lock();
        if state.removed {
            return Ok(());
        }
        state.sender = Some(tx);
        state.healthy = healthy;
    }
    pool.refresh_ready();
    pool.pump();
    tracing::info!(worker = %link.address, model = %info.model_name, healthy, "worker connected");
    let _prober = AbortOnDrop(tokio::spawn(probe_loop(
        pool.clone(),
        link.clone(),
        client.clone(),
    )));
    while let Some(message) = inbound.message().await.transpose() {
        let step = match message.map(|m| m.kind) {
            Ok(Some(worker_message::Kind::Step(step))) => step,
            Ok(None) => continue,
            Err(status) => {
                tracing::warn!(worker = %link.address, %status, "worker stream failed");
                break;
            }
        };
        let had_errors = !step.errors.is_empty();
        let freed = link.on_step(step);
        if had_errors {
            // A hand-back may have taken the worker out of rotation.
            pool.refresh_ready();
        }
        if freed > 0 {
            pool.pump();
        }
    }
    Ok(())
}

/// Whether the worker's `Health` says ready within `timeout`.
async fn probe(client: &mut WorkerClient<Channel>, timeout: Duration) -> bool {
    match tokio::time::timeout(timeout, client.health(HealthRequest {})).await {
        Ok(Ok(response)) => response.into_inner().ready,
        _ => false,
    }
}

/// Probes the worker every health interval and takes it out of rotation (or back) on change.
async fn probe_loop(
    pool: Arc<WorkerPool>,
    link: Arc<WorkerLink>,
    mut client: WorkerClient<Channel>,
) {
    let interval = pool.settings().health_interval;
    loop {
        tokio::time::sleep(interval).await;
        let healthy = probe(&mut client, interval).await;
        if link.set_healthy(healthy) {
            if healthy {
                tracing::info!(worker = %link.address, "worker healthy again; back in rotation");
            } else {
                tracing::warn!(worker = %link.address, "worker not ready; out of rotation");
            }
            pool.refresh_ready();
            if healthy {
                pool.pump();
            }
        }
    }
}
