//! Folders the tests write: sharded and F16 weights that must read like the originals, and bad
//! folders that must fail with one message naming the file, the key or tensor, and what was
//! expected.

use std::path::{Path, PathBuf};

use gguf::GgufFile;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::{json, Value};

use super::open_folder;

/// (name, dtype, shape, bytes) of every tensor of a safetensors file, sorted by name.
type Tensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

fn fixture(arch: &str, folder: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/tiny-arch/{arch}/{folder}"))
}

/// A copy of a fixture folder in a temporary directory.
fn copy(arch: &str, folder: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(folder);
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(fixture(arch, folder)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (tmp, dir)
}

fn read_tensors(path: &Path) -> Tensors {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Tensors = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn write_tensors(path: &Path, tensors: &Tensors) {
    let views = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()));
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

fn widened(file: &GgufFile, name: &str) -> Vec<f32> {
    let t = file.tensor(name).unwrap();
    gguf::dequantize_to_vec(
        t.dtype,
        file.tensor_bytes(t).unwrap(),
        t.n_elements() as usize,
    )
    .unwrap()
}

fn error(dir: &Path) -> String {
    open_folder(dir).unwrap_err().to_string()
}

#[test]
fn sharded_weights_read_like_one_file() {
    let (_tmp, dir) = copy("llama3rope", "hf-bf16");
    let single = dir.join("model.safetensors");
    let tensors = read_tensors(&single);
    std::fs::remove_file(&single).unwrap();
    let (a, b) = tensors.split_at(tensors.len() / 2);
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    let mut map = serde_json::Map::new();
    for (part, name) in [(a, names[0]), (b, names[1])] {
        write_tensors(&dir.join(name), &part.to_vec());
        for t in part {
            map.insert(t.0.clone(), json!(name));
        }
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let sharded = open_folder(&dir).unwrap();
    let original = open_folder(&fixture("llama3rope", "hf-bf16")).unwrap();
    assert!(sharded.origin().unwrap().contains("2 safetensors files"));
    assert_eq!(sharded.tensors().len(), original.tensors().len());
    for t in original.tensors() {
        assert_eq!(
            widened(&sharded, &t.name),
            widened(&original, &t.name),
            "{}",
            t.name
        );
    }

    // A shard the index names but the folder lacks.
    std::fs::remove_file(dir.join(names[1])).unwrap();
    let e = error(&dir);
    assert!(
        e.ends_with(&format!(
            "{}: missing (a shard listed in model.safetensors.index.json)",
            dir.join(names[1]).display()
        )),
        "{e}"
    );
}

#[test]
fn f16_weights_read_as_f16() {
    let (_tmp, dir) = copy("llama3rope", "hf-f32");
    let path = dir.join("model.safetensors");
    let f16: Tensors = read_tensors(&path)
        .into_iter()
        .map(|(n, _, s, b)| {
            let b = b
                .chunks_exact(4)
                .flat_map(|c| {
                    let x = f32::from_le_bytes(c.try_into().unwrap());
                    half::f16::from_f32(x).to_le_bytes()
                })
                .collect();
            (n, Dtype::F16, s, b)
        })
        .collect();
    write_tensors(&path, &f16);
    let file = open_folder(&dir).unwrap();
    let reference = open_folder(&fixture("llama3rope", "hf-f32")).unwrap();
    let q = file.tensor("blk.1.attn_q.weight").unwrap();
    assert_eq!(q.dtype, gguf::GgmlType::F16);
    for t in reference.tensors() {
        let rounded: Vec<f32> = widened(&reference, &t.name)
            .iter()
            .map(|&x| match t.name.as_str() {
                "rope_freqs.weight" => x,
                _ => half::f16::from_f32(x).to_f32(),
            })
            .collect();
        assert_eq!(widened(&file, &t.name), rounded, "{}", t.name);
    }
}

#[test]
fn bad_folders_are_refused_naming_file_key_or_tensor() {
    let (_tmp, dir) = copy("qwen2", "hf-f32");
    let config = dir.join("config.json");
    let weights = dir.join("model.safetensors");
    let shown = |p: &Path| p.display().to_string();

    edit_config(&dir, |c| c["intermediate_size"] = json!(128));
    assert_eq!(
        error(&dir),
        format!(
            "{}: tensor `model.layers.0.mlp.gate_proj.weight` has shape [160, 64], expected \
             [128, 64] (from config.json: intermediate_size 128 by hidden_size 64)",
            shown(&weights)
        )
    );
    edit_config(&dir, |c| {
        c["intermediate_size"] = json!(160);
        c["model_type"] = json!("mamba");
    });
    let e = error(&dir);
    assert!(
        e.starts_with(&format!(
            "{}: unsupported model_type `mamba`",
            shown(&config)
        )),
        "{e}"
    );
    edit_config(&dir, |c| {
        c["model_type"] = json!("qwen2");
        c["num_hidden_layers"] = json!("three");
    });
    assert_eq!(
        error(&dir),
        format!(
            "{}: key `num_hidden_layers`: expected a positive integer, found \"three\"",
            shown(&config)
        )
    );
    edit_config(&dir, |c| {
        c["num_hidden_layers"] = json!(3);
        c["head_dim"] = json!(15);
    });
    let e = error(&dir);
    assert!(
        e.starts_with(&format!(
            "{}: key `head_dim`: expected an even head size",
            shown(&config)
        )),
        "{e}"
    );
    edit_config(&dir, |c| c["head_dim"] = Value::Null);
    assert!(open_folder(&dir).is_ok());

    // A missing tensor, then one of an unsupported dtype.
    let original = read_tensors(&weights);
    let mut fewer = original.clone();
    fewer.retain(|t| t.0 != "model.layers.2.mlp.down_proj.weight");
    write_tensors(&weights, &fewer);
    assert_eq!(
        error(&dir),
        format!(
            "{}: missing tensor `model.layers.2.mlp.down_proj.weight`",
            shown(&weights)
        )
    );
    let mut f64s = original.clone();
    let norm = f64s
        .iter_mut()
        .find(|t| t.0 == "model.norm.weight")
        .unwrap();
    norm.1 = Dtype::F64;
    norm.3 = vec![0; 64 * 8];
    write_tensors(&weights, &f64s);
    assert_eq!(
        error(&dir),
        format!(
            "{}: tensor `model.norm.weight` has dtype F64, expected F32, F16 or BF16",
            shown(&weights)
        )
    );

    // A truncated weights file, then none at all.
    write_tensors(&weights, &original);
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() - 100]).unwrap();
    let e = error(&dir);
    assert!(
        e.starts_with(&format!("{}: invalid safetensors file", shown(&weights))),
        "{e}"
    );
    std::fs::remove_file(&weights).unwrap();
    let e = error(&dir);
    assert!(
        e.starts_with(&format!("{}: missing (the weights", shown(&weights))),
        "{e}"
    );

    // No tokenizer, then no config.
    std::fs::remove_file(dir.join("tokenizer.model")).unwrap();
    let e = error(&dir);
    assert!(e.contains("tokenizer.json: missing (the tokenizer"), "{e}");
    std::fs::remove_file(&config).unwrap();
    assert_eq!(
        error(&dir),
        format!("{}: missing (the model's config.json)", shown(&config))
    );
}

