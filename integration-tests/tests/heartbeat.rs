//! The worker's liveness heartbeat (issue 31, "A frozen worker keeps receiving new requests"), with
//! real router and worker processes on 127.0.0.1:
//!
//! - a worker stopped with SIGSTOP while it streams leaves rotation within `heartbeat_timeout_ms`
//!   (2 s; before, only the HTTP/2 keep-alive took it out, after 10 s + 5 s): no request sent 2.5 s
//!   after the stop reaches it, and its streams resume on the other worker with output identical
//!   to an undisturbed run; after SIGCONT it rejoins with every KV block free;
//! - a worker in one prefill step longer than the heartbeat timeout is never taken out (the
//!   heartbeat comes from a timer outside the engine loop).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use inference_proto::public::{GenerateRequest, ModelInfoRequest, TokenizeRequest};
use integration_tests::ops::{metric, parse_metrics, scrape, signal, wait_ready_workers};
use integration_tests::{
    connect_ready, free_port, greedy, start_router_with_env, start_worker_with, stream_all,
    tiny_model, tiny_model_with_context, wait_idle, worker_stats,
};

/// The router's default `heartbeat_timeout_ms`.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_leaves_rotation_within_the_heartbeat_timeout_and_its_streams_resume() {
    let (_dir, model) = tiny_model(31);
    let args = ["--threads", "1", "--max-num-seqs", "4"];
    let (a, b) = tokio::join!(
        start_worker_with(&model, &args),
        start_worker_with(&model, &args)
    );
    let workers = [a.1.clone(), b.1.clone()];
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    // Defaults otherwise: stall_timeout_ms 60 s, so only the heartbeat can take the worker out in
    // time.
    let (router, router_addr) = start_router_with_env(
        &[&workers[0], &workers[1]],
        &["--metrics-listen", &metrics_addr],
        &[],
    )
    .await;
    let mut client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    wait_ready_workers(&mut client, 2, Duration::from_secs(30)).await;
    let requests: Vec<GenerateRequest> = (0..8)
        .map(|i| greedy(&format!("Tell story {i} of {}", 8 - i), 200))
        .collect();
    let expected = stream_all(&client, &requests, Arc::default()).await;

    // Again; freeze the busier worker once the streams are well under way.
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
    let load: Vec<u32> = join_all(workers.iter().map(|w| worker_stats(w)))
        .await
        .iter()
        .map(|s| s.running_sequences + s.waiting_sequences)
        .collect();
    let victim = if load[0] >= load[1] { 0 } else { 1 };
    let victim_process = if victim == 0 { &a.0 } else { &b.0 };
    signal(victim_process, "STOP");
    let stopped_at = Instant::now();

    // Out of rotation within 2.5 s of the stop.
    let out_after = wait_ready_workers(&mut client, 1, Duration::from_millis(2_500)).await;
    let label = format!("{{worker=\"{}\"}}", workers[victim]);
    let m = parse_metrics(&scrape(&metrics_addr).await);
    assert_eq!(metric(&m, &format!("router_worker_ready{label}")), 0.0);
    assert_eq!(metric(&m, "router_worker_heartbeat_losses_total"), 1.0);
    assert_eq!(metric(&m, "router_worker_stalls_total"), 0.0);

    // From 2.5 s on, no new request reaches it: every one completes without a failover (one sent
    // to the frozen worker would wait for it, or move away).
    tokio::time::sleep(Duration::from_millis(2_500).saturating_sub(stopped_at.elapsed())).await;
    let later: Vec<GenerateRequest> = (0..8).map(|i| greedy(&format!("Later {i}"), 20)).collect();
    let later_started = Instant::now();
    for (i, r) in stream_all(&client, &later, Arc::default())
        .await
        .into_iter()
        .enumerate()
    {
        let r = r.unwrap_or_else(|s| panic!("later request {i} failed: {s:?}"));
        assert_eq!(r.generation.token_ids.len(), 20, "later request {i}");
        assert_eq!(
            r.failovers, 0,
            "later request {i} was sent to the frozen worker"
        );
    }
    let later_took = later_started.elapsed();

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
        "froze worker {victim} with load {load:?}: out of rotation after {out_after:?}; \
         {moved} requests failed over; 8 later requests took {later_took:?}"
    );
    assert!(
        load[victim] > 0 && moved > 0,
        "the stop hit running requests"
    );
    // Taken out by the heartbeat rule: not before its timeout (less one heartbeat interval).
    assert!(
        out_after >= HEARTBEAT_TIMEOUT - Duration::from_millis(500),
        "out of rotation after {out_after:?}, heartbeat timeout {HEARTBEAT_TIMEOUT:?}"
    );
    let log = router.log_text();
    assert!(
        log.contains("no heartbeat for 2000 ms (heartbeat_timeout_ms)"),
        "{log}"
    );

    // SIGCONT: it reconnects and rejoins; the requests that moved away were cancelled on it
    // (nothing left running, every block free).
    signal(victim_process, "CONT");
    let back_after = wait_ready_workers(&mut client, 2, Duration::from_secs(20)).await;
    eprintln!("back in rotation {back_after:?} after SIGCONT");
    wait_idle(&workers[victim], Duration::from_secs(10)).await;
    let m = parse_metrics(&scrape(&metrics_addr).await);
    assert_eq!(metric(&m, &format!("router_worker_ready{label}")), 1.0);
}

