//! The folder reader against llama.cpp's converter: each tiny-arch model's `hf-f32` and
//! `hf-bf16` folders must read as the `<arch>-f32.gguf` the converter made of `hf-f32`
//! (fixtures copied from `shared/reference/tiny-arch`): the same tensors, names, shapes and
//! values bit for bit once widened to f32, and the same metadata values.

use std::path::PathBuf;

use gguf::GgufFile;

use super::open_folder;

const ARCHS: [&str; 5] = ["qwen2", "qwen3", "llama3rope", "gemma2", "phi3"];

/// Metadata the converter derives from things other than the model (the folder name, its own
/// version) or that this reader adds.
fn incidental(key: &str) -> bool {
    matches!(
        key,
        "general.name"
            | "general.type"
            | "general.size_label"
            | "general.file_type"
            | "general.quantization_version"
            | "tokenizer.ggml.eos_token_ids"
    )
}

fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/tiny-arch/{arch}"))
}

fn widened(file: &GgufFile, name: &str) -> Vec<u32> {
    let t = file.tensor(name).unwrap();
    let bytes = file.tensor_bytes(t).unwrap();
    gguf::dequantize_to_vec(t.dtype, bytes, t.n_elements() as usize)
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

#[test]
fn every_tiny_arch_folder_reads_as_the_converters_gguf() {
    for arch in ARCHS {
        let dir = fixture(arch);
        let gguf = GgufFile::open(&dir.join(format!("{arch}-f32.gguf"))).unwrap();
        for folder in ["hf-f32", "hf-bf16"] {
            let what = format!("{arch}/{folder}");
            let hf = open_folder(&dir.join(folder)).unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut ours: Vec<&str> = hf.tensors().iter().map(|t| t.name.as_str()).collect();
            let mut theirs: Vec<&str> = gguf.tensors().iter().map(|t| t.name.as_str()).collect();
            ours.sort_unstable();
            theirs.sort_unstable();
            assert_eq!(ours, theirs, "{what}: tensor names");
            for t in gguf.tensors() {
                let mine = hf.tensor(&t.name).unwrap();
                assert_eq!(mine.dims, t.dims, "{what}: {} dims", t.name);
                assert!(
                    widened(&hf, &t.name) == widened(&gguf, &t.name),
                    "{what}: tensor {} differs from the converter's",
                    t.name
                );
            }
            for (key, value) in gguf.metadata_entries() {
                if incidental(key) {
                    continue;
                }
                assert_eq!(hf.metadata(key), Some(value), "{what}: metadata `{key}`");
            }
            for (key, _) in hf.metadata_entries() {
                assert!(
                    incidental(key) || gguf.metadata(key).is_some(),
                    "{what}: metadata `{key}` is not in the converter's file"
                );
            }
            assert!(
                hf.origin().unwrap().contains(arch_name(arch)),
                "{:?}",
                hf.origin()
            );
        }
    }
}

fn arch_name(fixture: &str) -> &str {
    match fixture {
        "llama3rope" => "llama",
        other => other,
    }
}
