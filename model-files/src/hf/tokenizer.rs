//! The tokenizer of a Hugging Face folder as GGUF `tokenizer.*` metadata, built as llama.cpp's
//! converter builds it: the vocabulary from `tokenizer.model` (SentencePiece) when present, else
//! from `tokenizer.json`, padded with `[PAD{id}]` tokens up to `vocab_size`; special ids, BOS/EOS
//! flags and the chat template from `tokenizer_config.json` (or `chat_template.jinja`) and
//! `config.json`.
//!
//! One key is this project's own: `tokenizer.ggml.eos_token_ids`, every end-of-generation id
//! the folder declares (`config.json` `eos_token_id` may be a list, e.g. Llama 3.1's
//! `[128001, 128008, 128009]`; GGUF has room for one `eos_token_id` only).

use std::path::{Path, PathBuf};

use gguf::{MetadataArray, MetadataValue};
use serde_json::Value;

use super::arch::Arch;
use super::config::{describe, read_json, HfConfig};
use super::sentencepiece::read_pieces;
use crate::error::{ModelFileError, Result};

/// The SentencePiece model file.
pub const SPM_FILE: &str = "tokenizer.model";
/// The `tokenizers` library's file.
pub const JSON_FILE: &str = "tokenizer.json";
/// Special tokens, flags and the chat template.
pub const CONFIG_FILE: &str = "tokenizer_config.json";
/// The chat template as a file of its own (transformers >= 4.43).
pub const TEMPLATE_FILE: &str = "chat_template.jinja";

/// GGUF token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// A vocabulary in GGUF form.
#[derive(Debug, Default)]
struct Vocab {
    model: &'static str,
    tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i32>,
    merges: Vec<String>,
}

impl Vocab {
    fn set(&mut self, id: usize, text: String, score: Option<f32>, ty: i32) {
        if id >= self.tokens.len() {
            self.tokens.resize_with(id + 1, String::new);
            self.types.resize(id + 1, UNUSED);
            if !self.scores.is_empty() {
                self.scores.resize(id + 1, -10000.0);
            }
        }
        self.tokens[id] = text;
        self.types[id] = ty;
        if let Some(s) = score {
            self.scores[id] = s;
        }
    }

    /// Fills unset ids and pads to `vocab_size` with `[PAD{id}]`, unused (the converter's
    /// padding); ids past `vocab_size` (which the model cannot produce) are dropped.
    fn pad(&mut self, vocab_size: usize) {
        self.tokens.truncate(vocab_size);
        self.types.truncate(vocab_size);
        self.scores.truncate(vocab_size);
        if self.tokens.len() < vocab_size {
            self.tokens.resize_with(vocab_size, String::new);
            self.types.resize(vocab_size, UNUSED);
            if !self.scores.is_empty() {
                self.scores.resize(vocab_size, -10000.0);
            }
        }
        for (id, t) in self.tokens.iter_mut().enumerate() {
            if t.is_empty() {
                *t = format!("[PAD{id}]");
            }
        }
    }

    fn id(&self, text: &str) -> Option<u32> {
        self.tokens.iter().position(|t| t == text).map(|i| i as u32)
    }
}

/// The folder's tokenizer metadata (`tokenizer.*` keys) and where its vocabulary came from.
#[derive(Debug)]
pub struct FolderTokenizer {
    /// GGUF `tokenizer.*` key/value pairs.
    pub metadata: Vec<(String, MetadataValue)>,
    /// The file the vocabulary came from.
    pub source: PathBuf,
}

