//! A binary's settings from defaults, a TOML file, environment variables and flags ([`load`]), and
//! unknown keys in that file ([`check_known_keys`]): a misspelt key (`kv_cache_mb` for
//! `kv_cache_mib`) would otherwise be ignored silently by figment and serde, and the binary would
//! start with the default.
//!
//! Used by the `router` and `worker` binaries (each owns its settings struct, its env prefix and
//! its flags; this crate only merges and checks them). [`flags`] parses those flags with each
//! setting's default shown in `--help`.

pub mod flags;

use std::path::Path;

use figment::providers::{Data, Env, Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};

/// Merges, each over the one before: `defaults`, the TOML file `file` (when given, after
/// [`check_known_keys`]), the environment provider `env` (e.g. `Env::prefixed("WORKER_")`; its
/// `config` key is ignored, that is the file's own flag) and `cli` (the parsed flags, whose unset
/// options serialize to nothing).
///
/// Errors: an unreadable or invalid file (named), a key in the file that is not a setting (nested
/// ones too), or a value of the wrong type (figment's message names the key, as `limits.max_new_tokens`
/// for the file, and where it came from).
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
        figment = figment.merge(SettingsFile(Toml::file_exact(path)));
    }
    figment
        .merge(env.ignore(&["config"]))
        .merge(Flags(Serialized::defaults(cli)))
        .extract()
        .map_err(Box::new)
}

/// Checks that every key of the TOML file at `file`, in nested tables too, is a field of the
/// settings whose defaults are `defaults` (their serialized form lists every field, `None` ones
/// included).
///
/// Errors: the file cannot be read or parsed (``settings file router.toml: ...``), or it has keys the
/// settings do not, named with their table path, and the known keys likewise (e.g. ``unknown
/// setting `limits.max_new_tokenz` in router.toml; known keys: ..., limits.max_new_tokens, ...``).
pub fn check_known_keys<S: serde::Serialize>(
    defaults: &S,
    file: &Path,
) -> Result<(), Box<figment::Error>> {
    let known = merged(Serialized::defaults(defaults).data()?);
    let given = Toml::file_exact(file).data().map_err(|e| {
        // figment names neither the file of an I/O error nor that of a TOML syntax error.
        let reason = e.to_string();
        Box::new(figment::Error::from(format!(
            "settings file {}: {}",
            file.display(),
            reason.trim_end()
        )))
    })?;
    let given = merged(given);
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
    let mut known_keys = Vec::new();
    leaf_paths(&known, "", &mut known_keys);
    known_keys.sort_unstable();
    Err(Box::new(figment::Error::from(format!(
        "unknown setting{} {names} in {}; known keys: {}",
        if unknown.len() == 1 { "" } else { "s" },
        file.display(),
        known_keys.join(", ")
    ))))
}

/// The settings file as a figment provider whose messages name a key by its path in the file
/// (`limits.max_new_tokens`) instead of figment's default `default.limits.max_new_tokens` (the
/// profile first, which a settings file never names).
struct SettingsFile(Data<Toml>);

impl Provider for SettingsFile {
    fn metadata(&self) -> Metadata {
        self.0
            .metadata()
            .interpolater(|_: &Profile, keys: &[&str]| keys.join("."))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        self.0.data()
    }
}

/// The parsed command-line flags, named so in errors (figment would name the Rust type and a source
/// line): a bad value reads `... for key "--routing" in command-line flags`.
struct Flags<T>(Serialized<T>);

impl<T: serde::Serialize> Provider for Flags<T> {
    fn metadata(&self) -> Metadata {
        Metadata::named("command-line flags").interpolater(|_: &Profile, keys: &[&str]| {
            format!("--{}", keys.join(".").replace('_', "-"))
        })
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        self.0.data()
    }
}

/// Appends to `out` the path (`prefix` + key, tables joined by `.`) of every non-table value in
/// `dict`.
fn leaf_paths(dict: &Dict, prefix: &str, out: &mut Vec<String>) {
    for (key, value) in dict {
        match value {
            Value::Dict(_, inner) => leaf_paths(inner, &format!("{prefix}{key}."), out),
            _ => out.push(format!("{prefix}{key}")),
        }
    }
}

/// The dictionaries of every profile, merged (settings files here use the default profile).
fn merged(data: Map<Profile, Dict>) -> Dict {
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

    #[derive(serde::Serialize, serde::Deserialize, Default, Debug, PartialEq)]
    struct Limits {
        max_new_tokens: u32,
    }

    #[derive(serde::Serialize, serde::Deserialize, Default, Debug, PartialEq)]
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
        assert!(
            e.contains("known keys: limits.max_new_tokens, model, threads"),
            "{e}"
        );
        let e = check("[nope]\nx = 1\n").unwrap_err();
        assert!(e.contains("unknown setting `nope` in"), "{e}");
    }

    #[test]
    fn a_bad_flag_value_names_the_flag_not_a_rust_type() {
        #[derive(serde::Serialize)]
        struct Cli {
            #[serde(skip_serializing_if = "Option::is_none")]
            max_thread_count: Option<&'static str>,
        }
        #[derive(serde::Serialize, serde::Deserialize, Default)]
        struct Wanted {
            max_thread_count: usize,
        }
        let cli = Cli {
            max_thread_count: Some("many"),
        };
        let e = load(
            &Wanted::default(),
            None,
            Env::prefixed("SETTINGS_FILE_TEST_"),
            &cli,
        )
        .err()
        .expect("a string is not a number")
        .to_string();
        assert!(
            e.contains("for key \"--max-thread-count\" in command-line flags"),
            "{e}"
        );
        assert!(!e.contains("src/lib.rs"), "{e}");
    }

    #[test]
    fn unreadable_or_invalid_files_are_errors_naming_the_file() {
        let e = check("threads = ").unwrap_err();
        assert!(e.starts_with("settings file "), "{e}");
        assert!(e.contains("s.toml: TOML parse error at line 1"), "{e}");
        assert!(!e.ends_with('\n'), "{e:?}");
        let missing = check_known_keys(&Settings::default(), Path::new("/nonexistent/s.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            missing.starts_with("settings file /nonexistent/s.toml: No such file"),
            "{missing}"
        );
    }

    /// Loads `toml` over the defaults with `TEST_SF_*` variables (none set) and no flags.
    fn load_file(toml: &str) -> Result<Settings, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(&path, toml).unwrap();
        #[derive(serde::Serialize)]
        struct NoFlags {}
        load(
            &Settings::default(),
            Some(&path),
            Env::prefixed("TEST_SF_UNSET_"),
            &NoFlags {},
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn the_file_is_merged_over_the_defaults() {
        let s = load_file(
            "threads = 3
[limits]
max_new_tokens = 9
",
        )
        .unwrap();
        assert_eq!((s.threads, s.limits.max_new_tokens, s.model), (3, 9, None));
    }

    #[test]
    fn a_wrong_type_names_the_key_as_the_file_spells_it() {
        let e = load_file(
            "[limits]
max_new_tokens = \"x\"
",
        )
        .unwrap_err();
        assert!(e.contains("for key \"limits.max_new_tokens\" in "), "{e}");
        assert!(e.contains("s.toml TOML file"), "{e}");
        let e = load_file(
            "threads = -1
",
        )
        .unwrap_err();
        assert!(e.contains("for key \"threads\" in "), "{e}");
    }
}
