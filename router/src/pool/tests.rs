//! The pool against in-process fake workers: dispatch, affinity, admission limits, health,
//! discovery changes and failover that loses nothing.
//!
//! A fake worker emits one token per request every few milliseconds; token `n` of a request is a
//! pure function of (prompt, seed, n), like a greedy or seeded run of a real model, and it honours
//! `generated_ids` (it continues at index `generated_ids.len()`). "Killing" one ends its streams
//! with an error and makes `Info`/`Health` fail, as a dead process would look to the router.
//! "Freezing" one stops its steps and holds every `Health` answer until it thaws (a hung engine, or
//! a SIGSTOPped process); a "slow health" one keeps stepping but answers `Health` only after
//! [`SLOW_HEALTH`] (a busy worker under the old blocking health check).

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::Stream;
use inference_proto::worker::worker_server::{Worker, WorkerServer};
use inference_proto::worker::{
    router_message, worker_message, AddRequest, HealthRequest, HealthResponse, InfoRequest,
    InfoResponse, KvCacheBlocksRequest, KvCacheBlocksResponse, LoadReport, RouterMessage,
    SamplingParams, StepOutput, StopReason, TokenOutput, TokenizerSpec, WorkerMessage,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use super::*;
use crate::admission::{AdmissionLimits, QueueFull};
use crate::affinity::AffinityPolicy;
use routing::Routing;

/// Token `index` of a request: what any worker would generate there.
fn expected_token(prompt: &[u32], seed: u64, index: usize) -> u32 {
    let sum: u64 = prompt.iter().map(|&t| u64::from(t)).sum();
    ((sum + seed + 31 * index as u64) % 200 + 3) as u32
}

/// How long a "slow health" fake takes to answer `Health` (ten probe intervals of [`settings`]).
const SLOW_HEALTH: Duration = Duration::from_millis(500);

#[derive(Clone)]
struct Fake {
    step: Duration,
    killed: watch::Receiver<bool>,
    healthy: Arc<AtomicBool>,
    frozen: Arc<AtomicBool>,
    slow_health: Arc<AtomicBool>,
    /// Request ids of every CancelRequest received.
    cancels: Arc<Mutex<Vec<String>>>,
    /// Every AddRequest received.
    adds: Arc<Mutex<Vec<AddRequest>>>,
}

/// Handle of a running fake worker.
struct FakeWorker {
    address: String,
    kill: watch::Sender<bool>,
    healthy: Arc<AtomicBool>,
    frozen: Arc<AtomicBool>,
    slow_health: Arc<AtomicBool>,
    cancels: Arc<Mutex<Vec<String>>>,
    adds: Arc<Mutex<Vec<AddRequest>>>,
}

impl FakeWorker {
    async fn start(step: Duration) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (kill, killed) = watch::channel(false);
        let fake = Fake {
            step,
            killed,
            healthy: Arc::new(AtomicBool::new(true)),
            frozen: Arc::default(),
            slow_health: Arc::default(),
            cancels: Arc::default(),
            adds: Arc::default(),
        };
        let fake_handle = fake.clone();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(WorkerServer::new(fake))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Self {
            address,
            kill,
            healthy: fake_handle.healthy,
            frozen: fake_handle.frozen,
            slow_health: fake_handle.slow_health,
            cancels: fake_handle.cancels,
            adds: fake_handle.adds,
        }
    }

    fn kill(&self) {
        self.kill.send_replace(true);
    }

    /// Undoes [`FakeWorker::kill`]: `Info` and `Health` answer again and new streams serve, as
    /// a restarted worker (or one that closed a router's stream and takes it back) would.
    fn revive(&self) {
        self.kill.send_replace(false);
    }

    fn adds(&self) -> Vec<AddRequest> {
        self.adds.lock().unwrap().clone()
    }
}

