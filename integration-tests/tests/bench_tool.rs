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

/// `--api-key`: sent as `authorization: Bearer KEY` to the router and as the header to the HTTP
/// front; a wrong or missing key stops the run before any request (exit status 2, the refusal
/// named), and the key never reaches the JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_sends_the_api_key_on_both_fronts() {
    const KEY: &str = "bench-key-7c41";
    let (_dir, model) = tiny_model(8);
    let (_worker, worker_addr) = integration_tests::start_worker(&model).await;
    let http = format!("127.0.0.1:{}", integration_tests::free_port());
    let (_router, router) = integration_tests::start_router_with_env(
        &[&worker_addr],
        &["--http-listen", &http],
        &[("ROUTER_API_KEYS", KEY)],
    )
    .await;
    // `/health` is open: ready once the router has its worker.
    let openai = format!("http://{http}");
    integration_tests::openai::wait_healthy(&openai, Duration::from_secs(30)).await;
    let (router, openai) = (router.as_str(), openai.as_str());
    let load = [
        "--requests",
        "3",
        "--concurrency",
        "3",
        "--prompt-tokens",
        "12",
    ];
    let load = [&load[..], &["--max-new-tokens", "4"]].concat();
    for (front, address) in [("--router", router), ("--openai", openai)] {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("bench.json");
        let mut args = vec![front, address, "--json", json.to_str().unwrap()];
        args.extend_from_slice(&load);
        let with_key = [&args[..], &["--api-key", KEY]].concat();
        let (ok, text) = run_to_exit("bench", &with_key, Duration::from_secs(120)).await;
        assert!(ok, "{front} with the key:\n{text}");
        let written = std::fs::read_to_string(&json).unwrap();
        assert!(!written.contains(KEY), "the key is in the JSON");
        let report: Value = serde_json::from_str(&written).unwrap();
        assert_eq!(report["config"]["api_key_sent"], true);
        assert_eq!(report["summary"]["succeeded"], 3, "{front}");
        std::fs::remove_file(&json).unwrap();

        let wrong = [&args[..], &["--api-key", "not-the-key"]].concat();
        for (what, args) in [("a wrong key", &wrong[..]), ("no key", &args[..])] {
            let (ok, text) = run_to_exit("bench", args, Duration::from_secs(60)).await;
            assert!(!ok, "{front} with {what}:\n{text}");
            assert!(
                text.contains("refused the API key"),
                "{front} with {what}:\n{text}"
            );
            assert!(!text.contains(KEY), "{text}");
            assert!(!json.exists(), "{front} with {what} wrote a report");
        }
    }
}

