//! Writes the seed corpus of the fuzz targets (`fuzz/corpus/NAME/seed-*`) from the project's own
//! fixtures and test inputs: the tiny test model and its tokenizer, the tiny Hugging Face folders
//! of `fixtures/tiny-arch/`, the built-in chat templates, and requests and constraints like those
//! of the router's and structured-output's tests. Run it after changing a target's input format:
//! `cargo run -p fuzz --example write_seeds` (the `openai-json` seeds are the JSON bodies of the
//! router's tests, kept as they were written).

use std::path::{Path, PathBuf};

use gguf::{GgmlType, GgufFile, GgufWriter};
use inference_proto::public::{
    constraint::Kind, ChatMessage, ChoiceList, Constraint, GenerateRequest,
};
use inference_proto::worker::{router_message, AddRequest, RouterMessage, SamplingParams};
use prost::Message as _;
use router::chat_template::builtin_template;

fn main() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    gguf_seeds(&corpus.join("gguf"));
    model_files_seeds(&corpus.join("model-files"));
    generate_request_seeds(&corpus.join("generate-request"));
    detokenizer_seeds(&corpus.join("detokenizer"));
    chat_template_seeds(&corpus.join("chat-template"));
    constraint_seeds(&corpus.join("constraint"));
    router_stream_seeds(&corpus.join("router-stream"));
}

/// Writes `bytes` as `dir/seed-NAME`.
fn put(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).expect("the corpus folder is made");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("the seed is written");
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The tiny model itself, its metadata with one small tensor of each simple type, and a header
/// with the llama keys alone.
fn gguf_seeds(dir: &Path) {
    let tmp = std::env::temp_dir().join(format!("fuzz-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let tiny_path = tmp.join("tiny.gguf");
    gguf::testing::write_tiny_llama(&tiny_path, 1).unwrap();
    put(dir, "tiny-llama", &std::fs::read(&tiny_path).unwrap());

    let tiny = GgufFile::open(&tiny_path).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in tiny.metadata_entries() {
        w.add_metadata(key, value.clone());
    }
    let values: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) / 64.0).collect();
    for (name, dtype, n) in [
        ("t.f32", GgmlType::F32, 4),
        ("t.f16", GgmlType::F16, 8),
        ("t.q8_0", GgmlType::Q8_0, 32),
        ("t.q4_1", GgmlType::Q4_1, 32),
        ("t.q4_k", GgmlType::Q4_K, 256),
        ("t.q6_k", GgmlType::Q6_K, 256),
    ] {
        let _ = w.add_tensor_f32(name, &[n as u64], dtype, &values[..n]);
    }
    put(dir, "tiny-metadata-small-tensors", &bytes_of(&w));

    let mut w = GgufWriter::new();
    w.add_string("general.architecture", "llama")
        .add_u32("llama.block_count", 1)
        .add_u32("llama.embedding_length", 32)
        .add_u32("llama.attention.head_count", 2)
        .add_u32("llama.feed_forward_length", 64)
        .add_u32("llama.context_length", 64);
    put(dir, "llama-keys", &bytes_of(&w));
    let _ = std::fs::remove_dir_all(&tmp);
}

fn bytes_of(w: &GgufWriter) -> Vec<u8> {
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    bytes
}

/// One seed per replaceable file (the first byte picks it, see `fuzz::model_files`).
fn model_files_seeds(dir: &Path) {
    let tiny = repo().join("fixtures/tiny-arch");
    for arch in ["qwen2", "qwen3", "gemma2", "phi3", "llama3rope"] {
        let config = std::fs::read(tiny.join(arch).join("hf-bf16/config.json")).unwrap();
        put(
            dir,
            &format!("config-{arch}"),
            &[&[0u8][..], &config].concat(),
        );
    }
    let st = std::fs::read(tiny.join("qwen2/hf-bf16/model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&st[8..8 + header_len]).unwrap();
    put(
        dir,
        "safetensors-header",
        &[&[1u8][..], &st[..8 + header_len + 64]].concat(),
    );
    let weight_map: serde_json::Map<String, serde_json::Value> = header
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "__metadata__")
        .map(|k| (k.clone(), "model.safetensors".into()))
        .collect();
    let index = serde_json::json!({"metadata": {"total_size": st.len()}, "weight_map": weight_map});
    put(
        dir,
        "index",
        &[&[2u8][..], index.to_string().as_bytes()].concat(),
    );
    let spm = std::fs::read(tiny.join("qwen2/hf-bf16/tokenizer.model")).unwrap();
    put(
        dir,
        "tokenizer-model-start",
        &[&[3u8][..], &spm[..2048]].concat(),
    );
    let tc = std::fs::read(tiny.join("qwen2/hf-bf16/tokenizer_config.json")).unwrap();
    put(dir, "tokenizer-config", &[&[4u8][..], &tc].concat());
    let tokenizer_json = serde_json::json!({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
        "merges": ["a b"]}, "added_tokens": [{"id": 3, "content": "</s>", "special": true}]});
    put(
        dir,
        "tokenizer-json",
        &[&[5u8][..], tokenizer_json.to_string().as_bytes()].concat(),
    );
}