/// Reads the tokenizer files of `dir` for a model of `vocab_size` ids.
///
/// Errors: `MissingFile` when neither `tokenizer.model` nor `tokenizer.json` exists; `Io`,
/// `Json`; `Tokenizer` for an undecodable `tokenizer.model` or a `tokenizer.json` without a
/// vocabulary; `Key` for a mistyped `tokenizer_config.json` value.
pub fn read(
    dir: &Path,
    arch: Arch,
    config: &HfConfig,
    vocab_size: usize,
) -> Result<FolderTokenizer> {
    let spm = dir.join(SPM_FILE);
    let json = dir.join(JSON_FILE);
    let tok_config = match dir.join(CONFIG_FILE) {
        p if p.is_file() => Some((read_json(&p)?, p)),
        _ => None,
    };
    let added_decoder = tok_config
        .as_ref()
        .and_then(|(v, _)| v.get("added_tokens_decoder"))
        .and_then(Value::as_object);
    let (mut vocab, source) = if spm.is_file() {
        let bytes = std::fs::read(&spm).map_err(|source| ModelFileError::Io {
            path: spm.clone(),
            source,
        })?;
        let pieces = read_pieces(&bytes).map_err(|message| ModelFileError::Tokenizer {
            path: spm.clone(),
            message,
        })?;
        let mut v = Vocab {
            model: "llama",
            ..Vocab::default()
        };
        for p in pieces.into_iter().take(vocab_size) {
            v.tokens.push(p.text);
            v.scores.push(p.score);
            v.types.push(p.token_type);
        }
        let added = dir.join("added_tokens.json");
        if added.is_file() {
            if let Value::Object(map) = read_json(&added)? {
                for (text, id) in map {
                    match id.as_u64().map(|i| i as usize) {
                        Some(id) if id < vocab_size => v.set(id, text, Some(-1000.0), USER_DEFINED),
                        _ => {}
                    }
                }
            }
        }
        (v, spm)
    } else if json.is_file() {
        (
            vocab_from_json(&json, &read_json(&json)?, vocab_size)?,
            json,
        )
    } else {
        return Err(ModelFileError::MissingFile {
            path: json,
            what: "the tokenizer: tokenizer.json or tokenizer.model",
        });
    };
    if let Some(decoder) = added_decoder {
        for (id, data) in decoder {
            let (Ok(id), Some(text)) = (
                id.parse::<usize>(),
                data.get("content").and_then(Value::as_str),
            ) else {
                continue;
            };
            if id >= vocab_size {
                continue;
            }
            let special = data
                .get("special")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let (text, ty) = match special {
                true => (text.to_string(), CONTROL),
                false => (text.replace('\u{2581}', " "), USER_DEFINED),
            };
            vocab.set(id, text, None, ty);
        }
    }
    vocab.pad(vocab_size);

    let mut meta: Vec<(String, MetadataValue)> = Vec::new();
    let mut put = |k: &str, v: MetadataValue| meta.push((format!("tokenizer.{k}"), v));
    let string = |s: &str| MetadataValue::String(s.to_string());
    put("ggml.model", string(vocab.model));
    put("ggml.pre", string("default"));
    // Special ids: the token named in tokenizer_config.json, else config.json's id.
    let tc = tok_config.as_ref();
    let named = |key: &str| -> Result<Option<u32>> {
        let Some((v, path)) = tc else { return Ok(None) };
        match v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(vocab.id(s)),
            Some(Value::Object(o)) => Ok(o
                .get("content")
                .and_then(Value::as_str)
                .and_then(|s| vocab.id(s))),
            Some(other) => Err(ModelFileError::Key {
                path: path.clone(),
                key: key.into(),
                expected: "a token string or an object with `content`".into(),
                found: describe(Some(other)),
            }),
        }
    };
    let flag = |key: &str| -> Result<Option<bool>> {
        let Some((v, path)) = tc else { return Ok(None) };
        match v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(ModelFileError::Key {
                path: path.clone(),
                key: key.into(),
                expected: "true or false".into(),
                found: describe(Some(other)),
            }),
        }
    };
    let in_vocab = |id: u32| (id as usize) < vocab.tokens.len();
    let config_eos = config.token_ids("eos_token_id")?;
    let bos = named("bos_token")?.or(config.token_ids("bos_token_id")?.first().copied());
    let eos = named("eos_token")?.or(config_eos.first().copied());
    let pad = config
        .token_ids("pad_token_id")?
        .first()
        .copied()
        .or(named("pad_token")?);
    let mut all_eos: Vec<u32> = eos
        .into_iter()
        .chain(config_eos)
        .filter(|&i| in_vocab(i))
        .collect();
    all_eos.sort_unstable();
    all_eos.dedup();
    put(
        "ggml.tokens",
        MetadataValue::Array(MetadataArray::String(vocab.tokens.clone())),
    );
    if !vocab.scores.is_empty() {
        put(
            "ggml.scores",
            MetadataValue::Array(MetadataArray::F32(vocab.scores.clone())),
        );
    }
    put(
        "ggml.token_type",
        MetadataValue::Array(MetadataArray::I32(vocab.types.clone())),
    );
    if !vocab.merges.is_empty() {
        put(
            "ggml.merges",
            MetadataValue::Array(MetadataArray::String(vocab.merges.clone())),
        );
    }
    for (key, id) in [("bos", bos), ("eos", eos), ("padding", pad)] {
        if let Some(id) = id.filter(|&i| in_vocab(i)) {
            put(&format!("ggml.{key}_token_id"), MetadataValue::U32(id));
        }
    }
    if !all_eos.is_empty() {
        put(
            "ggml.eos_token_ids",
            MetadataValue::Array(MetadataArray::U32(all_eos)),
        );
    }
    for key in ["add_bos_token", "add_eos_token"] {
        if let Some(b) = flag(key)? {
            put(&format!("ggml.{key}"), MetadataValue::Bool(b));
        }
    }
    if vocab.model == "llama" && matches!(arch, Arch::Gemma2 | Arch::Gemma3) {
        put("ggml.add_space_prefix", MetadataValue::Bool(false));
    }
    if let Some(template) = chat_template(dir, tc)? {
        put("chat_template", MetadataValue::String(template));
    }
    Ok(FolderTokenizer {
        metadata: meta,
        source,
    })
}

