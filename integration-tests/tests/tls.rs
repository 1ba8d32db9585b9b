//! TLS (issue 14, "Who may call") against real router and worker processes on the tiny
//! random-weight model, with CAs and certificates made at run time (no key is committed):
//! - the public ports: a gRPC client trusting the test CA generates over TLS, a plain-text client
//!   is refused, the HTTP front answers over HTTPS only, API keys are still enforced on both, the
//!   plain `health_listen` port answers gRPC health; replacing the certificate files with ones of a
//!   new CA takes effect for new connections without a restart;
//! - router to worker: with `worker_tls_ca` a generation works end to end over a TLS worker port;
//!   a router trusting another CA does not route to that worker, and `/health` says why; once its
//!   CA file is rotated to the worker's CA it connects and serves, without a restart.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inference_proto::public::text_generation_client::TextGenerationClient;
use inference_proto::public::ModelInfoRequest;
use integration_tests::ops::wait_health;
use integration_tests::{free_port, greedy, start_router_with_env, start_worker_with, tiny_model};
use serde_json::Value;
use tls_certs::test_ca::TestCa;
use tls_certs::ClientTls;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

const KEY: &str = "tls-test-key-61d0";
/// The names on every server certificate of these tests.
const NAMES: [&str; 2] = ["localhost", "127.0.0.1"];

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A gRPC channel to `addr` over TLS trusting only `ca` (verifying `localhost`).
async fn tls_channel(addr: &str, ca: &Path) -> Result<Channel, tonic::transport::Error> {
    let tls = ClientTls::load(path(ca), "localhost")
        .unwrap()
        .expect("a CA");
    Channel::from_shared(ClientTls::uri(Some(&tls), addr))
        .unwrap()
        .tls_config(tls.tonic_config())?
        .connect()
        .await
}

/// `ModelInfo` over TLS trusting `ca` with the test key: why it failed (connection or call).
async fn refused_with(addr: &str, ca: &Path) -> String {
    match tls_channel(addr, ca).await {
        Ok(channel) => format!("{:?}", model_info(channel, Some(KEY)).await.unwrap_err()),
        Err(e) => format!("{e:?}"),
    }
}

/// `ModelInfo` with `authorization: Bearer key` (none when `None`): the ready workers.
async fn model_info(channel: Channel, key: Option<&str>) -> Result<u32, tonic::Status> {
    let mut request = tonic::Request::new(ModelInfoRequest::default());
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    let info = TextGenerationClient::new(channel)
        .model_info(request)
        .await?;
    Ok(info.into_inner().ready_workers)
}

/// A greedy 4-token `Generate` with the test key: the text.
async fn generate(channel: Channel) -> Result<String, tonic::Status> {
    let mut request = tonic::Request::new(greedy("Hello", 4));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    let mut client = TextGenerationClient::new(channel);
    let mut stream = client.generate(request).await?.into_inner();
    let mut text = String::new();
    while let Some(m) = stream.message().await? {
        text.push_str(&m.text);
    }
    Ok(text)
}

