//! Synthetic prompts of an exact token count.
//!
//! A prompt is a head (`"Request <index>:"`, after the shared prefix when there is one) followed by
//! pseudo-English sentences drawn from a word list with a per-request seed, so that prompts differ
//! from their first tokens on and a prefix cache cannot make the benchmark trivial. The text is
//! fitted to the target count with the router's own tokenizer (any [`PromptTokenizer`]): grow
//! until the count reaches the target, binary-search the longest word prefix that does not exceed
//! it, then pad with short strings that each add exactly one token (`" a"`, `"."`, ...), checking
//! every step by tokenizing. The final text's tokenization is the returned `ids`, so its length is
//! verified, not estimated.
//!
//! Token counts include the BOS token when the model adds one (the router's `Generate` encodes
//! prompts with `add_special_tokens = true`, and so does [`PromptTokenizer`]).

use std::future::Future;

use anyhow::{bail, ensure, Context};
use futures::{StreamExt, TryStreamExt};

use super::rng::{derive_seed, SplitMix64};

/// Tokenizes text exactly as the router tokenizes a `Generate` prompt (special tokens added).
pub trait PromptTokenizer {
    /// The token ids of `text`.
    fn tokenize(&mut self, text: &str) -> impl Future<Output = anyhow::Result<Vec<u32>>>;
}

/// A prompt text and its tokenization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FittedPrompt {
    /// The text to send.
    pub text: String,
    /// Its token ids (the router's tokenization of `text`); `ids.len()` is the target count.
    pub ids: Vec<u32>,
}

/// Common English words the sentences are drawn from.
#[rustfmt::skip]
const WORDS: &[&str] = &[
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world",
    "school", "state", "family", "student", "group", "country", "problem", "hand", "part", "place",
    "case", "week", "company", "system", "program", "question", "work", "government", "number",
    "night", "point", "home", "water", "room", "mother", "area", "money", "story", "fact", "month",
    "lot", "right", "study", "book", "eye", "job", "word", "business", "issue", "side", "kind",
    "head", "house", "service", "friend", "father", "power", "hour", "game", "line", "end",
    "member", "law", "car", "city", "community", "name", "president", "team", "minute", "idea",
    "kid", "body", "information", "back", "parent", "face", "others", "level", "office", "door",
    "health", "person", "art", "war", "history", "party", "result", "change", "morning", "reason",
    "research", "girl", "guy", "moment", "air", "teacher", "force", "education", "river", "garden",
    "be", "have", "do", "say", "go", "can", "get", "would", "make", "know", "will", "think",
    "take", "see", "come", "could", "want", "look", "use", "find", "give", "tell", "ask", "seem",
    "feel", "try", "leave", "call", "good", "new", "first", "last", "long", "great", "little",
    "own", "other", "old", "big", "high", "different", "small", "large", "next", "early",
    "young", "important", "few", "public", "bad", "same", "able", "the", "a", "of", "and", "to",
    "in", "that", "with", "for", "on", "as", "at", "by", "from", "about", "into", "over", "after",
    "quietly", "quickly", "often", "never", "always", "very", "really", "almost", "again",
];

/// Strings tried, in order, to add exactly one token at the end of a prompt.
#[rustfmt::skip]
const PADS: &[&str] = &[
    " a", ".", " the", " and", ",", " I", " of", " to", " x", "!", "?", ";",
];

/// `n` or more pieces of pseudo-English: each piece is `" word"` or a sentence-ending `"."`, so
/// (with a GPT-2-style pre-tokenizer) each piece is its own pre-token and adds at least one token.
fn pieces(rng: &mut SplitMix64, n: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(n + 16);
    while out.len() < n {
        let words = rng.between(5, 14);
        for w in 0..words {
            let word = WORDS[rng.below(WORDS.len() as u64) as usize];
            if w == 0 {
                let mut chars = word.chars();
                let first = chars.next().map(|c| c.to_ascii_uppercase());
                out.push(format!(" {}{}", first.unwrap_or(' '), chars.as_str()));
            } else {
                out.push(format!(" {word}"));
            }
        }
        out.push(".".to_string());
    }
    out
}

