//! The soak's samples (every `--sample-secs` and at the end: requests so far, and per process
//! RSS, open fds, threads and, for workers, KV blocks used), their tables, the final summary and
//! the verdict on each target.
//!
//! Memory is judged per process instance (a restart starts a new curve) over the samples taken
//! after warm-up: from half the duration on, and at least 60 s after the instance started. A
//! curve is flat when its largest value is within 5 % of its first one (fds and threads: within
//! 5 % or 4, whichever is more: connection pools and blocking threads come and go); with fewer
//! than 2 samples it is not judged.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::faults::{Fault, Violation, GRACE};
use super::load::{Outcome, Record, Tag};
use super::procs::{metric, scrape, Cluster, Kind, ProcStats};

/// A process instance younger than this is still warming up.
const INSTANCE_WARMUP_S: f64 = 60.0;

/// One process at one sample.
#[derive(Debug, Clone)]
pub struct ProcSample {
    /// Its name.
    pub name: String,
    /// Its instance (0 first; +1 per restart) and pid.
    pub instance: u32,
    /// See `instance`.
    pub pid: u32,
    /// Seconds since the instance started.
    pub age_s: f64,
    /// `/proc` figures (`None`: not running).
    pub stats: Option<ProcStats>,
    /// Workers: `worker_kv_blocks_used` (`None`: no answer, e.g. stopped).
    pub kv_used: Option<f64>,
    /// Workers: `worker_held_sequences`, requests held for clients that stopped reading (`None`:
    /// no answer).
    pub held: Option<f64>,
}

impl ProcSample {
    /// A worker that holds nothing: every KV block free and no held request (each held request
    /// is resumed or cancelled by its router within `slow_client_timeout_ms`).
    pub fn holds_nothing(&self) -> bool {
        self.kv_used == Some(0.0) && self.held == Some(0.0)
    }
}

/// One sample.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds from the load's start.
    pub t: f64,
    /// Every process.
    pub procs: Vec<ProcSample>,
}

/// Reads every process at `t`.
pub async fn sample(cluster: &Cluster, http: &reqwest::Client, t: f64) -> Sample {
    let mut procs = Vec::new();
    for p in &cluster.procs {
        let (pid, instance, started) = p.current();
        let page = match p.kind {
            Kind::Worker => scrape(http, &p.metrics).await,
            Kind::Router => None,
        };
        let kv_used = page
            .as_deref()
            .and_then(|page| metric(page, "worker_kv_blocks_used", None));
        let held = page
            .as_deref()
            .and_then(|page| metric(page, "worker_held_sequences", None));
        procs.push(ProcSample {
            name: p.name.clone(),
            instance,
            pid,
            age_s: started.elapsed().as_secs_f64(),
            stats: p.stats(),
            kv_used,
            held,
        });
    }
    Sample { t, procs }
}

/// Counts of the records by outcome: (completed, cancelled, failed, hung).
fn outcomes(records: &[Record]) -> (usize, usize, usize, usize) {
    let count = |o| records.iter().filter(|r| r.outcome == o).count();
    (
        count(Outcome::Completed),
        count(Outcome::Cancelled),
        count(Outcome::Failed),
        count(Outcome::Hung),
    )
}

