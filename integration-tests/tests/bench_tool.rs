//! The `bench` load tool against a real worker and router on the tiny model: its JSON report
//! (counts, token totals, ordered percentiles, per-request records) and its refusal of settings
//! that do not fit the model's 256-token context.

use std::path::Path;
use std::time::Duration;

use integration_tests::{run_to_exit, tiny_model, Cluster};
use serde_json::Value;

/// Runs `bench` with `args` plus `--json` into a temporary folder; returns (success, output, JSON).
async fn bench(router: &str, args: &[&str]) -> (bool, String, Option<Value>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let json = dir.path().join("bench.json");
    let json_arg = json.to_str().expect("utf-8 temp path");
    let mut all = vec!["--router", router, "--json", json_arg];
    all.extend_from_slice(args);
    let (ok, text) = run_to_exit("bench", &all, Duration::from_secs(180)).await;
    (ok, text, read_json(&json))
}

fn read_json(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(serde_json::from_str(&text).expect("bench writes valid JSON"))
}

/// Asserts that a latency distribution has its percentiles and that they are ordered.
fn assert_ordered(summary: &Value, name: &str, count: u64) {
    let d = &summary[name];
    assert_eq!(d["count"], count, "{name}: {d}");
    let get = |k: &str| {
        d[k].as_f64()
            .unwrap_or_else(|| panic!("{name}.{k} missing: {d}"))
    };
    let (min, p50, p90, p95, p99, max) = (
        get("min"),
        get("p50"),
        get("p90"),
        get("p95"),
        get("p99"),
        get("max"),
    );
    assert!(min >= 0.0, "{name}: {d}");
    assert!(
        min <= p50 && p50 <= p90 && p90 <= p95 && p95 <= p99 && p99 <= max,
        "{name} not ordered: {d}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_reports_every_request_in_json() {
    let (_dir, model) = tiny_model(3);
    let cluster = Cluster::start(&model).await;
    let (requests, new_tokens, prompt_tokens) = (6u64, 8u64, 24u64);
    let (ok, text, report) = bench(
        &cluster.router_addr,
        &[
            "--requests",
            "6",
            "--concurrency",
            "3",
            "--prompt-tokens",
            "24",
            "--max-new-tokens",
            "8",
            "--warmup",
            "2",
            "--seed",
            "7",
            "--label",
            "integration test",
        ],
    )
    .await;
    assert!(ok, "bench failed:\n{text}");
    assert!(text.contains("request throughput:"), "{text}");
    assert!(text.contains("errors:              none"), "{text}");
    let report = report.expect("the JSON report");
    assert_eq!(report["schema"], "smollm-serve.bench.v1");
    assert_eq!(report["label"], "integration test");
    assert_eq!(report["config"]["requests"], 6);
    assert_eq!(report["config"]["effective_concurrency"], 3);
    assert_eq!(report["config"]["ignore_eos"], true);
    assert_eq!(report["max_context_tokens"], 256);

    let s = &report["summary"];
    assert_eq!(s["requests"], requests, "{s}");
    assert_eq!(s["succeeded"], requests, "{s}");
    assert_eq!(s["failed"], 0, "{s}");
    assert_eq!(s["errors"], serde_json::json!({}), "{s}");
    assert_eq!(s["generated_tokens"], requests * new_tokens, "{s}");
    assert_eq!(s["prompt_tokens"], requests * prompt_tokens, "{s}");
    assert_eq!(s["finish_reasons"]["MAX_NEW_TOKENS"], requests, "{s}");
    for key in [
        "duration_s",
        "requests_per_s",
        "generated_tokens_per_s",
        "prompt_tokens_per_s",
    ] {
        assert!(s[key].as_f64().unwrap() > 0.0, "{key}: {s}");
    }
    assert_ordered(s, "ttft_ms", requests);
    assert_ordered(s, "e2e_ms", requests);
    assert_ordered(s, "tpot_ms", requests);
    // ITL: max_new_tokens - 1 gaps per request.
    assert_ordered(s, "itl_ms", requests * (new_tokens - 1));

    let records = report["requests"].as_array().expect("requests array");
    assert_eq!(records.len() as u64, requests);
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r["index"], i as u64, "{r}");
        assert!(r["error"].is_null(), "{r}");
        assert_eq!(r["prompt_tokens"], prompt_tokens, "{r}");
        assert_eq!(r["server_prompt_tokens"], prompt_tokens, "{r}");
        assert_eq!(r["generated_tokens"], new_tokens, "{r}");
        assert_eq!(r["streamed_tokens"], new_tokens, "{r}");
        let (ttft, e2e) = (
            r["ttft_ms"].as_f64().unwrap(),
            r["e2e_ms"].as_f64().unwrap(),
        );
        assert!(0.0 < ttft && ttft <= e2e, "{r}");
    }
    // Distinct sampling seeds per request.
    let seeds: std::collections::HashSet<u64> = records
        .iter()
        .map(|r| r["seed"].as_u64().unwrap())
        .collect();
    assert_eq!(seeds.len(), records.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_draws_lengths_shares_a_prefix_and_paces_arrivals() {
    let (_dir, model) = tiny_model(4);
    let cluster = Cluster::start(&model).await;
    let (ok, text, report) = bench(
        &cluster.router_addr,
        &[
            "--requests",
            "8",
            "--request-rate",
            "50",
            "--concurrency",
            "4",
            "--prompt-tokens",
            "40",
            "--prompt-tokens-max",
            "90",
            "--shared-prefix-tokens",
            "30",
            "--max-new-tokens",
            "4",
            "--max-new-tokens-max",
            "12",
            "--temperature",
            "0.8",
            "--top-p",
            "0.9",
        ],
    )
    .await;
    assert!(ok, "bench failed:\n{text}");
    let report = report.expect("the JSON report");
    let s = &report["summary"];
    assert_eq!(s["succeeded"], 8, "{s}");
    let records = report["requests"].as_array().unwrap();
    let mut generated = 0;
    let mut sent_at = Vec::new();
    for r in records {
        let p = r["prompt_tokens"].as_u64().unwrap();
        let m = r["max_new_tokens"].as_u64().unwrap();
        assert!((40..=90).contains(&p), "{r}");
        assert!((4..=12).contains(&m), "{r}");
        assert_eq!(r["server_prompt_tokens"], p, "{r}");
        assert_eq!(r["generated_tokens"], m, "{r}");
        generated += m;
        sent_at.push(r["sent_at_ms"].as_f64().unwrap());
    }
    assert_eq!(s["generated_tokens"], generated, "{s}");
    // Open loop: sent in index order, not all at once.
    assert!(sent_at.windows(2).all(|w| w[0] <= w[1]), "{sent_at:?}");
    assert!(sent_at[7] > sent_at[0], "{sent_at:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_refuses_settings_beyond_the_context() {
    let (_dir, model) = tiny_model(5);
    let cluster = Cluster::start(&model).await;
    let (ok, text, report) = bench(
        &cluster.router_addr,
        &[
            "--requests",
            "2",
            "--prompt-tokens",
            "200",
            "--max-new-tokens",
            "100",
        ],
    )
    .await;
    assert!(!ok, "{text}");
    assert!(
        text.contains("exceed the model's context of 256 tokens"),
        "{text}"
    );
    assert!(report.is_none());
}

/// `--worker`: the same load straight to the worker's `Generate` stream, no router involved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_drives_a_worker_directly() {
    let (_dir, model) = tiny_model(6);
    let cluster = Cluster::start(&model).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let json = dir.path().join("bench.json");
    let (requests, new_tokens, prompt_tokens) = (5u64, 6u64, 20u64);
    let (ok, text) = run_to_exit(
        "bench",
        &[
            "--worker",
            &cluster.worker_addr,
            "--json",
            json.to_str().expect("utf-8 temp path"),
            "--requests",
            "5",
            "--concurrency",
            "3",
            "--prompt-tokens",
            "20",
            "--max-new-tokens",
            "6",
            "--warmup",
            "1",
            "--temperature",
            "0.7",
            "--seed",
            "3",
        ],
        Duration::from_secs(180),
    )
    .await;
    assert!(ok, "bench --worker failed:\n{text}");
    assert!(text.contains("errors:              none"), "{text}");
    let report = read_json(&json).expect("the JSON report");
    assert_eq!(report["config"]["mode"], "worker");
    assert_eq!(report["config"]["worker"], cluster.worker_addr.as_str());
    assert_eq!(report["config"]["connections"], 1);
    assert_eq!(report["max_context_tokens"], 256);
    let s = &report["summary"];
    assert_eq!(s["requests"], requests, "{s}");
    assert_eq!(s["succeeded"], requests, "{s}");
    assert_eq!(s["failed"], 0, "{s}");
    assert_eq!(s["errors"], serde_json::json!({}), "{s}");
    assert_eq!(s["generated_tokens"], requests * new_tokens, "{s}");
    assert_eq!(s["prompt_tokens"], requests * prompt_tokens, "{s}");
    assert_eq!(s["finish_reasons"]["MAX_NEW_TOKENS"], requests, "{s}");
    assert_ordered(s, "ttft_ms", requests);
    assert_ordered(s, "e2e_ms", requests);
    assert_ordered(s, "itl_ms", requests * (new_tokens - 1));
    let records = report["requests"].as_array().expect("requests array");
    assert_eq!(records.len() as u64, requests);
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r["index"], i as u64, "{r}");
        assert!(r["error"].is_null(), "{r}");
        assert_eq!(r["prompt_tokens"], prompt_tokens, "{r}");
        assert_eq!(r["streamed_tokens"], new_tokens, "{r}");
        let (ttft, e2e) = (
            r["ttft_ms"].as_f64().unwrap(),
            r["e2e_ms"].as_f64().unwrap(),
        );
        assert!(0.0 < ttft && ttft <= e2e, "{r}");
    }

    // The same settings through the router: same prompt lengths and seeds, so the same requests.
    let (ok, text, via_router) = bench(
        &cluster.router_addr,
        &[
            "--requests",
            "5",
            "--concurrency",
            "3",
            "--prompt-tokens",
            "20",
            "--max-new-tokens",
            "6",
            "--warmup",
            "1",
            "--temperature",
            "0.7",
            "--seed",
            "3",
        ],
    )
    .await;
    assert!(ok, "bench --router failed:\n{text}");
    let via_router = via_router.expect("the JSON report");
    assert_eq!(via_router["config"]["mode"], "router");
    let seeds = |r: &Value| -> Vec<u64> {
        r["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["seed"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(seeds(&report), seeds(&via_router));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_drives_an_openai_server() {
    let (_dir, model) = tiny_model(4);
    let h =
        integration_tests::openai::start(&model, &[], &["--served-model-name", "tiny"], &[]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let json = dir.path().join("bench.json");
    let args = [
        "--openai",
        &format!("{}/v1", h.base),
        "--json",
        json.to_str().unwrap(),
        "--requests",
        "5",
        "--concurrency",
        "2",
        "--prompt-tokens",
        "20",
        "--max-new-tokens",
        "6",
        "--temperature",
        "0.7",
    ];
    let (ok, text) = run_to_exit("bench", &args, Duration::from_secs(180)).await;
    assert!(ok, "bench failed:\n{text}");
    assert!(text.contains("errors:              none"), "{text}");
    let report = read_json(&json).expect("the JSON report");
    assert_eq!(report["config"]["mode"], "openai");
    assert_eq!(report["model"], "tiny");
    let s = &report["summary"];
    assert_eq!(s["succeeded"], 5, "{s}");
    assert_eq!(s["generated_tokens"], 30, "{s}");
    assert_eq!(s["prompt_tokens"], 100, "{s}");
    assert_eq!(s["finish_reasons"]["length"], 5, "{s}");
    assert_ordered(s, "ttft_ms", 5);
    for r in report["requests"].as_array().unwrap() {
        assert_eq!(r["prompt_tokens"], 20, "{r}");
        assert!(r["error"].is_null(), "{r}");
    }
}
