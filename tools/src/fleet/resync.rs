//! `bench resync`: how long a restarted `kv_aware` router takes, end to end over loopback, until its
//! index of every worker equals the worker's prefix cache (issue 25's target: under 1 s for 100k
//! blocks per worker).
//!
//! 1. Starts W workers with 1-token KV blocks (`block_size = 1` in a settings file, so that a
//!    block is a token and 100k blocks are 100k cached prompt tokens: a tiny model fills that in
//!    seconds, where 100k blocks of 16 tokens would be 1.6M tokens) and a `round_robin` router.
//! 2. Fills every worker's prefix cache to at least `--blocks` blocks with distinct prompts (one
//!    output token each) and reads each worker's hashes (`KvCacheBlocks`).
//! 3. `--repeats` times: starts a fresh `kv_aware` router over the workers and polls its metrics
//!    (`router_worker_kv_index_blocks` and `router_worker_kv_index_fingerprint`, the low 52 bits
//!    of the XOR of the index's hashes) until every worker's entry equals the worker's cache.
//!    Reports the time from the router's start to its ready line, and to the complete index.
//!
//! The time to complete includes the router's own start (tokenizer, connecting to the workers, one
//! `Info` per worker), the worker listing its cache, the snapshot on the wire (8 bytes per block)
//! and the router building the index, plus up to one poll interval (5 ms).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use futures::future::try_join_all;
use inference_proto::public::text_generation_client::TextGenerationClient;
use inference_proto::public::GenerateRequest;
use inference_proto::worker::worker_client::WorkerClient;
use inference_proto::worker::KvCacheBlocksRequest;
use routing::index::{fingerprint_of, metric_fingerprint};
use routing::Routing;

use super::real::{free_port, spawn, Fleet, FleetSpec};
use super::workload::WORDS;
use crate::bench::rng::SplitMix64;
use crate::soak::procs::{metric, scrape};

/// Longest the fill or one resync may take.
const LIMIT: Duration = Duration::from_secs(600);

/// `bench resync`: a restarted router's resync time at a given cache size.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench resync")]
pub struct ResyncArgs {
    /// Workers (W).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// KV blocks each worker's prefix cache holds before the router starts (1 token each).
    #[arg(long, default_value_t = 100_000)]
    pub blocks: usize,
    /// The model (default: the tiny random-weight llama, written to a temporary folder with an
    /// 8,192-token context).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Words per fill prompt (the tiny model's tokenizer makes about 2 tokens of a word).
    #[arg(long, default_value_t = 1_500)]
    pub prompt_words: usize,
    /// Router restarts measured.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Where the processes' logs go.
    #[arg(long, default_value = "target/resync-logs")]
    pub log_dir: PathBuf,
}

/// A worker's cache as the router's metrics show it: (blocks, fingerprint).
fn expected(cache: &[u64]) -> (u64, u64) {
    let fingerprint = metric_fingerprint(fingerprint_of(cache));
    (cache.len() as u64, fingerprint)
}

async fn worker_cache(addr: &str) -> anyhow::Result<Vec<u64>> {
    let mut client = WorkerClient::connect(format!("http://{addr}"))
        .await
        .with_context(|| format!("connecting to worker {addr}"))?
        .max_decoding_message_size(256 << 20);
    Ok(client
        .kv_cache_blocks(KvCacheBlocksRequest {})
        .await
        .context("KvCacheBlocks")?
        .into_inner()
        .block_hashes)
}

