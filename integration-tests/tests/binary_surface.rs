//! What a new user reaches for first (issue 30's "small things"), on real binaries and processes:
//! `--version` with the git commit on every binary, each setting's default in `--help`,
//! `--api-key`, `/metrics` on the HTTP port with `process_*`, `build_info` and counted HTTP
//! refusals, `/v1/models` with `max_model_len` and `chat_template_origin`, and the router's ready
//! line saying how many workers are ready.

use std::time::Duration;

use integration_tests::openai::{get, post, wait_healthy};
use integration_tests::ops::{metric, parse_metrics, scrape};
use integration_tests::{free_port, run_to_exit, start_worker, tiny_model};
use serde_json::json;

#[tokio::test]
async fn every_binary_prints_its_version_with_the_commit() {
    for bin in ["router", "worker", "serve", "client", "bench"] {
        let (ok, text) = run_to_exit(bin, &["--version"], Duration::from_secs(30)).await;
        assert!(ok, "{bin} --version: {text}");
        let line = text.trim();
        let rest = line
            .strip_prefix(&format!("{bin} 0.1.0 (commit "))
            .unwrap_or_else(|| panic!("{bin} --version printed {line:?}"));
        let commit = rest.strip_suffix(')').expect("closing parenthesis");
        assert!(
            commit == "unknown"
                || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
            "{bin}: commit {commit:?}"
        );
    }
}

#[tokio::test]
async fn help_shows_the_defaults_of_settings() {
    let (ok, router) = run_to_exit("router", &["--help"], Duration::from_secs(30)).await;
    assert!(ok, "{router}");
    assert!(router.contains("[default: 127.0.0.1:50051]"), "{router}");
    assert!(router.contains("[default: kv_aware]"), "{router}");
    assert!(router.contains("--api-key <API_KEY>"), "{router}");
    let (ok, worker) = run_to_exit("worker", &["--help"], Duration::from_secs(30)).await;
    assert!(ok, "{worker}");
    assert!(
        worker.contains("fast (the default on the CPU"),
        "numerics default in {worker}"
    );
}

