//! The worker side of issue 27 against real router and worker processes on the tiny model:
//!
//! - priority: a sheddable (priority -1) flood fills a worker's small KV cache (16 blocks of 16
//!   tokens) and queues behind it; a priority-10 request sent after it is admitted ahead of the
//!   flood's backlog, preempting sheddable streams, and finishes before any of them; every flood
//!   stream still finishes with the output of its solo run, and every KV block is freed;
//! - prefix-cache isolation: a request salted with `cache_salt` (gRPC and HTTP) hits only the prefix
//!   of its own salt, a tenant with `isolate_prefix_cache` only its own, and an empty salt is refused
//!   naming `cache_salt`.
//!
//! Every loop is bounded (counts or deadlines).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inference_proto::public::{GenerateRequest, ModelInfoRequest};
use integration_tests::{
    authorized, free_port, greedy, start_router_with_env, start_worker_with, tiny_model, wait_idle,
    worker_stats, Generation, Process, PublicClient,
};
use serde_json::{json, Value};

const TENANTS: &str = r#"
[[tenant]]
name = "batch"
keys = ["sk-batch"]
priority = -1

[[tenant]]
name = "live"
keys = ["sk-live"]
max_priority = 10

[[tenant]]
name = "iso"
keys = ["sk-iso"]
isolate_prefix_cache = true
"#;

/// A worker with `worker_args` and a router over it with [`TENANTS`] and the HTTP front.
struct Setup {
    _model_dir: tempfile::TempDir,
    _files: tempfile::TempDir,
    _worker: Process,
    _router: Process,
    worker: String,
    addr: String,
    base: String,
}

