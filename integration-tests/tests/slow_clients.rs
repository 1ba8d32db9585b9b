//! Slow and stuck clients (issue 31), with real router and worker processes on 127.0.0.1: 32
//! streams whose client never reads them (an HTTP/2 stream window of 1 KiB, never released) beside
//! 8 normal streams on another connection. Each stuck stream is held on the worker once its buffer
//! is full (out of the batch, generating nothing); the normal streams flow to their end with the
//! same tokens as without the stuck ones; each stuck stream is cancelled once its buffer stayed full
//! for `slow_client_timeout_ms` and ends with `RESOURCE_EXHAUSTED` naming the setting; the worker
//! ends with every KV block free, and the router's memory stays bounded. A client that pauses and
//! reads again gets every token, exactly those of an uninterrupted stream. (No ITL figure here: the
//! tiny model streams its tokens in bursts, too fast for one; `bench stuck-clients` measures it
//! on SmolLM2.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use inference_proto::public::text_generation_client::TextGenerationClient;
use inference_proto::public::GenerateRequest;
use inference_proto::worker::EngineStats;
use integration_tests::{
    connect_ready, greedy, start_router_with_env, start_worker_with, stream_all,
    tiny_model_with_context, wait_idle, worker_stats, PublicClient,
};
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

const STUCK: usize = 32;
const NORMAL: usize = 8;
const SLOW_CLIENT_TIMEOUT_MS: u64 = 3_000;
/// Tokens each stuck request asks for: more than the worker makes within the timeout.
const STUCK_TOKENS: u32 = 8_000;

/// Most tokens a held stream may have received: the router's 64 messages, what its 1 KiB HTTP/2
/// window and the transport's chunk hold, and the steps in flight when the hold reached the worker.
const MAX_BUFFERED_TOKENS: usize = 256;

