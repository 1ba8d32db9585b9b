//! Serving behaviour on a tiny random-weight model (fast): invalid input, cancellation on client
//! disconnect, concurrency, a router that starts before its worker, and command-line failures.

use std::time::{Duration, Instant};

use inference_proto::public::{
    text_generation_client::TextGenerationClient, ChatMessage, FinishReason, GenerateRequest,
    ModelInfoRequest,
};
use integration_tests::{
    connect_ready, free_port, generate, greedy, real_model, run_to_exit, start_router,
    start_worker, tiny_model, Cluster,
};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_get_invalid_argument_and_serving_goes_on() {
    let (_dir, model) = tiny_model(1);
    let cluster = Cluster::start(&model).await;
    let mut client = cluster.client().await;
    let info = client
        .model_info(ModelInfoRequest::default())
        .await
        .unwrap()
        .into_inner();
    let ctx = info.max_context_tokens;
    let limits = info.limits.unwrap();

    let ok = greedy("hello there", 4);
    let context_message = format!("context is {ctx} tokens");
    let cases: Vec<(&str, GenerateRequest, &str)> = vec![
        (
            "empty prompt",
            GenerateRequest {
                prompt: String::new(),
                ..ok.clone()
            },
            "empty",
        ),
        (
            "prompt longer than the context",
            GenerateRequest {
                prompt: "a ".repeat(ctx as usize * 2),
                ..ok.clone()
            },
            &context_message,
        ),
        (
            "max_new_tokens 0",
            GenerateRequest {
                max_new_tokens: Some(0),
                ..ok.clone()
            },
            "at least 1",
        ),
        (
            "max_new_tokens beyond the context",
            GenerateRequest {
                max_new_tokens: Some(ctx),
                ..ok.clone()
            },
            "exceeds this model's context",
        ),
        (
            "negative temperature",
            GenerateRequest {
                temperature: -1.0,
                ..ok.clone()
            },
            "temperature",
        ),
        (
            "top_p 0",
            GenerateRequest {
                top_p: Some(0.0),
                ..ok.clone()
            },
            "top_p",
        ),
        (
            "top_p above 1",
            GenerateRequest {
                top_p: Some(1.01),
                ..ok.clone()
            },
            "top_p",
        ),
        (
            "too many stop strings",
            GenerateRequest {
                stop: vec!["x".into(); limits.max_stop_sequences as usize + 1],
                ..ok.clone()
            },
            "stop sequences given",
        ),
        (
            "prompt and messages",
            GenerateRequest {
                messages: vec![ChatMessage {
                    role: "user".into(),
                    content: "hi".into(),
                    ..Default::default()
                }],
                ..ok.clone()
            },
            "not both",
        ),
    ];
    for (name, request, needle) in cases {
        let status = generate(&mut client, request).await.expect_err(name);
        assert_eq!(status.code(), Code::InvalidArgument, "{name}: {status:?}");
        assert!(
            status.message().contains(needle),
            "{name}: {:?}",
            status.message()
        );
    }
    let g = generate(&mut client, ok).await.expect("still serving");
    assert_eq!(g.token_ids.len(), 4);
    assert_eq!(g.finish_reason, FinishReason::MaxNewTokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_frees_the_sequence_on_the_worker() {
    // The real model: the tiny one finishes 500 tokens before the client could hang up.
    let cluster = Cluster::start(&real_model()).await;
    let mut client = cluster.client().await;
    let mut stream = client
        .generate(greedy("Once upon a time", 500))
        .await
        .unwrap()
        .into_inner();
    stream.message().await.unwrap().expect("first message");
    stream.message().await.unwrap().expect("second message");
    assert_eq!(cluster.worker_stats().await.running_sequences, 1);
    drop(stream);
    drop(client);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = cluster.worker_stats().await;
        if stats.running_sequences == 0 {
            assert_eq!(stats.cancelled_requests, 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sequence still running: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_equal_their_sequential_runs() {
    let (_dir, model) = tiny_model(3);
    let cluster = Cluster::start(&model).await;
    let mut client = cluster.client().await;
    let prompts = ["one two", "the cat sat", "hello", "x y z w"];
    let mut sequential = Vec::new();
    for p in prompts {
        sequential.push(generate(&mut client, greedy(p, 24)).await.unwrap());
    }
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut c = client.clone();
            let req = greedy(p, 24);
            tokio::spawn(async move { generate(&mut c, req).await })
        })
        .collect();
    for (task, want) in tasks.into_iter().zip(&sequential) {
        let got = task.await.unwrap().unwrap();
        assert_eq!(got.token_ids, want.token_ids);
        assert_eq!(got.text, want.text);
        assert_eq!(got.token_ids.len(), 24);
    }
    // Seeded sampling is reproducible too.
    let sampled = GenerateRequest {
        temperature: 1.0,
        top_p: Some(0.9),
        seed: Some(42),
        ..greedy("hello", 16)
    };
    let a = generate(&mut client, sampled.clone()).await.unwrap();
    let b = generate(&mut client, sampled).await.unwrap();
    assert_eq!(a.token_ids, b.token_ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_starts_before_its_worker_and_answers_unavailable_until_then() {
    let (_dir, model) = tiny_model(4);
    let worker_port = free_port();
    let worker_addr = format!("127.0.0.1:{worker_port}");
    let (_router, router_addr) = start_router(&[&worker_addr], &[]).await;
    let mut client = TextGenerationClient::connect(format!("http://{router_addr}"))
        .await
        .unwrap();
    let status = generate(&mut client, greedy("hi", 2)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("no worker is ready"),
        "{status:?}"
    );

    // Start the worker on the address the router keeps trying.
    let model_str = model.to_str().unwrap();
    let _worker = integration_tests::Process::start(
        "worker",
        &["--model", model_str, "--listen", &worker_addr],
        "worker ready",
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let mut client = connect_ready(&router_addr, Duration::from_secs(20)).await;
    let g = generate(&mut client, greedy("hi", 3)).await.unwrap();
    assert_eq!(g.token_ids.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_model_path_and_port_in_use_exit_with_a_message() {
    let timeout = Duration::from_secs(30);
    let addr = format!("127.0.0.1:{}", free_port());
    let (ok, out) = run_to_exit(
        "worker",
        &["--model", "/nonexistent/m.gguf", "--listen", &addr],
        timeout,
    )
    .await;
    assert!(!ok);
    assert!(
        out.contains("/nonexistent/m.gguf") && out.contains("does not exist"),
        "{out}"
    );

    let (_dir, model) = tiny_model(5);
    let (_worker, busy) = start_worker(&model).await;
    let (ok, out) = run_to_exit(
        "worker",
        &["--model", model.to_str().unwrap(), "--listen", &busy],
        timeout,
    )
    .await;
    assert!(!ok);
    assert!(out.contains(&format!("cannot listen on {busy}")), "{out}");

    let (ok, out) = run_to_exit("router", &["--workers", &addr, "--listen", &busy], timeout).await;
    assert!(!ok);
    assert!(out.contains(&format!("cannot listen on {busy}")), "{out}");
}
