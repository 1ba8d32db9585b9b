//! The router's workers and how requests reach them.
//!
//! - `link` ([`WorkerLink`]): one worker's state: its stream, health, progress and requests.
//! - `link_task`: the task per worker that keeps its bidirectional stream connected (reconnected
//!   with backoff) and health-probed.
//! - `unreachable`: the rate limit of the "worker unreachable" log.
//! - `progress`: the stall rule (a worker with work and no progress for `stall_timeout_ms` leaves
//!   rotation; a busy one whose probes time out does not).
//! - this module: the set of workers (static ones and DNS-discovered ones that come and go), the
//!   served model, the admission queue ([`crate::admission`]) and dispatch by the picking policy
//!   (`choice`: the `routing` setting's policy from the `routing` crate).
//! - `kv_view` ([`KvView`]): what this router knows of each worker's KV cache (its block index,
//!   fed by the worker's cache events) and its load in tokens, for `routing = kv_aware`.
//!   An admitted request holds a [`Ticket`] (its place: sent at once, or waiting in the queue until
//!   a worker has room), then a [`Dispatched`] (the request sent to one worker).
//! - `session` ([`Session`]): one request across workers: when its worker is lost it resumes
//!   elsewhere with the tokens already generated (failover).
//! - `settings` ([`PoolSettings`], [`PoolCounters`]): how the pool works, and what it counts.
//!
//! Locks are taken in the order queue -> links -> one link's state, and never held across an
//! `await`; the link tasks release a link's state before they pump the queue.

mod choice;
mod kv_fit;
mod kv_view;
mod link;
mod link_task;
mod progress;
mod session;
mod settings;
mod unreachable;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use inference_proto::worker::{AddRequest, InfoResponse};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;

pub use kv_fit::KvCapacity;
pub use kv_view::{KvIndexState, KvView};
pub use link::{Origin, WorkerEvent, WorkerLink, WorkerSnapshot};
pub use progress::{Change, Progress};
pub use session::Session;
pub use settings::{PoolCounters, PoolSettings};
pub use unreachable::{Unreachable, UnreachableLog};

use crate::admission::{AdmissionQueue, Placement, QueueFull, TenantQueues};
use crate::model_context::ModelContext;
use crate::route_error::RouteError;
use crate::validation::ValidationError;
use choice::{choose, RouteKey};
use link_task::LinkOwner;

struct Waiter {
    request: AddRequest,
    key: RouteKey,
    /// Gets the request's worker, or why it was displaced from the queue.
    tx: oneshot::Sender<Result<Dispatched, QueueFull>>,
}

struct LinkEntry {
    link: Arc<WorkerLink>,
    task: AbortHandle,
}

/// All workers of this router.
pub struct WorkerPool {
    settings: PoolSettings,
    links: RwLock<Vec<LinkEntry>>,
    model: RwLock<Option<Arc<ModelContext>>>,
    queue: Mutex<AdmissionQueue<Waiter>>,
    ready: watch::Sender<usize>,
    next_id: AtomicU64,
    counters: PoolCounters,
    /// Turns of `routing = round_robin`.
    round_robin: routing::round_robin::RoundRobin,
    /// Tokens per KV block of the workers' hash chains (the first worker's `Info`; 0 before).
    block_size: AtomicUsize,
}

impl WorkerPool {
    /// Creates the pool with the static `addresses` and starts their links (on the current tokio
    /// runtime). Connections are made in the background: the pool is usable at once and reports no
    /// ready worker until one connects.
    pub fn start(settings: PoolSettings, addresses: &[String]) -> Arc<Self> {
        let pool = Arc::new(Self {
            queue: Mutex::new(AdmissionQueue::new(settings.admission)),
            settings,
            links: RwLock::new(Vec::new()),
            model: RwLock::new(None),
            ready: watch::Sender::new(0),
            next_id: AtomicU64::new(1),
            counters: PoolCounters::default(),
            round_robin: routing::round_robin::RoundRobin::default(),
            block_size: AtomicUsize::new(0),
        });
        for address in addresses {
            pool.add_worker(address, Origin::Static);
        }
        pool
    }

    /// The pool's settings.
    pub fn settings(&self) -> &PoolSettings {
        &self.settings
    }

    /// Event counters.
    pub fn counters(&self) -> &PoolCounters {
        &self.counters
    }

    /// The served model, once a worker has described it.
    pub fn model(&self) -> Option<Arc<ModelContext>> {
        self.model.read().expect("model lock").clone()
    }

