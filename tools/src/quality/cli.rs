//! The `bench quality` command line: `bench quality [--model PATH] [--text PATH] [--baseline exact]
//! [--candidate fast] [--window 512] [--threads N] [--json PATH]`.
//!
//! Prints the report's table on stdout and each window's progress on stderr; `--json PATH` also
//! writes the report as JSON.

use std::path::PathBuf;

use anyhow::Context;
use backend_cpu::Numerics;
use clap::Parser;

use super::evaluate::{evaluate, Progress, QualityRun};
use super::report::QualityReport;

/// `bench quality`: perplexity, KL divergence and top-1 agreement of two numerics settings of the
/// CPU backend over a text.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench quality")]
pub struct QualityArgs {
    /// The model: a GGUF file or a Hugging Face folder.
    #[arg(long, default_value = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    /// The text (UTF-8) to score.
    #[arg(long, default_value = "fixtures/pride-and-prejudice-ch1-12.txt")]
    pub text: PathBuf,
    /// The setting measured against: `exact` or `fast`.
    #[arg(long, default_value = "exact", value_parser = parse_numerics)]
    pub baseline: Numerics,
    /// The setting measured: `exact` or `fast`.
    #[arg(long, default_value = "fast", value_parser = parse_numerics)]
    pub candidate: Numerics,
    /// Tokens of model input per window (at most the model's context).
    #[arg(long, default_value_t = 512)]
    pub window: usize,
    /// Tokens per forward pass within a window (bounds the logits held at once: `chunk` rows of
    /// `vocab` f32 per setting).
    #[arg(long, default_value_t = 64)]
    pub chunk: usize,
    /// Only the first N windows (a quick look; the report says how many ran).
    #[arg(long)]
    pub max_windows: Option<usize>,
    /// Compute threads, the caller included (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn parse_numerics(s: &str) -> Result<Numerics, clap::Error> {
    match s {
        "exact" => Ok(Numerics::Exact),
        "fast" => Ok(Numerics::Fast),
        _ => Err(clap::Error::raw(
            clap::error::ErrorKind::InvalidValue,
            format!("unknown numerics '{s}' (exact or fast)\n"),
        )),
    }
}

/// Runs `bench quality` with `args`: prints the table on stdout (progress on stderr) and writes
/// the JSON when asked. Returns the report.
///
/// Errors: those of [`evaluate`], and writing the JSON.
pub fn run(args: &QualityArgs) -> anyhow::Result<QualityReport> {
    backend_cpu::pool::set_threads(args.threads);
    let quality = QualityRun {
        model: &args.model,
        text: &args.text,
        baseline: args.baseline,
        candidate: args.candidate,
        window: args.window,
        chunk: args.chunk,
        max_windows: args.max_windows,
    };
    let mut show = |p: Progress| {
        eprint!(
            "\rbench quality: window {}/{} ({:.0} s)",
            p.done, p.total, p.elapsed_s
        );
        if p.done == p.total {
            eprintln!();
        }
    };
    let report = evaluate(&quality, &mut show).with_context(|| {
        format!(
            "measuring {} on {}",
            args.model.display(),
            args.text.display()
        )
    })?;
    println!("{}", report.render());
    if let Some(path) = &args.json {
        let bytes = serde_json::to_vec_pretty(&report).context("encoding the report")?;
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench quality: wrote {}", path.display());
    }
    Ok(report)
}
