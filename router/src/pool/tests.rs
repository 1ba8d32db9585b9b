//! The pool against in-process fake workers: dispatch, affinity, admission limits, health,
//! discovery changes and failover that loses nothing.
//!
//! A fake worker emits one token per request every few milliseconds; token `n` of a request is a
//! pure function of (prompt, seed, n), like a greedy or seeded run of a real model, and it honours
//! `generated_ids` (it continues at index `generated_ids.len()`). "Killing" one ends its streams
//! with an error and makes `Info`/`Health` fail, as a dead process would look to the router.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::Stream;
use inference_proto::worker::worker_server::{Worker, WorkerServer};
use inference_proto::worker::{
    router_message, worker_message, AddRequest, HealthRequest, HealthResponse, InfoRequest,
    InfoResponse, LoadReport, RouterMessage, SamplingParams, StepOutput, StopReason, TokenOutput,
    TokenizerSpec, WorkerMessage,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use super::*;

/// Token `index` of a request: what any worker would generate there.
fn expected_token(prompt: &[u32], seed: u64, index: usize) -> u32 {
    let sum: u64 = prompt.iter().map(|&t| u64::from(t)).sum();
    ((sum + seed + 31 * index as u64) % 200 + 3) as u32
}

#[derive(Clone)]
struct Fake {
    step: Duration,
    killed: watch::Receiver<bool>,
    healthy: Arc<AtomicBool>,
    /// Every AddRequest received.
    adds: Arc<Mutex<Vec<AddRequest>>>,
}

/// Handle of a running fake worker.
struct FakeWorker {
    address: String,
    kill: watch::Sender<bool>,
    healthy: Arc<AtomicBool>,
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
            adds: Arc::default(),
        };
        let (healthy, adds) = (fake.healthy.clone(), fake.adds.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(WorkerServer::new(fake))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Self {
            address,
            kill,
            healthy,
            adds,
        }
    }

    fn kill(&self) {
        self.kill.send_replace(true);
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
        tokio::spawn(async move {
            // (request, next index)
            let mut active: Vec<(AddRequest, usize)> = Vec::new();
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
                        }
                        Ok(Some(_)) => {}
                        _ => return,
                    },
                    _ = tick.tick() => {
                        if active.is_empty() {
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

    async fn health(&self, _: Request<HealthRequest>) -> Result<Response<HealthResponse>, Status> {
        if *self.killed.borrow() {
            return Err(Status::unavailable("killed"));
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
async fn run(session: &mut Session) -> Result<Vec<u32>, Status> {
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

fn start_session(pool: &Arc<WorkerPool>, req: AddRequest) -> Result<Session, Status> {
    let ticket = pool.admit(req.clone())?;
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
    let pool = WorkerPool::start(settings(), std::slice::from_ref(&a.address));
    wait_until("ready", || pool.ready_workers() == 1).await;
    let mut session = start_session(&pool, request(vec![5, 6], 1, 10_000)).unwrap();
    session.next().await.unwrap();
    a.kill();
    let started = Instant::now();
    let err = run(&mut session).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("no worker is left"), "{err:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "waited for a worker first"
    );
    assert_eq!(
        pool.counters().failovers_exhausted.load(Ordering::Relaxed),
        1
    );
    // New requests are refused at once.
    let err = start_session(&pool, request(vec![1], 1, 5)).err().unwrap();
    assert!(err.message().contains("no worker is ready"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_limits_refuse_at_once_and_waiters_run_in_order() {
    let a = FakeWorker::start(Duration::from_millis(2)).await;
    let s = PoolSettings {
        max_inflight_per_worker: 1,
        admission: AdmissionLimits {
            max_waiting_requests: 2,
            max_waiting_tokens: 1_000,
        },
        ..settings()
    };
    let pool = WorkerPool::start(s, std::slice::from_ref(&a.address));
    wait_until("ready", || pool.ready_workers() == 1).await;
    let mut sessions: Vec<Session> = (0..3u32)
        .map(|i| start_session(&pool, request(vec![i + 10], 0, 20)).unwrap())
        .collect();
    assert_eq!(pool.queue_depth(), (2, 2));
    let err = start_session(&pool, request(vec![9], 0, 5)).err().unwrap();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(
        err.message().contains("max_waiting_requests = 2"),
        "{err:?}"
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
async fn same_prefix_goes_to_one_worker_and_unhealthy_workers_are_skipped() {
    let workers = [
        FakeWorker::start(Duration::from_millis(1)).await,
        FakeWorker::start(Duration::from_millis(1)).await,
        FakeWorker::start(Duration::from_millis(1)).await,
    ];
    let addresses: Vec<String> = workers.iter().map(|w| w.address.clone()).collect();
    let s = PoolSettings {
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