    /// Number of known workers (static and discovered).
    pub fn configured_workers(&self) -> usize {
        self.links.read().expect("links lock").len()
    }

    /// Number of workers that may take requests (connected, healthy, not stalled).
    pub fn ready_workers(&self) -> usize {
        *self.ready.borrow()
    }

    /// Watches the number of ready workers.
    pub fn ready_watch(&self) -> watch::Receiver<usize> {
        self.ready.subscribe()
    }

    /// Every known worker's state.
    pub fn workers(&self) -> Vec<WorkerSnapshot> {
        let links = self.links.read().expect("links lock");
        links.iter().map(|e| e.link.snapshot()).collect()
    }

    /// Requests and tokens waiting in the admission queue.
    pub fn queue_depth(&self) -> (usize, u64) {
        let queue = self.queue.lock().expect("queue lock");
        (queue.len(), queue.tokens())
    }

    /// New requests waiting per tenant, and every tenant's fair-share counter.
    pub fn tenant_queues(&self) -> TenantQueues {
        self.queue.lock().expect("queue lock").tenant_queues()
    }

    /// Charges `tokens` generated for `tenant` to its fair-share counter (as they stream).
    pub fn charge(&self, tenant: &str, tokens: u64) {
        self.queue
            .lock()
            .expect("queue lock")
            .charge(tenant, tokens);
    }

    /// Adds a worker and starts its link; `false` when the address is already known.
    pub fn add_worker(self: &Arc<Self>, address: &str, origin: Origin) -> bool {
        let mut links = self.links.write().expect("links lock");
        if links.iter().any(|e| e.link.address == address) {
            return false;
        }
        let link = Arc::new(WorkerLink::new(address.to_string(), origin));
        let task = tokio::spawn(link_task::maintain(self.clone(), link.clone())).abort_handle();
        links.push(LinkEntry { link, task });
        tracing::info!(worker = address, ?origin, "worker added");
        true
    }

    /// Removes a worker: stops its link and fails its requests over. `false` when unknown.
    pub fn remove_worker(&self, address: &str) -> bool {
        let entry = {
            let mut links = self.links.write().expect("links lock");
            let Some(at) = links.iter().position(|e| e.link.address == address) else {
                return false;
            };
            links.remove(at)
        };
        entry.task.abort();
        let lost = entry.link.remove(&format!(
            "worker {address} was removed from the pool while the request was running"
        ));
        tracing::info!(
            worker = address,
            requests_failed_over = lost,
            "worker removed"
        );
        self.refresh_ready();
        true
    }

    /// Makes the discovered workers exactly `addresses` (static workers are untouched): adds the
    /// new ones, removes the vanished ones. Returns (added, removed).
    pub fn sync_discovered(self: &Arc<Self>, addresses: &BTreeSet<String>) -> (usize, usize) {
        let gone: Vec<String> = {
            let links = self.links.read().expect("links lock");
            links
                .iter()
                .filter(|e| e.link.origin == Origin::Discovered)
                .map(|e| e.link.address.clone())
                .filter(|a| !addresses.contains(a))
                .collect()
        };
        let removed = gone.iter().filter(|a| self.remove_worker(a)).count();
        let added = addresses
            .iter()
            .filter(|a| self.add_worker(a, Origin::Discovered))
            .count();
        (added, removed)
    }

    /// Recounts the ready workers.
    fn refresh_ready(&self) {
        let n = self.workers().iter().filter(|w| w.ready()).count();
        self.ready
            .send_if_modified(|old| std::mem::replace(old, n) != n);
    }

