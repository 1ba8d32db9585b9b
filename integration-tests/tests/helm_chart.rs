//! The Helm chart (`helm/`), rendered with `helm template` for the default values, the CPU profile
//! (`helm/values-cpu.yaml`) and the GPU profile (`helm/values-gpu.yaml`), checked for what breaks real
//! deployments:
//! - the router's `discovery_dns` is the worker headless Service's DNS name and the workers' port;
//! - the probes and container ports use the ports the binaries listen on;
//! - the rendered settings files load and validate with the binaries' own loader
//!   (`--check-config`), and hold no key the binaries would ignore;
//! - TLS from Secrets: the files the flags name are the Secrets' keys, mounted as directories, and
//!   the binaries accept them (test certificates made at run time); the probes then ask the plain
//!   health port;
//! - the grace periods exceed the drain timeouts;
//! - every container has resources and a restrictive security context;
//!
//! and, on real processes started from the rendered settings, that the health services the probes
//! ask for answer as the probes expect.
//!
//! Needs `helm` (scripts/install-helm puts it in `.cache/helm/bin`, scripts/test runs it first; `HELM`
//! names another binary) and the release binaries (`cargo build --release --bins`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use integration_tests::ops::{health, wait_health};
use integration_tests::{bin_path, free_port, tiny_model, Process};
use serde::Deserialize;
use serde_json::Value;
use tonic_health::pb::health_check_response::ServingStatus;