/// Fits `head` plus seeded pseudo-English to exactly `target` tokens.
///
/// Errors: `head` alone is longer than `target` tokens, a tokenize call fails, or no padding
/// reaches the exact count (a tokenizer where none of the pad strings adds exactly one token).
pub async fn fit_prompt<T: PromptTokenizer>(
    tok: &mut T,
    head: &str,
    seed: u64,
    target: usize,
) -> anyhow::Result<FittedPrompt> {
    let head_ids = tok.tokenize(head).await?;
    fit_after(tok, head, head_ids, seed, target).await
}

/// [`fit_prompt`] given `head`'s tokenization.
async fn fit_after<T: PromptTokenizer>(
    tok: &mut T,
    head: &str,
    head_ids: Vec<u32>,
    seed: u64,
    target: usize,
) -> anyhow::Result<FittedPrompt> {
    ensure!(
        head_ids.len() <= target,
        "the prompt head {head:?} alone is {} tokens, more than the {target} asked for",
        head_ids.len()
    );
    let mut rng = SplitMix64::new(seed);
    let mut parts: Vec<String> = Vec::new();
    let text_of = |parts: &[String]| {
        let mut t = head.to_string();
        parts.iter().for_each(|p| t.push_str(p));
        t
    };
    // Grow until the count reaches the target (every piece adds >= 1 token, so one round usually
    // suffices).
    let mut full_ids = head_ids.clone();
    for round in 0.. {
        if full_ids.len() >= target {
            break;
        }
        ensure!(
            round < 32,
            "the prompt does not grow: {} tokens after {} pieces",
            full_ids.len(),
            parts.len()
        );
        parts.extend(pieces(&mut rng, target - full_ids.len()));
        full_ids = tok.tokenize(&text_of(&parts)).await?;
    }
    if full_ids.len() == target {
        return Ok(FittedPrompt {
            text: text_of(&parts),
            ids: full_ids,
        });
    }
    // The longest piece prefix with at most `target` tokens: count(lo) <= target < count(hi).
    let (mut lo, mut hi) = (0usize, parts.len());
    let mut lo_ids = head_ids;
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        let ids = tok.tokenize(&text_of(&parts[..mid])).await?;
        if ids.len() <= target {
            lo = mid;
            lo_ids = ids;
        } else {
            hi = mid;
        }
    }
    // Pad up to the target; when stuck, drop one more piece and pad from there.
    let mut base = lo;
    let mut base_ids = lo_ids;
    for _attempt in 0..4 {
        if let Some(fitted) = pad(tok, text_of(&parts[..base]), base_ids, target).await? {
            return Ok(fitted);
        }
        if base == 0 {
            break;
        }
        base -= 1;
        base_ids = tok.tokenize(&text_of(&parts[..base])).await?;
    }
    bail!("could not fit a prompt to exactly {target} tokens with this tokenizer")
}

/// Appends pad strings one token at a time until `target`; `None` when no pad adds exactly one.
async fn pad<T: PromptTokenizer>(
    tok: &mut T,
    mut text: String,
    mut ids: Vec<u32>,
    target: usize,
) -> anyhow::Result<Option<FittedPrompt>> {
    'step: while ids.len() < target {
        for p in PADS {
            let candidate = format!("{text}{p}");
            let candidate_ids = tok.tokenize(&candidate).await?;
            if candidate_ids.len() == ids.len() + 1 {
                text = candidate;
                ids = candidate_ids;
                continue 'step;
            }
        }
        return Ok(None);
    }
    Ok((ids.len() == target).then_some(FittedPrompt { text, ids }))
}

