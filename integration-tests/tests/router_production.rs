//! The router in production, with real processes on 127.0.0.1: load spreading and prefix affinity
//! over three workers, failover that loses nothing when a worker is killed mid-stream, fast
//! `RESOURCE_EXHAUSTED` under overload, deadlines, graceful drain on SIGTERM (and what the calls
//! still running when its timeout passes get, on both fronts) and DNS discovery.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::StreamExt as _;
use inference_proto::public::{FinishReason, GenerateRequest, TokenizeRequest};
use inference_proto::worker::EngineStats;
use integration_tests::ops::wait_ready_workers;
use integration_tests::{
    connect_ready, free_port, generate, greedy, real_model, start_router, start_router_with_env,
    start_worker, start_worker_with, stream_all, tiny_model, tiny_model_with_context, wait_idle,
    worker_stats, Process,
};
use tonic::Code;

/// Starts `n` workers on `model` (with `args`) at once.
async fn start_workers(model: &std::path::Path, n: usize, args: &[&str]) -> Vec<(Process, String)> {
    join_all((0..n).map(|_| start_worker_with(model, args))).await
}

async fn all_stats(addrs: &[String]) -> Vec<EngineStats> {
    join_all(addrs.iter().map(|a| worker_stats(a))).await
}

fn finished(stats: &[EngineStats]) -> Vec<u64> {
    stats.iter().map(|s| s.finished_requests).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_share_the_load_and_a_shared_prefix_sticks_to_one() {
    let (_dir, model) = tiny_model(21);
    let workers = start_workers(&model, 3, &[]).await;
    let addrs: Vec<String> = workers.iter().map(|(_, a)| a.clone()).collect();
    let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let (_router, router_addr) = start_router(&refs, &[]).await;
    let mut client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    wait_ready_workers(&mut client, 3, Duration::from_secs(30)).await;

    // Load spreads: 24 concurrent long requests with different prompts.
    let tasks = (0..24).map(|i| {
        let mut c = client.clone();
        async move {
            generate(
                &mut c,
                greedy(&format!("request {i} about topic {}", i * 7), 200),
            )
            .await
        }
    });
    for g in join_all(tasks).await {
        assert_eq!(g.unwrap().token_ids.len(), 200);
    }
    let spread = finished(&all_stats(&addrs).await);
    assert_eq!(spread.iter().sum::<u64>(), 24);
    assert!(
        spread.iter().all(|&n| n > 0),
        "every worker served some: {spread:?}"
    );

    // Prefix affinity: prompts sharing their first 64+ tokens go to one worker.
    let prefix = "You are a careful assistant. Answer briefly and precisely. ".repeat(2);
    let ids = client
        .tokenize(TokenizeRequest {
            text: prefix.clone(),
            add_special_tokens: true,
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert!(ids.len() > 70, "the shared prefix is {} tokens", ids.len());
    for i in 0..8 {
        let g = generate(
            &mut client,
            greedy(&format!("{prefix}Question {i}: why?"), 4),
        )
        .await;
        assert_eq!(g.unwrap().token_ids.len(), 4);
    }
    let after = finished(&all_stats(&addrs).await);
    let delta: Vec<u64> = after.iter().zip(&spread).map(|(a, b)| a - b).collect();
    assert!(
        delta.contains(&8) && delta.iter().sum::<u64>() == 8,
        "all 8 shared-prefix requests on one worker: {delta:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_worker_mid_stream_loses_nothing() {
    let (_dir, model) = tiny_model(22);
    // One compute thread and few sequences at once keep the requests in flight long enough.
    let args = ["--threads", "1", "--max-num-seqs", "3"];
    kill_a_worker_mid_stream(&model, &args, "Tell story number", 220, 800).await;
}

/// The same with the real model (real weights: the new worker's prefill of the carried-over tokens
/// must lead to the same next tokens as the dead worker's decode): 16 short answers, the kill after
/// ~100 tokens streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_worker_mid_stream_loses_nothing_real_model() {
    let args = ["--threads", "1"];
    kill_a_worker_mid_stream(&real_model(), &args, "Write about topic", 24, 100).await;
}

/// Three workers on `model`, 16 greedy requests of `max_new_tokens`; kills -9 the busiest worker
/// once `kill_after` tokens streamed and checks every output against a run without the kill.
async fn kill_a_worker_mid_stream(
    model: &std::path::Path,
    worker_args: &[&str],
    prompt: &str,
    max_new_tokens: u32,
    kill_after: usize,
) {
    let mut workers = start_workers(model, 3, worker_args).await;
    let addrs: Vec<String> = workers.iter().map(|(_, a)| a.clone()).collect();
    let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let (router, router_addr) = start_router(&refs, &[]).await;
    let mut client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    wait_ready_workers(&mut client, 3, Duration::from_secs(30)).await;
    let requests: Vec<GenerateRequest> = (0..16)
        .map(|i| greedy(&format!("{prompt} {i} of {}", 16 - i), max_new_tokens))
        .collect();

    // The reference: the same 16 on the healthy cluster.
    let expected = stream_all(&client, &requests, Arc::default()).await;

    // Again, and kill -9 the busiest worker once `kill_after` tokens streamed (the running requests
    // are well into their answers, others may still wait on the workers).
    let received = Arc::new(AtomicUsize::new(0));
    let run = tokio::spawn({
        let (client, requests, received) = (client.clone(), requests.clone(), received.clone());
        async move { stream_all(&client, &requests, received).await }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.load(Ordering::SeqCst) < kill_after && !run.is_finished() {
        assert!(Instant::now() < deadline, "the streams did not start");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let load: Vec<u32> = all_stats(&addrs)
        .await
        .iter()
        .map(|s| s.running_sequences + s.waiting_sequences)
        .collect();
    let victim = (0..3).max_by_key(|&i| load[i]).unwrap();
    let killed_at = Instant::now();
    workers[victim].0.kill().await;
    let got = run.await.unwrap();
    let after_kill = killed_at.elapsed();

    let mut failovers = 0;
    let (mut gap_healthy, mut gap_moved) = (Duration::ZERO, Duration::ZERO);
    for (i, (want, got)) in expected.into_iter().zip(got).enumerate() {
        let want = want.expect("reference run");
        let got = got.unwrap_or_else(|s| panic!("request {i} failed: {s:?}"));
        let moved = got.failovers;
        assert_eq!(
            got.generation.token_ids, want.generation.token_ids,
            "request {i} (moved {moved} times)"
        );
        assert_eq!(got.generation.text, want.generation.text, "request {i}");
        assert_eq!(got.generation.token_ids.len(), max_new_tokens as usize);
        failovers += moved;
        gap_healthy = gap_healthy.max(want.max_gap);
        if moved > 0 {
            gap_moved = gap_moved.max(got.max_gap);
        }
    }
    eprintln!(
        "killed worker {victim} with load {load:?}; {failovers} requests failed over; the rest \
         took {after_kill:?}; longest stall between messages: {gap_moved:?} on a moved stream, \
         {gap_healthy:?} without the kill"
    );
    assert!(
        load[victim] > 0 && failovers > 0,
        "the kill hit running requests"
    );
    assert!(
        router.log_text().contains("failing over"),
        "the router logged the failovers"
    );
    wait_ready_workers(&mut client, 2, Duration::from_secs(30)).await;
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_gets_fast_resource_exhausted_and_the_rest_complete() {
    let (_dir, model) = tiny_model(23);
    let (_worker, worker_addr) = start_worker_with(&model, &["--threads", "1"]).await;
    let env = [
        ("ROUTER_MAX_INFLIGHT_PER_WORKER", "2"),
        ("ROUTER_MAX_WAITING_REQUESTS", "4"),
    ];
    let (router, router_addr) = start_router_with_env(&[&worker_addr], &[], &env).await;
    let client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    let pid = router.pid().unwrap();
    let mut rss = Vec::new();
    for burst in 0..3 {
        // 10x the queue limit at once.
        let tasks = (0..40).map(|i| {
            let mut c = client.clone();
            async move {
                let sent = Instant::now();
                let result =
                    generate(&mut c, greedy(&format!("burst {burst} item {i}"), 200)).await;
                (result, sent.elapsed())
            }
        });
        let (mut ok, mut refused) = (0, 0);
        for (result, took) in join_all(tasks).await {
            match result {
                Ok(g) => {
                    assert_eq!(g.token_ids.len(), 200);
                    ok += 1;
                }
                Err(status) => {
                    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                    assert!(
                        status.message().contains("max_waiting_requests = 4"),
                        "{status:?}"
                    );
                    assert!(took < Duration::from_secs(1), "refused in {took:?}");
                    refused += 1;
                }
            }
        }
        assert!(
            ok >= 6 && refused >= 20,
            "burst {burst}: {ok} ok, {refused} refused"
        );
        rss.push(rss_kib(pid));
    }
    eprintln!("router RSS after each burst (KiB): {rss:?}");
    assert!(
        rss[2] < rss[0] + 16 * 1024,
        "router memory grew: {rss:?} KiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_deadline_cancels_the_request_on_the_worker() {
    // The real model: a long generation (1,000 tokens, several seconds) that cannot finish within
    // the deadline. The deadline leaves room for the dispatch on a loaded 2-core machine (the other
    // tests of this file start real-model workers beside it): the request must reach the worker.
    let (_worker, worker_addr) = start_worker(&real_model()).await;
    let (router, router_addr) = start_router(&[&worker_addr], &[]).await;
    let mut client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    // A first short request warms the worker (first touch of the weights, thread start-up).
    let warm = generate(&mut client, greedy("Hello", 2))
        .await
        .expect("warm-up");
    assert_eq!(warm.token_ids.len(), 2);
    let mut request = tonic::Request::new(greedy("Once upon a time", 1000));
    request.set_timeout(Duration::from_millis(1500));
    let started = Instant::now();
    let status = match client.generate(request).await {
        Ok(response) => {
            let mut stream = response.into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("the stream ended without an error"),
                    Err(status) => break status,
                }
            }
        }
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    // The worker hears the Add and then the Cancel on the same stream, in that order. Its stats
    // are read until they show the cancel: reading "nothing running" alone raced the Add on a
    // loaded machine (the Add had not reached the engine yet; seen in CI).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = worker_stats(&worker_addr).await;
        let idle = stats.running_sequences == 0 && stats.waiting_sequences == 0;
        if idle && stats.cancelled_requests == 1 {
            assert!(stats.generated_tokens < 1000, "{stats:?}");
            assert_eq!(
                stats.finished_requests, 1,
                "only the warm-up finished: {stats:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker did not cancel the request: {stats:?}\nstatus: {status:?}\nrouter log:\n{}",
            router.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_router_and_it_exits_zero() {
    let (_worker, worker_addr) = start_worker(&real_model()).await;
    let (mut router, router_addr) = start_router(&[&worker_addr], &[]).await;
    let mut client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    let mut stream = client
        .generate(greedy("The history of the sea", 64))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().expect("first message");
    router.terminate();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = generate(&mut client, greedy("hello", 4)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("shutting down"), "{refused:?}");
    let mut ids: Vec<u32> = first.tokens.iter().map(|t| t.id).collect();
    let mut finish = FinishReason::Unspecified;
    while let Some(m) = stream
        .message()
        .await
        .expect("the running request completes")
    {
        ids.extend(m.tokens.iter().map(|t| t.id));
        if m.usage.is_some() {
            finish = m.finish_reason();
        }
    }
    assert_eq!((ids.len(), finish), (64, FinishReason::MaxNewTokens));
    drop(stream);
    drop(client);
    let status = router
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("router exits");
    assert!(status.success(), "router exit status {status:?}");
}

/// Reads an event stream to its end, or to the error that cut it: the text, and whether it was cut.
async fn read_events(response: reqwest::Response) -> (String, bool) {
    let mut body = response.bytes_stream();
    let mut text = String::new();
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(bytes) => text.push_str(&String::from_utf8_lossy(&bytes)),
            Err(_) => return (text, true),
        }
    }
    (text, false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_still_running_when_the_drain_timeout_passes_end_with_unavailable() {
    // A 16k context: requests of 15,000 tokens run far longer than the drain timeout.
    let (_dir, model) = tiny_model_with_context(31, 16_384);
    let (_worker, worker_addr) = start_worker(&model).await;
    let http = format!("127.0.0.1:{}", free_port());
    let drain = Duration::from_millis(1500);
    let drain_ms = drain.as_millis().to_string();
    let env = [
        ("ROUTER_DRAIN_TIMEOUT_MS", drain_ms.as_str()),
        ("ROUTER_LIMITS__MAX_NEW_TOKENS", "16000"),
    ];
    let (mut router, router_addr) =
        start_router_with_env(&[&worker_addr], &["--http-listen", &http], &env).await;
    let mut client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    integration_tests::openai::wait_healthy(&format!("http://{http}"), Duration::from_secs(10))
        .await;
    let mut grpc = client
        .generate(greedy("The history of the sea", 15_000))
        .await
        .unwrap()
        .into_inner();
    grpc.message().await.unwrap().expect("a first message");
    let url = format!("http://{http}/v1/completions");
    let body = |stream: bool| serde_json::json!({"prompt": "a", "max_tokens": 15_000, "ignore_eos": true, "stream": stream});
    let web = reqwest::Client::new();
    let sse = web.post(&url).json(&body(true)).send().await.unwrap();
    assert_eq!(sse.status(), 200);
    let whole = tokio::spawn(web.post(&url).json(&body(false)).send());
    let deadline = Instant::now() + Duration::from_secs(10);
    while worker_stats(&worker_addr).await.running_sequences < 3 {
        assert!(Instant::now() < deadline, "the three requests never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let terminated = Instant::now();
    router.terminate();
    let sse = tokio::spawn(read_events(sse));

    // gRPC: every message until a definite UNAVAILABLE that says why (not UNKNOWN from a cut
    // connection), once the drain timeout has passed.
    let status = loop {
        match grpc.message().await {
            Ok(Some(m)) => assert!(m.usage.is_none(), "a 15,000-token request finished"),
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    let waited = terminated.elapsed();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("drain timeout") && status.message().contains("retry"),
        "{status:?}"
    );
    assert!(
        waited >= drain,
        "ended after {waited:?}, before the drain timeout"
    );

    // HTTP, streamed: an OpenAI error object as the last event before `[DONE]`.
    let (text, cut) = sse.await.unwrap();
    assert!(!cut, "the event stream was cut: {text:?}");
    let blocks: Vec<&str> = text.split("\n\n").filter(|b| !b.is_empty()).collect();
    assert_eq!(blocks.last(), Some(&"data: [DONE]"), "{text:?}");
    let error: serde_json::Value = serde_json::from_str(
        blocks[blocks.len() - 2]
            .strip_prefix("data: ")
            .expect("a data event"),
    )
    .unwrap();
    assert_eq!(error["error"]["code"], "unavailable", "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("drain timeout"), "{error}");

    // HTTP, whole: 503 with the same error object.
    let whole = whole
        .await
        .unwrap()
        .expect("an answer, not a cut connection");
    assert_eq!(whole.status(), 503);
    let answer: serde_json::Value = whole.json().await.unwrap();
    assert_eq!(answer["error"]["code"], "unavailable", "{answer}");

    // The requests are cancelled on the worker and the router exits 0.
    let stats = wait_idle(&worker_addr, Duration::from_secs(10)).await;
    assert_eq!(stats.cancelled_requests, 3, "{stats:?}");
    let exit = router.wait_exit(Duration::from_secs(10)).await;
    assert!(
        exit.is_some_and(|s| s.success()),
        "{exit:?}\n{}",
        router.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_found_by_dns_discovery_serve() {
    let (_dir, model) = tiny_model(24);
    let port = free_port();
    let target = format!("localhost:{port}");
    let env = [("ROUTER_DISCOVERY_INTERVAL_MS", "200")];
    let (_router, router_addr) =
        start_router_with_env(&[], &["--discovery-dns", &target], &env).await;
    let worker_addr = format!("127.0.0.1:{port}");
    let _worker = Process::start(
        "worker",
        &["--model", model.to_str().unwrap(), "--listen", &worker_addr],
        "worker ready",
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let mut client = connect_ready(&router_addr, Duration::from_secs(20)).await;
    let g = generate(&mut client, greedy("hi there", 5)).await.unwrap();
    assert_eq!(g.token_ids.len(), 5);
    assert_eq!(worker_stats(&worker_addr).await.finished_requests, 1);
}