const RELEASE: &str = "smollm-serve";
const NAMESPACE: &str = "inference";
const CLUSTER_DOMAIN: &str = "cluster.local";
/// Worker keys the chart writes ahead of the binary (none: every key it writes is a worker setting).
const PENDING_WORKER_KEYS: &[&str] = &[];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The helm binary; fails with the fix when it is missing.
fn helm_bin() -> PathBuf {
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
fn helm_template(args: &[&str]) -> Result<String, String> {
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
fn profiles() -> Vec<(&'static str, Vec<String>)> {
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
struct Manifests {
    profile: String,
    docs: Vec<Value>,
}

impl Manifests {
    fn render(profile: &str, args: &[String]) -> Manifests {
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

    fn of_kind(&self, kind: &str) -> impl Iterator<Item = &Value> + '_ {
        let kind = kind.to_string();
        self.docs.iter().filter(move |d| d["kind"] == kind.as_str())
    }

    /// The one object of `kind` for `component` (label `app.kubernetes.io/component`).
    fn one(&self, kind: &str, component: &str) -> &Value {
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

    fn named(&self, kind: &str, name: &str) -> &Value {
        self.of_kind(kind)
            .find(|d| d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{}: no {kind} named {name}", self.profile))
    }
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v}"))
}

fn u64_of(v: &Value, what: &str) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("{what} is not a non-negative integer: {v}"))
}

fn items(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// The port of an `IP:PORT` / `NAME:PORT` string.
fn port_of(addr: &str) -> u64 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("{addr:?} is not HOST:PORT"))
}

/// The container port named `name`.
fn container_port(container: &Value, name: &str) -> Option<u64> {
    items(&container["ports"])
        .iter()
        .find(|p| p["name"] == name)
        .map(|p| u64_of(&p["containerPort"], "containerPort"))
}

/// A pod's settings file as the binary reads it: the TOML from the ConfigMap, and the binary's own
/// effective settings (`--check-config`, with the container's environment).
struct Settings {
    file: Value,
    effective: Value,
}

/// Loads the settings `container` of `pod` reads, with the binary `bin`'s own loader. Arguments
/// under a directory of `mounts` (a Secret's mount path, the local folder that stands for it) are
/// mapped to the local folder.
fn load_settings(
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
fn without_host_settings(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars() {
        if name.starts_with("ROUTER_") || name.starts_with("WORKER_") || name == "RUST_LOG" {
            command.env_remove(name);
        }
    }
    command
}

/// Every key of the rendered file (tables included) is a setting the binary has: a key it does not
/// know would be ignored without a word.
fn assert_known_keys(profile: &str, bin: &str, file: &Value, effective: &Value, pending: &[&str]) {
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

fn pod_labels_match(selector: &Value, labels: &Value) -> bool {
    let selector = selector.as_object().expect("a label selector");
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Requests (cpu, memory) and a memory limit; a security context that runs as non-root with no
/// privilege escalation, a read-only root filesystem and no capabilities.
fn assert_container_hardened(profile: &str, pod: &Value, container: &Value) {
    let name = format!("{profile}: container {}", container["name"]);
    let resources = &container["resources"];
    for key in ["cpu", "memory"] {
        assert!(
            !resources["requests"][key].is_null(),
            "{name}: no resources.requests.{key}"
        );
    }
    assert!(
        !resources["limits"]["memory"].is_null(),
        "{name}: no resources.limits.memory"
    );
    let sc = &container["securityContext"];
    assert!(sc.is_object(), "{name}: no securityContext");
    assert_eq!(
        sc["allowPrivilegeEscalation"], false,
        "{name}: allowPrivilegeEscalation"
    );
    assert_eq!(
        sc["readOnlyRootFilesystem"], true,
        "{name}: readOnlyRootFilesystem"
    );
    assert_ne!(sc["privileged"], true, "{name}: privileged");
    assert!(
        items(&sc["capabilities"]["drop"])
            .iter()
            .any(|c| c == "ALL"),
        "{name}: capabilities.drop lacks ALL"
    );
    let non_root = sc["runAsNonRoot"]
        .as_bool()
        .or(pod["securityContext"]["runAsNonRoot"].as_bool());
    assert_eq!(non_root, Some(true), "{name}: runAsNonRoot");
    let uid = sc["runAsUser"]
        .as_u64()
        .or(pod["securityContext"]["runAsUser"].as_u64());
    assert_ne!(uid, Some(0), "{name}: runs as uid 0");
}

/// Each probe is a native gRPC probe on `port`, asking for the expected health service.
fn assert_grpc_probes(profile: &str, container: &Value, port: u64, services: [(&str, &str); 3]) {
    for (probe, service) in services {
        let p = &container[probe]["grpc"];
        let name = format!("{profile}: {} {probe}", container["name"]);
        assert!(p.is_object(), "{name}: not a grpc probe");
        assert_eq!(
            u64_of(&p["port"], "probe port"),
            port,
            "{name}: probes a port the binary does not listen on"
        );
        assert_eq!(
            p["service"].as_str().unwrap_or(""),
            service,
            "{name}: health service"
        );
    }
}

/// The ms a pod may take to stop: its grace period, less nothing (the drain starts at SIGTERM, which
/// comes after the preStop hook, whose time the grace period includes).
fn grace_and_prestop_ms(pod: &Value, container: &Value) -> (u64, u64) {
    let grace = u64_of(
        &pod["terminationGracePeriodSeconds"],
        "terminationGracePeriodSeconds",
    );
    let prestop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        .as_u64()
        .unwrap_or(0);
    (grace * 1000, prestop * 1000)
}

/// Checks one rendered profile; returns the router's and worker's effective settings.
fn check_profile(profile: &str, args: &[String]) -> (Value, Value) {
    let m = Manifests::render(profile, args);

    // Workers: a StatefulSet behind a headless Service.
    let sts = m.one("StatefulSet", "worker");
    let worker_pod = &sts["spec"]["template"]["spec"];
    let worker_labels = &sts["spec"]["template"]["metadata"]["labels"];
    let worker = items(&worker_pod["containers"])
        .iter()
        .find(|c| c["name"] == "worker")
        .unwrap_or_else(|| panic!("{profile}: no worker container"));
    let ws = load_settings(&m, worker_pod, worker, "worker", &[]);
    assert_known_keys(
        profile,
        "worker",
        &ws.file,
        &ws.effective,
        PENDING_WORKER_KEYS,
    );
    let worker_listen = str_of(&ws.effective["listen"], "worker listen");
    let worker_port = port_of(worker_listen);

    let headless = m.one("Service", "worker");
    let headless_name = str_of(&headless["metadata"]["name"], "service name");
    assert_eq!(
        headless["spec"]["clusterIP"], "None",
        "{profile}: the worker Service is not headless"
    );
    assert_eq!(
        sts["spec"]["serviceName"], headless_name,
        "{profile}: StatefulSet serviceName"
    );
    assert!(
        pod_labels_match(&headless["spec"]["selector"], worker_labels),
        "{profile}: the headless Service selects no worker pod"
    );
    let grpc = items(&headless["spec"]["ports"])
        .iter()
        .find(|p| p["name"] == "grpc")
        .unwrap_or_else(|| panic!("{profile}: the headless Service has no grpc port"));
    let target = match &grpc["targetPort"] {
        Value::String(name) => container_port(worker, name)
            .unwrap_or_else(|| panic!("{profile}: no worker container port named {name}")),
        Value::Null => u64_of(&grpc["port"], "port"),
        other => u64_of(other, "targetPort"),
    };
    assert_eq!(
        target, worker_port,
        "{profile}: headless Service targets {target}, the worker listens on {worker_port}"
    );
    assert_eq!(
        u64_of(&grpc["port"], "port"),
        worker_port,
        "{profile}: a headless Service's DNS gives pod addresses: its port must be the worker's"
    );

    // Router: a Deployment whose discovery name is that Service.
    let deployment = m.one("Deployment", "router");
    let router_pod = &deployment["spec"]["template"]["spec"];
    let router_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let router = items(&router_pod["containers"])
        .iter()
        .find(|c| c["name"] == "router")
        .unwrap_or_else(|| panic!("{profile}: no router container"));
    let rs = load_settings(&m, router_pod, router, "router", &[]);
    assert_known_keys(profile, "router", &rs.file, &rs.effective, &[]);
    let discovery = str_of(&rs.effective["discovery_dns"], "discovery_dns");
    let (name, port) = discovery
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{profile}: discovery_dns {discovery:?} is not NAME:PORT"));
    assert_eq!(
        name.trim_end_matches('.'),
        format!("{headless_name}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}"),
        "{profile}: the router discovers workers at a name that is not the headless Service's"
    );
    assert_eq!(
        port.parse::<u64>().ok(),
        Some(worker_port),
        "{profile}: discovery_dns port {port} is not the worker's {worker_port}"
    );
    assert!(
        rs.effective["workers"]
            .as_array()
            .is_some_and(|w| w.is_empty()),
        "{profile}: static workers besides discovery"
    );

    // Ports: probes and container ports are the ports the binaries bind, on every interface.
    let router_port = port_of(str_of(&rs.effective["listen"], "router listen"));
    for (bin, settings, container) in [("router", &rs, router), ("worker", &ws, worker)] {
        let listen = str_of(&settings.effective["listen"], "listen");
        let ip = listen.rsplit_once(':').unwrap().0;
        assert!(
            ip == "0.0.0.0" || ip == "[::]",
            "{profile}: the {bin} listens on {listen}: kubelet probes and peers reach the pod IP"
        );
        assert_eq!(
            container_port(container, "grpc"),
            Some(port_of(listen)),
            "{profile}: {bin} grpc containerPort"
        );
        let metrics = str_of(&settings.effective["metrics_listen"], "metrics_listen");
        if !metrics.is_empty() {
            assert_eq!(
                container_port(container, "metrics"),
                Some(port_of(metrics)),
                "{profile}: {bin} metrics containerPort"
            );
        }
    }
    assert_grpc_probes(
        profile,
        router,
        router_port,
        [
            ("startupProbe", "liveness"),
            ("livenessProbe", "liveness"),
            ("readinessProbe", "inference.v1.TextGeneration"),
        ],
    );
    assert_grpc_probes(
        profile,
        worker,
        worker_port,
        [
            ("startupProbe", "inference.worker.v1.Worker"),
            ("livenessProbe", "inference.worker.v1.Worker"),
            ("readinessProbe", "inference.worker.v1.Worker"),
        ],
    );
    let router_service = m.one("Service", "router");
    assert!(
        pod_labels_match(&router_service["spec"]["selector"], router_labels),
        "{profile}: the router Service selects no router pod"
    );
    let public = items(&router_service["spec"]["ports"])
        .iter()
        .find(|p| p["name"] == "grpc")
        .unwrap_or_else(|| panic!("{profile}: the router Service has no grpc port"));
    assert!(
        public["targetPort"] == "grpc" || public["targetPort"] == router_port,
        "{profile}: the router Service targets {}",
        public["targetPort"]
    );

    // Model: the worker's model path is on the model volume, which an init container fills when
    // the chart downloads it.
    let model = str_of(&ws.effective["model"], "worker model");
    let model_mount = items(&worker["volumeMounts"])
        .iter()
        .find(|vm| model.starts_with(&format!("{}/", str_of(&vm["mountPath"], "mountPath"))))
        .unwrap_or_else(|| panic!("{profile}: the model {model} is on no worker volume"));
    for init in items(&worker_pod["initContainers"]) {
        let Some(dest) = items(&init["env"])
            .iter()
            .find(|e| e["name"] == "MODEL_PATH")
            .and_then(|e| e["value"].as_str())
        else {
            continue;
        };
        assert_eq!(
            dest, model,
            "{profile}: the init container fills a path the worker does not read"
        );
        assert!(
            items(&init["volumeMounts"])
                .iter()
                .any(|vm| vm["name"] == model_mount["name"]
                    && vm["mountPath"] == model_mount["mountPath"]
                    && vm["readOnly"] != true),
            "{profile}: the init container does not write the worker's model volume"
        );
    }

    // Shutdown: the grace period covers preStop plus the drain.
    for (bin, settings, pod, container) in [
        ("router", &rs, router_pod, router),
        ("worker", &ws, worker_pod, worker),
    ] {
        let drain = u64_of(&settings.effective["drain_timeout_ms"], "drain_timeout_ms");
        let (grace, prestop) = grace_and_prestop_ms(pod, container);
        assert!(
            grace > drain + prestop,
            "{profile}: the {bin} pod is killed after {grace} ms, before its drain ({drain} ms \
             after a {prestop} ms preStop) ends"
        );
    }

    // Every container: resources and security context.
    for pod in [router_pod, worker_pod] {
        for container in items(&pod["containers"])
            .iter()
            .chain(items(&pod["initContainers"]))
        {
            assert_container_hardened(profile, pod, container);
        }
        assert_eq!(
            pod["securityContext"]["runAsNonRoot"], true,
            "{profile}: pod runAsNonRoot"
        );
    }

    // Operations objects point at the right pods.
    if m.of_kind("HorizontalPodAutoscaler").next().is_some() {
        let hpa = m.one("HorizontalPodAutoscaler", "router");
        assert_eq!(
            hpa["spec"]["scaleTargetRef"]["name"], deployment["metadata"]["name"],
            "{profile}: HPA target"
        );
        assert!(
            deployment["spec"]["replicas"].is_null(),
            "{profile}: the Deployment sets replicas while the HPA owns them (every upgrade would \
             reset them)"
        );
    } else {
        assert!(
            deployment["spec"]["replicas"].as_u64().is_some(),
            "{profile}: no HPA and no replica count"
        );
    }
    for (component, labels) in [("router", router_labels), ("worker", worker_labels)] {
        let pdb = m.one("PodDisruptionBudget", component);
        assert!(
            pod_labels_match(&pdb["spec"]["selector"]["matchLabels"], labels),
            "{profile}: the {component} PodDisruptionBudget selects no pod"
        );
    }

    // GPU: requested by the GPU profiles, absent from the CPU one; the device setting follows.
    let gpus = worker["resources"]["limits"]["nvidia.com/gpu"].as_u64();
    let device = ws.file["device"].as_str();
    if profile == "cpu" || profile.starts_with("cpu-") {
        assert_eq!(gpus, None, "{profile}: a CPU worker requests a GPU");
        assert_eq!(device, Some("cpu"), "{profile}: device");
        assert!(
            items(&worker_pod["tolerations"]).is_empty(),
            "{profile}: tolerations"
        );
    } else {
        assert!(
            gpus.is_some_and(|n| n >= 1),
            "{profile}: the worker requests no nvidia.com/gpu"
        );
        assert_eq!(device, Some("cuda"), "{profile}: device");
    }
    (rs.effective, ws.effective)
}

#[test]
fn profiles_lint_render_and_hold_together() {
    for (profile, args) in profiles() {
        let output = Command::new(helm_bin())
            .args(["lint", "--strict"])
            .arg(repo_root().join("helm"))
            .args(&args)
            .output()
            .expect("running helm lint");
        assert!(
            output.status.success(),
            "{profile}: helm lint --strict fails:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        check_profile(profile, &args);
    }
}

#[test]
fn values_map_to_settings() {
    // A value set on the command line reaches the binary's effective settings.
    let args: Vec<String> = [
        "--set",
        "router.config.limits.max_new_tokens=512",
        "--set",
        "worker.config.max_num_seqs=7",
        "--set",
        "worker.config.drain_timeout_ms=90000",
        "--set",
        "router.preStopSleepSeconds=5",
        "--set",
        "worker.port=7000",
        // Environment overrides (nested keys with `__`) beat the file.
        "--set-string",
        "router.env[0].name=ROUTER_LIMITS__MAX_STOP_SEQUENCES,router.env[0].value=3",
        "--set-string",
        "worker.env[0].name=WORKER_KV_CACHE_BLOCKS,worker.env[0].value=99",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (router, worker) = check_profile("overrides", &args);
    assert_eq!(router["limits"]["max_new_tokens"], 512);
    assert_eq!(worker["max_num_seqs"], 7);
    assert_eq!(worker["drain_timeout_ms"], 90000);
    assert_eq!(port_of(worker["listen"].as_str().unwrap()), 7000);
    assert_eq!(port_of(router["discovery_dns"].as_str().unwrap()), 7000);
    assert_eq!(router["limits"]["max_stop_sequences"], 3);
    assert_eq!(worker["kv_cache_blocks"], 99);
}

#[test]
fn model_sources_and_switches_hold_together() {
    let cpu = repo_root().join("helm/values-cpu.yaml");
    let cpu = cpu.to_str().unwrap();
    let variants: &[(&str, &[&str])] = &[
        (
            "cpu-pvc",
            &[
                "-f",
                cpu,
                "--set",
                "model.source=pvc,model.pvc.claimName=models",
            ],
        ),
        (
            "cpu-volume",
            &[
                "-f",
                cpu,
                "--set",
                "model.source=volume,model.volume.nfs.server=nfs.example,model.volume.nfs.path=/m",
            ],
        ),
        (
            "cpu-persistent-download",
            &[
                "-f",
                cpu,
                "--set",
                "model.download.persistence.enabled=true",
            ],
        ),
        (
            "gpu-switches-off",
            &[
                "--set",
                "metrics.enabled=false,router.autoscaling.enabled=false",
                "--set",
                "router.podDisruptionBudget.enabled=true,router.preStopSleepSeconds=10",
                "--set",
                "worker.terminationGracePeriodSeconds=120,bindAddress=[::]",
            ],
        ),
    ];
    for (name, args) in variants {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let (router, worker) = check_profile(name, &args);
        let m = Manifests::render(name, &args);
        let pod = &m.one("StatefulSet", "worker")["spec"]["template"]["spec"];
        let volume = items(&pod["volumes"]).iter().find(|v| v["name"] == "model");
        let init = items(&pod["initContainers"]).len();
        match *name {
            "cpu-pvc" => {
                assert_eq!(
                    volume.unwrap()["persistentVolumeClaim"]["claimName"],
                    "models"
                );
                assert_eq!(init, 0, "{name}: no download with a PVC");
            }
            "cpu-volume" => {
                assert_eq!(volume.unwrap()["nfs"]["server"], "nfs.example");
                assert_eq!(init, 0, "{name}: no download with a volume");
            }
            "cpu-persistent-download" => {
                assert!(
                    volume.is_none(),
                    "{name}: the model volume is a claim template"
                );
                let sts = m.one("StatefulSet", "worker");
                assert_eq!(
                    sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"],
                    "model"
                );
                assert_eq!(init, 1);
            }
            _ => {
                assert_eq!(router["metrics_listen"], "");
                assert_eq!(worker["metrics_listen"], "");
                assert!(worker["listen"].as_str().unwrap().starts_with("[::]:"));
                assert_eq!(
                    pod["terminationGracePeriodSeconds"], 120,
                    "{name}: explicit grace period"
                );
            }
        }
    }
}

#[test]
fn service_monitors_select_the_metrics_ports() {
    let m = Manifests::render(
        "servicemonitor",
        &["--set".into(), "serviceMonitor.enabled=true".into()],
    );
    for component in ["router", "worker"] {
        let monitor = m.one("ServiceMonitor", component);
        let service = m.one("Service", component);
        assert!(
            pod_labels_match(
                &monitor["spec"]["selector"]["matchLabels"],
                &service["metadata"]["labels"]
            ),
            "the {component} ServiceMonitor selects no Service"
        );
        for endpoint in items(&monitor["spec"]["endpoints"]) {
            assert!(
                items(&service["spec"]["ports"])
                    .iter()
                    .any(|p| p["name"] == endpoint["port"]),
                "the {component} ServiceMonitor scrapes port {} the Service lacks",
                endpoint["port"]
            );
        }
    }
    // Off by default: clusters without the Prometheus Operator lack the kind.
    let m = Manifests::render("default", &[]);
    assert_eq!(m.of_kind("ServiceMonitor").count(), 0);
}

#[test]
fn wrong_values_fail_at_install_with_a_clear_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "worker.replicas=-1"], "worker.replicas"),
        (
            &["--set", "router.config.limits.max_new_token=5"],
            "max_new_token",
        ),
        (
            &["--set", "worker.config.device=tpu"],
            "worker.config.device",
        ),
        (&["--set", "router.port=grpc"], "router.port"),
        (&["--set", "model.source=pvc"], "claimName"),
        (&["--set", "model.download.sha256=abc"], "sha256"),
        (
            &["--set", "worker.terminationGracePeriodSeconds=10"],
            "must exceed the drain",
        ),
        (&["--set", "router.config.listen=0.0.0.0:1"], "listen"),
        (
            &[
                "--set",
                "worker.env[0].name=WORKER_THREADS,worker.env[0].value=4",
            ],
            "worker.env.0.value",
        ),
    ];
    for (args, expected) in cases {
        match helm_template(args) {
            Ok(_) => panic!("helm template {args:?} accepted a wrong value"),
            Err(message) => assert!(
                message.contains(expected),
                "helm template {args:?}: the error does not name {expected:?}:\n{message}"
            ),
        }
    }
}

/// Starts `bin` from its rendered settings file with `overrides` (flags beat the file: free local
/// ports instead of the pod's).
async fn start_from_rendered(bin: &str, file: &Path, overrides: &[&str], marker: &str) -> Process {
    let mut args = vec!["--config", file.to_str().unwrap()];
    args.extend_from_slice(overrides);
    Process::start(bin, &args, marker, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{bin} does not start from its rendered settings: {e:#}"))
}

#[tokio::test]
async fn probed_health_services_answer_as_the_probes_expect() {
    let m = Manifests::render("default", &[]);
    let config_map = m.of_kind("ConfigMap").next().expect("a ConfigMap");
    let dir = tempfile::tempdir().unwrap();
    for key in ["router.toml", "worker.toml"] {
        std::fs::write(dir.path().join(key), str_of(&config_map["data"][key], key)).unwrap();
    }
    let (_model_dir, model) = tiny_model(7);

    // A router with no worker (its discovery name does not resolve here): alive, not ready. The
    // liveness service must not follow the workers, or Kubernetes would restart a router that waits
    // for workers still loading their model.
    let router_port = free_port();
    let router_addr = format!("127.0.0.1:{router_port}");
    let router = start_from_rendered(
        "router",
        &dir.path().join("router.toml"),
        &["--listen", &router_addr, "--metrics-listen", ""],
        "router ready",
    )
    .await;
    assert_eq!(
        health(&router_addr, "liveness").await.unwrap(),
        ServingStatus::Serving,
        "router liveness without workers"
    );
    assert_eq!(
        health(&router_addr, "inference.v1.TextGeneration")
            .await
            .unwrap(),
        ServingStatus::NotServing,
        "router readiness without workers"
    );
    drop(router);

    // A worker from its rendered settings (the tiny model, a small KV cache): serving once loaded.
    // The default values say `device = "cuda"`, which exits 2 on a host without a GPU: `auto` here.
    let worker_addr = format!("127.0.0.1:{}", free_port());
    let _worker = start_from_rendered(
        "worker",
        &dir.path().join("worker.toml"),
        &[
            "--model",
            model.to_str().unwrap(),
            "--listen",
            &worker_addr,
            "--metrics-listen",
            "",
            "--kv-cache-mib",
            "16",
            "--device",
            "auto",
        ],
        "worker ready",
    )
    .await;
    assert_eq!(
        health(&worker_addr, "inference.worker.v1.Worker")
            .await
            .unwrap(),
        ServingStatus::Serving
    );

    // The router with that worker: ready.
    let router_addr = format!("127.0.0.1:{}", free_port());
    let _router = start_from_rendered(
        "router",
        &dir.path().join("router.toml"),
        &[
            "--listen",
            &router_addr,
            "--metrics-listen",
            "",
            "--workers",
            &worker_addr,
        ],
        "router ready",
    )
    .await;
    wait_health(
        &router_addr,
        "inference.v1.TextGeneration",
        ServingStatus::Serving,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        health(&router_addr, "liveness").await.unwrap(),
        ServingStatus::Serving
    );
}

#[test]
fn check_config_reports_bad_settings_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "model = 'm.gguf'\nthreads = 'many'\n").unwrap();
    let bad = bad.to_str().unwrap();
    let cases: &[(&str, &[&str], &str)] = &[
        ("worker", &["--config", bad], "threads"),
        ("worker", &[], "no model given"),
        (
            "worker",
            &["--model", "m.gguf", "--metrics-listen", "x"],
            "metrics_listen",
        ),
        ("router", &[], "no workers given"),
        (
            "router",
            &["--discovery-dns", "workers.ns.svc"],
            "discovery_dns",
        ),
    ];
    for (bin, args, expected) in cases {
        let output = without_host_settings(&mut Command::new(bin_path(bin)))
            .args(*args)
            .arg("--check-config")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{bin} {args:?}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{bin} {args:?}: the error does not name {expected:?}: {stderr}"
        );
        assert!(output.stdout.is_empty(), "{bin} {args:?}: printed settings");
    }
    // Valid settings: exit 0 and the effective settings as JSON, flags applied.
    let output = without_host_settings(&mut Command::new(bin_path("worker")))
        .args(["--model", "m.gguf", "--max-num-seqs", "5", "--check-config"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let settings: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(settings["max_num_seqs"], 5);
    assert_eq!(settings["model"], "m.gguf");
}

#[test]
fn api_keys_secret_and_worker_network_policy() {
    let m = Manifests::render(
        "access",
        &[
            "--set".into(),
            "router.apiKeys.existingSecret=router-keys".into(),
            "--set".into(),
            "networkPolicy.enabled=true".into(),
        ],
    );
    // The router reads the key file from the Secret, mounted as a directory (no subPath, so a
    // rotated Secret reaches the pod).
    let deployment = m.one("Deployment", "router");
    let pod = &deployment["spec"]["template"]["spec"];
    let router = items(&pod["containers"])
        .iter()
        .find(|c| c["name"] == "router")
        .expect("a router container");
    let args: Vec<&str> = items(&router["args"])
        .iter()
        .map(|a| str_of(a, "an argument"))
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--api-keys-file")
        .unwrap_or_else(|| panic!("no --api-keys-file in {args:?}"));
    let (dir, file) = args[at + 1].rsplit_once('/').expect("a path");
    let mount = items(&router["volumeMounts"])
        .iter()
        .find(|vm| vm["mountPath"] == dir)
        .unwrap_or_else(|| panic!("nothing mounted at {dir}"));
    assert_eq!(mount["readOnly"], true);
    assert!(mount.get("subPath").is_none(), "{mount:?}");
    let volume = items(&pod["volumes"])
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the key volume");
    assert_eq!(volume["secret"]["secretName"], "router-keys");
    assert!(items(&volume["secret"]["items"])
        .iter()
        .any(|i| i["key"] == "api-keys" && i["path"] == file));

    // Only router pods reach the workers' gRPC port; the metrics port stays open.
    let policy = m.one("NetworkPolicy", "worker");
    let sts = m.one("StatefulSet", "worker");
    let worker_labels = &sts["spec"]["template"]["metadata"]["labels"];
    let router_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert!(pod_labels_match(
        &policy["spec"]["podSelector"]["matchLabels"],
        worker_labels
    ));
    let worker = items(&sts["spec"]["template"]["spec"]["containers"])
        .iter()
        .find(|c| c["name"] == "worker")
        .expect("a worker container");
    let grpc = container_port(worker, "grpc").expect("the worker's grpc port");
    let metrics = container_port(worker, "metrics").expect("the worker's metrics port");
    let rules = items(&policy["spec"]["ingress"]);
    let grpc_rules: Vec<&Value> = rules
        .iter()
        .filter(|r| {
            items(&r["ports"])
                .iter()
                .any(|p| u64_of(&p["port"], "port") == grpc)
        })
        .collect();
    assert_eq!(grpc_rules.len(), 1, "{rules:?}");
    let from = items(&grpc_rules[0]["from"]);
    assert_eq!(from.len(), 1, "{from:?}");
    assert!(pod_labels_match(
        &from[0]["podSelector"]["matchLabels"],
        router_labels
    ));
    assert!(
        !pod_labels_match(&from[0]["podSelector"]["matchLabels"], worker_labels),
        "workers may not reach each other"
    );
    assert!(rules.iter().any(|r| r.get("from").is_none()
        && items(&r["ports"])
            .iter()
            .any(|p| u64_of(&p["port"], "port") == metrics)));

    // Both off by default.
    let m = Manifests::render("default", &[]);
    assert_eq!(m.of_kind("NetworkPolicy").count(), 0);
    let router = &m.one("Deployment", "router")["spec"]["template"]["spec"]["containers"][0];
    assert!(!items(&router["args"])
        .iter()
        .any(|a| a == "--api-keys-file"));
}

/// The Secret and key behind the file `path` in `container` of `pod` (mounted as a directory,
/// read-only, no subPath, so a renewed Secret reaches the pod).
fn secret_file<'a>(pod: &'a Value, container: &Value, path: &str) -> (&'a str, String) {
    let (dir, file) = path.rsplit_once('/').expect("a path");
    let mount = items(&container["volumeMounts"])
        .iter()
        .find(|vm| vm["mountPath"] == dir)
        .unwrap_or_else(|| panic!("nothing mounted at {dir}"));
    assert_eq!(mount["readOnly"], true, "{mount:?}");
    assert!(mount.get("subPath").is_none(), "{mount:?}");
    let volume = items(&pod["volumes"])
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume {}", mount["name"]));
    let item = items(&volume["secret"]["items"])
        .iter()
        .find(|i| i["path"] == file)
        .unwrap_or_else(|| panic!("the Secret volume has no item {file}: {volume:?}"));
    (
        str_of(&volume["secret"]["secretName"], "secretName"),
        str_of(&item["key"], "item key").to_string(),
    )
}

/// The value after `flag` in `container`'s arguments.
fn flag_value<'a>(container: &'a Value, flag: &str) -> &'a str {
    let args = items(&container["args"]);
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"));
    str_of(&args[at + 1], flag)
}