/// `worker --check-config` names the numeric modes that run: `numerics` (CPU) and
/// `cuda_numerics` (CUDA), beside the `device` that picks between them; unset, `numerics` is
/// `fast`, and `exact` when asked for.
#[tokio::test]
async fn check_config_names_the_numerics() {
    for (flags, shown) in [(&[][..], "fast"), (&["--numerics", "exact"][..], "exact")] {
        let mut args = vec!["--model", "m.gguf", "--check-config"];
        args.extend_from_slice(flags);
        // `run_to_exit` sets no `WORKER_NUMERICS` (unlike `Process::start` for a worker).
        let (ok, out) = run_to_exit("worker", &args, Duration::from_secs(30)).await;
        assert!(ok, "{out}");
        let line = format!(r#""numerics": "{shown}""#);
        assert!(out.contains(&line), "{line} in {out}");
    }
    let args = ["--model", "m.gguf", "--numerics", "fast", "--check-config"];
    let (ok, out) = run_to_exit("worker", &args, Duration::from_secs(30)).await;
    assert!(ok, "{out}");
    for line in [
        r#""numerics": "fast""#,
        r#""cuda_numerics": "exact""#,
        r#""device": "#,
    ] {
        assert!(out.contains(line), "{line} in {out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_port_serves_metrics_and_counts_refusals() {
    let (_dir, model) = tiny_model(30);
    let (_worker, worker_addr) = start_worker(&model).await;
    let http_addr = format!("127.0.0.1:{}", free_port());
    let (_router, _) = integration_tests::start_router(
        &[&worker_addr],
        &["--http-listen", &http_addr, "--api-key", "sk-one,sk-two"],
    )
    .await;
    let base = &format!("http://{http_addr}");
    wait_healthy(base, Duration::from_secs(30)).await;
    let http = reqwest::Client::new();
    // 401 without a key, 400 with a bad body, 404 for an unknown model, 200 for a good one.
    let (status, _) = post(
        &http,
        &format!("{base}/v1/completions"),
        &json!({"prompt": "a"}),
    )
    .await;
    assert_eq!(status, 401);
    let authed = |path: &str, body: serde_json::Value| {
        http.post(format!("{base}{path}"))
            .bearer_auth("sk-two")
            .json(&body)
            .send()
    };
    let r = authed("/v1/completions", json!({"prompt": 5}))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let r = authed("/v1/completions", json!({"model": "nope", "prompt": "a"}))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let r = authed("/v1/completions", json!({"prompt": "a", "max_tokens": 2}))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
    let models: serde_json::Value = http
        .get(format!("{base}/v1/models"))
        .bearer_auth("sk-one")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entry = &models["data"][0];
    assert!(
        entry["max_model_len"].as_u64().is_some_and(|n| n > 0),
        "{models}"
    );
    assert!(entry["chat_template_origin"].is_string(), "{models}");

    // /metrics is open on the HTTP port, as /health is.
    let text = http
        .get(format!("{base}/metrics"))
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let samples = parse_metrics(&text);
    let route = |status: u16| {
        format!(r#"router_http_requests_total{{route="/v1/completions",status="{status}"}}"#)
    };
    for status in [401, 400, 404, 200] {
        assert_eq!(metric(&samples, &route(status)), 1.0, "{status} in {text}");
    }
    let build = samples
        .keys()
        .find(|k| k.starts_with(r#"build_info{component="router",version="0.1.0",commit=""#))
        .unwrap_or_else(|| panic!("no build_info in {text}"));
    assert_eq!(samples[build], 1.0);
    if cfg!(target_os = "linux") {
        assert!(
            metric(&samples, "process_resident_memory_bytes") > 1e6,
            "{text}"
        );
        assert!(metric(&samples, "process_open_fds") >= 3.0, "{text}");
        assert!(metric(&samples, "process_threads") >= 1.0, "{text}");
        assert!(
            metric(&samples, "process_start_time_seconds") > 1.6e9,
            "{text}"
        );
    }
    // Unknown routes are not API routes: answered 404 and not counted by route.
    let (status, _) = get(&http, &format!("{base}/v2/nothing")).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_metrics_carry_build_info_and_process_metrics() {
    let (_dir, model) = tiny_model(31);
    let metrics = format!("127.0.0.1:{}", free_port());
    let (_worker, _addr) =
        integration_tests::start_worker_with(&model, &["--metrics-listen", &metrics]).await;
    let samples = parse_metrics(&scrape(&metrics).await);
    assert!(
        samples
            .keys()
            .any(|k| k.starts_with(r#"build_info{component="worker",version="0.1.0",commit=""#)),
        "{samples:?}"
    );
    if cfg!(target_os = "linux") {
        assert!(metric(&samples, "process_cpu_seconds_total") >= 0.0);
        assert!(metric(&samples, "process_resident_memory_bytes") > 1e6);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_ready_line_counts_ready_workers() {
    use tokio::io::AsyncBufReadExt as _;
    let (_dir, model) = tiny_model(32);
    let (_worker, worker_addr) = start_worker(&model).await;
    let listen = format!("127.0.0.1:{}", free_port());
    let mut router = tokio::process::Command::new(integration_tests::bin_path("router"))
        .args(["--listen", &listen, "--workers", &worker_addr])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("router starts");
    let mut lines = tokio::io::BufReader::new(router.stdout.take().unwrap()).lines();
    let read = async {
        let ready = lines.next_line().await.unwrap().expect("a ready line");
        assert!(ready.starts_with("router ready:"), "{ready}");
        if ready.contains("1 of 1 workers ready") {
            return;
        }
        assert!(ready.contains("no worker ready yet, 1 known"), "{ready}");
        let next = lines.next_line().await.unwrap().expect("a count line");
        assert_eq!(next, "router workers: 1 of 1 workers ready");
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("the worker became ready within 30 s");
}
