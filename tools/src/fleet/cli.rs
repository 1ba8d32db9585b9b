//! The `bench fleet` command line and its three modes:
//!
//! - default: real processes ([`super::real`]): per workload and policy, W workers and R routers
//!   started afresh, the workload replayed at `--load` times the pool's capacity; each run is also
//!   simulated with the fitted cost (`--cost`, else fitted first on one worker) and the calibration
//!   error printed;
//! - `--simulate`: the simulator alone over `--sim-workers` x `--sim-routers` x `--sim-loads`.
//!
//! Capacity (requests/s) is found by a saturating run (every request at time 0) under
//! `round_robin` on the same fleet (or the same simulated fleet); `--load 0.8` replays at 80 % of it.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use routing::Routing;

use super::calibrate::{fit_cost, fit_host_cores, relative_error};
use super::outcome::FleetSummary;
use super::real::{Fleet, FleetSpec};
use super::sim::worker::{CostModel, WorkerLimits};
use super::sim::{simulate, SharedHost, SimConfig, SimRequest};
use super::workload::{generate, ideal_hit_rate, Shape, WorkloadRequest, WorkloadSpec};

/// `bench fleet`: fleet benchmark of the routing policies (real processes or simulation).
#[derive(Debug, Clone, Parser)]
#[command(name = "bench fleet")]
pub struct FleetArgs {
    /// Workloads to run.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["shared-prefix", "multi-turn", "no-sharing"])]
    pub workload: Vec<Shape>,
    /// Policies to compare.
    #[arg(long, value_delimiter = ',', default_values = ["round_robin", "affinity", "kv_aware"], value_parser = parse_routing)]
    pub routing: Vec<Routing>,
    /// Seed of the workloads.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Groups / conversations / requests (see `fleet::workload`).
    #[arg(long, default_value_t = 8)]
    pub groups: usize,
    /// Questions per group / turns per conversation.
    #[arg(long, default_value_t = 6)]
    pub per_group: usize,
    /// Words of the shared system prompt.
    #[arg(long, default_value_t = 192)]
    pub prefix_tokens: usize,
    /// Words of a question.
    #[arg(long, default_value_t = 24)]
    pub question_tokens: usize,
    /// Words of an assistant reply (multi-turn).
    #[arg(long, default_value_t = 24)]
    pub reply_tokens: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 16)]
    pub max_new_tokens: u32,
    /// Offered load as a fraction of the pool's capacity.
    #[arg(long, default_value_t = 0.8)]
    pub load: f64,
    /// Workers (W) of the real fleet.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Routers (R) of the real fleet.
    #[arg(long, default_value_t = 2)]
    pub routers: usize,
    /// Model the workers serve.
    #[arg(long, default_value = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    /// Each worker's compute threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Each worker's KV blocks (16 tokens each).
    #[arg(long, default_value_t = 256)]
    pub kv_blocks: usize,
    /// The simulator's step cost as JSON (`CostModel`); without it, fitted on one real worker.
    #[arg(long)]
    pub cost: Option<String>,
    /// Simulation only.
    #[arg(long)]
    pub simulate: bool,
    /// Simulated worker counts.
    #[arg(long, value_delimiter = ',', default_values_t = [16usize, 128, 1024])]
    pub sim_workers: Vec<usize>,
    /// Simulated router counts.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 16])]
    pub sim_routers: Vec<usize>,
    /// Simulated loads.
    #[arg(long, value_delimiter = ',', default_values_t = [0.5f64, 0.8, 0.95])]
    pub sim_loads: Vec<f64>,
    /// Requests per simulated worker (the workload's groups scale with W).
    #[arg(long, default_value_t = 24)]
    pub sim_requests_per_worker: usize,
    /// The routers' `affinity_load_factor` (the load bound of `affinity` and `kv_aware`: a hit is
    /// taken only on a worker within `(1 + factor) x average load + prompt`), real and simulated.
    #[arg(long, default_value_t = 0.5)]
    pub load_factor: f64,
    /// The routers' `kv_prefill_weight` (`kv_aware`'s weight of the tokens to prefill against
    /// the load), real and simulated.
    #[arg(long, default_value_t = routing::kv_aware::DEFAULT_PREFILL_WEIGHT)]
    pub prefill_weight: f64,
    /// The routers' `kv_decode_weight` (`kv_aware`'s weight of a worker's running sequences times
    /// the request's new tokens), real and simulated; several (`0,1`) run `kv_aware` once per
    /// weight in the same sitting, labelled `kv_aware d=<weight>`.
    #[arg(long, value_delimiter = ',', default_values_t = [routing::kv_aware::DEFAULT_DECODE_WEIGHT])]
    pub decode_weight: Vec<f64>,
    /// Cores that the real fleet's workers share, for the simulated replay of each real run
    /// (calibration); default: fitted per workload so that the simulator's saturating run is as
    /// fast as the real one (`fleet::calibrate::fit_host_cores`, between 1 and W x threads). The
    /// `--simulate` sweeps give every worker its own cores unless this is given (to replay the
    /// calibration machine's contention).
    #[arg(long)]
    pub host_cores: Option<f64>,
    /// Where the processes' logs go.
    #[arg(long, default_value = "target/fleet-logs")]
    pub log_dir: PathBuf,
}