#[test]
fn tls_secrets_are_mounted_and_accepted_and_probes_use_the_health_ports() {
    let m = Manifests::render(
        "tls",
        &[
            "--set".into(),
            "router.tls.existingSecret=router-tls".into(),
            "--set".into(),
            "worker.tls.existingSecret=worker-tls".into(),
            "--set".into(),
            "networkPolicy.enabled=true".into(),
        ],
    );
    // Test certificates standing for the Secrets' files (cert-manager's key names).
    let dir = tempfile::tempdir().unwrap();
    let ca = tls_certs::test_ca::TestCa::new("helm test CA");
    let secret_dir = |name: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        let (cert, key) = ca.server_cert(&["localhost"]);
        std::fs::write(d.join("tls.crt"), cert).unwrap();
        std::fs::write(d.join("tls.key"), key).unwrap();
        std::fs::write(d.join("ca.crt"), &ca.pem).unwrap();
        d
    };
    let (router_secret, worker_secret) = (secret_dir("router-tls"), secret_dir("worker-tls"));

    let deployment = m.one("Deployment", "router");
    let pod = &deployment["spec"]["template"]["spec"];
    let router = items(&pod["containers"])
        .iter()
        .find(|c| c["name"] == "router")
        .expect("a router container");
    let sts = m.one("StatefulSet", "worker");
    let worker_pod = &sts["spec"]["template"]["spec"];
    let worker = items(&worker_pod["containers"])
        .iter()
        .find(|c| c["name"] == "worker")
        .expect("a worker container");
    for (container, pod, secret) in [
        (router, pod, "router-tls"),
        (worker, worker_pod, "worker-tls"),
    ] {
        for (flag, key) in [("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")] {
            let (name, item) = secret_file(pod, container, flag_value(container, flag));
            assert_eq!((name, item.as_str()), (secret, key), "{flag}");
        }
        // Kubernetes' gRPC probes cannot speak TLS: they ask the plain health port.
        let health = port_of(flag_value(container, "--health-listen"));
        assert_eq!(container_port(container, "health"), Some(health));
        assert_ne!(container_port(container, "grpc"), Some(health));
        let services = if secret == "router-tls" {
            [
                ("startupProbe", "liveness"),
                ("livenessProbe", "liveness"),
                ("readinessProbe", "inference.v1.TextGeneration"),
            ]
        } else {
            ["startupProbe", "livenessProbe", "readinessProbe"]
                .map(|p| (p, "inference.worker.v1.Worker"))
        };
        assert_grpc_probes("tls", container, health, services);
    }
    // The routers trust the CA of the workers' Secret and verify the headless service's name.
    let (name, item) = secret_file(pod, router, flag_value(router, "--worker-tls-ca"));
    assert_eq!((name, item.as_str()), ("worker-tls", "ca.crt"));

    // The binaries accept the rendered flags with such files.
    let mounts = |secret: &Path| {
        [
            ("/etc/smollm-tls", secret.to_path_buf()),
            ("/etc/smollm-worker-ca", worker_secret.clone()),
        ]
    };
    let router_mounts = mounts(&router_secret);
    let router_mounts: Vec<(&str, &Path)> = router_mounts
        .iter()
        .map(|(d, p)| (*d, p.as_path()))
        .collect();
    let rs = load_settings(&m, pod, router, "router", &router_mounts);
    assert_eq!(
        rs.effective["tls_cert"],
        router_secret.join("tls.crt").to_str().unwrap()
    );
    assert_eq!(
        rs.effective["worker_tls_ca"],
        worker_secret.join("ca.crt").to_str().unwrap()
    );
    let discovery = str_of(&rs.effective["discovery_dns"], "discovery_dns");
    assert_eq!(
        rs.effective["worker_tls_server_name"],
        discovery.rsplit_once(':').unwrap().0,
        "the name verified is the headless service's"
    );
    let ws = load_settings(
        &m,
        worker_pod,
        worker,
        "worker",
        &[("/etc/smollm-tls", worker_secret.as_path())],
    );
    assert_eq!(
        ws.effective["tls_key"],
        worker_secret.join("tls.key").to_str().unwrap()
    );

    // The workers' plain health port is open to the kubelet; gRPC only to routers.
    let policy = m.one("NetworkPolicy", "worker");
    let open: Vec<u64> = items(&policy["spec"]["ingress"])
        .iter()
        .filter(|r| r.get("from").is_none())
        .flat_map(|r| {
            items(&r["ports"])
                .iter()
                .map(|p| u64_of(&p["port"], "port"))
        })
        .collect();
    assert!(
        open.contains(&container_port(worker, "health").unwrap()),
        "{open:?}"
    );
    assert!(
        !open.contains(&container_port(worker, "grpc").unwrap()),
        "{open:?}"
    );

    // Off by default: no TLS flags, probes on the gRPC ports.
    let m = Manifests::render("default", &[]);
    let router = &m.one("Deployment", "router")["spec"]["template"]["spec"]["containers"][0];
    for flag in ["--tls-cert", "--worker-tls-ca", "--health-listen"] {
        assert!(!items(&router["args"]).iter().any(|a| a == flag), "{flag}");
    }
    assert_eq!(
        u64_of(&router["readinessProbe"]["grpc"]["port"], "probe port"),
        container_port(router, "grpc").unwrap()
    );
}
