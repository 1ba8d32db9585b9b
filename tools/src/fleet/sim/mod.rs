//! The fleet simulator: a discrete-event simulation of R routers and W modelled workers
//! ([`worker::SimWorker`]) in which every routing decision is made by the router's own code, the
//! `routing` crate ([`routing::affinity::AffinityPolicy`], [`routing::round_robin::RoundRobin`],
//! [`routing::kv_aware::KvAwarePolicy`] over [`routing::index::BlockIndex`]es), fed as the router
//! feeds it (`router/src/pool/choice.rs`).
//!
//! # Model
//!
//! - Time is an integer count of nanoseconds; events (arrivals, step ends) are ordered by time, then
//!   by the order they were scheduled, so a seed gives one result on every machine.
//! - Requests go to routers in turn (as a client spreading over router replicas). A router picks a
//!   worker among those with room (fewer than `max_inflight_per_worker` of its requests in flight);
//!   when none has room the request waits in that router's queue until one of its requests ends.
//! - Every router receives every worker's cache events and load report at the end of each of the
//!   worker's steps, without delay (one index per worker serves all routers, since all would hold the
//!   same). A router's load of a worker adds what it sent since that report (work in tokens and
//!   requests), as the router does.
//! - Network and router processing time are not modelled (zero).
//! - Each worker has its own cores unless [`SimConfig::host`] says that all of them share one
//!   machine's cores (the real calibration runs: W single-thread workers on a 2-core machine). Then
//!   the busy workers share the cores equally (processor sharing, as the OS scheduler approximately
//!   does): with `b` workers mid-step, each of `t` threads, a step's work advances at
//!   `min(1, cores / (b x t))` seconds per second, so a step's length depends on what else runs
//!   while it runs. Every change of `b` moves every busy worker's end (O(W) per event: meant for the
//!   calibration's few workers, not the 1,000-worker sweeps, which give each worker its own cores).

pub mod worker;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use routing::affinity::{AffinityPolicy, Candidate};
use routing::index::BlockIndex;
use routing::kv_aware::{KvAwarePolicy, KvCandidate, PromptChain};
use routing::round_robin::RoundRobin;
use routing::Routing;

use worker::{CostModel, Job, SimWorker, WorkerLimits};

use super::outcome::{FleetOutcome, RequestTiming};

/// A simulation's settings.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SimConfig {
    /// Workers (W).
    pub workers: usize,
    /// Routers (R).
    pub routers: usize,
    /// The policy every router runs.
    pub routing: Routing,
    /// Each worker's limits.
    pub limits: WorkerLimits,
    /// Each worker's step time.
    pub cost: CostModel,
    /// The router setting `max_inflight_per_worker`.
    pub max_inflight_per_worker: usize,
    /// The router setting `affinity_prefix_tokens`.
    pub affinity_prefix_tokens: usize,
    /// The load factor of both `affinity` and `kv_aware` (router default 0.5).
    pub load_factor: f64,
    /// `kv_aware`'s prefill weight (router `kv_prefill_weight`).
    pub prefill_weight: f64,
    /// `kv_aware`'s decode weight (router `kv_decode_weight`).
    pub decode_weight: f64,
    /// Cores shared by all workers (`None`: each worker has its own, its steps take exactly
    /// [`CostModel::step_seconds`]).
    pub host: Option<SharedHost>,
}

/// One machine's cores shared by every simulated worker (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SharedHost {
    /// The machine's cores (CPU threads the OS schedules on).
    pub cores: f64,
    /// Compute threads per worker (the worker setting `threads`).
    pub threads_per_worker: usize,
}

impl SharedHost {
    /// Seconds of step work done per second when `busy` workers are mid-step (at most 1).
    pub fn rate(&self, busy: usize) -> f64 {
        let demand = (busy * self.threads_per_worker.max(1)) as f64;
        if demand <= self.cores {
            1.0
        } else {
            self.cores / demand
        }
    }
}