/// One policy run of a workload.
struct Run {
    routing: Routing,
    /// The routers' `kv_decode_weight`.
    decode_weight: f64,
    /// Its name in the report (`kv_aware d=<weight>` when several weights run).
    label: String,
}

fn parse_routing(s: &str) -> Result<Routing, clap::Error> {
    match s {
        "affinity" => Ok(Routing::Affinity),
        "round_robin" => Ok(Routing::RoundRobin),
        "kv_aware" => Ok(Routing::KvAware),
        _ => Err(clap::Error::raw(
            clap::error::ErrorKind::InvalidValue,
            format!("unknown routing '{s}' (affinity, round_robin or kv_aware)\n"),
        )),
    }
}

impl FleetArgs {
    fn spec(&self, shape: Shape, groups: usize) -> WorkloadSpec {
        WorkloadSpec {
            shape,
            seed: self.seed,
            groups,
            per_group: self.per_group,
            prefix_tokens: self.prefix_tokens,
            question_tokens: self.question_tokens,
            reply_tokens: self.reply_tokens,
            max_new_tokens: self.max_new_tokens,
        }
    }

    /// The decode weight of the runs that do not vary it (the first of `--decode-weight`).
    fn first_decode_weight(&self) -> f64 {
        self.decode_weight
            .first()
            .copied()
            .unwrap_or(routing::kv_aware::DEFAULT_DECODE_WEIGHT)
    }

    /// The runs per workload: each policy, `kv_aware` once per decode weight.
    fn runs(&self) -> Vec<Run> {
        let mut runs = Vec::new();
        for &routing in &self.routing {
            let weights = if routing == Routing::KvAware {
                self.decode_weight.clone()
            } else {
                vec![self.first_decode_weight()]
            };
            for &decode_weight in &weights {
                let label = if routing == Routing::KvAware && self.decode_weight.len() > 1 {
                    format!("{routing} d={decode_weight}")
                } else {
                    routing.to_string()
                };
                runs.push(Run {
                    routing,
                    decode_weight,
                    label,
                });
            }
        }
        runs
    }

    fn sim_config(
        &self,
        workers: usize,
        routers: usize,
        routing: Routing,
        decode_weight: f64,
        cost: CostModel,
        host: Option<SharedHost>,
    ) -> SimConfig {
        SimConfig {
            workers,
            routers,
            routing,
            limits: WorkerLimits {
                block_size: 16,
                kv_blocks: self.kv_blocks,
                max_num_seqs: 128,
                max_batch_tokens: 512,
            },
            cost,
            max_inflight_per_worker: 64,
            affinity_prefix_tokens: 64,
            load_factor: self.load_factor,
            prefill_weight: self.prefill_weight,
            decode_weight,
            host,
        }
    }

    /// `cores` shared by the workers, each of `--threads` threads.
    fn shared_host(&self, cores: f64) -> SharedHost {
        SharedHost {
            cores,
            threads_per_worker: self.threads,
        }
    }

