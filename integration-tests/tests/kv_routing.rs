//! KV-cache-aware routing (`routing = kv_aware`) with real router and worker processes: each
//! router's index of each worker equals the worker's prefix cache after random traffic with
//! evictions; a conversation's turns land on the worker that holds it while unrelated requests
//! spread; a restarted worker is routed to as empty; a restarted router resyncs from the snapshots
//! and routes the conversation back; a router frozen under load (SIGSTOP) holds up no worker and
//! catches up when it thaws; one frozen past the worker's `router_backlog_kib` loses its stream,
//! not its tokens.
//!
//! The worker's side is its `KvCacheBlocks` RPC (every hash its prefix cache holds); the router's is
//! its metrics `router_worker_kv_index_blocks` and `router_worker_kv_index_fingerprint` (the low 52
//! bits of the XOR of the hashes in its index).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use inference_proto::worker::worker_client::WorkerClient;
use inference_proto::worker::KvCacheBlocksRequest;
use integration_tests::ops::{scrape_text, signal};
use integration_tests::{
    connect_ready, free_port, generate, greedy, start_router, tiny_model_with_context,
    worker_stats, Process, PublicClient,
};
use rand::{Rng, SeedableRng};
use routing::index::{fingerprint_of, metric_fingerprint};

/// Starts a worker on `addr` with a KV cache of `kv_blocks` blocks of 16 tokens.
async fn start_worker_at(model: &std::path::Path, addr: &str, kv_blocks: &str) -> Process {
    let model = model.to_str().unwrap();
    let args = [
        "--model",
        model,
        "--listen",
        addr,
        "--kv-cache-blocks",
        kv_blocks,
    ];
    Process::start("worker", &args, "worker ready", Duration::from_secs(120))
        .await
        .expect("worker starts")
}

/// Starts a `kv_aware` router over `workers` with its metrics on a free port: (process, gRPC
/// address, metrics address).
async fn start_kv_router(workers: &[String]) -> (Process, String, String) {
    let metrics = format!("127.0.0.1:{}", free_port());
    let refs: Vec<&str> = workers.iter().map(String::as_str).collect();
    let (process, addr) = start_router(
        &refs,
        &["--routing", "kv_aware", "--metrics-listen", &metrics],
    )
    .await;
    (process, addr, metrics)
}

/// The worker's prefix cache: its block hashes, ascending.
async fn worker_cache(addr: &str) -> Vec<u64> {
    let mut client = WorkerClient::connect(format!("http://{addr}"))
        .await
        .expect("connecting to the worker")
        .max_decoding_message_size(64 << 20);
    client
        .kv_cache_blocks(KvCacheBlocksRequest {})
        .await
        .expect("KvCacheBlocks")
        .into_inner()
        .block_hashes
}

/// (blocks, fingerprint, fresh) of one worker's index in a router's metrics.
fn router_index(metrics: &str, worker: &str) -> (u64, u64, bool) {
    let value = |name: &str| -> u64 {
        let prefix = format!("router_{name}{{worker=\"{worker}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in the router's metrics"))
            .trim()
            .parse::<f64>()
            .expect("a number") as u64
    };
    (
        value("worker_kv_index_blocks"),
        value("worker_kv_index_fingerprint"),
        value("worker_kv_index_fresh") == 1,
    )
}

/// What the router's metrics show of a worker whose cache is `cache`.
fn expected_index(cache: &[u64]) -> (u64, u64, bool) {
    let fingerprint = metric_fingerprint(fingerprint_of(cache));
    (cache.len() as u64, fingerprint, true)
}