/// One request as the simulator takes it: token ids, output length, arrival, dependency.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Tokens to generate.
    pub max_new_tokens: usize,
    /// Arrival, in seconds.
    pub arrival_s: f64,
    /// A request that must finish first (a conversation's previous turn).
    pub after: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival(usize),
    /// Worker, and the generation of its step end (an older one is stale: the step was moved).
    StepEnd(usize, u64),
}

/// What a router sent one worker since the worker's last load report (the router's `KvView`
/// counts the same).
#[derive(Debug, Clone, Copy, Default)]
struct SentSinceReport {
    /// Work in tokens ([`routing::kv_aware::request_work_tokens`] of each request).
    work_tokens: u64,
    /// Requests.
    requests: usize,
}

#[derive(Debug)]
struct SimRouter {
    round_robin: RoundRobin,
    /// This router's requests in flight, per worker.
    inflight: Vec<usize>,
    /// What this router sent each worker since its last load report.
    sent_since_report: Vec<SentSinceReport>,
    queue: VecDeque<usize>,
}

#[derive(Debug)]
struct WorkerState {
    model: SimWorker,
    index: BlockIndex,
    /// Last report: (running + waiting, KV demand tokens).
    report: (usize, u64),
    /// The planned step in progress (chunks per running sequence).
    step: Option<Vec<usize>>,
    /// Seconds of work (at full speed) left in the step in progress.
    work_left_s: f64,
    /// Bumped whenever the step's end is rescheduled; older `StepEnd`s are ignored.
    generation: u64,
}

/// Runs `requests` through the simulated fleet and returns every request's timing and each
/// worker's counters.
pub fn simulate(config: &SimConfig, requests: &[SimRequest]) -> FleetOutcome {
    Simulation::new(config, requests).run()
}

struct Simulation<'a> {
    config: SimConfig,
    requests: &'a [SimRequest],
    addresses: Vec<String>,
    routers: Vec<SimRouter>,
    workers: Vec<WorkerState>,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    scheduled: u64,
    now: u64,
    /// Seconds of step work per second for every busy worker since `rate_since` (1 without a
    /// shared host).
    rate: f64,
    rate_since: u64,
    /// Per request: (router, worker) once routed.
    placed: Vec<Option<(usize, usize)>>,
    timings: Vec<RequestTiming>,
    dependents: HashMap<usize, Vec<usize>>,
    affinity: AffinityPolicy,
    kv_aware: KvAwarePolicy,
}

fn nanos(seconds: f64) -> u64 {
    (seconds.max(0.0) * 1e9).round() as u64
}