/// Builds one prompt per entry of `targets` (the token count of prompt `i`, `i` being the global
/// request index, warmup included), seeded by `seed`, fitting up to `parallel` prompts at once
/// (each with its own clone of `tok`).
///
/// With `shared_prefix_tokens` K > 0, every prompt starts with the same K tokens (a seeded
/// pseudo-English text fitted to K tokens) followed by `" Request <i>:"` and per-request text;
/// without, prompts start with `"Request <i>:"`. When the head does not fit in a (short) target,
/// the index is left out. Each prompt is verified: its tokenization has exactly its target length
/// and, with a shared prefix, starts with the prefix's ids.
///
/// Errors: a target is 0 or not above K, a tokenize call fails, or a prompt cannot be fitted.
pub async fn build_prompts<T: PromptTokenizer + Clone>(
    tok: &T,
    targets: &[usize],
    shared_prefix_tokens: usize,
    seed: u64,
    parallel: usize,
) -> anyhow::Result<Vec<FittedPrompt>> {
    let prefix = if shared_prefix_tokens > 0 {
        let fitted = fit_prompt(
            &mut tok.clone(),
            "",
            derive_seed(seed, u64::MAX),
            shared_prefix_tokens,
        )
        .await
        .context("building the shared prefix")?;
        Some(fitted)
    } else {
        None
    };
    let prefix = prefix.as_ref();
    futures::stream::iter(targets.iter().copied().enumerate())
        .map(|(i, target)| {
            let mut tok = tok.clone();
            async move { build_one(&mut tok, prefix, i, target, derive_seed(seed, i as u64)).await }
        })
        .buffered(parallel.max(1))
        .try_collect()
        .await
}

