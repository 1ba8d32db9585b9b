//! API keys on both public fronts (issue 14, "Who may call") against real router and worker
//! processes on the tiny random-weight model: keys from a file and from `ROUTER_API_KEYS` at once;
//! a missing, malformed or wrong key is refused (`UNAUTHENTICATED` on gRPC, 401 with OpenAI's error
//! object on HTTP) without echoing the key; a right key is served on both fronts; gRPC health,
//! HTTP `/health` and `/metrics` stay open; rewriting the key file rotates the keys within seconds,
//! without a restart.

use std::time::{Duration, Instant};

use inference_proto::public::text_generation_client::TextGenerationClient;
use inference_proto::public::ModelInfoRequest;
use integration_tests::openai::wait_healthy;
use integration_tests::{
    free_port, greedy, run_to_exit, start_router_with_env, start_worker, tiny_model,
};
use serde_json::{json, Value};
use tonic::transport::Channel;

const ENV_KEY: &str = "env-key-5f1c";
const FILE_KEY_OLD: &str = "file-key-old-93ab";
const FILE_KEY_NEW: &str = "file-key-new-27de";
const WRONG_KEY: &str = "wrong-key-0000";

/// `ModelInfo` on gRPC with `authorization: Bearer key` (none when `key` is `None`).
async fn grpc_model_info(
    client: &mut TextGenerationClient<Channel>,
    key: Option<&str>,
) -> Result<(), tonic::Status> {
    let mut request = tonic::Request::new(ModelInfoRequest::default());
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    client.model_info(request).await.map(|_| ())
}

/// A greedy `Generate` on gRPC with `key`; the generated text.
async fn grpc_generate(
    client: &mut TextGenerationClient<Channel>,
    key: &str,
) -> Result<String, tonic::Status> {
    let mut request = tonic::Request::new(greedy("Hello", 4));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    let mut stream = client.generate(request).await?.into_inner();
    let mut text = String::new();
    while let Some(m) = stream.message().await? {
        text.push_str(&m.text);
    }
    Ok(text)
}

/// `POST /v1/completions` with an `Authorization` header value (none when `None`).
async fn http_completion(base: &str, authorization: Option<&str>) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0}));
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let response = request.send().await.expect("POST /v1/completions");
    let status = response.status().as_u16();
    if status == 401 {
        assert_eq!(
            response.headers().get("www-authenticate").unwrap(),
            "Bearer"
        );
    }
    (status, response.json().await.expect("a JSON answer"))
}

/// Asserts a 401 with OpenAI's error object whose message contains `says` and no key.
fn assert_refused(answer: &(u16, Value), says: &str) {
    let (status, body) = answer;
    assert_eq!(*status, 401, "{body}");
    let e = &body["error"];
    assert_eq!(e["type"], "invalid_request_error", "{body}");
    assert_eq!(e["code"], "invalid_api_key", "{body}");
    assert!(e["param"].is_null(), "{body}");
    let message = e["message"].as_str().expect("error.message");
    assert!(message.contains(says), "{message}");
    for key in [ENV_KEY, FILE_KEY_OLD, FILE_KEY_NEW, WRONG_KEY] {
        assert!(!message.contains(key), "{message}");
    }
}

