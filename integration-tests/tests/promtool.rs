//! Both /metrics endpoints pass Prometheus's own linter, `promtool check metrics` (Debian package
//! `prometheus`; `scripts/install-promtool`, which `scripts/test` runs), scraped as `curl` does (the
//! Prometheus text format 0.0.4, which is what promtool reads) while requests stream and again after
//! they finished.

use std::process::Stdio;
use std::time::Duration;

use integration_tests::ops::scrape_text;
use integration_tests::{generate, greedy, tiny_model, Cluster};
use tokio::io::AsyncWriteExt as _;

/// Runs `promtool check metrics` on `text`; panics with its report on any problem it finds.
async fn promtool_check(what: &str, text: &str) {
    let mut child = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("running promtool (install it with scripts/install-promtool)");
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(text.as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("promtool finishes")
        .expect("promtool output");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && report.trim().is_empty(),
        "promtool check metrics on the {what} ({}):\n{report}\n--- scraped text ---\n{text}",
        output.status
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_metrics_endpoints_pass_promtool_under_load() {
    let (_dir, model) = tiny_model(23);
    let cluster = Cluster::start_with_metrics(&model).await;
    let (worker_metrics, router_metrics) = cluster.metrics.clone().expect("metrics on");
    let client = cluster.client().await;

    // A few finished requests (and one refused), so every family has samples.
    let mut c = client.clone();
    for n in [3, 4, 5] {
        generate(&mut c, greedy("warm up", n))
            .await
            .expect("generation");
    }
    generate(&mut c, greedy("x", 0))
        .await
        .expect_err("max_new_tokens 0 is refused");

    // Load: streams running while both endpoints are scraped and linted.
    let streams: Vec<_> = (0..4)
        .map(|i| {
            let mut c = client.clone();
            tokio::spawn(async move { generate(&mut c, greedy(&format!("stream {i}"), 200)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    promtool_check("router under load", &scrape_text(&router_metrics).await).await;
    promtool_check("worker under load", &scrape_text(&worker_metrics).await).await;
    for s in streams {
        s.await.unwrap().expect("a loaded stream");
    }
    promtool_check("router after load", &scrape_text(&router_metrics).await).await;
    promtool_check("worker after load", &scrape_text(&worker_metrics).await).await;
}
