//! The `bench` load tool (`tools/src/bin/bench.rs`): drives the public `Generate` stream of a
//! router with synthetic prompts of exact token counts and reports throughput, latency percentiles
//! and errors, as text and as JSON.
//!
//! With `--worker HOST:PORT` it drives one worker's bidirectional `Generate` stream directly
//! instead ([`direct`]), with the same prompts, lengths, seeds and sampling, so that the same load
//! through a router and straight to its worker shows the latency the router adds.
//!
//! - [`BenchArgs`]: the command line;
//! - [`target`]: connecting to the router, worker or OpenAI server (with `--api-key`);
//! - [`prompt`]: prompts fitted to an exact token count with the router's `Tokenize`;
//! - [`plan`]: each request's prompt, lengths, seed and whether it is constrained;
//! - [`constraint`]: `--constraint` / `--constrained-fraction` (structured-output load) and the
//!   check of constrained outputs;
//! - [`direct`]: `--worker` mode (one `Generate` stream, prompts tokenized locally);
//! - [`openai`]: `--openai URL` mode (any OpenAI-compatible HTTP server);
//! - [`run`]: the load generator (closed loop at a fixed concurrency, or Poisson arrivals);
//! - [`request`]: one request, sent and followed to its end;
//! - [`mask_time`]: `--worker-metrics`, the worker's mask time per token from its histogram;
//! - [`report`]: per-request records, the summary and the JSON layout;
//! - [`tenant_mix`]: `--tenant-mix`, several tenants' keys, rates and priorities at once, and each
//!   tenant's figures;
//! - [`stats`]: percentiles; [`rng`]: the seeded random stream.

pub mod constraint;
pub mod direct;
pub mod mask_time;
pub mod openai;
pub mod plan;
pub mod prompt;
pub mod report;
pub mod request;
pub mod rng;
pub mod run;
pub mod stats;
pub mod target;
pub mod tenant_mix;

use clap::{ArgAction, Parser};
use serde::Serialize;

use constraint::ConstraintSpec;
use tenant_mix::TenantMix;