/// Fits prompt `i` to `target` tokens after the shared `prefix`, and verifies it.
async fn build_one<T: PromptTokenizer>(
    tok: &mut T,
    prefix: Option<&FittedPrompt>,
    i: usize,
    target: usize,
    seed: u64,
) -> anyhow::Result<FittedPrompt> {
    let shared = prefix.map_or(0, |p| p.ids.len());
    ensure!(target > 0, "prompt {i}: 0 tokens asked for");
    ensure!(
        target > shared,
        "prompt {i}: {target} tokens is not more than the {shared}-token shared prefix"
    );
    let (prefix_text, sep) = prefix.map_or(("", ""), |p| (p.text.as_str(), " "));
    let heads = [
        format!("{prefix_text}{sep}Request {i}:"),
        prefix_text.to_string(),
    ];
    let mut fitted = None;
    for head in heads {
        let head_ids = tok.tokenize(&head).await?;
        if head_ids.len() <= target {
            fitted = Some(fit_after(tok, &head, head_ids, seed, target).await?);
            break;
        }
    }
    let fitted = fitted.with_context(|| format!("prompt {i}: nothing fits {target} tokens"))?;
    ensure!(
        fitted.ids.len() == target,
        "prompt {i}: fitted to {} tokens instead of {target}",
        fitted.ids.len()
    );
    if let Some(p) = prefix {
        ensure!(
            fitted.ids.starts_with(&p.ids),
            "prompt {i}: the shared prefix's tokens change when text follows it"
        );
    }
    Ok(fitted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use inference_proto::worker::TokenizerSpec;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokenizer::TextTokenizer;

    /// The tiny test model's tokenizer (byte-level BPE with 20 merges, SmolLM2 pre-tokenizer).
    #[derive(Clone)]
    struct Tiny(std::sync::Arc<TextTokenizer>, std::sync::Arc<AtomicUsize>);

    impl Tiny {
        fn new(add_bos: bool) -> Tiny {
            static INFO: std::sync::OnceLock<gguf::testing::TinyModelInfo> =
                std::sync::OnceLock::new();
            let info = INFO.get_or_init(|| {
                let dir = std::env::temp_dir().join(format!("bench-prompt-{}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                let info = gguf::testing::write_tiny_llama(&dir.join("tiny.gguf"), 1).unwrap();
                let _ = std::fs::remove_dir_all(&dir);
                info
            });
            let mut types = vec![3; 3];
            types.resize(info.tokens.len(), 1);
            let spec = TokenizerSpec {
                model: "gpt2".into(),
                pre: "smollm".into(),
                tokens: info.tokens.clone(),
                merges: info.merges.clone(),
                token_types: types,
                bos_token_id: Some(info.bos_token_id),
                add_bos_token: add_bos,
                tokenizer_json: String::new(),
                ..Default::default()
            };
            Tiny(
                std::sync::Arc::new(TextTokenizer::from_spec(&spec).unwrap()),
                Default::default(),
            )
        }
    }

    impl PromptTokenizer for Tiny {
        async fn tokenize(&mut self, text: &str) -> anyhow::Result<Vec<u32>> {
            self.1.fetch_add(1, Ordering::Relaxed);
            Ok(self.0.encode(text, true)?)
        }
    }

    /// Runs a future that never waits (the tokenizers here answer at once).
    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn fits_exact_counts() {
        for add_bos in [false, true] {
            let mut tok = Tiny::new(add_bos);
            for target in [1usize, 2, 3, 7, 16, 31, 64, 100, 200] {
                let p = block_on(fit_prompt(&mut tok, "", 5, target)).unwrap();
                assert_eq!(p.ids.len(), target, "{add_bos} {target}: {:?}", p.text);
                assert_eq!(tok.0.encode(&p.text, true).unwrap(), p.ids);
            }
        }
    }

    #[test]
    fn prompts_differ_per_request_and_are_exact() {
        let tok = Tiny::new(false);
        let targets: Vec<usize> = (0..12).map(|i| 20 + 7 * i).collect();
        let prompts = block_on(build_prompts(&tok, &targets, 0, 9, 4)).unwrap();
        for (i, (p, &t)) in prompts.iter().zip(&targets).enumerate() {
            assert_eq!(p.ids.len(), t);
            assert!(p.text.starts_with(&format!("Request {i}:")), "{}", p.text);
        }
        let texts: std::collections::HashSet<&str> =
            prompts.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(texts.len(), prompts.len());
        // A few dozen tokenize calls per prompt at most.
        let calls = tok.1.load(Ordering::Relaxed);
        assert!(calls < 40 * prompts.len(), "{calls} calls");
        // Same seed, same prompts; another seed, other prompts.
        let again = block_on(build_prompts(&tok, &targets, 0, 9, 4)).unwrap();
        assert_eq!(again, prompts);
        let other = block_on(build_prompts(&tok, &targets, 0, 10, 4)).unwrap();
        assert_ne!(other[3].text, prompts[3].text);
    }

    #[test]
    fn shared_prefix_is_common_and_the_rest_differs() {
        let tok = Tiny::new(true);
        let targets = [60usize, 61, 75, 90, 60];
        let prompts = block_on(build_prompts(&tok, &targets, 40, 3, 4)).unwrap();
        for (p, &t) in prompts.iter().zip(&targets) {
            assert_eq!(p.ids.len(), t);
            assert_eq!(p.ids[..40], prompts[0].ids[..40]);
        }
        assert_ne!(prompts[0].ids, prompts[4].ids);
    }

    #[test]
    fn short_targets_drop_the_head_and_impossible_ones_fail() {
        let mut tok = Tiny::new(false);
        let prompts = block_on(build_prompts(&tok, &[1, 2, 3], 0, 1, 4)).unwrap();
        assert_eq!(
            prompts.iter().map(|p| p.ids.len()).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert!(block_on(build_prompts(&tok, &[0], 0, 1, 4)).is_err());
        assert!(block_on(build_prompts(&tok, &[10], 10, 1, 4)).is_err());
        assert!(block_on(fit_prompt(&mut tok, "a long head of many words", 1, 3)).is_err());
    }
}
