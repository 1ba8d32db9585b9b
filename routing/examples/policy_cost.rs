//! Micro-benchmark of the `kv_aware` policy's cost per request: the prompt's block chain (hashed
//! once per request) and the index lookups plus the choice over every worker, each index behind an
//! `RwLock` as in the router. Not a test: run it in release mode and read the figures.
//!
//! ```text
//! cargo run --release -p routing --example policy_cost -- [WORKERS] [BLOCKS_PER_WORKER] [PROMPT_TOKENS]
//! ```
//!
//! Defaults: 4 workers, 100,000 blocks each, 1,024-token prompts, 16-token blocks. Each worker's
//! index holds random blocks plus the chains of the prompt families it serves (every family is
//! held by one worker), so lookups walk real prefixes; each request is a family's prompt with a
//! fresh tail. The requests run twice: alone, then while another thread applies a stream's events
//! to every index (one step's net change, 16 stores and 16 evicts, per write lock), as the
//! router's stream tasks do; it also reports how long that thread held a write lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use routing::index::BlockIndex;
use routing::kv_aware::{KvAwarePolicy, KvCandidate, PromptChain};

const BLOCK_SIZE: usize = 16;
const FAMILIES: usize = 64;
const REQUESTS: usize = 2_000;

fn arg(n: usize, default: usize) -> usize {
    std::env::args()
        .nth(n)
        .map(|a| a.parse().expect("a number"))
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn main() {
    let workers = arg(1, 4);
    let blocks = arg(2, 100_000);
    let prompt_tokens = arg(3, 1_024);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let families: Vec<Vec<u32>> = (0..FAMILIES)
        .map(|_| {
            (0..prompt_tokens)
                .map(|_| rng.random_range(0..50_000))
                .collect()
        })
        .collect();
    let started = Instant::now();
    let addresses: Vec<String> = (0..workers)
        .map(|i| format!("10.0.{}.{}:50061", i / 256, i % 256))
        .collect();
    let mut snapshot_apply = std::time::Duration::ZERO;
    let indexes: Vec<RwLock<BlockIndex>> = (0..workers)
        .map(|w| {
            let mut hashes: Vec<u64> = Vec::with_capacity(blocks);
            for (f, family) in families.iter().enumerate() {
                if f % workers == w {
                    hashes.extend(PromptChain::new(family, BLOCK_SIZE).hashes);
                }
            }
            while hashes.len() < blocks {
                hashes.push(rng.random());
            }
            hashes.truncate(blocks);
            // Room for the blocks the event thread stores (it evicts them again).
            let t0 = Instant::now();
            let index = BlockIndex::from_snapshot(blocks + 1_000, &hashes).0;
            snapshot_apply += t0.elapsed();
            RwLock::new(index)
        })
        .collect();
    // What a restarted router does per worker with the snapshot that opens each stream.
    println!(
        "snapshot apply (the index built from a worker's {blocks}-hash snapshot): {:.1} ms per worker",
        snapshot_apply.as_secs_f64() * 1e3 / workers as f64
    );
    println!(
        "{workers} workers x {blocks} blocks built in {:.1} s; prompts of {prompt_tokens} tokens, blocks of {BLOCK_SIZE}",
        started.elapsed().as_secs_f64()
    );
    let policy = KvAwarePolicy::default();
    let loads: Vec<u64> = (0..workers).map(|_| rng.random_range(0..20_000)).collect();
    let run = |rng: &mut rand_chacha::ChaCha8Rng| {
        let mut chain_times = Vec::with_capacity(REQUESTS);
        let mut choice_times = Vec::with_capacity(REQUESTS);
        let mut hits = 0usize;
        for r in 0..REQUESTS {
            let mut prompt = families[r % FAMILIES].clone();
            let keep = prompt.len() * 3 / 4;
            for t in &mut prompt[keep..] {
                *t = rng.random_range(0..50_000);
            }
            let t0 = Instant::now();
            let chain = PromptChain::new(&prompt, BLOCK_SIZE);
            let t1 = Instant::now();
            let candidates: Vec<KvCandidate<'_>> = addresses
                .iter()
                .zip(&indexes)
                .zip(&loads)
                .map(|((address, index), &load)| KvCandidate {
                    address,
                    has_room: true,
                    cached_blocks: index.read().unwrap().prefix_blocks(&chain.hashes),
                    load_tokens: load,
                    sequences: (load / 128) as usize,
                })
                .collect();
            let chosen = policy.pick(&chain, 128, &candidates).expect("a worker");
            let t2 = Instant::now();
            hits += usize::from(candidates[chosen].cached_blocks > 0);
            chain_times.push(t1 - t0);
            choice_times.push(t2 - t1);
        }
        (chain_times, choice_times, hits)
    };
    let (chain_times, choice_times, hits) = run(&mut rng);
    report("alone", chain_times, choice_times, hits);
    let stop = AtomicBool::new(false);
    let (chain_times, choice_times, hits, holds) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
            // Per worker, the random blocks this thread stored (evicted again later).
            let mut mine: Vec<Vec<u64>> = vec![Vec::new(); workers];
            let mut holds = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for (w, index) in indexes.iter().enumerate() {
                    let stored: Vec<u64> = (0..16).map(|_| rng.random()).collect();
                    let evicted: Vec<u64> = if mine[w].len() >= 64 {
                        mine[w].drain(..16).collect()
                    } else {
                        Vec::new()
                    };
                    let t = Instant::now();
                    index.write().unwrap().apply(&stored, &evicted);
                    holds.push(t.elapsed());
                    mine[w].extend(stored);
                }
            }
            holds
        });
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let (a, b, c) = run(&mut rng);
        stop.store(true, Ordering::Relaxed);
        (a, b, c, writer.join().unwrap())
    });
    report("while events are applied", chain_times, choice_times, hits);
    let mut holds = holds;
    holds.sort_unstable();
    println!(
        "write lock held per step's events: mean {:.2} us, p99 {:.2} us, max {:.2} us ({} applications)",
        holds.iter().sum::<Duration>().as_secs_f64() * 1e6 / holds.len() as f64,
        percentile(&holds, 0.99),
        holds.last().unwrap().as_secs_f64() * 1e6,
        holds.len()
    );
}

fn report(
    label: &str,
    mut chain_times: Vec<Duration>,
    mut choice_times: Vec<Duration>,
    hits: usize,
) {
    chain_times.sort_unstable();
    choice_times.sort_unstable();
    let mean = |v: &[Duration]| v.iter().sum::<Duration>().as_secs_f64() * 1e6 / v.len() as f64;
    println!("{label}:");
    println!(
        "  chain hashing per request: mean {:.1} us, p50 {:.1} us, p99 {:.1} us",
        mean(&chain_times),
        percentile(&chain_times, 0.5),
        percentile(&chain_times, 0.99)
    );
    println!(
        "  index lookup + choice per request: mean {:.1} us, p50 {:.1} us, p99 {:.1} us ({hits} of {REQUESTS} routed to a hit)",
        mean(&choice_times),
        percentile(&choice_times, 0.5),
        percentile(&choice_times, 0.99)
    );
}
