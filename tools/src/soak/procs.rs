//! The soak's processes: W workers and R routers on 127.0.0.1 (every router over every worker),
//! each restartable on its own ports ([`Proc::restart`]), signalled with `kill` ([`Proc::signal`]),
//! and read from outside: `/proc/PID` (RSS, open fds, threads) and the Prometheus page on its
//! `--metrics-listen` ([`scrape`], [`metric`]).
//!
//! Each start of a process is an *instance* (its log: `NAME.INSTANCE.log` in the run's folder);
//! the memory curve is kept per instance, since a restarted process starts afresh.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use inference_proto::public::text_generation_client::TextGenerationClient;
use inference_proto::public::ModelInfoRequest;
use tokio::process::Child;
use tonic::transport::{Channel, Endpoint};

use crate::fleet::real::{free_port, spawn};

/// Limit on one metrics scrape (a stopped process never answers).
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(3);

/// What a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A `worker`.
    Worker,
    /// A `router` (gRPC, HTTP and metrics ports).
    Router,
}

/// The running instance of a process.
struct Running {
    child: Option<Child>,
    pid: u32,
    instance: u32,
    started: Instant,
}

/// One process of the cluster: fixed name and ports, restartable.
pub struct Proc {
    /// `worker-0`, `router-1`, ...
    pub name: String,
    /// Worker or router.
    pub kind: Kind,
    /// gRPC address (HOST:PORT).
    pub addr: String,
    /// Prometheus page address (HOST:PORT).
    pub metrics: String,
    /// The OpenAI HTTP front (routers): `http://HOST:PORT`.
    pub http: Option<String>,
    args: Vec<String>,
    log_dir: PathBuf,
    running: Mutex<Running>,
}

/// One reading of a process from `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcStats {
    /// Resident set, KiB (`VmRSS`).
    pub rss_kib: u64,
    /// Open file descriptors.
    pub fds: u64,
    /// Threads.
    pub threads: u64,
}

impl Proc {
    /// The process's pid, instance number (0 first) and when that instance started.
    pub fn current(&self) -> (u32, u32, Instant) {
        let r = self.running.lock().expect("proc lock");
        (r.pid, r.instance, r.started)
    }

    /// Sends `sig` (`KILL`, `STOP`, `CONT`, `TERM`) to the current instance.
    pub fn signal(&self, sig: &str) -> anyhow::Result<()> {
        let pid = self.current().0;
        let status = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -{sig} {pid} ({}) failed", self.name);
        }
        Ok(())
    }

    /// Waits up to `limit` for the current instance to exit (after a signal); kills it when it
    /// has not. Returns whether it exited by itself.
    pub async fn wait_exit(&self, limit: Duration) -> bool {
        let child = self.running.lock().expect("proc lock").child.take();
        let Some(mut child) = child else { return true };
        match tokio::time::timeout(limit, child.wait()).await {
            Ok(_) => true,
            Err(_) => {
                let _ = child.kill().await;
                false
            }
        }
    }

    /// Starts a new instance on the same ports (after [`Proc::wait_exit`]) and waits for its
    /// ready line.
    pub async fn restart(&self) -> anyhow::Result<()> {
        let instance = self.current().1 + 1;
        let child = start(self.kind, &self.name, instance, &self.args, &self.log_dir).await?;
        let mut r = self.running.lock().expect("proc lock");
        r.pid = child.id().unwrap_or(0);
        r.child = Some(child);
        r.instance = instance;
        r.started = Instant::now();
        Ok(())
    }

    /// RSS, fds and threads of the current instance (`None` when it is not running).
    pub fn stats(&self) -> Option<ProcStats> {
        let pid = self.current().0;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
        Some(ProcStats {
            rss_kib: field("VmRSS:")?,
            fds,
            threads: field("Threads:")?,
        })
    }
}

/// Starts instance `instance` of a process and waits for its ready line.
async fn start(
    kind: Kind,
    name: &str,
    instance: u32,
    args: &[String],
    log_dir: &Path,
) -> anyhow::Result<Child> {
    let (bin, ready) = match kind {
        Kind::Worker => ("worker", "worker ready"),
        Kind::Router => ("router", "router ready"),
    };
    let log = log_dir.join(format!("{name}.{instance}.log"));
    spawn(bin, args, ready, &log)
        .await
        .with_context(|| format!("starting {name}"))
}

/// The whole cluster.
pub struct Cluster {
    /// Workers first, then routers.
    pub procs: Vec<Proc>,
}