/// Half the prompt length (about 24k tokens) whose prefill in one step takes several seconds on one
/// thread with the tiny model of a 32k context (10k tokens took only 1.5 s on an AVX-512 machine).
const LONG_PROMPT_REPEATS: usize = 12_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_in_a_prefill_step_longer_than_the_heartbeat_timeout_stays_in_rotation() {
    let (_dir, model) = tiny_model_with_context(7, 32_768);
    // The whole prompt in one step: one long step, no step message for its whole length.
    let (_worker, worker_addr) =
        start_worker_with(&model, &["--threads", "1", "--max-batch-tokens", "32768"]).await;
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let (router, router_addr) =
        start_router_with_env(&[&worker_addr], &["--metrics-listen", &metrics_addr], &[]).await;
    let mut client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    let long_text = " the and".repeat(LONG_PROMPT_REPEATS);
    let prompt_tokens = client
        .tokenize(TokenizeRequest {
            text: long_text.clone(),
            add_special_tokens: true,
        })
        .await
        .unwrap()
        .into_inner()
        .ids
        .len();

    // The router's ready-worker count, sampled every 50 ms while the request runs.
    let done = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn({
        let (done, mut client) = (done.clone(), client.clone());
        async move {
            let mut samples = Vec::new();
            while !done.load(Ordering::SeqCst) {
                let info = client
                    .model_info(ModelInfoRequest::default())
                    .await
                    .unwrap();
                samples.push(info.into_inner().ready_workers);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            samples
        }
    });
    let steps_before = worker_stats(&worker_addr).await.steps;
    let started = Instant::now();
    let result = stream_all(&client, &[greedy(&long_text, 4)], Arc::default())
        .await
        .remove(0);
    let took = started.elapsed();
    done.store(true, Ordering::SeqCst);
    let samples = sampler.await.unwrap();
    let steps = worker_stats(&worker_addr).await.steps - steps_before;
    let result = result.expect("the long request completes");
    eprintln!(
        "prompt {prompt_tokens} tokens: {steps} steps in {took:?}, longest gap between stream \
         messages {:?}; {} readiness samples",
        result.max_gap,
        samples.len()
    );
    assert_eq!(result.generation.token_ids.len(), 4);
    assert_eq!(result.failovers, 0, "the long request moved");
    // The premise: the prefill was one step, much longer than the heartbeat timeout (a step
    // message per step: no message for the whole step; the first token comes with its end).
    assert!(
        steps <= 5,
        "{steps} steps: the prompt was not prefilled in one step"
    );
    assert!(
        took >= HEARTBEAT_TIMEOUT * 3 / 2,
        "the prefill took {took:?}, not much longer than the heartbeat timeout: make the prompt \
         longer"
    );
    assert!(
        samples.iter().all(|&n| n == 1),
        "the busy worker left rotation: {samples:?}"
    );
    let log = router.log_text();
    assert!(!log.contains("no heartbeat"), "{log}");
    let m = parse_metrics(&scrape(&metrics_addr).await);
    assert_eq!(metric(&m, "router_worker_heartbeat_losses_total"), 0.0);
}
