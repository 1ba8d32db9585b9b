//! The load generator: connects to the target ([`super::target`]), plans the requests
//! ([`super::plan`]), runs the warmup and the measured phase, and gathers one
//! [`RequestRecord`](super::report::RequestRecord) per measured request ([`super::request`]).
//!
//! Closed loop (no `--request-rate`): `--concurrency` requests are in flight at all times until
//! all are sent. Open loop: request i is due at the i-th arrival of a Poisson process (exponential
//! gaps with mean 1 / rate, the first at 0 s) and is sent at that time or, when the concurrency
//! cap is reached, as soon as a slot frees up (late requests are then sent back to back).
//!
//! Every loop is bounded: exactly `--requests` (+ `--warmup`) requests, each under
//! `--timeout-secs`. With `--worker-metrics`, the worker's mask-time histogram is scraped right
//! before and right after the measured phase ([`super::mask_time`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::constraint::OutputCheck;
use super::mask_time::{MaskTime, MetricsPage};
use super::plan::{Planned, ARRIVALS_STREAM};
use super::report::{ConstrainedSummary, Report, RequestError, RequestRecord, Summary, SCHEMA};
use super::request::{self, Progress};
use super::rng::{derive_seed, SplitMix64};
use super::target::{self, Target};
use super::tenant_mix::summarize;
use super::BenchArgs;

/// The settings stored in the report: the command line plus what was derived from it.
#[derive(Debug, Clone, Serialize)]
pub struct RunConfig {
    /// The command-line flags (`--api-key` is left out).
    #[serde(flatten)]
    pub args: BenchArgs,
    /// The cap on requests in flight actually used.
    pub effective_concurrency: usize,
    /// The fraction of requests that carried `--constraint` (0 without it).
    pub effective_constrained_fraction: f64,
    /// Whether an API key was sent.
    pub api_key_sent: bool,
    /// HTTP/2 connections to the router (with `--worker`: 1, one `Generate` stream).
    pub connections: usize,
    /// What was driven: `"router"` (its public `Generate`), `"worker"` (`--worker`: one worker's
    /// `Generate` stream, directly) or `"openai"` (`--openai`).
    pub mode: &'static str,
}

/// Everything a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The report (`--json` writes it).
    pub report: Report<RunConfig>,
    /// Warmup requests that failed (not part of the summary).
    pub warmup_failed: usize,
}

impl Outcome {
    /// Whether every measured request succeeded (with `--tenant-mix`, a `RESOURCE_EXHAUSTED`
    /// refusal counts as an outcome: the tenants' quotas at work).
    pub fn all_ok(&self) -> bool {
        if self.report.tenants.is_none() {
            return self.report.summary.failed == 0;
        }
        self.report
            .requests
            .iter()
            .filter_map(|r| r.error.as_ref())
            .all(|e| e.code == "RESOURCE_EXHAUSTED")
    }
}

