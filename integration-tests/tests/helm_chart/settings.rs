//! The binaries' settings files as the chart renders them, loaded with the binaries' own loader.

use std::path::Path;
use std::process::Command;

use integration_tests::bin_path;
use serde_json::Value;

use super::render::{items, str_of, Manifests};

/// A pod's settings file as the binary reads it: the TOML from the ConfigMap, and the binary's own
/// effective settings (`--check-config`, with the container's environment).
pub(crate) struct Settings {
    pub(crate) file: Value,
    pub(crate) effective: Value,
}

/// Loads the settings `container` of `pod` reads, with the binary `bin`'s own loader. Arguments
/// under a directory of `mounts` (a Secret's mount path, the local folder that stands for it) are
/// mapped to the local folder.
pub(crate) fn load_settings(
    m: &Manifests,
    pod: &Value,
    container: &Value,
    bin: &str,
    mounts: &[(&str, &Path)],
) -> Settings {
    let what = format!("{}: {bin} container", m.profile);
    let args: Vec<&str> = items(&container["args"])
        .iter()
        .map(|a| str_of(a, "an argument"))
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--config")
        .unwrap_or_else(|| panic!("{what}: no --config in {args:?}"));
    let config_path = args[at + 1];
    // The mount that holds the file, its ConfigMap and the key.
    let mount = items(&container["volumeMounts"])
        .iter()
        .find(|vm| {
            let dir = str_of(&vm["mountPath"], "mountPath").trim_end_matches('/');
            config_path.starts_with(&format!("{dir}/"))
        })
        .unwrap_or_else(|| panic!("{what}: {config_path} is on no volume mount"));
    let relative = &config_path[str_of(&mount["mountPath"], "mountPath")
        .trim_end_matches('/')
        .len()
        + 1..];
    let volume = items(&pod["volumes"])
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("{what}: no volume {}", mount["name"]));
    let config_map = m.named(
        "ConfigMap",
        str_of(&volume["configMap"]["name"], "volume's configMap name"),
    );
    let key = match volume["configMap"]["items"].as_array() {
        Some(list) => str_of(
            &list
                .iter()
                .find(|i| i["path"] == relative)
                .unwrap_or_else(|| panic!("{what}: the ConfigMap volume has no item {relative}"))
                ["key"],
            "item key",
        ),
        None => relative,
    };
    let text = str_of(&config_map["data"][key], "ConfigMap data");
    let file: toml::Table =
        toml::from_str(text).unwrap_or_else(|e| panic!("{what}: {key} is not TOML: {e}\n{text}"));
    let file = serde_json::to_value(file).unwrap();

    // The binary's own view, with the container's arguments (the file path mapped here) and
    // environment (literal values; the host's own settings variables removed).
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join(key);
    std::fs::write(&local, text).unwrap();
    let mut command = Command::new(bin_path(bin));
    for (i, arg) in args.iter().enumerate() {
        let mounted = mounts
            .iter()
            .find_map(|(dir, here)| Some(here.join(arg.strip_prefix(&format!("{dir}/"))?)));
        if i == at + 1 {
            command.arg(&local);
        } else if let Some(path) = mounted {
            command.arg(path);
        } else {
            command.arg(arg);
        }
    }
    command.arg("--check-config");
    without_host_settings(&mut command);
    for env in items(&container["env"]) {
        match env["value"].as_str() {
            Some(value) => {
                command.env(str_of(&env["name"], "env name"), value);
            }
            None => assert!(
                env["value"].is_null() && env["valueFrom"].is_object(),
                "{what}: env {env} has no string value (Kubernetes rejects it)"
            ),
        }
    }
    let output = command.output().expect("running --check-config");
    assert!(
        output.status.success(),
        "{what}: `{bin} --check-config` rejects the rendered {key}:\n{}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    let effective: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{what}: --check-config printed no JSON: {e}"));
    Settings { file, effective }
}

/// Removes the host's own `ROUTER_*` / `WORKER_*` settings from `command`'s environment.
pub(crate) fn without_host_settings(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars() {
        if name.starts_with("ROUTER_") || name.starts_with("WORKER_") || name == "RUST_LOG" {
            command.env_remove(name);
        }
    }
    command
}

/// Every key of the rendered file (tables included) is a setting the binary has: a key it does not
/// know would be ignored without a word.
pub(crate) fn assert_known_keys(
    profile: &str,
    bin: &str,
    file: &Value,
    effective: &Value,
    pending: &[&str],
) {
    fn walk(prefix: &str, file: &Value, effective: &Value, unknown: &mut Vec<String>) {
        for (key, value) in file.as_object().into_iter().flatten() {
            let path = format!("{prefix}{key}");
            match effective.get(key) {
                None => unknown.push(path),
                Some(known) if value.is_object() => {
                    walk(&format!("{path}."), value, known, unknown)
                }
                Some(_) => {}
            }
        }
    }
    let mut unknown = Vec::new();
    walk("", file, effective, &mut unknown);
    unknown.retain(|k| !pending.contains(&k.as_str()));
    assert!(
        unknown.is_empty(),
        "{profile}: the rendered {bin} settings hold keys the {bin} ignores: {unknown:?} (check \
         helm/values.yaml {bin}.config against {bin}/src/config.rs)"
    );
}