/// Waits until the router at `addr` (TLS, trusting `ca`) reports a ready worker.
async fn wait_ready_tls(addr: &str, ca: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(channel) = tls_channel(addr, ca).await {
            if model_info(channel, Some(KEY)).await.unwrap_or(0) > 0 {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{addr} not ready over TLS");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An HTTPS client trusting only `ca`.
fn https_client(ca: &Path) -> reqwest::Client {
    let pem = std::fs::read(ca).unwrap();
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap()
}

/// `POST /v1/completions` on `base` with `client` and the test key (or none).
async fn completion(
    client: &reqwest::Client,
    base: &str,
    key: Option<&str>,
) -> reqwest::Result<(u16, Value)> {
    let mut request = client
        .post(format!("{base}/v1/completions"))
        .json(&serde_json::json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0}));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_ports_over_tls_with_keys_and_rotation() {
    let (_model_dir, model) = tiny_model(31);
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("router test CA");
    let (ca_file, files) = ca.write(dir.path(), "router", &NAMES);
    let (_worker, worker_addr) = start_worker_with(&model, &[]).await;
    let http = format!("127.0.0.1:{}", free_port());
    let health = format!("127.0.0.1:{}", free_port());
    let (router, addr) = start_router_with_env(
        &[&worker_addr],
        &[
            "--tls-cert",
            path(&files.cert),
            "--tls-key",
            path(&files.key),
            "--http-listen",
            &http,
            "--health-listen",
            &health,
        ],
        &[("ROUTER_API_KEYS", KEY)],
    )
    .await;
    wait_ready_tls(&addr, &ca_file).await;
    // The plain health port answers without TLS (what Kubernetes' gRPC probes need).
    wait_health(&health, "", ServingStatus::Serving, Duration::from_secs(5)).await;
    wait_health(
        &health,
        "liveness",
        ServingStatus::Serving,
        Duration::from_secs(5),
    )
    .await;

    // gRPC over TLS: generates with the key; without it UNAUTHENTICATED.
    let channel = tls_channel(&addr, &ca_file).await.unwrap();
    let text = generate(channel.clone()).await.unwrap();
    assert!(!text.is_empty());
    let refused = model_info(channel, None).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    // A plain-text client gets no answer from the TLS port.
    let plain = match Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
    {
        Ok(channel) => model_info(channel, Some(KEY)).await.map(|_| ()),
        Err(e) => Err(tonic::Status::unavailable(e.to_string())),
    };
    assert!(plain.is_err(), "a plain-text client was served");
    // A client that trusts another CA refuses the router's certificate.
    let stranger = dir.path().join("stranger-ca.pem");
    std::fs::write(&stranger, TestCa::new("stranger").pem).unwrap();
    let err = refused_with(&addr, &stranger).await;
    assert!(err.contains("UnknownIssuer"), "{err}");

    // HTTP over TLS: served with the key, 401 without, nothing over plain HTTP.
    let base = format!("https://localhost:{}", http.rsplit_once(':').unwrap().1);
    let client = https_client(&ca_file);
    let (status, body) = completion(&client, &base, Some(KEY)).await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion", "{body}");
    let (status, body) = completion(&client, &base, None).await.unwrap();
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
    let health_page = client.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(health_page.status(), 200);
    let plain_http = reqwest::Client::new()
        .get(format!("http://{http}/health"))
        .send()
        .await;
    assert!(plain_http.is_err(), "plain HTTP was served: {plain_http:?}");

    // Rotation: certificate files of a new CA replace the old ones; within a few seconds new
    // connections verify with the new CA only, without a restart.
    let ca2 = TestCa::new("router test CA 2");
    let ca2_file = dir.path().join("router-ca2.pem");
    std::fs::write(&ca2_file, &ca2.pem).unwrap();
    ca2.write_server(&files, &NAMES);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rotated = match tls_channel(&addr, &ca2_file).await {
            Ok(channel) => model_info(channel, Some(KEY)).await.is_ok(),
            Err(_) => false,
        };
        if rotated {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was not served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let old = refused_with(&addr, &ca_file).await;
    assert!(old.contains("UnknownIssuer"), "{old}");
    assert!(!generate(tls_channel(&addr, &ca2_file).await.unwrap())
        .await
        .unwrap()
        .is_empty());
    // The command-line client over TLS (the rotated certificate, the key from the environment).
    let (ok, output) = integration_tests::run_to_exit(
        "client",
        &[
            "--router",
            &addr,
            "--tls-ca",
            path(&ca2_file),
            "--tls-server-name",
            "localhost",
            "--api-key",
            KEY,
            "--max-new-tokens",
            "3",
            "Hello",
        ],
        Duration::from_secs(30),
    )
    .await;
    assert!(ok && output.contains("generated_tokens=3"), "{output}");
    // The load tool over TLS too.
    let (ok, output) = integration_tests::run_to_exit(
        "bench",
        &[
            "--router",
            &addr,
            "--tls-ca",
            path(&ca2_file),
            "--tls-server-name",
            "localhost",
            "--api-key",
            KEY,
            "--requests",
            "2",
            "--concurrency",
            "2",
            "--prompt-tokens",
            "8",
            "--max-new-tokens",
            "3",
            "--warmup",
            "0",
        ],
        Duration::from_secs(60),
    )
    .await;
    assert!(
        ok && output.contains("errors:              none"),
        "{output}"
    );
    let client2 = https_client(&ca2_file);
    let (status, body) = completion(&client2, &base, Some(KEY)).await.unwrap();
    assert_eq!(status, 200, "{body}");
    // Open connections keep going; a new one with the old CA fails.
    assert_eq!(completion(&client, &base, Some(KEY)).await.unwrap().0, 200);
    let err = completion(&https_client(&ca_file), &base, Some(KEY))
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("UnknownIssuer"), "{err:?}");
    // A broken file keeps the last good certificate.
    std::fs::write(&files.cert, "not a certificate\n").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        model_info(tls_channel(&addr, &ca2_file).await.unwrap(), Some(KEY))
            .await
            .is_ok()
    );
    let log = router.log_text();
    assert!(log.contains("TLS certificate files changed"), "{log}");
    assert!(
        log.contains("keeping the last good TLS certificate"),
        "{log}"
    );
}

/// Starts a router over `worker` with worker TLS trusting `ca` (and an HTTP front, plain); returns
/// the router and its HTTP base URL.
async fn router_trusting(worker: &str, ca: &Path) -> (integration_tests::Process, String) {
    let http = format!("127.0.0.1:{}", free_port());
    let (router, _) = start_router_with_env(
        &[worker],
        &["--worker-tls-ca", path(ca), "--http-listen", &http],
        &[],
    )
    .await;
    (router, format!("http://{http}"))
}

/// `GET {base}/health`: status and body.
async fn http_health(base: &str) -> (u16, Value) {
    let response = reqwest::get(format!("{base}/health")).await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_to_worker_tls() {
    let (_model_dir, model) = tiny_model(32);
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("worker test CA");
    let (ca_file, files) = ca.write(dir.path(), "worker", &NAMES);
    let (_worker, worker_addr) = start_worker_with(
        &model,
        &[
            "--tls-cert",
            path(&files.cert),
            "--tls-key",
            path(&files.key),
        ],
    )
    .await;

    // Trusting the worker's CA: ready, and a generation works end to end.
    let (_good, good_base) = router_trusting(&worker_addr, &ca_file).await;
    integration_tests::openai::wait_healthy(&good_base, Duration::from_secs(30)).await;
    let (status, body) = completion(&reqwest::Client::new(), &good_base, None)
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 4, "{body}");

    // Trusting another CA: the worker's certificate does not verify; the router never routes to
    // it, and its /health says why.
    let other: PathBuf = dir.path().join("other-ca.pem");
    std::fs::write(&other, TestCa::new("another CA").pem).unwrap();
    let (bad, bad_base) = router_trusting(&worker_addr, &other).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let body = loop {
        let (status, body) = http_health(&bad_base).await;
        assert_eq!(status, 503, "{body}");
        if body["workers"][0]["error"].is_string() {
            break body;
        }
        assert!(Instant::now() < deadline, "no error reported: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(body["status"], "no_ready_worker", "{body}");
    assert_eq!(
        body["workers"][0]["address"],
        worker_addr.as_str(),
        "{body}"
    );
    assert_eq!(body["workers"][0]["ready"], false, "{body}");
    let error = body["workers"][0]["error"].as_str().unwrap();
    assert!(error.contains("UnknownIssuer"), "{error}");
    let (status, body) = completion(&reqwest::Client::new(), &bad_base, None)
        .await
        .unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(bad.log_text().contains("UnknownIssuer"));

    // The CA file rotated to the worker's CA: the same router, without a restart, connects at its
    // next attempt and serves.
    std::fs::write(&other, &ca.pem).unwrap();
    integration_tests::openai::wait_healthy(&bad_base, Duration::from_secs(30)).await;
    let (status, body) = completion(&reqwest::Client::new(), &bad_base, None)
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 4, "{body}");

    // A router dialling the TLS worker in plain text gets no worker either.
    let (_plain, plain_addr) = start_router_with_env(&[&worker_addr], &[], &[]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let channel = integration_tests::ops::channel(&plain_addr).await;
    let status = model_info(channel, None).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_settings_stop_the_start_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let (_, files) = TestCa::new("ca").write(dir.path(), "server", &NAMES);
    let exit = |bin: &'static str, args: Vec<String>| async move {
        let output = tokio::process::Command::new(integration_tests::bin_path(bin))
            .args(&args)
            .output()
            .await
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let cert = path(&files.cert).to_string();
    let (code, stderr) = exit(
        "router",
        vec![
            "--workers".into(),
            "127.0.0.1:1".into(),
            "--tls-cert".into(),
            cert.clone(),
        ],
    )
    .await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("`tls_cert` is set but `tls_key` is not"),
        "{stderr}"
    );
    let missing = dir.path().join("missing.key");
    let (code, stderr) = exit(
        "worker",
        vec![
            "--model".into(),
            "m.gguf".into(),
            "--tls-cert".into(),
            cert,
            "--tls-key".into(),
            path(&missing).into(),
        ],
    )
    .await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot read TLS key file {}", missing.display())),
        "{stderr}"
    );
}
