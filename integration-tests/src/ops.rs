//! Helpers for the operations tests: gRPC channels, the standard health check, scraping and
//! parsing the Prometheus endpoints, signals to a process, and the router's ready-worker count.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use inference_proto::public::ModelInfoRequest;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::transport::Channel;
use tonic::Status;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// A connected gRPC channel to `addr` (`HOST:PORT`).
pub async fn channel(addr: &str) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"))
}

/// The `grpc.health.v1` status of `service` at `addr`.
pub async fn health(addr: &str, service: &str) -> Result<ServingStatus, Status> {
    let mut client = HealthClient::new(channel(addr).await);
    let response = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await?;
    Ok(response.into_inner().status())
}

/// Waits until `service` at `addr` reports `want`.
pub async fn wait_health(addr: &str, service: &str, want: ServingStatus, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let status = health(addr, service).await;
        if status.as_ref().ok() == Some(&want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{addr} {service:?} is {status:?}, not {want:?}, after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET /metrics` at `addr` asking for OpenMetrics (as Prometheus does): the body, after checking
/// the status and content type.
pub async fn scrape(addr: &str) -> String {
    let body = get_metrics(
        addr,
        "Accept: application/openmetrics-text; version=1.0.0\r\n",
    )
    .await;
    assert!(body.ends_with("# EOF\n"), "not OpenMetrics:\n{body}");
    body
}

/// `GET /metrics` at `addr` without an `Accept` header (as `curl` does): the Prometheus text format
/// 0.0.4 body, after checking the status and content type.
pub async fn scrape_text(addr: &str) -> String {
    get_metrics(addr, "").await
}

/// `GET /metrics` at `addr` with `extra_headers` (each ending in CRLF): the body.
async fn get_metrics(addr: &str, extra_headers: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connecting to the metrics endpoint {addr}: {e}"));
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{extra_headers}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text"), "{head}");
    body.to_string()
}

/// Parses the Prometheus / OpenMetrics text format strictly enough to catch a malformed line:
/// every sample is `name{labels} value`, every sample's family has a `# TYPE`, and the text ends
/// with `# EOF`. Returns `name{labels}` -> value.
pub fn parse_metrics(text: &str) -> HashMap<String, f64> {
    assert!(text.ends_with("# EOF\n"), "no # EOF terminator:\n{text}");
    let mut types = HashMap::new();
    let mut samples = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                assert!(
                    labels.starts_with('{') && labels.ends_with('}') && labels.contains("=\""),
                    "bad labels in {line:?}"
                );
            }
        }
        let family = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).filter(|f| types.contains_key(*f)))
            .unwrap_or(name);
        assert!(types.contains_key(family), "no # TYPE for {line:?}");
        assert!(
            samples.insert(series.to_string(), value).is_none(),
            "duplicate series {series}"
        );
    }
    samples
}

/// The value of `series` (`name{labels}` as printed); panics when it is missing.
pub fn metric(samples: &HashMap<String, f64>, series: &str) -> f64 {
    *samples
        .get(series)
        .unwrap_or_else(|| panic!("no series {series} in {samples:#?}"))
}

/// The sum of the series of metric `name` (as printed, e.g. `router_requests_total`) whose labels
/// include every pair of `labels`, whatever their other labels (e.g. every `model_name`); 0 when
/// there is none.
pub fn metric_sum(samples: &HashMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            let Some(rest) = series.strip_prefix(name) else {
                return false;
            };
            let pairs = series_labels(rest);
            (rest.is_empty() || rest.starts_with('{'))
                && labels
                    .iter()
                    .all(|&(k, v)| pairs.iter().any(|(pk, pv)| pk == k && pv == v))
        })
        .map(|(_, value)| value)
        .sum()
}

/// The `(label, value)` pairs of a series' `{a="x",b="y"}` (empty for none); values unescaped.
fn series_labels(braces: &str) -> Vec<(String, String)> {
    let inner = braces
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .unwrap_or("");
    let mut pairs = Vec::new();
    let mut chars = inner.chars().peekable();
    while chars.peek().is_some() {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        assert_eq!(chars.next(), Some('"'), "bad labels {braces}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.extend(chars.next()),
                '"' => break,
                c => value.push(c),
            }
        }
        if chars.peek() == Some(&',') {
            chars.next();
        }
        pairs.push((key.trim().to_string(), value));
    }
    pairs
}

/// Sends `signal` (e.g. "STOP", "CONT") to `process`.
pub fn signal(process: &crate::Process, signal: &str) {
    let pid = process.pid().expect("the process is running");
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("running kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// Waits until the router behind `client` reports `n` ready workers; returns how long it took.
pub async fn wait_ready_workers(
    client: &mut crate::PublicClient,
    n: u32,
    timeout: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        let info = client
            .model_info(ModelInfoRequest::default())
            .await
            .unwrap()
            .into_inner();
        if info.ready_workers == n {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < timeout,
            "{} ready workers, not {n}, after {timeout:?}",
            info.ready_workers
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
