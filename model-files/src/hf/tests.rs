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

/// Gemma 3 270M's `config.json` (google/gemma-3-270m) gives the metadata and tensors of the
/// Gemma 3 270M GGUF (values and shapes read from `gemma-3-270m-q4_k_m.gguf`, converted by an
/// older converter that did not yet write `rope.freq_base_swa`).
#[test]
fn gemma3_270m_config_gives_the_published_ggufs_metadata_and_tensors() {
    use super::arch::{self, Arch, Dims, Transform};
    use gguf::MetadataValue::{F32, U32};
    let layer_types: Vec<&str> = (0..18)
        .map(|l| match (l + 1) % 6 {
            0 => "full_attention",
            _ => "sliding_attention",
        })
        .collect();
    let config = super::HfConfig::from_value(
        PathBuf::from("/m/config.json"),
        serde_json::json!({
            "architectures": ["Gemma3ForCausalLM"], "_sliding_window_pattern": 6,
            "attention_bias": false, "attn_logit_softcapping": null, "bos_token_id": 2,
            "eos_token_id": 1, "final_logit_softcapping": null, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640,
            "intermediate_size": 2048, "layer_types": layer_types,
            "max_position_embeddings": 32768, "model_type": "gemma3_text",
            "num_attention_heads": 4, "num_hidden_layers": 18, "num_key_value_heads": 1,
            "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
            "rope_local_base_freq": 10000.0, "rope_scaling": null, "rope_theta": 1000000.0,
            "sliding_window": 512, "torch_dtype": "bfloat16", "vocab_size": 262144
        }),
    );
    let a = Arch::of(&config).unwrap();
    assert_eq!(a, Arch::Gemma3);
    let dims = Dims::read(a, &config).unwrap();
    let meta = arch::metadata(a, &config, &dims, &config.rope().unwrap()).unwrap();
    let mut got: Vec<(String, gguf::MetadataValue)> = meta;
    got.sort_by(|x, y| x.0.cmp(&y.0));
    let mut want = vec![
        ("gemma3.context_length", U32(32768)),
        ("gemma3.embedding_length", U32(640)),
        ("gemma3.block_count", U32(18)),
        ("gemma3.feed_forward_length", U32(2048)),
        ("gemma3.attention.head_count", U32(4)),
        ("gemma3.attention.layer_norm_rms_epsilon", F32(1e-6)),
        ("gemma3.attention.key_length", U32(256)),
        ("gemma3.attention.value_length", U32(256)),
        ("gemma3.rope.freq_base", F32(1e6)),
        ("gemma3.attention.sliding_window", U32(512)),
        ("gemma3.attention.head_count_kv", U32(1)),
        // Written by today's converter (Gemma 3's local layers' base).
        ("gemma3.rope.freq_base_swa", F32(10000.0)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect::<Vec<_>>();
    want.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(got, want);

    let specs = arch::tensor_specs(a, &config, &dims).unwrap();
    assert_eq!(specs.len(), 236);
    assert!(specs.iter().all(|s| s.gguf != "output.weight"), "tied");
    let gguf_dims = |name: &str| -> Vec<usize> {
        let s = specs.iter().find(|s| s.gguf == name).unwrap();
        s.shape.iter().rev().copied().collect()
    };
    assert_eq!(gguf_dims("blk.0.attn_q.weight"), [640, 1024]);
    assert_eq!(gguf_dims("blk.0.attn_k.weight"), [640, 256]);
    assert_eq!(gguf_dims("blk.0.attn_output.weight"), [1024, 640]);
    assert_eq!(gguf_dims("blk.0.attn_q_norm.weight"), [256]);
    assert_eq!(gguf_dims("token_embd.weight"), [640, 262144]);
    for s in &specs {
        let norm = s.gguf.contains("norm");
        assert_eq!(s.transform == Transform::AddOne, norm, "{}", s.gguf);
    }
}

/// The tensors a folder holds as stored are handed out as ranges of their safetensors file's
/// memory map (served from the page cache, not copied); the ones the reader converts (llama's
/// permuted Q/K rows, its RoPE factors, Gemma's `1 + w` norms) are owned.
#[test]
fn stored_tensors_are_shared_from_the_mapping_and_converted_ones_are_owned() {
    let converted = |arch: &str, name: &str| match arch {
        "llama3rope" => {
            name.contains(".attn_q.") || name.contains(".attn_k.") || name == "rope_freqs.weight"
        }
        _ => name.ends_with("norm.weight"),
    };
    for arch in ["llama3rope", "gemma2"] {
        let hf = open_folder(&fixture(arch).join("hf-f32")).unwrap();
        let mut shared = 0;
        for t in hf.tensors() {
            let mapped = hf.tensor_mapped(t).unwrap();
            assert_eq!(
                mapped.is_none(),
                converted(arch, &t.name),
                "{arch}: {}",
                t.name
            );
            if let Some(m) = mapped {
                let bytes = hf.tensor_bytes(t).unwrap();
                assert_eq!((m.as_ptr(), m.len()), (bytes.as_ptr(), bytes.len()));
                assert!(m.map().as_ptr_range().contains(&m.as_ptr()), "{}", t.name);
                shared += 1;
            }
        }
        assert!(shared > hf.tensors().len() / 2, "{arch}: {shared} shared");
    }
}