    /// Admits a new request of `placement` (tenant and priority class): sends it to a worker at
    /// once when the queue is empty and one has room, queues it otherwise (see
    /// [`crate::admission`]). `request.request_id` is replaced with a router-unique id.
    ///
    /// Errors: [`RouteError::NoWorkersKnown`] / [`RouteError::NoWorkerReady`] when no worker is
    /// ready, [`RouteError::Overloaded`] when the queue (or the tenant's share of it) is full.
    pub fn admit(
        self: &Arc<Self>,
        request: AddRequest,
        placement: Placement,
    ) -> Result<Ticket, RouteError> {
        if self.ready_workers() == 0 {
            return Err(RouteError::no_worker(self.configured_workers()));
        }
        if let Some(refusal) = self.never_fits(&request) {
            return Err(refusal.into());
        }
        let key = self.route_key(&request);
        let mut queue = self.queue.lock().expect("queue lock");
        let tokens = waiting_tokens(&request);
        if queue.is_empty() {
            if let Some(dispatched) = self.dispatch_now(&request, &key) {
                queue.dispatched_directly(&placement, tokens);
                return Ok(Ticket::dispatched(self.clone(), dispatched));
            }
        }
        let (tx, rx) = oneshot::channel();
        let by = placement.priority;
        let pushed = queue
            .push_new(tokens, placement, Waiter { request, key, tx })
            .inspect_err(|_| {
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            })?;
        drop(queue);
        if let Some(displaced) = pushed.displaced {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            let priority = displaced.placement.as_ref().map_or(0, |p| p.priority);
            let _ = displaced
                .item
                .tx
                .send(Err(QueueFull::Displaced { priority, by }));
        }
        Ok(Ticket::queued(self.clone(), pushed.id, rx))
    }

    /// The refusal of a request that no ready worker's KV cache could ever hold
    /// ([`kv_fit::never_fits`]); `None` when one can, or when a ready worker reports no capacity.
    fn never_fits(&self, request: &AddRequest) -> Option<ValidationError> {
        let model = self.model()?;
        let capacities: Option<Vec<KvCapacity>> = self
            .workers()
            .iter()
            .filter(|s| s.ready())
            .map(|s| s.kv)
            .collect();
        kv_fit::never_fits(request, model.context_length, &capacities?)
    }

    /// What the routing policy needs of `request`, computed once.
    fn route_key(&self, request: &AddRequest) -> RouteKey {
        RouteKey::new(
            &self.settings,
            self.block_size.load(Ordering::Relaxed),
            request,
        )
    }

    /// Queues a request that resumes after its worker was lost, ahead of new requests.
    pub fn resume(self: &Arc<Self>, request: AddRequest) -> Ticket {
        let key = self.route_key(&request);
        let (tx, rx) = oneshot::channel();
        let tokens = waiting_tokens(&request);
        let id = self
            .queue
            .lock()
            .expect("queue lock")
            .push_resumed(tokens, Waiter { request, key, tx });
        self.pump();
        Ticket::queued(self.clone(), id, rx)
    }

    /// Sends waiting requests, oldest first, while a worker has room.
    fn pump(self: &Arc<Self>) {
        let mut undelivered = Vec::new();
        let mut queue = self.queue.lock().expect("queue lock");
        while let Some(front) = queue.front() {
            if front.item.tx.is_closed() {
                queue.pop_front();
                continue;
            }
            let Some(dispatched) = self.dispatch_now(&front.item.request, &front.item.key) else {
                break;
            };
            let entry = queue.pop_front().expect("front exists");
            if let Err(Ok(dispatched)) = entry.item.tx.send(Ok(dispatched)) {
                undelivered.push(dispatched);
            }
        }
        drop(queue);
        // Cancels them on their workers, which pumps again: outside the queue lock.
        drop(undelivered);
    }

    /// Picks a worker for `request` and sends it there, if one has room.
    fn dispatch_now(self: &Arc<Self>, request: &AddRequest, key: &RouteKey) -> Option<Dispatched> {
        let cap = self.settings.max_inflight_per_worker.max(1);
        let mut request = request.clone();
        request.request_id = format!("r{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let links: Vec<Arc<WorkerLink>> = {
            let links = self.links.read().expect("links lock");
            links.iter().map(|e| e.link.clone()).collect()
        };
        let mut snapshots: Vec<(Arc<WorkerLink>, WorkerSnapshot)> = links
            .into_iter()
            .map(|l| {
                let s = l.snapshot();
                (l, s)
            })
            .filter(|(_, s)| s.ready())
            .collect();
        // A worker that refuses (its stream just closed) is dropped and the choice made again.
        while !snapshots.is_empty() {
            let chosen = choose(&self.settings, &self.round_robin, key, &snapshots, cap)?;
            let link = snapshots[chosen].0.clone();
            if let Some(events) = link.try_send(&request, cap) {
                link.kv.on_dispatch(key.tokens);
                self.counters.dispatched.fetch_add(1, Ordering::Relaxed);
                return Some(Dispatched {
                    events,
                    pool: self.clone(),
                    link,
                    internal_id: request.request_id,
                });
            }
            snapshots.remove(chosen);
        }
        None
    }
}

impl LinkOwner for WorkerPool {
    fn settings(&self) -> &PoolSettings {
        &self.settings
    }