async fn setup(worker_args: &[&str]) -> Setup {
    let (model_dir, model) = tiny_model(27);
    let files = tempfile::tempdir().unwrap();
    let tenants_file = files.path().join("tenants.toml");
    std::fs::write(&tenants_file, TENANTS).unwrap();
    let (worker, worker_addr) = start_worker_with(&model, worker_args).await;
    let http = format!("127.0.0.1:{}", free_port());
    let (router, addr) = start_router_with_env(
        &[&worker_addr],
        &[
            "--http-listen",
            &http,
            "--tenants-file",
            tenants_file.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    let s = Setup {
        _model_dir: model_dir,
        _files: files,
        _worker: worker,
        _router: router,
        worker: worker_addr,
        addr,
        base: format!("http://{http}"),
    };
    s.client().await;
    s
}

impl Setup {
    /// A client of the router, once it reports a ready worker (within 30 s).
    async fn client(&self) -> PublicClient {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut client) = PublicClient::connect(format!("http://{}", self.addr)).await {
                let info = client
                    .model_info(authorized(ModelInfoRequest::default(), "sk-live"))
                    .await;
                if info.is_ok_and(|i| i.get_ref().ready_workers > 0) {
                    return client;
                }
            }
            assert!(Instant::now() < deadline, "router not ready after 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A greedy request of `max_new` tokens after a prompt of distinct words numbered from `from`.
fn words(from: usize, count: usize, max_new: u32) -> GenerateRequest {
    let prompt: Vec<String> = (from..from + count).map(|i| format!("w{i}")).collect();
    greedy(&prompt.join(" "), max_new)
}

/// One generation and when its first and last messages arrived.
struct Timed {
    generation: Generation,
    first: Instant,
    done: Instant,
}

/// Runs `request` as `key` to the end of its stream; counts it in `started` at its first message.
async fn generate_as(
    mut client: PublicClient,
    key: &str,
    request: GenerateRequest,
    started: &AtomicUsize,
) -> Result<Timed, tonic::Status> {
    let mut stream = client
        .generate(authorized(request, key))
        .await?
        .into_inner();
    let mut generation = Generation::default();
    let mut first = None;
    while let Some(m) = stream.message().await? {
        if first.is_none() {
            first = Some(Instant::now());
            started.fetch_add(1, Ordering::SeqCst);
        }
        generation.absorb(&m);
    }
    let done = Instant::now();
    Ok(Timed {
        generation,
        first: first.unwrap_or(done),
        done,
    })
}

/// [`generate_as`], expecting success.
async fn run_as(
    client: PublicClient,
    key: &str,
    request: GenerateRequest,
    started: Arc<AtomicUsize>,
) -> Timed {
    generate_as(client, key, request, &started)
        .await
        .expect("Generate")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_priority_request_preempts_a_sheddable_flood_whose_outputs_stay_identical() {
    let s = setup(&["--kv-cache-blocks", "16"]).await;
    let client = s.client().await;
    // Thirty sheddable streams of 12 prompt words + 60 generated tokens (blocks of 16 tokens):
    // the 16 blocks hold three of them whole, so they fill the cache and queue behind it. Thirty
    // make a backlog of about ten rounds of 60 steps, so that streams are still waiting when the
    // priority request arrives even on a loaded machine (with ten, the whole flood sometimes
    // started before it did).
    let flood: Vec<GenerateRequest> = (0..30).map(|i| words(100 * i, 12, 60)).collect();
    let mut solo = Vec::new();
    for r in &flood {
        let t = run_as(client.clone(), "sk-batch", r.clone(), Arc::default()).await;
        solo.push(t.generation.token_ids);
    }
    let before = worker_stats(&s.worker).await.preemptions;
    let started = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = flood
        .iter()
        .map(|r| {
            let (c, r, started) = (client.clone(), r.clone(), started.clone());
            tokio::spawn(async move { run_as(c, "sk-batch", r, started).await })
        })
        .collect();
    // The flood streams and queues in the worker before the priority request is sent.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = worker_stats(&s.worker).await;
        if started.load(Ordering::SeqCst) >= 2 && stats.waiting_sequences > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the flood did not fill the worker: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut high = words(5000, 12, 8);
    high.priority = Some(10);
    let high = run_as(client.clone(), "sk-live", high, started.clone()).await;
    assert_eq!(high.generation.token_ids.len(), 8);
    let mut queued_behind = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        let t = t.await.expect("flood task");
        assert_eq!(
            t.generation.token_ids, solo[i],
            "flood stream {i} differs from its solo run"
        );
        // Admitted ahead of the flood's backlog: first come first served would have started every
        // flood stream that was waiting when the priority request arrived before it, so none would
        // start after it. Which streams the worker had already admitted when the priority request
        // arrived is not visible to the client, so only streams that started after the priority
        // request's first token count as queued behind it; they also finish after it.
        if t.first > high.first {
            queued_behind += 1;
            assert!(t.done > high.done, "flood stream {i} finished first");
        }
    }
    assert!(queued_behind > 0, "no flood stream was queued behind");
    let stats = wait_idle(&s.worker, Duration::from_secs(30)).await;
    assert!(stats.preemptions > before, "no preemption: {stats:?}");
    assert_eq!(stats.kv_blocks_used, 0);
}

/// The worker's prefix-cache hit tokens after `request` ran as `key`.
async fn hits_after(s: &Setup, key: &str, request: GenerateRequest) -> u64 {
    run_as(s.client().await, key, request, Arc::default()).await;
    worker_stats(&s.worker).await.prefix_cache_hit_tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_salted_request_hits_only_its_own_salt_s_prefix() {
    let s = setup(&[]).await;
    // 40 prompt words: at least two full blocks are shareable.
    let salted = |salt: Option<&str>, max_new| {
        let mut r = words(0, 40, max_new);
        r.cache_salt = salt.map(str::to_string);
        r
    };
    let mut seen = hits_after(&s, "sk-live", salted(Some("a"), 1)).await;
    assert_eq!(seen, 0);
    // Another salt, no salt, and an isolated tenant: no hit on salt a's blocks (nor on each other's).
    for (key, salt) in [("sk-live", Some("b")), ("sk-live", None), ("sk-iso", None)] {
        let now = hits_after(&s, key, salted(salt, 2)).await;
        assert_eq!(now, seen, "{key} {salt:?} hit another salt's prefix");
        seen = now;
    }
    // The same salt, the same unsalted sharing, the same isolated tenant: hits.
    for (key, salt) in [("sk-live", Some("a")), ("sk-batch", None), ("sk-iso", None)] {
        let now = hits_after(&s, key, salted(salt, 3)).await;
        assert!(now >= seen + 32, "{key} {salt:?}: {seen} -> {now}");
        seen = now;
    }
    // HTTP's `cache_salt` is the same salt.
    let http = reqwest::Client::new();
    let prompt: Vec<String> = (0..40).map(|i| format!("w{i}")).collect();
    let response = http
        .post(format!("{}/v1/completions", s.base))
        .bearer_auth("sk-live")
        .json(&json!({"prompt": prompt.join(" "), "max_tokens": 1, "cache_salt": "b"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let now = worker_stats(&s.worker).await.prefix_cache_hit_tokens;
    assert!(now >= seen + 32, "HTTP salt b: {seen} -> {now}");
    // An empty salt is refused, naming the field.
    let response = http
        .post(format!("{}/v1/completions", s.base))
        .bearer_auth("sk-live")
        .json(&json!({"prompt": "x", "max_tokens": 1, "cache_salt": ""}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["param"], "cache_salt", "{body}");
    let started = AtomicUsize::new(0);
    let refused = generate_as(s.client().await, "sk-live", salted(Some(""), 1), &started).await;
    let Err(status) = refused else {
        panic!("an empty salt was served");
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("cache_salt"), "{status:?}");
    wait_idle(&s.worker, Duration::from_secs(30)).await;
}