impl<'a> Simulation<'a> {
    fn new(config: &SimConfig, requests: &'a [SimRequest]) -> Self {
        let w = config.workers.max(1);
        let r = config.routers.max(1);
        let mut dependents: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, req) in requests.iter().enumerate() {
            if let Some(prev) = req.after {
                dependents.entry(prev).or_default().push(i);
            }
        }
        let mut sim = Self {
            config: *config,
            requests,
            addresses: (0..w)
                .map(|i| format!("10.{}.{}.{}:50061", i / 65_536, (i / 256) % 256, i % 256))
                .collect(),
            routers: (0..r)
                .map(|_| SimRouter {
                    round_robin: RoundRobin::default(),
                    inflight: vec![0; w],
                    sent_since_report: vec![SentSinceReport::default(); w],
                    queue: VecDeque::new(),
                })
                .collect(),
            workers: (0..w)
                .map(|i| WorkerState {
                    model: SimWorker::new(config.limits, i as u64 + 1),
                    index: BlockIndex::new(config.limits.kv_blocks),
                    report: (0, 0),
                    step: None,
                    work_left_s: 0.0,
                    generation: 0,
                })
                .collect(),
            events: BinaryHeap::new(),
            scheduled: 0,
            now: 0,
            rate: 1.0,
            rate_since: 0,
            placed: vec![None; requests.len()],
            timings: requests
                .iter()
                .map(|r| RequestTiming {
                    arrival_s: r.arrival_s,
                    first_token_s: None,
                    finish_s: None,
                    output_tokens: r.max_new_tokens as u64,
                })
                .collect(),
            dependents,
            affinity: AffinityPolicy {
                prefix_tokens: config.affinity_prefix_tokens,
                load_factor: config.load_factor,
            },
            kv_aware: KvAwarePolicy {
                load_factor: config.load_factor,
                prefill_weight: config.prefill_weight,
                decode_weight: config.decode_weight,
            },
        };
        for (i, req) in requests.iter().enumerate() {
            if req.after.is_none() {
                sim.schedule(nanos(req.arrival_s), Event::Arrival(i));
            }
        }
        sim
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.scheduled += 1;
        self.events.push(Reverse((at, self.scheduled, event)));
    }

    fn run(mut self) -> FleetOutcome {
        self.run_events();
        self.outcome()
    }

    /// Processes events until none is left (every request finished).
    fn run_events(&mut self) {
        while let Some(Reverse((at, _, event))) = self.events.pop() {
            if let Event::StepEnd(w, generation) = event {
                if generation != self.workers[w].generation {
                    continue; // moved by a change of the shared host's rate
                }
            }
            self.now = at;
            self.progress();
            match event {
                Event::Arrival(i) => {
                    self.timings[i].arrival_s = at as f64 / 1e9;
                    let router = i % self.routers.len();
                    self.routers[router].queue.push_back(i);
                    self.drain_queue(router);
                }
                Event::StepEnd(w, _) => self.end_step(w),
            }
            self.reshare();
        }
    }

    /// Charges the work every busy worker did since `rate_since` (shared host only).
    fn progress(&mut self) {
        if self.config.host.is_none() {
            return;
        }
        let done = (self.now - self.rate_since) as f64 / 1e9 * self.rate;
        for state in &mut self.workers {
            if state.step.is_some() {
                state.work_left_s = (state.work_left_s - done).max(0.0);
            }
        }
        self.rate_since = self.now;
    }

    /// With a shared host: the rate for the workers now busy, and every busy worker's step end
    /// rescheduled at it.
    fn reshare(&mut self) {
        let Some(host) = self.config.host else {
            return;
        };
        let busy = self.workers.iter().filter(|s| s.step.is_some()).count();
        self.rate = host.rate(busy);
        self.rate_since = self.now;
        for w in 0..self.workers.len() {
            let state = &mut self.workers[w];
            if state.step.is_some() {
                state.generation += 1;
                let (at, generation) = (
                    self.now + nanos(state.work_left_s / self.rate).max(1),
                    state.generation,
                );
                self.schedule(at, Event::StepEnd(w, generation));
            }
        }
    }

    fn outcome(self) -> FleetOutcome {
        FleetOutcome {
            requests: self.timings,
            worker_requests: self.workers.iter().map(|w| w.model.requests).collect(),
            worker_query_tokens: self.workers.iter().map(|w| w.model.query_tokens).collect(),
            worker_hit_tokens: self.workers.iter().map(|w| w.model.hit_tokens).collect(),
        }
    }

    /// Routes this router's queued requests, in order, while a worker has room.
    fn drain_queue(&mut self, router: usize) {
        while let Some(&i) = self.routers[router].queue.front() {
            let Some(w) = self.pick(router, i) else {
                return;
            };
            self.routers[router].queue.pop_front();
            let req = &self.requests[i];
            let r = &mut self.routers[router];
            r.inflight[w] += 1;
            let sent = &mut r.sent_since_report[w];
            sent.requests += 1;
            sent.work_tokens +=
                routing::kv_aware::request_work_tokens(req.prompt.len(), req.max_new_tokens);
            self.placed[i] = Some((router, w));
            let job = Job {
                request: i,
                chain: routing::block_hashes(&req.prompt, self.config.limits.block_size),
                prompt_tokens: req.prompt.len(),
                max_new_tokens: req.max_new_tokens,
            };
            self.workers[w].model.submit(job);
            self.start_step(w);
        }
    }

    /// The worker `router` picks for request `i` with the `routing` crate (as `choice.rs` does).
    fn pick(&self, router: usize, i: usize) -> Option<usize> {
        let r = &self.routers[router];
        let cap = self.config.max_inflight_per_worker;
        let prompt = &self.requests[i].prompt;
        match self.config.routing {
            Routing::KvAware => {
                let chain = PromptChain::new(prompt, self.config.limits.block_size);
                let candidates: Vec<KvCandidate<'_>> = self
                    .workers
                    .iter()
                    .enumerate()
                    .map(|(w, s)| KvCandidate {
                        address: &self.addresses[w],
                        has_room: r.inflight[w] < cap,
                        cached_blocks: s.index.prefix_blocks(&chain.hashes),
                        load_tokens: s.report.1 + r.sent_since_report[w].work_tokens,
                        sequences: (s.report.0 + r.sent_since_report[w].requests)
                            .max(r.inflight[w]),
                    })
                    .collect();
                self.kv_aware
                    .pick(&chain, self.requests[i].max_new_tokens, &candidates)
            }
            Routing::RoundRobin => {
                let addresses: Vec<&str> = self.addresses.iter().map(String::as_str).collect();
                let has_room: Vec<bool> = r.inflight.iter().map(|&n| n < cap).collect();
                r.round_robin.pick(&addresses, &has_room)
            }
            Routing::Affinity => {
                let candidates: Vec<Candidate<'_>> = self
                    .workers
                    .iter()
                    .enumerate()
                    .map(|(w, s)| Candidate {
                        address: &self.addresses[w],
                        load: r.inflight[w].max(s.report.0),
                        has_room: r.inflight[w] < cap,
                    })
                    .collect();
                self.affinity.pick(self.affinity.key(prompt), &candidates)
            }
        }
    }

    /// Starts worker `w`'s next step unless one is in progress or it has nothing to do.
    fn start_step(&mut self, w: usize) {
        let state = &mut self.workers[w];
        if state.step.is_some() {
            return;
        }
        if let Some((tokens, decodes, chunks)) = state.model.plan_step() {
            let seconds = self.config.cost.step_seconds(tokens, decodes);
            state.step = Some(chunks);
            state.work_left_s = seconds;
            if self.config.host.is_none() {
                let generation = state.generation;
                self.schedule(
                    self.now + nanos(seconds).max(1),
                    Event::StepEnd(w, generation),
                );
            } // else `reshare` schedules it once the event is done
        }
    }

    fn end_step(&mut self, w: usize) {
        let now_s = self.now as f64 / 1e9;
        let state = &mut self.workers[w];
        let chunks = state.step.take().expect("a step in progress");
        let outcome = state.model.finish_step(&chunks);
        state.index.apply(&outcome.stored, &outcome.evicted);
        state.report = state.model.load();
        for r in &mut self.routers {
            r.sent_since_report[w] = SentSinceReport::default();
        }
        for &i in &outcome.first_tokens {
            self.timings[i].first_token_s = Some(now_s);
        }
        let mut routers_freed = Vec::new();
        for &i in &outcome.finished {
            self.timings[i].finish_s = Some(now_s);
            if let Some((router, worker)) = self.placed[i] {
                self.routers[router].inflight[worker] -= 1;
                routers_freed.push(router);
            }
            for d in self.dependents.remove(&i).unwrap_or_default() {
                let at = nanos(self.requests[d].arrival_s).max(self.now);
                self.schedule(at, Event::Arrival(d));
            }
        }
        self.start_step(w);
        routers_freed.sort_unstable();
        routers_freed.dedup();
        for router in routers_freed {
            self.drain_queue(router);
        }
    }
}

#[cfg(test)]
mod tests;