/// The table of one sample.
pub fn render_sample(s: &Sample, label: &str, records: &[Record], in_flight: usize) -> String {
    let (ok, cancelled, failed, hung) = outcomes(records);
    let mut out = format!(
        "[{label} t={:.0} s] requests ended {} (completed {ok}, cancelled {cancelled}, failed \
         {failed}, hung {hung}), in flight {in_flight}\n",
        s.t,
        records.len()
    );
    out.push_str("  process   inst  pid      rss_MiB  fds  threads  kv_blocks_used\n");
    for p in &s.procs {
        let (rss, fds, threads) = match p.stats {
            Some(st) => (
                format!("{:.1}", st.rss_kib as f64 / 1024.0),
                st.fds.to_string(),
                st.threads.to_string(),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let kv = p.kv_used.map_or("-".into(), |k| format!("{k:.0}"));
        let kv = if p.name.starts_with("router") {
            String::new()
        } else {
            kv
        };
        let _ = writeln!(
            out,
            "  {:<9} {:<5} {:<8} {:>7}  {:>3}  {:>7}  {:>5}",
            p.name, p.instance, p.pid, rss, fds, threads, kv
        );
    }
    out
}

/// Everything the verdict needs.
pub struct Finish<'a> {
    /// The load's length, s.
    pub duration: f64,
    /// Every record.
    pub records: &'a [Record],
    /// The samples, the last one taken at the end (idle).
    pub samples: &'a [Sample],
    /// The faults run.
    pub faults: &'a [Fault],
    /// Readiness violations and readings judged.
    pub violations: &'a [Violation],
    /// See `violations`.
    pub judged: usize,
    /// Requests never recorded (still in flight at the end).
    pub unanswered: usize,
    /// Whether the greedy references agreed across the two solo runs.
    pub references_agree: bool,
}

/// One memory curve: (name, instance) -> its post-warm-up (rss KiB, fds, threads) and the whole
/// RSS range.
#[derive(Default)]
struct Curve {
    window: Vec<ProcStats>,
    rss_min: u64,
    rss_max: u64,
}

fn curves(f: &Finish<'_>) -> BTreeMap<(String, u32), Curve> {
    let mut curves: BTreeMap<(String, u32), Curve> = BTreeMap::new();
    for s in f.samples {
        for p in &s.procs {
            let Some(st) = p.stats else { continue };
            let c = curves.entry((p.name.clone(), p.instance)).or_insert(Curve {
                rss_min: u64::MAX,
                ..Default::default()
            });
            c.rss_min = c.rss_min.min(st.rss_kib);
            c.rss_max = c.rss_max.max(st.rss_kib);
            if s.t >= f.duration / 2.0 && p.age_s >= INSTANCE_WARMUP_S {
                c.window.push(st);
            }
        }
    }
    curves
}

/// Growth of the largest value over the first, as a fraction; whether it is within 5 % (or
/// `slack` absolute).
fn growth(values: &[u64], slack: u64) -> (f64, bool) {
    let first = values[0];
    let max = values.iter().copied().max().unwrap_or(first);
    let g = (max as f64 - first as f64) / (first.max(1) as f64);
    (g, max <= first + slack || g <= 0.05)
}

/// The summary lines and the verdict (whether every target holds); the last line is the
/// one-line summary.
pub fn summary(f: &Finish<'_>) -> (String, bool) {
    let mut out = String::from("== soak summary\n");
    let (ok, cancelled, failed, hung) = outcomes(f.records);
    let by = |front: &str| f.records.iter().filter(|r| r.front == front).count();
    let tagged = |t: Tag| f.records.iter().filter(|r| r.tag == t).count();
    let _ = writeln!(
        out,
        "requests: {} (gRPC {}, HTTP {}; burst {}, stuck {}, failover probes {}): completed \
         {ok}, cancelled by the client {cancelled}, failed {failed}, hung {hung}, never recorded {}",
        f.records.len(),
        by("grpc"),
        by("http"),
        tagged(Tag::Burst),
        tagged(Tag::Stuck),
        tagged(Tag::Probe),
        f.unanswered
    );
    let mut codes: BTreeMap<&str, usize> = BTreeMap::new();
    for r in f.records.iter().filter(|r| r.outcome != Outcome::Completed) {
        if let Some(code) = &r.code {
            *codes.entry(code).or_default() += 1;
        }
    }
    let codes: Vec<String> = codes.iter().map(|(c, n)| format!("{c} {n}")).collect();
    let _ = writeln!(
        out,
        "errors by status: {}",
        if codes.is_empty() {
            "none".into()
        } else {
            codes.join(", ")
        }
    );
    let quiet = f
        .records
        .iter()
        .filter(|r| r.outcome == Outcome::Failed && r.tag == Tag::Normal)
        .filter(|r| {
            !f.faults.iter().any(|x| {
                r.end_s >= x.start_s - 1.0 && r.sent_s <= x.end_s.unwrap_or(f64::MAX) + GRACE
            })
        })
        .count();
    let _ = writeln!(
        out,
        "failed steady requests outside every fault window: {quiet}"
    );

    let greedy: Vec<&Record> = f
        .records
        .iter()
        .filter(|r| r.greedy_match.is_some())
        .collect();
    let mismatched = greedy
        .iter()
        .filter(|r| r.greedy_match == Some(false))
        .count();
    let failed_over = greedy.iter().filter(|r| r.failovers > 0).count();
    let failed_over_bad = greedy
        .iter()
        .filter(|r| r.failovers > 0 && r.greedy_match == Some(false))
        .count();
    let _ = writeln!(
        out,
        "greedy outputs checked against their solo run: {} ({} failed over on gRPC): {mismatched} \
         differ ({failed_over_bad} of the failed-over); solo references agree across two runs: {}",
        greedy.len(),
        failed_over,
        f.references_agree
    );
    let checked: Vec<&Record> = f.records.iter().filter(|r| r.valid.is_some()).collect();
    let invalid = checked.iter().filter(|r| r.valid == Some(false)).count();
    let _ = writeln!(
        out,
        "constrained outputs checked: {}, invalid {invalid}",
        checked.len()
    );

    let _ = writeln!(out, "faults injected: {}", f.faults.len());
    let mut faults_ok = f.faults.len() == 5;
    for x in f.faults {
        let end = x.end_s.map_or("-".into(), |e| format!("{e:.0}"));
        let error = x
            .error
            .as_ref()
            .map(|e| format!(" ERROR: {e}"))
            .unwrap_or_default();
        faults_ok &= x.error.is_none() && x.end_s.is_some();
        let _ = writeln!(
            out,
            "  {:>5.0}-{:>4} s  {:<9} {}{error}",
            x.start_s, end, x.target, x.what
        );
    }

    let _ = writeln!(
        out,
        "memory (RSS MiB min..max over the run; growth after warm-up: RSS, fds, threads):"
    );
    let mut memory_ok = true;
    let mut judged_curves = 0;
    for ((name, instance), c) in curves(f) {
        let mib = |k: u64| k as f64 / 1024.0;
        let verdict = if c.window.len() < 2 {
            "not judged (fewer than 2 samples after warm-up)".to_string()
        } else {
            judged_curves += 1;
            let pick = |g: fn(&ProcStats) -> u64| c.window.iter().map(g).collect::<Vec<_>>();
            let (rss, rss_ok) = growth(&pick(|s| s.rss_kib), 0);
            let (fds, fds_ok) = growth(&pick(|s| s.fds), 4);
            let (threads, threads_ok) = growth(&pick(|s| s.threads), 4);
            let ok = rss_ok && fds_ok && threads_ok;
            memory_ok &= ok;
            format!(
                "{:+.1} %, {:+.1} %, {:+.1} % over {} samples: {}",
                rss * 100.0,
                fds * 100.0,
                threads * 100.0,
                c.window.len(),
                if ok { "flat" } else { "GROWS" }
            )
        };
        let _ = writeln!(
            out,
            "  {name:<9} #{instance}  {:>7.1}..{:<7.1} {verdict}",
            mib(c.rss_min),
            mib(c.rss_max)
        );
    }
    memory_ok &= judged_curves > 0;

    let idle = f.samples.last();
    let kv: Vec<String> = idle
        .map(|s| {
            s.procs
                .iter()
                .filter(|p| p.name.starts_with("worker"))
                .map(|p| {
                    let value = |v: Option<f64>| v.map_or("?".into(), |k| k.to_string());
                    format!("{} {} (held {})", p.name, value(p.kv_used), value(p.held))
                })
                .collect()
        })
        .unwrap_or_default();
    let kv_ok = idle.is_some_and(|s| {
        s.procs
            .iter()
            .filter(|p| p.name.starts_with("worker"))
            .all(ProcSample::holds_nothing)
    });
    let _ = writeln!(
        out,
        "KV blocks used (and requests held) when idle at the end: {}",
        kv.join(", ")
    );
    let _ = writeln!(
        out,
        "readiness readings of unfaulted workers: {}, not ready: {}",
        f.judged,
        f.violations.len()
    );
    for (t, router, worker) in f.violations.iter().take(10) {
        let _ = writeln!(out, "  t={t:.0} s: {router} reported {worker} not ready");
    }

    let targets = [
        (
            "every request answered (none hung past the limit)",
            hung == 0 && f.unanswered == 0,
        ),
        (
            "greedy outputs identical to solo (failed-over included)",
            mismatched == 0 && f.references_agree,
        ),
        ("constrained outputs valid", invalid == 0),
        ("RSS, fds, threads flat after warm-up (5 %)", memory_ok),
        ("KV blocks (and held requests) back to 0 when idle", kv_ok),
        (
            "busy workers never reported not ready",
            f.violations.is_empty() && f.judged > 0,
        ),
        ("every fault injected", faults_ok),
    ];
    let mut pass = true;
    for (name, ok) in targets {
        pass &= ok;
        let _ = writeln!(out, "{} {name}", if ok { "PASS" } else { "FAIL" });
    }
    let failed_targets: Vec<&str> = targets.iter().filter(|t| !t.1).map(|t| t.0).collect();
    let _ = write!(
        out,
        "soak: {} in {:.0} s: {} requests (completed {ok}, cancelled {cancelled}, failed {failed}, \
         hung {hung}), {} faults, greedy {mismatched}/{} differ, KV idle {}, readiness violations \
         {}{}",
        if pass { "PASS" } else { "FAIL" },
        f.duration,
        f.records.len(),
        f.faults.len(),
        greedy.len(),
        if kv_ok { "0" } else { "not 0" },
        f.violations.len(),
        if pass { String::new() } else { format!("; failed: {}", failed_targets.join("; ")) }
    );
    (out, pass)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_allows_five_percent_or_slack() {
        assert!(growth(&[100, 104, 105], 0).1);
        assert!(!growth(&[100, 106], 0).1);
        assert!(growth(&[20, 22], 2).1);
        assert!(!growth(&[20, 23], 2).1);
        assert!(growth(&[100, 50], 0).1);
    }
}
