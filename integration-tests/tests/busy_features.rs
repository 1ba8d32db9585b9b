//! Issue 14's server features while the worker is busy, with real processes on the tiny
//! random-weight model (16k context, one thread, at most 128 batch tokens a step): a prompt of about
//! 12k tokens prefills throughout each test (checked: it has not streamed its first token when
//! the checks are done), then its client hangs up.
//!
//! - API keys: with the long prompt prefilling and four streams decoding, a wrong or missing key
//!   is refused within 1 s on both fronts (gRPC `UNAUTHENTICATED`, HTTP 401), the right key is
//!   served on both (same text), gRPC health and HTTP `/health` stay open and serving;
//! - structured output: twelve requests constrained by a JSON schema (temperature 1) arrive
//!   10 ms apart while the long prompt prefills, every third one cancelled by its client after a few tokens;
//!   every finished output parses and validates, and once the cancels land the worker holds no
//!   sequence and no KV block;
//! - a request no KV cache could ever hold: with the long prompt prefilling and six short streams
//!   (half cancelled), it is refused by the router within 1 s (`INVALID_ARGUMENT`), the worker never
//!   sees it, and the streams are served.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use inference_proto::public::constraint::Kind;
use inference_proto::public::text_generation_client::TextGenerationClient;
use inference_proto::public::{FinishReason, GenerateRequest, TokenizeRequest};
use integration_tests::openai::wait_healthy;
use integration_tests::ops::{channel, health};
use integration_tests::{
    animal_schema, authorized, connect_ready, constrained, free_port, greedy, start_router,
    start_router_with_env, start_worker_with, tiny_model_with_context, wait_idle, Generation,
    PublicClient,
};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tonic_health::pb::health_check_response::ServingStatus;

/// The worker's flags: one thread, at most 128 batch tokens a step (a long prompt takes about a
/// hundred steps).
const WORKER_ARGS: [&str; 4] = ["--threads", "1", "--max-batch-tokens", "128"];

const KEY: &str = "busy-key-3e9d";
const WRONG_KEY: &str = "busy-key-0000";

/// `request` with `authorization: Bearer key`, or without when `key` is `None`.
fn with_key(request: GenerateRequest, key: Option<&str>) -> tonic::Request<GenerateRequest> {
    match key {
        Some(key) => authorized(request, key),
        None => tonic::Request::new(request),
    }
}

/// Runs `request` to the end of its stream, or until `cancel_after` tokens have arrived (then the
/// client hangs up and `None` is returned). `streaming` is incremented at its first token.
async fn follow(
    mut client: PublicClient,
    request: tonic::Request<GenerateRequest>,
    cancel_after: Option<usize>,
    streaming: Arc<AtomicUsize>,
) -> Result<Option<Generation>, tonic::Status> {
    let mut stream = client.generate(request).await?.into_inner();
    let mut g = Generation::default();
    while let Some(m) = stream.message().await? {
        if g.token_ids.is_empty() && !m.tokens.is_empty() {
            streaming.fetch_add(1, Ordering::SeqCst);
        }
        g.absorb(&m);
        if cancel_after.is_some_and(|n| g.token_ids.len() >= n) {
            return Ok(None);
        }
    }
    Ok(Some(g))
}

/// A prompt of about 12k tokens prefilling on the worker.
struct LongPrefill {
    task: JoinHandle<Result<Option<Generation>, tonic::Status>>,
    /// 1 once it has streamed its first token (its prefill is over).
    streamed: Arc<AtomicUsize>,
}

