//! The router's workers and how requests reach them.
//!
//! - `link` ([`WorkerLink`]): one worker's state: its stream, health, progress and requests.
//! - `link_task`: the task per worker that keeps its bidirectional stream connected (reconnected
//!   with backoff) and health-probed.
//! - `unreachable`: the rate limit of the "worker unreachable" log.
//! - `progress`: the stall rule (a worker with work and no progress for `stall_timeout_ms` leaves
//!   rotation; a busy one whose probes time out does not).
//! - this module: the set of workers (static ones and DNS-discovered ones that come and go), one
//!   admission queue per served model ([`crate::admission`]) and dispatch by the picking policy
//!   (`choice`: the `routing` setting's policy from the `routing` crate) among the workers of the
//!   request's model.
//! - `models` ([`ModelTable`]): the served models (one per id the workers announce), each with its
//!   tokenizer and chat template, and which worker serves which. A request is routed, queued and
//!   failed over only among its own model's workers.
//! - `kv_view` ([`KvView`]): what this router knows of each worker's KV cache (its block index,
//!   fed by the worker's cache events) and its load in tokens, for `routing = kv_aware`.
//! - `ticket`: an admitted request holds a [`Ticket`] (its place: sent at once, or waiting in the
//!   queue until a worker has room, or until a worker that lost its stream reconnects), then a
//!   [`Dispatched`] (the request sent to one worker).
//! - `session` ([`Session`]): one request across workers: when its worker is lost it resumes
//!   elsewhere with the tokens already generated (failover).
//! - `settings` ([`PoolSettings`], [`PoolCounters`]): how the pool works, and what it counts.
//!
//! Locks are taken in the order queues -> links -> models -> one link's state, and never held across an
//! `await`; the link tasks release a link's state before they pump the queue.

mod choice;
mod kv_fit;
mod kv_view;
mod link;
mod link_task;
mod models;
mod occupancy;
mod progress;
mod session;
mod settings;
mod ticket;
mod unreachable;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use inference_proto::worker::{AddRequest, InfoResponse};
use tokio::sync::{oneshot, watch};
use tokio::task::AbortHandle;

pub use kv_fit::KvCapacity;
pub use kv_view::{KvIndexState, KvView};
pub use link::{Origin, WorkerEvent, WorkerLink, WorkerSnapshot};
pub use models::{announced_id, combined_numerics, ModelTable, ServedModel};
pub use progress::{Change, Progress};
pub use session::Session;
pub use settings::{PoolCounters, PoolSettings};
use ticket::TicketPool;
pub use ticket::{Dispatched, Ticket};
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

/// The admission queue of each served model, by model id.
type ModelQueues = BTreeMap<Arc<str>, AdmissionQueue<Waiter>>;

/// All workers of this router.
pub struct WorkerPool {
    settings: PoolSettings,
    links: RwLock<Vec<LinkEntry>>,
    models: RwLock<ModelTable>,
    queues: Mutex<ModelQueues>,
    ready: watch::Sender<usize>,
    /// Bumped whenever any worker's readiness may have changed (a model's ready count can change
    /// while the total stays the same).
    readiness: watch::Sender<u64>,
    next_id: AtomicU64,
    counters: PoolCounters,
    /// Turns of `routing = round_robin`.
    round_robin: routing::round_robin::RoundRobin,
}

