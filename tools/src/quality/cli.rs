//! The `bench quality` command line: `bench quality [--model PATH] [--text PATH] [--baseline exact]
//! [--candidate fast] [--window 512] [--threads N] [--json PATH]`, or with `--prompts FILE` the
//! greedy agreement on a reference file's prompts instead of the text ([`super::prompts`]), or
//! with `--api URL --candidate-api URL` the text's perplexity and top-1 agreement of two servers
//! through their HTTP APIs instead of the CPU backend in-process ([`super::api`]).
//!
//! Prints the report's table on stdout and each window's progress on stderr; `--json PATH` also
//! writes the report as JSON.

use std::path::PathBuf;

use anyhow::Context;
use backend_cpu::{CpuModel, IntPath, Numerics, SimdPath};
use clap::builder::TypedValueParser;
use clap::Parser;

use super::api::{evaluate_api, ApiRun};
use super::evaluate::{evaluate, Progress, QualityRun};
use super::prompts::{greedy_agreement, read_reference, render};
use super::report::cpu_model_name;
use super::text::WindowLayout;
use super::QualityError;

/// `bench quality`: perplexity, KL divergence and top-1 agreement of two numerics settings of the
/// CPU backend over a text.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench quality", bin_name = "bench quality")]
pub struct QualityArgs {
    /// The model: a GGUF file or a Hugging Face folder.
    #[arg(long, default_value = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    /// The text (UTF-8) to score.
    #[arg(long, default_value = "fixtures/pride-and-prejudice-ch1-12.txt")]
    pub text: PathBuf,
    /// The setting measured against: `exact` or `fast`.
    #[arg(long, default_value = "exact", value_parser = numerics_parser())]
    pub baseline: Numerics,
    /// The setting measured: `exact` or `fast`.
    #[arg(long, default_value = "fast", value_parser = numerics_parser())]
    pub candidate: Numerics,
    /// Tokens of model input per window (at most the model's context).
    #[arg(long, default_value_t = 512)]
    pub window: usize,
    /// Tokens per forward pass within a window (bounds the logits held at once: `chunk` rows of
    /// `vocab` f32 per setting).
    #[arg(long, default_value_t = 64)]
    pub chunk: usize,
    /// Score each window from this token on (0: every token but the first). Default: 0, or
    /// `window / 2 + 1` with `--layout llama-perplexity` (the tokens `llama-perplexity` scores).
    #[arg(long)]
    pub score_from: Option<usize>,
    /// How the text is cut into windows: `consecutive` (text tokens in order, BOS in front of
    /// each window when the model asks for one) or `llama-perplexity` (exactly as llama.cpp's
    /// `llama-perplexity -c WINDOW` cuts and scores them, for a side-by-side perplexity).
    #[arg(long, value_enum, default_value_t = WindowLayout::Consecutive)]
    pub layout: WindowLayout,
    /// Only the first N windows (a quick look; the report says how many ran).
    #[arg(long)]
    pub max_windows: Option<usize>,
    /// Compute threads, the caller included (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Instead of the text: greedy decoding of this reference file's prompts in both settings
    /// (e.g. `fixtures/reference.json` for SmolLM2, `fixtures/gemma3-270m.json` for Gemma 3).
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Instead of the CPU backend in-process: the baseline server, an OpenAI-compatible base URL
    /// (`http://HOST:PORT`) with `/tokenize` and completions' `echo` + `logprobs`; needs
    /// `--candidate-api`. `--model`, `--baseline`, `--candidate`, `--chunk` and `--threads` do
    /// not apply; no KL is reported.
    #[arg(long, requires = "candidate_api", conflicts_with = "prompts")]
    pub api: Option<String>,
    /// The candidate server of `--api`.
    #[arg(long, requires = "api")]
    pub candidate_api: Option<String>,
    /// The model name sent to `--api` (default: the first its `GET /v1/models` lists).
    #[arg(long)]
    pub api_model: Option<String>,
    /// The model name sent to `--candidate-api` (default: the first it lists).
    #[arg(long)]
    pub candidate_api_model: Option<String>,
    /// Alternatives per position asked of each server with `--api` (completions' `logprobs`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub api_logprobs: u32,
    /// Sent to both servers as `Authorization: Bearer KEY`.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl QualityArgs {
    /// The first token scored: `--score-from`, else the layout's default.
    fn score_from(&self) -> usize {
        self.score_from
            .unwrap_or_else(|| self.layout.default_score_from(self.window))
    }
}