    /// The shared host of the `--simulate` sweeps: `--host-cores` when given.
    fn sweep_host(&self) -> Option<SharedHost> {
        self.host_cores.map(|cores| self.shared_host(cores))
    }
}

/// The simulator's requests: `ids` (token ids per request) with the workload's lengths and times.
fn sim_requests(requests: &[WorkloadRequest], ids: Option<&[Vec<u32>]>) -> Vec<SimRequest> {
    requests
        .iter()
        .enumerate()
        .map(|(i, r)| SimRequest {
            prompt: ids.map_or_else(|| r.words.clone(), |ids| ids[i].clone()),
            max_new_tokens: r.max_new_tokens as usize,
            arrival_s: r.arrival_s,
            after: r.after,
        })
        .collect()
}

/// Runs `bench fleet` with `args`, printing the report on stdout.
pub async fn run(args: &FleetArgs) -> anyhow::Result<()> {
    if args.simulate {
        let cost = match &args.cost {
            Some(json) => serde_json::from_str(json).context("parsing --cost")?,
            None => anyhow::bail!("--simulate needs --cost (the JSON a real run prints)"),
        };
        simulate_sweep(args, cost);
        return Ok(());
    }
    real_runs(args).await
}

/// The simulated sweep: every W x R x load x workload x policy.
fn simulate_sweep(args: &FleetArgs, cost: CostModel) {
    println!(
        "simulated; cost {}",
        serde_json::to_string(&cost).unwrap_or_default()
    );
    for &shape in &args.workload {
        for &w in &args.sim_workers {
            let groups = (w * args.sim_requests_per_worker / args.per_group.max(1)).max(1);
            let groups = if shape == Shape::NoSharing {
                groups * args.per_group
            } else {
                groups
            };
            let spec = args.spec(shape, groups);
            let saturating = sim_requests(&generate(&spec, 0.0), None);
            let capacity = simulate(
                &args.sim_config(
                    w,
                    1,
                    Routing::RoundRobin,
                    args.first_decode_weight(),
                    cost,
                    args.sweep_host(),
                ),
                &saturating,
            )
            .summary()
            .requests_per_s;
            for &r in &args.sim_routers {
                for &load in &args.sim_loads {
                    let reqs = sim_requests(&generate(&spec, load * capacity), None);
                    for run in args.runs() {
                        let config = args.sim_config(
                            w,
                            r,
                            run.routing,
                            run.decode_weight,
                            cost,
                            args.sweep_host(),
                        );
                        let s = simulate(&config, &reqs).summary();
                        let label = format!("{shape} W={w} R={r} load={load} {}", run.label);
                        println!("{}", s.render(&label));
                    }
                }
            }
        }
    }
}