#[test]
fn tokenizer_json_folders_carry_their_vocabulary_eos_list_and_chat_template() {
    let (_tmp, dir) = copy("qwen2", "hf-f32");
    std::fs::remove_file(dir.join("tokenizer.model")).unwrap();
    // A byte-level BPE of 384 ids: 380 plain tokens, then four specials among the added tokens.
    let mut vocab = serde_json::Map::new();
    for id in 0..380 {
        vocab.insert(format!("t{id}"), json!(id));
    }
    let added: Vec<Value> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<extra>"]
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"id": 380 + i, "content": t, "special": i < 3}))
        .collect();
    let tokenizer = json!({
        "model": {"type": "BPE", "vocab": vocab, "merges": [["t1", "t2"], "t3 t4"]},
        "added_tokens": added,
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let template = "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}";
    let tok_config =
        json!({"eos_token": "<|im_end|>", "chat_template": template, "add_bos_token": false});
    std::fs::write(dir.join("tokenizer_config.json"), tok_config.to_string()).unwrap();
    edit_config(&dir, |c| c["eos_token_id"] = json!([380, 382]));
    let file = open_folder(&dir).unwrap();
    let tok = gguf::TokenizerMetadata::from_gguf(&file).unwrap();
    assert_eq!(tok.model, "gpt2");
    assert_eq!(tok.tokens.len(), 384);
    assert_eq!(tok.tokens[382], "<|im_end|>");
    assert_eq!(tok.token_types[381], 3);
    assert_eq!(tok.token_types[383], 4);
    assert_eq!(tok.merges, ["t1 t2", "t3 t4"]);
    assert_eq!(tok.eos_token_id, Some(382));
    assert_eq!(tok.eos_token_ids, [380, 382]);
    assert!(!tok.add_bos_token);
    assert_eq!(tok.chat_template.as_deref(), Some(template));
    assert!(file
        .origin()
        .unwrap()
        .ends_with("tokenizer from tokenizer.json"));
}
