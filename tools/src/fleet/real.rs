//! `bench fleet` on real processes: W `worker` and R `router` processes (the binaries next to the
//! `bench` binary) on 127.0.0.1, started afresh for each policy so that every policy begins with
//! empty caches, a workload replayed open-loop through the routers' public `Generate`, and the
//! workers' own prefix-cache counters (`Info`'s `EngineStats`) read before and after.
//!
//! Requests go to the routers in turn; each asks for exactly `max_new_tokens` tokens
//! (`ignore_eos`, greedy). A request's TTFT is from when it was sent (a conversation's turn: when
//! its previous turn ended, or its own arrival if later) to its first streamed token. Each request
//! has a deadline ([`REQUEST_TIMEOUT`]); one that misses it counts as failed, so a run always ends.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use inference_proto::inference::v1::text_generation_client::TextGenerationClient;
use inference_proto::inference::v1::{GenerateRequest, TokenizeRequest};
use inference_proto::inference::worker::v1::worker_client::WorkerClient;
use inference_proto::inference::worker::v1::{EngineStats, InfoRequest};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tonic::transport::Channel;

use super::outcome::{FleetOutcome, RequestTiming};
use super::workload::WorkloadRequest;

/// Longest a request may take from send to its last token.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest a process may take to print its ready line.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// What to start.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    /// The model file or folder every worker serves.
    pub model: PathBuf,
    /// Workers (W).
    pub workers: usize,
    /// Routers (R).
    pub routers: usize,
    /// Each worker's `--threads`.
    pub threads: usize,
    /// Each worker's `--kv-cache-blocks`.
    pub kv_blocks: usize,
    /// Extra worker flags.
    pub worker_args: Vec<String>,
    /// Extra router flags.
    pub router_args: Vec<String>,
    /// Where the processes' logs go.
    pub log_dir: PathBuf,
}

/// The started processes; killed when dropped.
pub struct Fleet {
    children: Vec<Child>,
    /// The workers' gRPC addresses.
    pub workers: Vec<String>,
    /// The routers' gRPC addresses.
    pub routers: Vec<String>,
}

/// A port on 127.0.0.1 that was free a moment ago (also `bench soak`'s).
pub(crate) fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// The `name` binary next to the running `bench` binary.
pub(crate) fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the bench binary")?;
    let path = exe.with_file_name(name);
    if !path.exists() {
        bail!(
            "no `{name}` binary next to {} (build it: cargo build --release --bins)",
            exe.display()
        );
    }
    Ok(path)
}

/// Starts `bin args`, logs its stderr to `log`, and waits for a stdout line containing `ready`.
pub(crate) async fn spawn(
    bin: &str,
    args: &[String],
    ready: &str,
    log: &Path,
) -> anyhow::Result<Child> {
    let mut child = Command::new(binary(bin)?)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {bin}"))?;
    let stdout = child.stdout.take().context("piped stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let waited = tokio::time::timeout(START_TIMEOUT, async {
        while let Some(line) = lines.next_line().await? {
            if line.contains(ready) {
                return Ok(true);
            }
        }
        Ok::<bool, std::io::Error>(false)
    })
    .await;
    match waited {
        Ok(Ok(true)) => {}
        Ok(_) => bail!("{bin} exited before it was ready (log: {})", log.display()),
        Err(_) => bail!(
            "{bin} not ready after {START_TIMEOUT:?} (log: {})",
            log.display()
        ),
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(child)
}

impl Fleet {
    /// Starts the workers, then the routers (`--routing routing`) over all of them.
    pub async fn start(spec: &FleetSpec, routing: routing::Routing) -> anyhow::Result<Fleet> {
        std::fs::create_dir_all(&spec.log_dir)
            .with_context(|| format!("creating {}", spec.log_dir.display()))?;
        let mut fleet = Fleet {
            children: Vec::new(),
            workers: Vec::new(),
            routers: Vec::new(),
        };
        for i in 0..spec.workers {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let mut args: Vec<String> = vec![
                "--model".into(),
                spec.model.display().to_string(),
                "--listen".into(),
                addr.clone(),
                "--threads".into(),
                spec.threads.to_string(),
                "--kv-cache-blocks".into(),
                spec.kv_blocks.to_string(),
            ];
            args.extend(spec.worker_args.iter().cloned());
            let log = spec.log_dir.join(format!("worker-{routing}-{i}.log"));
            fleet
                .children
                .push(spawn("worker", &args, "worker ready", &log).await?);
            fleet.workers.push(addr);
        }
        for i in 0..spec.routers {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let mut args: Vec<String> = vec![
                "--listen".into(),
                addr.clone(),
                "--workers".into(),
                fleet.workers.join(","),
                "--routing".into(),
                routing.to_string(),
            ];
            args.extend(spec.router_args.iter().cloned());
            let log = spec.log_dir.join(format!("router-{routing}-{i}.log"));
            fleet
                .children
                .push(spawn("router", &args, "router ready", &log).await?);
            fleet.routers.push(addr);
        }
        fleet.wait_for_workers().await?;
        Ok(fleet)
    }

