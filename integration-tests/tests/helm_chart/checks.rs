//! What every rendered profile must hold: ports, probes, settings, hardening, grace periods.

use serde_json::Value;

use super::render::{
    container_port, items, port_of, str_of, u64_of, Manifests, CLUSTER_DOMAIN, NAMESPACE,
};
use super::settings::{assert_known_keys, load_settings};

/// Worker keys the chart writes ahead of the binary (none: every key it writes is a worker setting).
const PENDING_WORKER_KEYS: &[&str] = &[];

pub(crate) fn pod_labels_match(selector: &Value, labels: &Value) -> bool {
    let selector = selector.as_object().expect("a label selector");
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Requests (cpu, memory) and a memory limit; a security context that runs as non-root with no
/// privilege escalation, a read-only root filesystem and no capabilities.
pub(crate) fn assert_container_hardened(profile: &str, pod: &Value, container: &Value) {
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
pub(crate) fn assert_grpc_probes(
    profile: &str,
    container: &Value,
    port: u64,
    services: [(&str, &str); 3],
) {
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
pub(crate) fn grace_and_prestop_ms(pod: &Value, container: &Value) -> (u64, u64) {
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
pub(crate) fn check_profile(profile: &str, args: &[String]) -> (Value, Value) {
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

    // The router replicas find each other through their own headless Service (tenant limits
    // shared among them).
    let replicas = m.one("Service", "router-replicas");
    let replicas_name = str_of(&replicas["metadata"]["name"], "service name");
    assert_eq!(
        replicas["spec"]["clusterIP"], "None",
        "{profile}: the router replicas' Service is not headless"
    );
    assert!(
        pod_labels_match(&replicas["spec"]["selector"], router_labels),
        "{profile}: the router replicas' Service selects no router pod"
    );
    assert_eq!(
        str_of(
            &rs.effective["replica_discovery_dns"],
            "replica_discovery_dns"
        ),
        format!("{replicas_name}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}:{router_port}"),
        "{profile}: the routers look for each other somewhere else"
    );
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

    // The OpenAI HTTP API (router.http, on by default): the router binds http_listen on every
    // interface, and the container and the Service expose it as the port named `http`.
    let http_listen = str_of(&rs.effective["http_listen"], "router http_listen");
    let service_http = items(&router_service["spec"]["ports"])
        .iter()
        .find(|p| p["name"] == "http");
    if http_listen.is_empty() {
        assert_eq!(container_port(router, "http"), None, "{profile}: http off");
        assert!(
            service_http.is_none(),
            "{profile}: http off, yet a Service port"
        );
    } else {
        let ip = http_listen.rsplit_once(':').unwrap().0;
        assert!(
            ip == "0.0.0.0" || ip == "[::]",
            "{profile}: the router serves HTTP on {http_listen} only"
        );
        assert_eq!(
            container_port(router, "http"),
            Some(port_of(http_listen)),
            "{profile}: router http containerPort"
        );
        let service_http = service_http
            .unwrap_or_else(|| panic!("{profile}: the router Service has no http port"));
        assert_eq!(service_http["targetPort"], "http", "{profile}");
    }

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
