//! Worker groups (values `workers`) and the GIE profile (values `gie`): what their renders must hold.

use serde_json::{json, Value};

use super::checks::{assert_container_hardened, pod_labels_match};
use super::render::{container_port, items, port_of, repo_root, str_of, Manifests};
use super::settings::{assert_known_keys, load_settings};

/// A group's worker pod spec, pod labels and worker container.
pub(crate) fn worker_pod(sts: &Value) -> (&Value, &Value, &Value) {
    let pod = &sts["spec"]["template"]["spec"];
    let container = items(&pod["containers"])
        .iter()
        .find(|c| c["name"] == "worker")
        .expect("a worker container");
    (
        pod,
        &sts["spec"]["template"]["metadata"]["labels"],
        container,
    )
}

/// The vendored InferencePool v1 schema (fixtures/gie), read strictly: objects with known
/// properties refuse unknown ones (as `kubectl apply --validate=strict` does).
pub(crate) fn strict_pool_schema() -> Value {
    let path = repo_root().join("fixtures/gie/inferencepool-v1.schema.json");
    let text = std::fs::read_to_string(&path).expect("the vendored InferencePool schema");
    let mut schema: Value = serde_json::from_str(&text).expect("JSON");
    let source = schema["$comment"].to_string();
    assert!(
        source.contains("inference.networking.k8s.io/v1") && source.contains("v1.6.0"),
        "{} does not name its source and version",
        path.display()
    );
    schema.as_object_mut().unwrap().remove("$comment");
    fn walk(node: &mut Value) {
        match node {
            Value::Object(map) => {
                if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                    map.insert("additionalProperties".into(), Value::Bool(false));
                }
                map.values_mut().for_each(walk);
            }
            Value::Array(list) => list.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut schema);
    schema
}

/// The schema's errors for `pool`, plus the CRD's two CEL rules (x-kubernetes-validations).
pub(crate) fn pool_errors(validator: &jsonschema::Validator, pool: &Value) -> Vec<String> {
    let mut errors: Vec<String> = validator
        .iter_errors(pool)
        .map(|e| format!("{}: {e}", e.instance_path))
        .collect();
    let spec = &pool["spec"];
    let picker = &spec["endpointPickerRef"];
    if picker.is_object()
        && picker.get("kind").is_none_or(|k| k == "Service")
        && picker.get("port").is_none()
    {
        errors.push("endpointPickerRef: port is required when kind is Service".into());
    }
    let numbers: Vec<String> = items(&spec["targetPorts"])
        .iter()
        .map(|p| p["number"].to_string())
        .collect();
    let unique: std::collections::HashSet<&String> = numbers.iter().collect();
    if unique.len() != numbers.len() {
        errors.push("targetPorts: port number must be unique".into());
    }
    if pool["apiVersion"] != "inference.networking.k8s.io/v1" {
        errors.push(format!("apiVersion {}", pool["apiVersion"]));
    }
    errors
}

/// Checks the worker groups of `m`: one StatefulSet per group with its own headless Service,
/// settings file, PDB and NetworkPolicy, every group's pods behind the shared headless Service that
/// the router discovers, each group's settings loaded by the worker's own loader with no key it
/// ignores; returns each group's rendered settings file (as JSON) by StatefulSet name.
pub(crate) fn check_groups(m: &Manifests, groups: &[&str]) -> Vec<(String, Value)> {
    let profile = &m.profile;
    let shared = m.named("Service", "smollm-serve-worker-headless");
    let mut found = Vec::new();
    for group in groups {
        let name = format!("smollm-serve-worker-{group}");
        let sts = m.named("StatefulSet", &name);
        let (pod, labels, container) = worker_pod(sts);
        assert_eq!(
            labels["smollm-serve/worker-group"], *group,
            "{profile}: {name}"
        );
        assert!(
            pod_labels_match(&sts["spec"]["selector"]["matchLabels"], labels)
                && sts["spec"]["selector"]["matchLabels"]["smollm-serve/worker-group"] == *group,
            "{profile}: {name} must select only its group's pods"
        );
        let headless = m.named(
            "Service",
            str_of(&sts["spec"]["serviceName"], "serviceName"),
        );
        assert_eq!(headless["spec"]["clusterIP"], "None", "{profile}: {name}");
        assert_eq!(
            headless["spec"]["selector"]["smollm-serve/worker-group"], *group,
            "{profile}: {name}: its headless Service must select its group"
        );
        assert!(pod_labels_match(&headless["spec"]["selector"], labels));
        assert!(
            pod_labels_match(&shared["spec"]["selector"], labels),
            "{profile}: the discovery Service does not select group {group}'s pods"
        );
        for kind in ["PodDisruptionBudget", "NetworkPolicy"] {
            let object = m.named(kind, &name);
            let selector = if kind == "NetworkPolicy" {
                &object["spec"]["podSelector"]["matchLabels"]
            } else {
                &object["spec"]["selector"]["matchLabels"]
            };
            assert!(
                pod_labels_match(selector, labels)
                    && selector["smollm-serve/worker-group"] == *group,
                "{profile}: the {kind} {name} does not select exactly group {group}"
            );
        }
        let settings = load_settings(m, pod, container, "worker", &[]);
        assert_known_keys(profile, "worker", &settings.file, &settings.effective, &[]);
        found.push((name, settings.file));
    }
    assert_eq!(
        m.of_kind("StatefulSet").count(),
        groups.len(),
        "{profile}: one StatefulSet per group"
    );
    found
}

