//! The Prometheus text exposition format 0.0.4, derived from the OpenMetrics text that
//! `prometheus-client` writes, for scrapers that do not ask for OpenMetrics (`curl`, `promtool
//! check metrics`, older Prometheus servers).
//!
//! The two formats differ where it matters here in one way: an OpenMetrics counter family is named
//! without its `_total` suffix (`# TYPE router_requests counter`, samples `router_requests_total`),
//! while in 0.0.4 the family is named as its samples (`# TYPE router_requests_total counter`); a
//! 0.0.4 parser reading OpenMetrics sees untyped samples with no help text. So [`from_openmetrics`]
//! renames counter families, drops the OpenMetrics-only lines (`# EOF`, `# UNIT`, counters'
//! `_created` samples) and exemplars, writes `unknown` as `untyped`, and unescapes `\"` in help
//! text (0.0.4 help escapes only `\\` and `\n`). Source of both formats: the Prometheus
//! "Exposition formats" page and the OpenMetrics 1.0 specification.

use std::collections::HashSet;

/// Content type of the Prometheus text format 0.0.4.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `text` (OpenMetrics, as `prometheus_client::encoding::text::encode` writes it) in the
/// Prometheus text format 0.0.4. Lines it does not recognise pass through unchanged.
pub fn from_openmetrics(text: &str) -> String {
    let counters: HashSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(text.len() + 16 * counters.len());
    for line in text.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let help = help.replace("\\\"", "\"");
            out.push_str(&format!("# HELP {}", family_name(name, &counters)));
            if !help.is_empty() {
                out.push(' ');
                out.push_str(&help);
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let kind = if kind == "unknown" { "untyped" } else { kind };
            out.push_str(&format!("# TYPE {} {kind}", family_name(name, &counters)));
        } else if line.starts_with('#') {
            out.push_str(line);
        } else {
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let is_created = line[..name_end]
                .strip_suffix("_created")
                .is_some_and(|family| counters.contains(family));
            if is_created {
                continue;
            }
            // An exemplar follows the value after " # ".
            let sample = match line.find(" # ") {
                Some(at) => &line[..at],
                None => line,
            };
            out.push_str(sample);
        }
        out.push('\n');
    }
    out
}

/// A family's 0.0.4 name: counters get their samples' `_total` suffix.
fn family_name(name: &str, counters: &HashSet<&str>) -> String {
    if counters.contains(name) {
        format!("{name}_total")
    } else {
        name.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;

    #[test]
    fn counters_take_their_samples_names_and_openmetrics_lines_go() {
        let mut registry = Registry::with_prefix("app");
        let requests = Family::<[(&str, &str); 1], Counter>::default();
        requests.get_or_create(&[("code", "OK")]).inc_by(3);
        registry.register("requests", "Calls by \"code\"", requests);
        let queue = Gauge::<i64>::default();
        queue.set(2);
        registry.register("queue", "Waiting", queue);
        let latency = Histogram::new([0.5, 1.0]);
        latency.observe(0.7);
        registry.register("latency_seconds", "Latency", latency);
        let mut openmetrics = String::new();
        prometheus_client::encoding::text::encode(&mut openmetrics, &registry).unwrap();
        assert!(
            openmetrics.contains("# TYPE app_requests counter\n"),
            "{openmetrics}"
        );

        let text = from_openmetrics(&openmetrics);
        assert_eq!(
            text,
            "# HELP app_requests_total Calls by \"code\".\n\
             # TYPE app_requests_total counter\n\
             app_requests_total{code=\"OK\"} 3\n\
             # HELP app_queue Waiting.\n\
             # TYPE app_queue gauge\n\
             app_queue 2\n\
             # HELP app_latency_seconds Latency.\n\
             # TYPE app_latency_seconds histogram\n\
             app_latency_seconds_sum 0.7\n\
             app_latency_seconds_count 1\n\
             app_latency_seconds_bucket{le=\"0.5\"} 0\n\
             app_latency_seconds_bucket{le=\"1.0\"} 1\n\
             app_latency_seconds_bucket{le=\"+Inf\"} 1\n"
        );
    }

    #[test]
    fn unknown_becomes_untyped_and_exemplars_and_created_samples_go() {
        let openmetrics = "# TYPE a unknown\na 1\n# TYPE c counter\nc_total 2 # {id=\"x\"} 1\nc_created 5\n# UNIT a seconds\n# EOF\n";
        assert_eq!(
            from_openmetrics(openmetrics),
            "# TYPE a untyped\na 1\n# TYPE c_total counter\nc_total 2\n"
        );
    }
}
