//! `bench quality --prompts FILE`: greedy decoding of a reference file's prompts in both settings,
//! and per prompt how many generated ids the candidate shares with the baseline before the first
//! difference (information for users, no target).
//!
//! The file is one of the project's references (`fixtures/reference.json` for SmolLM2,
//! `fixtures/gemma3-270m.json` for Gemma 3): `{"prompts": [{"name", "prompt_ids", "greedy_ids"},
//! ...]}`. Each setting decodes greedily on its own ([`engine::sampler::argmax`], as many steps as
//! the reference has ids, no stop on EOS), from a prefill of the prompt ids; the report also says
//! whether the baseline reproduces the reference's ids and the baseline's top-1 minus top-2 logit
//! margin at the step where the candidate first differs (a small margin: a near tie).

use std::path::Path;

use backend_cpu::CpuModel;
use engine::backend::BatchEntry;
use engine::sampler::argmax;
use serde::{Deserialize, Serialize};

use super::score::BLOCK;
use super::QualityError;

/// One prompt of a reference file.
#[derive(Debug, Clone, Deserialize)]
pub struct ReferencePrompt {
    /// Its name.
    pub name: String,
    /// The prompt's token ids.
    pub prompt_ids: Vec<u32>,
    /// The reference's greedy continuation.
    pub greedy_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct ReferenceFile {
    prompts: Vec<ReferencePrompt>,
}

/// Reads the prompts of the reference file at `path`.
///
/// Errors: [`QualityError::Read`] (the file), [`QualityError::Reference`] (its JSON).
pub fn read_reference(path: &Path) -> Result<Vec<ReferencePrompt>, QualityError> {
    let text = std::fs::read_to_string(path).map_err(|source| QualityError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file: ReferenceFile =
        serde_json::from_str(&text).map_err(|source| QualityError::Reference {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(file.prompts)
}

/// How one prompt's greedy continuations compare.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptAgreement {
    /// The prompt's name.
    pub name: String,
    /// Ids generated per setting.
    pub steps: usize,
    /// The baseline's generated ids.
    pub baseline_ids: Vec<u32>,
    /// The candidate's generated ids.
    pub candidate_ids: Vec<u32>,
    /// Leading generated ids the candidate shares with the baseline (`steps` when all).
    pub agreeing_prefix: usize,
    /// Whether the baseline generated exactly the reference's ids.
    pub baseline_matches_reference: bool,
    /// The baseline's top-1 minus top-2 logit at the first different step (`None` when all agree).
    pub baseline_margin_at_difference: Option<f32>,
}

/// The greedy continuation of `prompt` under `model` for `steps` ids, and the logits row each id
/// was chosen from.
fn greedy(
    model: &CpuModel,
    prompt: &[u32],
    steps: usize,
) -> Result<(Vec<u32>, Vec<Vec<f32>>), QualityError> {
    let table: Vec<u32> = (0..(prompt.len() + steps).div_ceil(BLOCK) as u32).collect();
    let mut kv = model.new_kv(table.len(), BLOCK);
    let (mut ids, mut rows) = (Vec::with_capacity(steps), Vec::with_capacity(steps));
    let mut input = prompt.to_vec();
    let mut pos = 0;
    while ids.len() < steps {
        let entry = BatchEntry {
            tokens: &input,
            start_pos: pos,
            block_table: &table,
            logit_tokens: 1,
        };
        let row = model
            .forward_batch(&[entry], &mut kv)?
            .pop()
            .expect("one logits row per entry");
        pos += input.len();
        let next = argmax(&row) as u32;
        ids.push(next);
        rows.push(row);
        input = vec![next];
    }
    Ok((ids, rows))
}

/// Top-1 minus top-2 of `row` (0 for fewer than 2 values).
fn margin(row: &[f32]) -> f32 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > first {
            second = first;
            first = v;
        } else if v > second {
            second = v;
        }
    }
    if second == f32::NEG_INFINITY {
        0.0
    } else {
        first - second
    }
}

/// Decodes every prompt greedily under `baseline` and `candidate` (see the module docs).
///
/// Errors: [`QualityError::Model`] when the backend refuses a step (an id outside the
/// vocabulary, a prompt past the context).
pub fn greedy_agreement(
    baseline: &CpuModel,
    candidate: &CpuModel,
    prompts: &[ReferencePrompt],
) -> Result<Vec<PromptAgreement>, QualityError> {
    prompts
        .iter()
        .map(|p| {
            let steps = p.greedy_ids.len();
            let (base, base_rows) = greedy(baseline, &p.prompt_ids, steps)?;
            let (cand, _) = greedy(candidate, &p.prompt_ids, steps)?;
            let agreeing_prefix = base.iter().zip(&cand).take_while(|(a, b)| a == b).count();
            Ok(PromptAgreement {
                name: p.name.clone(),
                steps,
                agreeing_prefix,
                baseline_matches_reference: base == p.greedy_ids,
                baseline_margin_at_difference: base_rows.get(agreeing_prefix).map(|r| margin(r)),
                baseline_ids: base,
                candidate_ids: cand,
            })
        })
        .collect()
}

/// The table of `rows` (several lines, no trailing newline): `baseline` and `candidate` name the
/// settings.
pub fn render(rows: &[PromptAgreement], baseline: &str, candidate: &str) -> String {
    let mut out = vec![format!(
        "{:<16} {:>22} {:>18} {:>24}",
        "prompt",
        format!("{candidate} = {baseline} ids"),
        format!("{baseline} = reference"),
        format!("{baseline} margin there"),
    )];
    for r in rows {
        out.push(format!(
            "{:<16} {:>22} {:>18} {:>24}",
            r.name,
            format!("{} of {}", r.agreeing_prefix, r.steps),
            if r.baseline_matches_reference {
                "yes"
            } else {
                "no"
            },
            r.baseline_margin_at_difference
                .map_or_else(|| "-".to_string(), |m| format!("{m:.4}")),
        ));
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::margin;

    #[test]
    fn margin_is_top1_minus_top2() {
        assert_eq!(margin(&[0.5, 2.0, 1.25, -3.0]), 0.75);
        assert_eq!(margin(&[2.0, 2.0]), 0.0);
        assert_eq!(margin(&[1.0]), 0.0);
    }
}
