//! Bad model files end the worker with exit code 2 and one line naming the file and the problem;
//! `worker inspect` says what a file holds and whether it can be served (exit 0 or 2). The files
//! are written by the test: a tiny random llama, truncated, one of another architecture, and
//! copies of the tiny Qwen 3 fixture with a tensor missing or of the wrong shape.

use std::process::Command;

use integration_tests::{bin_path, free_port, tiny_model};

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

#[test]
fn bad_files_exit_2_naming_the_problem_and_inspect_tells_what_a_file_holds() {
    let (dir, model) = tiny_model(41);
    let model_str = model.to_str().unwrap();
    let (code, out) = worker(&["inspect", model_str]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("architecture   llama"), "{out}");
    assert!(out.contains("servable       yes"), "{out}");

    let bytes = std::fs::read(&model).unwrap();
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let other = dir.path().join("other.gguf");
    let mut w = gguf::GgufWriter::new();
    w.add_string("general.architecture", "mamba");
    w.write(&other).unwrap();
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"definitely not a model").unwrap();

    for (path, expected) in [
        (&truncated, "lies outside the file"),
        (&other, "unsupported model architecture `mamba`"),
        (&garbage, "not a GGUF file"),
    ] {
        let path = path.to_str().unwrap();
        let (code, out) = worker(&["inspect", path]);
        assert_eq!(code, Some(2), "{out}");
        assert!(out.contains("servable       no: "), "{out}");
        assert!(out.contains(expected), "{out}");

        let listen = format!("127.0.0.1:{}", free_port());
        let (code, out) = worker(&["--model", path, "--listen", &listen]);
        assert_eq!(code, Some(2), "{out}");
        let last = out.lines().last().unwrap_or_default();
        assert!(
            last.starts_with(&format!("worker: {path}")) && last.contains(expected),
            "{out}"
        );
    }
    let (code, out) = worker(&["--model", "/nonexistent/m.gguf"]);
    assert_eq!(code, Some(2), "{out}");
}

/// A copy of the tiny Qwen 3 fixture (`fixtures/tiny-arch/qwen3/qwen3-f32.gguf`) at `to`, without
/// the tensor `drop` and with `reshape`'s tensor declared with other dims (same bytes).
fn altered_qwen3(to: &std::path::Path, drop: &str, reshape: Option<(&str, &[u64])>) {
    let from = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/tiny-arch/qwen3/qwen3-f32.gguf"
    );
    let file = gguf::GgufFile::open(std::path::Path::new(from)).expect("qwen3 fixture");
    let mut w = gguf::GgufWriter::new();
    for (k, v) in file.metadata_entries() {
        w.add_metadata(k, v.clone());
    }
    for t in file.tensors() {
        if t.name == drop {
            continue;
        }
        let dims = match reshape {
            Some((name, dims)) if name == t.name => dims.to_vec(),
            _ => t.dims.clone(),
        };
        let bytes = file.tensor_bytes(t).unwrap().to_vec();
        w.add_tensor_raw(&t.name, &dims, t.dtype, bytes).unwrap();
    }
    w.write(to).unwrap();
}

#[test]
fn an_architecture_tensor_missing_or_misshapen_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    altered_qwen3(&missing, "blk.2.attn_k_norm.weight", None);
    let misshapen = dir.path().join("misshapen.gguf");
    // [32] norm declared as [16, 2]: same bytes, wrong shape.
    altered_qwen3(&misshapen, "", Some(("blk.0.attn_q_norm.weight", &[16, 2])));
    for (path, expected) in [
        (
            &missing,
            "missing tensor `blk.2.attn_k_norm.weight`".to_string(),
        ),
        (
            &misshapen,
            "tensor `blk.0.attn_q_norm.weight` has dims [16, 2], expected [32]".to_string(),
        ),
    ] {
        let path = path.to_str().unwrap();
        let (code, out) = worker(&["inspect", path]);
        assert_eq!(code, Some(2), "{out}");
        assert!(out.contains("architecture   qwen3"), "{out}");
        assert!(out.contains(&expected), "{out}");
        let listen = format!("127.0.0.1:{}", free_port());
        let (code, out) = worker(&["--model", path, "--listen", &listen]);
        assert_eq!(code, Some(2), "{out}");
        let last = out.lines().last().unwrap_or_default();
        assert!(last.contains(&expected), "{out}");
    }
}
