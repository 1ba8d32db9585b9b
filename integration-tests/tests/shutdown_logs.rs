//! A normal shutdown is quiet: after a request, SIGTERM to the router and then to the worker; both
//! exit 0 and neither logs a WARN or ERROR line (a router going away is an ordinary close for the
//! worker's stream, logged at INFO).

use std::time::Duration;

use integration_tests::{
    connect_ready, generate, greedy, start_router, start_worker, tiny_model, Process,
};

/// The log's WARN and ERROR lines.
fn warnings_and_errors(process: &Process) -> Vec<String> {
    process
        .log_text()
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_then_worker_sigterm_logs_no_warn_or_error() {
    let (_dir, model) = tiny_model(24);
    let (mut worker, worker_addr) = start_worker(&model).await;
    let (mut router, router_addr) = start_router(&[&worker_addr], &[]).await;
    let mut client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    let g = generate(&mut client, greedy("a quiet shutdown", 6))
        .await
        .expect("generation");
    assert_eq!(g.usage.expect("usage").generated_tokens, 6);
    drop(client);

    router.terminate();
    let status = router.wait_exit(Duration::from_secs(20)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "router exit: {status:?}\n{}",
        router.log_text()
    );
    // Let the worker notice the closed stream before it is stopped itself.
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.terminate();
    let status = worker.wait_exit(Duration::from_secs(20)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "worker exit: {status:?}\n{}",
        worker.log_text()
    );

    let worker_log = worker.log_text();
    assert!(
        worker_log.contains("router went away") || worker_log.contains("router stream closed"),
        "the worker logs the router's stream closing at INFO:\n{worker_log}"
    );
    for (name, process) in [("router", &router), ("worker", &worker)] {
        let bad = warnings_and_errors(process);
        assert!(
            bad.is_empty(),
            "{name} logged on a normal shutdown:\n{}",
            bad.join("\n")
        );
    }
}
