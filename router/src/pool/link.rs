//! One worker link's state ([`WorkerLink`]): whether it is connected, healthy and making
//! progress, the requests in flight on it, and its last load report. The task that keeps it
//! connected is `link_task`.
//!
//! When the stream breaks, the link leaves rotation at once and every request in flight on it hears
//! [`WorkerEvent::Lost`] (and fails over). A worker whose `Health` answer says not ready stays
//! connected but takes no new requests until an answer says ready again; a worker that has work
//! and shows no progress for `stall_timeout_ms` leaves rotation, its requests fail over (and are
//! cancelled on it), and it rejoins once it moves again (see `progress`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inference_proto::worker::{
    router_message, AddRequest, CancelRequest, HealthResponse, HoldRequest, LoadReport,
    PromptLogprobs, ResumeRequest, RouterMessage, StepOutput, TokenOutput,
};
use tokio::sync::mpsc;

use super::kv_fit::KvCapacity;
use super::kv_view::{KvIndexState, KvView};
use super::occupancy::Occupancy;
use super::progress::{Change, Progress};
use crate::affinity::LOAD_REPORT_TTL;
use crate::route_error::{WorkerFailure, WorkerFailureKind};

/// What a request hears from its worker.
#[derive(Debug)]
pub enum WorkerEvent {
    /// One generated token (the last one has `finished` set).
    Token(TokenOutput),
    /// Scored prompt tokens (a request with prompt logprobs); all come before its first token.
    Prompt(PromptLogprobs),
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
    inflight: HashMap<String, InFlight>,
    /// The worker's last load report and when it arrived.
    reported: Option<(LoadReport, Instant)>,
    /// Why the last connection attempt failed (cleared when one succeeds).
    last_error: Option<String>,
    /// The KV cache its last `Info` reported.
    kv: Option<KvCapacity>,
    /// When the link last lost a stream while it was ready (cleared when it connects again).
    lost_ready_at: Option<Instant>,
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
    /// Those requests as `max_inflight_per_worker` counts them (by class and tenant).
    pub occupancy: Occupancy,
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
    /// This router's index of the worker's KV cache, and its load in tokens.
    pub kv_index: KvIndexState,
}

impl WorkerSnapshot {
    /// Connected, healthy and not stalled: it may take requests.
    pub fn ready(&self) -> bool {
        self.connected && self.healthy && !self.stalled
    }
}

impl LinkState {
    /// The requests in flight as the cap counts them. Held ones do not count: they take no place
    /// in the worker's batch, and counting them let a few clients that stopped reading block every
    /// other request queued for the worker until `slow_client_timeout_ms` (measured with
    /// `max_inflight_per_worker = 4`: new requests waited 28 s). When they resume, the worker's
    /// own scheduler (`max_num_seqs`, KV preemption) absorbs the excess.
    fn occupancy(&self) -> Occupancy {
        let mut o = Occupancy::default();
        for r in self.inflight.values().filter(|r| !r.held) {
            o.add(r.sheddable, r.tenant.as_ref());
        }
        o
    }

    /// Requests in flight that the worker runs or queues (not held).
    fn active(&self) -> usize {
        self.inflight.values().filter(|r| !r.held).count()
    }
}

/// A request in flight on a worker.
struct InFlight {
    /// Where its events go.
    events: mpsc::UnboundedSender<WorkerEvent>,
    /// It is sheddable (negative priority).
    sheddable: bool,
    /// Its tenant, when known (not for a failover).
    tenant: Option<Arc<str>>,
    /// Held on the worker because its client stopped reading ([`WorkerLink::hold`]): the worker
    /// runs no step for it, so it does not count as work for the stall rule.
    held: bool,
}

/// One worker: its address and connection state.
pub struct WorkerLink {
    /// `HOST:PORT` of the worker.
    pub address: String,
    /// How the router learned of it.
    pub origin: Origin,
    /// Its KV cache and load in tokens as its stream reports them (apart from `state`, so that
    /// lookups never wait on the link's lock).
    pub kv: KvView,
    state: Mutex<LinkState>,
}

