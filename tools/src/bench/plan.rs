//! The planned requests of a run: each one's prompt (fitted to an exact token count), length,
//! sampling seed and whether it carries the `--constraint`, all drawn from `--seed` so that every
//! run and every path (router, worker, OpenAI) sends the same requests.

use std::time::Instant;

use anyhow::Context;

use super::constraint::is_constrained;
use super::prompt::{build_prompts, PromptTokenizer};
use super::rng::{derive_seed, SplitMix64};
use super::BenchArgs;

/// Prompts fitted at once (each fit is a sequence of tokenizer calls).
const PROMPT_BUILD_PARALLELISM: usize = 8;

/// Random stream numbers (with `--seed`) of the drawn lengths and of the sampling seeds; prompts
/// use the request index, arrival times [`ARRIVALS_STREAM`].
const LENGTHS_STREAM: u64 = 1 << 40;
/// The random stream of the open loop's arrival times.
pub const ARRIVALS_STREAM: u64 = (1 << 40) + 1;
const SAMPLING_STREAM: u64 = (1 << 40) + 2;

/// One planned request.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The prompt text.
    pub prompt: String,
    /// The prompt's token ids (what the router sends the worker for `prompt`).
    pub ids: Vec<u32>,
    /// `ids.len()`.
    pub prompt_tokens: u32,
    /// The `max_new_tokens` to send.
    pub max_new_tokens: u32,
    /// The sampling seed to send.
    pub seed: u64,
    /// Whether it carries the `--constraint` (then always without `ignore_eos`).
    pub constrained: bool,
}

impl Planned {
    /// The `ignore_eos` to send: `--ignore-eos`, except for a constrained request (never; the
    /// router refuses the combination).
    pub fn ignore_eos(&self, args: &BenchArgs) -> bool {
        args.ignore_eos && !self.constrained
    }
}

/// Draws the lengths and seeds of the warmup and measured requests, picks the constrained ones
/// (by index within each phase) and builds their prompts with `tokenizer`; `calls` counts its
/// calls (named `calls_name` in the progress line).
///
/// Errors: a prompt cannot be built (the tokenizer failed).
pub async fn plan<T: PromptTokenizer + Clone>(
    args: &BenchArgs,
    tokenizer: T,
    calls_name: &str,
    calls: impl Fn() -> usize,
) -> anyhow::Result<Vec<Planned>> {
    let total = args.warmup + args.requests;
    let mut rng = SplitMix64::new(derive_seed(args.seed, LENGTHS_STREAM));
    let lengths: Vec<(usize, u32)> = (0..total)
        .map(|_| {
            let p = rng.between(args.prompt_tokens as u64, args.prompt_tokens_upper() as u64);
            let m = rng.between(
                args.max_new_tokens as u64,
                args.max_new_tokens_upper() as u64,
            );
            (p as usize, m as u32)
        })
        .collect();
    let targets: Vec<usize> = lengths.iter().map(|&(p, _)| p).collect();
    let started = Instant::now();
    let prompts = build_prompts(
        &tokenizer,
        &targets,
        args.shared_prefix_tokens,
        args.seed,
        PROMPT_BUILD_PARALLELISM,
    )
    .await
    .context("building the prompts")?;
    eprintln!(
        "bench: built {total} prompts of {} tokens in {:.2} s ({} {calls_name})",
        if args.prompt_tokens_upper() > args.prompt_tokens {
            format!("{}..={}", args.prompt_tokens, args.prompt_tokens_upper())
        } else {
            args.prompt_tokens.to_string()
        },
        started.elapsed().as_secs_f64(),
        calls()
    );
    let sampling_seed = derive_seed(args.seed, SAMPLING_STREAM);
    let fraction = args.effective_constrained_fraction();
    Ok(prompts
        .into_iter()
        .zip(lengths)
        .enumerate()
        .map(|(i, (p, (_, m)))| Planned {
            prompt_tokens: p.ids.len() as u32,
            prompt: p.text,
            ids: p.ids,
            max_new_tokens: m,
            seed: derive_seed(sampling_seed, i as u64),
            constrained: is_constrained(i.checked_sub(args.warmup).unwrap_or(i), fraction),
        })
        .collect())
}