impl WorkerPool {
    /// Creates the pool with the static `addresses` and starts their links (on the current tokio
    /// runtime). Connections are made in the background: the pool is usable at once and reports no
    /// ready worker until one connects.
    pub fn start(settings: PoolSettings, addresses: &[String]) -> Arc<Self> {
        let pool = Arc::new(Self {
            queues: Mutex::new(BTreeMap::new()),
            settings,
            links: RwLock::new(Vec::new()),
            models: RwLock::new(ModelTable::default()),
            ready: watch::Sender::new(0),
            readiness: watch::Sender::new(0),
            next_id: AtomicU64::new(1),
            counters: PoolCounters::default(),
            round_robin: routing::round_robin::RoundRobin::default(),
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

    /// The model a request naming `requested` gets (`None`: the default model; see
    /// [`crate::model_choice`]).
    ///
    /// Errors: [`RouteError::Model`] for a name no worker serves (or none where several models
    /// are served without a default); [`RouteError::NoWorkersKnown`] /
    /// [`RouteError::NoWorkerReady`] while no worker has described any model.
    pub fn resolve_model(&self, requested: Option<&str>) -> Result<Arc<ServedModel>, RouteError> {
        let resolved = self
            .models
            .read()
            .expect("models lock")
            .resolve(requested, &self.settings.naming)?;
        // Outside the models lock (locks are taken links -> models).
        resolved.ok_or_else(|| RouteError::no_worker(self.configured_workers()))
    }

    /// Every served model with the name it is listed under, by id; each model's public name
    /// first, then the default model's aliases ([`crate::model_choice::ModelNaming::listed`]).
    pub fn served_models(&self) -> Vec<(Arc<ServedModel>, Vec<String>)> {
        let models = self.models.read().expect("models lock");
        let ids = models.ids();
        let naming = &self.settings.naming;
        let default = naming.default_of(&ids);
        models
            .all()
            .map(|m| {
                let mut names = vec![naming.public_name(&m.id, &ids)];
                if default == Some(&*m.id) {
                    names.extend(naming.aliases.iter().cloned());
                }
                (m.clone(), names)
            })
            .collect()
    }

    /// Workers ready now that serve the model `id`.
    pub fn ready_workers_of(&self, id: &str) -> usize {
        self.links_of(id)
            .iter()
            .filter(|l| l.snapshot().ready())
            .count()
    }

    /// The links of the workers that serve the model `id` (whatever their state).
    fn links_of(&self, id: &str) -> Vec<Arc<WorkerLink>> {
        let links = self.links.read().expect("links lock");
        let models = self.models.read().expect("models lock");
        links
            .iter()
            .filter(|e| models.model_of(&e.link.address).is_some_and(|m| &**m == id))
            .map(|e| e.link.clone())
            .collect()
    }

    /// The numeric mode the model `id` runs, as `ModelInfo.numerics` and `/v1/models` report it:
    /// [`combined_numerics`] of the `Info.numerics` of its ready workers, or of every worker that
    /// described it while none is ready (`"exact"`, `"fast"`, `"mixed"`, or empty when no worker
    /// reports a mode).
    pub fn numerics_of(&self, id: &str) -> String {
        let links = self.links_of(id);
        let models = self.models.read().expect("models lock");
        let ready: Vec<&str> = links
            .iter()
            .filter(|l| l.snapshot().ready())
            .filter_map(|l| models.numerics_of(&l.address))
            .collect();
        match ready.is_empty() {
            true => combined_numerics(
                models
                    .workers_of(id)
                    .filter_map(|address| models.numerics_of(address)),
            ),
            false => combined_numerics(ready),
        }
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

    /// Requests and tokens waiting in the admission queues (every model's).
    pub fn queue_depth(&self) -> (usize, u64) {
        let queues = self.queues.lock().expect("queue lock");
        queues
            .values()
            .fold((0, 0), |(n, t), q| (n + q.len(), t + q.tokens()))
    }

    /// New requests waiting per tenant, and every tenant's fair-share counter (summed over the
    /// models' queues).
    pub fn tenant_queues(&self) -> TenantQueues {
        let queues = self.queues.lock().expect("queue lock");
        let mut waiting: BTreeMap<Arc<str>, usize> = BTreeMap::new();
        let mut counters: BTreeMap<Arc<str>, f64> = BTreeMap::new();
        for queue in queues.values() {
            let q = queue.tenant_queues();
            for (tenant, n) in q.waiting {
                *waiting.entry(tenant).or_default() += n;
            }
            for (tenant, c) in q.counters {
                *counters.entry(tenant).or_default() += c;
            }
        }
        TenantQueues {
            waiting: waiting.into_iter().collect(),
            counters: counters.into_iter().collect(),
        }
    }

    /// Charges `tokens` generated for `tenant` to its fair-share counter (as they stream), in
    /// every model's queue: a tenant's service on any model counts against its share on all.
    pub fn charge(&self, tenant: &str, tokens: u64) {
        let mut queues = self.queues.lock().expect("queue lock");
        for queue in queues.values_mut() {
            queue.charge(tenant, tokens);
        }
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
        self.models.write().expect("models lock").forget(address);
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
        self.readiness.send_modify(|generation| *generation += 1);
    }

    /// Admits a new request of `placement` (tenant and priority class) for `model`: sends it to
    /// one of the model's workers at once when the model's queue is empty and one has room, queues
    /// it otherwise (see [`crate::admission`]). `request.request_id` is replaced with a
    /// router-unique id.
    ///
    /// A request that finds no worker of its model ready while one of them is reconnecting (it
    /// lost its stream while ready within `reconnect_grace_ms`) is queued, and its ticket gives
    /// up at the end of that grace unless a worker is back.
    ///
    /// Errors: [`RouteError::NoWorkersKnown`] / [`RouteError::NoWorkerReady`] when no worker of
    /// the model is ready (nor reconnecting), [`RouteError::Overloaded`] when the model's queue
    /// (or the tenant's share of it) is full.
    pub fn admit(
        self: &Arc<Self>,
        model: &ServedModel,
        request: AddRequest,
        placement: Placement,
    ) -> Result<Ticket, RouteError> {
        // No worker ready: wait for one that is reconnecting, else refuse at once.
        let reconnect_by = match self.ready_workers_of(&model.id) {
            0 => Some(
                self.reconnect_deadline_of(&model.id)
                    .ok_or_else(|| RouteError::no_worker(self.configured_workers()))?,
            ),
            _ => None,
        };
        if let Some(refusal) = self.never_fits(model, &request) {
            return Err(refusal.into());
        }
        let key = RouteKey::new(&self.settings, model.block_size, &request)
            .of_tenant(placement.tenant.clone());
        let mut queues = self.queues.lock().expect("queue lock");
        let queue = queues
            .entry(model.id.clone())
            .or_insert_with(|| AdmissionQueue::new(self.settings.admission));
        let tokens = waiting_tokens(&request);
        if queue.is_empty() {
            if let Some(dispatched) = self.dispatch_now(&model.id, &request, &key) {
                queue.dispatched_directly(&placement, tokens);
                return Ok(Ticket::dispatched(self.clone(), &model.id, dispatched));
            }
        }
        let (tx, rx) = oneshot::channel();
        let by = placement.priority;
        let pushed = queue
            .push_new(tokens, placement, Waiter { request, key, tx })
            .inspect_err(|_| {
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            })?;
        drop(queues);
        if let Some(displaced) = pushed.displaced {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            let priority = displaced.placement.as_ref().map_or(0, |p| p.priority);
            let _ = displaced
                .item
                .tx
                .send(Err(QueueFull::Displaced { priority, by }));
        }
        // A worker may have room for it though the queue was not empty: a request that is not
        // sheddable does not count the sheddable ones in flight against the cap, so it can go
        // at once past a queue of sheddable work that waits for room.
        self.pump();
        let ticket = Ticket::queued(self.clone(), &model.id, pushed.id, rx);
        Ok(match reconnect_by {
            Some(by) => ticket.waiting_for_reconnect(by),
            None => ticket,
        })
    }

    /// While no worker of the model `id` is ready: the end of the reconnect grace
    /// (`reconnect_grace_ms` after the latest time one of them lost its stream while ready), if
    /// it is still ahead; `None` when none was lost that recently (or the grace is zero).
    fn reconnect_deadline_of(&self, id: &str) -> Option<Instant> {
        self.links_of(id)
            .iter()
            .filter_map(|l| l.reconnect_grace_end(self.settings.reconnect_grace))
            .max()
    }

    /// The refusal of a request that no ready worker of `model` could ever hold in its KV cache
    /// ([`kv_fit::never_fits`]); `None` when one can, or when a ready worker reports no capacity.
    fn never_fits(&self, model: &ServedModel, request: &AddRequest) -> Option<ValidationError> {
        let workers = self.workers();
        let capacities: Option<Vec<KvCapacity>> = {
            let models = self.models.read().expect("models lock");
            workers
                .iter()
                .filter(|s| s.ready())
                .filter(|s| models.model_of(&s.address) == Some(&model.id))
                .map(|s| s.kv)
                .collect()
        };
        kv_fit::never_fits(request, model.context.context_length, &capacities?)
    }

    /// Queues a request of the model `model` that resumes after its worker was lost, ahead of the
    /// model's new requests.
    pub fn resume(self: &Arc<Self>, model: &Arc<str>, request: AddRequest) -> Ticket {
        let block_size = self
            .models
            .read()
            .expect("models lock")
            .get(model)
            .map_or(0, |m| m.block_size);
        let key = RouteKey::new(&self.settings, block_size, &request);
        let (tx, rx) = oneshot::channel();
        let tokens = waiting_tokens(&request);
        let id = self
            .queues
            .lock()
            .expect("queue lock")
            .entry(model.clone())
            .or_insert_with(|| AdmissionQueue::new(self.settings.admission))
            .push_resumed(tokens, Waiter { request, key, tx });
        self.pump();
        Ticket::queued(self.clone(), model, id, rx)
    }

    /// Sends waiting requests of each model in the queue's order ([`AdmissionQueue::heads`]: the
    /// oldest request of each class and tenant) while one of its workers has room for them. A
    /// request no worker has room for does not hold back the others: room depends on the
    /// request's class and tenant ([`occupancy`]), so after one fails, the others of its
    /// sheddability and tenant are skipped in that round (at most two tries per tenant, whatever
    /// the queue's length).
    fn pump(self: &Arc<Self>) {
        let mut undelivered = Vec::new();
        let mut queues = self.queues.lock().expect("queue lock");
        for (model, queue) in queues.iter_mut() {
            'round: loop {
                let mut blocked: Vec<(bool, Option<Arc<str>>)> = Vec::new();
                for id in queue.heads() {
                    let waiter = &queue.get(id).expect("heads are queued").item;
                    if waiter.tx.is_closed() {
                        queue.remove(id);
                        continue 'round;
                    }
                    let class = (waiter.request.priority < 0, waiter.key.tenant().cloned());
                    if blocked.contains(&class) {
                        continue;
                    }
                    match self.dispatch_now(model, &waiter.request, &waiter.key) {
                        Some(dispatched) => {
                            let entry = queue.take(id).expect("heads are queued");
                            if let Err(Ok(dispatched)) = entry.item.tx.send(Ok(dispatched)) {
                                undelivered.push(dispatched);
                            }
                            // The counters moved: the order is computed again.
                            continue 'round;
                        }
                        None => blocked.push(class),
                    }
                }
                break;
            }
        }
        drop(queues);
        // Cancels them on their workers, which pumps again: outside the queue lock.
        drop(undelivered);
    }

    /// Picks a worker of the model `model` for `request` and sends it there, if one has room.
    fn dispatch_now(
        self: &Arc<Self>,
        model: &str,
        request: &AddRequest,
        key: &RouteKey,
    ) -> Option<Dispatched> {
        let cap = self.settings.max_inflight_per_worker.max(1);
        let mut request = request.clone();
        request.request_id = format!("r{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let mut snapshots: Vec<(Arc<WorkerLink>, WorkerSnapshot)> = self
            .links_of(model)
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
            if let Some(events) = link.try_send(&request, cap, key.tenant()) {
                link.kv.on_dispatch(key.work_tokens);
                self.counters.dispatched.fetch_add(1, Ordering::Relaxed);
                return Some(Dispatched::new(
                    events,
                    self.clone(),
                    link,
                    request.request_id,
                ));
            }
            snapshots.remove(chosen);
        }
        None
    }
}

impl TicketPool for WorkerPool {
    fn failover_timeout(&self) -> Duration {
        self.settings.failover_timeout
    }

    fn watch_readiness(&self) -> watch::Receiver<u64> {
        self.readiness.subscribe()
    }

    fn ready_workers_of(&self, model: &str) -> usize {
        WorkerPool::ready_workers_of(self, model)
    }

    fn configured_workers(&self) -> usize {
        WorkerPool::configured_workers(self)
    }

    fn leave_queue(&self, model: &str, id: u64) {
        let removed = self
            .queues
            .lock()
            .expect("queue lock")
            .get_mut(model)
            .and_then(|queue| queue.remove(id));
        // Its answer channel drops outside the lock.
        drop(removed);
    }

    fn pump_queues(self: Arc<Self>) {
        self.pump();
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
        let template_file = self.settings.chat_template.as_deref();
        // A new model's tokenizer is built outside the lock that dispatch reads.
        let known = self
            .models
            .read()
            .expect("models lock")
            .get(announced_id(info))
            .is_some();
        let built = match known {
            true => None,
            false => Some(Arc::new(ModelContext::from_info(info, template_file)?)),
        };
        self.models
            .write()
            .expect("models lock")
            .adopt(address, info, built, template_file)?;
        Ok(())
    }

    fn refresh_ready(&self) {
        WorkerPool::refresh_ready(self);
    }

    fn pump(self: &Arc<Self>) {
        WorkerPool::pump(self);
    }
}

/// Tokens a waiting request holds: prompt plus already generated.
fn waiting_tokens(request: &AddRequest) -> u64 {
    (request.prompt_ids.len() + request.generated_ids.len()) as u64
}

#[cfg(test)]
mod tests;
