//! A quality run's report: the human table ([`QualityReport::render`]) and the JSON (`Serialize`,
//! the summary's fields flattened beside the run's).

use serde::Serialize;

use super::metrics::QualitySummary;
use super::text::WindowLayout;

/// The windows of a quality run (in-process or through the API) and their wall time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowRun {
    /// How the text was cut.
    pub layout: WindowLayout,
    /// Tokens of model input per window.
    pub window: usize,
    /// The first token of each window that is scored (at least 1).
    pub score_from: usize,
    /// The token each window starts with, when the model asks for one.
    pub bos: Option<u32>,
    /// Tokens of the whole text.
    pub text_tokens: usize,
    /// Windows run.
    pub windows: usize,
    /// Text tokens in the windows run.
    pub text_tokens_used: usize,
    /// Wall time of the windows, seconds.
    pub elapsed_s: f64,
}

impl WindowRun {
    /// The windows of `window` tokens (scored from `score_from`, at least 1) that `windows`
    /// cut from a text of `text_tokens` tokens, each starting with `bos` when the model asks for
    /// it, run since `started`.
    pub fn new(
        layout: WindowLayout,
        window: usize,
        score_from: usize,
        bos: Option<u32>,
        text_tokens: usize,
        windows: usize,
        started: std::time::Instant,
    ) -> Self {
        Self {
            layout,
            window,
            score_from: score_from.max(1),
            bos,
            text_tokens,
            windows,
            text_tokens_used: windows * (window - usize::from(bos.is_some())),
            elapsed_s: started.elapsed().as_secs_f64(),
        }
    }

    /// The report's line about the text and the windows, with `scored` positions.
    fn render(&self, scored: usize) -> String {
        format!(
            "text: {} tokens; {} windows of {}{} ({} text tokens); {} positions scored ({}); {:.0} s",
            self.text_tokens,
            self.windows,
            self.window,
            match self.layout {
                WindowLayout::Consecutive => "",
                WindowLayout::LlamaPerplexity => " cut as llama-perplexity cuts them",
            },
            self.text_tokens_used,
            scored,
            scored_what(self.bos, self.score_from),
            self.elapsed_s
        )
    }
}

/// What [`super::evaluate`] measured, and on what.
#[derive(Debug, Clone, Serialize)]
pub struct QualityReport {
    /// The model path as given.
    pub model: String,
    /// The text path as given.
    pub text: String,
    /// The CPU's model name (`/proc/cpuinfo`'s `model name`, as `lscpu` shows it).
    pub cpu: String,
    /// The f32 kernels' SIMD path that ran (`portable`, `avx2`, `avx512`).
    pub f32_path: &'static str,
    /// The integer kernels' path that `fast` ran (`portable`, `avx2`, `avx512-vnni`).
    pub int_path: &'static str,
    /// Compute threads (the caller included).
    pub threads: usize,
    /// The baseline's numerics (`exact` or `fast`).
    pub baseline: &'static str,
    /// The candidate's numerics.
    pub candidate: &'static str,
    /// The windows run and their time (both settings and the scoring together).
    #[serde(flatten)]
    pub run: WindowRun,
    /// The measurements.
    #[serde(flatten)]
    pub summary: QualitySummary,
}

impl QualityReport {
    /// The human-readable table (several lines, no trailing newline).
    pub fn render(&self) -> String {
        let s = &self.summary;
        let mut out = vec![
            format!("bench quality: {} on {}", self.model, self.text),
            format!(
                "cpu: {}; f32 path {}, integer path {}; {} thread(s)",
                self.cpu, self.f32_path, self.int_path, self.threads
            ),
            self.run.render(s.scored),
        ];
        out.extend(summary_table("numerics", self.baseline, self.candidate, s));
        out.join("\n")
    }
}

/// What [`super::api::evaluate_api`] measured through two servers' APIs, and on what.
#[derive(Debug, Clone, Serialize)]
pub struct ApiQualityReport {
    /// The baseline server's base URL.
    pub baseline: String,
    /// The model name sent to the baseline server.
    pub baseline_model: String,
    /// The candidate server's base URL.
    pub candidate: String,
    /// The model name sent to the candidate server.
    pub candidate_model: String,
    /// Whether both servers named their tokens by id (`return_tokens_as_token_ids`), so that
    /// top-1 agreement compares token ids; `false`: it compared token texts.
    pub top1_by_id: bool,
    /// The text path as given.
    pub text: String,
    /// The windows run and their time (both servers together).
    #[serde(flatten)]
    pub run: WindowRun,
    /// The measurements (no KL: the API reports each position's top tokens only).
    #[serde(flatten)]
    pub summary: QualitySummary,
}

impl ApiQualityReport {
    /// The human-readable table (several lines, no trailing newline).
    pub fn render(&self) -> String {
        let s = &self.summary;
        let mut out = vec![
            format!("bench quality: through the API, on {}", self.text),
            format!(
                "baseline: {} (model {}); candidate: {} (model {}); top-1 compared by token {}",
                self.baseline,
                self.baseline_model,
                self.candidate,
                self.candidate_model,
                if self.top1_by_id { "id" } else { "text" }
            ),
            self.run.render(s.scored),
        ];
        out.extend(summary_table("server", "baseline", "candidate", s));
        out.join("\n")
    }
}

/// Which tokens of a window are scored, in words.
fn scored_what(bos: Option<u32>, score_from: usize) -> String {
    match (bos, score_from) {
        (Some(id), 1) => format!("each window starts with BOS id {id}; every text token scored"),
        (None, 1) => "each window's first token not scored".to_string(),
        (Some(id), from) => format!("each window starts with BOS id {id}; tokens {from}.. scored"),
        (None, from) => format!("each window's tokens {from}.. scored"),
    }
}

/// The perplexity table and the agreement line of a summary, the rows named `baseline` and
/// `candidate` under the column `what` (a blank line first).
fn summary_table(what: &str, baseline: &str, candidate: &str, s: &QualitySummary) -> Vec<String> {
    let kl = match (s.kl_mean, s.kl_p99, s.kl_max) {
        (Some(mean), Some(p99), Some(max)) => {
            format!("KL mean {mean:.6} nats, p99 {p99:.6}, max {max:.6}")
        }
        _ => "KL not measured".to_string(),
    };
    vec![
        String::new(),
        format!(
            "{what:<10} {:>12} {:>16} {:>14}",
            "perplexity", "mean NLL (nats)", "vs baseline"
        ),
        format!(
            "{baseline:<10} {:>12.4} {:>16.5} {:>14}",
            s.perplexity_baseline, s.mean_nll_baseline, ""
        ),
        format!(
            "{candidate:<10} {:>12.4} {:>16.5} {:>13.3}%",
            s.perplexity_candidate, s.mean_nll_candidate, s.perplexity_change_pct
        ),
        String::new(),
        format!(
            "{candidate} against {baseline}: {kl}; top-1 agreement {:.3} % ({} of {})",
            s.top1_agreement * 100.0,
            s.top1_agree,
            s.scored
        ),
    ]
}

/// The CPU's model name from `/proc/cpuinfo` (`lscpu`'s "Model name"); `"unknown"` where it cannot
/// be read.
pub fn cpu_model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}
