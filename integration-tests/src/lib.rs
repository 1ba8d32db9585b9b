//! Harness for the end-to-end tests: starts real `worker` and `router` processes on free 127.0.0.1
//! ports and hands out gRPC clients.
//!
//! The binaries are the ones `cargo build --release --bins` put next to the test executable (the
//! README's test command builds them first). Each process's output goes to
//! `target/<profile>/it-logs/<name>-<port>.log`.

pub mod openai;
pub mod ops;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use inference_proto::public::text_generation_client::TextGenerationClient;
use inference_proto::public::ModelInfoRequest;
use inference_proto::worker::worker_client::WorkerClient;
use inference_proto::worker::{EngineStats, InfoRequest};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tonic::transport::Channel;

/// Client of the public API.
pub type PublicClient = TextGenerationClient<Channel>;

/// The folder holding the built binaries (`target/<profile>`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// Path of a workspace binary; panics with the command to run when it is missing.
pub fn bin_path(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --release --bins` first (scripts/test does)",
        path.display()
    );
    path
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough for tests).
///
/// The port is below Linux's ephemeral range (32768-60999 by default), so no outgoing connection
/// takes it as its source port between this call and the server's bind. (An ephemeral port could be:
/// a router that keeps dialling a worker not started yet on `127.0.0.1:P` can even connect to itself
/// from source port `P`, and the worker then fails with "Address already in use".) Ports are handed
/// out in turn from a per-process start, each checked free by binding it.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    // Start each test process at its own place in the range.
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % COUNT,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..COUNT {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % COUNT) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 127.0.0.1:{FIRST}..{}", FIRST + COUNT)
}

/// The real default model; panics with the fix when it has not been fetched.
pub fn real_model() -> PathBuf {
    let path = gguf::testing::default_model_path();
    assert!(
        path.is_file(),
        "the default model is missing at {}: run scripts/fetch-model",
        path.display()
    );
    path
}

/// The fetched Gemma 3 270M model; panics with the fix when it has not been fetched (the test
/// fails, it is not skipped).
pub fn gemma3_model() -> PathBuf {
    let path = gguf::testing::gemma3_model_path();
    assert!(
        path.is_file(),
        "{} not found: run scripts/fetch-model gemma3-270m",
        path.display()
    );
    path
}

/// A tiny random-weight llama model written to a temporary folder (kept alive by the returned guard).
pub fn tiny_model(seed: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tiny.gguf");
    gguf::testing::write_tiny_llama(&path, seed).expect("writing the tiny model");
    (dir, path)
}

/// Writes the tiny random-weight model with a `context`-token context (long prompts, to keep a
/// worker busy prefilling) into a new temporary folder; the folder must outlive the model's use.
pub fn tiny_model_with_context(seed: u64, context: usize) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(format!("tiny-{context}.gguf"));
    gguf::testing::write_tiny_llama_with_context(&path, seed, context)
        .expect("writing the tiny model");
    (dir, path)
}

/// The reference fixture (copied from the shared correctness reference).
pub fn reference() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixtures/reference.json"))
        .expect("valid reference json")
}

/// A running child process, killed when dropped.
pub struct Process {
    child: Child,
    /// Its log file (stdout and stderr).
    pub log: PathBuf,
}

impl Process {
    /// Starts `bin args...` and waits until it prints a line containing `ready_marker`.
    ///
    /// Errors: the process exits first (the error holds its log) or `timeout` passes.
    pub async fn start(
        bin: &str,
        args: &[&str],
        ready_marker: &str,
        timeout: Duration,
    ) -> anyhow::Result<Process> {
        Self::start_with_env(bin, args, &[], ready_marker, timeout).await
    }

    /// Like [`Process::start`], with extra environment variables (e.g. `ROUTER_*` settings).
    ///
    /// A worker runs with `WORKER_NUMERICS=exact` unless `env` sets it or `args` pass
    /// `--numerics`: the correctness references the tests compare with are the `exact` numerics
    /// (the worker's default on the CPU is `fast`); tests of `fast` pass `--numerics fast`.
    pub async fn start_with_env(
        bin: &str,
        args: &[&str],
        env: &[(&str, &str)],
        ready_marker: &str,
        timeout: Duration,
    ) -> anyhow::Result<Process> {
        let log_dir = bin_dir().join("it-logs");
        std::fs::create_dir_all(&log_dir)?;
        let log = log_dir.join(format!("{bin}-{}.log", free_port()));
        let mut command = Command::new(bin_path(bin));
        if bin == "worker" {
            command.env("WORKER_NUMERICS", "exact");
        }
        let mut child = command
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {bin}"))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let deadline = Instant::now() + timeout;
        loop {
            let line = tokio::time::timeout_at(deadline.into(), lines.next_line()).await;
            match line {
                Ok(Ok(Some(line))) if line.contains(ready_marker) => break,
                Ok(Ok(Some(_))) => continue,
                Ok(_) => {
                    let status = child.wait().await?;
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    bail!("{bin} exited ({status}) before it was ready; its log:\n{text}");
                }
                Err(_) => bail!("{bin} not ready after {timeout:?}"),
            }
        }
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Process { child, log })
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// The process id (`None` once it has been waited for).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends SIGTERM (graceful shutdown) without waiting.
    pub fn terminate(&self) {
        let pid = self.pid().expect("the process is still running");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -TERM {pid} failed");
    }

    /// Waits for the process to exit; `None` when it is still running after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .ok()
            .map(|status| status.expect("waiting for the process"))
    }

    /// The process's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Runs `bin args...` to completion; returns (exit success, stdout + stderr).
pub async fn run_to_exit(bin: &str, args: &[&str], timeout: Duration) -> (bool, String) {
    let output = tokio::time::timeout(
        timeout,
        Command::new(bin_path(bin))
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{bin} did not exit within {timeout:?}"))
    .expect("running the binary");
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

/// Starts a worker serving `model` on a free port.
pub async fn start_worker(model: &Path) -> (Process, String) {
    start_worker_with(model, &[]).await
}

/// Starts a worker serving `model` on a free port with extra command-line flags.
pub async fn start_worker_with(model: &Path, extra_args: &[&str]) -> (Process, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let model = model.to_str().expect("utf-8 model path");
    let mut args = vec!["--model", model, "--listen", addr.as_str()];
    args.extend_from_slice(extra_args);
    let process = Process::start("worker", &args, "worker ready", Duration::from_secs(120))
        .await
        .expect("worker starts");
    (process, addr)
}

/// Starts a router over `workers` on a free port (does not wait for the workers).
pub async fn start_router(workers: &[&str], extra_args: &[&str]) -> (Process, String) {
    start_router_with_env(workers, extra_args, &[]).await
}

/// Like [`start_router`], with extra environment variables (`ROUTER_*` settings, e.g.
/// `("ROUTER_MAX_WAITING_REQUESTS", "4")`). With no `workers`, pass `--discovery-dns` in
/// `extra_args`.
pub async fn start_router_with_env(
    workers: &[&str],
    extra_args: &[&str],
    env: &[(&str, &str)],
) -> (Process, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let joined = workers.join(",");
    let mut args = vec!["--listen", addr.as_str()];
    if !workers.is_empty() {
        args.extend_from_slice(&["--workers", joined.as_str()]);
    }
    args.extend_from_slice(extra_args);
    let process = Process::start_with_env(
        "router",
        &args,
        env,
        "router ready",
        Duration::from_secs(30),
    )
    .await
    .expect("router starts");
    (process, addr)
}

/// The engine counters of the worker at `addr`.
pub async fn worker_stats(addr: &str) -> EngineStats {
    let mut client = WorkerClient::connect(format!("http://{addr}"))
        .await
        .expect("connecting to the worker")
        .max_decoding_message_size(64 << 20);
    client
        .info(InfoRequest {})
        .await
        .expect("worker Info")
        .into_inner()
        .stats
        .expect("stats in Info")
}

/// Waits until the worker at `addr` runs and holds nothing (no running or waiting sequence, every
/// KV block free: cancelled requests freed theirs); returns its counters then. Panics after
/// `timeout` with the last counters.
pub async fn wait_idle(addr: &str, timeout: Duration) -> EngineStats {
    let deadline = Instant::now() + timeout;
    loop {
        let s = worker_stats(addr).await;
        if s.running_sequences + s.waiting_sequences + s.held_sequences == 0
            && s.kv_blocks_used == 0
        {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "the worker still holds work after {timeout:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `message` as a gRPC request carrying `authorization: Bearer key`.
pub fn authorized<T>(message: T, key: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value = format!("Bearer {key}").parse().expect("an ASCII key");
    request.metadata_mut().insert("authorization", value);
    request
}

/// Connects to the router and waits until it reports a ready worker.
pub async fn connect_ready(router: &str, timeout: Duration) -> PublicClient {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(mut client) = TextGenerationClient::connect(format!("http://{router}")).await {
            if let Ok(info) = client.model_info(ModelInfoRequest::default()).await {
                if info.get_ref().ready_workers > 0 {
                    return client;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "router {router} had no ready worker after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A worker and a router in front of it.
pub struct Cluster {
    /// The worker process.
    pub worker: Process,
    /// The worker's address.
    pub worker_addr: String,
    /// The router process.
    pub router: Process,
    /// The router's address.
    pub router_addr: String,
    /// The worker's and the router's `/metrics` addresses ([`Cluster::start_with_metrics`]).
    pub metrics: Option<(String, String)>,
}

impl Cluster {
    /// Starts a worker on `model` and a router over it, and waits until the router is ready.
    pub async fn start(model: &Path) -> Cluster {
        Self::start_with(model, &[]).await
    }

    /// Like [`Cluster::start`], with extra worker command-line flags.
    pub async fn start_with(model: &Path, worker_args: &[&str]) -> Cluster {
        let (worker, worker_addr) = start_worker_with(model, worker_args).await;
        let (router, router_addr) = start_router(&[&worker_addr], &[]).await;
        connect_ready(&router_addr, Duration::from_secs(30)).await;
        Cluster {
            worker,
            worker_addr,
            router,
            router_addr,
            metrics: None,
        }
    }

    /// Like [`Cluster::start`], with both `/metrics` endpoints on free ports (in `metrics`).
    pub async fn start_with_metrics(model: &Path) -> Cluster {
        let worker_metrics = format!("127.0.0.1:{}", free_port());
        let router_metrics = format!("127.0.0.1:{}", free_port());
        let (worker, worker_addr) =
            start_worker_with(model, &["--metrics-listen", &worker_metrics]).await;
        let (router, router_addr) =
            start_router(&[&worker_addr], &["--metrics-listen", &router_metrics]).await;
        connect_ready(&router_addr, Duration::from_secs(30)).await;
        Cluster {
            worker,
            worker_addr,
            router,
            router_addr,
            metrics: Some((worker_metrics, router_metrics)),
        }
    }

    /// A client of the router's public API.
    pub async fn client(&self) -> PublicClient {
        connect_ready(&self.router_addr, Duration::from_secs(10)).await
    }

    /// The worker's engine counters.
    pub async fn worker_stats(&self) -> EngineStats {
        worker_stats(&self.worker_addr).await
    }
}

/// A whole generation, gathered from the stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// All text deltas joined.
    pub text: String,
    /// Every token id, in order.
    pub token_ids: Vec<u32>,
    /// The last message's finish reason.
    pub finish_reason: inference_proto::public::FinishReason,
    /// The matched stop string, if any.
    pub stop_sequence: String,
    /// The last message's usage.
    pub usage: Option<inference_proto::public::Usage>,
    /// How many messages the stream carried.
    pub messages: usize,
    /// The last message's tool calls (a request with `tools`).
    pub tool_calls: Vec<inference_proto::public::ToolCall>,
}

/// Runs `request` to the end of its stream.
pub async fn generate(
    client: &mut PublicClient,
    request: inference_proto::public::GenerateRequest,
) -> Result<Generation, tonic::Status> {
    let mut stream = client.generate(request).await?.into_inner();
    let mut g = Generation::default();
    while let Some(m) = stream.message().await? {
        g.absorb(&m);
    }
    Ok(g)
}

/// The token ids of a reference fixture's JSON array.
pub fn reference_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Checks one reference prompt (`name`, `text`, `prompt_ids`, `greedy_ids`, optional
/// `greedy_text`) through the router: Tokenize gives the prompt ids, and a greedy generation of
/// `greedy_ids.len()` tokens gives exactly those ids, its usage counts and, when the fixture has
/// it, the text (special tokens included, as the reference decodes them).
pub async fn check_reference_prompt(client: &mut PublicClient, prompt: &serde_json::Value) {
    use inference_proto::public::{FinishReason, TokenizeRequest};
    let name = prompt["name"].as_str().unwrap();
    let text = prompt["text"].as_str().unwrap();
    let expected_prompt = reference_ids(&prompt["prompt_ids"]);
    let expected = reference_ids(&prompt["greedy_ids"]);
    let tokenized = client
        .tokenize(TokenizeRequest {
            text: text.into(),
            add_special_tokens: true,
        })
        .await
        .expect("Tokenize")
        .into_inner();
    assert_eq!(tokenized.ids, expected_prompt, "{name}: prompt ids");
    let mut request = greedy(text, expected.len() as u32);
    request.include_special_tokens = true;
    let g = generate(client, request).await.expect("Generate");
    assert_eq!(g.token_ids, expected, "{name}: greedy ids");
    assert_eq!(g.finish_reason, FinishReason::MaxNewTokens, "{name}");
    let usage = g.usage.expect("usage");
    assert_eq!(
        usage.prompt_tokens as usize,
        expected_prompt.len(),
        "{name}"
    );
    assert_eq!(usage.generated_tokens as usize, expected.len(), "{name}");
    if let Some(want) = prompt["greedy_text"].as_str() {
        assert_eq!(g.text, want, "{name}: text");
    }
}

/// Runs `requests` concurrently (one task each, so they share the worker's batches); one result per
/// request, in order.
pub async fn generate_concurrently(
    client: &PublicClient,
    requests: impl IntoIterator<Item = inference_proto::public::GenerateRequest>,
) -> Vec<Result<Generation, tonic::Status>> {
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|r| {
            let mut c = client.clone();
            tokio::spawn(async move { generate(&mut c, r).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("generation task"));
    }
    out
}

impl Default for Generation {
    fn default() -> Self {
        Generation {
            text: String::new(),
            token_ids: Vec::new(),
            finish_reason: inference_proto::public::FinishReason::Unspecified,
            stop_sequence: String::new(),
            usage: None,
            messages: 0,
            tool_calls: Vec::new(),
        }
    }
}

impl Generation {
    /// Adds one stream message: its text and tokens, and the finish (reason, stop string, usage)
    /// when it carries the usage.
    pub fn absorb(&mut self, m: &inference_proto::public::GenerateResponse) {
        self.messages += 1;
        self.text.push_str(&m.text);
        self.token_ids.extend(m.tokens.iter().map(|t| t.id));
        if m.usage.is_some() {
            self.finish_reason = m.finish_reason();
            self.stop_sequence = m.stop_sequence.clone();
            self.usage = m.usage;
            self.tool_calls = m.tool_calls.clone();
        }
    }
}

/// One streamed generation and how it went ([`stream_all`]).
#[derive(Debug)]
pub struct Streamed {
    /// The generation.
    pub generation: Generation,
    /// `usage.failovers` of the last message (times the request moved to another worker).
    pub failovers: u32,
    /// Longest wait between two messages of the stream.
    pub max_gap: Duration,
}

/// Runs `requests` concurrently through `client`, each to the end of its stream; `received` counts
/// the tokens received over all streams as they arrive (to act while they run). One result per
/// request, in order.
pub async fn stream_all(
    client: &PublicClient,
    requests: &[inference_proto::public::GenerateRequest],
    received: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> Vec<Result<Streamed, tonic::Status>> {
    let tasks = requests.iter().cloned().map(|request| {
        let (mut c, received) = (client.clone(), received.clone());
        tokio::spawn(async move {
            let mut stream = c.generate(request).await?.into_inner();
            let mut generation = Generation::default();
            let mut max_gap = Duration::ZERO;
            let mut last: Option<Instant> = None;
            while let Some(m) = stream.message().await? {
                let now = Instant::now();
                if let Some(last) = last {
                    max_gap = max_gap.max(now - last);
                }
                last = Some(now);
                received.fetch_add(m.tokens.len(), std::sync::atomic::Ordering::SeqCst);
                generation.absorb(&m);
            }
            let failovers = generation.usage.map_or(0, |u| u.failovers);
            Ok(Streamed {
                generation,
                failovers,
                max_gap,
            })
        })
    });
    futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.expect("stream task"))
        .collect()
}

/// A greedy request for `prompt` with `max_new_tokens`, ignoring EOS.
pub fn greedy(prompt: &str, max_new_tokens: u32) -> inference_proto::public::GenerateRequest {
    inference_proto::public::GenerateRequest {
        prompt: prompt.to_string(),
        max_new_tokens: Some(max_new_tokens),
        ignore_eos: true,
        ..Default::default()
    }
}

/// A chat request asking `question` at temperature 1 with `seed`, constrained by `kind` (EOS not
/// ignored: a complete structured output ends there).
pub fn constrained(
    question: &str,
    kind: inference_proto::public::constraint::Kind,
    max_new_tokens: u32,
    seed: u64,
) -> inference_proto::public::GenerateRequest {
    use inference_proto::public::{ChatMessage, Constraint, GenerateRequest};
    GenerateRequest {
        messages: vec![ChatMessage {
            role: "user".into(),
            content: question.into(),
            ..Default::default()
        }],
        max_new_tokens: Some(max_new_tokens),
        temperature: 1.0,
        seed: Some(seed),
        constraint: Some(Constraint { kind: Some(kind) }),
        ..Default::default()
    }
}

/// A small bounded JSON schema (an animal from an enum and its legs, 0 to 8) that even the tiny
/// random-weight model completes within a few dozen tokens.
pub fn animal_schema() -> serde_json::Value {
    serde_json::json!({"type": "object", "properties": {
        "animal": {"enum": ["cat", "dog", "owl"]},
        "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
        "required": ["animal", "legs"], "additionalProperties": false})
}
