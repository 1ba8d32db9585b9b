//! Token counts for the repetition, frequency and presence penalties, kept incrementally.
//!
//! The sampler is stateless across tokens in meaning: everything here is rebuilt from the `prompt` and
//! `generated` slices it is given. It only caches what it counted last time, with a copy of the tokens
//! it covers, and extends the counts when the new `generated` continues that copy (the usual case:
//! one more token per step), or recounts from scratch when it does not (a resumed, rewound or unrelated
//! history). Checking the copy is a `memcmp` of the history, far cheaper than a vocabulary-sized count
//! array per step.

use std::collections::HashMap;

use super::SamplingConfig;

/// Cached counts over one prompt and one generated history.
#[derive(Debug, Clone, Default)]
pub(crate) struct Penalties {
    /// The prompt `prompt_ids` was built from (kept only with the repetition penalty on).
    prompt: Vec<u32>,
    /// Distinct ids of `prompt`, sorted.
    prompt_ids: Vec<u32>,
    /// The generated tokens `counts` covers.
    generated: Vec<u32>,
    /// How often each id occurs in `generated`.
    counts: HashMap<u32, u32>,
}

impl Penalties {
    /// Applies the repetition penalty (over `prompt` and `generated`), then the frequency and presence
    /// penalties (over `generated`), to `logits` in place. Ids outside `logits` are skipped.
    pub(crate) fn apply(
        &mut self,
        config: &SamplingConfig,
        logits: &mut [f32],
        prompt: &[u32],
        generated: &[u32],
    ) {
        let repetition = config.repetition_on();
        let frequency_presence = config.frequency_presence_on();
        if !repetition && !frequency_presence {
            return;
        }
        if repetition {
            self.sync_prompt(prompt);
        }
        self.sync_generated(generated);
        if repetition {
            let p = config.repetition_penalty;
            let penalise = |v: &mut f32| *v = if *v > 0.0 { *v / p } else { *v * p };
            for &id in &self.prompt_ids {
                if let Some(v) = logits.get_mut(id as usize) {
                    penalise(v);
                }
            }
            for &id in self.counts.keys() {
                if self.prompt_ids.binary_search(&id).is_err() {
                    if let Some(v) = logits.get_mut(id as usize) {
                        penalise(v);
                    }
                }
            }
        }
        if frequency_presence {
            let (f, pr) = (config.frequency_penalty, config.presence_penalty);
            for (&id, &count) in &self.counts {
                if let Some(v) = logits.get_mut(id as usize) {
                    *v -= f * count as f32 + pr;
                }
            }
        }
    }

    /// Rebuilds the distinct prompt ids unless `prompt` is the one they came from.
    fn sync_prompt(&mut self, prompt: &[u32]) {
        if self.prompt == prompt {
            return;
        }
        self.prompt.clear();
        self.prompt.extend_from_slice(prompt);
        self.prompt_ids.clear();
        self.prompt_ids.extend_from_slice(prompt);
        self.prompt_ids.sort_unstable();
        self.prompt_ids.dedup();
    }

    /// Brings `counts` to `generated`: extends them when `generated` continues the counted tokens,
    /// recounts otherwise.
    fn sync_generated(&mut self, generated: &[u32]) {
        if !generated.starts_with(&self.generated) {
            self.generated.clear();
            self.counts.clear();
        }
        let new = &generated[self.generated.len()..];
        for &id in new {
            *self.counts.entry(id).or_insert(0) += 1;
        }
        self.generated.extend_from_slice(new);
    }

    /// The cached count of `id` (tests).
    #[cfg(test)]
    pub(crate) fn count(&self, id: u32) -> u32 {
        self.counts.get(&id).copied().unwrap_or(0)
    }
}
