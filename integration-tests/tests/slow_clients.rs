//! Slow and stuck clients (issue 31), with real router and worker processes on 127.0.0.1: 32
//! streams whose client never reads them (an HTTP/2 stream window of 1 KiB, never released) beside
//! 8 normal streams on another connection. The normal streams flow to their end with the same
//! tokens as without the stuck ones; each stuck stream is cancelled once its buffer stayed full for
//! `slow_client_timeout_ms` and ends with `RESOURCE_EXHAUSTED` naming the setting; the worker ends
//! with every KV block free, and the router's memory stays bounded. (No ITL figure here: the tiny
//! model streams its tokens in bursts, too fast for one.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use inference_proto::public::text_generation_client::TextGenerationClient;
use inference_proto::public::GenerateRequest;
use integration_tests::{
    connect_ready, greedy, start_router_with_env, start_worker_with, stream_all,
    tiny_model_with_context, wait_idle, worker_stats, PublicClient,
};
use tonic::transport::Endpoint;
use tonic::Code;

const STUCK: usize = 32;
const NORMAL: usize = 8;
const SLOW_CLIENT_TIMEOUT_MS: u64 = 3_000;
/// Tokens each stuck request asks for: more than the worker makes within the timeout.
const STUCK_TOKENS: u32 = 8_000;

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
    let stuck_channel = Endpoint::from_shared(format!("http://{router_addr}"))
        .unwrap()
        .initial_stream_window_size(1024)
        .connect()
        .await
        .unwrap();
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
        assert!(
            tokens < STUCK_TOKENS as usize,
            "stuck stream {i} got all its tokens"
        );
    }
    assert_eq!(worker_stats(&worker_addr).await.kv_blocks_used, 0);
}
