//! The whole soak: start the cluster, fit the prompts, take the greedy references on the idle pool
//! (twice, through each router, to show they are reproducible), then run the steady clients, the
//! fault schedule, the readiness watch and the sampler together for `--duration`; wait for the
//! last requests, then for the workers to hold no KV block (up to 30 s), take the final sample and
//! judge. The processes are killed at the end, whatever happened.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use inference_proto::public::text_generation_client::TextGenerationClient;
use inference_proto::public::GenerateRequest;
use tonic::transport::Channel;

use super::cli::SoakArgs;
use super::faults::{self, FaultLog};
use super::load::{Load, Prompt, Reference, Tag, GREEDY_NEW};
use super::procs::{lazy_channel, Cluster};
use super::report::{render_sample, sample, summary, Finish, ProcSample, Sample};
use crate::bench::prompt::build_prompts;
use crate::bench::rng::SplitMix64;
use crate::bench::target::RpcTokenizer;

/// Token counts of the greedy reference prompts.
const REFERENCE_TOKENS: [usize; 6] = [5, 60, 300, 900, 1800, 3000];
/// Prompts in the pool of the sampled and constrained requests.
const POOL: usize = 40;
/// Workers and routers.
const WORKERS: usize = 3;
const ROUTERS: usize = 2;

/// Runs the soak; prints the samples and the summary (its last line the one-line summary).
/// Returns whether every target held.
///
/// Errors: the cluster, the prompts or the references could not be set up.
pub async fn run(args: &SoakArgs) -> anyhow::Result<bool> {
    let dir = args
        .work_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("soak-{}", std::process::id())));
    println!(
        "soak: {} s of load; logs and records in {}",
        args.duration,
        dir.display()
    );
    // SIGINT / SIGTERM (e.g. scripts/soak interrupted) end the run here; dropping the cluster
    // kills its processes (`kill_on_drop`).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let run = async {
        let cluster =
            Cluster::start(&args.model, WORKERS, ROUTERS, args.kv_cache_mib, &dir).await?;
        let result = soak(args, &cluster, dir.clone()).await;
        cluster.stop().await;
        result
    };
    tokio::select! {
        result = run => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted (SIGINT)")),
        _ = term.recv() => Err(anyhow::anyhow!("interrupted (SIGTERM)")),
    }
}

/// Fits the reference prompts and a pool of prompts of 5 to 3,000 tokens (about half short, a
/// third medium, the rest long).
async fn prompts(router: Channel, seed: u64) -> anyhow::Result<Vec<Prompt>> {
    let mut rng = SplitMix64::new(seed);
    let mut targets = REFERENCE_TOKENS.to_vec();
    for _ in 0..POOL {
        let (lo, hi) = match rng.below(100) {
            0..55 => (5, 150),
            55..85 => (150, 800),
            _ => (800, 3000),
        };
        targets.push(rng.between(lo, hi) as usize);
    }
    let tokenizer = RpcTokenizer::new(TextGenerationClient::new(router));
    let fitted = build_prompts(&tokenizer, &targets, 0, seed, 4)
        .await
        .context("fitting the prompts")?;
    Ok(fitted
        .into_iter()
        .map(|p| Prompt {
            tokens: p.ids.len(),
            text: p.text,
        })
        .collect())
}

/// The greedy output of `prompt` alone ([`GREEDY_NEW`] tokens, `ignore_eos`).
async fn solo(router: Channel, prompt: &str) -> anyhow::Result<Reference> {
    let request = GenerateRequest {
        prompt: prompt.to_string(),
        max_new_tokens: Some(GREEDY_NEW),
        ignore_eos: true,
        seed: Some(0),
        ..Default::default()
    };
    let limit = Duration::from_secs(300);
    let follow = async {
        let mut client = TextGenerationClient::new(router);
        let mut stream = client.generate(request).await?.into_inner();
        let mut got = Reference {
            ids: Vec::new(),
            text: String::new(),
        };
        while let Some(message) = stream.message().await? {
            got.ids.extend(message.tokens.iter().map(|t| t.id));
            got.text.push_str(&message.text);
        }
        Ok::<_, tonic::Status>(got)
    };
    let got = tokio::time::timeout(limit, follow)
        .await
        .context("a reference request took over 300 s")??;
    anyhow::ensure!(
        got.ids.len() == GREEDY_NEW as usize,
        "a reference request streamed {} tokens, not {GREEDY_NEW}",
        got.ids.len()
    );
    Ok(got)
}

