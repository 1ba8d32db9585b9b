//! The fuzz targets as regression tests on stable: every file of `fuzz/corpus/NAME/` (the seeds
//! and what the fuzzer kept) and `fuzz/artifacts/NAME/` (saved crash inputs, each fixed since) goes
//! through the target's entry point, as `cargo fuzz` would feed it.

use std::path::{Path, PathBuf};

/// The files of `fuzz/{kind}/{target}/`, sorted (none when the folder does not exist).
fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(kind)
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a readable folder entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Feeds every corpus and artifact file of `name` to its entry point; a panic names the file.
fn replay(name: &str) {
    let (_, target) = fuzz::TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a known target");
    let corpus = inputs("corpus", name);
    assert!(!corpus.is_empty(), "fuzz/corpus/{name}/ has no seed");
    for path in corpus.iter().chain(&inputs("artifacts", name)) {
        let data = std::fs::read(path).expect("a readable input");
        let outcome = std::panic::catch_unwind(|| target(&data));
        assert!(outcome.is_ok(), "{name}: {} fails", path.display());
    }
}

#[test]
fn every_target_is_tested_here_and_has_a_binary() {
    let tested = [
        "openai-json",
        "generate-request",
        "gguf",
        "model-files",
        "detokenizer",
        "chat-template",
        "constraint",
        "router-stream",
    ];
    let names: Vec<&str> = fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, tested);
    for name in names {
        let binary = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fuzz_targets/{name}.rs"));
        assert!(binary.is_file(), "{} is missing", binary.display());
    }
}

#[test]
fn openai_json_corpus() {
    replay("openai-json");
}

#[test]
fn generate_request_corpus() {
    replay("generate-request");
}

#[test]
fn gguf_corpus() {
    replay("gguf");
}

#[test]
fn model_files_corpus() {
    replay("model-files");
}

#[test]
fn detokenizer_corpus() {
    replay("detokenizer");
}

#[test]
fn chat_template_corpus() {
    replay("chat-template");
}

#[test]
fn constraint_corpus() {
    replay("constraint");
}

#[test]
fn router_stream_corpus() {
    replay("router-stream");
}
