//! The OpenAI-compatible HTTP front (issue 14) against real router and worker processes on the tiny
//! random-weight model, with a plain HTTP client:
//!
//! - the same greedy request gives the same text and usage on HTTP and gRPC, for completions and
//!   chat, whole and streamed; `n` choices use seeds `seed + i` (each equals the gRPC run with that
//!   seed) and a seeded request repeats exactly; stop strings, logprobs, `include_usage`, the event
//!   stream's shape (role first, one finish per choice, usage chunk, `[DONE]`), `/v1/models`,
//!   aliases, `/health`;
//! - every error status with OpenAI's error object: 400 (wrong type, wrong value), 404 (model,
//!   path), 413, 429 (queue full), 503 (no worker); structured output (guided_choice) through
//!   the HTTP front;
//! - a client that disconnects mid-stream cancels its sequences on the worker;
//! - while the worker prefills a long prompt and streams come and go (half disconnected), every
//!   request is served and `/health` stays 200.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use inference_proto::public::{ChatMessage, GenerateRequest};
use integration_tests::openai::{events, get, joined, post, start, wait_healthy};
use integration_tests::{free_port, generate, greedy, start_router, worker_stats};
use serde_json::{json, Value};

/// A tiny model with a 16k context, so that long requests run long enough to act on.
fn tiny_16k(seed: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    integration_tests::tiny_model_with_context(seed, 16_384)
}