impl WorkerLink {
    pub(super) fn new(address: String, origin: Origin) -> Self {
        Self {
            address,
            origin,
            kv: KvView::default(),
            state: Mutex::new(LinkState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkState> {
        self.state.lock().expect("link lock")
    }

    /// While the link is in its reconnect grace: when the grace ends (`grace` after it last lost
    /// its stream while ready, if it has not connected since and that end is still ahead; see
    /// `reconnect_grace_ms`). `None` otherwise, and always for a zero `grace`.
    pub fn reconnect_grace_end(&self, grace: Duration) -> Option<Instant> {
        let state = self.lock();
        state
            .lost_ready_at
            .filter(|_| !state.removed)
            .map(|at| at + grace)
            .filter(|end| *end > Instant::now())
    }

    /// Records why the last connection attempt failed (`None`: it succeeded).
    pub(super) fn set_last_error(&self, error: Option<String>) {
        self.lock().last_error = error;
    }

    /// Puts the link in service on a new stream whose outbound half is `sender`, with the worker's
    /// KV cache `kv`, its first health answer `healthy` and a fresh `progress`. Returns `false`
    /// (and changes nothing) when the link was removed from the pool meanwhile.
    pub(super) fn connected(
        &self,
        sender: mpsc::UnboundedSender<RouterMessage>,
        kv: Option<KvCapacity>,
        healthy: bool,
        progress: Progress,
    ) -> bool {
        let mut state = self.lock();
        if state.removed {
            return false;
        }
        state.sender = Some(sender);
        state.last_error = None;
        state.kv = kv;
        state.healthy = healthy;
        state.progress = Some(progress);
        state.lost_ready_at = None;
        true
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
            occupancy: state.occupancy(),
            load: state.active().max(reported_load as usize),
            reported,
            last_report: state.reported.map(|(r, _)| r),
            last_error: state.last_error.clone(),
            kv: state.kv,
            kv_index: self.kv.state(),
        }
    }

    /// Sends `request` (whose id is `request.request_id`, of `tenant` when known) when the link
    /// is ready and has room for it under `cap` ([`Occupancy::has_room`]); returns the request's
    /// event channel.
    pub(super) fn try_send(
        &self,
        request: &AddRequest,
        cap: usize,
        tenant: Option<&Arc<str>>,
    ) -> Option<mpsc::UnboundedReceiver<WorkerEvent>> {
        let mut state = self.lock();
        let stalled = state.progress.as_ref().is_some_and(Progress::is_stalled);
        let sheddable = request.priority < 0;
        let unusable = state.removed || !state.healthy || stalled;
        if unusable || !(state.occupancy()).has_room(cap, sheddable, tenant.map(|t| &**t)) {
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
        let inflight_before = state.active();
        if let Some(progress) = state.progress.as_mut() {
            progress.on_dispatch(Instant::now(), inflight_before);
        }
        state.inflight.insert(
            request.request_id.clone(),
            InFlight {
                events: tx,
                sheddable,
                tenant: tenant.cloned(),
                held: false,
            },
        );
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

    /// Flow control: asks the worker to hold the request (its client stopped reading; see
    /// `HoldRequest` in worker.proto). Returns whether it was in flight here.
    pub(super) fn hold(&self, request_id: &str) -> bool {
        self.set_held(request_id, true)
    }

    /// Flow control: asks the worker to resume a held request; the stall clock restarts when it
    /// was the only work this router had there. Returns whether it was in flight here.
    pub(super) fn resume(&self, request_id: &str) -> bool {
        self.set_held(request_id, false)
    }

    fn set_held(&self, request_id: &str, held: bool) -> bool {
        let mut state = self.lock();
        let active_before = state.active();
        let Some(request) = state.inflight.get_mut(request_id) else {
            return false;
        };
        if request.held == held {
            return true;
        }
        request.held = held;
        if !held {
            if let Some(progress) = state.progress.as_mut() {
                progress.on_dispatch(Instant::now(), active_before);
            }
        }
        if let Some(sender) = &state.sender {
            let request_id = request_id.to_string();
            let kind = if held {
                router_message::Kind::Hold(HoldRequest { request_id })
            } else {
                router_message::Kind::Resume(ResumeRequest { request_id })
            };
            let _ = sender.send(RouterMessage { kind: Some(kind) });
        }
        true
    }

    /// Takes the link out of rotation and tells every request in flight that it was lost.
    /// Returns how many there were. A link that was ready records when it lost its stream.
    pub(super) fn fail_all(&self, reason: &str) -> usize {
        let mut state = self.lock();
        let stalled = state.progress.as_ref().is_some_and(Progress::is_stalled);
        if state.progress.is_some() && state.healthy && !stalled && !state.removed {
            state.lost_ready_at = Some(Instant::now());
        }
        state.sender = None;
        state.progress = None;
        let n = state.inflight.len();
        for (_, request) in state.inflight.drain() {
            let _ = request.events.send(WorkerEvent::Lost(reason.to_string()));
        }
        n
    }

    /// Marks the link removed from the pool and fails its requests over.
    pub(super) fn remove(&self, reason: &str) -> usize {
        self.lock().removed = true;
        self.fail_all(reason)
    }

    /// Records whether the worker is ready; returns whether it changed.
    pub(super) fn set_healthy(&self, healthy: bool) -> bool {
        let mut state = self.lock();
        std::mem::replace(&mut state.healthy, healthy) != healthy
    }

    /// Records a `Health` answer; returns whether `healthy` changed, and whether a stalled worker
    /// moves again.
    pub(super) fn on_health(&self, answer: &HealthResponse) -> (bool, Change) {
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
    pub(super) fn check_stall(&self) -> Option<(Duration, usize)> {
        let mut state = self.lock();
        let now = Instant::now();
        let inflight = state.active();
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
        for (_, request) in state.inflight.drain() {
            let _ = request.events.send(WorkerEvent::Lost(reason.clone()));
        }
        Some((since, ids.len()))
    }

    /// Routes one step message to its requests; returns how many requests ended (slots freed) and
    /// whether a stalled worker moves again.
    pub(super) fn on_step(&self, step: StepOutput) -> (usize, bool) {
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
            if let Some(request) = state.inflight.remove(&error.request_id) {
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
                let _ = request.events.send(event);
            }
        }
        for scored in step.prompt_logprobs {
            if let Some(request) = state.inflight.get(&scored.request_id) {
                let _ = request.events.send(WorkerEvent::Prompt(scored));
            }
        }
        for token in step.tokens {
            let finished = token.finished;
            let id = token.request_id.clone();
            if let Some(request) = state.inflight.get(&id) {
                let _ = request.events.send(WorkerEvent::Token(token));
            }
            if finished {
                state.inflight.remove(&id);
            }
        }
        (before - state.inflight.len(), moving)
    }
}