/// `tokenizer_config.json`'s `chat_template` (a string, or a list of `{name, template}` of which
/// the one named `default` is taken), else `chat_template.jinja`.
fn chat_template(dir: &Path, tc: Option<&(Value, PathBuf)>) -> Result<Option<String>> {
    if let Some((v, path)) = tc {
        match v.get("chat_template") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => return Ok(Some(s.clone())),
            Some(Value::Array(list)) => {
                let named = |n: &str| {
                    list.iter()
                        .find(|t| t.get("name").and_then(Value::as_str) == Some(n))
                };
                if let Some(t) = named("default")
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                {
                    return Ok(Some(t.to_string()));
                }
            }
            Some(other) => {
                return Err(ModelFileError::Key {
                    path: path.clone(),
                    key: "chat_template".into(),
                    expected: "a string or a list of {name, template}".into(),
                    found: describe(Some(other)),
                })
            }
        }
    }
    let file = dir.join(TEMPLATE_FILE);
    if file.is_file() {
        return std::fs::read_to_string(&file)
            .map(Some)
            .map_err(|source| ModelFileError::Io { path: file, source });
    }
    Ok(None)
}

/// The vocabulary of a `tokenizer.json`: `model.vocab` (an object of token → id for BPE, a list
/// of `[piece, score]` for Unigram) plus `added_tokens`, and BPE `model.merges` (strings
/// `"a b"` or pairs `["a", "b"]`). Ids from `vocab_size` on, which the model cannot produce, are
/// left out.
fn vocab_from_json(path: &Path, v: &Value, vocab_size: usize) -> Result<Vocab> {
    let bad = |message: &str| ModelFileError::Tokenizer {
        path: path.to_path_buf(),
        message: message.to_string(),
    };
    let model = v.get("model").ok_or_else(|| bad("no `model` object"))?;
    let mut vocab = Vocab::default();
    match model.get("vocab") {
        Some(Value::Object(map)) => {
            vocab.model = "gpt2";
            for (text, id) in map {
                let id = id
                    .as_u64()
                    .ok_or_else(|| bad("`model.vocab` ids must be integers"))?;
                if (id as usize) < vocab_size {
                    vocab.set(id as usize, text.clone(), None, NORMAL);
                }
            }
        }
        Some(Value::Array(list)) => {
            vocab.model = "llama";
            vocab.scores = Vec::with_capacity(list.len());
            for (id, entry) in list.iter().enumerate().take(vocab_size) {
                let (Some(text), Some(score)) = (
                    entry.get(0).and_then(Value::as_str),
                    entry.get(1).and_then(Value::as_f64),
                ) else {
                    return Err(bad("`model.vocab` entries must be [piece, score]"));
                };
                vocab.set(id, text.to_string(), Some(score as f32), NORMAL);
            }
        }
        _ => return Err(bad("no `model.vocab`")),
    }
    if let Some(Value::Array(merges)) = model.get("merges") {
        for m in merges {
            match m {
                Value::String(s) => vocab.merges.push(s.clone()),
                Value::Array(pair) if pair.len() == 2 => {
                    let part = |i: usize| pair[i].as_str().unwrap_or_default();
                    vocab.merges.push(format!("{} {}", part(0), part(1)));
                }
                _ => return Err(bad("`model.merges` entries must be \"a b\" or [a, b]")),
            }
        }
    }
    if let Some(Value::Array(added)) = v.get("added_tokens") {
        for t in added {
            let (Some(id), Some(text)) = (
                t.get("id").and_then(Value::as_u64),
                t.get("content").and_then(Value::as_str),
            ) else {
                return Err(bad("`added_tokens` entries need `id` and `content`"));
            };
            if id as usize >= vocab_size {
                continue;
            }
            let special = t.get("special").and_then(Value::as_bool).unwrap_or(false);
            vocab.set(
                id as usize,
                text.to_string(),
                None,
                if special { CONTROL } else { USER_DEFINED },
            );
        }
    }
    Ok(vocab)
}
