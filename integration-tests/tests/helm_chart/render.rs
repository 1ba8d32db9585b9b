//! Rendering the chart with `helm template` and reading the manifests back.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

/// The Helm release name the chart is rendered as.
pub(crate) const RELEASE: &str = "smollm-serve";
/// The namespace the chart is rendered into.
pub(crate) const NAMESPACE: &str = "inference";
/// The cluster's DNS domain (the chart's default), the suffix of the Services' names.
pub(crate) const CLUSTER_DOMAIN: &str = "cluster.local";

pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The helm binary; fails with the fix when it is missing.
pub(crate) fn helm_bin() -> PathBuf {
    let path = std::env::var_os("HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/helm/bin/helm"));
    assert!(
        path.is_file(),
        "helm is missing at {}: run scripts/install-helm (scripts/test runs it before the tests), \
         or set HELM to a helm v3 binary",
        path.display()
    );
    path
}

/// `helm template` of the chart with `args`: the manifests, or helm's error text.
pub(crate) fn helm_template(args: &[&str]) -> Result<String, String> {
    let output = Command::new(helm_bin())
        .arg("template")
        .arg(RELEASE)
        .arg(repo_root().join("helm"))
        .args(["--namespace", NAMESPACE])
        .args(args)
        .output()
        .expect("running helm");
    if output.status.success() {
        Ok(String::from_utf8(output.stdout).expect("utf-8 manifests"))
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// The values profiles the chart ships: (name, helm arguments).
pub(crate) fn profiles() -> Vec<(&'static str, Vec<String>)> {
    let file = |name: &str| {
        let path = repo_root().join("helm").join(name);
        assert!(path.is_file(), "{} is missing", path.display());
        vec!["-f".to_string(), path.to_str().unwrap().to_string()]
    };
    vec![
        ("default", Vec::new()),
        ("cpu", file("values-cpu.yaml")),
        ("gpu", file("values-gpu.yaml")),
    ]
}

/// Rendered manifests, one JSON value per YAML document.
pub(crate) struct Manifests {
    pub(crate) profile: String,
    pub(crate) docs: Vec<Value>,
}

impl Manifests {
    pub(crate) fn render(profile: &str, args: &[String]) -> Manifests {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let text = helm_template(&args)
            .unwrap_or_else(|e| panic!("{profile}: helm template {args:?} failed:\n{e}"));
        let docs = serde_norway::Deserializer::from_str(&text)
            .map(|doc| Value::deserialize(doc).expect("a YAML document"))
            .filter(|doc| !doc.is_null())
            .collect();
        Manifests {
            profile: profile.to_string(),
            docs,
        }
    }

    pub(crate) fn of_kind(&self, kind: &str) -> impl Iterator<Item = &Value> + '_ {
        let kind = kind.to_string();
        self.docs.iter().filter(move |d| d["kind"] == kind.as_str())
    }

    /// The one object of `kind` for `component` (label `app.kubernetes.io/component`).
    pub(crate) fn one(&self, kind: &str, component: &str) -> &Value {
        let found: Vec<&Value> = self
            .of_kind(kind)
            .filter(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == component)
            .collect();
        assert_eq!(
            found.len(),
            1,
            "{}: expected one {kind} for the {component}, found {}",
            self.profile,
            found.len()
        );
        found[0]
    }

    pub(crate) fn named(&self, kind: &str, name: &str) -> &Value {
        self.of_kind(kind)
            .find(|d| d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{}: no {kind} named {name}", self.profile))
    }
}

pub(crate) fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v}"))
}

pub(crate) fn u64_of(v: &Value, what: &str) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("{what} is not a non-negative integer: {v}"))
}

pub(crate) fn items(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// The port of an `IP:PORT` / `NAME:PORT` string.
pub(crate) fn port_of(addr: &str) -> u64 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("{addr:?} is not HOST:PORT"))
}

/// The container port named `name`.
pub(crate) fn container_port(container: &Value, name: &str) -> Option<u64> {
    items(&container["ports"])
        .iter()
        .find(|p| p["name"] == name)
        .map(|p| u64_of(&p["containerPort"], "containerPort"))
}