impl LongPrefill {
    /// Sends the long greedy request (with `key`) and waits until the worker is stepping on it.
    async fn start(client: &PublicClient, worker_addr: &str, key: Option<&str>) -> LongPrefill {
        let text = " the and".repeat(6_000);
        let mut c = client.clone();
        let ids = c
            .tokenize(with_key_tokenize(&text, key))
            .await
            .expect("Tokenize")
            .into_inner()
            .ids;
        assert!(
            ids.len() >= 12_000,
            "the long prompt is {} tokens",
            ids.len()
        );
        let streamed = Arc::new(AtomicUsize::new(0));
        let request = with_key(greedy(&text, 4), key);
        let task = tokio::spawn(follow(client.clone(), request, None, streamed.clone()));
        let deadline = Instant::now() + Duration::from_secs(30);
        while integration_tests::worker_stats(worker_addr).await.steps == 0 {
            assert!(Instant::now() < deadline, "the long prompt never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        LongPrefill { task, streamed }
    }

    /// Asserts the test's premise: the long prompt is still prefilling.
    fn assert_still_prefilling(&self) {
        assert_eq!(
            self.streamed.load(Ordering::SeqCst),
            0,
            "the long prefill ended before the checks were done: make the prompt longer"
        );
        assert!(!self.task.is_finished(), "the long request ended early");
    }

    /// Its client hangs up.
    fn cancel(self) {
        self.task.abort();
    }
}

/// A `Tokenize` request for `text` (special tokens added, as `Generate` does), with `key`.
fn with_key_tokenize(text: &str, key: Option<&str>) -> tonic::Request<TokenizeRequest> {
    let request = TokenizeRequest {
        text: text.into(),
        add_special_tokens: true,
    };
    match key {
        Some(key) => authorized(request, key),
        None => tonic::Request::new(request),
    }
}

/// `POST /v1/completions` (greedy, 4 tokens) with an `Authorization` header for `key`; the status,
/// the JSON answer and how long the answer took.
async fn http_completion(base: &str, key: Option<&str>) -> (u16, Value, Duration) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": true}));
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let started = Instant::now();
    let response = request.send().await.expect("POST /v1/completions");
    let status = response.status().as_u16();
    let body = response.json().await.expect("a JSON answer");
    (status, body, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_are_checked_promptly_while_the_worker_is_busy() {
    let (_dir, model) = tiny_model_with_context(41, 16_384);
    let (_worker, worker_addr) = start_worker_with(&model, &WORKER_ARGS).await;
    let http = format!("127.0.0.1:{}", free_port());
    let (_router, router_addr) = start_router_with_env(
        &[&worker_addr],
        &["--http-listen", &http],
        &[("ROUTER_API_KEYS", KEY)],
    )
    .await;
    let base = format!("http://{http}");
    wait_healthy(&base, Duration::from_secs(30)).await;
    let client = TextGenerationClient::new(channel(&router_addr).await);

    let long = LongPrefill::start(&client, &worker_addr, Some(KEY)).await;
    // Four streams decoding beside it (far from their end when the checks are done).
    let streaming = Arc::new(AtomicUsize::new(0));
    let streams: Vec<_> = (0..4)
        .map(|i| {
            let request = with_key(greedy(&format!("Stream {i}:"), 2_000), Some(KEY));
            tokio::spawn(follow(client.clone(), request, None, streaming.clone()))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while streaming.load(Ordering::SeqCst) < 4 {
        assert!(Instant::now() < deadline, "the streams did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Wrong and missing keys: refused within a second on both fronts, a few times over.
    let limit = Duration::from_secs(1);
    for round in 0..3 {
        for key in [Some(WRONG_KEY), None] {
            let started = Instant::now();
            let request = with_key(greedy("Let me in", 4), key);
            let status = follow(client.clone(), request, None, Arc::default())
                .await
                .expect_err("refused");
            let took = started.elapsed();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
            assert!(
                took < limit,
                "round {round}, gRPC key {key:?}: refused after {took:?}"
            );
            let (code, body, took) = http_completion(&base, key).await;
            assert_eq!(code, 401, "{body}");
            assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
            assert!(
                took < limit,
                "round {round}, HTTP key {key:?}: refused after {took:?}"
            );
        }
    }
    // Health is open and serving on both fronts.
    let service = "inference.v1.TextGeneration";
    assert_eq!(
        health(&router_addr, service).await.ok(),
        Some(ServingStatus::Serving)
    );
    wait_healthy(&base, Duration::from_millis(500)).await;
    // The right key is served on both fronts, with the same text.
    let request = with_key(greedy("Hello", 4), Some(KEY));
    let served = follow(client.clone(), request, None, Arc::default())
        .await
        .expect("served with the right key")
        .expect("not cancelled");
    assert_eq!(served.token_ids.len(), 4);
    let (code, body, _) = http_completion(&base, Some(KEY)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], served.text.as_str(), "{body}");

    long.assert_still_prefilling();
    for s in &streams {
        assert!(
            !s.is_finished(),
            "a stream ended before the checks were done"
        );
    }
    long.cancel();
    streams.iter().for_each(|s| s.abort());
    let stats = wait_idle(&worker_addr, Duration::from_secs(10)).await;
    assert!(stats.cancelled_requests >= 5, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_output_beside_a_long_prefill_and_cancels_always_parses_and_frees_blocks() {
    let (_dir, model) = tiny_model_with_context(42, 16_384);
    let (_worker, worker_addr) = start_worker_with(&model, &WORKER_ARGS).await;
    let (_router, router_addr) = start_router(&[&worker_addr], &[]).await;
    let client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    let schema = animal_schema();
    let validator = jsonschema::validator_for(&schema).expect("a valid schema");

    let long = LongPrefill::start(&client, &worker_addr, None).await;
    // Twelve constrained requests 10 ms apart; every third one hangs up after 1 to 3 tokens.
    let mut tasks = Vec::new();
    for i in 0..12u64 {
        let kind = Kind::JsonSchema(schema.to_string());
        let request = constrained(&format!("Animal {i} as JSON:"), kind, 60, i);
        let cancel_after = (i % 3 == 0).then_some(1 + (i as usize / 3) % 3);
        let task = follow(
            client.clone(),
            tonic::Request::new(request),
            cancel_after,
            Arc::default(),
        );
        tasks.push(tokio::spawn(task));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let results = join_all(tasks).await;
    let mut finished = 0;
    for (i, result) in results.into_iter().enumerate() {
        let outcome = result
            .unwrap()
            .unwrap_or_else(|s| panic!("request {i}: {s:?}"));
        let Some(g) = outcome else {
            assert_eq!(i % 3, 0, "request {i} was not to be cancelled");
            continue;
        };
        assert_ne!(i % 3, 0, "request {i} was to be cancelled");
        assert!(
            matches!(
                g.finish_reason,
                FinishReason::ConstraintComplete | FinishReason::EosToken
            ),
            "request {i}: {:?} after {} tokens: {:?}",
            g.finish_reason,
            g.token_ids.len(),
            g.text
        );
        let value: Value = serde_json::from_str(&g.text)
            .unwrap_or_else(|e| panic!("request {i}: {e}: {:?}", g.text));
        assert!(validator.is_valid(&value), "request {i}: {value}");
        finished += 1;
    }
    assert_eq!(finished, 8);
    long.assert_still_prefilling();

    long.cancel();
    let stats = wait_idle(&worker_addr, Duration::from_secs(10)).await;
    // The four constrained cancels and the long prompt's reached the worker.
    assert!(stats.cancelled_requests >= 5, "{stats:?}");
    // The worker still serves constrained requests afterwards.
    let kind = Kind::JsonSchema(schema.to_string());
    let mut c = client.clone();
    let after = integration_tests::generate(&mut c, constrained("One more:", kind, 60, 99))
        .await
        .expect("served after the cancels");
    let value: Value = serde_json::from_str(&after.text).expect("JSON");
    assert!(validator.is_valid(&value), "{value}");
}

/// While the long prompt prefills and short streams decode (some cancelled), a request that no
/// worker's KV cache could ever hold is refused at once by the router (`INVALID_ARGUMENT`, before
/// any work: the worker never sees it), and the short requests are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_kv_cache_can_hold_is_refused_at_once_while_busy() {
    let (_dir, model) = tiny_model_with_context(43, 16_384);
    // 800 blocks of 16 tokens: the ~12k-token prompt fits, ~9k + 4,096 new tokens does not.
    let mut args = WORKER_ARGS.to_vec();
    args.extend(["--kv-cache-blocks", "800"]);
    let (_worker, worker_addr) = start_worker_with(&model, &args).await;
    let (_router, router_addr) = start_router(&[&worker_addr], &[]).await;
    let client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    let long = LongPrefill::start(&client, &worker_addr, None).await;
    let mut streams = Vec::new();
    for i in 0..6u64 {
        let request = tonic::Request::new(greedy(&format!("stream {i}"), 40));
        let cancel_after = (i % 2 == 0).then_some(2);
        streams.push(tokio::spawn(follow(
            client.clone(),
            request,
            cancel_after,
            Arc::default(),
        )));
    }
    let mut c = client.clone();
    let started = Instant::now();
    let status = c
        .generate(greedy(&" the and".repeat(4_500), 4_096))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().ends_with(
            "KV blocks; the largest KV cache of the ready workers has 800 blocks of 16 tokens"
        ),
        "{status:?}"
    );
    assert!(waited < Duration::from_secs(1), "refused after {waited:?}");
    for (i, stream) in streams.into_iter().enumerate() {
        let outcome = stream
            .await
            .unwrap()
            .unwrap_or_else(|s| panic!("{i}: {s:?}"));
        assert_eq!(outcome.is_none(), i % 2 == 0, "stream {i}");
    }
    long.assert_still_prefilling();
    long.cancel();
    let stats = wait_idle(&worker_addr, Duration::from_secs(10)).await;
    assert_eq!(
        stats.failed_requests, 0,
        "the worker saw the refused request: {stats:?}"
    );
    assert_eq!(stats.kv_blocks_used, 0, "{stats:?}");
}