fn info() -> InfoResponse {
    static TINY: std::sync::OnceLock<gguf::testing::TinyModelInfo> = std::sync::OnceLock::new();
    let tiny = TINY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("router-pool-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tiny = gguf::testing::write_tiny_llama(&dir.join("tiny.gguf"), 1).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        tiny
    });
    let mut types = vec![3; 3];
    types.resize(tiny.tokens.len(), 1);
    InfoResponse {
        model_name: "fake".into(),
        architecture: "llama".into(),
        context_length: 256,
        vocab_size: tiny.tokens.len() as u32,
        eos_token_ids: vec![2],
        tokenizer: Some(TokenizerSpec {
            model: "gpt2".into(),
            pre: "smollm".into(),
            tokens: tiny.tokens.clone(),
            merges: tiny.merges.clone(),
            token_types: types,
            bos_token_id: Some(1),
            add_bos_token: false,
            tokenizer_json: String::new(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

type Out = Pin<Box<dyn Stream<Item = Result<WorkerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Worker for Fake {
    type GenerateStream = Out;

    async fn generate(
        &self,
        request: Request<Streaming<RouterMessage>>,
    ) -> Result<Response<Out>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        let (step, adds, mut killed) = (self.step, self.adds.clone(), self.killed.clone());
        let (frozen, cancels) = (self.frozen.clone(), self.cancels.clone());
        tokio::spawn(async move {
            // (request, next index)
            let mut active: Vec<(AddRequest, usize)> = Vec::new();
            // Cancels emptied the batch: the next tick sends an idle load report, as the real
            // engine does (once it runs again, when frozen).
            let mut owe_idle_report = false;
            let mut tick = tokio::time::interval(step);
            loop {
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(RouterMessage { kind: Some(router_message::Kind::Add(add)) })) => {
                            adds.lock().unwrap().push(add.clone());
                            let next = add.generated_ids.len();
                            active.push((add, next));
                        }
                        Ok(Some(RouterMessage { kind: Some(router_message::Kind::Cancel(c)) })) => {
                            active.retain(|(a, _)| a.request_id != c.request_id);
                            cancels.lock().unwrap().push(c.request_id);
                            owe_idle_report |= active.is_empty();
                        }
                        Ok(Some(_)) => {}
                        _ => return,
                    },
                    _ = tick.tick() => {
                        if frozen.load(Ordering::Relaxed) {
                            continue;
                        }
                        if active.is_empty() {
                            if std::mem::take(&mut owe_idle_report) {
                                let idle = StepOutput {
                                    load: Some(LoadReport::default()),
                                    ..Default::default()
                                };
                                let _ = tx.send(Ok(WorkerMessage { kind: Some(worker_message::Kind::Step(idle)) }));
                            }
                            continue;
                        }
                        let mut out = StepOutput::default();
                        for (add, next) in &mut active {
                            let seed = add.sampling.as_ref().map_or(0, |s| s.seed);
                            let finished = *next + 1 >= add.max_new_tokens as usize;
                            out.tokens.push(TokenOutput {
                                request_id: add.request_id.clone(),
                                token_id: expected_token(&add.prompt_ids, seed, *next),
                                index: *next as u32,
                                finished,
                                stop_reason: if finished { StopReason::Length as i32 } else { 0 },
                                ..Default::default()
                            });
                            *next += 1;
                        }
                        active.retain(|(a, next)| *next < a.max_new_tokens as usize);
                        out.load = Some(LoadReport {
                            running_sequences: active.len() as u32,
                            ..Default::default()
                        });
                        let _ = tx.send(Ok(WorkerMessage { kind: Some(worker_message::Kind::Step(out)) }));
                    }
                    _ = killed.wait_for(|k| *k) => {
                        let _ = tx.send(Err(Status::unavailable("killed")));
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }

    async fn info(&self, _: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
        if *self.killed.borrow() {
            return Err(Status::unavailable("killed"));
        }
        Ok(Response::new(info()))
    }

    async fn kv_cache_blocks(
        &self,
        _: Request<KvCacheBlocksRequest>,
    ) -> Result<Response<KvCacheBlocksResponse>, Status> {
        Err(Status::unimplemented("the fake worker has no prefix cache"))
    }

    async fn health(&self, _: Request<HealthRequest>) -> Result<Response<HealthResponse>, Status> {
        if *self.killed.borrow() {
            return Err(Status::unavailable("killed"));
        }
        if self.slow_health.load(Ordering::Relaxed) {
            tokio::time::sleep(SLOW_HEALTH).await;
        }
        while self.frozen.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(Response::new(HealthResponse {
            ready: self.healthy.load(Ordering::Relaxed),
            ..Default::default()
        }))
    }
}

fn settings() -> PoolSettings {
    PoolSettings {
        backoff: (Duration::from_millis(10), Duration::from_millis(100)),
        health_interval: Duration::from_millis(50),
        failover_timeout: Duration::from_millis(500),
        ..PoolSettings::default()
    }
}

async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn request(prompt: Vec<u32>, seed: u64, max_new_tokens: u32) -> AddRequest {
    AddRequest {
        prompt_ids: prompt,
        sampling: Some(SamplingParams {
            seed,
            ..Default::default()
        }),
        max_new_tokens,
        ..Default::default()
    }
}

/// Runs a session to its last token; returns the token ids.
async fn run(session: &mut Session) -> Result<Vec<u32>, RouteError> {
    let mut ids = Vec::new();
    let mut start = None;
    loop {
        let token = session.next().await?;
        let start = *start.get_or_insert(token.index as usize);
        assert_eq!(
            token.index as usize,
            start + ids.len(),
            "indices are contiguous"
        );
        ids.push(token.token_id);
        if token.finished {
            return Ok(ids);
        }
    }
}

fn start_session(pool: &Arc<WorkerPool>, req: AddRequest) -> Result<Session, RouteError> {
    start_session_at(pool, req, 0)
}

/// A session of the default tenant whose request has `priority` (on the worker too).
fn start_session_at(
    pool: &Arc<WorkerPool>,
    req: AddRequest,
    priority: i32,
) -> Result<Session, RouteError> {
    start_session_of(pool, req, priority, "default")
}

/// A session of `tenant` whose request has `priority`.
fn start_session_of(
    pool: &Arc<WorkerPool>,
    mut req: AddRequest,
    priority: i32,
    tenant: &str,
) -> Result<Session, RouteError> {
    req.priority = priority;
    let placement = crate::admission::Placement {
        priority,
        tenant: tenant.into(),
        ..crate::admission::Placement::default_tenant()
    };
    let model = pool.resolve_model(None)?;
    let ticket = pool.admit(&model, req.clone(), placement)?;
    Ok(Session::new(pool.clone(), req, ticket))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_continues_the_stream_exactly() {
    let a = FakeWorker::start(Duration::from_millis(2)).await;
    let b = FakeWorker::start(Duration::from_millis(2)).await;
    let pool = WorkerPool::start(settings(), &[a.address.clone(), b.address.clone()]);
    wait_until("both ready", || pool.ready_workers() == 2).await;
    let prompts: Vec<Vec<u32>> = (0..8u32).map(|i| vec![40 + i, 50, 60 + i]).collect();
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut session = start_session(&pool, request(p.clone(), 7, 200)).unwrap();
            tokio::spawn(async move { (run(&mut session).await, session.failovers()) })
        })
        .collect();
    // Let them stream a while, then kill the worker that carries requests.
    wait_until("tokens flowing", || a.adds().len() + b.adds().len() == 8).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let (victim, survivor) = if a.adds().is_empty() {
        (&b, &a)
    } else {
        (&a, &b)
    };
    let lost = victim.adds().len();
    victim.kill();
    let mut moved = 0;
    for (task, prompt) in tasks.into_iter().zip(&prompts) {
        let (ids, failovers) = task.await.unwrap();
        let ids = ids.expect("every request completes");
        let want: Vec<u32> = (0..200).map(|n| expected_token(prompt, 7, n)).collect();
        assert_eq!(ids, want, "prompt {prompt:?}");
        moved += failovers;
    }
    assert_eq!(moved as usize, lost);
    assert_eq!(
        pool.counters().failovers.load(Ordering::Relaxed),
        lost as u64
    );
    let resumed: Vec<_> = survivor
        .adds()
        .into_iter()
        .filter(|r| !r.generated_ids.is_empty())
        .collect();
    assert_eq!(resumed.len(), lost);
    for r in resumed {
        let seed = r.sampling.as_ref().unwrap().seed;
        assert_eq!(seed, 7);
        assert_eq!(r.max_new_tokens, 200);
        let want: Vec<u32> = (0..r.generated_ids.len())
            .map(|n| expected_token(&r.prompt_ids, 7, n))
            .collect();
        assert_eq!(r.generated_ids, want);
    }
    wait_until("victim out of rotation", || pool.ready_workers() == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_worker_left_means_unavailable_after_the_failover_timeout() {
    let a = FakeWorker::start(Duration::from_millis(5)).await;
    let settings = PoolSettings {
        reconnect_grace: Duration::from_millis(800),
        ..settings()
    };
    let pool = WorkerPool::start(settings, std::slice::from_ref(&a.address));
    wait_until("ready", || pool.ready_workers() == 1).await;
    let mut session = start_session(&pool, request(vec![5, 6], 1, 10_000)).unwrap();
    session.next().await.unwrap();
    a.kill();
    let started = Instant::now();
    let err = run(&mut session).await.unwrap_err();
    let RouteError::NoWorkerLeft { cause, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(
        matches!(**cause, RouteError::NoWorkerInTime { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("no worker is left"), "{err}");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "waited for a worker first"
    );
    assert_eq!(
        pool.counters().failovers_exhausted.load(Ordering::Relaxed),
        1
    );
    // A new request within the reconnect grace (800 ms after the loss) waits for the worker to
    // come back, and fails when it does not.
    let mut session = start_session(&pool, request(vec![1], 1, 5)).unwrap();
    let err = run(&mut session).await.unwrap_err();
    assert!(
        matches!(err, RouteError::NoWorkerInTime { ready: 0, .. }),
        "{err:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(750),
        "waited to the end of the grace: {:?}",
        started.elapsed()
    );
    // Past the grace, new requests are refused at once.
    let err = start_session(&pool, request(vec![1], 1, 5)).err().unwrap();
    assert_eq!(err, RouteError::NoWorkerReady { configured: 1 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_request_waits_for_a_worker_that_is_reconnecting() {
    let a = FakeWorker::start(Duration::from_millis(2)).await;
    let pool = WorkerPool::start(settings(), std::slice::from_ref(&a.address));
    wait_until("ready", || pool.ready_workers() == 1).await;
    // The worker drops the stream and is back 300 ms later (a restart, or a stream it closed).
    a.kill();
    wait_until("out of rotation", || pool.ready_workers() == 0).await;
    let lost = Instant::now();
    let mut sessions: Vec<Session> = (0..4)
        .map(|i| start_session(&pool, request(vec![9, i], 3, 20)).expect("queued, not refused"))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.revive();
    for (i, session) in sessions.iter_mut().enumerate() {
        let ids = run(session).await.expect("served once the worker is back");
        let prompt = [9, i as u32];
        let want: Vec<u32> = (0..20).map(|n| expected_token(&prompt, 3, n)).collect();
        assert_eq!(ids, want);
    }
    assert!(lost.elapsed() >= Duration::from_millis(300));
    // With the grace off, the same gap refuses at once.
    let pool = WorkerPool::start(
        PoolSettings {
            reconnect_grace: Duration::ZERO,
            ..settings()
        },
        std::slice::from_ref(&a.address),
    );
    wait_until("ready", || pool.ready_workers() == 1).await;
    a.kill();
    wait_until("out of rotation", || pool.ready_workers() == 0).await;
    let err = start_session(&pool, request(vec![1], 1, 5)).err().unwrap();
    assert_eq!(err, RouteError::NoWorkerReady { configured: 1 });
    a.revive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_back_late_in_the_grace_is_found_in_time() {
    // The default backoff (100 ms doubling to 5 s) would next try at +3.1 s after tries at +0.7
    // and +1.5 s; during the grace the link retries every 100 ms instead.
    let settings = PoolSettings {
        backoff: (Duration::from_millis(100), Duration::from_secs(5)),
        ..settings()
    };
    let a = FakeWorker::start(Duration::from_millis(2)).await;
    let pool = WorkerPool::start(settings, std::slice::from_ref(&a.address));
    wait_until("ready", || pool.ready_workers() == 1).await;
    a.kill();
    wait_until("out of rotation", || pool.ready_workers() == 0).await;
    let mut session = start_session(&pool, request(vec![4, 2], 5, 6)).expect("queued");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    a.revive();
    let ids = run(&mut session)
        .await
        .expect("served: the worker was back within the grace");
    let want: Vec<u32> = (0..6).map(|n| expected_token(&[4, 2], 5, n)).collect();
    assert_eq!(ids, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_was_ready_gets_no_grace() {
    // Nothing listens at this address: the worker never connects, so nothing reconnects.
    let address = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let a = FakeWorker::start(Duration::from_millis(2)).await;
    let pool = WorkerPool::start(settings(), &[a.address.clone(), address]);
    wait_until("ready", || pool.ready_workers() == 1).await;
    // A worker that was unhealthy when it went away gets none either (it was draining).
    a.healthy.store(false, Ordering::SeqCst);
    wait_until("unhealthy", || pool.ready_workers() == 0).await;
    a.kill();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let err = start_session(&pool, request(vec![1], 1, 5)).err().unwrap();
    assert_eq!(err, RouteError::NoWorkerReady { configured: 2 });
}

/// A pool under `settings` over one fake worker (2 ms per token), once the worker is ready.
async fn one_worker_pool(settings: PoolSettings) -> (FakeWorker, Arc<WorkerPool>) {
    let a = FakeWorker::start(Duration::from_millis(2)).await;
    let pool = WorkerPool::start(settings, std::slice::from_ref(&a.address));
    wait_until("ready", || pool.ready_workers() == 1).await;
    (a, pool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_limits_refuse_at_once_and_waiters_run_in_order() {
    let (a, pool) = one_worker_pool(PoolSettings {
        max_inflight_per_worker: 1,
        admission: AdmissionLimits {
            max_waiting_requests: 2,
            max_waiting_tokens: 1_000,
        },
        ..settings()
    })
    .await;
    let mut sessions: Vec<Session> = (0..3u32)
        .map(|i| start_session(&pool, request(vec![i + 10], 0, 20)).unwrap())
        .collect();
    assert_eq!(pool.queue_depth(), (2, 2));
    let err = start_session(&pool, request(vec![9], 0, 5)).err().unwrap();
    assert_eq!(
        err,
        RouteError::Overloaded(QueueFull::Requests { waiting: 2, max: 2 })
    );
    assert_eq!(pool.counters().rejected.load(Ordering::Relaxed), 1);
    for s in &mut sessions {
        assert_eq!(run(s).await.unwrap().len(), 20);
    }
    let order: Vec<u32> = a.adds().iter().map(|r| r.prompt_ids[0]).collect();
    assert_eq!(order, [10, 11, 12]);
    assert_eq!(pool.queue_depth(), (0, 0));
    // A waiter that gives up leaves the queue.
    let running = start_session(&pool, request(vec![1], 0, 1_000)).unwrap();
    let waiting = start_session(&pool, request(vec![2; 5], 0, 5)).unwrap();
    assert_eq!(pool.queue_depth(), (1, 5));
    drop(waiting);
    assert_eq!(pool.queue_depth(), (0, 0));
    drop(running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sheddable_work_in_flight_never_keeps_a_higher_priority_request_waiting() {
    let (a, pool) = one_worker_pool(PoolSettings {
        max_inflight_per_worker: 2,
        ..settings()
    })
    .await;
    // Two sheddable requests fill the worker's slots; two more wait in the router.
    let mut shed: Vec<Session> = (0..4u32)
        .map(|i| start_session_at(&pool, request(vec![i + 10], 0, 2_000), -1).unwrap())
        .collect();
    wait_until("two sent", || a.adds().len() == 2).await;
    assert_eq!(pool.queue_depth().0, 2);
    // A priority-0 request goes to the worker at once, past the sheddable queue (the sheddable
    // requests in flight do not count against its cap), and so does a second one.
    let mut urgent: Vec<Session> = (0..2u32)
        .map(|i| start_session_at(&pool, request(vec![i + 50], 0, 5), 0).unwrap())
        .collect();
    wait_until("urgent sent", || a.adds().len() == 4).await;
    let sent: Vec<(u32, i32)> = (a.adds().iter())
        .map(|r| (r.prompt_ids[0], r.priority))
        .collect();
    assert_eq!(sent, [(10, -1), (11, -1), (50, 0), (51, 0)]);
    assert_eq!(pool.queue_depth().0, 2);
    // A third waits: two non-sheddable requests are in flight, the cap.
    let mut third = start_session_at(&pool, request(vec![52], 0, 5), 0).unwrap();
    assert_eq!(pool.queue_depth().0, 3);
    for s in urgent.iter_mut().chain([&mut third]) {
        assert_eq!(run(s).await.unwrap().len(), 5);
    }
    // It went before the sheddable ones queued ahead of it.
    assert_eq!(a.adds()[4].prompt_ids[0], 52);
    for s in &mut shed {
        assert_eq!(run(s).await.unwrap().len(), 2_000);
    }
    assert_eq!(pool.queue_depth(), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_below_its_share_goes_past_another_tenants_full_slots() {
    let (a, pool) = one_worker_pool(PoolSettings {
        max_inflight_per_worker: 4,
        ..settings()
    })
    .await;
    // Tenant "flood" takes the 4 slots and queues 2 more.
    let mut flood: Vec<Session> = (0..6u32)
        .map(|i| start_session_of(&pool, request(vec![i + 10], 0, 1_000), 0, "flood").unwrap())
        .collect();
    wait_until("four sent", || a.adds().len() == 4).await;
    assert_eq!(pool.queue_depth().0, 2);
    // Tenant "small" (share 4 / 2 = 2) sends two at once past the flood's queue; its third
    // waits, as the flood's do.
    let mut small: Vec<Session> = (0..3u32)
        .map(|i| start_session_of(&pool, request(vec![i + 50], 0, 5), 0, "small").unwrap())
        .collect();
    wait_until("small sent", || a.adds().len() == 6).await;
    let sent: Vec<u32> = a.adds().iter().map(|r| r.prompt_ids[0]).collect();
    assert_eq!(sent, [10, 11, 12, 13, 50, 51]);
    assert_eq!(pool.queue_depth().0, 3);
    for s in small.iter_mut().chain(&mut flood) {
        assert!(run(s).await.is_ok());
    }
    assert_eq!(pool.queue_depth(), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_prefix_goes_to_one_worker_and_unhealthy_workers_are_skipped() {
    let workers = [
        FakeWorker::start(Duration::from_millis(1)).await,
        FakeWorker::start(Duration::from_millis(1)).await,
        FakeWorker::start(Duration::from_millis(1)).await,
    ];
    let addresses: Vec<String> = workers.iter().map(|w| w.address.clone()).collect();
    // Prefix affinity (the fake workers report no KV cache for `kv_aware` to follow).
    let s = PoolSettings {
        routing: Routing::Affinity,
        affinity: AffinityPolicy {
            prefix_tokens: 4,
            load_factor: 0.5,
        },
        ..settings()
    };
    let pool = WorkerPool::start(s, &addresses);
    wait_until("ready", || pool.ready_workers() == 3).await;
    for i in 0..6u32 {
        let mut session = start_session(&pool, request(vec![1, 2, 3, 4, 100 + i], 0, 3)).unwrap();
        run(&mut session).await.unwrap();
    }
    let counts: Vec<usize> = workers.iter().map(|w| w.adds().len()).collect();
    assert!(
        counts.contains(&6),
        "one worker took the shared prefix: {counts:?}"
    );
    let favourite = counts.iter().position(|&c| c == 6).unwrap();
    workers[favourite].healthy.store(false, Ordering::Relaxed);
    wait_until("favourite out of rotation", || pool.ready_workers() == 2).await;
    let mut session = start_session(&pool, request(vec![1, 2, 3, 4, 99], 0, 3)).unwrap();
    run(&mut session).await.unwrap();
    assert_eq!(
        workers[favourite].adds().len(),
        6,
        "the unhealthy worker got nothing"
    );
    workers[favourite].healthy.store(true, Ordering::Relaxed);
    wait_until("favourite back", || pool.ready_workers() == 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_workers_come_and_go_and_their_requests_fail_over() {
    let a = FakeWorker::start(Duration::from_millis(2)).await;
    let b = FakeWorker::start(Duration::from_millis(2)).await;
    let pool = WorkerPool::start(settings(), &[]);
    let both = BTreeSet::from([a.address.clone(), b.address.clone()]);
    assert_eq!(pool.sync_discovered(&both), (2, 0));
    assert_eq!(pool.sync_discovered(&both), (0, 0));
    wait_until("both ready", || pool.ready_workers() == 2).await;
    let mut sessions: Vec<Session> = (0..4u32)
        .map(|i| start_session(&pool, request(vec![i * 13, 1], 3, 150)).unwrap())
        .collect();
    for s in &mut sessions {
        s.next().await.unwrap();
    }
    let on_a = sessions
        .iter()
        .filter(|s| s.worker_address() == Some(a.address.as_str()))
        .count();
    assert_eq!(
        pool.sync_discovered(&BTreeSet::from([b.address.clone()])),
        (0, 1)
    );
    assert_eq!(pool.configured_workers(), 1);
    for s in &mut sessions {
        let rest = run(s).await.unwrap();
        assert_eq!(rest.len(), 149);
    }
    assert_eq!(
        pool.counters().failovers.load(Ordering::Relaxed),
        on_a as u64
    );
    assert!(pool.workers().iter().all(|w| w.address == b.address));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_worker_whose_probes_time_out_stays_in_rotation() {
    let a = FakeWorker::start(Duration::from_millis(2)).await;
    let pool = WorkerPool::start(settings(), std::slice::from_ref(&a.address));
    wait_until("ready", || pool.ready_workers() == 1).await;
    // Every probe now times out (500 ms answers, 50 ms interval) while steps keep coming.
    a.slow_health.store(true, Ordering::Relaxed);
    let sessions: Vec<_> = (0..4u32)
        .map(|i| {
            let mut session = start_session(&pool, request(vec![i, 9], 1, 400)).unwrap();
            tokio::spawn(async move { run(&mut session).await })
        })
        .collect();
    let mut ready = pool.ready_watch();
    let watcher = tokio::spawn(async move {
        // Records any moment without a ready worker.
        while ready.changed().await.is_ok() {
            if *ready.borrow() == 0 {
                return false;
            }
        }
        true
    });
    let started = Instant::now();
    for task in sessions {
        assert_eq!(task.await.unwrap().unwrap().len(), 400);
    }
    assert!(
        started.elapsed() > SLOW_HEALTH,
        "long enough for probes to miss"
    );
    assert!(
        !watcher.is_finished(),
        "the worker left rotation while busy"
    );
    watcher.abort();
    assert_eq!(pool.ready_workers(), 1);
    assert!(pool.counters().health_probe_misses.load(Ordering::Relaxed) > 0);
    assert_eq!(pool.counters().stalls.load(Ordering::Relaxed), 0);
    assert_eq!(pool.counters().failovers.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_worker_leaves_rotation_its_requests_fail_over_and_it_rejoins() {
    let a = FakeWorker::start(Duration::from_millis(2)).await;
    let b = FakeWorker::start(Duration::from_millis(2)).await;
    let s = PoolSettings {
        // Long enough that the healthy fake worker (a step every 2 ms) is never taken for stalled
        // on a loaded 2-core machine (a 300 ms timeout once failed there).
        stall_timeout: Duration::from_millis(1000),
        ..settings()
    };
    let pool = WorkerPool::start(s, &[a.address.clone(), b.address.clone()]);
    wait_until("both ready", || pool.ready_workers() == 2).await;
    let prompts: Vec<Vec<u32>> = (0..8u32).map(|i| vec![70 + i, 3, 80 + i]).collect();
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut session = start_session(&pool, request(p.clone(), 5, 400)).unwrap();
            tokio::spawn(async move { (run(&mut session).await, session.failovers()) })
        })
        .collect();
    wait_until("tokens flowing", || a.adds().len() + b.adds().len() == 8).await;
    tokio::time::sleep(Duration::from_millis(40)).await;
    let victim = if a.adds().is_empty() { &b } else { &a };
    let on_victim = victim.adds().len();
    let frozen_at = Instant::now();
    victim.frozen.store(true, Ordering::Relaxed);
    wait_until("the victim stalled", || {
        pool.workers()
            .iter()
            .any(|w| w.address == victim.address && w.stalled)
    })
    .await;
    let stalled_after = frozen_at.elapsed();
    assert!(
        stalled_after >= Duration::from_millis(1000) && stalled_after < Duration::from_secs(4),
        "stalled after {stalled_after:?} (stall timeout 1 s)"
    );
    assert_eq!(pool.ready_workers(), 1);
    let mut moved = 0;
    for (task, prompt) in tasks.into_iter().zip(&prompts) {
        let (ids, failovers) = task.await.unwrap();
        let want: Vec<u32> = (0..400).map(|n| expected_token(prompt, 5, n)).collect();
        assert_eq!(ids.expect("every request completes"), want);
        moved += failovers;
    }
    assert_eq!(
        moved as usize, on_victim,
        "every request on the victim moved"
    );
    assert_eq!(pool.counters().stalls.load(Ordering::Relaxed), 1);
    // Its requests were cancelled on it, for when it runs again.
    assert_eq!(victim.cancels.lock().unwrap().len(), on_victim);
    // Still frozen: it stays out although the router has nothing on it any more.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(pool.ready_workers(), 1);
    victim.frozen.store(false, Ordering::Relaxed);
    wait_until("the victim rejoined", || pool.ready_workers() == 2).await;
    let before = victim.adds().len();
    // Its prefix-affinity or load share brings new requests to it again.
    for i in 0..8u32 {
        let mut session = start_session(&pool, request(vec![200 + i], 1, 3)).unwrap();
        run(&mut session).await.unwrap();
    }
    assert!(
        victim.adds().len() > before,
        "the rejoined worker takes requests"
    );
}

/// The table keeps each described worker's `Info.numerics`: a model's workers give its mode,
/// `mixed` while they differ; a forgotten worker no longer counts, and one that comes back counts
/// with its new mode.
#[test]
fn the_model_table_keeps_each_workers_numerics() {
    let mut table = ModelTable::default();
    let with = |numerics: &str| InfoResponse {
        numerics: numerics.into(),
        ..info()
    };
    let id = table.adopt("a", &with("exact"), None, None).unwrap();
    table.adopt("b", &with("exact"), None, None).unwrap();
    let mode =
        |t: &ModelTable| combined_numerics(t.workers_of(&id).filter_map(|a| t.numerics_of(a)));
    assert_eq!(mode(&table), "exact");
    table.adopt("c", &with("fast"), None, None).unwrap();
    assert_eq!(table.numerics_of("c"), Some("fast"));
    assert_eq!(mode(&table), "mixed");
    table.forget("c");
    assert_eq!(table.numerics_of("c"), None);
    assert_eq!(mode(&table), "exact");
    table.adopt("a", &with("fast"), None, None).unwrap();
    table.adopt("b", &with("fast"), None, None).unwrap();
    assert_eq!(mode(&table), "fast");
}
