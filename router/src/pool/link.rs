//! One worker link: a background task connects, checks health, fetches `Info` (the first worker to
//! answer defines the [`ModelContext`]), opens the `Generate` stream and routes the worker's step
//! messages to the requests in flight. A health probe runs beside the stream.
//!
//! When the stream breaks (process killed, connection cut, worker shut down), the link leaves
//! rotation at once, every request in flight on it hears [`WorkerEvent::Lost`] (and fails over), and
//! the task reconnects with exponential backoff. A worker whose `Health` answer says not ready stays
//! connected but takes no new requests until an answer says ready again. A probe that gets no
//! answer within the interval changes nothing (a busy worker is not a down one; logged at debug,
//! counted in `router_health_probe_misses_total`); a worker that has work and shows no progress for
//! `stall_timeout_ms` leaves rotation, its requests fail over (and are cancelled on it), and it
//! rejoins once it moves again (see `progress`).
//!
//! A worker that cannot be reached is logged when it first fails (WARN, with the error), then at
//! most once a minute while it stays unreachable, and at INFO when it is back (`unreachable`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inference_proto::worker::{
    router_message, worker_client::WorkerClient, worker_message, AddRequest, CancelRequest,
    HealthRequest, HealthResponse, InfoRequest, LoadReport, RouterMessage, StepOutput, TokenOutput,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

use super::kv_fit::KvCapacity;
use super::progress::{Change, Progress};
use super::unreachable::{Unreachable, UnreachableLog};
use super::WorkerPool;
use crate::affinity::LOAD_REPORT_TTL;
use crate::model_context::ModelContext;
use crate::route_error::{WorkerFailure, WorkerFailureKind};

/// What a request hears from its worker.
#[derive(Debug)]
pub enum WorkerEvent {
    /// One generated token (the last one has `finished` set).
    Token(TokenOutput),
    /// The worker rejected or could not finish the request; nothing more follows. (A request the
    /// worker hands back, [`WorkerFailureKind::HandedBack`], is [`WorkerEvent::Lost`] instead.)
    Failed(WorkerFailure),
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
    /// The last health answer said ready.
    healthy: bool,
    /// Progress of the connected worker (`None` while disconnected).
    progress: Option<Progress>,
    /// The link was removed from the pool; it never becomes ready again.
    removed: bool,
    /// Requests in flight on this worker, by the router's internal request id.
    inflight: HashMap<String, mpsc::UnboundedSender<WorkerEvent>>,
    /// The worker's last load report and when it arrived.
    reported: Option<(LoadReport, Instant)>,
    /// Why the last connection attempt failed (cleared when one succeeds).
    last_error: Option<String>,
    /// The KV cache its last `Info` reported.
    kv: Option<KvCapacity>,
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
    /// Its last health answer said ready.
    pub healthy: bool,
    /// It had work and showed no progress for the stall timeout (out of rotation until it moves).
    pub stalled: bool,
    /// Requests this router has in flight on it.
    pub inflight: usize,
    /// The load used for picking (see [`crate::affinity`]).
    pub load: usize,
    /// The worker's last load report, if recent (within `LOAD_REPORT_TTL`; used for picking).
    pub reported: Option<LoadReport>,
    /// The worker's last load report, however old: an idle worker sends none, so its last one
    /// (sent with the step that finished its last request) still holds its free KV tokens.
    pub last_report: Option<LoadReport>,
    /// Why the last connection attempt failed (e.g. the worker's TLS certificate does not verify);
    /// `None` once connected.
    pub last_error: Option<String>,
    /// The KV cache its last `Info` reported (`None` before the first connection, or when the
    /// worker reports none).
    pub kv: Option<KvCapacity>,
}

