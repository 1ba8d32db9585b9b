//! `bench stuck-clients`: issue 31's slow-client target, measured on a real model. Clients that
//! open streams and never read them must not slow the others down: the normal requests' ITL p50
//! beside 32 stuck streams within 1.5x of their ITL without them.
//!
//! 1. Starts one worker (`--model`, `--threads`) and one router on 127.0.0.1, the router with a
//!    `slow_client_timeout_ms` longer than the run, so that no stuck stream is cancelled while it
//!    is measured.
//! 2. `--rounds` times, alternating so that drift hits both sides alike:
//!    - *alone*: `--normal` streaming greedy requests of `--tokens` new tokens each, all at once,
//!      read as they come;
//!    - *beside stuck*: first `--stuck` streams of `--stuck-tokens` new tokens on their own
//!      connection, whose HTTP/2 stream window is 1 KiB and never released (the client reads
//!      nothing); once the worker holds them all (`held_sequences`, or `--settle-ms` passed for a
//!      worker without flow control), the same normal requests as alone; then the stuck streams
//!      are dropped (cancelled) and the worker is left idle.
//! 3. ITL is the gap between two consecutive token messages of one normal stream, at the client,
//!    in ms; every gap of every normal stream of every round of a side is one sample.
//!
//! Prints both sides' ITL p50 and p90, TTFT p50, the tokens generated for the stuck streams and
//! the ratio of the ITL p50s. Exit status (from `bench`): 0 when the ratio is at most
//! `--max-ratio` and every normal stream ended well with the tokens it had alone, 1 when not, 2
//! when the run could not be carried out.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use futures::future::join_all;
use inference_proto::public::text_generation_client::TextGenerationClient;
use inference_proto::public::GenerateRequest;
use inference_proto::worker::worker_client::WorkerClient;
use inference_proto::worker::{EngineStats, InfoRequest};
use tonic::transport::{Channel, Endpoint};

use crate::bench::stats::Distribution;
use crate::fleet::real::{free_port, spawn};
use crate::fleet::workload::WORDS;
use crate::soak::procs::wait_ready_workers;

/// `bench stuck-clients`: normal requests' ITL beside clients that never read.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench stuck-clients")]
pub struct StuckArgs {
    /// The model the worker serves (GGUF file or Hugging Face folder).
    #[arg(long)]
    pub model: PathBuf,
    /// The worker's compute threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Normal (reading) requests per round, run at once.
    #[arg(long, default_value_t = 8)]
    pub normal: usize,
    /// New tokens per normal request (EOS ignored).
    #[arg(long, default_value_t = 64)]
    pub tokens: u32,
    /// Streams whose client never reads.
    #[arg(long, default_value_t = 32)]
    pub stuck: usize,
    /// New tokens each stuck request asks for.
    #[arg(long, default_value_t = 4_000)]
    pub stuck_tokens: u32,
    /// Rounds of each side (alone, beside stuck), alternating.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Longest wait, after the stuck streams opened, for the worker to hold them all.
    #[arg(long, default_value_t = 20_000)]
    pub settle_ms: u64,
    /// The target: ITL p50 beside the stuck streams at most this many times ITL p50 alone.
    #[arg(long, default_value_t = 1.5)]
    pub max_ratio: f64,
    /// Where the processes' logs go.
    #[arg(long, default_value = "target/stuck-clients-logs")]
    pub log_dir: PathBuf,
}

/// What the normal requests of one round saw.
#[derive(Debug, Default)]
struct Round {
    /// Gaps between consecutive token messages, ms.
    itl_ms: Vec<f64>,
    /// Time to the first token, ms.
    ttft_ms: Vec<f64>,
    /// Each request's token ids.
    tokens: Vec<Vec<u32>>,
}

/// A few words of the shared vocabulary, distinct per `(kind, i)`.
fn prompt(kind: &str, i: usize, words: usize) -> String {
    let mut text = format!("{kind} {i}:");
    for k in 0..words {
        text.push(' ');
        text.push_str(WORDS[(i * 7 + k * 13) % WORDS.len()]);
    }
    text
}

