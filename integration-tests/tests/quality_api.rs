//! `bench quality --api URL --candidate-api URL` (issue 29) against real worker and router
//! processes on the tiny model: through the HTTP API the perplexities and the top-1 agreement of
//! an `exact` and a `fast` worker are those `bench quality` computes in-process for the same
//! windows; the same server on both sides agrees everywhere with equal perplexities; a model of
//! another seed does not agree everywhere.

use std::path::Path;
use std::time::Duration;

use integration_tests::openai::start;
use integration_tests::{run_to_exit, tiny_model};
use serde_json::Value;

/// The text: the start of the fixture (a few windows of the tiny model's tokens).
fn text(dir: &Path) -> String {
    let full = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/pride-and-prejudice-ch1-12.txt"
    ))
    .expect("the fixture text");
    let cut: String = full.chars().take(3000).collect();
    let path = dir.join("text.txt");
    std::fs::write(&path, cut).expect("writing the text");
    path.to_str().expect("utf-8 temp path").to_string()
}

/// Runs `bench quality` with `args` and the shared windows, returns its JSON report.
async fn quality(dir: &Path, name: &str, text: &str, args: &[&str]) -> Value {
    let json = dir.join(format!("{name}.json"));
    let json = json.to_str().expect("utf-8 temp path");
    let mut all = vec![
        "quality",
        "--text",
        text,
        "--window",
        "64",
        "--max-windows",
        "3",
        "--json",
        json,
    ];
    all.extend_from_slice(args);
    let (ok, out) = run_to_exit("bench", &all, Duration::from_secs(60)).await;
    assert!(ok, "bench quality {args:?} failed:\n{out}");
    serde_json::from_str(&std::fs::read_to_string(json).expect("the JSON report"))
        .expect("bench writes valid JSON")
}

fn f(report: &Value, key: &str) -> f64 {
    report[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing: {report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_figures_match_in_process_and_tell_models_apart() {
    let (_dir, model) = tiny_model(7);
    let (_other_dir, other) = tiny_model(8);
    let dir = tempfile::tempdir().expect("temp dir");
    let text = text(dir.path());
    let exact = start(&model, &["--numerics", "exact"], &[], &[]).await;
    let fast = start(&model, &["--numerics", "fast"], &[], &[]).await;
    let seed8 = start(&other, &[], &[], &[]).await;

    // exact against fast through the API and in-process: the same windows, the same figures.
    let api = quality(
        dir.path(),
        "api",
        &text,
        &["--api", &exact.base, "--candidate-api", &fast.base],
    )
    .await;
    let model_arg = model.to_str().expect("utf-8 temp path");
    let local = quality(
        dir.path(),
        "local",
        &text,
        &["--model", model_arg, "--threads", "1"],
    )
    .await;
    assert_eq!(api["top1_by_id"], true, "{api}");
    assert_eq!(api["kl_mean"], Value::Null, "{api}");
    for key in ["text_tokens", "windows", "scored", "top1_agree"] {
        assert_eq!(api[key], local[key], "{key}: API {api}\nin-process {local}");
    }
    // 3 windows of 64 tokens (no BOS for this tokenizer), each scored from its second token.
    assert_eq!(api["scored"], 3 * 63, "{api}");
    // The worker reports f32 log-probabilities; in-process sums f64 from the same f32 logits.
    for key in ["mean_nll_baseline", "mean_nll_candidate"] {
        let (a, l) = (f(&api, key), f(&local, key));
        assert!((a - l).abs() < 1e-5, "{key}: API {a}, in-process {l}");
    }

    // The same server on both sides: equal perplexities, agreement everywhere.
    let same = quality(
        dir.path(),
        "same",
        &text,
        &["--api", &exact.base, "--candidate-api", &exact.base],
    )
    .await;
    assert_eq!(same["perplexity_baseline"], same["perplexity_candidate"]);
    assert_eq!(same["perplexity_baseline"], api["perplexity_baseline"]);
    assert_eq!(f(&same, "top1_agreement"), 1.0, "{same}");

    // Another seed's weights: other perplexity, and they disagree somewhere.
    let other = quality(
        dir.path(),
        "other",
        &text,
        &["--api", &exact.base, "--candidate-api", &seed8.base],
    )
    .await;
    assert!(f(&other, "top1_agreement") < 1.0, "{other}");
    assert_ne!(other["perplexity_candidate"], other["perplexity_baseline"]);

    // A window past the server's context stops the run.
    let (ok, out) = run_to_exit(
        "bench",
        &[
            "quality",
            "--text",
            &text,
            "--window",
            "512",
            "--api",
            &exact.base,
            "--candidate-api",
            &seed8.base,
        ],
        Duration::from_secs(60),
    )
    .await;
    assert!(!ok && out.contains("max_model_len of 256"), "{out}");
}