fn generate_request_seeds(dir: &Path) {
    let constraint = |kind| Some(Constraint { kind: Some(kind) });
    let requests = [
        (
            "prompt",
            GenerateRequest {
                prompt: "Hello there".into(),
                ..Default::default()
            },
        ),
        (
            "sampling",
            GenerateRequest {
                prompt: "the and in".into(),
                max_new_tokens: Some(9),
                temperature: 0.7,
                top_k: 40,
                top_p: Some(0.9),
                min_p: 0.1,
                repetition_penalty: 1.2,
                frequency_penalty: -0.5,
                presence_penalty: 0.5,
                logit_bias: [(42, -100.0), (7, 3.5)].into_iter().collect(),
                logprobs: true,
                top_logprobs: 2,
                seed: Some(5),
                stop: vec!["x".into(), "\n\n".into()],
                request_id: Some("r-1".into()),
                priority: Some(-1),
                cache_salt: Some("salt".into()),
                prompt_logprobs: Some(3),
                ..Default::default()
            },
        ),
        (
            "messages",
            GenerateRequest {
                messages: vec![
                    ChatMessage {
                        role: "system".into(),
                        content: "be brief".into(),
                        ..Default::default()
                    },
                    ChatMessage {
                        role: "user".into(),
                        content: "hi".into(),
                        ..Default::default()
                    },
                ],
                include_special_tokens: true,
                ..Default::default()
            },
        ),
        (
            "prompt-and-messages",
            GenerateRequest {
                prompt: "p".into(),
                messages: vec![ChatMessage {
                    role: "user".into(),
                    content: "q".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
        ),
        (
            "special-text",
            GenerateRequest {
                prompt: "<|im_start|>user\nhi<|im_end|>".into(),
                prompt_as_plain_text: true,
                ignore_eos: true,
                ..Default::default()
            },
        ),
        (
            "json-schema",
            GenerateRequest {
                prompt: "json".into(),
                constraint: constraint(Kind::JsonSchema(
                    r#"{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}"#
                        .into(),
                )),
                ..Default::default()
            },
        ),
        (
            "regex",
            GenerateRequest {
                prompt: "r".into(),
                constraint: constraint(Kind::Regex("[0-9]{3}-(ab|cd)".into())),
                ..Default::default()
            },
        ),
        (
            "lark",
            GenerateRequest {
                prompt: "l".into(),
                constraint: constraint(Kind::Lark("start: \"yes\" | \"no\"".into())),
                ..Default::default()
            },
        ),
        (
            "choice",
            GenerateRequest {
                prompt: "c".into(),
                constraint: constraint(Kind::Choice(ChoiceList {
                    choices: vec!["a".into(), "b".into()],
                })),
                ..Default::default()
            },
        ),
        (
            "json-object",
            GenerateRequest {
                prompt: "o".into(),
                constraint: constraint(Kind::JsonObject(true)),
                ..Default::default()
            },
        ),
    ];
    for (name, request) in requests {
        put(dir, name, &request.encode_to_vec());
    }
}

fn detokenizer_seeds(dir: &Path) {
    let tokenizer = &fuzz::tiny_model::model().tokenizer;
    let texts = [
        ("ascii", "Hello world, the and in the end", 0u8, vec![]),
        (
            "utf8",
            "héllo 日本語 🎉 ﷺ",
            0,
            vec![(1u8, 3u8, b"\xe6\x97\xa5".to_vec())],
        ),
        (
            "special",
            "<|im_start|>user\nhi<|im_end|>",
            1,
            vec![(0, 2, 4)]
                .into_iter()
                .map(|(k, a, b)| (k, a, vec![b]))
                .collect(),
        ),
        (
            "stops",
            "the and the and stop here",
            0,
            vec![(0, 4, 2), (0, 8, 7), (1, 0, 3)]
                .into_iter()
                .map(|(k, a, b)| (k, a, vec![b]))
                .collect(),
        ),
    ];
    for (name, text, skip, stops) in texts {
        let ids = tokenizer.encode(text, false).unwrap();
        let mut bytes = vec![skip | ((stops.len() as u8) << 1)];
        for (kind, a, b) in stops {
            bytes.extend([kind, a]);
            match kind % 2 {
                0 => bytes.push(b[0]),
                _ => {
                    bytes.push(b.len() as u8 - 1);
                    bytes.extend(&b);
                }
            }
        }
        for id in ids {
            bytes.extend((id as u16).to_le_bytes());
        }
        put(dir, name, &bytes);
    }
}

fn chat_template_seeds(dir: &Path) {
    let message = |role: u8, content: &str| {
        let mut m = vec![role, content.len() as u8];
        m.extend(content.as_bytes());
        m
    };
    let conversation = [
        vec![0u8],
        message(0, "Be brief."),
        message(1, "Hi there"),
        message(2, "Hello! How can I help?"),
        message(1, "日本語で"),
    ]
    .concat();
    put(dir, "conversation", &conversation);
    let mut tools = vec![0u8];
    tools.extend(message(1, "weather?"));
    tools.extend([0x12, 0, 11]);
    tools.extend(b"get_weather");
    tools.push(16);
    tools.extend(br#"{"city":"Paris"}"#);
    tools.extend([0x23, 5]);
    tools.extend(b"sunny");
    tools.push(6);
    tools.extend(b"call_0");
    put(dir, "tool-call", &tools);
    for arch in ["gemma3", "qwen2", "llama", "phi3"] {
        let t = builtin_template(arch, |_| true).unwrap();
        put(
            dir,
            &format!("source-{}", t.name),
            &[&[1u8][..], t.source.as_bytes()].concat(),
        );
    }
    put(
        dir,
        "source-smollm2",
        &[&[1u8][..], gguf::testing::SMOLLM2_CHAT_TEMPLATE.as_bytes()].concat(),
    );
}

fn constraint_seeds(dir: &Path) {
    let seeds: [(&str, u8, &str); 12] = [
        (
            "schema-object",
            0,
            r#"{"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":9},"s":{"type":"string","maxLength":4}},"required":["n"]}"#,
        ),
        (
            "schema-ref",
            0,
            r##"{"$defs":{"a":{"type":"array","items":{"$ref":"#/$defs/a"}}},"$ref":"#/$defs/a"}"##,
        ),
        (
            "schema-anyof",
            0,
            r#"{"anyOf":[{"type":"string","enum":["x","y"]},{"type":"number"},{"const":null}]}"#,
        ),
        (
            "schema-bad-bounds",
            0,
            r#"{"type":"integer","minimum":5,"maximum":1}"#,
        ),
        ("regex-digits", 1, "[0-9]{3}-(ab|cd)"),
        ("regex-repeat", 1, "(ab|cd)+x"),
        ("regex-unicode", 1, r"[^\x00-\x{10FFFF}]"),
        ("lark-yes-no", 2, "start: \"yes\" | \"no\""),
        (
            "lark-rules",
            2,
            "start: item (\",\" item)*\nitem: /[a-z]+/ | NUMBER\nNUMBER: /[0-9]+/",
        ),
        ("lark-recursive", 2, "start: x\nx: x"),
        ("choice", 3, "red\0green\0blue"),
        ("choice-empty", 3, "a\0\0b"),
    ];
    for (name, kind, text) in seeds {
        put(dir, name, &[&[kind][..], text.as_bytes()].concat());
    }
}

/// One `add` of the `router-stream` input format (see `fuzz::router_stream`): the flags byte, the
/// id's index, the prompt (a count byte below 32, then one token byte each), the `max_new_tokens`
/// byte and the bytes of the parts the flags choose.
fn add_op(flags: u8, id: u8, prompt: &[u8], max_new_tokens: u8, parts: &[u8]) -> Vec<u8> {
    let mut op = vec![0, flags, id, prompt.len() as u8];
    op.extend(prompt);
    op.push(max_new_tokens);
    op.extend(parts);
    op
}

/// Sampling parts: seed 7, greedy (`0`) or seeded (`1`, no top logprobs).
const GREEDY: [u8; 3] = [7, 0, 0];
const SEEDED: [u8; 4] = [7, 0, 1, 0];
/// A `cancel` of id `i`, a message of no kind, a pause.
const fn cancel(i: u8) -> [u8; 2] {
    [3, i]
}
const NO_KIND: u8 = 5;
const PAUSE: u8 = 6;

/// Router message sequences: requests that finish, cancels of running and unknown ids, duplicate
/// ids, out-of-range ids, zero `max_new_tokens`, a huge prompt, bad sampling parameters,
/// constraints, a pool filled past its KV blocks, and an encoded message through the raw path.
fn router_stream_seeds(dir: &Path) {
    let prompt: &[u8] = &[10, 20, 30, 40, 50];
    let long: Vec<u8> = (0..31).map(|i| 65 + i).collect();
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "greedy",
            [add_op(1, 0, prompt, 8, &GREEDY), vec![PAUSE]].concat(),
        ),
        (
            "seeded-two",
            [
                add_op(1, 0, prompt, 12, &SEEDED),
                add_op(1, 1, prompt, 12, &SEEDED),
            ]
            .concat(),
        ),
        (
            "cancel-running",
            [
                add_op(1, 1, prompt, 200, &GREEDY),
                vec![PAUSE],
                cancel(1).to_vec(),
            ]
            .concat(),
        ),
        (
            "cancel-unknown",
            [cancel(3).to_vec(), vec![NO_KIND]].concat(),
        ),
        (
            "duplicate-id",
            [
                add_op(1, 0, &long, 200, &GREEDY),
                add_op(1, 0, prompt, 4, &GREEDY),
                cancel(0).to_vec(),
            ]
            .concat(),
        ),
        ("empty-id", add_op(1, 5, prompt, 4, &GREEDY)),
        (
            "out-of-vocab",
            add_op(1, 2, &[10, 241, 243, 244], 4, &GREEDY),
        ),
        ("zero-max-new-tokens", add_op(1, 0, prompt, 0, &GREEDY)),
        ("no-sampling", add_op(0, 0, prompt, 4, &[])),
        ("past-context", add_op(1, 0, &long, 202, &GREEDY)),
        // A 100,256-token prompt (count 204) with u32::MAX (243) at index 5, 4 new tokens.
        ("huge-prompt", vec![0, 0x81, 0, 204, 5, 0, 243, 4, 7, 0, 0]),
        (
            "bad-sampling",
            add_op(
                1,
                0,
                prompt,
                4,
                &[7, 0, 2, 8, 4, 5, 5, 9, 6, 7, 2, 241, 8, 0, 9, 31],
            ),
        ),
        (
            "constraint-choice",
            add_op(1 | 4 | 8, 0, prompt, 16, &[7, 0, 0, 1, 2, 0]),
        ),
        (
            "constraint-no-stop",
            add_op(1 | 8, 0, prompt, 16, &[7, 0, 0, 1]),
        ),
        (
            "constraint-invalid",
            add_op(1 | 4 | 8, 0, prompt, 16, &[7, 0, 0, 1, 2, 6]),
        ),
        (
            "generated-ids",
            add_op(1 | 2, 0, prompt, 8, &[7, 0, 0, 3, 11, 12, 241]),
        ),
        (
            "prompt-logprobs",
            add_op(1 | 16, 0, prompt, 4, &[7, 0, 1, 0, 5]),
        ),
        (
            "priority-salt",
            add_op(1 | 32 | 64, 0, prompt, 4, &[7, 0, 0, 3, 2, 1]),
        ),
        (
            "fill-kv",
            [
                add_op(1, 0, &long, 200, &SEEDED),
                add_op(1, 1, &long, 200, &SEEDED),
                add_op(1, 2, &long, 200, &SEEDED),
                add_op(1, 3, &long, 200, &SEEDED),
                vec![PAUSE],
                cancel(2).to_vec(),
            ]
            .concat(),
        ),
    ];
    for (name, bytes) in seeds {
        put(dir, name, &bytes);
    }
    let raw = RouterMessage {
        kind: Some(router_message::Kind::Add(AddRequest {
            request_id: "r0".into(),
            prompt_ids: vec![10, 20, 30],
            sampling: Some(SamplingParams {
                top_p: 1.0,
                ..Default::default()
            }),
            max_new_tokens: 4,
            ..Default::default()
        })),
    }
    .encode_to_vec();
    put(
        dir,
        "raw-add",
        &[&[4, raw.len() as u8][..], &raw, &[PAUSE]].concat(),
    );
}