    /// Waits until every router answers `Tokenize` (it knows a ready worker), then one health
    /// interval (2 s) more so that every router has connected to every worker.
    async fn wait_for_workers(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        for mut client in self.clients().await? {
            loop {
                let probe = TokenizeRequest {
                    text: "ready".into(),
                    add_special_tokens: true,
                };
                match client.tokenize(probe).await {
                    Ok(_) => break,
                    Err(status) if Instant::now() > deadline => {
                        bail!("a router has no ready worker after {START_TIMEOUT:?}: {status}")
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(())
    }

    /// Kills every process and waits for it.
    pub async fn stop(mut self) {
        for child in &mut self.children {
            let _ = child.kill().await;
        }
    }

    /// Every worker's engine counters.
    pub async fn worker_stats(&self) -> anyhow::Result<Vec<EngineStats>> {
        let mut all = Vec::with_capacity(self.workers.len());
        for addr in &self.workers {
            let mut client = WorkerClient::connect(format!("http://{addr}"))
                .await
                .with_context(|| format!("connecting to worker {addr}"))?;
            let info = client.info(InfoRequest {}).await?.into_inner();
            all.push(info.stats.unwrap_or_default());
        }
        Ok(all)
    }

    async fn clients(&self) -> anyhow::Result<Vec<TextGenerationClient<Channel>>> {
        let mut clients = Vec::new();
        for addr in &self.routers {
            clients.push(
                TextGenerationClient::connect(format!("http://{addr}"))
                    .await
                    .with_context(|| format!("connecting to router {addr}"))?,
            );
        }
        Ok(clients)
    }

    /// The routers' token ids of each prompt (special tokens added, as `Generate` encodes).
    pub async fn tokenize(&self, requests: &[WorkloadRequest]) -> anyhow::Result<Vec<Vec<u32>>> {
        let mut client = self.clients().await?.remove(0);
        let mut all = Vec::with_capacity(requests.len());
        for r in requests {
            let ids = client
                .tokenize(TokenizeRequest {
                    text: r.text(),
                    add_special_tokens: true,
                })
                .await?
                .into_inner()
                .ids;
            all.push(ids);
        }
        Ok(all)
    }

    /// Replays `requests` (open loop, arrivals as generated) and returns their timings with the
    /// workers' prefix-cache counters over the run.
    pub async fn replay(&self, requests: &[WorkloadRequest]) -> anyhow::Result<FleetOutcome> {
        let clients = self.clients().await?;
        let before = self.worker_stats().await?;
        let start = Instant::now();
        let mut done_tx: Vec<Option<tokio::sync::watch::Sender<bool>>> = Vec::new();
        let mut done_rx = Vec::new();
        for _ in requests {
            let (tx, rx) = tokio::sync::watch::channel(false);
            done_tx.push(Some(tx));
            done_rx.push(rx);
        }
        let mut tasks = Vec::with_capacity(requests.len());
        for (i, r) in requests.iter().enumerate() {
            let mut client = clients[i % clients.len()].clone();
            let previous = r.after.map(|p| done_rx[p].clone());
            let done = done_tx[i].take().expect("one sender per request");
            let request = GenerateRequest {
                prompt: r.text(),
                max_new_tokens: Some(r.max_new_tokens),
                ignore_eos: true,
                seed: Some(i as u64),
                ..Default::default()
            };
            let arrival = Duration::from_secs_f64(r.arrival_s);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until((start + arrival).into()).await;
                if let Some(mut previous) = previous {
                    let _ = previous.wait_for(|d| *d).await;
                }
                let sent = start.elapsed().as_secs_f64();
                let mut timing = RequestTiming {
                    arrival_s: sent,
                    first_token_s: None,
                    finish_s: None,
                    output_tokens: 0,
                };
                let follow = async {
                    let mut stream = client.generate(request).await?.into_inner();
                    while let Some(message) = stream.message().await? {
                        if !message.tokens.is_empty() {
                            timing
                                .first_token_s
                                .get_or_insert(start.elapsed().as_secs_f64());
                            timing.output_tokens += message.tokens.len() as u64;
                        }
                        if message.usage.is_some() {
                            timing.finish_s = Some(start.elapsed().as_secs_f64());
                        }
                    }
                    Ok::<(), tonic::Status>(())
                };
                let ok = matches!(
                    tokio::time::timeout(REQUEST_TIMEOUT, follow).await,
                    Ok(Ok(()))
                );
                if !ok {
                    timing.finish_s = None;
                }
                let _ = done.send(true);
                timing
            }));
        }
        let mut timings = Vec::with_capacity(tasks.len());
        for t in tasks {
            timings.push(t.await.context("a request task panicked")?);
        }
        let after = self.worker_stats().await?;
        let delta = |f: fn(&EngineStats) -> u64| -> Vec<u64> {
            before
                .iter()
                .zip(&after)
                .map(|(b, a)| f(a).saturating_sub(f(b)))
                .collect()
        };
        Ok(FleetOutcome {
            requests: timings,
            worker_requests: delta(|s| {
                s.finished_requests + s.cancelled_requests + s.failed_requests
            }),
            worker_query_tokens: delta(|s| s.prefix_cache_query_tokens),
            worker_hit_tokens: delta(|s| s.prefix_cache_hit_tokens),
        })
    }
}
