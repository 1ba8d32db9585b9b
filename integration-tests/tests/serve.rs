//! `serve MODEL --port P --grpc-port G` as a new user runs it (issue 30), real processes on
//! 127.0.0.1: it prints one ready line with both addresses, answers the official `openai` SDK
//! (integration-tests/python/serve_sdk.py, the SDK from scripts/install-openai-sdk) and gRPC, drains
//! on SIGTERM (a stream running at the signal finishes whole), exits 0 and leaves no process behind;
//! a model path that does not exist or a port in use ends it non-zero with the failing part's message.

use std::time::Duration;

use inference_proto::public::GenerateRequest;
use integration_tests::openai::{joined, sdk_python};
use integration_tests::{bin_path, connect_ready, free_port, generate, tiny_model_with_context};
use integration_tests::{Generation, Process};

/// The processes whose parent is `pid` (from /proc).
fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            found.push(child);
        }
    }
    found
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Runs `serve args...` to its end; returns its exit code and its standard error.
async fn serve_to_exit(args: &[&str]) -> (Option<i32>, String) {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(bin_path("serve"))
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("serve exits within 60 s")
    .expect("running serve");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_the_sdk_and_grpc_then_drains_on_sigterm() {
    let (_dir, model) = tiny_model_with_context(30, 8192);
    let (port, grpc_port) = (free_port(), free_port());
    let (port_arg, grpc_arg) = (port.to_string(), grpc_port.to_string());
    let mut serve = Process::start(
        "serve",
        &[
            model.to_str().unwrap(),
            "--port",
            &port_arg,
            "--grpc-port",
            &grpc_arg,
            "--served-model-name",
            "tiny",
            "--threads",
            "1",
        ],
        "serve ready:",
        Duration::from_secs(120),
    )
    .await
    .expect("serve starts");
    let parts = children(serve.pid().unwrap());
    assert_eq!(parts.len(), 2, "a worker and a router: {parts:?}");

    // The official SDK on the HTTP port.
    let base = format!("http://127.0.0.1:{port}/v1");
    let output = tokio::process::Command::new(sdk_python())
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/python/serve_sdk.py"))
        .env("OPENAI_BASE", &base)
        .output()
        .await
        .expect("running python");
    assert!(
        output.status.success(),
        "serve_sdk.py failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let sdk: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("serve_sdk.py prints JSON");
    // `--served-model-name` names the model.
    assert_eq!(sdk["models"], serde_json::json!(["tiny"]));
    for answer in ["whole", "streamed"] {
        let tokens = sdk[answer]["completion_tokens"].as_u64().expect("usage");
        assert!((1..=8).contains(&tokens), "{answer}: {sdk}");
    }
    assert_eq!(sdk["streamed"]["text"], sdk["whole"]["text"], "{sdk}");
    assert_eq!(
        sdk["streamed"]["finish_reasons"],
        serde_json::json!([sdk["whole"]["finish_reason"]]),
        "{sdk}"
    );

    assert_eq!(
        sdk["tools"],
        serde_json::json!({"status": 200, "finish_reason": "tool_calls",
                           "calls": [["get_weather", "{}"]]}),
        "{sdk}"
    );

    // gRPC beside it.
    let grpc_addr = format!("127.0.0.1:{grpc_port}");
    let mut grpc = connect_ready(&grpc_addr, Duration::from_secs(10)).await;
    let Generation { usage, .. } = generate(
        &mut grpc,
        GenerateRequest {
            prompt: "hello".into(),
            max_new_tokens: Some(4),
            ignore_eos: true,
            ..Default::default()
        },
    )
    .await
    .expect("a gRPC generation");
    assert_eq!(usage.expect("usage").generated_tokens, 4);

    // SIGTERM while a long stream runs: it finishes whole, then serve exits 0 and its parts are gone.
    const LONG: u64 = 2000;
    let mut response = reqwest::Client::new()
        .post(format!("{base}/completions"))
        .json(
            &serde_json::json!({"model": "tiny-llama-test", "prompt": "a", "max_tokens": LONG,
                                  "ignore_eos": true, "stream": true}),
        )
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 200);
    let mut body = String::from_utf8_lossy(&response.chunk().await.unwrap().unwrap()).into_owned();
    serve.terminate();
    while let Some(chunk) = response
        .chunk()
        .await
        .expect("the stream goes on while draining")
    {
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    let chunks: Vec<serde_json::Value> = body
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).expect("a JSON event"))
        .collect();
    let (_, reasons) = joined(&chunks, 0);
    assert_eq!(reasons, ["length"], "the running stream finished whole");
    let status = serve
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("serve exits after draining");
    assert!(status.success(), "serve after SIGTERM: {status}");
    for pid in parts {
        assert!(!alive(pid), "part {pid} outlived serve");
    }
    let log = serve.log_text();
    assert!(log.contains("serve: stopping the router"), "{log}");
    // The stream was running when the router got the signal, and the router stopped before the
    // worker.
    let draining = log.find("router: draining running=1").expect(&log);
    let worker_stop = log.find("serve: stopping the worker").expect(&log);
    assert!(draining < worker_stop, "{log}");
}

#[tokio::test]
async fn a_missing_model_ends_serve_with_the_workers_message() {
    let (port, grpc_port) = (free_port().to_string(), free_port().to_string());
    let (code, stderr) = serve_to_exit(&[
        "/nonexistent/model.gguf",
        "--port",
        &port,
        "--grpc-port",
        &grpc_port,
    ])
    .await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "serve: the worker exited with code 2: worker: model file /nonexistent/model.gguf \
             does not exist"
        ),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_port_in_use_ends_serve_with_the_routers_message() {
    let (_dir, model) = tiny_model_with_context(31, 256);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let grpc_port = free_port().to_string();
    let (code, stderr) = serve_to_exit(&[
        model.to_str().unwrap(),
        "--port",
        &port,
        "--grpc-port",
        &grpc_port,
    ])
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "serve: the router exited with code 1: router: cannot listen on 127.0.0.1:{port} \
             (http_listen)"
        )),
        "{stderr}"
    );
    // The worker it had started was stopped first.
    assert!(stderr.contains("serve: stopping the worker"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_api_keys_stay_off_the_command_line_and_are_required() {
    let (_dir, model) = tiny_model_with_context(30, 8192);
    let (port, grpc_port) = (free_port(), free_port());
    let (port_arg, grpc_arg) = (port.to_string(), grpc_port.to_string());
    let mut serve = Process::start(
        "serve",
        &[
            "-m",
            model.to_str().unwrap(),
            "--port",
            &port_arg,
            "--grpc-port",
            &grpc_arg,
            "--api-key",
            "sk-serve",
        ],
        "serve ready:",
        Duration::from_secs(120),
    )
    .await
    .expect("serve starts");
    // The key is in the router's environment, not on any command line (`ps` shows those).
    for pid in children(serve.pid().unwrap()) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&cmdline).contains("sk-serve"));
    }
    let url = format!("http://127.0.0.1:{port}/v1/models");
    let client = reqwest::Client::new();
    let (status, body) = integration_tests::openai::get(&client, &url).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
    let listed = client
        .get(&url)
        .bearer_auth("sk-serve")
        .send()
        .await
        .expect("GET /v1/models");
    assert_eq!(listed.status(), 200);
    serve.terminate();
    let status = serve.wait_exit(Duration::from_secs(60)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "serve after SIGTERM: {status:?}"
    );
}
