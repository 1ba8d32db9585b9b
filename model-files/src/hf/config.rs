//! `config.json` of a Hugging Face model folder: typed look-ups whose errors name the file and
//! the key, and the RoPE parameters gathered as llama.cpp's converter gathers them (the
//! transformers 5 `rope_parameters`, or the legacy `rope_theta` / `rope_scaling` keys).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{ModelFileError, Result};

/// A parsed `config.json` (a multimodal config's `text_config` merged over its root, as the
/// converter does).
#[derive(Debug, Clone)]
pub struct HfConfig {
    path: PathBuf,
    map: Map<String, Value>,
}

/// Reads a JSON file into a value. Errors: `Io`, `Json` (both naming `path`).
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelFileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ModelFileError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// A short description of a JSON value for error messages.
pub(crate) fn describe(v: Option<&Value>) -> String {
    match v {
        None => "nothing".into(),
        Some(Value::String(s)) if s.len() > 40 => format!("a string of {} bytes", s.len()),
        Some(v) => v.to_string(),
    }
}

impl HfConfig {
    /// Reads `dir/config.json`. Errors: `MissingFile`, `Io`, `Json` (also for a non-object).
    pub fn read(dir: &Path) -> Result<HfConfig> {
        let path = dir.join("config.json");
        if !path.is_file() {
            return Err(ModelFileError::MissingFile {
                path,
                what: "the model's config.json",
            });
        }
        let Value::Object(mut map) = read_json(&path)? else {
            return Err(ModelFileError::Json {
                path,
                message: "expected an object at the top level".into(),
            });
        };
        if let Some(Value::Object(text)) = map.remove("text_config") {
            map.extend(text);
        }
        Ok(HfConfig { path, map })
    }

    /// Builds a config from an object (tests).
    #[cfg(test)]
    pub fn from_value(path: PathBuf, v: Value) -> HfConfig {
        let Value::Object(map) = v else {
            panic!("not an object")
        };
        HfConfig { path, map }
    }

    /// The `config.json` path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw value of `key`, `None` when absent or `null`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// An error for `key` holding something other than `expected`.
    pub fn bad(&self, key: &str, expected: &str) -> ModelFileError {
        ModelFileError::Key {
            path: self.path.clone(),
            key: key.to_string(),
            expected: expected.to_string(),
            found: describe(self.get(key)),
        }
    }

    /// `key` as a positive integer. Errors: `Key` when absent, not an integer, or 0.
    pub fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| self.bad(key, "a positive integer"))
    }

    /// `key` as a positive integer, `None` when absent or null. Errors: `Key` for other values.
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(self.bad(key, "a positive integer")),
            },
        }
    }

    /// The first of `keys` present, as a positive integer (the converter's `find_hparam`).
    /// Errors: `Key` naming the first key when none is present.
    pub fn first_usize(&self, keys: &[&str]) -> Result<usize> {
        for key in keys {
            if let Some(v) = self.opt_usize(key)? {
                return Ok(v);
            }
        }
        self.usize(keys[0])
    }

    /// `key` as a finite number, `None` when absent or null. Errors: `Key` for other values.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(self.bad(key, "a number")),
            },
        }
    }

    /// `key` as a finite number. Errors: `Key` when absent or not a number.
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?.ok_or_else(|| self.bad(key, "a number"))
    }

    /// `key` as a bool, `None` when absent or null. Errors: `Key` for other values.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.bad(key, "true or false")),
        }
    }

    /// `key` as a string, `None` when absent or null. Errors: `Key` for other values.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.bad(key, "a string")),
        }
    }

    /// The token ids of `key` (an integer or a list of integers), empty when absent.
    /// Errors: `Key` for other values.
    pub fn token_ids(&self, key: &str) -> Result<Vec<u32>> {
        let id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(id)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| self.bad(key, "a token id or a list of token ids")),
            Some(v) => id(v)
                .map(|i| vec![i])
                .ok_or_else(|| self.bad(key, "a token id or a list of token ids")),
        }
    }

    /// The RoPE parameters of the global (full-attention) layers, and the local base when the
    /// config gives one. Errors: `Key` for mistyped values.
    pub fn rope(&self) -> Result<RopeParams> {
        // transformers 5 writes `rope_parameters` (per layer type for Gemma 3); older configs
        // `rope_theta` plus an optional `rope_scaling` object.
        let section = self.get("rope_parameters").or(self.get("rope_scaling"));
        let (key, params) = match section {
            None => ("rope_parameters", Map::new()),
            Some(Value::Object(m)) => {
                let key = match self.get("rope_parameters") {
                    Some(_) => "rope_parameters",
                    None => "rope_scaling",
                };
                (key, m.clone())
            }
            Some(_) => return Err(self.bad("rope_parameters", "an object")),
        };
        let by_layer_type = params.contains_key("full_attention");
        let (global_key, global) = match params.get("full_attention") {
            Some(Value::Object(m)) => (format!("{key}.full_attention"), m.clone()),
            Some(_) => return Err(self.bad(key, "an object of objects per layer type")),
            None => (key.to_string(), params.clone()),
        };
        let sub = HfConfig {
            path: self.path.clone(),
            map: global,
        };
        let nested = |k: &str| format!("{global_key}.{k}");
        let rebadge = |e: ModelFileError, k: &str| match e {
            ModelFileError::Key {
                path,
                expected,
                found,
                ..
            } => ModelFileError::Key {
                path,
                key: nested(k),
                expected,
                found,
            },
            other => other,
        };
        let num = |k: &str| sub.opt_f64(k).map_err(|e| rebadge(e, k));
        let local_theta = match params.get("sliding_attention") {
            Some(Value::Object(m)) => m.get("rope_theta").and_then(Value::as_f64),
            _ if by_layer_type => None,
            _ => [
                "local_rope_theta",
                "rope_local_theta",
                "rope_theta_local",
                "swa_rope_theta",
                "rope_local_base_freq",
            ]
            .iter()
            .find_map(|k| self.get(k).and_then(Value::as_f64)),
        };
        let rope_type = match sub.get("rope_type").or(sub.get("type")) {
            None => None,
            Some(Value::String(s)) => Some(s.to_lowercase()),
            Some(_) => return Err(self.bad(&nested("rope_type"), "a string")),
        };
        let theta = match num("rope_theta")? {
            Some(t) => Some(t),
            None => [
                "global_rope_theta",
                "rope_global_theta",
                "rope_theta_global",
                "rope_theta",
                "rotary_emb_base",
            ]
            .iter()
            .map(|k| self.opt_f64(k))
            .find_map(|r| r.transpose())
            .transpose()?,
        };
        let factors = |k: &str| -> Result<Option<Vec<f32>>> {
            match sub.get(k) {
                None => Ok(None),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_f64().map(|x| x as f32))
                    .collect::<Option<Vec<_>>>()
                    .map(Some)
                    .ok_or_else(|| self.bad(&nested(k), "a list of numbers")),
                Some(_) => Err(self.bad(&nested(k), "a list of numbers")),
            }
        };
        Ok(RopeParams {
            theta,
            local_theta,
            rope_type,
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: match num("original_max_position_embeddings")? {
                Some(v) => Some(v),
                None => self.opt_f64("original_max_position_embeddings")?,
            },
            partial_rotary_factor: match num("partial_rotary_factor")? {
                Some(v) => Some(v),
                None => self.opt_f64("partial_rotary_factor")?,
            },
            long_factor: factors("long_factor")?,
            short_factor: factors("short_factor")?,
            key: global_key,
        })
    }
}