/// Runs the benchmark `args` describe (validated by the caller) and returns its report.
/// Progress goes to stderr, about once a second.
///
/// Errors: the target cannot be reached or is not ready within `--wait-ready-secs` (or refuses
/// the API key), the settings do not fit the model's context, the prompts cannot be built, or the
/// worker's metrics page cannot be read. Failed requests are not errors: they are counted in the
/// report.
pub async fn run(args: &BenchArgs) -> anyhow::Result<Outcome> {
    let concurrency = args.effective_concurrency();
    let connected = target::connect(args).await?;
    let target = Arc::new(connected.target);
    let (warmup, measured) = connected.plans.split_at(args.warmup);
    let check = match &args.constraint {
        Some(spec) => Some(Arc::new(
            OutputCheck::new(spec).map_err(anyhow::Error::msg)?,
        )),
        None => None,
    };
    let phase = Phase {
        target: target.clone(),
        args: Arc::new(args.clone()),
        check,
        concurrency,
    };
    let metrics = args
        .worker_metrics
        .as_deref()
        .map(MetricsPage::new)
        .transpose()?;

    let mut warmup_failed = 0;
    if !warmup.is_empty() {
        eprintln!("bench: warmup, {} requests", warmup.len());
        let records = phase.run(warmup, None, None, "warmup").await;
        let failures: Vec<&RequestError> =
            records.iter().filter_map(|r| r.error.as_ref()).collect();
        warmup_failed = failures.len();
        if let Some(first) = failures.first() {
            eprintln!(
                "bench: warning: {warmup_failed} of {} warmup requests failed (first: {} {})",
                warmup.len(),
                first.code,
                first.message
            );
        }
    }

    let schedule = args
        .tenant_mix
        .as_ref()
        .map(|mix| mix.schedule(args.seed, ARRIVALS_STREAM, measured.len()));
    let tenants: Option<Vec<usize>> = schedule
        .as_ref()
        .map(|s| s.iter().map(|&(_, tenant)| tenant).collect());
    let arrivals = schedule.map(|s| s.into_iter().map(|(at, _)| at).collect::<Vec<_>>());
    let arrivals = arrivals.or_else(|| {
        args.request_rate.map(|rate| {
            let mut rng = SplitMix64::new(derive_seed(args.seed, ARRIVALS_STREAM));
            let mut t = 0.0;
            (0..measured.len())
                .map(|i| {
                    if i > 0 {
                        t += rng.exponential(rate);
                    }
                    Duration::from_secs_f64(t)
                })
                .collect::<Vec<_>>()
        })
    });
    eprintln!(
        "bench: {} requests ({} constrained), {}",
        measured.len(),
        measured.iter().filter(|p| p.constrained).count(),
        match (&args.tenant_mix, args.request_rate) {
            (Some(mix), _) => format!(
                "{} tenants, {} req/s Poisson arrivals in all, at most {concurrency} in flight",
                mix.tenants.len(),
                mix.total_rate()
            ),
            (None, Some(rate)) => {
                format!("{rate} req/s Poisson arrivals, at most {concurrency} in flight")
            }
            (None, None) => format!("concurrency {concurrency}"),
        }
    );
    let masks_before = match &metrics {
        Some(page) => Some(page.mask_histogram().await?),
        None => None,
    };
    let started_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let phase_start = Instant::now();
    let records = phase
        .run(
            measured,
            arrivals.as_deref(),
            tenants.as_deref(),
            "measured",
        )
        .await;
    let duration_s = phase_start.elapsed().as_secs_f64();
    let mask_time = match (&metrics, masks_before) {
        (Some(page), Some(before)) => {
            let delta = page.mask_histogram().await?.since(&before)?;
            Some(MaskTime::from_delta(&page.url, &delta))
        }
        _ => None,
    };
    let summary = Summary::from_records(&records, duration_s);
    let constrained = args
        .constraint
        .is_some()
        .then(|| ConstrainedSummary::from_records(&records, duration_s));
    let report = Report {
        schema: SCHEMA,
        label: args.label.clone(),
        router: match (&args.worker, &args.openai) {
            (Some(_), _) => String::new(),
            (None, Some(url)) => url.clone(),
            (None, None) => args.router.clone(),
        },
        model: connected.info.model_name.clone(),
        max_context_tokens: connected.info.max_context_tokens,
        started_unix_ms,
        config: RunConfig {
            args: args.clone(),
            effective_concurrency: concurrency,
            effective_constrained_fraction: args.effective_constrained_fraction(),
            api_key_sent: args.api_key.is_some(),
            connections: connected.connections,
            mode: target.mode(),
        },
        summary,
        constrained,
        mask_time,
        tenants: args
            .tenant_mix
            .as_ref()
            .map(|mix| summarize(mix, &records, duration_s)),
        requests: records,
    };
    Ok(Outcome {
        report,
        warmup_failed,
    })
}

/// What every request of a phase shares.
struct Phase {
    target: Arc<Target>,
    args: Arc<BenchArgs>,
    check: Option<Arc<OutputCheck>>,
    concurrency: usize,
}

impl Phase {
    /// Sends `plans` (at `arrivals` offsets from the phase start when given, each as the tenant
    /// of `--tenant-mix` that `tenants` gives) with at most `concurrency` in flight, and returns
    /// their records in index order.
    async fn run(
        &self,
        plans: &[Planned],
        arrivals: Option<&[Duration]>,
        tenants: Option<&[usize]>,
        phase: &'static str,
    ) -> Vec<RequestRecord> {
        let progress = Arc::new(Progress::default());
        let phase_start = Instant::now();
        let ticker = tokio::spawn(report_progress(
            progress.clone(),
            plans.len(),
            phase,
            phase_start,
        ));
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let mut tasks = JoinSet::new();
        for (index, plan) in plans.iter().enumerate() {
            if let Some(at) = arrivals.and_then(|a| a.get(index)) {
                tokio::time::sleep_until((phase_start + *at).into()).await;
            }
            let permit = slots
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let plan = plan.clone();
            let (target, args) = (self.target.clone(), self.args.clone());
            let (check, progress) = (self.check.clone(), progress.clone());
            let tenant = tenants.and_then(|t| t.get(index)).copied();
            tasks.spawn(async move {
                let tenant = tenant.and_then(|i| args.tenant_mix.as_ref().map(|m| &m.tenants[i]));
                let cx = request::Context {
                    index,
                    request_id: format!("bench-{phase}-{index}"),
                    phase_start,
                    progress: &progress,
                    check: check.as_deref(),
                    tenant,
                };
                let record = request::send(&target, &args, &plan, cx).await;
                drop(permit);
                record
            });
        }
        let mut records = Vec::with_capacity(plans.len());
        while let Some(joined) = tasks.join_next().await {
            records.push(joined.expect("request tasks do not panic"));
        }
        ticker.abort();
        records.sort_by_key(|r| r.index);
        records
    }
}

/// Prints a progress line to stderr every second until aborted.
async fn report_progress(progress: Arc<Progress>, total: usize, phase: &str, start: Instant) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tick.tick().await;
        let elapsed = start.elapsed().as_secs_f64();
        let done = progress.done.load(Ordering::Relaxed);
        let tokens = progress.tokens.load(Ordering::Relaxed);
        eprintln!(
            "bench: {phase} {done}/{total} done, {} failed, {} in flight, {elapsed:.1} s, \
             {:.1} tokens/s",
            progress.failed.load(Ordering::Relaxed),
            progress.sent.load(Ordering::Relaxed) - done,
            tokens as f64 / elapsed.max(1e-9),
        );
    }
}
