//! The standard process metrics of Prometheus client libraries and a `build_info` gauge, unprefixed,
//! appended to a binary's own (prefixed) registry by [`render`].
//!
//! Names and meanings follow the Prometheus client guidelines ("Process metrics", prometheus.io
//! `docs/instrumenting/writing_clientlibs`): `process_cpu_seconds_total` (user + system),
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_max_fds` (soft limit), `process_start_time_seconds` (Unix time) and `process_threads`.
//! They are read from `/proc/self` at each scrape, so on a system without procfs they are absent.
//! `build_info{component, version, commit}` is always 1.

use std::fs;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::const_metrics::gauge;

/// Clock ticks per second of `/proc/self/stat`'s times: Linux's `USER_HZ`, 100 on every
/// architecture it exposes to user space (the Go client's procfs assumes the same).
const USER_HZ: f64 = 100.0;

/// What a binary was built from, for `build_info`.
#[derive(Debug, Clone, Copy)]
pub struct BuildInfo {
    /// `router`, `worker`, ...
    pub component: &'static str,
    /// The package version, e.g. `0.1.0`.
    pub version: &'static str,
    /// The git commit, or `unknown`.
    pub commit: &'static str,
}

/// The process metrics and `build_info` of one binary, in a registry of their own (no prefix).
#[derive(Debug)]
pub struct ProcessMetrics {
    registry: Registry,
}

impl ProcessMetrics {
    /// Metrics of this process, labelled with `build`.
    pub fn new(build: BuildInfo) -> ProcessMetrics {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessCollector { build }));
        ProcessMetrics { registry }
    }
}

/// Renders `own` (a binary's registry) and then `process` as one OpenMetrics text (one `# EOF`).
pub fn render(own: &Registry, process: &ProcessMetrics) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode_registry(&mut text, own)
        .and_then(|()| {
            prometheus_client::encoding::text::encode_registry(&mut text, &process.registry)
        })
        .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut text))
        .expect("writing to a String cannot fail");
    text
}

#[derive(Debug)]
struct ProcessCollector {
    build: BuildInfo,
}

impl Collector for ProcessCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let b = self.build;
        let labels = [
            ("component", b.component),
            ("version", b.version),
            ("commit", b.commit),
        ];
        let g = ConstGauge::new(1i64);
        let mut family = e.encode_descriptor(
            "build_info",
            "What the binary was built from (always 1)",
            None,
            MetricType::Gauge,
        )?;
        g.encode(family.encode_family(&labels)?)?;
        let Some(s) = ProcessSample::read() else {
            return Ok(());
        };
        let cpu = prometheus_client::metrics::counter::ConstCounter::new(s.cpu_seconds);
        cpu.encode(e.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.rss_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.vm_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (soft limit)",
                s.max_fds,
            ),
            ("process_threads", "Number of OS threads", s.threads),
        ];
        for (name, help, v) in gauges {
            if let Some(v) = v {
                gauge(&mut e, name, help, v)?;
            }
        }
        if let Some(start) = s.start_time_seconds {
            let g = ConstGauge::new(start);
            g.encode(e.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds",
                None,
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// One reading of `/proc/self`; a value that cannot be read is `None`.
#[derive(Debug, Default, PartialEq)]
struct ProcessSample {
    cpu_seconds: f64,
    rss_bytes: Option<i64>,
    vm_bytes: Option<i64>,
    open_fds: Option<i64>,
    max_fds: Option<i64>,
    threads: Option<i64>,
    start_time_seconds: Option<f64>,
}

impl ProcessSample {
    /// Reads `/proc/self/{stat,status,fd,limits}` and `/proc/stat`; `None` without procfs.
    fn read() -> Option<ProcessSample> {
        let stat = fs::read_to_string("/proc/self/stat").ok()?;
        let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
        let limits = fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let boot = fs::read_to_string("/proc/stat").unwrap_or_default();
        let mut s = parse(&stat, &status, &limits, &boot)?;
        s.open_fds = fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as i64);
        Some(s)
    }
}

/// Parses the texts of `/proc/self/stat`, `/proc/self/status`, `/proc/self/limits` and
/// `/proc/stat` (proc(5)); `None` when `stat` is not a stat line.
fn parse(stat: &str, status: &str, limits: &str, boot: &str) -> Option<ProcessSample> {
    // The command name (field 2) is in parentheses and may hold spaces: fields 3.. follow the
    // last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let (utime, stime) = (field(14)?, field(15)?);
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<i64>().ok())
    };
    let btime = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    let max_fds = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next()?.parse::<i64>().ok());
    Some(ProcessSample {
        cpu_seconds: (utime + stime) as f64 / USER_HZ,
        rss_bytes: kib("VmRSS:").map(|k| k * 1024),
        vm_bytes: kib("VmSize:").map(|k| k * 1024),
        open_fds: None,
        max_fds,
        threads: kib("Threads:"),
        start_time_seconds: btime
            .zip(field(22))
            .map(|(b, ticks)| b as f64 + ticks as f64 / USER_HZ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (tokio-rt worker) S 1 4242 4242 0 -1 4194560 2000 0 0 0 \
                        250 150 0 0 20 0 9 0 123456 1000000 500 18446744073709551615";
    const STATUS: &str = "Name:\trouter\nVmSize:\t  204800 kB\nVmRSS:\t   10240 kB\nThreads:\t9\n";
    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units\n\
                          Max open files            1024                 524288               files\n";
    const BOOT: &str = "cpu  1 2 3\nbtime 1700000000\nprocesses 5\n";

    #[test]
    fn parses_proc_texts() {
        let s = parse(STAT, STATUS, LIMITS, BOOT).unwrap();
        assert_eq!(s.cpu_seconds, 4.0);
        assert_eq!(s.rss_bytes, Some(10240 * 1024));
        assert_eq!(s.vm_bytes, Some(204800 * 1024));
        assert_eq!(s.threads, Some(9));
        assert_eq!(s.max_fds, Some(1024));
        assert_eq!(s.start_time_seconds, Some(1700000000.0 + 1234.56));
        assert_eq!(parse("no parenthesis", STATUS, LIMITS, BOOT), None);
    }

    #[test]
    fn renders_build_info_and_this_process() {
        let process = ProcessMetrics::new(BuildInfo {
            component: "router",
            version: "0.1.0",
            commit: "abc",
        });
        let mut own = Registry::with_prefix("router");
        let c = prometheus_client::metrics::counter::Counter::<u64>::default();
        own.register("requests", "Requests", c);
        let text = render(&own, &process);
        assert!(text.contains("router_requests_total 0"), "{text}");
        assert!(
            text.contains(r#"build_info{component="router",version="0.1.0",commit="abc"} 1"#),
            "{text}"
        );
        if cfg!(target_os = "linux") {
            for name in [
                "process_cpu_seconds_total ",
                "process_resident_memory_bytes ",
                "process_open_fds ",
                "process_max_fds ",
                "process_threads ",
                "process_start_time_seconds ",
            ] {
                assert!(text.contains(name), "{name} in {text}");
            }
        }
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
