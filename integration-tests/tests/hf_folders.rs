//! Hugging Face model folders (`--model DIR`) through real router and worker processes: a folder
//! generates exactly what the GGUF llama.cpp's converter made of it generates, `worker inspect`
//! describes a folder, and a bad folder ends the worker with exit code 2 and one line naming the
//! file and the problem. The folders are the tiny-arch fixtures (copied from
//! `shared/reference/tiny-arch`); the bad ones are written by the test.

use std::path::{Path, PathBuf};
use std::process::Command;

use integration_tests::{bin_path, free_port, generate, greedy, Cluster};

fn fixture(arch: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/tiny-arch/{arch}/{name}"))
}

/// Runs the worker binary to its exit; returns (exit code, stdout + stderr).
fn worker(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(bin_path("worker"))
        .args(args)
        .output()
        .expect("running the worker binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Greedy ids and text for `prompt` from a cluster serving `model`.
async fn greedy_run(model: &Path, prompt: &str) -> (Vec<u32>, String) {
    let cluster = Cluster::start(model).await;
    let mut client = cluster.client().await;
    let g = generate(&mut client, greedy(prompt, 12)).await.unwrap();
    (g.token_ids, g.text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_generates_exactly_what_its_gguf_generates() {
    let prompt = "the quick brown fox jumps";
    // llama: Q/K rows permuted, llama3 RoPE factors computed; gemma2: 1 + w norms, soft-caps,
    // sliding window (every tiny-arch folder is checked token-exact in worker/tests/architectures.rs).
    for arch in ["llama3rope", "gemma2"] {
        let folder = greedy_run(&fixture(arch, "hf-f32"), prompt).await;
        let gguf = greedy_run(&fixture(arch, &format!("{arch}-f32.gguf")), prompt).await;
        assert_eq!(folder.0.len(), 12, "{arch}: {folder:?}");
        assert_eq!(folder, gguf, "{arch}: folder vs GGUF");
    }
}

#[test]
fn inspect_describes_a_folder_and_bad_folders_exit_2_naming_the_file() {
    let good = fixture("qwen2", "hf-bf16");
    let (code, out) = worker(&["inspect", good.to_str().unwrap()]);
    assert!(
        out.contains("format         Hugging Face folder: qwen2 (1 safetensors file, BF16)"),
        "{out}"
    );
    assert!(
        out.contains("tokenizer      llama (default), 384 tokens"),
        "{out}"
    );
    // Whether qwen2 is servable depends on the CPU backend's architectures; the file reads.
    assert!(matches!(code, Some(0 | 2)), "{out}");

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(fixture("llama3rope", "hf-f32")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let dir_str = dir.to_str().unwrap();
    let (code, out) = worker(&["inspect", dir_str]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("servable       yes"), "{out}");

    let config = dir.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    let cases: [(Box<dyn Fn()>, String); 2] = [
        (
            Box::new(|| {
                let mamba = text.replace("\"model_type\": \"llama\"", "\"model_type\": \"mamba\"");
                std::fs::write(&config, mamba).unwrap();
            }),
            format!("{}: unsupported model_type `mamba`", config.display()),
        ),
        (
            Box::new(|| std::fs::remove_file(&config).unwrap()),
            format!("{}: missing (the model's config.json)", config.display()),
        ),
    ];
    for (break_it, expected) in cases {
        break_it();
        let (code, out) = worker(&["inspect", dir_str]);
        assert_eq!(code, Some(2), "{out}");
        assert!(
            out.contains(&format!("servable       no: {expected}")),
            "{out}"
        );
        let listen = format!("127.0.0.1:{}", free_port());
        let (code, out) = worker(&["--model", dir_str, "--listen", &listen]);
        assert_eq!(code, Some(2), "{out}");
        let last = out.lines().last().unwrap_or_default();
        assert!(last.starts_with(&format!("worker: {expected}")), "{out}");
    }
}
