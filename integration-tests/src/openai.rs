//! Helpers for the OpenAI HTTP front's tests: a worker and a router with `--http-listen`, JSON
//! requests, and server-sent-event streams read as their JSON chunks.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{connect_ready, free_port, start_router_with_env, start_worker_with, Cluster};

/// A worker and a router serving the OpenAI HTTP API too.
pub struct HttpCluster {
    /// The processes and the gRPC address.
    pub cluster: Cluster,
    /// The HTTP API's base URL, `http://127.0.0.1:PORT`.
    pub base: String,
}

/// Starts a worker on `model` (with `worker_args`) and a router over it with the HTTP API on a
/// free port (plus `router_args` and `env`), and waits until both fronts are ready.
pub async fn start(
    model: &Path,
    worker_args: &[&str],
    router_args: &[&str],
    env: &[(&str, &str)],
) -> HttpCluster {
    let (worker, worker_addr) = start_worker_with(model, worker_args).await;
    let http = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--http-listen", http.as_str()];
    args.extend_from_slice(router_args);
    let (router, router_addr) = start_router_with_env(&[&worker_addr], &args, env).await;
    connect_ready(&router_addr, Duration::from_secs(30)).await;
    let base = format!("http://{http}");
    wait_healthy(&base, Duration::from_secs(10)).await;
    HttpCluster {
        cluster: Cluster {
            worker,
            worker_addr,
            router,
            router_addr,
            metrics: None,
        },
        base,
    }
}

/// The Python of the official `openai` SDK's virtual environment; panics with the fix when it is not
/// installed.
pub fn sdk_python() -> std::path::PathBuf {
    let path = std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../.cache/openai-venv/bin/python"
    ));
    assert!(
        path.is_file(),
        "the openai SDK is missing at {}: run scripts/install-openai-sdk (scripts/test does)",
        path.display()
    );
    path
}

/// Runs the SDK test script `integration-tests/python/{script}` (a `unittest` file) with the SDK's
/// Python ([`sdk_python`]), `OPENAI_BASE` = `base` and the extra environment `env`, and returns its
/// report (stderr: unittest writes there). Panics with the report and `router_log()` (the router's
/// log, read only then) when the script fails.
pub async fn run_sdk_test(
    script: &str,
    base: &str,
    env: &[(&str, &std::ffi::OsStr)],
    router_log: impl FnOnce() -> String,
) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join(script);
    let output = tokio::process::Command::new(sdk_python())
        .arg(&path)
        .env("OPENAI_BASE", base)
        .envs(env.iter().copied())
        .output()
        .await
        .expect("running the Python test");
    let report = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "{script} failed:\n{report}\nrouter log:\n{}",
        router_log()
    );
    report
}

/// Waits until `GET {base}/health` answers 200.
pub async fn wait_healthy(base: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let client = reqwest::Client::new();
    loop {
        if let Ok(r) = client.get(format!("{base}/health")).send().await {
            if r.status() == 200 {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{base}/health not 200 after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `POST {url}` with a JSON body; returns the status and the JSON answer.
pub async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let response = client.post(url).json(body).send().await.expect("POST");
    let status = response.status().as_u16();
    let text = response.text().await.expect("response body");
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the answer to POST {url} is not JSON ({e}): {text}"));
    (status, value)
}

/// `GET {url}`; returns the status and the JSON answer.
pub async fn get(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let response = client.get(url).send().await.expect("GET");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON answer"))
}

/// Reads a whole event stream: the JSON of every `data:` event before `data: [DONE]`. Panics when
/// the stream is not `text/event-stream`, an event is not `data: ...`, or `[DONE]` is missing or
/// not last.
pub async fn events(response: reqwest::Response) -> Vec<Value> {
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert_eq!(content_type, "text/event-stream");
    let text = response.text().await.expect("event stream");
    let blocks: Vec<&str> = text.split("\n\n").filter(|b| !b.is_empty()).collect();
    let (last, rest) = blocks.split_last().expect("at least one event");
    assert_eq!(*last, "data: [DONE]", "the stream ends with [DONE]: {text}");
    rest.iter()
        .map(|block| {
            let data = block
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {block:?}"));
            serde_json::from_str(data).unwrap_or_else(|e| panic!("event {data:?}: {e}"))
        })
        .collect()
}

/// A choice's text, joined from stream chunks (chat `delta.content` or completions `text`), and
/// its finish reasons (exactly one is expected).
pub fn joined(chunks: &[Value], index: u64) -> (String, Vec<String>) {
    let mut text = String::new();
    let mut reasons = Vec::new();
    for chunk in chunks {
        for choice in chunk["choices"].as_array().into_iter().flatten() {
            if choice["index"] != index {
                continue;
            }
            let piece = choice["delta"]["content"]
                .as_str()
                .or_else(|| choice["text"].as_str())
                .unwrap_or_default();
            text.push_str(piece);
            if let Some(reason) = choice["finish_reason"].as_str() {
                reasons.push(reason.to_string());
            }
        }
    }
    (text, reasons)
}