fn assert_unauthenticated(result: Result<impl std::fmt::Debug, tonic::Status>, says: &str) {
    let status = result.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains(says), "{status:?}");
    assert!(!status.message().contains(WRONG_KEY), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_guard_both_fronts_and_rotate_without_restart() {
    let (_model_dir, model) = tiny_model(21);
    let keys_dir = tempfile::tempdir().unwrap();
    let key_file = keys_dir.path().join("api-keys");
    std::fs::write(
        &key_file,
        format!("# rotated by the test\n\n{FILE_KEY_OLD}\n"),
    )
    .unwrap();
    let (_worker, worker_addr) = start_worker(&model).await;
    let http = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let (router, router_addr) = start_router_with_env(
        &[&worker_addr],
        &[
            "--http-listen",
            &http,
            "--metrics-listen",
            &metrics,
            "--api-keys-file",
            key_file.to_str().unwrap(),
        ],
        &[("ROUTER_API_KEYS", ENV_KEY)],
    )
    .await;
    let base = format!("http://{http}");
    // Open without a key: HTTP /health (waits for readiness), /metrics, gRPC health.
    wait_healthy(&base, Duration::from_secs(30)).await;
    let metrics_page = reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .unwrap();
    assert_eq!(metrics_page.status(), 200);
    let channel = Channel::from_shared(format!("http://{router_addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "inference.v1.TextGeneration".into(),
        })
        .await
        .expect("gRPC health is open")
        .into_inner();
    assert_eq!(
        serving.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let mut client = TextGenerationClient::new(channel);

    // Missing, malformed and wrong keys are refused on both fronts.
    assert_unauthenticated(grpc_model_info(&mut client, None).await, "no API key");
    assert_unauthenticated(
        grpc_generate(&mut client, WRONG_KEY).await,
        "the API key is not valid",
    );
    assert_refused(&http_completion(&base, None).await, "no API key");
    assert_refused(
        &http_completion(&base, Some(&format!("Bearer {WRONG_KEY}"))).await,
        "the API key is not valid",
    );
    assert_refused(
        &http_completion(&base, Some(FILE_KEY_OLD)).await,
        "not `Bearer KEY`",
    );
    let models = reqwest::get(format!("{base}/v1/models")).await.unwrap();
    assert_eq!(models.status(), 401);

    // The file's key and the environment's key are served on both fronts, with the same text.
    let grpc_text = grpc_generate(&mut client, FILE_KEY_OLD).await.unwrap();
    assert!(!grpc_text.is_empty());
    assert_eq!(
        grpc_generate(&mut client, ENV_KEY).await.unwrap(),
        grpc_text
    );
    for key in [FILE_KEY_OLD, ENV_KEY] {
        let (status, body) = http_completion(&base, Some(&format!("Bearer {key}"))).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["text"], grpc_text.as_str(), "{body}");
    }

    // The command-line client sends `--api-key`.
    let (ok, output) = run_to_exit(
        "client",
        &[
            "--router",
            &router_addr,
            "--api-key",
            ENV_KEY,
            "--ignore-eos",
            "--max-new-tokens",
            "4",
            "Hello",
        ],
        Duration::from_secs(30),
    )
    .await;
    assert!(ok, "{output}");
    assert!(output.contains(&grpc_text), "{output}");
    let (ok, output) = run_to_exit(
        "client",
        &["--router", &router_addr, "--max-new-tokens", "4", "Hello"],
        Duration::from_secs(30),
    )
    .await;
    assert!(!ok && output.contains("no API key"), "{output}");

    // Rotation: the new key is accepted within a few seconds, then the old one is refused.
    std::fs::write(&key_file, format!("{FILE_KEY_NEW}\n")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while grpc_model_info(&mut client, Some(FILE_KEY_NEW))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the rotated key was not taken");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = http_completion(&base, Some(&format!("Bearer {FILE_KEY_NEW}"))).await;
    assert_eq!(status, 200, "{body}");
    assert_unauthenticated(
        grpc_model_info(&mut client, Some(FILE_KEY_OLD)).await,
        "the API key is not valid",
    );
    assert_refused(
        &http_completion(&base, Some(&format!("Bearer {FILE_KEY_OLD}"))).await,
        "the API key is not valid",
    );
    grpc_model_info(&mut client, Some(ENV_KEY)).await.unwrap();

    // The refused Generate calls are counted like any other refusal.
    let page = reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.lines()
            .any(|l| l.starts_with("router_requests_total") && l.contains("UNAUTHENTICATED")),
        "{page}"
    );

    // An unreadable file keeps the last good keys.
    std::fs::remove_file(&key_file).unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    grpc_model_info(&mut client, Some(FILE_KEY_NEW))
        .await
        .unwrap();
    let log = router.log_text();
    assert!(log.contains("keeping the last good API keys"), "{log}");
    assert!(log.contains("API key file changed"), "{log}");
    for key in [ENV_KEY, FILE_KEY_OLD, FILE_KEY_NEW, WRONG_KEY] {
        assert!(!log.contains(key), "the router log shows a key: {log}");
    }
}