/// Checks the GIE objects of `m`: each InferencePool validates against the CRD's schema, selects
/// exactly one group's worker pods on the HTTP port of their router sidecar (the OpenAI API the
/// GIE model-server protocol wants on the target port; the worker speaks only gRPC), whose
/// settings load with the router's own loader and name its own pod's worker as its only worker,
/// and names a picker Service whose Deployment reads the workers' GIE gauges on their metrics
/// port. Returns the pools' names.
pub(crate) fn check_gie(m: &Manifests) -> Vec<String> {
    let profile = &m.profile;
    let validator = jsonschema::validator_for(&strict_pool_schema()).expect("a valid schema");
    // The check itself refuses what the CRD refuses.
    let bad = json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "x"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPort": 1,
                 "targetPorts": [{"number": 1}, {"number": 1}],
                 "endpointPickerRef": {"name": "epp"}}
    });
    assert_eq!(
        pool_errors(&validator, &bad).len(),
        3,
        "{:?}",
        pool_errors(&validator, &bad)
    );
    let mut names = Vec::new();
    for pool in m.of_kind("InferencePool") {
        let name = str_of(&pool["metadata"]["name"], "pool name").to_string();
        let errors = pool_errors(&validator, pool);
        assert!(
            errors.is_empty(),
            "{profile}: InferencePool {name}: {errors:?}"
        );
        let selector = &pool["spec"]["selector"]["matchLabels"];
        let selected: Vec<&Value> = m
            .of_kind("StatefulSet")
            .filter(|s| pod_labels_match(selector, worker_pod(s).1))
            .collect();
        assert_eq!(
            selected.len(),
            1,
            "{profile}: {name} must select one group's pods"
        );
        // The gateway sends the client's OpenAI request to the picked pod on the target port: the
        // router sidecar's HTTP port, its only worker its own pod's; the picker scrapes the worker.
        let (pod, _, worker) = worker_pod(selected[0]);
        let metrics = container_port(worker, "metrics").expect("metrics port");
        let grpc = container_port(worker, "grpc").expect("grpc port");
        let sidecar = items(&pod["containers"])
            .iter()
            .find(|c| c["name"] == "router")
            .unwrap_or_else(|| panic!("{profile}: {name}'s pods have no router sidecar"));
        let http = container_port(sidecar, "http").expect("the sidecar's http port");
        assert_eq!(
            pool["spec"]["targetPorts"][0]["number"], http,
            "{profile}: {name}'s target port is not the router sidecar's HTTP port"
        );
        assert_ne!(http, metrics, "{profile}: {name}");
        let probe = &sidecar["readinessProbe"]["httpGet"];
        assert_eq!(
            probe["path"], "/health",
            "{profile}: {name}'s sidecar readiness"
        );
        assert_eq!(probe["port"], http, "{profile}: {name}'s sidecar readiness");
        assert_container_hardened(profile, pod, sidecar);
        let settings = load_settings(m, pod, sidecar, "router", &[]);
        assert_known_keys(profile, "router", &settings.file, &settings.effective, &[]);
        assert_eq!(
            settings.effective["workers"],
            json!([format!("127.0.0.1:{grpc}")]),
            "{profile}: {name}'s router sidecar must route to its own pod's worker only"
        );
        assert_eq!(
            settings.effective["discovery_dns"], "",
            "{profile}: {name}'s router sidecar discovers workers"
        );
        assert_eq!(
            port_of(str_of(&settings.effective["http_listen"], "http_listen")),
            http,
            "{profile}: {name}'s router sidecar serves HTTP on another port"
        );
        let metrics_port = metrics.to_string();
        let picker = str_of(&pool["spec"]["endpointPickerRef"]["name"], "picker");
        let service = m.named("Service", picker);
        assert!(items(&service["spec"]["ports"])
            .iter()
            .any(|p| p["port"] == pool["spec"]["endpointPickerRef"]["port"]["number"]));
        let deployment = m.named("Deployment", picker);
        let args: Vec<&str> =
            items(&deployment["spec"]["template"]["spec"]["containers"][0]["args"])
                .iter()
                .map(|a| str_of(a, "an argument"))
                .collect();
        for (flag, value) in [
            ("--pool-name", name.as_str()),
            ("--total-queued-requests-metric", "worker_waiting_sequences"),
            (
                "--total-running-requests-metric",
                "worker_running_sequences",
            ),
            (
                "--kv-cache-usage-percentage-metric",
                "worker_kv_cache_usage_ratio",
            ),
            ("--cache-info-metric", "worker_cache_config_info"),
            ("--model-server-metrics-port", metrics_port.as_str()),
        ] {
            let at = args.iter().position(|a| *a == flag);
            assert_eq!(
                at.map(|i| args[i + 1]),
                Some(value),
                "{profile}: the picker of {name} lacks {flag} {value}: {args:?}"
            );
        }
        names.push(name);
    }
    names
}
