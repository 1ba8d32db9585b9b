//! The OpenAI HTTP API with the official `openai` Python SDK and with `curl -N`, on the real SmolLM2
//! model (issue 14): this test starts a worker and four routers (the API under test, one that
//! admits a single request with no queue, one with no reachable worker, one that requires an API
//! key and serves TLS with a test CA made at run time), computes the gRPC front's texts for the
//! requests the Python test makes, and runs integration-tests/python/test_openai.py with the SDK
//! that scripts/install-openai-sdk installs (scripts/test runs it first).
use std::time::Duration;

use inference_proto::public::{ChatMessage, GenerateRequest};
use integration_tests::openai::{run_sdk_test, sdk_python, start, wait_healthy};
use integration_tests::{free_port, generate, real_model, start_router, start_router_with_env};
use serde_json::json;

const MODEL: &str = "smollm2";
const CHAT_PROMPT: &str = "What is the capital of France?";
const COMPLETION_PROMPT: &str = "The three primary colors are";
/// The API key of the router that requires one.
const KEYED_KEY: &str = "sk-sdk-test-7c41";

fn summary(g: &integration_tests::Generation) -> serde_json::Value {
    let usage = g.usage.expect("usage");
    let reason = match g.finish_reason {
        inference_proto::public::FinishReason::MaxNewTokens
        | inference_proto::public::FinishReason::ContextLength => "length",
        _ => "stop",
    };
    json!({
        "text": g.text,
        "finish_reason": reason,
        "prompt_tokens": usage.prompt_tokens,
        "generated_tokens": usage.generated_tokens,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdk_and_curl_against_the_real_model() {
    // Fails fast, before the servers start, when the SDK is missing.
    sdk_python();
    let h = start(&real_model(), &[], &["--served-model-name", MODEL], &[]).await;
    let mut grpc = h.cluster.client().await;
    let chat = |max: u32, temperature: f32, seed: Option<u64>| GenerateRequest {
        messages: vec![ChatMessage {
            role: "user".into(),
            content: CHAT_PROMPT.into(),
            ..Default::default()
        }],
        max_new_tokens: Some(max),
        temperature,
        seed,
        ..Default::default()
    };
    let chat_ref = generate(&mut grpc, chat(32, 0.0, None)).await.unwrap();
    let completion_ref = generate(
        &mut grpc,
        GenerateRequest {
            prompt: COMPLETION_PROMPT.into(),
            max_new_tokens: Some(24),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut seeded = Vec::new();
    for i in 0..3 {
        seeded.push(
            generate(&mut grpc, chat(16, 0.9, Some(123 + i)))
                .await
                .unwrap()
                .text,
        );
    }
    let expected = json!({
        "chat_prompt": CHAT_PROMPT,
        "completion_prompt": COMPLETION_PROMPT,
        "chat": summary(&chat_ref),
        "completion": summary(&completion_ref),
        "seeded": seeded,
    });
    let dir = tempfile::tempdir().unwrap();
    let expected_path = dir.path().join("expected.json");
    std::fs::write(&expected_path, expected.to_string()).unwrap();

    // A second router over the same worker that takes one request and queues none.
    let overload_http = format!("127.0.0.1:{}", free_port());
    let (_overload, _) = start_router_with_env(
        &[&h.cluster.worker_addr],
        &[
            "--http-listen",
            &overload_http,
            "--served-model-name",
            MODEL,
        ],
        &[
            ("ROUTER_MAX_INFLIGHT_PER_WORKER", "1"),
            ("ROUTER_MAX_WAITING_REQUESTS", "0"),
        ],
    )
    .await;
    wait_healthy(&format!("http://{overload_http}"), Duration::from_secs(30)).await;
    // A router whose worker is not there.
    let dead_http = format!("127.0.0.1:{}", free_port());
    let dead_worker = format!("127.0.0.1:{}", free_port());
    let (_dead, _) = start_router(
        &[&dead_worker],
        &["--http-listen", &dead_http, "--served-model-name", MODEL],
    )
    .await;

    // A router over the same worker that requires an API key and serves TLS (a test CA made
    // here; its plain health port says when it is ready).
    let ca = tls_certs::test_ca::TestCa::new("openai SDK test CA");
    let (ca_file, cert) = ca.write(dir.path(), "keyed", &["localhost"]);
    let keyed_port = free_port();
    let keyed_http = format!("127.0.0.1:{keyed_port}");
    let keyed_health = format!("127.0.0.1:{}", free_port());
    let (_keyed, _) = start_router_with_env(
        &[&h.cluster.worker_addr],
        &[
            "--http-listen",
            &keyed_http,
            "--served-model-name",
            MODEL,
            "--tls-cert",
            cert.cert.to_str().unwrap(),
            "--tls-key",
            cert.key.to_str().unwrap(),
            "--health-listen",
            &keyed_health,
        ],
        &[("ROUTER_API_KEYS", KEYED_KEY)],
    )
    .await;
    integration_tests::ops::wait_health(
        &keyed_health,
        "",
        tonic_health::pb::health_check_response::ServingStatus::Serving,
        Duration::from_secs(30),
    )
    .await;

    let report = run_sdk_test(
        "test_openai.py",
        &format!("{}/v1", h.base),
        &[
            (
                "OVERLOAD_BASE",
                format!("http://{overload_http}/v1").as_ref(),
            ),
            ("DEAD_BASE", format!("http://{dead_http}/v1").as_ref()),
            (
                "KEYED_BASE",
                format!("https://localhost:{keyed_port}/v1").as_ref(),
            ),
            ("TLS_CA", ca_file.as_ref()),
            ("KEYED_KEY", KEYED_KEY.as_ref()),
            ("MODEL", MODEL.as_ref()),
            ("EXPECTED", expected_path.as_ref()),
        ],
        || h.cluster.router.log_text(),
    )
    .await;
    assert!(report.contains("Ran 13 tests"), "{report}");

    // The raw event stream, as `curl -N` shows it.
    let body = json!({"model": MODEL, "prompt": COMPLETION_PROMPT, "max_tokens": 24,
                      "temperature": 0, "stream": true,
                      "stream_options": {"include_usage": true}});
    let curl = tokio::process::Command::new("curl")
        .args(["-sSN", "-H", "content-type: application/json", "-d"])
        .arg(body.to_string())
        .arg(format!("{}/v1/completions", h.base))
        .output()
        .await
        .expect("running curl");
    assert!(
        curl.status.success(),
        "{}",
        String::from_utf8_lossy(&curl.stderr)
    );
    let raw = String::from_utf8(curl.stdout).unwrap();
    assert!(raw.ends_with("\n\ndata: [DONE]\n\n"), "{raw}");
    let events: Vec<&str> = raw.trim_end().split("\n\n").collect();
    let mut text = String::new();
    for event in &events[..events.len() - 1] {
        let data = event.strip_prefix("data: ").expect("data events only");
        let chunk: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(chunk["object"], "text_completion");
        if let Some(choice) = chunk["choices"].get(0) {
            text.push_str(choice["text"].as_str().unwrap());
        }
    }
    assert_eq!(text, completion_ref.text);
    let usage: serde_json::Value =
        serde_json::from_str(events[events.len() - 2].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"]["completion_tokens"],
        completion_ref.usage.unwrap().generated_tokens
    );
}
