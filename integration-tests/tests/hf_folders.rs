//! Hugging Face model folders (`--model DIR`) through real router and worker processes: a folder
//! generates exactly what the GGUF llama.cpp's converter made of it generates, `worker inspect`
//! describes a folder, and a bad folder ends the worker with exit code 2 and one line naming the
//! file and the problem. The folders are the tiny-arch fixtures (copied from
//! `shared/reference/tiny-arch`); the bad ones are written by the test.

use std::path::{Path, PathBuf};
use std::process::Command;

use inference_proto::public::{ChatMessage, GenerateRequest, ModelInfoRequest, TokenizeRequest};
use integration_tests::{bin_path, free_port, generate, greedy, Cluster};
use serde_json::{json, Value};

fn fixture(arch: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/tiny-arch/{arch}/{name}"))
}

/// A copy of the fixture folder `arch/folder` in a temporary directory.
fn copy_folder(arch: &str, folder: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(fixture(arch, folder)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (tmp, dir)
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

    let (_tmp, dir) = copy_folder("llama3rope", "hf-f32");
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

/// A folder with a `tokenizer.json` (a word-level vocabulary written here: `w0` ... `w383` and two
/// special tokens), a chat template in `tokenizer_config.json` and two `eos_token_id`s: the router
/// tokenizes with that `tokenizer.json`, renders chats with that template and stops on both ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folders_tokenizer_json_chat_template_and_eos_list_reach_the_router() {
    let (_tmp, dir) = copy_folder("qwen2", "hf-f32");
    std::fs::remove_file(dir.join("tokenizer.model")).unwrap();
    let specials = [(3, "<|im_start|>"), (4, "<|im_end|>")];
    let mut vocab = serde_json::Map::new();
    for id in 0..384u32 {
        let word = specials
            .iter()
            .find(|s| s.0 == id)
            .map_or(format!("w{id}"), |s| s.1.to_string());
        vocab.insert(word, json!(id));
    }
    let added: Vec<Value> = specials
        .iter()
        .map(|(id, content)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let template = "{% for m in messages %}<|im_start|> w7 {{ m.content }} <|im_end|> {% endfor %}\
                    {% if add_generation_prompt %}<|im_start|> w8 {% endif %}";
    let tok_config = json!({"chat_template": template, "eos_token": "<|im_end|>"});
    std::fs::write(dir.join("tokenizer_config.json"), tok_config.to_string()).unwrap();
    let config_path = dir.join("config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["eos_token_id"] = json!([2, 4]);
    std::fs::write(&config_path, config.to_string()).unwrap();

    let cluster = Cluster::start(&dir).await;
    let mut client = cluster.client().await;
    let info = client
        .model_info(ModelInfoRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.architecture, "qwen2");
    assert_eq!(info.eos_token_ids, [2, 4]);
    assert_eq!(info.chat_template, template);
    let tokens = client
        .tokenize(TokenizeRequest {
            text: "w10 w11 <|im_end|> w383".into(),
            add_special_tokens: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(tokens.ids, [10, 11, 4, 383]);
    let chat = GenerateRequest {
        messages: vec![ChatMessage {
            role: "user".into(),
            content: "w20 w21".into(),
            ..Default::default()
        }],
        max_new_tokens: Some(6),
        ..Default::default()
    };
    let g = generate(&mut client, chat).await.unwrap();
    let usage = g.usage.unwrap();
    // <|im_start|> w7 w20 w21 <|im_end|> <|im_start|> w8
    assert_eq!(usage.prompt_tokens, 7, "{g:?}");
    assert!(
        !g.token_ids.is_empty() && g.token_ids.iter().all(|&id| id < 384),
        "{g:?}"
    );
}
