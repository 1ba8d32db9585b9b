//! The fault schedule and what it leaves behind: the [`FaultLog`] (when each fault ran, so that
//! readiness is judged only for processes not faulted at that moment) and the readiness watch.
//!
//! Faults, at fractions of the duration (see [`schedule`]): a burst at 5x the steady clients; a
//! worker `kill -9` then restart on its ports; a worker SIGSTOP for 20 s (scaled down for short
//! runs) then SIGCONT; a router restart (SIGTERM, its drain, a new instance on its ports); a
//! client that stops reading its streams for a while.
//!
//! Readiness ([`watch_readiness`]): every second each router's `router_worker_ready{worker}` is
//! read; a 0 for a worker that is not faulted (from 1 s before its fault to [`GRACE`] after it
//! recovered), on a router that is not itself restarting (until [`GRACE`] after it is back), is
//! a violation: a worker that is only busy was reported not ready.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::load::{Load, Tag};
use super::procs::{metric, scrape, wait_all_ready, Cluster, Kind, Proc};

/// After a fault has ended, how long its process may still be reported not ready (routers
/// reconnect with a backoff).
pub const GRACE: f64 = 15.0;

/// Greedy failover probes sent before each worker fault, and how long before it.
const PROBES: usize = 6;
const PROBE_LEAD: Duration = Duration::from_secs(2);

/// One fault.
#[derive(Debug, Clone)]
pub struct Fault {
    /// What it was (`kill -9 + restart`, ...).
    pub what: String,
    /// The process it hit (empty for load faults).
    pub target: String,
    /// Seconds from the load's start: begin and end (`None` while it runs).
    pub start_s: f64,
    /// See `start_s`.
    pub end_s: Option<f64>,
    /// Whether it went as planned (an error is printed with it).
    pub error: Option<String>,
}

/// Every fault so far.
#[derive(Default)]
pub struct FaultLog {
    /// In order of start.
    pub faults: Mutex<Vec<Fault>>,
}

impl FaultLog {
    fn begin(&self, what: &str, target: &str, at: f64) -> usize {
        let mut faults = self.faults.lock().expect("fault log");
        faults.push(Fault {
            what: what.into(),
            target: target.into(),
            start_s: at,
            end_s: None,
            error: None,
        });
        faults.len() - 1
    }

    fn end(&self, index: usize, at: f64, result: anyhow::Result<()>) {
        let mut faults = self.faults.lock().expect("fault log");
        faults[index].end_s = Some(at);
        faults[index].error = result.err().map(|e| format!("{e:#}"));
    }

    /// Whether the process `name` is faulted (or recovering) at `t`.
    pub fn faulted(&self, name: &str, t: f64) -> bool {
        let faults = self.faults.lock().expect("fault log");
        faults.iter().any(|f| {
            f.target == name && t >= f.start_s - 1.0 && f.end_s.is_none_or(|e| t <= e + GRACE)
        })
    }
}

/// A planned fault.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Planned {
    /// `clients` extra clients for `secs`.
    Burst { clients: usize, secs: f64 },
    /// `kill -9` worker `worker`, restart it.
    KillWorker { worker: usize },
    /// SIGSTOP worker `worker` for `secs`, then SIGCONT.
    StopWorker { worker: usize, secs: f64 },
    /// Restart router `router`.
    RestartRouter { router: usize },
    /// The client that stops reading its streams for `secs`.
    StuckClient { secs: f64 },
}

/// The faults of a run of `duration` s with `clients` steady clients: (seconds from the start,
/// fault), every one starting before 60 % of the duration so that the rest shows the memory
/// curve after them.
pub fn schedule(duration: f64, clients: usize) -> Vec<(f64, Planned)> {
    vec![
        (
            0.10 * duration,
            Planned::Burst {
                clients: 4 * clients,
                secs: (0.05 * duration).clamp(10.0, 30.0),
            },
        ),
        (0.20 * duration, Planned::KillWorker { worker: 0 }),
        (
            0.30 * duration,
            Planned::StopWorker {
                worker: 1,
                secs: (0.1 * duration).min(20.0),
            },
        ),
        (0.40 * duration, Planned::RestartRouter { router: 1 }),
        (
            0.50 * duration,
            Planned::StuckClient {
                secs: (0.15 * duration).clamp(10.0, 60.0),
            },
        ),
    ]
}