/// RoPE settings from `config.json` (absent values stay `None`; callers apply the defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeParams {
    /// Base θ of the global layers.
    pub theta: Option<f64>,
    /// Base θ of the sliding-window layers, when the config gives one.
    pub local_theta: Option<f64>,
    /// `rope_type` lower-cased: `default`, `linear`, `yarn`, `llama3`, `longrope`, ...
    pub rope_type: Option<String>,
    /// Scaling factor.
    pub factor: Option<f64>,
    /// llama3 scaling: low-frequency factor.
    pub low_freq_factor: Option<f64>,
    /// llama3 scaling: high-frequency factor.
    pub high_freq_factor: Option<f64>,
    /// The context length the model was pre-trained with.
    pub original_max_position_embeddings: Option<f64>,
    /// Fraction of each head that is rotated.
    pub partial_rotary_factor: Option<f64>,
    /// longrope: per-frequency factors for long contexts.
    pub long_factor: Option<Vec<f32>>,
    /// longrope: per-frequency factors for short contexts.
    pub short_factor: Option<Vec<f32>>,
    /// The config key the values came from (for error messages).
    pub key: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(v: Value) -> HfConfig {
        HfConfig::from_value(PathBuf::from("/m/config.json"), v)
    }

    #[test]
    fn typed_lookups_name_the_file_and_key() {
        let c =
            config(json!({"hidden_size": 64, "bad": "x", "eos_token_id": [1, 106], "pad": null}));
        assert_eq!(c.usize("hidden_size").unwrap(), 64);
        assert_eq!(c.opt_usize("pad").unwrap(), None);
        assert_eq!(c.token_ids("eos_token_id").unwrap(), [1, 106]);
        let e = c.usize("bad").unwrap_err().to_string();
        assert_eq!(
            e,
            "/m/config.json: key `bad`: expected a positive integer, found \"x\""
        );
        let e = c.usize("num_hidden_layers").unwrap_err().to_string();
        assert!(
            e.ends_with("expected a positive integer, found nothing"),
            "{e}"
        );
    }

    #[test]
    fn rope_parameters_new_legacy_and_per_layer_type() {
        let new = config(json!({"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}));
        let r = new.rope().unwrap();
        assert_eq!(
            (r.theta, r.rope_type.as_deref()),
            (Some(1e6), Some("default"))
        );
        let legacy = config(
            json!({"rope_theta": 5e5, "rope_scaling": {"type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
        );
        let r = legacy.rope().unwrap();
        assert_eq!(r.theta, Some(5e5));
        assert_eq!(r.rope_type.as_deref(), Some("llama3"));
        assert_eq!(r.original_max_position_embeddings, Some(8192.0));
        let gemma3 = config(json!({"rope_parameters": {
            "full_attention": {"rope_theta": 1e6, "rope_type": "default"},
            "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}}));
        let r = gemma3.rope().unwrap();
        assert_eq!((r.theta, r.local_theta), (Some(1e6), Some(1e4)));
        let gemma3_legacy = config(json!({"rope_theta": 1e6, "rope_local_base_freq": 1e4}));
        assert_eq!(gemma3_legacy.rope().unwrap().local_theta, Some(1e4));
        let bad = config(json!({"rope_parameters": {"factor": "eight"}}));
        let e = bad.rope().unwrap_err().to_string();
        assert!(
            e.contains("key `rope_parameters.factor`: expected a number"),
            "{e}"
        );
    }
}