/// `bench` command line. Every length is in tokens, every rate per second of wall time.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(
    name = "bench",
    version = build_info::VERSION,
    about = "Load-tests a router's (or, with --worker, one worker's) Generate stream and reports \
             throughput and latency percentiles",
    after_help = "Exit status: 0 when every measured request succeeded, 1 when any failed (the \
                  summary is still printed and written), 2 when the run could not start or the \
                  JSON could not be written."
)]
pub struct BenchArgs {
    /// Router address (HOST:PORT); the only address the tool talks to (unless `--worker`).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub router: String,
    /// Drive this worker (HOST:PORT) directly instead of a router: one bidirectional `Generate`
    /// stream carrying every request, prompts tokenized locally with the worker's own tokenizer
    /// (from its `Info`), same prompts, lengths, seeds and sampling as through a router. TTFT is
    /// timed from sending the request's Add to its first token. The JSON config says
    /// `"mode": "worker"`. Conflicts with `--router`.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "router")]
    pub worker: Option<String>,
    /// Drive an OpenAI-compatible HTTP server at this URL instead (this router's `http_listen`,
    /// vLLM, llama.cpp's llama-server), e.g. `http://127.0.0.1:8000`: streamed
    /// `/v1/completions`, prompts fitted with its `POST /tokenize`; same prompts, lengths, seeds
    /// and sampling. The JSON config says `"mode": "openai"`. Conflicts with `--router` and
    /// `--worker`.
    #[arg(long, value_name = "URL", conflicts_with_all = ["router", "worker"])]
    pub openai: Option<String>,
    /// With `--openai`: the `model` to send (default: the first one `/v1/models` lists).
    #[arg(long, value_name = "NAME", requires = "openai")]
    pub openai_model: Option<String>,
    /// Send this API key with every call: `authorization: Bearer KEY` gRPC metadata to a router,
    /// the `Authorization` header with `--openai`. Never written to the JSON (which says
    /// `api_key_sent`). Conflicts with `--worker` (workers take no keys).
    #[arg(long, value_name = "KEY", conflicts_with = "worker")]
    #[serde(skip)]
    pub api_key: Option<String>,
    /// CA certificate file (PEM) of a router that serves TLS: connect over TLS trusting only it.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["worker", "openai"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<String>,
    /// With `--tls-ca`: the name the router's certificate must carry (default: the host of
    /// `--router`).
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
    /// Structured-output load: the constraint some requests carry. `json-object`,
    /// `json-schema:PATH` (a JSON Schema file), `regex:RE` (the whole output matches RE) or
    /// `choice:A,B,...`. gRPC `GenerateRequest.constraint`; with `--openai`, `response_format` or
    /// `guided_regex` / `guided_choice`. Constrained requests are sent without `ignore_eos` (the
    /// router refuses the combination) and may end before `max_new_tokens` when the constraint
    /// is complete; the report counts their valid outputs and summarizes them apart.
    #[arg(long, value_name = "SPEC", value_parser = ConstraintSpec::parse)]
    pub constraint: Option<ConstraintSpec>,
    /// The fraction (0 to 1) of requests that carry `--constraint`, picked by request index
    /// (exactly floor(n F) of the first n, spread evenly: 0.5 constrains every second request).
    /// Default with `--constraint`: 1 (all).
    #[arg(long, value_name = "F", requires = "constraint")]
    pub constrained_fraction: Option<f64>,
    /// The worker's Prometheus metrics page (`HOST:PORT` for `http://HOST:PORT/metrics`, or a
    /// full `http://` URL): scraped before and after the measured phase to report the mask time
    /// per token of constrained requests (`worker_constraint_mask_seconds`: count, mean, and the
    /// p50 / p99 estimated from the bucket deltas by linear interpolation).
    #[arg(long, value_name = "URL")]
    pub worker_metrics: Option<String>,
    /// Measured requests (exactly this many are sent).
    #[arg(long, default_value_t = 64)]
    pub requests: usize,
    /// Most requests in flight at once. Default: 16 without `--request-rate`, unlimited with it.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Open loop: send requests at this mean rate (requests/s, Poisson arrivals, i.e. exponential
    /// gaps); `--concurrency` then caps the requests in flight. Without it: closed loop, each of
    /// `--concurrency` slots sends its next request when the previous one ends.
    #[arg(long)]
    pub request_rate: Option<f64>,
    /// Several tenants at once: `NAME:KEY:RATE[:PRIORITY]`, comma separated, e.g.
    /// `batch:sk-batch:20:-1,search:sk-search:2` (RATE in requests/s: open loop, Poisson arrivals
    /// per tenant; PRIORITY the `priority` its requests ask for). Each request carries its
    /// tenant's key; the report adds each tenant's requests, refusals, TTFT p50 / p99 and
    /// generated tokens/s. Refusals (`RESOURCE_EXHAUSTED`) are then outcomes, not failures.
    /// Router only; conflicts with `--request-rate` and `--api-key`.
    #[arg(long, value_name = "SPEC", conflicts_with_all = ["worker", "openai", "request_rate", "api_key"])]
    pub tenant_mix: Option<TenantMix>,
    /// Prompt length in tokens (exact, BOS included when the model adds one).
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// When given, each prompt length is drawn uniformly from [--prompt-tokens, this].
    #[arg(long)]
    pub prompt_tokens_max: Option<usize>,
    /// The first K prompt tokens are the same in every request (0: prompts differ from the start).
    #[arg(long, default_value_t = 0)]
    pub shared_prefix_tokens: usize,
    /// Tokens to generate per request (`max_new_tokens`).
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: u32,
    /// When given, each request's `max_new_tokens` is drawn uniformly from [--max-new-tokens, this].
    #[arg(long)]
    pub max_new_tokens_max: Option<u32>,
    /// Keep generating past end-of-sequence tokens, so that every request generates exactly its
    /// `max_new_tokens` (`--ignore-eos false` to stop at EOS).
    #[arg(long, default_value_t = true, action = ArgAction::Set, value_name = "BOOL")]
    pub ignore_eos: bool,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1] (unset: disabled).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Top-k sampling (0 = disabled).
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    /// Seed of the prompts, the drawn lengths, the arrival times and each request's sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Requests run first (same settings, closed loop) and not counted.
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
    /// Per-request limit in seconds (sent -> end of stream); a request past it fails with
    /// DEADLINE_EXCEEDED.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
    /// Wait up to this many seconds for the router to report a ready worker (with `--worker`: for
    /// the worker's `Health` to say ready) before starting.
    #[arg(long, default_value_t = 30)]
    pub wait_ready_secs: u64,
    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<std::path::PathBuf>,
    /// Free text stored in the JSON (and printed), e.g. what this run measures.
    #[arg(long, default_value = "")]
    pub label: String,
}