impl WorkerSnapshot {
    /// Connected, healthy and not stalled: it may take requests.
    pub fn ready(&self) -> bool {
        self.connected && self.healthy && !self.stalled
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
            stalled: state.progress.as_ref().is_some_and(Progress::is_stalled),
            inflight: state.inflight.len(),
            load: state.inflight.len().max(reported_load as usize),
            reported,
            last_report: state.reported.map(|(r, _)| r),
            last_error: state.last_error.clone(),
            kv: state.kv,
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
        let stalled = state.progress.as_ref().is_some_and(Progress::is_stalled);
        if state.removed || !state.healthy || stalled || state.inflight.len() >= cap {
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
        let inflight_before = state.inflight.len();
        if let Some(progress) = state.progress.as_mut() {
            progress.on_dispatch(Instant::now(), inflight_before);
        }
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
        state.progress = None;
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

    /// Records whether the worker is ready; returns whether it changed.
    fn set_healthy(&self, healthy: bool) -> bool {
        let mut state = self.lock();
        std::mem::replace(&mut state.healthy, healthy) != healthy
    }

    /// Records a `Health` answer; returns whether `healthy` changed, and whether a stalled worker
    /// moves again.
    fn on_health(&self, answer: &HealthResponse) -> (bool, Change) {
        let mut state = self.lock();
        let changed = std::mem::replace(&mut state.healthy, answer.ready) != answer.ready;
        let progress = match state.progress.as_mut() {
            Some(progress) => progress.on_health(Instant::now(), answer),
            None => Change::None,
        };
        (changed, progress)
    }

    /// Applies the stall rule now: when the worker has work and showed no progress for the stall
    /// timeout, takes it out of rotation, cancels this router's requests on it and tells them they
    /// were lost (they fail over). Returns (time since progress, requests failed over) when it
    /// just stalled.
    fn check_stall(&self) -> Option<(Duration, usize)> {
        let mut state = self.lock();
        let now = Instant::now();
        let inflight = state.inflight.len();
        let progress = state.progress.as_mut()?;
        if progress.check(now, inflight) != Change::Stalled {
            return None;
        }
        let since = progress.since_progress(now);
        let reason = format!(
            "worker {} made no progress for {} ms (stall_timeout_ms) while the request was running",
            self.address,
            since.as_millis()
        );
        let ids: Vec<String> = state.inflight.keys().cloned().collect();
        for id in &ids {
            if let Some(sender) = &state.sender {
                // Frees the sequence on the worker once it runs again.
                let _ = sender.send(RouterMessage {
                    kind: Some(router_message::Kind::Cancel(CancelRequest {
                        request_id: id.clone(),
                    })),
                });
            }
        }
        for (_, tx) in state.inflight.drain() {
            let _ = tx.send(WorkerEvent::Lost(reason.clone()));
        }
        Some((since, ids.len()))
    }

    /// Routes one step message to its requests; returns how many requests ended (slots freed) and
    /// whether a stalled worker moves again.
    fn on_step(&self, step: StepOutput) -> (usize, bool) {
        let mut state = self.lock();
        let moving = state
            .progress
            .as_mut()
            .is_some_and(|p| p.on_step(Instant::now()) == Change::Moving);
        let before = state.inflight.len();
        if let Some(load) = step.load {
            state.reported = Some((load, Instant::now()));
        }
        for error in step.errors {
            if let Some(tx) = state.inflight.remove(&error.request_id) {
                let failure = WorkerFailure::from(error);
                let event = if failure.kind == WorkerFailureKind::HandedBack {
                    // Fail over, and take the worker out of rotation at once (before the request
                    // is re-dispatched) until its health probe says ready again.
                    state.healthy = false;
                    WorkerEvent::Lost(format!(
                        "worker {} handed the request back: {}",
                        self.address, failure.message
                    ))
                } else {
                    WorkerEvent::Failed(failure)
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
        (before - state.inflight.len(), moving)
    }
}

/// `e` and its causes joined by `: `, each cause left out when the message before it already
/// says it (tonic's transport errors repeat their source: `tcp connect error: tcp connect error:
/// Connection refused`).
fn cause_chain(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !parts.last().is_some_and(|last| last.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// Keeps `link` connected until the task is aborted (the link was removed).
pub(super) async fn maintain(pool: Arc<WorkerPool>, link: Arc<WorkerLink>) {
    let (initial, max) = pool.settings().backoff;
    let mut delay = initial;
    let mut unreachable = UnreachableLog::new(UNREACHABLE_LOG_EVERY);
    loop {
        let result = run(&pool, &link, &mut unreachable).await;
        link.lock().last_error = result.as_ref().err().map(cause_chain);
        match result {
            Ok(()) => {
                tracing::warn!(worker = %link.address, "worker stream ended");
                delay = initial;
            }
            Err(e) => match unreachable.failed(Instant::now()) {
                Some(Unreachable::First) => tracing::warn!(
                    worker = %link.address,
                    error = %cause_chain(&e),
                    "worker unreachable; retrying with backoff"
                ),
                Some(Unreachable::Still { attempts, down_for }) => tracing::warn!(
                    worker = %link.address,
                    error = %cause_chain(&e),
                    attempts,
                    down_for_s = down_for.as_secs(),
                    "worker still unreachable"
                ),
                None => {
                    tracing::debug!(worker = %link.address, error = %cause_chain(&e), "worker unreachable")
                }
            },
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

/// How often a worker that stays unreachable is logged again.
const UNREACHABLE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Longest wait for a connected worker's `Info` (answered from published state, so at once unless
/// the process is stopped or hung).
const INFO_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects once and serves the stream until it ends. Returns `Err` when the worker could not be
/// reached or described, `Ok` when an established stream ended.
async fn run(
    pool: &Arc<WorkerPool>,
    link: &Arc<WorkerLink>,
    unreachable: &mut UnreachableLog,
) -> anyhow::Result<()> {
    let tls = pool.settings().worker_tls.as_ref();
    let mut endpoint =
        tonic::transport::Endpoint::from_shared(tls_certs::ClientTls::uri(tls, &link.address))?;
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls.tonic_config())?;
    }
    let endpoint = endpoint
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
    let channel = endpoint.connect().await?;
    let mut client = WorkerClient::new(channel).max_decoding_message_size(64 << 20);
    let info = tokio::time::timeout(INFO_TIMEOUT, client.info(InfoRequest {}))
        .await
        .map_err(|_| anyhow::anyhow!("no Info answer within {INFO_TIMEOUT:?}"))??
        .into_inner();
    if let Some((down_for, attempts)) = unreachable.reached(Instant::now()) {
        tracing::info!(
            worker = %link.address,
            down_for_s = down_for.as_secs(),
            attempts,
            "worker reachable again"
        );
    }
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
            None => {
                let template_file = pool.settings().chat_template.as_deref();
                *model = Some(Arc::new(ModelContext::from_info(&info, template_file)?));
            }
        }
    }
    // Not ready until a `Health` answer says so.
    let healthy = match probe(&mut client.clone(), pool.settings().health_interval).await {
        Ok(answer) => answer.ready,
        Err(_) => false,
    };
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
        state.last_error = None;
        state.kv = KvCapacity::of(&info);
        state.healthy = healthy;
        state.progress = Some(Progress::new(Instant::now(), pool.settings().stall_timeout));
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
        let (freed, moving) = link.on_step(step);
        if moving {
            tracing::info!(worker = %link.address, "stalled worker makes progress again; back in rotation");
        }
        if had_errors || moving {
            // A hand-back may have taken the worker out of rotation; a stalled one is back.
            pool.refresh_ready();
        }
        if freed > 0 || moving {
            pool.pump();
        }
    }
    Ok(())
}

/// The worker's `Health` answer within `timeout`; `Err` says why there was none.
async fn probe(
    client: &mut WorkerClient<Channel>,
    timeout: Duration,
) -> Result<HealthResponse, String> {
    match tokio::time::timeout(timeout, client.health(HealthRequest {})).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(format!("Health failed: {status}")),
        Err(_) => Err(format!("no Health answer within {timeout:?}")),
    }
}

/// Probes the worker every health interval: a "not ready" answer takes it out of rotation (a ready
/// one puts it back), no answer changes nothing; then applies the stall rule.
async fn probe_loop(
    pool: Arc<WorkerPool>,
    link: Arc<WorkerLink>,
    mut client: WorkerClient<Channel>,
) {
    let interval = pool.settings().health_interval;
    loop {
        tokio::time::sleep(interval).await;
        let mut changed = false;
        let mut back = false;
        match probe(&mut client, interval).await {
            Ok(answer) => {
                let (ready_changed, progress) = link.on_health(&answer);
                if ready_changed {
                    if answer.ready {
                        tracing::info!(worker = %link.address, "worker healthy again; back in rotation");
                    } else {
                        tracing::warn!(worker = %link.address, status = %answer.status, "worker not ready; out of rotation");
                    }
                }
                if progress == Change::Moving {
                    tracing::info!(
                        worker = %link.address,
                        steps = answer.steps,
                        "stalled worker makes progress again; back in rotation"
                    );
                }
                changed = ready_changed || progress == Change::Moving;
                back = answer.ready;
            }
            Err(reason) => {
                pool.counters()
                    .health_probe_misses
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(worker = %link.address, %reason, "health probe got no answer; a busy worker is not a down one");
            }
        }
        if let Some((since, failed_over)) = link.check_stall() {
            pool.counters().stalls.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                worker = %link.address,
                since_progress_ms = since.as_millis() as u64,
                stall_timeout_ms = pool.settings().stall_timeout.as_millis() as u64,
                requests_failed_over = failed_over,
                "worker has work but made no progress within the stall timeout; out of rotation"
            );
            changed = true;
            back = false;
        }
        if changed {
            pool.refresh_ready();
            if back {
                pool.pump();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cause_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("tcp connect error")]
    struct Connect(#[source] std::io::Error);

    #[test]
    fn a_cause_its_parent_already_says_is_left_out() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = anyhow::Error::new(Connect(io))
            .context("tcp connect error")
            .context("transport error");
        assert_eq!(
            cause_chain(&e),
            "transport error: tcp connect error: Connection refused"
        );
        assert_eq!(cause_chain(&anyhow::anyhow!("plain")), "plain");
    }
}