/// `exact` or `fast` (clap lists both on a wrong value).
fn numerics_parser() -> impl TypedValueParser<Value = Numerics> {
    clap::builder::PossibleValuesParser::new(["exact", "fast"]).map(|s| match s.as_str() {
        "fast" => Numerics::Fast,
        _ => Numerics::Exact,
    })
}

/// Runs `bench quality` with `args`: prints the table on stdout (progress on stderr) and writes
/// the JSON when asked.
///
/// Errors: those of [`evaluate`], of [`evaluate_api`] or of the prompts' run, and writing the
/// JSON.
pub async fn run(args: &QualityArgs) -> anyhow::Result<()> {
    let json = match (&args.api, &args.candidate_api, &args.prompts) {
        (Some(baseline), Some(candidate), _) => run_api(args, baseline, candidate).await?,
        (_, _, Some(reference)) => {
            backend_cpu::pool::set_threads(args.threads);
            run_prompts(args, reference)?
        }
        _ => {
            backend_cpu::pool::set_threads(args.threads);
            run_text(args)?
        }
    };
    if let Some(path) = &args.json {
        let bytes = serde_json::to_vec_pretty(&json).context("encoding the report")?;
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench quality: wrote {}", path.display());
    }
    Ok(())
}

/// Shows a run's progress on stderr, on one line rewritten per window.
fn show_progress(p: Progress) {
    eprint!(
        "\rbench quality: window {}/{} ({:.0} s)",
        p.done, p.total, p.elapsed_s
    );
    if p.done == p.total {
        eprintln!();
    }
}

/// The text's run; returns its JSON.
fn run_text(args: &QualityArgs) -> anyhow::Result<serde_json::Value> {
    let quality = QualityRun {
        model: &args.model,
        text: &args.text,
        baseline: args.baseline,
        candidate: args.candidate,
        window: args.window,
        chunk: args.chunk,
        score_from: args.score_from(),
        max_windows: args.max_windows,
        layout: args.layout,
    };
    let mut show = show_progress;
    let report = evaluate(&quality, &mut show).with_context(|| {
        format!(
            "measuring {} on {}",
            args.model.display(),
            args.text.display()
        )
    })?;
    println!("{}", report.render());
    Ok(serde_json::to_value(&report)?)
}

/// The text's run through two servers' APIs; returns its JSON.
async fn run_api(
    args: &QualityArgs,
    baseline: &str,
    candidate: &str,
) -> anyhow::Result<serde_json::Value> {
    let run = ApiRun {
        baseline,
        candidate,
        baseline_model: args.api_model.as_deref(),
        candidate_model: args.candidate_api_model.as_deref(),
        api_key: args.api_key.as_deref(),
        text: &args.text,
        window: args.window,
        score_from: args.score_from(),
        max_windows: args.max_windows,
        layout: args.layout,
        top_logprobs: args.api_logprobs,
    };
    let mut show = show_progress;
    let report = evaluate_api(&run, &mut show).await.with_context(|| {
        format!(
            "measuring {baseline} against {candidate} on {}",
            args.text.display()
        )
    })?;
    println!("{}", report.render());
    Ok(serde_json::to_value(&report)?)
}

/// The reference prompts' run; returns its JSON.
fn run_prompts(
    args: &QualityArgs,
    reference: &std::path::Path,
) -> anyhow::Result<serde_json::Value> {
    let prompts = read_reference(reference)?;
    let load = |numerics| -> Result<CpuModel, QualityError> {
        Ok(CpuModel::load(&args.model)?.with_numerics(numerics))
    };
    let (baseline, candidate) = (load(args.baseline)?, load(args.candidate)?);
    let rows = greedy_agreement(&baseline, &candidate, &prompts)
        .with_context(|| format!("decoding the prompts of {}", reference.display()))?;
    let (b, c) = (args.baseline.as_str(), args.candidate.as_str());
    println!(
        "bench quality: greedy ids of {} on {}\ncpu: {}; f32 path {}, integer path {}; {} thread(s)\n",
        args.model.display(),
        reference.display(),
        cpu_model_name(),
        SimdPath::detect().as_str(),
        IntPath::detect().as_str(),
        backend_cpu::pool::global().threads(),
    );
    println!("{}", render(&rows, b, c));
    Ok(serde_json::json!({
        "model": args.model.display().to_string(),
        "reference": reference.display().to_string(),
        "cpu": cpu_model_name(),
        "f32_path": SimdPath::detect().as_str(),
        "int_path": IntPath::detect().as_str(),
        "threads": backend_cpu::pool::global().threads(),
        "baseline": b,
        "candidate": c,
        "prompts": rows,
    }))
}