fn error_of(body: &Value) -> (&str, &str, Option<&str>) {
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    (
        e["type"].as_str().expect("error.type"),
        e["code"].as_str().expect("error.code"),
        e["param"].as_str(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_front_matches_grpc_and_speaks_openai() {
    let (_dir, model) = tiny_16k(14);
    let h = start(
        &model,
        &[],
        &[
            "--served-model-name",
            "tiny",
            "--model-aliases",
            "tiny-alias",
        ],
        &[],
    )
    .await;
    let mut grpc = h.cluster.client().await;
    let http = reqwest::Client::new();
    let base = &h.base;

    let (status, health) = get(&http, &format!("{base}/health")).await;
    assert_eq!((status, &health["status"]), (200, &json!("ready")));
    let (status, models) = get(&http, &format!("{base}/v1/models")).await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["tiny", "tiny-alias"]);
    // One model, as the SDK's `models.retrieve` asks for it; an unknown one is 404.
    let (status, one) = get(&http, &format!("{base}/v1/models/tiny-alias")).await;
    assert_eq!((status, &one), (200, &models["data"][1]));
    let (status, unknown) = get(&http, &format!("{base}/v1/models/gpt-4o")).await;
    assert_eq!(status, 404, "{unknown}");
    assert_eq!(unknown["error"]["code"], "model_not_found", "{unknown}");

    // Completions, greedy: the same text and usage as gRPC.
    let reference = generate(&mut grpc, greedy("Once upon a time", 24))
        .await
        .unwrap();
    let url = format!("{base}/v1/completions");
    let body = json!({"model": "tiny-alias", "prompt": "Once upon a time", "max_tokens": 24,
                      "temperature": 0, "ignore_eos": true});
    let (status, done) = post(&http, &url, &body).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["object"], "text_completion");
    assert_eq!(done["model"], "tiny-alias");
    assert_eq!(done["choices"][0]["text"], reference.text.as_str());
    assert_eq!(done["choices"][0]["finish_reason"], "length");
    let usage = reference.usage.unwrap();
    assert_eq!(done["usage"]["prompt_tokens"], usage.prompt_tokens);
    assert_eq!(done["usage"]["completion_tokens"], 24);
    assert_eq!(done["usage"]["total_tokens"], usage.prompt_tokens + 24);

    // Streamed: the same text, one finish reason, the usage chunk, [DONE].
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = events(http.post(&url).json(&streamed).send().await.unwrap()).await;
    let (text, reasons) = joined(&chunks, 0);
    assert_eq!(text, reference.text);
    assert_eq!(reasons, ["length"]);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 24);
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["usage"].is_null()));

    // Chat, whole and streamed: the gRPC chat's text; the role comes first.
    let messages = vec![ChatMessage {
        role: "user".into(),
        content: "Hi there".into(),
        ..Default::default()
    }];
    let chat_ref = generate(
        &mut grpc,
        GenerateRequest {
            messages,
            max_new_tokens: Some(16),
            ignore_eos: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let chat_url = format!("{base}/v1/chat/completions");
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi there"}]}],
                      "max_completion_tokens": 16, "temperature": 0, "ignore_eos": true});
    let (status, done) = post(&http, &chat_url, &chat).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["object"], "chat.completion");
    assert_eq!(done["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        done["choices"][0]["message"]["content"],
        chat_ref.text.as_str()
    );
    let mut chat_stream = chat.clone();
    chat_stream["stream"] = json!(true);
    let chunks = events(
        http.post(&chat_url)
            .json(&chat_stream)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    let (text, reasons) = joined(&chunks, 0);
    assert_eq!(
        (text.as_str(), reasons),
        (chat_ref.text.as_str(), vec!["length".to_string()])
    );

    // n = 3 at temperature 1 with a seed: choice i is the gRPC run with seed + i, and repeats.
    let sampled = json!({"prompt": "The weather", "max_tokens": 12, "temperature": 1.0, "n": 3,
                         "seed": 77, "ignore_eos": true});
    let (status, first) = post(&http, &url, &sampled).await;
    assert_eq!(status, 200, "{first}");
    let (_, again) = post(&http, &url, &sampled).await;
    assert_eq!(first["choices"], again["choices"]);
    assert_eq!(first["usage"]["completion_tokens"], 36);
    for i in 0..3u64 {
        let g = generate(
            &mut grpc,
            GenerateRequest {
                temperature: 1.0,
                seed: Some(77 + i),
                ..greedy("The weather", 12)
            },
        )
        .await
        .unwrap();
        assert_eq!(first["choices"][i as usize]["index"], i);
        assert_eq!(first["choices"][i as usize]["text"], g.text.as_str());
    }
    let mut n_stream = sampled.clone();
    n_stream["stream"] = json!(true);
    let chunks = events(http.post(&url).json(&n_stream).send().await.unwrap()).await;
    for i in 0..3u64 {
        let (text, reasons) = joined(&chunks, i);
        assert_eq!(text, first["choices"][i as usize]["text"].as_str().unwrap());
        assert_eq!(reasons.len(), 1, "one finish_reason per choice");
    }

    // A stop string cuts the text before it, with finish_reason "stop".
    let chars: Vec<char> = reference.text.chars().collect();
    assert!(chars.len() >= 12, "the reference text is long enough");
    let stop: String = chars[8..11].iter().collect();
    let expected = &reference.text[..reference.text.find(&stop).unwrap()];
    let mut stopped = body.clone();
    stopped["stop"] = json!([stop]);
    let (_, done) = post(&http, &url, &stopped).await;
    assert_eq!(done["choices"][0]["text"], expected);
    assert_eq!(done["choices"][0]["finish_reason"], "stop");

    // logprobs: one entry per generated token with the alternatives asked for.
    let mut lp = body.clone();
    lp["logprobs"] = json!(2);
    let (_, done) = post(&http, &url, &lp).await;
    let logprobs = &done["choices"][0]["logprobs"];
    assert_eq!(logprobs["tokens"].as_array().unwrap().len(), 24);
    assert_eq!(logprobs["token_logprobs"].as_array().unwrap().len(), 24);
    for alternatives in logprobs["top_logprobs"].as_array().unwrap() {
        assert_eq!(alternatives.as_object().map(|m| m.len() <= 2), Some(true));
    }
    let mut chat_lp = chat.clone();
    chat_lp["logprobs"] = json!(true);
    chat_lp["top_logprobs"] = json!(3);
    let (_, done) = post(&http, &chat_url, &chat_lp).await;
    let content = done["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 16);
    assert!(content.iter().all(|t| t["logprob"].as_f64().unwrap() <= 0.0
        && t["top_logprobs"].as_array().unwrap().len() == 3));

    // Errors, each with OpenAI's error object.
    let cases = [
        (
            json!({"prompt": "x", "temperature": "hot"}),
            400,
            "invalid_type",
            Some("temperature"),
        ),
        (
            json!({"prompt": "x", "max_tokens": 100000}),
            400,
            "invalid_value",
            Some("max_tokens"),
        ),
        (
            json!({"prompt": "x", "top_p": 1.5}),
            400,
            "invalid_value",
            Some("top_p"),
        ),
        (
            json!({"prompt": "x", "logit_bias": {"999999": 1}}),
            400,
            "invalid_value",
            Some("logit_bias"),
        ),
        (
            json!({"prompt": "x", "model": "gpt-4o"}),
            404,
            "model_not_found",
            Some("model"),
        ),
        (
            json!({"prompt": "x", "guided_regex": "(unclosed"}),
            400,
            "invalid_value",
            Some("response_format"),
        ),
        (
            json!({"prompt": "x", "guided_choice": []}),
            400,
            "invalid_value",
            Some("response_format"),
        ),
    ];
    for (body, status, code, param) in cases {
        let (got, answer) = post(&http, &url, &body).await;
        assert_eq!(got, status, "{body} -> {answer}");
        let (_, got_code, got_param) = error_of(&answer);
        assert_eq!((got_code, got_param), (code, param), "{body} -> {answer}");
    }
    // Structured output through the HTTP front: a guided choice ends on one of the choices.
    for seed in 0..3 {
        let body = json!({"prompt": "Pick:", "guided_choice": ["yes", "no"], "max_tokens": 8,
                          "temperature": 1.0, "seed": seed});
        let (status, answer) = post(&http, &url, &body).await;
        assert_eq!(status, 200, "{answer}");
        let choice = &answer["choices"][0];
        let text = choice["text"].as_str().unwrap();
        assert!(text == "yes" || text == "no", "{answer}");
        assert_eq!(choice["finish_reason"], "stop", "{answer}");
    }
    let (status, answer) = post(&http, &chat_url, &json!({"messages": "hi"})).await;
    assert_eq!((status, error_of(&answer).2), (400, Some("messages")));
    let response = http.post(&url).body("{\"prompt\": ").send().await.unwrap();
    assert_eq!(response.status(), 400);
    let big = json!({"prompt": "x".repeat(2 << 20)});
    let (status, answer) = post(&http, &url, &big).await;
    assert_eq!((status, error_of(&answer).1), (413, "request_too_large"));
    let (status, answer) = post(&http, &format!("{base}/v1/embeddings"), &json!({})).await;
    assert_eq!((status, error_of(&answer).1), (404, "unknown_url"));
    let response = http.get(&chat_url).send().await.unwrap();
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap();
    assert_eq!((status, error_of(&answer).1), (405, "method_not_allowed"));

    // A client that goes away mid-stream cancels its sequences on the worker.
    let long = json!({"prompt": "Tell me everything", "max_tokens": 4000, "ignore_eos": true,
                      "stream": true, "n": 2});
    let response = http.post(&url).json(&long).send().await.unwrap();
    let mut stream = response.bytes_stream();
    stream.next().await.expect("a first event").unwrap();
    // Both choices are on the worker (its counters are published once per step).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = worker_stats(&h.cluster.worker_addr).await;
        if stats.running_sequences + stats.waiting_sequences == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{stats:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = worker_stats(&h.cluster.worker_addr).await;
        if stats.running_sequences == 0 && stats.waiting_sequences == 0 {
            assert!(stats.cancelled_requests >= 2, "{stats:?}");
            break;
        }
        assert!(Instant::now() < deadline, "not cancelled: {stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_429_and_no_worker_is_503() {
    // No worker at all: /health and requests are 503.
    let dead = format!("127.0.0.1:{}", free_port());
    let http_addr = format!("127.0.0.1:{}", free_port());
    let (_router, _) = start_router(&[&dead], &["--http-listen", &http_addr]).await;
    let http = reqwest::Client::new();
    let base = format!("http://{http_addr}");
    let (status, health) = get(&http, &format!("{base}/health")).await;
    assert_eq!(
        (status, &health["status"]),
        (503, &json!("no_ready_worker"))
    );
    let url = format!("{base}/v1/chat/completions");
    let (status, answer) = post(
        &http,
        &url,
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(
        (status, error_of(&answer)),
        (503, ("server_error", "unavailable", None))
    );
    // Bad input is still reported as such.
    let (status, _) = post(&http, &url, &json!({"messages": [], "top_p": 2})).await;
    assert_eq!(status, 400);

    // One request in flight per worker and no queue: a second request is 429.
    let (_dir, model) = tiny_16k(15);
    let h = start(
        &model,
        &[],
        &[],
        &[
            ("ROUTER_MAX_INFLIGHT_PER_WORKER", "1"),
            ("ROUTER_MAX_WAITING_REQUESTS", "0"),
        ],
    )
    .await;
    let url = format!("{}/v1/completions", h.base);
    let long = json!({"prompt": "a", "max_tokens": 4000, "ignore_eos": true, "stream": true});
    let running = http.post(&url).json(&long).send().await.unwrap();
    assert_eq!(running.status(), 200);
    let (status, answer) = post(&http, &url, &json!({"prompt": "b"})).await;
    assert_eq!(
        (status, error_of(&answer)),
        (429, ("rate_limit_error", "overloaded", None))
    );
    drop(running);
}

/// A streaming request that waits for a lost worker to come back (`reconnect_grace_ms`) and fails
/// gets its status, 503 with OpenAI's error object, before the event stream's headers (not 200 and
/// an error event, which clients do not retry); after the grace, the refusal is at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_waits_for_a_lost_worker_in_vain_is_503_not_an_event() {
    let (_dir, model) = tiny_16k(16);
    let mut h = start(&model, &[], &[], &[("ROUTER_RECONNECT_GRACE_MS", "1500")]).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/completions", h.base);
    let body = json!({"prompt": "a", "max_tokens": 4, "stream": true});
    let served = http.post(&url).json(&body).send().await.unwrap();
    assert_eq!(served.status(), 200);
    assert!(!events(served).await.is_empty());

    h.cluster.worker.kill().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&http, &format!("{}/health", h.base)).await.0 != 503 {
        assert!(
            Instant::now() < deadline,
            "the router never saw the worker go"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, answer) = post(&http, &url, &body).await;
    assert_eq!(
        (status, error_of(&answer)),
        (503, ("server_error", "unavailable", None)),
        "{answer}"
    );
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("waited"),
        "it waited in the grace: {message}"
    );
    // Past the grace: refused at once.
    let (status, answer) = post(&http, &url, &body).await;
    assert_eq!(status, 503, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("retry shortly"), "{message}");
}

/// A request that no worker's KV cache could ever hold is refused by the router before any work:
/// HTTP 400 with OpenAI's error object even when streaming (before the event stream's headers),
/// `INVALID_ARGUMENT` on gRPC, and the worker never sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_kv_cache_can_hold_is_400_before_any_stream() {
    let (_dir, model) = tiny_16k(16);
    // 8 blocks of 16 tokens: 128 tokens at once.
    let h = start(&model, &["--kv-cache-blocks", "8"], &[], &[]).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/completions", h.base);
    let too_long = json!({"prompt": vec![5; 100], "max_tokens": 100, "stream": true});
    let response = http.post(&url).json(&too_long).send().await.unwrap();
    assert_eq!(response.status(), 400);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(
        error_of(&answer),
        ("invalid_request_error", "invalid_value", Some("max_tokens"))
    );
    let message = answer["error"]["message"].as_str().unwrap();
    assert_eq!(
        message,
        "prompt (100 tokens) + max_tokens (100) needs 13 KV blocks; the largest KV cache of \
         the ready workers has 8 blocks of 16 tokens"
    );
    let mut grpc = h.cluster.client().await;
    let status = grpc
        .generate(greedy(&"hello ".repeat(60), 100))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().ends_with(
            "KV blocks; the largest KV cache of the ready workers has 8 blocks of 16 tokens"
        ),
        "{status:?}"
    );
    // What fits is served (128 tokens exactly), and the worker never saw the refused ones.
    let fits = json!({"prompt": vec![5; 100], "max_tokens": 28, "ignore_eos": true});
    let (status, answer) = post(&http, &url, &fits).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 28, "{answer}");
    let stats = worker_stats(&h.cluster.worker_addr).await;
    assert_eq!((stats.finished_requests, stats.failed_requests), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_stays_200_while_a_long_prefill_runs_and_streams_come_and_go() {
    let (_dir, model) = tiny_16k(5);
    let h = start(
        &model,
        &["--threads", "1", "--max-batch-tokens", "256"],
        &[],
        &[("ROUTER_HEALTH_INTERVAL_MS", "50")],
    )
    .await;
    let base = h.base.clone();
    let http = reqwest::Client::new();
    let done = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn({
        let (done, base, http) = (done.clone(), base.clone(), http.clone());
        async move {
            let mut statuses = Vec::new();
            while !done.load(Ordering::SeqCst) {
                let r = http.get(format!("{base}/health")).send().await.unwrap();
                statuses.push(r.status().as_u16());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            statuses
        }
    });
    let url = format!("{base}/v1/completions");
    // A long prompt (about 12k tokens) as token ids, prefilling 256 tokens a step.
    let long_ids: Vec<u32> = (0..12_000u32).map(|i| 10 + i % 200).collect();
    let long = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        async move {
            post(
                &http,
                &url,
                &json!({"prompt": long_ids, "max_tokens": 4, "temperature": 0}),
            )
            .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while worker_stats(&h.cluster.worker_addr).await.steps == 0 {
        assert!(Instant::now() < deadline, "the long prompt never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut shorts = Vec::new();
    for i in 0..12u32 {
        let (http, url) = (http.clone(), url.clone());
        shorts.push(tokio::spawn(async move {
            let body = json!({"prompt": format!("Short question {i}?"), "max_tokens": 16,
                              "ignore_eos": true, "stream": true, "temperature": 0});
            let response = http.post(&url).json(&body).send().await.unwrap();
            assert_eq!(response.status(), 200);
            if i % 2 == 0 {
                // Hang up after the first event.
                let mut stream = response.bytes_stream();
                stream.next().await.expect("an event").unwrap();
                return None;
            }
            let chunks = events(response).await;
            Some(joined(&chunks, 0).1)
        }));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    for short in futures::future::join_all(shorts).await {
        if let Some(reasons) = short.unwrap() {
            assert_eq!(reasons, ["length"]);
        }
    }
    let (status, answer) = long.await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens"], 12_000);
    done.store(true, Ordering::SeqCst);
    let statuses = sampler.await.unwrap();
    assert!(statuses.len() >= 5, "{} health samples", statuses.len());
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    // Every sequence is gone from the worker.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = worker_stats(&h.cluster.worker_addr).await;
        if stats.running_sequences == 0 && stats.waiting_sequences == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_healthy(&base, Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_http_front_and_running_streams_finish() {
    let (_dir, model) = tiny_16k(16);
    let mut h = start(&model, &[], &[], &[]).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/completions", h.base);
    let body = json!({"prompt": "a", "max_tokens": 3000, "ignore_eos": true, "stream": true});
    let running = http.post(&url).json(&body).send().await.unwrap();
    assert_eq!(running.status(), 200);
    h.cluster.router.terminate();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, health) = get(&http, &format!("{}/health", h.base)).await;
        if status == 503 {
            assert_eq!(health["status"], "draining");
            break;
        }
        assert!(Instant::now() < deadline, "/health still {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, answer) = post(&http, &url, &json!({"prompt": "b"})).await;
    assert_eq!((status, error_of(&answer).1), (503, "unavailable"));
    let chunks = events(running).await;
    assert_eq!(joined(&chunks, 0).1, ["length"]);
    let exit = h.cluster.router.wait_exit(Duration::from_secs(10)).await;
    assert!(exit.is_some_and(|s| s.success()), "{exit:?}");
}
