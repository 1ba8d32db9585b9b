//! The router's workers and how requests reach them.
//!
//! - `link` ([`WorkerLink`]): one bidirectional stream per worker, reconnected with backoff, health-probed.
//! - `unreachable`: the rate limit of the "worker unreachable" log.
//! - `progress`: the stall rule (a worker with work and no progress for `stall_timeout_ms` leaves
//!   rotation; a busy one whose probes time out does not).
//! - this module: the set of workers (static ones and DNS-discovered ones that come and go), the
//!   served model, the admission queue ([`crate::admission`]) and dispatch by the picking policy
//!   ([`crate::affinity`]).
//! - `ticket` ([`Ticket`], [`Dispatched`]): an admitted request's place in the queue, then its
//!   dispatch to one worker.
//! - `session` ([`Session`]): one request across workers: when its worker is lost it resumes elsewhere with the
//!   tokens already generated (failover).
//!
//! Locks are taken in the order queue -> links -> one link's state, and never held across an
//! `await`; the link tasks release a link's state before they pump the queue.

mod kv_fit;
mod link;
mod progress;
mod session;
mod ticket;
mod unreachable;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use inference_proto::worker::AddRequest;
use tokio::sync::{oneshot, watch};
use tokio::task::AbortHandle;

pub use link::{Origin, WorkerEvent, WorkerLink, WorkerSnapshot};
pub use progress::{Change, Progress};
pub use session::Session;
pub use ticket::{Dispatched, Ticket};
pub use unreachable::{Unreachable, UnreachableLog};

use crate::admission::{AdmissionLimits, AdmissionQueue};
use crate::affinity::{AffinityPolicy, Candidate};
use crate::model_context::{ChatTemplateFile, ModelContext};
use crate::route_error::RouteError;
pub use kv_fit::KvCapacity;

/// How the pool connects, picks, queues and fails over.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// First and longest reconnect delay.
    pub backoff: (Duration, Duration),
    /// Period of the health probe (also its timeout; a probe without an answer changes nothing).
    pub health_interval: Duration,
    /// A worker with work (requests of this router in flight, or its health says `has_work`) that
    /// shows no progress for this long leaves rotation and its requests fail over.
    pub stall_timeout: Duration,
    /// Most requests this router has in flight on one worker.
    pub max_inflight_per_worker: usize,
    /// The admission queue's limits.
    pub admission: AdmissionLimits,
    /// The picking policy.
    pub affinity: AffinityPolicy,
    /// How long a request waits for a ready worker when none is left (after its worker was lost, or
    /// while queued) before it fails ([`RouteError::NoWorkerInTime`], `UNAVAILABLE`).
    pub failover_timeout: Duration,
    /// Most failovers of one request (a request that keeps losing workers fails).
    pub max_failovers: u32,
    /// The `chat_template` setting's template, which overrides the model's (see
    /// [`ModelContext::from_info`]).
    pub chat_template: Option<Arc<ChatTemplateFile>>,
    /// TLS of the links to workers (the CA their certificates must chain to); `None` = plain.
    pub worker_tls: Option<tls_certs::ClientTls>,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            backoff: (Duration::from_millis(100), Duration::from_secs(5)),
            health_interval: Duration::from_secs(2),
            stall_timeout: Duration::from_secs(60),
            max_inflight_per_worker: 64,
            admission: AdmissionLimits {
                max_waiting_requests: 256,
                max_waiting_tokens: 262_144,
            },
            affinity: AffinityPolicy {
                prefix_tokens: 64,
                load_factor: 0.5,
            },
            failover_timeout: Duration::from_secs(10),
            max_failovers: 3,
            chat_template: None,
            worker_tls: None,
        }
    }
}

/// Event counters (read by metrics).
#[derive(Debug, Default)]
pub struct PoolCounters {
    /// Requests sent to a worker (a failover counts again).
    pub dispatched: AtomicU64,
    /// Requests that resumed on another worker after theirs was lost.
    pub failovers: AtomicU64,
    /// Requests that failed because no worker was left to continue them.
    pub failovers_exhausted: AtomicU64,
    /// Requests refused by the admission queue ([`RouteError::Overloaded`], `RESOURCE_EXHAUSTED`).
    pub rejected: AtomicU64,
    /// Health probes that got no answer in time (not taken as "down").
    pub health_probe_misses: AtomicU64,
    /// Times a worker was taken out of rotation by the stall rule.
    pub stalls: AtomicU64,
}

