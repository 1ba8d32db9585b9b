//! [`evaluate`]: one quality run, from the model file and the text to the [`QualityReport`].

use std::path::Path;
use std::time::Instant;

use backend_cpu::{CpuModel, IntPath, Numerics, SimdPath};
use engine::backend::ModelError;

use super::metrics::QualityTally;
use super::report::{cpu_model_name, QualityReport, WindowRun};
use super::score::SideBySide;
use super::text::{ModelTokenizer, WindowLayout};
use super::QualityError;

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct QualityRun<'a> {
    /// The model: a GGUF file or a Hugging Face folder.
    pub model: &'a Path,
    /// The text (UTF-8).
    pub text: &'a Path,
    /// The setting measured against.
    pub baseline: Numerics,
    /// The setting measured.
    pub candidate: Numerics,
    /// Tokens of model input per window (BOS included when the model asks for it).
    pub window: usize,
    /// Tokens per forward pass within a window (bounds the logits held at once).
    pub chunk: usize,
    /// The first token of each window that is scored (0 or 1: every token but the first;
    /// `window / 2`: as `llama-perplexity`).
    pub score_from: usize,
    /// Only the first this many windows (`None`: all).
    pub max_windows: Option<usize>,
    /// How the text is cut into windows.
    pub layout: WindowLayout,
}

/// Where a run is: windows done of all, after `elapsed_s` seconds.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Windows scored so far.
    pub done: usize,
    /// Windows in the run.
    pub total: usize,
    /// Seconds since the first window started.
    pub elapsed_s: f64,
}

/// Tokenizes `run.text` with the model's tokenizer, runs every window in both settings on the
/// CPU backend's global compute pool ([`backend_cpu::pool`]) and summarises the scored positions.
/// `progress` hears about each window done.
///
/// Errors: [`QualityError::Read`] (reading the text), [`QualityError::Model`] (opening or loading
/// the model, a refused step), [`QualityError::Tokenizer`], [`QualityError::WindowTooSmall`],
/// [`QualityError::TextTooShort`], [`QualityError::WindowPastContext`],
/// [`QualityError::ScoreFromPastWindow`],
/// [`QualityError::TokenOutOfVocab`].
pub fn evaluate(
    run: &QualityRun<'_>,
    progress: &mut dyn FnMut(Progress),
) -> Result<QualityReport, QualityError> {
    let text = std::fs::read_to_string(run.text).map_err(|source| QualityError::Read {
        path: run.text.to_path_buf(),
        source,
    })?;
    let file = model_files::open(run.model).map_err(ModelError::from)?;
    let tokenizer = ModelTokenizer::from_model(run.model, &file)?;
    let baseline = CpuModel::from_source(&file)?.with_numerics(run.baseline);
    let candidate = CpuModel::from_source(&file)?.with_numerics(run.candidate);
    let mut pair = SideBySide::new(&baseline, &candidate, run.window, run.chunk, run.score_from)?;
    let ids = tokenizer.encode(&text)?;
    let mut all = run.layout.cut(&ids, run.window, tokenizer.bos())?;
    if let Some(max) = run.max_windows {
        all.truncate(max.max(1));
    }

    let mut tally = QualityTally::new();
    let started = Instant::now();
    for (done, window) in all.iter().enumerate() {
        pair.score_window(window, &mut tally)?;
        progress(Progress {
            done: done + 1,
            total: all.len(),
            elapsed_s: started.elapsed().as_secs_f64(),
        });
    }
    let summary = tally
        .summary()
        .expect("every window of at least 2 tokens scores a position");
    let bos = tokenizer.bos();
    Ok(QualityReport {
        model: run.model.display().to_string(),
        text: run.text.display().to_string(),
        cpu: cpu_model_name(),
        f32_path: SimdPath::detect().as_str(),
        int_path: IntPath::detect().as_str(),
        threads: backend_cpu::pool::global().threads(),
        baseline: run.baseline.as_str(),
        candidate: run.candidate.as_str(),
        run: WindowRun::new(
            run.layout,
            run.window,
            run.score_from,
            bos,
            ids.len(),
            all.len(),
            started,
        ),
        summary,
    })
}