    fn counters(&self) -> &PoolCounters {
        &self.counters
    }

    fn adopt_model(&self, address: &str, info: &InfoResponse) -> anyhow::Result<()> {
        let mut model = self.model.write().expect("model lock");
        match model.as_ref() {
            Some(existing) if !existing.same_model(info) => {
                anyhow::bail!(
                    "worker {} serves {:?}, but this router serves {:?}",
                    address,
                    info.model_name,
                    existing.model_name
                );
            }
            Some(_) => {}
            None => {
                let block_size = info.stats.as_ref().map_or(0, |s| s.kv_block_size as usize);
                self.block_size.store(block_size, Ordering::Relaxed);
                let template_file = self.settings.chat_template.as_deref();
                *model = Some(Arc::new(ModelContext::from_info(info, template_file)?));
            }
        }
        Ok(())
    }

    fn refresh_ready(&self) {
        WorkerPool::refresh_ready(self);
    }

    fn pump(self: &Arc<Self>) {
        WorkerPool::pump(self);
    }
}

/// A request sent to a worker. Dropping it before the worker finished the request cancels the
/// request on the worker (client gone, stop string matched, deadline passed).
pub struct Dispatched {
    /// Events from the worker for this request.
    pub events: mpsc::UnboundedReceiver<WorkerEvent>,
    pool: Arc<WorkerPool>,
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
        if self.link.cancel(&self.internal_id) {
            self.pool.pump();
        }
    }
}

/// An admitted request's place: already sent to a worker, or waiting in the queue. Dropping it
/// gives up the place.
pub struct Ticket {
    pool: Arc<WorkerPool>,
    dispatched: Option<Dispatched>,
    queued: Option<(u64, oneshot::Receiver<Result<Dispatched, QueueFull>>)>,
}

impl Ticket {
    fn dispatched(pool: Arc<WorkerPool>, dispatched: Dispatched) -> Self {
        Self {
            pool,
            dispatched: Some(dispatched),
            queued: None,
        }
    }

    fn queued(
        pool: Arc<WorkerPool>,
        id: u64,
        rx: oneshot::Receiver<Result<Dispatched, QueueFull>>,
    ) -> Self {
        Self {
            pool,
            dispatched: None,
            queued: Some((id, rx)),
        }
    }

    /// Waits until the request is sent to a worker.
    ///
    /// Errors: [`RouteError::NoWorkerInTime`] when no worker was ready for the pool's failover
    /// timeout; [`RouteError::Overloaded`] when a request of a higher class displaced it.
    pub async fn wait(&mut self) -> Result<Dispatched, RouteError> {
        if let Some(dispatched) = self.dispatched.take() {
            return Ok(dispatched);
        }
        let Some((_, rx)) = self.queued.as_mut() else {
            return Err(RouteError::Internal("the ticket was already used".into()));
        };
        let timeout = self.pool.settings.failover_timeout;
        let mut ready = self.pool.ready_watch();
        let mut no_worker_since: Option<Instant> = None;
        let outcome = loop {
            let none_ready = *ready.borrow_and_update() == 0;
            let give_up_at = if none_ready {
                Some(*no_worker_since.get_or_insert_with(Instant::now) + timeout)
            } else {
                no_worker_since = None;
                None
            };
            let give_up = async {
                match give_up_at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                result = &mut *rx => break result.ok(),
                changed = ready.changed() => if changed.is_err() { break None },
                () = give_up => break None,
            }
        };
        if let Some(outcome) = outcome {
            self.queued = None;
            return outcome.map_err(RouteError::Overloaded);
        }
        self.leave_queue();
        Err(RouteError::NoWorkerInTime {
            ready: self.pool.ready_workers(),
            configured: self.pool.configured_workers(),
            waited_ms: timeout.as_millis(),
        })
    }

    /// Gives up the place in the queue, if any.
    fn leave_queue(&mut self) {
        if let Some((id, rx)) = self.queued.take() {
            let removed = self.pool.queue.lock().expect("queue lock").remove(id);
            drop(removed);
            // A request sent meanwhile is cancelled when its `Dispatched` drops with `rx`.
            drop(rx);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.leave_queue();
    }
}

/// Tokens a waiting request holds: prompt plus already generated.
fn waiting_tokens(request: &AddRequest) -> u64 {
    (request.prompt_ids.len() + request.generated_ids.len()) as u64
}

#[cfg(test)]
mod tests;