/// Waits until every router's index of every worker equals the worker's cache; returns how long it
/// took. Panics after `timeout` with the difference.
async fn wait_indexes_equal(routers: &[&str], workers: &[String], timeout: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let mut differences = Vec::new();
        for w in workers {
            let want = expected_index(&worker_cache(w).await);
            for r in routers {
                let got = router_index(&scrape_text(r).await, w);
                if got != want {
                    differences.push(format!("router {r}, worker {w}: {got:?} != {want:?}"));
                }
            }
        }
        if differences.is_empty() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "indexes differ after {timeout:?}:\n{}",
            differences.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The sum of a router's `router_kv_event_anomalies_total` series.
fn anomalies(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("router_kv_event_anomalies_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

/// Random lower-case words from `rng`, about `chars` characters.
fn words(rng: &mut impl Rng, chars: usize) -> String {
    let mut s = String::new();
    while s.len() < chars {
        let n = rng.random_range(2..8);
        for _ in 0..n {
            s.push(rng.random_range(b'a'..=b'z') as char);
        }
        s.push(' ');
    }
    s
}

async fn start_workers(
    model: &std::path::Path,
    n: usize,
    kv_blocks: &str,
) -> (Vec<Process>, Vec<String>) {
    let addrs: Vec<String> = (0..n)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let mut procs = Vec::new();
    for a in &addrs {
        procs.push(start_worker_at(model, a, kv_blocks).await);
    }
    (procs, addrs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_routers_index_equals_every_workers_cache_after_random_traffic() {
    let (_dir, model) = tiny_model_with_context(3, 1024);
    // 40 blocks of 16 tokens: the random traffic below evicts.
    let (_workers, worker_addrs) = start_workers(&model, 3, "40").await;
    let (_r1, r1, m1) = start_kv_router(&worker_addrs).await;
    let (_r2, r2, m2) = start_kv_router(&worker_addrs).await;
    let clients = [
        connect_ready(&r1, Duration::from_secs(30)).await,
        connect_ready(&r2, Duration::from_secs(30)).await,
    ];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(25);
    // Shared system prompts (prefix hits) and conversations that grow, plus unrelated prompts.
    let systems: Vec<String> = (0..3).map(|_| words(&mut rng, 120)).collect();
    for round in 0..4 {
        let mut calls = Vec::new();
        for i in 0..12 {
            let prompt = match rng.random_range(0..3) {
                0 => format!("{}{}", systems[rng.random_range(0..3)], words(&mut rng, 40)),
                1 => {
                    let chars = rng.random_range(20..200);
                    format!("{round} {i} {}", words(&mut rng, chars))
                }
                _ => format!("{}{}", systems[0], words(&mut rng, 200)),
            };
            let mut client: PublicClient = clients[i % 2].clone();
            let max_new = rng.random_range(1..12);
            calls.push(async move { generate(&mut client, greedy(&prompt, max_new)).await });
        }
        for result in join_all(calls).await {
            result.expect("generation succeeds");
        }
    }
    let took = wait_indexes_equal(&[&m1, &m2], &worker_addrs, Duration::from_secs(10)).await;
    eprintln!("indexes equal {took:?} after the traffic ended");
    // The traffic went through more KV than the caches hold: they evicted.
    for w in &worker_addrs {
        let s = worker_stats(w).await;
        assert!(
            s.prompt_tokens > s.kv_tokens_capacity,
            "worker {w} saw too little traffic to evict: {s:?}"
        );
        assert!(s.prefix_cache_blocks <= s.kv_blocks_total);
    }
    for m in [&m1, &m2] {
        assert_eq!(anomalies(&scrape_text(m).await), 0, "no event anomalies");
    }
}

/// Prefix-cache hit tokens of each worker, by address.
async fn hits(workers: &[String]) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for w in workers {
        out.insert(w.clone(), worker_stats(w).await.prefix_cache_hit_tokens);
    }
    out
}

/// Requests finished by each worker, by address.
async fn finished(workers: &[String]) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for w in workers {
        out.insert(w.clone(), worker_stats(w).await.finished_requests);
    }
    out
}

/// A conversation: each turn's prompt is the whole conversation so far plus a new question.
struct Conversation {
    text: String,
    rng: rand_chacha::ChaCha8Rng,
}

impl Conversation {
    /// Runs the next turn through `client`; returns its prompt tokens.
    async fn turn(&mut self, client: &mut PublicClient) -> u32 {
        let question = words(&mut self.rng, 60);
        self.text.push_str(&question);
        let reply = generate(client, greedy(&self.text, 16))
            .await
            .expect("the turn succeeds");
        self.text.push_str(&reply.text);
        reply.usage.expect("usage").prompt_tokens
    }
}

/// Runs `n` unrelated requests (short prompts, each starting with its own number) through
/// `clients` in turn, all at once.
async fn unrelated(clients: &[PublicClient], n: usize, rng: &mut impl Rng, seed: u64) {
    let calls: Vec<_> = (0..n)
        .map(|i| {
            let prompt = format!("{seed} {i} {}", words(rng, 30));
            let mut c = clients[i % clients.len()].clone();
            async move { generate(&mut c, greedy(&prompt, 4)).await }
        })
        .collect();
    for r in join_all(calls).await {
        r.expect("an unrelated request succeeds");
    }
}

/// Runs one turn of `conversation` through `client` while a flood of unrelated requests goes
/// through `flood_clients`; returns (the worker that served the turn from its cache, its hit
/// tokens in the turn, the turn's prompt tokens, each worker's finished flood requests).
async fn turn_under_flood(
    conversation: &mut Conversation,
    client: &mut PublicClient,
    flood_clients: &[PublicClient],
    workers: &[String],
    flood_seed: u64,
) -> (Option<String>, u64, u32, HashMap<String, u64>) {
    let before_hits = hits(workers).await;
    let before_done = finished(workers).await;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(flood_seed);
    let (prompt_tokens, ()) = tokio::join!(
        conversation.turn(client),
        unrelated(flood_clients, 24, &mut rng, flood_seed)
    );
    let after_hits = hits(workers).await;
    let after_done = finished(workers).await;
    let gained: Vec<(String, u64)> = workers
        .iter()
        .map(|w| (w.clone(), after_hits[w] - before_hits[w]))
        .collect();
    let (holder, most) = gained.iter().max_by_key(|(_, g)| *g).cloned().unwrap();
    let done = workers
        .iter()
        .map(|w| (w.clone(), after_done[w] - before_done[w]))
        .collect();
    ((most > 0).then_some(holder), most, prompt_tokens, done)
}

/// KV blocks of the conversation test's workers: room for the conversation and the flood.
const CONVERSATION_KV_BLOCKS: &str = "600";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conversations_stick_to_their_worker_through_restarts() {
    let (_dir, model) = tiny_model_with_context(5, 2048);
    let (mut workers, worker_addrs) = start_workers(&model, 3, CONVERSATION_KV_BLOCKS).await;
    let (_r1, r1, m1) = start_kv_router(&worker_addrs).await;
    let (mut r2_process, r2, _m2) = start_kv_router(&worker_addrs).await;
    let mut c1 = connect_ready(&r1, Duration::from_secs(30)).await;
    let mut c2 = connect_ready(&r2, Duration::from_secs(30)).await;
    let mut conversation = Conversation {
        text: words(&mut rand_chacha::ChaCha8Rng::seed_from_u64(1), 150),
        rng: rand_chacha::ChaCha8Rng::seed_from_u64(2),
    };
    let flood = [c1.clone(), c2.clone()];
    // Unrelated requests alone spread evenly (misses go to the least loaded worker; equal choices
    // spread by rendezvous order).
    let before = finished(&worker_addrs).await;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(50);
    for round in 0..3 {
        unrelated(&flood, 24, &mut rng, 50 + round).await;
    }
    let after = finished(&worker_addrs).await;
    let shares: Vec<u64> = worker_addrs.iter().map(|w| after[w] - before[w]).collect();
    eprintln!("unrelated requests per worker: {shares:?}");
    assert_eq!(shares.iter().sum::<u64>(), 72);
    assert!(
        shares.iter().all(|&n| (12..=36).contains(&n)),
        "72 unrelated requests spread unevenly: {shares:?}"
    );
    // Turn 1 (no cache anywhere), then turns through alternating routers under a flood.
    conversation.turn(&mut c1).await;
    let mut holder: Option<String> = None;
    let mut flood_done: HashMap<String, u64> = HashMap::new();
    for turn in 0..4u64 {
        let client = if turn % 2 == 0 { &mut c2 } else { &mut c1 };
        let (served, hit, prompt_tokens, done) =
            turn_under_flood(&mut conversation, client, &flood, &worker_addrs, 100 + turn).await;
        eprintln!(
            "turn {turn}: served by {served:?}, {hit} of {prompt_tokens} prompt tokens cached"
        );
        let served = served.expect("the turn hit a cache");
        // Nearly the whole previous conversation came from the cache (at most two blocks of it
        // recomputed, a partial last block and the last token).
        assert!(
            hit * 10 >= u64::from(prompt_tokens) * 6,
            "turn {turn}: {hit} of {prompt_tokens} prompt tokens from the cache"
        );
        if let Some(h) = &holder {
            assert_eq!(
                &served, h,
                "turn {turn} left the worker that holds the conversation"
            );
        }
        holder = Some(served);
        for (w, n) in done {
            *flood_done.entry(w).or_default() += n;
        }
    }
    // The unrelated requests still reach every worker, the conversation's holder too (less: its
    // long turns count in its load in tokens).
    eprintln!("requests finished per worker during the turns: {flood_done:?}");
    let total: u64 = flood_done.values().sum();
    for (w, n) in &flood_done {
        assert!(
            *n * 10 >= total,
            "worker {w} took {n} of {total} requests: {flood_done:?}"
        );
    }
    let holder = holder.unwrap();

    // The holder is killed and restarted (same address): routed to as empty at once.
    let at = worker_addrs.iter().position(|w| *w == holder).unwrap();
    workers[at].kill().await;
    workers[at] = start_worker_at(&model, &holder, CONVERSATION_KV_BLOCKS).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while router_index(&scrape_text(&m1).await, &holder) != (0, 0, true) {
        assert!(
            Instant::now() < deadline,
            "the restarted worker never resynced as empty"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = hits(&worker_addrs).await;
    conversation.turn(&mut c1).await;
    let after = hits(&worker_addrs).await;
    let gained: u64 = worker_addrs.iter().map(|w| after[w] - before[w]).sum();
    assert!(
        gained < 64,
        "no worker holds the conversation any more, yet {gained} tokens hit"
    );
    // The turn went somewhere and is cached there now: find its new holder.
    wait_indexes_equal(&[&m1], &worker_addrs, Duration::from_secs(10)).await;
    let (new_holder, _, _, _) =
        turn_under_flood(&mut conversation, &mut c1, &flood, &worker_addrs, 300).await;
    let new_holder = new_holder.expect("the conversation is cached again");

    // Router 2 restarts under load (a flood through router 1 runs meanwhile): it resyncs from the
    // snapshots and routes the conversation back to its worker.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(400);
    let background: Vec<_> = (0..24)
        .map(|i| {
            let prompt = format!("bg {i} {}", words(&mut rng, 30));
            let mut c = c1.clone();
            async move { generate(&mut c, greedy(&prompt, 8)).await }
        })
        .collect();
    let background = tokio::spawn(join_all(background));
    r2_process.kill().await;
    let (_r2b, r2b, m2b) = start_kv_router(&worker_addrs).await;
    let mut c2b = connect_ready(&r2b, Duration::from_secs(30)).await;
    let started = Instant::now();
    loop {
        let metrics = scrape_text(&m2b).await;
        if worker_addrs.iter().all(|w| router_index(&metrics, w).2) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no snapshots:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "restarted router had every snapshot {:?} after its first ready worker",
        started.elapsed()
    );
    for r in background.await.unwrap() {
        r.expect("background request succeeds");
    }
    wait_indexes_equal(&[&m2b], &worker_addrs, Duration::from_secs(10)).await;
    let flood_b = [c2b.clone()];
    let (served, hit, prompt_tokens, _) =
        turn_under_flood(&mut conversation, &mut c2b, &flood_b, &worker_addrs, 500).await;
    assert_eq!(
        served.as_deref(),
        Some(new_holder.as_str()),
        "back to its worker"
    );
    assert!(
        hit * 10 >= u64::from(prompt_tokens) * 6,
        "{hit} of {prompt_tokens}"
    );
}

/// A router frozen while another serves (SIGSTOP: a stopped process, a long pause, a partition)
/// reads none of its streams. The workers must go on serving the other router at its usual speed
/// (a stream nobody reads never blocks the engine), and the thawed router must serve at once (no
/// false `UNAVAILABLE` from its own pause) and catch up: its index equals every worker's cache
/// again, from the ordered stream or a new snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_router_holds_up_no_worker_and_catches_up_when_it_thaws() {
    let (_dir, model) = tiny_model_with_context(7, 1024);
    let (_workers, worker_addrs) = start_workers(&model, 2, "200").await;
    let (frozen, r1, m1) = start_kv_router(&worker_addrs).await;
    let (_r2, r2, m2) = start_kv_router(&worker_addrs).await;
    let mut c1 = connect_ready(&r1, Duration::from_secs(30)).await;
    let mut c2 = connect_ready(&r2, Duration::from_secs(30)).await;
    let both = [c1.clone(), c2.clone()];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(70);
    unrelated(&both, 16, &mut rng, 70).await;
    wait_indexes_equal(&[&m1, &m2], &worker_addrs, Duration::from_secs(10)).await;
    // The other router's flood with everyone awake, for its usual time.
    let only_r2 = [c2.clone()];
    let started = Instant::now();
    unrelated(&only_r2, 32, &mut rng, 71).await;
    let awake = started.elapsed();

    // Floods for longer than the frozen router's heartbeat timeout (2 s), so that its streams
    // fall far behind and, on thawing, the silence it measured is its own.
    signal(&frozen, "STOP");
    let started = Instant::now();
    let (mut floods, mut slowest) = (0u64, Duration::ZERO);
    while started.elapsed() < Duration::from_secs(4) {
        let flood = Instant::now();
        unrelated(&only_r2, 32, &mut rng, 72 + floods).await;
        slowest = slowest.max(flood.elapsed());
        floods += 1;
    }
    eprintln!("a flood of 32 took {awake:?} awake; {floods} with a router frozen, the slowest {slowest:?}");
    assert!(
        slowest < awake * 3 + Duration::from_secs(2),
        "a frozen router held up the workers: a flood took {slowest:?} against {awake:?}"
    );
    signal(&frozen, "CONT");

    let prompt = "after the thaw the router serves at once";
    let thawed = generate(&mut c1, greedy(prompt, 8))
        .await
        .expect("the thawed router serves its first request");
    let awake = generate(&mut c2, greedy(prompt, 8))
        .await
        .expect("the other router serves the same request");
    assert_eq!(thawed.token_ids, awake.token_ids, "the same greedy tokens");
    let caught_up = wait_indexes_equal(&[&m1, &m2], &worker_addrs, Duration::from_secs(15)).await;
    eprintln!("the thawed router's indexes equal the caches {caught_up:?} after its first reply");
    assert_eq!(anomalies(&scrape_text(&m1).await), 0, "no event anomalies");
}

/// A router frozen so long that it leaves more than the worker's `router_backlog_kib` unread: the
/// worker closes that router's stream (the memory a stopped router can make it hold is bounded) and
/// goes on serving the other router. Thawed, the router fails its request over with the tokens it
/// has (the same greedy tokens as an undisturbed run) and resyncs from a new snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_router_frozen_past_the_backlog_limit_loses_its_stream_not_its_tokens() {
    let (_dir, model) = tiny_model_with_context(8, 1024);
    let addr = format!("127.0.0.1:{}", free_port());
    let args = [
        "--model",
        model.to_str().unwrap(),
        "--listen",
        &addr,
        "--kv-cache-blocks",
        "200",
        "--router-backlog-kib",
        "64",
    ];
    let worker = Process::start("worker", &args, "worker ready", Duration::from_secs(120))
        .await
        .expect("worker starts");
    let workers = vec![addr.clone()];
    let (frozen, r1, m1) = start_kv_router(&workers).await;
    let (_r2, r2, _m2) = start_kv_router(&workers).await;
    let c1 = connect_ready(&r1, Duration::from_secs(30)).await;
    let mut c2 = connect_ready(&r2, Duration::from_secs(30)).await;
    let prompt = "a long answer through the router that is about to freeze";
    let undisturbed = generate(&mut c2, greedy(prompt, 600))
        .await
        .expect("the undisturbed run");

    let mut c = c1.clone();
    let pending = tokio::spawn(async move { generate(&mut c, greedy(prompt, 600)).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    signal(&frozen, "STOP");
    let started = Instant::now();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(90);
    let mut floods = 0u64;
    while !worker.log_text().contains("more than router_backlog_kib") {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the frozen router's backlog never passed 64 KiB"
        );
        unrelated(&[c2.clone()], 32, &mut rng, 90 + floods).await;
        floods += 1;
    }
    eprintln!(
        "the worker closed the frozen router's stream after {floods} floods of 32 ({:?})",
        started.elapsed()
    );
    // The other router is served as before.
    unrelated(&[c2.clone()], 32, &mut rng, 89).await;
    signal(&frozen, "CONT");
    // New requests that reach the thawed router while it reconnects (its only worker closed the
    // stream) wait for the worker instead of getting `UNAVAILABLE` (`reconnect_grace_ms`).
    let fresh: Vec<_> = (0..8)
        .map(|i| {
            let mut c = c1.clone();
            tokio::spawn(
                async move { generate(&mut c, greedy(&format!("new request {i}"), 4)).await },
            )
        })
        .collect();
    for (i, request) in fresh.into_iter().enumerate() {
        let answer = request.await.unwrap();
        assert!(
            answer.is_ok(),
            "new request {i} after the thaw: {:?}",
            answer.err()
        );
    }

    let resumed = pending
        .await
        .unwrap()
        .expect("the frozen router's request completes after the thaw");
    assert_eq!(
        resumed.token_ids, undisturbed.token_ids,
        "no token lost or changed"
    );
    wait_indexes_equal(&[&m1], &workers, Duration::from_secs(15)).await;
}
