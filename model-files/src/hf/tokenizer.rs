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

/// `tokenizer_config.json`, when the folder has one.
struct TokConfig {
    value: Value,
    path: PathBuf,
}

impl TokConfig {
    fn read(dir: &Path) -> Result<Option<TokConfig>> {
        let path = dir.join(CONFIG_FILE);
        if !path.is_file() {
            return Ok(None);
        }
        Ok(Some(TokConfig {
            value: read_json(&path)?,
            path,
        }))
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.value.get(key).filter(|v| !v.is_null())
    }

    fn bad(&self, key: &str, expected: &str) -> ModelFileError {
        ModelFileError::Key {
            path: self.path.clone(),
            key: key.into(),
            expected: expected.into(),
            found: describe(self.get(key)),
        }
    }

    /// The id of the token `key` names (`"<s>"` or `{"content": "<s>", ...}`), if in `vocab`.
    fn token(&self, key: &str, vocab: &Vocab) -> Result<Option<u32>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(vocab.id(s)),
            Some(Value::Object(o)) => Ok(o
                .get("content")
                .and_then(Value::as_str)
                .and_then(|s| vocab.id(s))),
            Some(_) => Err(self.bad(key, "a token string or an object with `content`")),
        }
    }

    fn flag(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.bad(key, "true or false")),
        }
    }

    /// `added_tokens_decoder` (id → `{content, special}`): special tokens become control tokens,
    /// the others user-defined with `▁` read as a space (the converter's rule).
    fn apply_added_tokens(&self, vocab: &mut Vocab, vocab_size: usize) {
        let Some(decoder) = self.get("added_tokens_decoder").and_then(Value::as_object) else {
            return;
        };
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
            let special = data.get("special").and_then(Value::as_bool) == Some(true);
            let (text, ty) = match special {
                true => (text.to_string(), CONTROL),
                false => (text.replace('\u{2581}', " "), USER_DEFINED),
            };
            vocab.set(id, text, None, ty);
        }
    }
}

/// The pieces of `tokenizer.model` (up to `vocab_size`), with `added_tokens.json`'s tokens.
fn spm_vocab(dir: &Path, path: &Path, vocab_size: usize) -> Result<Vocab> {
    let bytes = std::fs::read(path).map_err(|source| ModelFileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let pieces = read_pieces(&bytes).map_err(|e| ModelFileError::Tokenizer {
        path: path.to_path_buf(),
        message: e.to_string(),
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
    Ok(v)
}

/// Reads the tokenizer files of `dir` for a model of `vocab_size` ids.
///
/// Errors: `MissingFile` when neither `tokenizer.model` nor `tokenizer.json` exists; `Io`,
/// `Json`; `Tokenizer` for an undecodable `tokenizer.model` or a `tokenizer.json` without a
/// vocabulary; `Key` for a mistyped `tokenizer_config.json` or `config.json` value.
pub fn read(
    dir: &Path,
    arch: Arch,
    config: &HfConfig,
    vocab_size: usize,
) -> Result<FolderTokenizer> {
    let (spm, json) = (dir.join(SPM_FILE), dir.join(JSON_FILE));
    let tc = TokConfig::read(dir)?;
    let (mut vocab, source) = if spm.is_file() {
        (spm_vocab(dir, &spm, vocab_size)?, spm)
    } else if json.is_file() {
        let v = read_json(&json)?;
        (vocab_from_json(&json, &v, vocab_size)?, json)
    } else {
        return Err(ModelFileError::MissingFile {
            path: json,
            what: "the tokenizer: tokenizer.json or tokenizer.model",
        });
    };
    if let Some(tc) = &tc {
        tc.apply_added_tokens(&mut vocab, vocab_size);
    }
    vocab.pad(vocab_size);

    // Special ids: the token tokenizer_config.json names, else config.json's id (the first of a
    // list); every id of config.json's `eos_token_id` ends a generation.
    let named = |key: &str| tc.as_ref().map_or(Ok(None), |tc| tc.token(key, &vocab));
    let in_vocab = |id: &u32| (*id as usize) < vocab_size; // the padded vocabulary's length
    let config_eos = config.token_ids("eos_token_id")?;
    let bos = named("bos_token")?.or(config.token_ids("bos_token_id")?.first().copied());
    let eos = named("eos_token")?.or(config_eos.first().copied());
    let pad = match config.token_ids("pad_token_id")?.first() {
        Some(&id) => Some(id),
        None => named("pad_token")?,
    };
    let mut all_eos: Vec<u32> = eos.into_iter().chain(config_eos).filter(in_vocab).collect();
    all_eos.sort_unstable();
    all_eos.dedup();
    let flags = match &tc {
        Some(tc) => [tc.flag("add_bos_token")?, tc.flag("add_eos_token")?],
        None => [None, None],
    };
    let template = chat_template(dir, tc.as_ref())?;

    let mut meta: Vec<(String, MetadataValue)> = Vec::new();
    let mut put = |k: &str, v: MetadataValue| meta.push((format!("tokenizer.{k}"), v));
    let array = MetadataValue::Array;
    put("ggml.model", MetadataValue::String(vocab.model.into()));
    put("ggml.pre", MetadataValue::String("default".into()));
    put("ggml.tokens", array(MetadataArray::String(vocab.tokens)));
    if !vocab.scores.is_empty() {
        put("ggml.scores", array(MetadataArray::F32(vocab.scores)));
    }
    put("ggml.token_type", array(MetadataArray::I32(vocab.types)));
    if !vocab.merges.is_empty() {
        put("ggml.merges", array(MetadataArray::String(vocab.merges)));
    }
    for (key, id) in [("bos", bos), ("eos", eos), ("padding", pad)] {
        if let Some(id) = id.filter(in_vocab) {
            put(&format!("ggml.{key}_token_id"), MetadataValue::U32(id));
        }
    }
    if !all_eos.is_empty() {
        put("ggml.eos_token_ids", array(MetadataArray::U32(all_eos)));
    }
    for (key, flag) in ["add_bos_token", "add_eos_token"].iter().zip(flags) {
        if let Some(b) = flag {
            put(&format!("ggml.{key}"), MetadataValue::Bool(b));
        }
    }
    if vocab.model == "llama" && matches!(arch, Arch::Gemma2 | Arch::Gemma3) {
        put("ggml.add_space_prefix", MetadataValue::Bool(false));
    }
    if let Some(template) = template {
        put("chat_template", MetadataValue::String(template));
    }
    Ok(FolderTokenizer {
        metadata: meta,
        source,
    })
}

/// `tokenizer_config.json`'s `chat_template` (a string, or a list of `{name, template}` of which
/// the one named `default` is taken), else `chat_template.jinja`.
fn chat_template(dir: &Path, tc: Option<&TokConfig>) -> Result<Option<String>> {
    if let Some(tc) = tc {
        match tc.get("chat_template") {
            None => {}
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
            Some(_) => {
                return Err(tc.bad("chat_template", "a string or a list of {name, template}"))
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
