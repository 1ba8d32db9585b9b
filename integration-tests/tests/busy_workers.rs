//! Busy is not down, stalled is (issue 12), with real processes on 127.0.0.1:
//!
//! - a worker stopped with SIGSTOP while it streams: the router takes it out of rotation within
//!   its stall timeout, its requests fail over to the other worker with output identical to an
//!   undisturbed run, and after SIGCONT it rejoins and takes requests again;
//! - one worker prefilling a prompt of thousands of tokens while 16 short streaming requests come
//!   and go (half cancelled by their clients): no request is refused, the router's
//!   `grpc.health.v1` readiness is `SERVING` at every sample (every 100 ms), and every KV block is
//!   free at the end. Probes run every 50 ms, far shorter than one step: before health was answered
//!   from the engine's published state, each long step took the worker out of rotation.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use inference_proto::public::{GenerateRequest, TokenizeRequest};
use integration_tests::ops::{health, metric, parse_metrics, scrape, signal, wait_ready_workers};
use integration_tests::{
    connect_ready, free_port, greedy, start_router_with_env, start_worker_with, stream_all,
    tiny_model, wait_idle, worker_stats, Process,
};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigstopped_worker_is_failed_over_within_the_stall_timeout_and_rejoins() {
    let (_dir, model) = tiny_model(31);
    let args = ["--threads", "1", "--max-num-seqs", "4"];
    let (a, b) = tokio::join!(
        start_worker_with(&model, &args),
        start_worker_with(&model, &args)
    );
    let workers = [a.1.clone(), b.1.clone()];
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    const STALL_MS: u64 = 1_000;
    let (router, router_addr) = start_router_with_env(
        &[&workers[0], &workers[1]],
        &[
            "--stall-timeout-ms",
            &STALL_MS.to_string(),
            "--metrics-listen",
            &metrics_addr,
        ],
        // A stop here stands for a live process whose engine stopped stepping: the heartbeat
        // rule (which takes a frozen process out, `heartbeat.rs`) is off.
        &[
            ("ROUTER_HEALTH_INTERVAL_MS", "100"),
            ("ROUTER_HEARTBEAT_TIMEOUT_MS", "0"),
        ],
    )
    .await;
    let mut client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    wait_ready_workers(&mut client, 2, Duration::from_secs(30)).await;
    let requests: Vec<GenerateRequest> = (0..8)
        .map(|i| greedy(&format!("Tell story {i} of {}", 8 - i), 200))
        .collect();
    let expected = stream_all(&client, &requests, Arc::default()).await;

    // Again; stop the busier worker once the streams are well under way.
    let received = Arc::new(AtomicUsize::new(0));
    let run = tokio::spawn({
        let (client, requests, received) = (client.clone(), requests.clone(), received.clone());
        async move { stream_all(&client, &requests, received).await }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.load(Ordering::SeqCst) < 150 {
        assert!(Instant::now() < deadline, "the streams did not start");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The victim must still be generating when it stops: the tiny model can finish its streams
    // (or have them held, waiting for a client that reads behind) long before the client has
    // read them, and a stopped worker with no work is not stalled. Sample until one runs.
    let load = loop {
        let load: Vec<u32> = join_all(workers.iter().map(|w| worker_stats(w)))
            .await
            .iter()
            .map(|s| s.running_sequences + s.waiting_sequences)
            .collect();
        if load.iter().any(|&l| l > 0) {
            break load;
        }
        assert!(
            Instant::now() < deadline,
            "no worker had running work to stop"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let victim = if load[0] >= load[1] { 0 } else { 1 };
    let victim_process = if victim == 0 { &a.0 } else { &b.0 };
    signal(victim_process, "STOP");
    let stopped_at = Instant::now();

    // Out of rotation within the stall time (plus two probe periods and some scheduling slack).
    let out_after = wait_ready_workers(&mut client, 1, Duration::from_secs(10)).await;
    let label = format!("{{worker=\"{}\"}}", workers[victim]);
    let m = parse_metrics(&scrape(&metrics_addr).await);
    assert_eq!(metric(&m, &format!("router_worker_stalled{label}")), 1.0);
    assert_eq!(metric(&m, &format!("router_worker_ready{label}")), 0.0);
    assert_eq!(metric(&m, "router_worker_stalls_total"), 1.0);

    // Every stream completes on the other worker, token for token as without the stop.
    let got = run.await.unwrap();
    let mut moved = 0;
    for (i, (want, got)) in expected.into_iter().zip(got).enumerate() {
        let want = want.expect("reference run").generation.token_ids;
        let got = got.unwrap_or_else(|s| panic!("request {i} failed: {s:?}"));
        let (ids, failovers) = (got.generation.token_ids, got.failovers);
        assert_eq!(ids, want, "request {i} (moved {failovers} times)");
        assert_eq!(ids.len(), 200);
        moved += failovers;
    }
    eprintln!(
        "stopped worker {victim} with load {load:?}: out of rotation after {out_after:?} \
         (stall_timeout_ms {STALL_MS}); {moved} requests failed over"
    );
    assert!(
        load[victim] > 0 && moved > 0,
        "the stop hit running requests"
    );
    assert!(
        out_after >= Duration::from_millis(STALL_MS - 100)
            && out_after <= Duration::from_millis(STALL_MS + 2_000),
        "out of rotation after {out_after:?}, stall timeout {STALL_MS} ms"
    );
    let log = router.log_text();
    assert!(
        log.contains("made no progress within the stall timeout"),
        "{log}"
    );
    assert!(
        !log.contains("worker not ready"),
        "a stop is a stall, not a not-ready answer"
    );

    // SIGCONT: it moves again, answers health, and rejoins.
    signal(victim_process, "CONT");
    let back_after = wait_ready_workers(&mut client, 2, Duration::from_secs(10)).await;
    eprintln!(
        "back in rotation {back_after:?} after SIGCONT ({:?} stopped)",
        stopped_at.elapsed()
    );
    let m = parse_metrics(&scrape(&metrics_addr).await);
    assert_eq!(metric(&m, &format!("router_worker_stalled{label}")), 0.0);
    assert_eq!(metric(&m, &format!("router_worker_ready{label}")), 1.0);
    assert!(router
        .log_text()
        .contains("makes progress again; back in rotation"));
    // The requests that moved away were cancelled on it: nothing left running, every block free.
    wait_idle(&workers[victim], Duration::from_secs(10)).await;
    // Later requests land on it again (the router spreads concurrent ones by load).
    let before = worker_stats(&workers[victim]).await.finished_requests;
    let later: Vec<GenerateRequest> = (0..8).map(|i| greedy(&format!("Again {i}"), 30)).collect();
    for r in stream_all(&client, &later, Arc::default()).await {
        assert_eq!(r.expect("later request").generation.token_ids.len(), 30);
    }
    let after = worker_stats(&workers[victim]).await.finished_requests;
    assert!(
        after > before,
        "no later request reached the rejoined worker"
    );
    // Idle again: past the load reports' 1 s lifetime, the router still shows the worker's free KV
    // tokens from its last report (all of them: every block is free), not 0.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let capacity = worker_stats(&workers[victim]).await.kv_tokens_capacity as f64;
    let m = parse_metrics(&scrape(&metrics_addr).await);
    assert_eq!(
        metric(&m, &format!("router_worker_free_kv_tokens{label}")),
        capacity
    );
}

/// A small deterministic generator (xorshift64*) for the cancel pattern.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// What a short request saw.
#[derive(Debug)]
struct Short {
    /// Its final status: Ok, or the error that ended the stream.
    result: Result<(), tonic::Status>,
    /// When it was sent.
    submitted: Instant,
    /// When its first token arrived.
    first_token: Option<Instant>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_requests_beside_a_long_prefill_are_never_refused_and_readiness_holds() {
    let (_dir, model) = integration_tests::tiny_model_with_context(5, 16_384);
    let (_worker, worker_addr) =
        start_worker_with(&model, &["--threads", "1", "--max-batch-tokens", "256"]).await;
    // Probes every 50 ms with a 50 ms timeout: shorter than one step of this prefill.
    let (router, router_addr) =
        start_router_with_env(&[&worker_addr], &[], &[("ROUTER_HEALTH_INTERVAL_MS", "50")]).await;
    let mut client = connect_ready(&router_addr, Duration::from_secs(30)).await;

    let long_text = " the and".repeat(6_000);
    let long_ids = client
        .tokenize(TokenizeRequest {
            text: long_text.clone(),
            add_special_tokens: true,
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert!(
        long_ids.len() >= 12_000,
        "the long prompt is {} tokens",
        long_ids.len()
    );

    // Router readiness, sampled every 100 ms for the whole test.
    let done = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn({
        let (done, router_addr) = (done.clone(), router_addr.clone());
        async move {
            let mut samples = Vec::new();
            while !done.load(Ordering::SeqCst) {
                samples.push(health(&router_addr, "").await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            samples
        }
    });

    let started = Instant::now();
    let long = tokio::spawn({
        let mut c = client.clone();
        async move {
            let mut stream = c.generate(greedy(&long_text, 4)).await?.into_inner();
            let mut first = None;
            while let Some(m) = stream.message().await? {
                if !m.tokens.is_empty() {
                    first.get_or_insert_with(Instant::now);
                }
            }
            Ok::<_, tonic::Status>(first.expect("the long request streamed tokens"))
        }
    });
    // The long prompt is on the worker and prefilling before the short ones come.
    let deadline = Instant::now() + Duration::from_secs(30);
    while worker_stats(&worker_addr).await.steps == 0 {
        assert!(Instant::now() < deadline, "the long prompt never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // 16 short streams arriving 30 ms apart; half are cancelled by their client after a few
    // tokens (dropping the call), the rest run to the end.
    let mut rng = Rng(0x5eed_1234_abcd_0042);
    let mut shorts = Vec::new();
    for i in 0..16u64 {
        let cancel_after = (i % 2 == 0).then(|| 1 + rng.below(6) as usize);
        let mut c = client.clone();
        shorts.push(tokio::spawn(async move {
            let mut short = Short {
                result: Ok(()),
                submitted: Instant::now(),
                first_token: None,
            };
            let request = greedy(&format!("Short question {i}?"), 24);
            let mut stream = match c.generate(request).await {
                Ok(response) => response.into_inner(),
                Err(status) => {
                    short.result = Err(status);
                    return short;
                }
            };
            let mut tokens = 0;
            loop {
                match stream.message().await {
                    Ok(Some(m)) => {
                        if !m.tokens.is_empty() {
                            short.first_token.get_or_insert_with(Instant::now);
                        }
                        tokens += m.tokens.len();
                        if cancel_after.is_some_and(|n| tokens >= n) {
                            return short; // the client hangs up
                        }
                    }
                    Ok(None) => return short,
                    Err(status) => {
                        short.result = Err(status);
                        return short;
                    }
                }
            }
        }));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let shorts: Vec<Short> = join_all(shorts)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let long_first = long.await.unwrap().expect("the long request completes");
    done.store(true, Ordering::SeqCst);
    let samples = sampler.await.unwrap();
    let prefill = long_first - started;

    // No request was refused or failed.
    for (i, s) in shorts.iter().enumerate() {
        if let Err(status) = &s.result {
            assert_ne!(
                status.code(),
                Code::Unavailable,
                "short request {i}: {status:?}"
            );
            panic!("short request {i} failed: {status:?}");
        }
    }
    // Readiness was SERVING at every sample.
    let not_serving: Vec<_> = samples
        .iter()
        .filter(|s| s.as_ref().ok() != Some(&ServingStatus::Serving))
        .collect();
    eprintln!(
        "long prompt {} tokens, first token after {prefill:?}; {} readiness samples",
        long_ids.len(),
        samples.len()
    );
    assert!(samples.len() >= 5, "{} readiness samples", samples.len());
    assert!(
        not_serving.is_empty(),
        "readiness not SERVING: {not_serving:?}"
    );
    let log = router.log_text();
    assert!(
        !log.contains("out of rotation"),
        "the busy worker left rotation:\n{log}"
    );
    // Every KV block is free once the cancels have reached the worker.
    let s = wait_idle(&worker_addr, Duration::from_secs(10)).await;
    eprintln!(
        "worker: {} steps, {} preemptions, {} cancelled",
        s.steps, s.preemptions, s.cancelled_requests
    );
    // The test's premise: every short request was sent while the long prompt was prefilling.
    let last_sent = shorts.iter().map(|s| s.submitted).max().unwrap();
    assert!(
        last_sent < long_first,
        "the long prefill ({prefill:?}) ended before the last short request was sent: make the \
         prompt longer"
    );
    // Fair scheduling: each short request's first token arrived while the long prompt was still
    // prefilling: at least one step (here >= 100 ms at that depth) before the long request's own
    // first token, not in the step that ends its prefill.
    let margin = Duration::from_millis(100);
    let late: Vec<(usize, Duration)> = shorts
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let first = s.first_token.expect("every short request streams a token");
            (first + margin > long_first).then(|| (i, (first + margin) - long_first))
        })
        .collect();
    let ttft: Vec<Duration> = shorts
        .iter()
        .map(|s| s.first_token.unwrap() - s.submitted)
        .collect();
    eprintln!("short requests' time to first token: {ttft:?}");
    assert!(
        late.is_empty(),
        "short requests whose first token came less than {margin:?} before the long prefill \
         ended ({prefill:?}), by how much: {late:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_worker_is_logged_once_then_when_it_is_back() {
    let (_dir, model) = tiny_model(3);
    let worker_addr = format!("127.0.0.1:{}", free_port());
    // Nothing listens there yet: the router retries every 100-200 ms.
    let (router, router_addr) = start_router_with_env(
        &[&worker_addr],
        &[],
        &[
            ("ROUTER_RECONNECT_INITIAL_MS", "100"),
            ("ROUTER_RECONNECT_MAX_MS", "200"),
        ],
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !router.log_text().contains("worker unreachable") {
        assert!(
            Instant::now() < deadline,
            "no unreachable log:\n{}",
            router.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Several more failed attempts, still one line (the next one is due after a minute).
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let log = router.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("unreachable")).collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0].contains("WARN") && lines[0].contains(&worker_addr) && lines[0].contains("error"),
        "{}",
        lines[0]
    );
    let model = model.to_str().unwrap();
    let _worker = Process::start(
        "worker",
        &["--model", model, "--listen", &worker_addr],
        "worker ready",
        Duration::from_secs(60),
    )
    .await
    .expect("worker starts");
    connect_ready(&router_addr, Duration::from_secs(10)).await;
    let log = router.log_text();
    let back: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("worker reachable again"))
        .collect();
    assert_eq!(back.len(), 1, "{log}");
    assert!(
        back[0].contains("INFO") && back[0].contains(&worker_addr),
        "{}",
        back[0]
    );
}
