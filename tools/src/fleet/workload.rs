//! The fleet benchmark's workloads, generated from a seed (`bench fleet --workload NAME`), with the
//! shapes issue 25 names:
//!
//! - `shared-prefix`: `groups` groups, each a `prefix_tokens`-token system prompt, `questions`
//!   questions of `question_tokens` tokens per group, in a shuffled order (SGLang's
//!   generated-shared-prefix);
//! - `multi-turn`: `conversations` conversations of `turns` turns, all behind one
//!   `prefix_tokens`-token system prompt (so their first 64 tokens are the same, as in a chat
//!   product); turn 1 is the system prompt and a `question_tokens`-token user message, turn `t`'s
//!   prompt is the whole conversation so far (the previous turn's prompt, a `reply_tokens`-token
//!   assistant reply, then a user message), sent only after turn `t - 1` finished;
//! - `no-sharing`: `requests` unrelated prompts of `prefix_tokens + question_tokens` tokens.
//!
//! A prompt is a sequence of *words*: indices into [`WORDS`]. The simulator reads each word as one
//! token id; the real benchmark sends the words as text (each preceded by a space, so that a
//! prompt's tokenization begins with its prefix's tokenization) and feeds the simulator the router's
//! token ids of those texts instead. The assistant replies of `multi-turn` are part of the workload,
//! not the model's outputs, so the real and simulated runs send the same prompts.
//!
//! Arrivals are a Poisson process at `rate` requests/s (`rate = 0`: all at time 0, the saturating
//! run that measures capacity); a `multi-turn` turn starts at its arrival or when its previous turn
//! finished, whichever is later.

use crate::bench::rng::{derive_seed, SplitMix64};

/// Words the prompts are made of (short, common English words: one token each in most vocabularies).
#[rustfmt::skip]
pub const WORDS: &[&str] = &[
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world",
    "school", "state", "family", "student", "group", "country", "problem", "hand", "part", "place",
    "case", "week", "company", "system", "program", "question", "work", "number", "night", "point",
    "home", "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right",
    "study", "book", "eye", "job", "word", "business", "issue", "side", "kind", "head", "house",
    "service", "friend", "father", "power", "hour", "game", "line", "end", "member", "law", "car",
    "city", "name", "team", "minute", "idea", "kid", "body", "back", "parent", "face", "others",
    "level", "office", "door", "health", "person", "art", "war", "history", "party", "result",
    "change", "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force",
    "good", "new", "first", "last", "long", "great", "little", "own", "other", "old", "big", "high",
    "small", "large", "next", "early", "young", "important", "few", "public", "bad", "same", "able",
    "make", "know", "take", "see", "come", "think", "look", "want", "give", "use", "find", "tell",
];

/// The workload shapes (`--workload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    /// Groups of questions behind a shared system prompt.
    SharedPrefix,
    /// Conversations whose every turn resends the whole conversation.
    MultiTurn,
    /// Unrelated prompts.
    NoSharing,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Shape::SharedPrefix => "shared-prefix",
            Shape::MultiTurn => "multi-turn",
            Shape::NoSharing => "no-sharing",
        })
    }
}

/// The sizes of a workload (see the module docs for what each means per shape).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct WorkloadSpec {
    /// The shape.
    pub shape: Shape,
    /// Seed of every random choice.
    pub seed: u64,
    /// `shared-prefix`: groups; `multi-turn`: conversations; `no-sharing`: requests.
    pub groups: usize,
    /// `shared-prefix`: questions per group; `multi-turn`: turns per conversation; else unused.
    pub per_group: usize,
    /// Words of the shared system prompt (`no-sharing`: of a prompt, with `question_tokens`).
    pub prefix_tokens: usize,
    /// Words of a question (a user message).
    pub question_tokens: usize,
    /// Words of an assistant reply (`multi-turn`).
    pub reply_tokens: usize,
    /// Tokens generated per request (sent with `ignore_eos`).
    pub max_new_tokens: u32,
}

impl WorkloadSpec {
    /// Total requests of the workload.
    pub fn requests(&self) -> usize {
        match self.shape {
            Shape::NoSharing => self.groups,
            Shape::SharedPrefix | Shape::MultiTurn => self.groups * self.per_group,
        }
    }
}

/// One request of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadRequest {
    /// The prompt as words (indices into [`WORDS`]).
    pub words: Vec<u32>,
    /// Tokens to generate.
    pub max_new_tokens: u32,
    /// Arrival time, in seconds from the start.
    pub arrival_s: f64,
    /// The request (index into the workload) that must finish before this one starts
    /// (`multi-turn`: the previous turn).
    pub after: Option<usize>,
}

impl WorkloadRequest {
    /// The prompt as text: every word preceded by a space.
    pub fn text(&self) -> String {
        let mut text = String::with_capacity(self.words.len() * 7);
        for &w in &self.words {
            text.push(' ');
            text.push_str(WORDS[w as usize % WORDS.len()]);
        }
        text
    }
}

fn words(rng: &mut SplitMix64, n: usize) -> Vec<u32> {
    (0..n)
        .map(|_| rng.below(WORDS.len() as u64) as u32)
        .collect()
}