/// `--constraint` with `--constrained-fraction 0.5`: every second request carries a JSON schema,
/// the report counts them, checks each output against the schema and summarizes them apart, and
/// `--worker-metrics` reports the worker's mask time over the run. The same through `--worker`
/// (outputs decoded locally) and `--openai` (`guided_choice`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_constrains_a_fraction_of_requests_and_reports_the_mask_time() {
    let (_dir, model) = tiny_model(9);
    let metrics = format!("127.0.0.1:{}", integration_tests::free_port());
    let h =
        integration_tests::openai::start(&model, &["--metrics-listen", &metrics], &[], &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("animal.json");
    std::fs::write(&schema, integration_tests::animal_schema().to_string()).unwrap();
    let constraint = format!("json-schema:{}", schema.display());
    let (requests, new_tokens) = (8u64, 40u64);
    let (ok, text, report) = bench(
        &h.cluster.router_addr,
        &[
            "--requests",
            "8",
            "--concurrency",
            "4",
            "--prompt-tokens",
            "16",
            "--max-new-tokens",
            "40",
            "--temperature",
            "1",
            "--seed",
            "11",
            "--constraint",
            &constraint,
            "--constrained-fraction",
            "0.5",
            "--worker-metrics",
            &metrics,
        ],
    )
    .await;
    assert!(ok, "bench failed:\n{text}");
    assert!(
        text.contains("constrained outputs: 4 valid, 0 invalid"),
        "{text}"
    );
    assert!(text.contains("mask time (worker):"), "{text}");
    let report = report.expect("the JSON report");
    assert_eq!(report["config"]["effective_constrained_fraction"], 0.5);
    assert_eq!(report["config"]["constraint"]["kind"], "json_schema");
    let split = &report["constrained"];
    assert_eq!(split["valid_outputs"], 4, "{split}");
    assert_eq!(split["invalid_outputs"], 0, "{split}");
    assert_eq!(split["truncated_outputs"], 0, "{split}");
    assert_eq!(split["constrained"]["succeeded"], 4, "{split}");
    assert_eq!(split["unconstrained"]["succeeded"], 4, "{split}");
    // The unconstrained requests ignore EOS and generate their whole budget; the constrained ones
    // end with the schema, and all tokens count in the run's throughput.
    let unconstrained_tokens = split["unconstrained"]["generated_tokens"].as_u64().unwrap();
    let constrained_tokens = split["constrained"]["generated_tokens"].as_u64().unwrap();
    assert_eq!(unconstrained_tokens, 4 * new_tokens, "{split}");
    assert!((4..4 * new_tokens).contains(&constrained_tokens), "{split}");
    assert_eq!(
        report["summary"]["generated_tokens"].as_u64().unwrap(),
        unconstrained_tokens + constrained_tokens
    );
    for r in report["requests"].as_array().unwrap() {
        let i = r["index"].as_u64().unwrap();
        assert_eq!(r["constrained"], i % 2 == 1, "{r}");
        if i % 2 == 1 {
            assert_eq!(r["output_valid"], true, "{r}");
            let reason = r["finish_reason"].as_str().unwrap();
            assert!(
                ["CONSTRAINT_COMPLETE", "EOS_TOKEN"].contains(&reason),
                "{r}"
            );
        } else {
            assert!(r["output_valid"].is_null(), "{r}");
            assert_eq!(r["generated_tokens"], new_tokens, "{r}");
        }
    }
    assert_eq!(report["summary"]["requests"], requests);
    // One mask per constrained sampled token (forced tokens need none).
    let mask = &report["mask_time"];
    let masks = mask["masks"].as_u64().unwrap();
    assert!(masks >= 4 && masks <= constrained_tokens, "{mask}");
    let (p50, p99) = (
        mask["p50_us"].as_f64().unwrap(),
        mask["p99_us"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99, "{mask}");
    assert!(mask["mean_us"].as_f64().unwrap() > 0.0, "{mask}");
    assert!(
        mask["method"]
            .as_str()
            .unwrap()
            .contains("linear interpolation"),
        "{mask}"
    );

    // --worker: the same constraint on the worker's stream, outputs decoded locally and checked.
    let json = dir.path().join("worker.json");
    let (ok, text) = run_to_exit(
        "bench",
        &[
            "--worker",
            &h.cluster.worker_addr,
            "--json",
            json.to_str().unwrap(),
            "--requests",
            "4",
            "--prompt-tokens",
            "16",
            "--max-new-tokens",
            "40",
            "--temperature",
            "1",
            "--constraint",
            &constraint,
        ],
        Duration::from_secs(120),
    )
    .await;
    assert!(ok, "bench --worker failed:\n{text}");
    let report = read_json(&json).unwrap();
    assert_eq!(report["constrained"]["valid_outputs"], 4, "{report}");
    assert_eq!(report["constrained"]["unconstrained"]["requests"], 0);

    // --openai: a choice as `guided_choice`.
    let json = dir.path().join("openai.json");
    let (ok, text) = run_to_exit(
        "bench",
        &[
            "--openai",
            &h.base,
            "--json",
            json.to_str().unwrap(),
            "--requests",
            "4",
            "--prompt-tokens",
            "16",
            "--max-new-tokens",
            "8",
            "--temperature",
            "1",
            "--constraint",
            "choice:yes,no",
            "--constrained-fraction",
            "0.5",
        ],
        Duration::from_secs(120),
    )
    .await;
    assert!(ok, "bench --openai failed:\n{text}");
    let report = read_json(&json).unwrap();
    let split = &report["constrained"];
    assert_eq!(split["valid_outputs"], 2, "{split}");
    assert_eq!(split["constrained"]["finish_reasons"]["stop"], 2, "{split}");
    assert_eq!(
        split["unconstrained"]["finish_reasons"]["length"], 2,
        "{split}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_drives_a_tenant_mix_and_reports_each_tenant() {
    let (_dir, model) = tiny_model(8);
    let files = tempfile::tempdir().unwrap();
    let tenants = files.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        "[[tenant]]\nname = \"flood\"\nkeys = [\"key-flood\"]\nrequests_per_second = 2\n\
         max_priority = 0\n\
         [[tenant]]\nname = \"calm\"\nkeys = [\"key-calm\"]\nmax_priority = 5\n",
    )
    .unwrap();
    let (_worker, worker_addr) = integration_tests::start_worker(&model).await;
    let (_router, router) = integration_tests::start_router_with_env(
        &[&worker_addr],
        &["--tenants-file", tenants.to_str().unwrap()],
        &[],
    )
    .await;
    // flood: 40 req/s against its 2/s quota; calm: 4 req/s at priority 5, no limit.
    let (ok, text, json) = bench(
        &router,
        &[
            "--tenant-mix",
            "flood:key-flood:40:-1,calm:key-calm:4:5",
            "--requests",
            "44",
            "--prompt-tokens",
            "12",
            "--max-new-tokens",
            "4",
        ],
    )
    .await;
    assert!(ok, "refusals are outcomes with --tenant-mix: {text}");
    assert!(text.contains("TTFT p99 ms"), "{text}");
    let json = json.expect("the JSON report");
    let tenants = json["tenants"].as_array().expect("tenants in the JSON");
    let (flood, calm) = (&tenants[0], &tenants[1]);
    assert_eq!(flood["name"], "flood");
    let total = flood["requests"].as_u64().unwrap() + calm["requests"].as_u64().unwrap();
    assert_eq!(total, 44);
    assert!(
        calm["requests"].as_u64().unwrap() >= 1,
        "calm drew no request: {calm}"
    );
    assert_eq!(calm["refused"], 0, "{calm}");
    assert_eq!(calm["failed"], 0, "{calm}");
    assert!(flood["refused"].as_u64().unwrap() > 10, "{flood}");
    assert_eq!(flood["failed"], 0, "{flood}");
    assert!(calm["ttft_p99_ms"].as_f64().unwrap() > 0.0, "{calm}");
    // Each record names its tenant; no key is written.
    let records = json["requests"].as_array().unwrap();
    assert!(records
        .iter()
        .all(|r| r["tenant"] == "flood" || r["tenant"] == "calm"));
    assert!(!json.to_string().contains("key-flood"));
}
