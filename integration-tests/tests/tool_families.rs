//! Tool calling (issue 29) through the model families' own chat templates, with the official
//! `openai` Python SDK against real worker and router processes on 127.0.0.1: four models behind
//! one router, each named with `--served-model-name`:
//!
//! - tiny random-weight Qwen 2.5, Qwen 3 and Llama 3.1 models (the `fixtures/tiny-arch` qwen2,
//!   qwen3 and llama3rope Hugging Face folders) whose `tokenizer_config.json` carries the real
//!   model's own chat template (fetched by `scripts/fetch-chat-templates`), so the worker hands
//!   that template to the router, which renders `tools`, calls and results with it and reads
//!   calls in the family's syntax (Hermes `<tool_call>` for Qwen, bare JSON with `parameters`
//!   for Llama 3.1);
//! - the tiny llama of `integration_tests::tiny_model`, whose template has no tool support (the
//!   built-in Hermes format).
//!
//! On every model: `tool_choice` `required`, a named function, `auto` and `none`; parallel calls
//! (the end tokens barred with `logit_bias`, so that the random model chains calls)
//! and `parallel_tool_calls: false`; a call's result fed back, the rendered prompt (`/tokenize`
//! then `/detokenize`) holding what that family's template writes for the tools, the call and the
//! result; streaming assembled by the SDK's helper and from raw `delta.tool_calls`, equal to the
//! non-streamed calls of the same seed; `finish_reason: "tool_calls"` and null `content` when
//! only calls were made. Then 280 answers sampled at temperature 1 (a seed and a prompt of their
//! own each) over 40 argument schemas (at least 30 distinct: nested objects, enums, bounded arrays
//! and numbers, optional fields, strings with `maxLength`) spread over the four models: every
//! call returned parses and validates with `jsonschema`, over 200 of them (an answer whose random
//! model repeats a number's digits to `max_tokens` returns no call, and is counted apart); and a
//! constrained tool request in a batch of 31 greedy plain requests leaving their texts unchanged.
//! Runs integration-tests/python/test_tool_families.py.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inference_proto::public::text_generation_client::TextGenerationClient;
use inference_proto::public::ModelInfoRequest;
use integration_tests::openai::{run_sdk_test, wait_healthy};
use integration_tests::{free_port, start_router, start_worker_with, tiny_model_with_context};
use serde_json::Value;

/// The context the models are served with: a tool list in a prompt is longer than the fixtures'
/// 256 positions (their weights do not depend on it).
const CONTEXT: u64 = 8192;

/// (served name, family as the Python test names it, tiny-arch fixture, template file).
const FAMILIES: [(&str, &str, &str, &str); 3] = [
    (
        "qwen2.5-tiny",
        "qwen2.5",
        "qwen2",
        "Qwen-Qwen2.5-7B-Instruct.jinja",
    ),
    ("qwen3-tiny", "qwen3", "qwen3", "Qwen-Qwen3-0.6B.jinja"),
    (
        "llama3.1-tiny",
        "llama3.1",
        "llama3rope",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
    ),
];

/// The tiny llama with the built-in format.
const BUILTIN: &str = "llama-builtin";

/// A fetched chat template's source; panics with the fix when it has not been fetched (the test
/// fails, it is not skipped).
fn template(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.cache/chat-templates")
        .join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}: run scripts/fetch-chat-templates", path.display()))
}

/// A copy of `fixtures/tiny-arch/{arch}/hf-f32` in `dir` with `template` as its
/// `tokenizer_config.json` `chat_template` and a [`CONTEXT`]-token context.
fn model_folder(dir: &Path, arch: &str, template: String) -> PathBuf {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../fixtures/tiny-arch/{arch}/hf-f32"));
    let folder = dir.join(arch);
    std::fs::create_dir(&folder).unwrap();
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), folder.join(entry.file_name())).unwrap();
    }
    let edit = |name: &str, change: &dyn Fn(&mut Value)| {
        let path = folder.join(name);
        let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        change(&mut json);
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    };
    edit("tokenizer_config.json", &|c| {
        c["chat_template"] = Value::String(template.clone())
    });
    edit("config.json", &|c| {
        c["max_position_embeddings"] = CONTEXT.into()
    });
    folder
}

/// Waits until the router at `address` has a ready worker for each of `models`.
async fn wait_models_ready(address: &str, models: &[&str]) {
    let started = Instant::now();
    for model in models {
        loop {
            let ready = match TextGenerationClient::connect(format!("http://{address}")).await {
                Ok(mut client) => client
                    .model_info(ModelInfoRequest {
                        model: Some(model.to_string()),
                    })
                    .await
                    .is_ok_and(|info| info.get_ref().ready_workers == 1),
                Err(_) => false,
            };
            if ready {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "model {model} has no ready worker"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_through_each_familys_own_template() {
    let tmp = tempfile::tempdir().unwrap();
    let mut workers = Vec::new();
    let mut addresses = Vec::new();
    let mut env = Vec::new();
    for (name, family, arch, file) in FAMILIES {
        let folder = model_folder(tmp.path(), arch, template(file));
        let args = ["--threads", "1", "--served-model-name", name];
        let (worker, address) = start_worker_with(&folder, &args).await;
        workers.push(worker);
        addresses.push(address);
        env.push(format!("{name}={family}"));
    }
    let (_tiny_dir, tiny) = tiny_model_with_context(29, CONTEXT as usize);
    let args = ["--threads", "1", "--served-model-name", BUILTIN];
    let (worker, address) = start_worker_with(&tiny, &args).await;
    workers.push(worker);
    addresses.push(address);
    env.push(format!("{BUILTIN}=builtin"));

    let http = format!("127.0.0.1:{}", free_port());
    let worker_list: Vec<&str> = addresses.iter().map(String::as_str).collect();
    let (router, router_address) = start_router(&worker_list, &["--http-listen", &http]).await;
    let mut names: Vec<&str> = FAMILIES.iter().map(|f| f.0).collect();
    names.push(BUILTIN);
    wait_models_ready(&router_address, &names).await;
    let base = format!("http://{http}");
    wait_healthy(&base, Duration::from_secs(10)).await;

    let started = Instant::now();
    let models = env.join(",");
    let report = run_sdk_test(
        "test_tool_families.py",
        &format!("{base}/v1"),
        &[
            ("MODELS", models.as_ref()),
            ("PLAIN_MODEL", BUILTIN.as_ref()),
        ],
        || router.log_text(),
    )
    .await;
    eprintln!("{report}\nthe SDK test took {:?}", started.elapsed());
    assert!(report.contains("Ran 9 tests"), "{report}");
    assert!(report.trim_end().ends_with("OK"), "{report}");
    let sampled = report
        .lines()
        .find_map(|l| l.strip_prefix("sampled: "))
        .unwrap_or_else(|| panic!("no sampled line: {report}"));
    let numbers: Vec<u64> = sampled
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        numbers.len() >= 2 && numbers[0] >= 200 && numbers[1] >= 30,
        "over 200 calls over 30 schemas: {sampled}"
    );
    drop(workers);
}
