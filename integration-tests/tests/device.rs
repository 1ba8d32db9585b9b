//! The `device` setting end to end: `auto` picks the CPU on a host without a GPU and says so in the
//! log; `cuda` on such a host exits with code 2 and one line naming the setting.

use std::time::Duration;

use integration_tests::{bin_path, free_port, start_worker_with, tiny_model};

/// Whether this host's worker picks CUDA under `--device auto` (read from its log).
async fn auto_picks_cuda(model: &std::path::Path) -> bool {
    let (mut worker, _) = start_worker_with(model, &["--device", "auto"]).await;
    let log = worker.log_text();
    worker.kill().await;
    let line = log
        .lines()
        .find(|l| l.contains("compute device chosen"))
        .unwrap_or_else(|| panic!("no `compute device chosen` line in the log:\n{log}"))
        .to_string();
    assert!(
        line.contains("device=\"cpu\"") || line.contains("device=\"cuda\""),
        "{line}"
    );
    line.contains("device=\"cuda\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_logs_its_choice_and_cuda_without_a_gpu_exits_2() {
    let (_dir, model) = tiny_model(3);
    if auto_picks_cuda(&model).await {
        // A GPU host: `--device cuda` must serve (the GPU checks live in scripts/gpu-check).
        let (mut worker, _) = start_worker_with(&model, &["--device", "cuda"]).await;
        worker.kill().await;
        return;
    }
    let listen = format!("127.0.0.1:{}", free_port());
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(bin_path("worker"))
            .args(["--model", model.to_str().unwrap(), "--listen", &listen])
            .args(["--device", "cuda"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("worker exits promptly")
    .expect("running the worker");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {stderr}");
    assert!(
        lines[0].starts_with("worker: invalid settings: device = \"cuda\" but no usable GPU: "),
        "{stderr}"
    );
    assert!(lines[0].contains("--device cpu or auto"), "{stderr}");
    // Nothing was started: the port is still free.
    assert!(std::net::TcpListener::bind(&listen).is_ok());
}