struct Waiter {
    request: AddRequest,
    key: Option<u64>,
    tx: oneshot::Sender<Dispatched>,
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

    /// Adds a worker and starts its link; `false` when the address is already known.
    pub fn add_worker(self: &Arc<Self>, address: &str, origin: Origin) -> bool {
        let mut links = self.links.write().expect("links lock");
        if links.iter().any(|e| e.link.address == address) {
            return false;
        }
        let link = Arc::new(WorkerLink::new(address.to_string(), origin));
        let task = tokio::spawn(link::maintain(self.clone(), link.clone())).abort_handle();
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

    /// Admits a new request: sends it to a worker at once when the queue is empty and one has
    /// room, queues it otherwise. `request.request_id` is replaced with a router-unique id.
    ///
    /// Errors: [`RouteError::NoWorkersKnown`] / [`RouteError::NoWorkerReady`] when no worker is
    /// ready, [`RouteError::Overloaded`] when the queue is full.
    pub fn admit(self: &Arc<Self>, request: AddRequest) -> Result<Ticket, RouteError> {
        if self.ready_workers() == 0 {
            return Err(RouteError::no_worker(self.configured_workers()));
        }
        if let Some(refusal) = self.never_fits(&request) {
            return Err(refusal.into());
        }
        let key = self.settings.affinity.key(&request.prompt_ids);
        let mut queue = self.queue.lock().expect("queue lock");
        if queue.is_empty() {
            if let Some(dispatched) = self.dispatch_now(&request, key) {
                return Ok(Ticket::dispatched(self.clone(), dispatched));
            }
        }
        let (tx, rx) = oneshot::channel();
        let tokens = waiting_tokens(&request);
        let id = queue
            .push_new(tokens, Waiter { request, key, tx })
            .inspect_err(|_| {
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            })?;
        Ok(Ticket::queued(self.clone(), id, rx))
    }

    /// The refusal of a request that no ready worker's KV cache could ever hold
    /// ([`kv_fit::never_fits`]); `None` when one can, or when a ready worker reports no capacity.
    fn never_fits(&self, request: &AddRequest) -> Option<crate::validation::ValidationError> {
        let model = self.model()?;
        let capacities: Option<Vec<KvCapacity>> = self
            .workers()
            .iter()
            .filter(|s| s.ready())
            .map(|s| s.kv)
            .collect();
        kv_fit::never_fits(request, model.context_length, &capacities?)
    }

    /// Queues a request that resumes after its worker was lost, ahead of new requests.
    pub fn resume(self: &Arc<Self>, request: AddRequest) -> Ticket {
        let key = self.settings.affinity.key(&request.prompt_ids);
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
            let Some(dispatched) = self.dispatch_now(&front.item.request, front.item.key) else {
                break;
            };
            let entry = queue.pop_front().expect("front exists");
            if let Err(dispatched) = entry.item.tx.send(dispatched) {
                undelivered.push(dispatched);
            }
        }
        drop(queue);
        // Cancels them on their workers, which pumps again: outside the queue lock.
        drop(undelivered);
    }

    /// Picks a worker for `request` and sends it there, if one has room.
    fn dispatch_now(
        self: &Arc<Self>,
        request: &AddRequest,
        key: Option<u64>,
    ) -> Option<Dispatched> {
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
            let candidates: Vec<Candidate<'_>> = snapshots
                .iter()
                .map(|(_, s)| Candidate {
                    address: &s.address,
                    load: s.load,
                    has_room: s.inflight < cap,
                })
                .collect();
            let chosen = self.settings.affinity.pick(key, &candidates)?;
            let link = snapshots[chosen].0.clone();
            if let Some(events) = link.try_send(&request, cap) {
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

/// Tokens a waiting request holds: prompt plus already generated.
fn waiting_tokens(request: &AddRequest) -> u64 {
    (request.prompt_ids.len() + request.generated_ids.len()) as u64
}

#[cfg(test)]
mod tests;