/// The requests of `spec` with Poisson arrivals at `rate` requests/s (0: all at time 0), in
/// arrival order. Deterministic in `spec.seed`.
pub fn generate(spec: &WorkloadSpec, rate: f64) -> Vec<WorkloadRequest> {
    let mut rng = SplitMix64::new(derive_seed(spec.seed, 0));
    let mut requests: Vec<WorkloadRequest> = Vec::with_capacity(spec.requests());
    let new = |words: Vec<u32>, after| WorkloadRequest {
        words,
        max_new_tokens: spec.max_new_tokens,
        arrival_s: 0.0,
        after,
    };
    match spec.shape {
        Shape::NoSharing => {
            for _ in 0..spec.groups {
                let w = words(&mut rng, spec.prefix_tokens + spec.question_tokens);
                requests.push(new(w, None));
            }
        }
        Shape::SharedPrefix => {
            let prefixes: Vec<Vec<u32>> = (0..spec.groups)
                .map(|_| words(&mut rng, spec.prefix_tokens))
                .collect();
            let mut order: Vec<usize> = (0..spec.requests()).map(|i| i % spec.groups).collect();
            shuffle(&mut rng, &mut order);
            for g in order {
                let mut w = prefixes[g].clone();
                w.extend(words(&mut rng, spec.question_tokens));
                requests.push(new(w, None));
            }
        }
        Shape::MultiTurn => {
            // Conversations start in a shuffled order; each turn is queued behind its previous one.
            let system = words(&mut rng, spec.prefix_tokens);
            let mut last: Vec<Option<usize>> = vec![None; spec.groups];
            let mut order: Vec<usize> = (0..spec.requests()).map(|i| i % spec.groups).collect();
            shuffle(&mut rng, &mut order);
            for c in order {
                let w = match last[c] {
                    None => {
                        let mut w = system.clone();
                        w.extend(words(&mut rng, spec.question_tokens));
                        w
                    }
                    Some(prev) => {
                        let mut w = requests[prev].words.clone();
                        w.extend(words(&mut rng, spec.reply_tokens));
                        w.extend(words(&mut rng, spec.question_tokens));
                        w
                    }
                };
                requests.push(new(w, last[c]));
                last[c] = Some(requests.len() - 1);
            }
        }
    }
    if rate > 0.0 {
        let mut t = 0.0;
        for r in &mut requests {
            t += rng.exponential(rate);
            r.arrival_s = t;
        }
    }
    requests
}

/// Fisher-Yates with the seeded stream.
fn shuffle(rng: &mut SplitMix64, items: &mut [usize]) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// The hit rate one worker with an unbounded prefix cache would reach on `prompts` (token ids) in
/// order: cached prompt tokens over prompt tokens, counting whole blocks of `block_size` tokens of
/// earlier prompts, at most all but the last token (as the workers count). Generated tokens are not
/// counted (the workloads never resend them). The `kv_aware` target is 90 % of this.
pub fn ideal_hit_rate(prompts: &[Vec<u32>], block_size: usize) -> f64 {
    let mut seen = std::collections::HashSet::new();
    let (mut hit, mut query) = (0usize, 0usize);
    for p in prompts {
        let chain = routing::block_hashes(p, block_size);
        let held = chain.iter().take_while(|h| seen.contains(*h)).count();
        if !p.is_empty() {
            hit += held.min((p.len() - 1) / block_size) * block_size;
        }
        query += p.len();
        seen.extend(chain);
    }
    if query == 0 {
        0.0
    } else {
        hit as f64 / query as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(shape: Shape) -> WorkloadSpec {
        WorkloadSpec {
            shape,
            seed: 7,
            groups: 4,
            per_group: 3,
            prefix_tokens: 40,
            question_tokens: 8,
            reply_tokens: 6,
            max_new_tokens: 4,
        }
    }

    #[test]
    fn shapes_have_the_documented_structure() {
        let shared = generate(&spec(Shape::SharedPrefix), 2.0);
        assert_eq!(shared.len(), 12);
        let mut prefixes: Vec<&[u32]> = shared.iter().map(|r| &r.words[..40]).collect();
        prefixes.sort();
        prefixes.dedup();
        assert_eq!(prefixes.len(), 4, "one system prompt per group");
        assert!(shared
            .iter()
            .all(|r| r.words.len() == 48 && r.after.is_none()));
        assert!(shared.windows(2).all(|w| w[0].arrival_s < w[1].arrival_s));

        let turns = generate(&spec(Shape::MultiTurn), 0.0);
        assert_eq!(turns.len(), 12);
        for (i, r) in turns.iter().enumerate() {
            match r.after {
                None => {
                    assert_eq!(r.words.len(), 48);
                    assert_eq!(r.words[..40], turns[0].words[..40], "one system prompt");
                }
                Some(prev) => {
                    assert!(prev < i);
                    let p = &turns[prev].words;
                    assert_eq!(
                        &r.words[..p.len()],
                        &p[..],
                        "a turn resends the conversation"
                    );
                    assert_eq!(r.words.len(), p.len() + 14);
                }
            }
        }
        assert_eq!(turns.iter().filter(|r| r.after.is_none()).count(), 4);

        let unrelated = generate(&spec(Shape::NoSharing), 0.0);
        assert_eq!(unrelated.len(), 4);
        assert!(unrelated[0].text().starts_with(' '));
    }

    #[test]
    fn the_seed_decides_everything() {
        let s = spec(Shape::SharedPrefix);
        assert_eq!(generate(&s, 3.0), generate(&s, 3.0));
        let other = WorkloadSpec { seed: 8, ..s };
        assert_ne!(generate(&s, 3.0), generate(&other, 3.0));
    }

    #[test]
    fn ideal_hit_rate_counts_whole_earlier_blocks() {
        let a: Vec<u32> = (0..40).collect();
        let mut b = a[..32].to_vec();
        b.extend(100..108);
        // b reuses a's first two 16-token blocks: 32 of 80 prompt tokens.
        assert_eq!(ideal_hit_rate(&[a.clone(), b], 16), 32.0 / 80.0);
        // The last token is always computed: an identical 32-token prompt reuses one block.
        let c: Vec<u32> = (0..32).collect();
        assert_eq!(ideal_hit_rate(&[c.clone(), c], 16), 16.0 / 64.0);
    }
}