async fn soak(args: &SoakArgs, cluster: &Cluster, dir: PathBuf) -> anyhow::Result<bool> {
    let routers: Vec<(Channel, String)> = cluster
        .routers()
        .map(|r| Ok((lazy_channel(&r.addr)?, r.http.clone().unwrap_or_default())))
        .collect::<anyhow::Result<_>>()?;
    let started = Instant::now();
    let prompts = prompts(routers[0].0.clone(), args.seed).await?;
    let mut refs = Vec::new();
    let mut references_agree = true;
    for p in &prompts[..REFERENCE_TOKENS.len()] {
        let first = solo(routers[0].0.clone(), &p.text).await?;
        let again = solo(routers[ROUTERS - 1].0.clone(), &p.text).await?;
        references_agree &= first.ids == again.ids && first.text == again.text;
        refs.push(first);
    }
    println!(
        "soak: {} prompts fitted, {} greedy references taken twice in {:.1} s (agree: \
         {references_agree})",
        prompts.len(),
        refs.len(),
        started.elapsed().as_secs_f64()
    );

    let hang = Duration::from_secs(args.hang_secs);
    let load = Arc::new(Load::new(routers, prompts, refs, hang)?);
    let log = FaultLog::default();
    let duration = args.duration as f64;
    let until = Instant::now() + Duration::from_secs(args.duration);
    let mut samples: Vec<Sample> = Vec::new();
    let http = reqwest::Client::new();
    let steady = futures::future::join_all((0..args.clients).map(|c| {
        load.clone()
            .client(args.seed + c as u64, until, Tag::Normal)
    }));
    let plan = faults::schedule(duration, args.clients);
    let work = async {
        tokio::join!(steady, faults::run(plan, cluster, &load, &log));
        load.stop.store(true, Ordering::Relaxed);
    };
    let sampler = async {
        let mut next = args.sample_secs as f64;
        while !load.stop.load(Ordering::Relaxed) {
            if load.now_s() < next {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            let s = sample(cluster, &http, load.now_s()).await;
            let records = load.records.lock().expect("records").clone();
            let in_flight = load.in_flight.load(Ordering::Relaxed);
            println!("{}", render_sample(&s, "sample", &records, in_flight));
            samples.push(s);
            next += args.sample_secs as f64;
        }
    };
    let ((), (violations, judged), ()) =
        tokio::join!(work, faults::watch_readiness(cluster, &load, &log), sampler);

    // Idle: every request has ended; the workers should free their blocks.
    let idle_until = Instant::now() + Duration::from_secs(30);
    let last = loop {
        let s = sample(cluster, &http, load.now_s()).await;
        let freed = s
            .procs
            .iter()
            .filter(|p| p.name.starts_with("worker"))
            .all(ProcSample::holds_nothing);
        if freed || Instant::now() > idle_until {
            break s;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let records = load.records.lock().expect("records").clone();
    println!(
        "{}",
        render_sample(
            &last,
            "end, idle",
            &records,
            load.in_flight.load(Ordering::Relaxed)
        )
    );
    samples.push(last);

    let lines: Vec<String> = records
        .iter()
        .map(|r| serde_json::to_string(r).expect("a record is JSON"))
        .collect();
    let path = dir.join("records.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n")
        .with_context(|| format!("writing {}", path.display()))?;

    let fault_list = log.faults.lock().expect("fault log").clone();
    let (text, pass) = summary(&Finish {
        duration,
        records: &records,
        samples: &samples,
        faults: &fault_list,
        violations: &violations,
        judged,
        unanswered: load.in_flight.load(Ordering::Relaxed),
        references_agree,
    });
    println!("{text}");
    Ok(pass)
}