/// Real runs per workload and policy, each simulated alongside.
async fn real_runs(args: &FleetArgs) -> anyhow::Result<()> {
    let spec = FleetSpec {
        model: args.model.clone(),
        workers: args.workers,
        routers: args.routers,
        threads: args.threads,
        kv_blocks: args.kv_blocks,
        worker_args: Vec::new(),
        router_args: Vec::new(),
        log_dir: args.log_dir.clone(),
    };
    let settings = tempfile::tempdir().context("a temporary folder")?;
    // The fleet of a run: the routers' settings with its decode weight.
    let spec_of = |decode_weight: f64| -> anyhow::Result<FleetSpec> {
        let path = settings
            .path()
            .join(format!("router-d{decode_weight}.toml"));
        std::fs::write(
            &path,
            format!(
                "affinity_load_factor = {:?}\nkv_prefill_weight = {:?}\nkv_decode_weight = {:?}\n",
                args.load_factor, args.prefill_weight, decode_weight
            ),
        )
        .context("writing the routers' settings")?;
        Ok(FleetSpec {
            router_args: vec!["--config".into(), path.display().to_string()],
            ..spec.clone()
        })
    };
    let spec = spec_of(args.first_decode_weight())?;
    let cost = match &args.cost {
        Some(json) => serde_json::from_str(json).context("parsing --cost")?,
        None => {
            let one = FleetSpec {
                workers: 1,
                routers: 1,
                ..spec.clone()
            };
            let fleet = Fleet::start(&one, Routing::RoundRobin).await?;
            let cost = fit_cost(&fleet, 24, 400, 8).await;
            fleet.stop().await;
            cost?
        }
    };
    println!("fitted cost: {}", serde_json::to_string(&cost)?);
    println!(
        "W={} R={} model {} threads {}; this machine has {} cores",
        args.workers,
        args.routers,
        args.model.display(),
        args.threads,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for &shape in &args.workload {
        let groups = if shape == Shape::NoSharing {
            args.groups * args.per_group
        } else {
            args.groups
        };
        let wspec = args.spec(shape, groups);
        let fleet = Fleet::start(&spec, Routing::RoundRobin).await?;
        let saturating = generate(&wspec, 0.0);
        let ids = fleet.tokenize(&saturating).await?;
        let capacity = fleet.replay(&saturating).await?.summary().requests_per_s;
        fleet.stop().await;
        let rate = args.load * capacity;
        println!(
            "{shape}: {} requests, capacity {capacity:.2} req/s (round_robin, saturating), rate {rate:.2} req/s, ideal hit {:.1}%",
            saturating.len(),
            ideal_hit_rate(&ids, 16) * 100.0
        );
        let sim_saturating = sim_requests(&saturating, Some(&ids));
        let sim_capacity = |cores: f64| {
            let host = args.shared_host(cores);
            let config = args.sim_config(
                args.workers,
                args.routers,
                Routing::RoundRobin,
                args.first_decode_weight(),
                cost,
                Some(host),
            );
            simulate(&config, &sim_saturating).summary().requests_per_s
        };
        let all_cores = (args.workers * args.threads.max(1)) as f64;
        let host = args.shared_host(args.host_cores.unwrap_or_else(|| {
            fit_host_cores(capacity, 1.0_f64.min(all_cores), all_cores, sim_capacity)
        }));
        println!(
            "  simulated host: the workers share {:.2} cores ({}); simulated capacity {:.2} req/s",
            host.cores,
            if args.host_cores.is_some() {
                "--host-cores"
            } else {
                "fitted to the saturating run's capacity"
            },
            sim_capacity(host.cores)
        );
        let requests = generate(&wspec, rate);
        for run in args.runs() {
            let fleet = Fleet::start(&spec_of(run.decode_weight)?, run.routing).await?;
            let measured = fleet.replay(&requests).await;
            fleet.stop().await;
            let measured = measured?;
            // Simulate with the real send times (a turn's send time is when its previous turn ended
            // on the real fleet; the simulator re-derives it from its own finishes).
            let simulated = simulate(
                &args.sim_config(
                    args.workers,
                    args.routers,
                    run.routing,
                    run.decode_weight,
                    cost,
                    Some(host),
                ),
                &sim_requests(&requests, Some(&ids)),
            );
            let (m, s) = (measured.summary(), simulated.summary());
            println!("{}", m.render(&format!("{shape} {} real", run.label)));
            println!("{}", s.render(&format!("{shape} {} sim", run.label)));
            println!("{}", error_line(&m, &s));
            println!(
                "  per-worker hit rate (real): {:?}",
                m.worker_hit_rates
                    .iter()
                    .map(|h| (h * 1000.0).round() / 10.0)
                    .collect::<Vec<_>>()
            );
        }
    }
    Ok(())
}

fn error_line(m: &FleetSummary, s: &FleetSummary) -> String {
    let pct = |sim: f64, real: f64| relative_error(sim, real) * 100.0;
    format!(
        "  sim error: hit {:+.1} pts, TTFT p50 {:+.0}%, p90 {:+.0}%, p99 {:+.0}%, tok/s {:+.0}%",
        (s.hit_rate - m.hit_rate) * 100.0,
        pct(s.ttft_p50_ms, m.ttft_p50_ms),
        pct(s.ttft_p90_ms, m.ttft_p90_ms),
        pct(s.ttft_p99_ms, m.ttft_p99_ms),
        pct(s.output_tokens_per_s, m.output_tokens_per_s),
    )
}
