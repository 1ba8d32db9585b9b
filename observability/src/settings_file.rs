//! A binary's settings from defaults, a TOML file, environment variables and flags ([`load`]), and
//! unknown keys in that file ([`check_known_keys`]): a misspelt key (`kv_cache_mb` for
//! `kv_cache_mib`) would otherwise be ignored silently by figment and serde, and the binary would
//! start with the default.

use std::path::Path;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Value};
use figment::{Figment, Provider};

/// Merges, each over the one before: `defaults`, the TOML file `file` (when given, after
/// [`check_known_keys`]), the environment provider `env` (e.g. `Env::prefixed("WORKER_")`; its
/// `config` key is ignored, that is the file's own flag) and `cli` (the parsed flags, whose unset
/// options serialize to nothing).
///
/// Errors: an unreadable or invalid file, a key in the file that is not a setting (nested ones
/// too), or a value of the wrong type (figment's message names the key and where it came from).
pub fn load<S, C>(
    defaults: &S,
    file: Option<&Path>,
    env: Env,
    cli: &C,
) -> Result<S, Box<figment::Error>>
where
    S: serde::Serialize + serde::de::DeserializeOwned,
    C: serde::Serialize,
{
    let mut figment = Figment::from(Serialized::defaults(defaults));
    if let Some(path) = file {
        check_known_keys(defaults, path)?;
        figment = figment.merge(Toml::file_exact(path));
    }
    figment
        .merge(env.ignore(&["config"]))
        .merge(Serialized::defaults(cli))
        .extract()
        .map_err(Box::new)
}

/// Checks that every key of the TOML file at `file`, in nested tables too, is a field of the
/// settings whose defaults are `defaults` (their serialized form lists every field, `None` ones
/// included).
///
/// Errors: the file cannot be read or parsed (figment's message), or it has keys the settings do not,
/// named with their table path (e.g. ``unknown setting `limits.max_new_tokenz` in router.toml; known
/// keys: ...``).
pub fn check_known_keys<S: serde::Serialize>(
    defaults: &S,
    file: &Path,
) -> Result<(), Box<figment::Error>> {
    let known = merged(Serialized::defaults(defaults).data()?);
    let given = merged(Toml::file_exact(file).data()?);
    let mut unknown = Vec::new();
    collect_unknown(&given, &known, "", &mut unknown);
    if unknown.is_empty() {
        return Ok(());
    }
    let names = unknown
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut known_keys: Vec<&str> = known.keys().map(String::as_str).collect();
    known_keys.sort_unstable();
    Err(Box::new(figment::Error::from(format!(
        "unknown setting{} {names} in {}; known keys: {}",
        if unknown.len() == 1 { "" } else { "s" },
        file.display(),
        known_keys.join(", ")
    ))))
}

/// The dictionaries of every profile, merged (settings files here use the default profile).
fn merged(data: figment::value::Map<figment::Profile, Dict>) -> Dict {
    data.into_values().flatten().collect()
}

/// Appends to `out` the keys of `given` (with their `prefix.`) that `known` lacks, recursing into
/// tables that both have.
fn collect_unknown(given: &Dict, known: &Dict, prefix: &str, out: &mut Vec<String>) {
    for (key, value) in given {
        let path = format!("{prefix}{key}");
        match (value, known.get(key)) {
            (_, None) => out.push(path),
            (Value::Dict(_, g), Some(Value::Dict(_, k))) => {
                collect_unknown(g, k, &format!("{path}."), out)
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, Default)]
    struct Limits {
        max_new_tokens: u32,
    }

    #[derive(serde::Serialize, Default)]
    struct Settings {
        model: Option<String>,
        threads: usize,
        limits: Limits,
    }

    fn check(toml: &str) -> Result<(), String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(&path, toml).unwrap();
        check_known_keys(&Settings::default(), &path).map_err(|e| e.to_string())
    }

    #[test]
    fn known_keys_pass_including_none_fields_and_tables() {
        check("model = \"m.gguf\"\nthreads = 2\n[limits]\nmax_new_tokens = 9\n").unwrap();
        check("").unwrap();
    }

    #[test]
    fn unknown_keys_are_named_with_their_table() {
        let e = check("threads = 2\nthread = 3\n[limits]\nmax_new_tokenz = 1\n").unwrap_err();
        assert!(
            e.contains("unknown settings `limits.max_new_tokenz`, `thread`"),
            "{e}"
        );
        assert!(e.contains("known keys: limits, model, threads"), "{e}");
        let e = check("[nope]\nx = 1\n").unwrap_err();
        assert!(e.contains("unknown setting `nope` in"), "{e}");
    }

    #[test]
    fn unreadable_or_invalid_files_are_errors() {
        assert!(check("threads = ").is_err());
        let missing = check_known_keys(&Settings::default(), Path::new("/nonexistent/s.toml"));
        assert!(missing.is_err());
    }
}
