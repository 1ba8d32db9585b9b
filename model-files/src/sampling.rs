//! The sampling a model's authors recommend, where the model says: a GGUF file's
//! `general.sampling.temp`, `general.sampling.top_p` and `general.sampling.top_k` keys (the names
//! llama.cpp's converter writes and llama-server seeds its defaults from), or a Hugging Face
//! folder's `generation_config.json` (`temperature`, `top_p`, `top_k`; the values vLLM takes as its
//! defaults).

use std::fmt;
use std::path::Path;

use gguf::GgufFile;
use serde_json::Value;

use crate::error::{ModelFileError, Result};
use crate::hf::config::{describe, read_json};

/// Where a [`RecommendedSampling`] was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplingSource {
    /// The GGUF file's `general.sampling.*` keys.
    GgufMetadata,
    /// The Hugging Face folder's `generation_config.json`.
    GenerationConfig,
}

impl SamplingSource {
    /// How the source is named to a person (`general.sampling.*` or `generation_config.json`).
    pub fn as_str(self) -> &'static str {
        match self {
            SamplingSource::GgufMetadata => "general.sampling.*",
            SamplingSource::GenerationConfig => "generation_config.json",
        }
    }
}

/// The recommended sampling parameters; a field the model does not give is `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct RecommendedSampling {
    /// Temperature (0 = greedy).
    pub temperature: Option<f32>,
    /// Nucleus mass in (0, 1].
    pub top_p: Option<f32>,
    /// Top-k (a value of 0 or below in the file means off and is read as `None`).
    pub top_k: Option<u32>,
    /// Where the values were read.
    pub source: SamplingSource,
}

impl fmt::Display for RecommendedSampling {
    /// `temperature=0.6 top_p=0.95 top_k=20 (generation_config.json)`, the fields given only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(t) = self.temperature {
            write!(f, "temperature={t} ")?;
        }
        if let Some(p) = self.top_p {
            write!(f, "top_p={p} ")?;
        }
        if let Some(k) = self.top_k {
            write!(f, "top_k={k} ")?;
        }
        write!(f, "({})", self.source.as_str())
    }
}

/// The recommendation of the model at `path` (already opened as `file`): `None` when it gives none.
///
/// Errors: an unreadable or malformed `generation_config.json` (`Io`, `Json`, `Key`, naming the
/// file), or a `general.sampling.*` key of the wrong type (`Gguf`).
pub fn recommended_sampling(path: &Path, file: &GgufFile) -> Result<Option<RecommendedSampling>> {
    if path.is_dir() {
        let config = path.join("generation_config.json");
        return match config.is_file() {
            true => from_generation_config(&config),
            false => Ok(None),
        };
    }
    let top_k = match file.metadata("general.sampling.top_k") {
        Some(v) => v.as_integer().ok_or_else(|| {
            ModelFileError::Gguf(gguf::GgufError::TypeMismatch {
                key: "general.sampling.top_k".into(),
                expected: "an integer",
                found: v.describe(),
            })
        })?,
        None => 0,
    };
    let found = RecommendedSampling {
        temperature: file.get_opt_f32("general.sampling.temp")?,
        top_p: file.get_opt_f32("general.sampling.top_p")?,
        top_k: positive(top_k),
        source: SamplingSource::GgufMetadata,
    };
    Ok(found.any().then_some(found))
}

/// Reads `temperature`, `top_p` and `top_k` of a `generation_config.json`.
fn from_generation_config(path: &Path) -> Result<Option<RecommendedSampling>> {
    let json = read_json(path)?;
    let key_error = |key: &str, expected: &str| ModelFileError::Key {
        path: path.to_path_buf(),
        key: key.to_string(),
        expected: expected.to_string(),
        found: describe(json.get(key)),
    };
    let number = |key: &str| match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(|x| Some(x as f32))
            .ok_or_else(|| key_error(key, "a number")),
    };
    let top_k = match json.get("top_k") {
        None | Some(Value::Null) => None,
        Some(v) => positive(v.as_i64().ok_or_else(|| key_error("top_k", "an integer"))?),
    };
    let found = RecommendedSampling {
        temperature: number("temperature")?,
        top_p: number("top_p")?,
        top_k,
        source: SamplingSource::GenerationConfig,
    };
    Ok(found.any().then_some(found))
}

/// `k` as a top-k, `None` for 0 and below (off).
fn positive(k: impl TryInto<u32>) -> Option<u32> {
    k.try_into().ok().filter(|&k| k > 0)
}

impl RecommendedSampling {
    fn any(&self) -> bool {
        self.temperature.is_some() || self.top_p.is_some() || self.top_k.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf::GgufWriter;

    /// A GGUF file holding only `general.architecture` and the keys `add` sets, opened.
    fn gguf_with(dir: &Path, add: impl FnOnce(&mut GgufWriter)) -> (std::path::PathBuf, GgufFile) {
        let path = dir.join("m.gguf");
        let mut w = GgufWriter::new();
        w.add_string("general.architecture", "llama");
        add(&mut w);
        w.write(&path).unwrap();
        let file = GgufFile::open(&path).unwrap();
        (path, file)
    }

    #[test]
    fn a_gguf_file_gives_its_general_sampling_keys() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = gguf_with(dir.path(), |_| {});
        assert_eq!(recommended_sampling(&path, &file).unwrap(), None);
        let (path, file) = gguf_with(dir.path(), |w| {
            w.add_f32("general.sampling.temp", 0.8)
                .add_f32("general.sampling.top_p", 0.9)
                .add_i32("general.sampling.top_k", 40);
        });
        let found = recommended_sampling(&path, &file).unwrap().unwrap();
        assert_eq!(
            found.to_string(),
            "temperature=0.8 top_p=0.9 top_k=40 (general.sampling.*)"
        );
        let (path, file) = gguf_with(dir.path(), |w| {
            w.add_string("general.sampling.top_k", "many");
        });
        let e = recommended_sampling(&path, &file).unwrap_err();
        assert!(e.to_string().contains("general.sampling.top_k"), "{e}");
    }

    #[test]
    fn a_folder_gives_its_generation_config() {
        let dir = tempfile::tempdir().unwrap();
        let (_, file) = gguf_with(dir.path(), |_| {});
        let folder = dir.path().join("folder");
        std::fs::create_dir(&folder).unwrap();
        assert_eq!(recommended_sampling(&folder, &file).unwrap(), None);
        let config = folder.join("generation_config.json");
        std::fs::write(
            &config,
            r#"{"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20}"#,
        )
        .unwrap();
        let found = recommended_sampling(&folder, &file).unwrap().unwrap();
        assert_eq!(
            found.to_string(),
            "temperature=0.6 top_p=0.95 top_k=20 (generation_config.json)"
        );
        std::fs::write(&config, r#"{"top_k": -1, "bos_token_id": 1}"#).unwrap();
        assert_eq!(recommended_sampling(&folder, &file).unwrap(), None);
        std::fs::write(&config, r#"{"temperature": "hot"}"#).unwrap();
        let e = recommended_sampling(&folder, &file).unwrap_err();
        assert!(e.to_string().contains("key `temperature`"), "{e}");
    }
}