fn greedy(prompt: String, max_new_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_new_tokens: Some(max_new_tokens),
        ignore_eos: true,
        ..Default::default()
    }
}

/// Runs the normal requests at once and reads them to their end.
async fn run_normal(router: &Channel, args: &StuckArgs) -> anyhow::Result<Round> {
    let runs = (0..args.normal).map(|i| {
        let mut client = TextGenerationClient::new(router.clone());
        let request = greedy(prompt("Question", i, 12), args.tokens);
        async move {
            let started = Instant::now();
            let mut stream = client.generate(request).await?.into_inner();
            let (mut last, mut ttft, mut gaps, mut ids) =
                (None::<Instant>, None, Vec::new(), Vec::new());
            while let Some(message) = stream.message().await? {
                if message.tokens.is_empty() {
                    continue;
                }
                let now = Instant::now();
                match last {
                    Some(at) => gaps.push(now.duration_since(at).as_secs_f64() * 1e3),
                    None => ttft = Some(now.duration_since(started).as_secs_f64() * 1e3),
                }
                last = Some(now);
                ids.extend(message.tokens.iter().map(|t| t.id));
            }
            Ok::<_, tonic::Status>((gaps, ttft, ids))
        }
    });
    let mut round = Round::default();
    for (i, result) in join_all(runs).await.into_iter().enumerate() {
        let (gaps, ttft, ids) = result.with_context(|| format!("normal request {i}"))?;
        round.itl_ms.extend(gaps);
        round.ttft_ms.extend(ttft);
        round.tokens.push(ids);
    }
    Ok(round)
}

async fn worker_stats(worker: &Channel) -> anyhow::Result<EngineStats> {
    WorkerClient::new(worker.clone())
        .info(InfoRequest {})
        .await
        .context("the worker's Info")?
        .into_inner()
        .stats
        .context("no stats in the worker's Info")
}