/// Sends distinct prompts through `router` (round robin over the workers) until every worker's
/// cache holds at least `blocks` blocks; returns each worker's hashes.
async fn fill(fleet: &Fleet, blocks: usize, prompt_words: usize) -> anyhow::Result<Vec<Vec<u64>>> {
    let client = TextGenerationClient::connect(format!("http://{}", fleet.routers[0]))
        .await
        .context("connecting to the fill router")?;
    let mut rng = SplitMix64::new(25);
    let started = Instant::now();
    for round in 0u64.. {
        let caches = try_join_all(fleet.workers.iter().map(|w| worker_cache(w))).await?;
        let least = caches.iter().map(Vec::len).min().unwrap_or(0);
        eprint!(
            "\rbench resync: filling, {least} of {blocks} blocks on the emptiest worker ({:.0} s)",
            started.elapsed().as_secs_f64()
        );
        if least >= blocks {
            eprintln!();
            return Ok(caches);
        }
        if started.elapsed() > LIMIT {
            bail!("the workers hold only {least} of {blocks} blocks after {LIMIT:?}");
        }
        // One prompt per worker per round (round robin), all at once; a round number first so
        // that no two prompts share a block.
        let sends = (0..fleet.workers.len()).map(|k| {
            let mut client = client.clone();
            let mut prompt = format!("{round} {k}");
            for _ in 0..prompt_words {
                prompt.push(' ');
                prompt.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
            }
            async move {
                let mut stream = client
                    .generate(GenerateRequest {
                        prompt,
                        max_new_tokens: Some(1),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                while stream.message().await?.is_some() {}
                Ok::<(), tonic::Status>(())
            }
        });
        try_join_all(sends).await.context("a fill request failed")?;
    }
    unreachable!("the loop returns")
}

/// One router restart: (ready after, index complete after), both from its start.
async fn resync_once(
    args: &ResyncArgs,
    workers: &[String],
    want: &[(u64, u64)],
    n: usize,
) -> anyhow::Result<(Duration, Duration)> {
    let metrics = format!("127.0.0.1:{}", free_port()?);
    let router_args: Vec<String> = [
        "--listen",
        &format!("127.0.0.1:{}", free_port()?),
        "--workers",
        &workers.join(","),
        "--routing",
        "kv_aware",
        "--metrics-listen",
        &metrics,
    ]
    .map(String::from)
    .to_vec();
    let http = reqwest::Client::new();
    let started = Instant::now();
    let log = args.log_dir.join(format!("router-kv_aware-{n}.log"));
    let mut router = spawn("router", &router_args, "router ready", &log).await?;
    let ready = started.elapsed();
    let synced = loop {
        if let Some(page) = scrape(&http, &metrics).await {
            let all = workers.iter().zip(want).all(|(w, &(blocks, fingerprint))| {
                let label = Some(("worker", w.as_str()));
                metric(&page, "router_worker_kv_index_blocks", label) == Some(blocks as f64)
                    && metric(&page, "router_worker_kv_index_fingerprint", label)
                        == Some(fingerprint as f64)
            });
            if all {
                break started.elapsed();
            }
        }
        if started.elapsed() > LIMIT {
            bail!("the router's index differs from the workers' caches after {LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    router.kill().await.ok();
    Ok((ready, synced))
}

/// Runs `bench resync` with `args`, printing the report on stdout.
pub async fn run(args: &ResyncArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.log_dir)
        .with_context(|| format!("creating {}", args.log_dir.display()))?;
    let dir = tempfile::tempdir().context("a temporary folder")?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => {
            let path = dir.path().join("tiny.gguf");
            gguf::testing::write_tiny_llama_with_context(&path, 25, 8_192)
                .context("writing the tiny model")?;
            path
        }
    };
    let settings = dir.path().join("worker.toml");
    std::fs::write(&settings, "block_size = 1\nmax_batch_tokens = 4096\n")
        .context("writing the worker settings")?;
    let spec = FleetSpec {
        model: model.clone(),
        workers: args.workers,
        routers: 1,
        threads: 1,
        // Room for the fill's overshoot (one prompt past the target) without evicting.
        kv_blocks: args.blocks + 4 * args.prompt_words + 8_192,
        worker_args: vec!["--config".into(), settings.display().to_string()],
        router_args: Vec::new(),
        log_dir: args.log_dir.clone(),
    };
    let fleet = Fleet::start(&spec, Routing::RoundRobin).await?;
    let caches = fill(&fleet, args.blocks, args.prompt_words).await?;
    let want: Vec<(u64, u64)> = caches.iter().map(|c| expected(c)).collect();
    println!(
        "bench resync: {} workers ({}), {} cached blocks of 1 token each ({} KB of snapshot per worker)",
        args.workers,
        model.display(),
        caches
            .iter()
            .map(|c| c.len().to_string())
            .collect::<Vec<_>>()
            .join(" / "),
        caches.iter().map(Vec::len).max().unwrap_or(0) * 8 / 1000
    );
    for n in 0..args.repeats {
        let (ready, synced) = resync_once(args, &fleet.workers, &want, n).await?;
        println!(
            "restart {}: router ready after {:.0} ms; every worker's index complete after {:.0} ms ({:.0} ms after ready)",
            n + 1,
            ready.as_secs_f64() * 1e3,
            synced.as_secs_f64() * 1e3,
            synced.saturating_sub(ready).as_secs_f64() * 1e3
        );
    }
    fleet.stop().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expected_fingerprint_is_the_low_52_bits_of_the_xor() {
        assert_eq!(expected(&[]), (0, 0));
        assert_eq!(expected(&[0b1010, 0b0110]), (2, 0b1100));
        assert_eq!(expected(&[u64::MAX]), (1, (1 << 52) - 1));
    }
}