/// Waits up to 60 s until the worker at `addr` holds `n` sequences.
async fn wait_held(addr: &str, n: u32) -> EngineStats {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = worker_stats(addr).await;
        if stats.held_sequences == n {
            return stats;
        }
        assert!(
            Instant::now() < deadline,
            "the worker holds {} sequences, not {n}: {stats:?}",
            stats.held_sequences
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A connection of its own to the router at `router_addr` whose HTTP/2 stream window is 1 KiB:
/// a client that stops reading on it fills the router's buffer after a few messages.
async fn small_window_channel(router_addr: &str) -> Channel {
    Endpoint::from_shared(format!("http://{router_addr}"))
        .unwrap()
        .initial_stream_window_size(1024)
        .connect()
        .await
        .unwrap()
}

/// Runs the normal requests concurrently to their end: their token ids.
async fn run_normal(client: &PublicClient, requests: &[GenerateRequest]) -> Vec<Vec<u32>> {
    stream_all(client, requests, Arc::default())
        .await
        .into_iter()
        .map(|r| r.expect("a normal stream ends well").generation.token_ids)
        .collect()
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_clients_are_cancelled_after_the_timeout_and_never_hold_back_the_others() {
    let (_dir, model) = tiny_model_with_context(17, 8_192);
    let (_worker, worker_addr) = start_worker_with(&model, &["--max-num-seqs", "64"]).await;
    let (router, router_addr) = start_router_with_env(
        &[&worker_addr],
        &[
            "--slow-client-timeout-ms",
            &SLOW_CLIENT_TIMEOUT_MS.to_string(),
        ],
        &[("ROUTER_LIMITS__MAX_NEW_TOKENS", "8000")],
    )
    .await;
    let client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    let normal: Vec<GenerateRequest> = (0..NORMAL)
        .map(|i| greedy(&format!("A normal question {i}?"), 120))
        .collect();
    let expected = run_normal(&client, &normal).await;
    let router_pid = router.pid().unwrap();
    let rss_before = rss_kib(router_pid);

    // The stuck client: its own connection, 1 KiB per stream, never read.
    let stuck_channel = small_window_channel(&router_addr).await;
    let stuck_client = TextGenerationClient::new(stuck_channel);
    let opened = Instant::now();
    let mut stuck = Vec::new();
    for i in 0..STUCK {
        let request = greedy(&format!("A stuck story {i}"), STUCK_TOKENS);
        stuck.push(
            stuck_client
                .clone()
                .generate(request)
                .await
                .expect("the stuck stream opens")
                .into_inner(),
        );
    }

    // Once its buffer is full, each stuck request is held on the worker: it generates nothing.
    wait_held(&worker_addr, STUCK as u32).await;

    // Meanwhile the normal streams run to their end with the tokens they have alone.
    let got = run_normal(&client, &normal).await;
    let normal_took = opened.elapsed();
    for (i, (want, got)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(got, want, "normal request {i}");
        assert_eq!(got.len(), 120);
    }

    // The stuck ones are cancelled on the worker once the timeout passed: nothing runs, every
    // block is free, and the router holds no more than a bounded amount for them.
    let stats = wait_idle(&worker_addr, Duration::from_secs(30)).await;
    let rss_after = rss_kib(router_pid);
    assert!(
        opened.elapsed() >= Duration::from_millis(SLOW_CLIENT_TIMEOUT_MS),
        "the stuck requests ended before the timeout"
    );
    eprintln!(
        "normal requests took {normal_took:?} beside {STUCK} stuck streams; router RSS \
         {rss_before} -> {rss_after} KiB; worker: {} cancelled, {} finished",
        stats.cancelled_requests, stats.finished_requests
    );
    assert!(
        stats.cancelled_requests >= STUCK as u64,
        "{} requests cancelled on the worker",
        stats.cancelled_requests
    );
    assert!(
        rss_after < rss_before + 64 * 1024,
        "router RSS grew from {rss_before} to {rss_after} KiB"
    );

    // Read now, each stuck stream gives what it buffered, then the clear status.
    for (i, mut stream) in stuck.into_iter().enumerate() {
        let mut tokens = 0;
        let status = loop {
            match stream.message().await {
                Ok(Some(m)) => tokens += m.tokens.len(),
                Ok(None) => panic!("stuck stream {i} ended without an error after {tokens} tokens"),
                Err(status) => break status,
            }
        };
        assert_eq!(
            status.code(),
            Code::ResourceExhausted,
            "stuck stream {i}: {status:?}"
        );
        assert!(
            status.message().contains(&format!(
                "the client read nothing for {SLOW_CLIENT_TIMEOUT_MS} ms"
            )),
            "{status:?}"
        );
        assert!(
            status.message().contains("slow_client_timeout_ms"),
            "{status:?}"
        );
        // What the router buffered (64 messages) and the stream's 1 KiB window held, and the
        // steps in flight when the hold arrived: far from the 8,000 asked for.
        assert!(
            tokens <= MAX_BUFFERED_TOKENS,
            "stuck stream {i} got {tokens} tokens although it was held"
        );
    }
    assert_eq!(worker_stats(&worker_addr).await.kv_blocks_used, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_pauses_and_reads_again_gets_every_token_of_an_uninterrupted_stream() {
    const TOKENS: u32 = 600;
    let (_dir, model) = tiny_model_with_context(18, 4_096);
    let (_worker, worker_addr) = start_worker_with(&model, &[]).await;
    let (_router, router_addr) =
        start_router_with_env(&[&worker_addr], &["--slow-client-timeout-ms", "60000"], &[]).await;
    let client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    let request = GenerateRequest {
        temperature: 1.0,
        seed: Some(7),
        ..greedy("A story told in two sittings", TOKENS)
    };
    let want = run_normal(&client, std::slice::from_ref(&request)).await;

    // A client with a 1 KiB window that reads nothing for a while: the worker holds the request.
    let paused_channel = small_window_channel(&router_addr).await;
    let mut stream = TextGenerationClient::new(paused_channel)
        .generate(request)
        .await
        .expect("the stream opens")
        .into_inner();
    let held = wait_held(&worker_addr, 1).await;
    assert_eq!(held.running_sequences, 0, "{held:?}");
    let generated = held.generated_tokens;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = worker_stats(&worker_addr).await;
    assert_eq!(
        still.generated_tokens, generated,
        "a held request generated tokens: {still:?}"
    );

    // Reading again resumes it: every token, in order, those of the uninterrupted run.
    let mut got = Vec::new();
    let mut finish = 0;
    while let Some(message) = stream.message().await.expect("the stream ends well") {
        got.extend(message.tokens.iter().map(|t| t.id));
        finish = message.finish_reason;
    }
    assert_eq!(got, want[0]);
    assert_ne!(finish, 0, "the last message carries the finish reason");
    let stats = wait_idle(&worker_addr, Duration::from_secs(30)).await;
    assert_eq!(stats.held_sequences, 0);
}

/// A client that reads steadily, one message every 100 ms through a 1 KiB HTTP/2 window (far
/// slower than the worker generates, so its buffer fills and the worker holds it again and again),
/// is never taken for one that reads nothing: with `slow_client_timeout_ms` = 1 s it gets every
/// token. (Before the router yielded one message per body chunk, the buffer drained only after the
/// client had read up to 63 messages through its window, and the stream was cancelled.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reading_steadily_through_a_small_window_is_never_cancelled() {
    const TOKENS: u32 = 160;
    let (_dir, model) = tiny_model_with_context(19, 4_096);
    let (_worker, worker_addr) = start_worker_with(&model, &[]).await;
    let (_router, router_addr) =
        start_router_with_env(&[&worker_addr], &["--slow-client-timeout-ms", "1000"], &[]).await;
    let client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    let request = greedy("A story read slowly", TOKENS);
    let want = run_normal(&client, std::slice::from_ref(&request)).await;

    let slow_channel = small_window_channel(&router_addr).await;
    let mut stream = TextGenerationClient::new(slow_channel)
        .generate(request)
        .await
        .expect("the stream opens")
        .into_inner();
    let mut got = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        match stream.message().await {
            Ok(Some(message)) => got.extend(message.tokens.iter().map(|t| t.id)),
            Ok(None) => break,
            Err(status) => panic!("cancelled after {} tokens: {status:?}", got.len()),
        }
    }
    assert_eq!(got, want[0]);
    let stats = wait_idle(&worker_addr, Duration::from_secs(30)).await;
    assert_eq!((stats.held_sequences, stats.kv_blocks_used), (0, 0));
}

/// Held requests free their places under `max_inflight_per_worker`: with a cap of 2 and two
/// streams whose clients stopped reading, a new request is served at once, not after the stuck
/// ones are cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_requests_do_not_block_the_queue_under_max_inflight_per_worker() {
    let (_dir, model) = tiny_model_with_context(20, 8_192);
    let (_worker, worker_addr) = start_worker_with(&model, &[]).await;
    let (_router, router_addr) = start_router_with_env(
        &[&worker_addr],
        &["--slow-client-timeout-ms", "60000"],
        &[("ROUTER_MAX_INFLIGHT_PER_WORKER", "2")],
    )
    .await;
    let client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    let stuck_channel = small_window_channel(&router_addr).await;
    let mut stuck = Vec::new();
    for i in 0..2 {
        let request = greedy(&format!("Stuck story {i}"), 4_000);
        let mut c = TextGenerationClient::new(stuck_channel.clone());
        stuck.push(c.generate(request).await.expect("opens").into_inner());
    }
    wait_held(&worker_addr, 2).await;
    let started = Instant::now();
    let got = tokio::time::timeout(
        Duration::from_secs(10),
        run_normal(&client, &[greedy("A new request", 16)]),
    )
    .await
    .expect("a new request is served while two streams are held");
    assert_eq!(got[0].len(), 16);
    eprintln!("served in {:?} beside 2 held streams", started.elapsed());
    drop(stuck);
    let stats = wait_idle(&worker_addr, Duration::from_secs(30)).await;
    assert_eq!((stats.held_sequences, stats.kv_blocks_used), (0, 0));
}
