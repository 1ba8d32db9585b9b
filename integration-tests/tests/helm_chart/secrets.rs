//! Secrets: API keys, TLS certificates mounted from Secrets, and the worker NetworkPolicy.

use std::path::Path;

use serde_json::Value;

use super::checks::{assert_grpc_probes, pod_labels_match};
use super::render::{container_port, items, port_of, str_of, u64_of, Manifests};
use super::settings::load_settings;

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