/// Waits up to 60 s until the worker runs and holds nothing.
async fn wait_idle(worker: &Channel) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = worker_stats(worker).await?;
        if s.running_sequences + s.waiting_sequences + s.held_sequences == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the worker still has work after 60 s: {s:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One round beside stuck streams: (the normal requests' round, sequences the worker held, tokens
/// it generated for the stuck streams).
async fn beside_stuck(
    router_addr: &str,
    router: &Channel,
    worker: &Channel,
    args: &StuckArgs,
    round: usize,
) -> anyhow::Result<(Round, u32, u64)> {
    // Their own connection, 1 KiB per stream, never read.
    let stuck_channel = Endpoint::from_shared(format!("http://{router_addr}"))?
        .initial_stream_window_size(1024)
        .connect()
        .await
        .context("connecting the stuck client")?;
    let generated_before = worker_stats(worker).await?.generated_tokens;
    let mut stuck = Vec::new();
    for i in 0..args.stuck {
        let request = greedy(
            prompt("Story", round * args.stuck + i, 20),
            args.stuck_tokens,
        );
        let mut client = TextGenerationClient::new(stuck_channel.clone());
        stuck.push(client.generate(request).await?.into_inner());
    }
    let settle = Instant::now();
    let held = loop {
        let held = worker_stats(worker).await?.held_sequences;
        if held as usize >= args.stuck || settle.elapsed() >= Duration::from_millis(args.settle_ms)
        {
            break held;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let normal = run_normal(router, args).await?;
    let stuck_generated = worker_stats(worker).await?.generated_tokens
        - generated_before
        - normal.tokens.iter().map(|t| t.len() as u64).sum::<u64>();
    drop(stuck);
    drop(stuck_channel);
    wait_idle(worker).await?;
    Ok((normal, held, stuck_generated))
}

fn summary(name: &str, itl: &[f64], ttft: &[f64]) -> Distribution {
    let itl = Distribution::from_samples(itl);
    let ttft = Distribution::from_samples(ttft);
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    println!(
        "{name:<14} ITL p50 {} ms, p90 {} ms ({} gaps); TTFT p50 {} ms",
        ms(itl.p50),
        ms(itl.p90),
        itl.count,
        ms(ttft.p50)
    );
    itl
}

/// Runs `bench stuck-clients` with `args`; returns whether the target held.
pub async fn run(args: &StuckArgs) -> anyhow::Result<bool> {
    std::fs::create_dir_all(&args.log_dir)
        .with_context(|| format!("creating {}", args.log_dir.display()))?;
    let worker_addr = format!("127.0.0.1:{}", free_port()?);
    let worker_args: Vec<String> = [
        "--model",
        &args.model.display().to_string(),
        "--listen",
        &worker_addr,
        "--threads",
        &args.threads.to_string(),
        "--max-num-seqs",
        &(args.normal + args.stuck).max(64).to_string(),
    ]
    .map(String::from)
    .to_vec();
    let mut worker = spawn(
        "worker",
        &worker_args,
        "worker ready",
        &args.log_dir.join("worker.log"),
    )
    .await?;
    let router_addr = format!("127.0.0.1:{}", free_port()?);
    let router_args: Vec<String> = [
        "--listen",
        &router_addr,
        "--workers",
        &worker_addr,
        // No stuck stream is cancelled while it is measured.
        "--slow-client-timeout-ms",
        "3600000",
    ]
    .map(String::from)
    .to_vec();
    let mut router = spawn(
        "router",
        &router_args,
        "router ready",
        &args.log_dir.join("router.log"),
    )
    .await?;
    let result = measure(args, &router_addr, &worker_addr).await;
    router.kill().await.ok();
    worker.kill().await.ok();
    result
}

async fn measure(args: &StuckArgs, router_addr: &str, worker_addr: &str) -> anyhow::Result<bool> {
    let router = Endpoint::from_shared(format!("http://{router_addr}"))?
        .connect()
        .await
        .context("connecting to the router")?;
    let worker = Endpoint::from_shared(format!("http://{worker_addr}"))?
        .connect()
        .await
        .context("connecting to the worker")?;
    wait_ready_workers(router_addr, 1, Duration::from_secs(60)).await?;
    // Warm-up (first-touch of the weights, allocator), not measured.
    run_normal(&router, args).await?;
    let (mut alone, mut beside) = (Round::default(), Round::default());
    let mut same_tokens = true;
    let (mut held, mut stuck_generated) = (Vec::new(), 0);
    for round in 0..args.rounds {
        eprintln!(
            "bench stuck-clients: round {} of {}",
            round + 1,
            args.rounds
        );
        let a = run_normal(&router, args).await?;
        let (b, h, g) = beside_stuck(router_addr, &router, &worker, args, round).await?;
        same_tokens &= a.tokens == b.tokens;
        held.push(h);
        stuck_generated += g;
        alone.itl_ms.extend(a.itl_ms);
        alone.ttft_ms.extend(a.ttft_ms);
        beside.itl_ms.extend(b.itl_ms);
        beside.ttft_ms.extend(b.ttft_ms);
    }
    println!(
        "bench stuck-clients: {} normal requests of {} tokens, alone and beside {} stuck streams \
         ({} rounds each)",
        args.normal, args.tokens, args.stuck, args.rounds
    );
    let a = summary("alone", &alone.itl_ms, &alone.ttft_ms);
    let b = summary("beside stuck", &beside.itl_ms, &beside.ttft_ms);
    println!(
        "stuck streams: held by the worker {held:?} of {} per round; {:.0} tokens generated \
         for each (of {} asked)",
        args.stuck,
        stuck_generated as f64 / (args.stuck * args.rounds) as f64,
        args.stuck_tokens
    );
    let ratio = match (a.p50, b.p50) {
        (Some(a), Some(b)) if a > 0.0 => b / a,
        _ => bail!("no ITL samples (--tokens must be at least 2)"),
    };
    let met = ratio <= args.max_ratio && same_tokens;
    println!(
        "ITL p50 ratio {ratio:.2} (target <= {}); normal tokens {} alone and beside: {}",
        args.max_ratio,
        if same_tokens { "equal" } else { "DIFFER" },
        if met { "PASS" } else { "FAIL" }
    );
    Ok(met)
}
