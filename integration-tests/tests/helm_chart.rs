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
//! - worker groups (helm/values-multi-group.yaml): a StatefulSet, headless Service, settings file,
//!   PDB and NetworkPolicy per group, all discovered by the router through one headless Service;
//! - the GIE profile (helm/values-gie.yaml): each InferencePool validates against the GIE v1 CRD's
//!   published schema (fixtures/gie), selects one group's pods on the HTTP port of their router
//!   sidecar (whose settings make its own pod's worker its only worker), and its endpoint picker
//!   reads the workers' GIE gauges on their metrics port;
//!
//! and, on real processes started from the rendered settings, that the health services the probes
//! ask for answer as the probes expect.
//!
//! Needs `helm` (scripts/install-helm puts it in `.cache/helm/bin`, scripts/test runs it first; `HELM`
//! names another binary) and the release binaries (`cargo build --release --bins`).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use integration_tests::ops::{health, wait_health};
use integration_tests::{bin_path, free_port, tiny_model, Process};
use serde_json::Value;
use tonic_health::pb::health_check_response::ServingStatus;

#[path = "helm_chart/checks.rs"]
mod checks;
#[path = "helm_chart/groups.rs"]
mod groups;
#[path = "helm_chart/render.rs"]
mod render;
#[path = "helm_chart/secrets.rs"]
mod secrets;
#[path = "helm_chart/settings.rs"]
mod settings;

use checks::{check_profile, pod_labels_match};
use groups::{check_gie, check_groups};
use render::{helm_bin, helm_template, items, port_of, profiles, repo_root, str_of, Manifests};
use settings::without_host_settings;

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
fn the_openai_http_api_is_exposed_on_its_port_or_off() {
    let on = ["--set", "router.http.port=8080"].map(String::from);
    let (router, _) = check_profile("http-8080", &on);
    assert_eq!(router["http_listen"], "0.0.0.0:8080");
    let m = Manifests::render("http-8080", &on);
    let service = m.one("Service", "router");
    let http = items(&service["spec"]["ports"])
        .iter()
        .find(|p| p["name"] == "http")
        .cloned()
        .expect("an http Service port");
    assert_eq!(http["port"], 8080);
    let off = ["--set", "router.http.enabled=false"].map(String::from);
    let (router, _) = check_profile("http-off", &off);
    assert_eq!(router["http_listen"], "");
    // The chart owns http_listen (like listen): the value is router.http.
    for (args, expected) in [
        (["--set", "router.http.port=0"], "router.http.port"),
        (["--set", "router.http.enabled=yes"], "router.http.enabled"),
        (
            ["--set", "router.config.http_listen=0.0.0.0:1"],
            "http_listen",
        ),
    ] {
        match helm_template(&args) {
            Ok(_) => panic!("helm template {args:?} accepted a wrong value"),
            Err(message) => assert!(message.contains(expected), "{args:?}: {message}"),
        }
    }
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

#[test]
fn worker_groups_render_apart_and_are_all_discovered() {
    let file = |name: &str| repo_root().join("helm").join(name).display().to_string();
    let args = vec!["-f".to_string(), file("values-multi-group.yaml")];
    let m = Manifests::render("multi-group", &args);
    let files = check_groups(&m, &["smollm2", "gemma3"]);
    let model = |i: usize| str_of(&files[i].1["model"], "model").to_string();
    assert_eq!(model(0), "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(model(1), "/models/gemma-3-270m-q4_k_m.gguf");
    assert_eq!(files[0].1["device"], "cuda");
    assert_eq!(files[1].1["device"], "cpu");
    assert_eq!(files[0].1["served_model_name"], "smollm2-135m-instruct");
    assert_eq!(files[1].1["served_model_name"], "gemma-3-270m");
    // Group values replace (not merge) the node selector and resources: the CPU group keeps no GPU.
    let gemma = m.named("StatefulSet", "smollm-serve-worker-gemma3");
    let (pod, _, container) = groups::worker_pod(gemma);
    assert!(
        pod["nodeSelector"].is_null() && pod["tolerations"].is_null(),
        "{pod}"
    );
    assert!(container["resources"]["limits"]
        .get("nvidia.com/gpu")
        .is_none());
    let smollm = m.named("StatefulSet", "smollm-serve-worker-smollm2");
    assert_eq!(
        groups::worker_pod(smollm).2["resources"]["limits"]["nvidia.com/gpu"],
        1
    );
    // The rest of the profile checks hold for the groups' render too (one router, settings load).
    let router = m.one("Deployment", "router");
    let router_pod = &router["spec"]["template"]["spec"];
    let rs = settings::load_settings(&m, router_pod, &router_pod["containers"][0], "router", &[]);
    assert_eq!(
        rs.effective["discovery_dns"],
        "smollm-serve-worker-headless.inference.svc.cluster.local:50061"
    );
    assert_eq!(rs.file["default_model"], "smollm2-135m-instruct");
    settings::assert_known_keys("multi-group", "router", &rs.file, &rs.effective, &[]);
    // Wrong groups fail at install, naming the value.
    for (args, expected) in [
        (["--set", "workers[0].name=Bad"], "workers.0.name"),
        (["--set", "workers[0].name=a,workers[0].port=1"], "port"),
        (["--set", "workers[0].replicas=1"], "name is required"),
        (
            ["--set", "workers[0].name=a,workers[1].name=a"],
            "used twice",
        ),
        (
            ["--set", "workers[0].name=a,workers[0].device=tpu"],
            "workers.0.device",
        ),
    ] {
        match helm_template(&args) {
            Ok(_) => panic!("helm template {args:?} accepted a wrong group"),
            Err(message) => assert!(message.contains(expected), "{args:?}: {message}"),
        }
    }
}

#[test]
fn the_gie_profile_renders_inference_pools_the_crd_accepts() {
    let file = |name: &str| repo_root().join("helm").join(name).display().to_string();
    let gie = vec!["-f".to_string(), file("values-gie.yaml")];
    let m = Manifests::render("gie", &gie);
    assert_eq!(check_gie(&m), ["smollm-serve-worker"]);
    let both = vec![
        "-f".to_string(),
        file("values-multi-group.yaml"),
        "-f".to_string(),
        file("values-gie.yaml"),
    ];
    let m = Manifests::render("gie-groups", &both);
    let mut pools = check_gie(&m);
    pools.sort();
    assert_eq!(
        pools,
        ["smollm-serve-worker-gemma3", "smollm-serve-worker-smollm2"]
    );
    let mut one = both.clone();
    one.extend(["--set".to_string(), "gie.groups={gemma3}".to_string()]);
    assert_eq!(
        check_gie(&Manifests::render("gie-one-group", &one)),
        ["smollm-serve-worker-gemma3"]
    );
    // Off by default.
    assert_eq!(
        Manifests::render("default", &[])
            .of_kind("InferencePool")
            .count(),
        0
    );
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
