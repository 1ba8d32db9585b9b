//! A worker's graceful drain on SIGTERM (real processes, the real model so that a request is surely
//! still running when the signal arrives): health goes NOT_SERVING, new requests are refused with
//! `UNAVAILABLE` (a router sends them to another worker), running ones finish, the process exits 0.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use inference_proto::worker::worker_client::WorkerClient;
use inference_proto::worker::{
    router_message, worker_message, AddRequest, RouterMessage, SamplingParams, StepOutput,
};
use integration_tests::ops::{channel, wait_health};
use integration_tests::{
    connect_ready, generate, greedy, real_model, start_router, start_worker_with,
};
use tonic_health::pb::health_check_response::ServingStatus;

/// Reads a worker stream until `request_id` finishes; returns its token count and every request
/// error seen meanwhile.
async fn read_until_finished(
    inbound: &mut tonic::Streaming<inference_proto::worker::WorkerMessage>,
    request_id: &str,
    errors: &mut Vec<(String, i32)>,
) -> usize {
    let mut tokens = 0;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(60), inbound.message())
            .await
            .expect("a step within 60 s")
            .expect("the stream stays up")
            .expect("the stream goes on until the request finished");
        let Some(worker_message::Kind::Step(StepOutput {
            tokens: out,
            errors: errs,
            ..
        })) = message.kind
        else {
            continue;
        };
        errors.extend(errs.into_iter().map(|e| (e.request_id, e.code)));
        for token in out.iter().filter(|t| t.request_id == request_id) {
            tokens += 1;
            if token.finished {
                return tokens;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_worker_running_requests_finish_new_ones_are_refused_exit_zero() {
    // The real model: slow enough on a CPU that the request is surely still running at SIGTERM.
    let model = real_model();
    let (mut worker, addr) = start_worker_with(&model, &["--drain-timeout-ms", "60000"]).await;
    let mut client = WorkerClient::new(channel(&addr).await);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut inbound = client
        .generate(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .expect("worker stream")
        .into_inner();
    let add = |id: &str, max_new_tokens: u32| RouterMessage {
        kind: Some(router_message::Kind::Add(AddRequest {
            request_id: id.into(),
            prompt_ids: vec![1, 504, 3458, 282, 4649, 314],
            sampling: Some(SamplingParams {
                top_p: 1.0,
                seed: 7,
                ..Default::default()
            }),
            max_new_tokens,
            ..Default::default()
        })),
    };
    let max_new_tokens = 48;
    tx.send(add("long", max_new_tokens)).unwrap();
    // Wait for its first token, then SIGTERM.
    let first = loop {
        let message = inbound.message().await.unwrap().expect("a step");
        if let Some(worker_message::Kind::Step(step)) = message.kind {
            if let Some(token) = step.tokens.into_iter().find(|t| t.request_id == "long") {
                break token;
            }
        }
    };
    assert!(!first.finished);
    worker.terminate();
    wait_health(
        &addr,
        "",
        ServingStatus::NotServing,
        Duration::from_secs(10),
    )
    .await;

    // A request added while draining is refused with UNAVAILABLE (the router fails it over).
    tx.send(add("late", 4)).unwrap();
    let mut errors = Vec::new();
    let tokens = read_until_finished(&mut inbound, "long", &mut errors).await;
    assert_eq!(
        tokens + 1,
        max_new_tokens as usize,
        "the running request finished"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !errors.iter().any(|(id, _)| id == "late") {
        assert!(
            Instant::now() < deadline,
            "the late request was not refused"
        );
        match tokio::time::timeout(Duration::from_secs(30), inbound.next()).await {
            Ok(Some(Ok(message))) => {
                if let Some(worker_message::Kind::Step(step)) = message.kind {
                    errors.extend(step.errors.into_iter().map(|e| (e.request_id, e.code)));
                }
            }
            other => panic!("the stream ended before the refusal: {other:?}"),
        }
    }
    let (_, code) = errors.iter().find(|(id, _)| id == "late").unwrap();
    assert_eq!(*code, tonic::Code::Unavailable as i32);

    // Then the stream ends and the process exits 0.
    let status = worker
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the worker exits after its drain");
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        worker.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_finishes_its_request_while_new_ones_go_elsewhere() {
    let model = real_model();
    let (mut a, a_addr) = start_worker_with(&model, &["--drain-timeout-ms", "60000"]).await;
    let (mut b, b_addr) = start_worker_with(&model, &["--drain-timeout-ms", "60000"]).await;
    let (_router, router_addr) = start_router(&[&a_addr, &b_addr], &[]).await;
    let mut client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    // Both workers ready.
    let deadline = Instant::now() + Duration::from_secs(30);
    while client
        .model_info(inference_proto::public::ModelInfoRequest::default())
        .await
        .unwrap()
        .into_inner()
        .ready_workers
        < 2
    {
        assert!(Instant::now() < deadline, "both workers ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut long = client.clone();
    let running =
        tokio::spawn(async move { generate(&mut long, greedy("Once upon a time", 40)).await });
    // Find the worker running it and SIGTERM that one.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (draining, other_addr) = loop {
        if integration_tests::worker_stats(&a_addr)
            .await
            .running_sequences
            > 0
        {
            break (&mut a, b_addr.clone());
        }
        if integration_tests::worker_stats(&b_addr)
            .await
            .running_sequences
            > 0
        {
            break (&mut b, a_addr.clone());
        }
        assert!(Instant::now() < deadline, "the request started somewhere");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    draining.terminate();
    // New requests meanwhile all succeed, on the other worker.
    let before = integration_tests::worker_stats(&other_addr)
        .await
        .finished_requests;
    for i in 0..3 {
        let g = generate(&mut client, greedy(&format!("Request number {i}"), 4))
            .await
            .expect("a request during the drain succeeds");
        assert_eq!(g.usage.unwrap().generated_tokens, 4);
    }
    let after = integration_tests::worker_stats(&other_addr)
        .await
        .finished_requests;
    assert_eq!(
        after - before,
        3,
        "the new requests ran on the other worker"
    );
    // The running request finished where it was, without a failover.
    let g = running
        .await
        .unwrap()
        .expect("the running request completes");
    let usage = g.usage.unwrap();
    assert_eq!(usage.generated_tokens, 40);
    assert_eq!(usage.failovers, 0);
    let status = draining
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the drained worker exits");
    assert!(status.success(), "exit status {status}");
}