/// Runs `plan`: each fault at its time (they may overlap when one runs long), recording each in
/// `log`.
pub async fn run(plan: Vec<(f64, Planned)>, cluster: &Cluster, load: &Arc<Load>, log: &FaultLog) {
    let faults = plan
        .into_iter()
        .enumerate()
        .map(|(i, (at, fault))| async move {
            let wait = at - load.now_s();
            if wait > 0.0 {
                tokio::time::sleep(Duration::from_secs_f64(wait)).await;
            }
            if !load.stop.load(Ordering::Relaxed) {
                run_one(fault, 1000 + i as u64, cluster, load, log).await;
            }
        });
    futures::future::join_all(faults).await;
}

/// Runs one fault now.
async fn run_one(fault: Planned, seed: u64, cluster: &Cluster, load: &Arc<Load>, log: &FaultLog) {
    let workers: Vec<&Proc> = cluster.workers().collect();
    let routers: Vec<&Proc> = cluster.routers().collect();
    match fault {
        Planned::Burst { clients, secs } => {
            let what = format!("burst: {clients} more clients for {secs:.0} s");
            let index = log.begin(&what, "", load.now_s());
            let until = std::time::Instant::now() + Duration::from_secs_f64(secs);
            let burst = (0..clients).map(|c| {
                load.clone()
                    .client(seed * 100 + c as u64, until, Tag::Burst)
            });
            futures::future::join_all(burst).await;
            log.end(index, load.now_s(), Ok(()));
        }
        Planned::KillWorker { worker } => {
            let p = workers[worker];
            let fault = async {
                tokio::time::sleep(PROBE_LEAD).await;
                let index = log.begin("kill -9, restart", &p.name, load.now_s());
                let result = async {
                    p.signal("KILL")?;
                    p.wait_exit(Duration::from_secs(10)).await;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    p.restart().await?;
                    for r in &routers {
                        wait_all_ready(r, workers.len(), Duration::from_secs(60)).await?;
                    }
                    Ok(())
                }
                .await;
                log.end(index, load.now_s(), result);
            };
            tokio::join!(load.clone().probes(PROBES, seed), fault);
        }
        Planned::StopWorker { worker, secs } => {
            let p = workers[worker];
            let fault = async {
                tokio::time::sleep(PROBE_LEAD).await;
                let what = format!("SIGSTOP {secs:.0} s, SIGCONT");
                let index = log.begin(&what, &p.name, load.now_s());
                let result = async {
                    p.signal("STOP")?;
                    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                    p.signal("CONT")
                }
                .await;
                log.end(index, load.now_s(), result);
            };
            tokio::join!(load.clone().probes(PROBES, seed), fault);
        }
        Planned::RestartRouter { router } => {
            let p = routers[router];
            let index = log.begin("SIGTERM (drain), restart", &p.name, load.now_s());
            let result = async {
                p.signal("TERM")?;
                if !p.wait_exit(Duration::from_secs(45)).await {
                    anyhow::bail!("{} did not exit within 45 s of SIGTERM (killed)", p.name);
                }
                p.restart().await?;
                wait_all_ready(p, workers.len(), Duration::from_secs(60)).await
            }
            .await;
            log.end(index, load.now_s(), result);
        }
        Planned::StuckClient { secs } => {
            let what = format!("client stops reading 2 streams for {secs:.0} s");
            let index = log.begin(&what, "", load.now_s());
            load.clone()
                .stuck(Duration::from_secs_f64(secs), seed)
                .await;
            log.end(index, load.now_s(), Ok(()));
        }
    }
}

/// A readiness reading that broke the rule: (seconds, router, worker).
pub type Violation = (f64, String, String);

/// Reads every router's view of every worker each second until [`Load::stop`]; returns the
/// violations (see the [module docs](self)) and the number of readings judged.
pub async fn watch_readiness(
    cluster: &Cluster,
    load: &Load,
    log: &FaultLog,
) -> (Vec<Violation>, usize) {
    let http = reqwest::Client::new();
    let mut violations = Vec::new();
    let mut judged = 0;
    while !load.stop.load(Ordering::Relaxed) {
        for router in cluster.routers() {
            let Some(page) = scrape(&http, &router.metrics).await else {
                continue;
            };
            let t = load.now_s();
            if log.faulted(&router.name, t) {
                continue;
            }
            for worker in cluster.procs.iter().filter(|p| p.kind == Kind::Worker) {
                let ready = metric(&page, "router_worker_ready", Some(("worker", &worker.addr)));
                if log.faulted(&worker.name, t) || ready.is_none() {
                    continue;
                }
                judged += 1;
                if ready == Some(0.0) {
                    violations.push((t, router.name.clone(), worker.name.clone()));
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    (violations, judged)
}