impl BenchArgs {
    /// The cap on requests in flight: `--concurrency`, or 16 in closed loop and `--requests`
    /// (unlimited) in open loop.
    pub fn effective_concurrency(&self) -> usize {
        match (self.concurrency, self.open_loop()) {
            (Some(c), _) => c,
            (None, false) => 16,
            (None, true) => self.requests.max(1),
        }
    }

    /// Whether requests arrive on a schedule (`--request-rate` or `--tenant-mix`).
    pub fn open_loop(&self) -> bool {
        self.request_rate.is_some() || self.tenant_mix.is_some()
    }

    /// The fraction of requests that carry the constraint: `--constrained-fraction`, 1 with
    /// `--constraint` alone, 0 without.
    pub fn effective_constrained_fraction(&self) -> f64 {
        match (&self.constraint, self.constrained_fraction) {
            (None, _) => 0.0,
            (Some(_), fraction) => fraction.unwrap_or(1.0),
        }
    }

    /// The largest prompt length that can be drawn.
    pub fn prompt_tokens_upper(&self) -> usize {
        self.prompt_tokens_max.unwrap_or(self.prompt_tokens)
    }

    /// The largest `max_new_tokens` that can be drawn.
    pub fn max_new_tokens_upper(&self) -> u32 {
        self.max_new_tokens_max.unwrap_or(self.max_new_tokens)
    }