impl Cluster {
    /// Starts `workers` workers of `model` (each `--threads 1`, `kv_mib` of KV cache, plus
    /// `worker_args`), then `routers` routers over all of them, and waits until every router
    /// reports every worker ready.
    pub async fn start(
        model: &Path,
        workers: usize,
        routers: usize,
        kv_mib: u32,
        log_dir: &Path,
    ) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let mut procs = Vec::new();
        let mut addrs = Vec::new();
        for i in 0..workers {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let metrics = format!("127.0.0.1:{}", free_port()?);
            let args: Vec<String> = [
                "--model",
                &model.display().to_string(),
                "--listen",
                &addr,
                "--metrics-listen",
                &metrics,
                "--threads",
                "1",
                "--kv-cache-mib",
                &kv_mib.to_string(),
            ]
            .map(String::from)
            .to_vec();
            addrs.push(addr.clone());
            procs.push(
                Proc::launch(
                    Kind::Worker,
                    format!("worker-{i}"),
                    addr,
                    metrics,
                    None,
                    args,
                    log_dir,
                )
                .await?,
            );
        }
        for i in 0..routers {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let metrics = format!("127.0.0.1:{}", free_port()?);
            let http = format!("127.0.0.1:{}", free_port()?);
            let args: Vec<String> = [
                "--listen",
                &addr,
                "--workers",
                &addrs.join(","),
                "--http-listen",
                &http,
                "--metrics-listen",
                &metrics,
            ]
            .map(String::from)
            .to_vec();
            let http = Some(format!("http://{http}"));
            procs.push(
                Proc::launch(
                    Kind::Router,
                    format!("router-{i}"),
                    addr,
                    metrics,
                    http,
                    args,
                    log_dir,
                )
                .await?,
            );
        }
        let cluster = Cluster { procs };
        for router in cluster.routers() {
            wait_all_ready(router, workers, Duration::from_secs(120)).await?;
        }
        Ok(cluster)
    }

    /// The workers.
    pub fn workers(&self) -> impl Iterator<Item = &Proc> {
        self.procs.iter().filter(|p| p.kind == Kind::Worker)
    }

    /// The routers.
    pub fn routers(&self) -> impl Iterator<Item = &Proc> {
        self.procs.iter().filter(|p| p.kind == Kind::Router)
    }

    /// Kills every process (best effort; `kill_on_drop` covers the rest).
    pub async fn stop(&self) {
        for p in &self.procs {
            let _ = p.signal("CONT");
            let _ = p.signal("KILL");
            p.wait_exit(Duration::from_secs(5)).await;
        }
    }
}

impl Proc {
    async fn launch(
        kind: Kind,
        name: String,
        addr: String,
        metrics: String,
        http: Option<String>,
        args: Vec<String>,
        log_dir: &Path,
    ) -> anyhow::Result<Proc> {
        let child = start(kind, &name, 0, &args, log_dir).await?;
        Ok(Proc {
            running: Mutex::new(Running {
                pid: child.id().unwrap_or(0),
                child: Some(child),
                instance: 0,
                started: Instant::now(),
            }),
            name,
            kind,
            addr,
            metrics,
            http,
            args,
            log_dir: log_dir.to_path_buf(),
        })
    }
}

/// A gRPC channel to `addr` that connects when first used and reconnects after a restart.
pub fn lazy_channel(addr: &str) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy())
}

/// Waits up to `limit` for `router`'s `ModelInfo` to count `workers` ready workers.
pub async fn wait_all_ready(router: &Proc, workers: usize, limit: Duration) -> anyhow::Result<()> {
    wait_ready_workers(&router.addr, workers, limit)
        .await
        .with_context(|| router.name.clone())
}

/// Waits up to `limit` for the router at `addr` to count `workers` ready workers in its
/// `ModelInfo` (a router prints "router ready" before it has connected to its workers).
/// Errors: the count still short when `limit` passes.
pub async fn wait_ready_workers(addr: &str, workers: usize, limit: Duration) -> anyhow::Result<()> {
    let mut client = TextGenerationClient::new(lazy_channel(addr)?);
    let deadline = Instant::now() + limit;
    loop {
        let call = client.model_info(ModelInfoRequest::default());
        let ready = match tokio::time::timeout(Duration::from_secs(5), call).await {
            Ok(Ok(info)) => info.get_ref().ready_workers as usize,
            _ => 0,
        };
        if ready >= workers {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the router at {addr} sees {ready} of {workers} workers ready after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The Prometheus page at `addr` (`None` when it does not answer within 3 s).
pub async fn scrape(http: &reqwest::Client, addr: &str) -> Option<String> {
    let get = http
        .get(format!("http://{addr}/metrics"))
        .timeout(SCRAPE_TIMEOUT);
    let response = get.send().await.ok()?;
    response.text().await.ok()
}

/// The value of the sample `name` (with `label="value"` among its labels, when given) in a
/// Prometheus text page.
pub fn metric(page: &str, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    page.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once('}')?,
            None if rest.starts_with(' ') => ("", rest),
            None => return None,
        };
        if let Some((key, want)) = label {
            if !labels
                .split(',')
                .any(|kv| kv == format!("{key}=\"{want}\""))
            {
                return None;
            }
        }
        value.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_lines() {
        let page = "# HELP x\nworker_kv_blocks_used 12\nworker_kv_blocks_used_total 3\n\
                    router_worker_ready{worker=\"127.0.0.1:1\"} 1\n\
                    router_worker_ready{worker=\"127.0.0.1:2\"} 0\n";
        assert_eq!(metric(page, "worker_kv_blocks_used", None), Some(12.0));
        let ready = |w| metric(page, "router_worker_ready", Some(("worker", w)));
        assert_eq!(ready("127.0.0.1:1"), Some(1.0));
        assert_eq!(ready("127.0.0.1:2"), Some(0.0));
        assert_eq!(ready("127.0.0.1:3"), None);
        assert_eq!(metric(page, "worker_kv", None), None);
    }
}