    /// Checks the settings that do not need the router.
    ///
    /// Errors: a message naming the offending flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        use anyhow::ensure;
        ensure!(self.requests >= 1, "--requests must be at least 1");
        ensure!(
            self.effective_concurrency() >= 1,
            "--concurrency must be at least 1"
        );
        if let Some(rate) = self.request_rate {
            ensure!(
                rate.is_finite() && rate > 0.0,
                "--request-rate must be a positive number of requests/s, got {rate}"
            );
        }
        ensure!(
            self.prompt_tokens >= 1,
            "--prompt-tokens must be at least 1"
        );
        ensure!(
            self.prompt_tokens_upper() >= self.prompt_tokens,
            "--prompt-tokens-max ({}) is below --prompt-tokens ({})",
            self.prompt_tokens_upper(),
            self.prompt_tokens
        );
        ensure!(
            self.shared_prefix_tokens < self.prompt_tokens,
            "--shared-prefix-tokens ({}) must be below --prompt-tokens ({})",
            self.shared_prefix_tokens,
            self.prompt_tokens
        );
        ensure!(
            self.max_new_tokens >= 1,
            "--max-new-tokens must be at least 1"
        );
        ensure!(
            self.max_new_tokens_upper() >= self.max_new_tokens,
            "--max-new-tokens-max ({}) is below --max-new-tokens ({})",
            self.max_new_tokens_upper(),
            self.max_new_tokens
        );
        ensure!(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "--temperature must be >= 0"
        );
        if let Some(p) = self.top_p {
            ensure!(p > 0.0 && p <= 1.0, "--top-p must be in (0, 1], got {p}");
        }
        ensure!(self.timeout_secs >= 1, "--timeout-secs must be at least 1");
        if let Some(f) = self.constrained_fraction {
            ensure!(
                (0.0..=1.0).contains(&f),
                "--constrained-fraction must be in [0, 1], got {f}"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> BenchArgs {
        BenchArgs::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn defaults() {
        let a = parse(&[]);
        assert_eq!(a.router, "127.0.0.1:50051");
        assert_eq!(a.worker, None);
        assert_eq!(
            (a.requests, a.prompt_tokens, a.max_new_tokens),
            (64, 128, 128)
        );
        assert_eq!(a.effective_concurrency(), 16);
        assert!(a.ignore_eos);
        assert_eq!(a.timeout_secs, 600);
        a.validate().unwrap();
    }

    #[test]
    fn rate_mode_is_uncapped_unless_asked() {
        let a = parse(&["--request-rate", "2.5", "--requests", "10"]);
        assert_eq!(a.effective_concurrency(), 10);
        let a = parse(&["--request-rate", "2.5", "--concurrency", "3"]);
        assert_eq!(a.effective_concurrency(), 3);
    }

    #[test]
    fn worker_mode_excludes_router() {
        let a = parse(&["--worker", "127.0.0.1:7000"]);
        assert_eq!(a.worker.as_deref(), Some("127.0.0.1:7000"));
        a.validate().unwrap();
        let both = [
            "bench",
            "--worker",
            "127.0.0.1:7000",
            "--router",
            "127.0.0.1:7001",
        ];
        assert!(BenchArgs::try_parse_from(both).is_err());
    }

    #[test]
    fn openai_mode_excludes_router_and_worker() {
        let a = parse(&["--openai", "http://127.0.0.1:8000", "--openai-model", "m"]);
        assert_eq!(a.openai.as_deref(), Some("http://127.0.0.1:8000"));
        assert_eq!(a.openai_model.as_deref(), Some("m"));
        for other in [["--router", "127.0.0.1:1"], ["--worker", "127.0.0.1:1"]] {
            let args = ["bench", "--openai", "http://x", other[0], other[1]];
            assert!(BenchArgs::try_parse_from(args).is_err(), "{other:?}");
        }
        assert!(BenchArgs::try_parse_from(["bench", "--openai-model", "m"]).is_err());
    }

    #[test]
    fn constraint_flags() {
        let a = parse(&["--constraint", "choice:a,b"]);
        assert_eq!(a.effective_constrained_fraction(), 1.0);
        let a = parse(&[
            "--constraint",
            "json-object",
            "--constrained-fraction",
            "0.5",
        ]);
        assert_eq!(a.effective_constrained_fraction(), 0.5);
        a.validate().unwrap();
        assert_eq!(parse(&[]).effective_constrained_fraction(), 0.0);
        let no_spec = ["bench", "--constrained-fraction", "0.5"];
        assert!(BenchArgs::try_parse_from(no_spec).is_err());
        let bad = ["bench", "--constraint", "xml"];
        assert!(BenchArgs::try_parse_from(bad).is_err());
        let a = parse(&[
            "--constraint",
            "json-object",
            "--constrained-fraction",
            "1.5",
        ]);
        assert!(a.validate().is_err());
    }

    #[test]
    fn the_api_key_is_not_serialized() {
        let a = parse(&["--api-key", "secret-key-1"]);
        assert_eq!(a.api_key.as_deref(), Some("secret-key-1"));
        let json = serde_json::to_string(&a).unwrap();
        assert!(!json.contains("secret-key-1"), "{json}");
        let with_worker = ["bench", "--api-key", "k", "--worker", "127.0.0.1:1"];
        assert!(BenchArgs::try_parse_from(with_worker).is_err());
    }

    #[test]
    fn ignore_eos_takes_a_value() {
        assert!(!parse(&["--ignore-eos", "false"]).ignore_eos);
        assert!(parse(&["--ignore-eos", "true"]).ignore_eos);
    }

    #[test]
    fn bad_settings_are_rejected() {
        for args in [
            &["--requests", "0"][..],
            &["--concurrency", "0"],
            &["--request-rate", "0"],
            &["--prompt-tokens", "0"],
            &["--prompt-tokens", "10", "--prompt-tokens-max", "5"],
            &["--prompt-tokens", "10", "--shared-prefix-tokens", "10"],
            &["--max-new-tokens", "0"],
            &["--max-new-tokens", "4", "--max-new-tokens-max", "3"],
            &["--top-p", "0"],
            &["--temperature=-1"],
        ] {
            assert!(parse(args).validate().is_err(), "{args:?}");
        }
    }
}
