//! `bench quality --api URL --candidate-api URL`: perplexity and top-1 agreement of two servers
//! over the same text, through their OpenAI-compatible HTTP APIs (issue 29), so that two
//! deployments (two numerics settings, two quantizations, two engines of the same model) compare
//! as `bench quality` compares two numerics settings in-process.
//!
//! The text is tokenized by the baseline server's `POST /tokenize` (vLLM's shape, no special
//! tokens; the candidate must tokenize it the same, or the run stops), its beginning-of-sequence
//! token found by tokenizing with and without special tokens, and cut into the same windows as the
//! in-process run ([`super::text::windows`]). Each window is sent to both servers as a token-id
//! prompt, `POST /v1/completions` with `echo: true`, `logprobs: N` (default 1), `max_tokens: 0`,
//! `temperature: 0` and vLLM's `return_tokens_as_token_ids: true`; the answer's
//! `logprobs.token_logprobs[i]` is the log-probability of prompt token `i` given the tokens before
//! it, and `logprobs.top_logprobs[i]` the most likely tokens at that position. Window token `i`
//! (from `max(1, score_from)` on, as in-process) scores `-token_logprobs[i]` and agrees when both
//! servers' most likely token there is the same ([`super::metrics::QualityTally::add_scores`]).
//!
//! Tokens are compared by id when the server names them `token_id:ID` (this router and vLLM do
//! with `return_tokens_as_token_ids`), else by their text (two ids of the same text then count as
//! agreeing; the report says which). The KL divergence needs whole distributions, which the API
//! does not give: it is not reported.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use serde_json::{json, Value};

use super::evaluate::Progress;
use super::metrics::QualityTally;
use super::report::{ApiQualityReport, WindowRun};
use super::text::WindowLayout;
use crate::bench::openai::{connect, OpenAiServer};

/// How long a server may take to list its model at the start.
const CONNECT_WAIT: Duration = Duration::from_secs(30);
/// Limit on one window's scoring call.
const SCORE_TIMEOUT: Duration = Duration::from_secs(600);

/// What to measure through the API.
#[derive(Debug, Clone, Copy)]
pub struct ApiRun<'a> {
    /// The baseline server's base URL (`http://HOST:PORT`, with or without `/v1`).
    pub baseline: &'a str,
    /// The candidate server's base URL.
    pub candidate: &'a str,
    /// The model name sent to the baseline (`None`: the first its `GET /v1/models` lists).
    pub baseline_model: Option<&'a str>,
    /// The model name sent to the candidate.
    pub candidate_model: Option<&'a str>,
    /// Sent as `Authorization: Bearer KEY` to both.
    pub api_key: Option<&'a str>,
    /// The text (UTF-8).
    pub text: &'a Path,
    /// Tokens of model input per window (BOS included when the model asks for it).
    pub window: usize,
    /// The first token of each window that is scored (0 or 1: every token but the first).
    pub score_from: usize,
    /// Only the first this many windows (`None`: all).
    pub max_windows: Option<usize>,
    /// How the text is cut into windows.
    pub layout: WindowLayout,
    /// Alternatives per position asked of each server (completions' `logprobs`, at least 1).
    pub top_logprobs: u32,
}

/// A token as a server names it in `logprobs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenName {
    /// `token_id:ID` (vLLM's `return_tokens_as_token_ids`).
    Id(u32),
    /// The token's text (servers that ignore `return_tokens_as_token_ids`).
    Text(String),
}

impl TokenName {
    /// Reads a `logprobs` token name: `token_id:ID` is an id, anything else a text.
    pub fn parse(name: &str) -> TokenName {
        name.strip_prefix("token_id:")
            .and_then(|id| id.parse().ok())
            .map_or_else(|| TokenName::Text(name.to_string()), TokenName::Id)
    }
}

/// One window as one server scored it: per prompt token `i`, its log-probability given the
/// tokens before it and the most likely token at that position (both `None` for token 0).
#[derive(Debug, Clone, PartialEq)]
pub struct WindowScores {
    /// `token_logprobs[i]`, nats.
    pub logprobs: Vec<Option<f64>>,
    /// The most likely of `top_logprobs[i]` (ties: the lower id, or the first text).
    pub top1: Vec<Option<TokenName>>,
    /// The echoed tokens' names.
    pub tokens: Vec<TokenName>,
}

impl WindowScores {
    /// Whether every token and every top-1 is named by id.
    pub fn by_id(&self) -> bool {
        let id = |t: &TokenName| matches!(t, TokenName::Id(_));
        self.tokens.iter().all(id) && self.top1.iter().flatten().all(id)
    }
}

/// Reads the first choice's `logprobs` of a `/v1/completions` answer to an echoed prompt of `n`
/// tokens: the first `n` entries of `tokens`, `token_logprobs` and `top_logprobs` (generated
/// tokens, if any, follow them and are left out).
///
/// Errors: an answer without `choices[0].logprobs`, or with fewer than `n` entries in one of its
/// three lists, or entries of the wrong type.
pub fn parse_echo(answer: &Value, n: usize) -> anyhow::Result<WindowScores> {
    let lp = &answer["choices"][0]["logprobs"];
    let list = |field: &str| -> anyhow::Result<&Vec<Value>> {
        let list = lp[field]
            .as_array()
            .with_context(|| format!("the answer has no choices[0].logprobs.{field}: {answer}"))?;
        ensure!(
            list.len() >= n,
            "choices[0].logprobs.{field} has {} entries for a prompt of {n} tokens",
            list.len()
        );
        Ok(list)
    };
    let (tokens, logprobs, tops) = (
        list("tokens")?,
        list("token_logprobs")?,
        list("top_logprobs")?,
    );
    let tokens = tokens[..n]
        .iter()
        .map(|t| {
            t.as_str()
                .map(TokenName::parse)
                .context("a token is not a string")
        })
        .collect::<anyhow::Result<_>>()?;
    let logprobs = logprobs[..n]
        .iter()
        .map(|v| match v {
            Value::Null => Ok(None),
            v => v
                .as_f64()
                .map(Some)
                .context("a token_logprobs entry is not a number"),
        })
        .collect::<anyhow::Result<_>>()?;
    let top1 = tops[..n]
        .iter()
        .map(|v| match v {
            Value::Null => Ok(None),
            Value::Object(alternatives) => Ok(most_likely(alternatives)),
            _ => bail!("a top_logprobs entry is not an object: {v}"),
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(WindowScores {
        logprobs,
        top1,
        tokens,
    })
}

/// The most likely of a `top_logprobs` entry's alternatives (ties: the lower id, as greedy
/// decoding picks; texts tie to the first listed). `None` for an empty entry.
fn most_likely(alternatives: &serde_json::Map<String, Value>) -> Option<TokenName> {
    let mut best: Option<(TokenName, f64)> = None;
    for (name, lp) in alternatives {
        let (name, lp) = (
            TokenName::parse(name),
            lp.as_f64().unwrap_or(f64::NEG_INFINITY),
        );
        let better = match &best {
            None => true,
            Some((b, blp)) => {
                lp > *blp
                    || (lp == *blp
                        && matches!((&name, b), (TokenName::Id(x), TokenName::Id(y)) if x < y))
            }
        };
        if better {
            best = Some((name, lp));
        }
    }
    best.map(|(name, _)| name)
}

/// Adds a window's scored positions (token `max(1, score_from)` on) to `tally`.
///
/// Errors: a scored position without a log-probability on either side, or scores of different
/// lengths.
pub fn score_window(
    tally: &mut QualityTally,
    score_from: usize,
    baseline: &WindowScores,
    candidate: &WindowScores,
) -> anyhow::Result<()> {
    let n = baseline.logprobs.len();
    ensure!(
        candidate.logprobs.len() == n,
        "the servers scored {n} and {} tokens",
        candidate.logprobs.len()
    );
    for i in score_from.max(1)..n {
        let (Some(b), Some(c)) = (baseline.logprobs[i], candidate.logprobs[i]) else {
            bail!("prompt token {i} has no log-probability");
        };
        let agree = matches!((&baseline.top1[i], &candidate.top1[i]), (Some(x), Some(y)) if x == y);
        tally.add_scores(-b, -c, None, agree);
    }
    Ok(())
}

/// The ids of `text` by the server's `POST /tokenize` (vLLM's shape), with or without special
/// tokens, and its `max_model_len` when it reports one.
///
/// Errors: the call fails or answers other than 200 with `tokens`.
pub async fn tokenize(
    server: &OpenAiServer,
    text: &str,
    add_special_tokens: bool,
) -> anyhow::Result<(Vec<u32>, Option<usize>)> {
    let body = json!({"model": server.model, "prompt": text,
                      "add_special_tokens": add_special_tokens});
    let answer = post(server, "/tokenize", &body, Duration::from_secs(60)).await?;
    let tokens = serde_json::from_value(answer["tokens"].clone())
        .with_context(|| format!("{}/tokenize answered no tokens", server.base))?;
    let max_len = answer["max_model_len"].as_u64().map(|n| n as usize);
    Ok((tokens, max_len))
}

/// The beginning-of-sequence token the server puts before a prompt (`None` when it adds none at
/// the start): what tokenizing with special tokens adds before the ids without them.
///
/// Errors: those of [`tokenize`].
pub async fn server_bos(server: &OpenAiServer) -> anyhow::Result<Option<u32>> {
    let (plain, _) = tokenize(server, "The", false).await?;
    let (special, _) = tokenize(server, "The", true).await?;
    Ok(match special.split_first() {
        Some((&first, rest)) if special.len() > plain.len() && rest.starts_with(&plain) => {
            Some(first)
        }
        _ => None,
    })
}

/// Scores `ids` as one echoed token-id prompt on `server` with `top_logprobs` alternatives.
///
/// Errors: the call fails or answers other than 200, or [`parse_echo`]'s; an answer naming its
/// tokens by id whose ids are not `ids`.
pub async fn score(
    server: &OpenAiServer,
    ids: &[u32],
    top_logprobs: u32,
) -> anyhow::Result<WindowScores> {
    let body = json!({"model": server.model, "prompt": ids, "echo": true,
                      "logprobs": top_logprobs, "max_tokens": 0, "temperature": 0,
                      "return_tokens_as_token_ids": true});
    let answer = post(server, "/v1/completions", &body, SCORE_TIMEOUT).await?;
    let scores = parse_echo(&answer, ids.len())
        .with_context(|| format!("{}/v1/completions", server.base))?;
    if scores.by_id() {
        let echoed = scores.tokens.iter().map(|t| match t {
            TokenName::Id(id) => *id,
            TokenName::Text(_) => unreachable!("by_id"),
        });
        ensure!(
            echoed.eq(ids.iter().copied()),
            "{} echoed other token ids than the prompt's",
            server.base
        );
    }
    Ok(scores)
}

/// `POST base + path` with a JSON body; the JSON answer.
async fn post(
    server: &OpenAiServer,
    path: &str,
    body: &Value,
    timeout: Duration,
) -> anyhow::Result<Value> {
    let url = format!("{}{path}", server.base);
    let response = server
        .client()
        .post(&url)
        .json(body)
        .timeout(timeout)
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = response.status();
    let answer: Value = response
        .json()
        .await
        .with_context(|| format!("reading the answer of POST {url}"))?;
    ensure!(
        status.is_success(),
        "POST {url} answered {status}: {answer}"
    );
    Ok(answer)
}

/// Connects to both servers, tokenizes `run.text`, scores every window on both (the two at once,
/// the windows one after another) and summarises the scored positions. `progress` hears about
/// each window done.
///
/// Errors: a server not ready within 30 s, reading the text, the two servers tokenizing it
/// differently, a window longer than the baseline's `max_model_len`, [`super::text::windows`]'s
/// (too short a text or window), `score_from` past the window, and any window's [`score`] or
/// [`score_window`].
pub async fn evaluate_api(
    run: &ApiRun<'_>,
    progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<ApiQualityReport> {
    let text = std::fs::read_to_string(run.text)
        .with_context(|| format!("reading {}", run.text.display()))?;
    ensure!(
        run.score_from < run.window,
        "--score-from {} leaves nothing of a {}-token window to score",
        run.score_from,
        run.window
    );
    let baseline = connect(run.baseline, run.baseline_model, run.api_key, CONNECT_WAIT).await?;
    let candidate = connect(
        run.candidate,
        run.candidate_model,
        run.api_key,
        CONNECT_WAIT,
    )
    .await?;
    let (ids, max_len) = tokenize(&baseline, &text, false).await?;
    let (candidate_ids, _) = tokenize(&candidate, &text, false).await?;
    ensure!(
        ids == candidate_ids,
        "the servers tokenize the text differently ({} and {} tokens): top-1 agreement needs \
         one tokenizer",
        ids.len(),
        candidate_ids.len()
    );
    if let Some(context) = max_len {
        ensure!(
            run.window <= context,
            "a window of {} tokens is longer than the baseline's max_model_len of {context}",
            run.window
        );
    }
    let bos = server_bos(&baseline).await?;
    let mut all = run.layout.cut(&ids, run.window, bos)?;
    if let Some(max) = run.max_windows {
        all.truncate(max.max(1));
    }

    let mut tally = QualityTally::new();
    let mut by_id = true;
    let started = Instant::now();
    for (done, window) in all.iter().enumerate() {
        let (b, c) = tokio::try_join!(
            score(&baseline, window, run.top_logprobs),
            score(&candidate, window, run.top_logprobs)
        )?;
        by_id &= b.by_id() && c.by_id();
        score_window(&mut tally, run.score_from, &b, &c)
            .with_context(|| format!("window {}", done + 1))?;
        progress(Progress {
            done: done + 1,
            total: all.len(),
            elapsed_s: started.elapsed().as_secs_f64(),
        });
    }
    let summary = tally
        .summary()
        .context("no position was scored (windows of fewer than 2 tokens?)")?;
    Ok(ApiQualityReport {
        baseline: baseline.base.clone(),
        baseline_model: baseline.model.clone(),
        candidate: candidate.base.clone(),
        candidate_model: candidate.model.clone(),
        top1_by_id: by_id,
        text: run.text.display().to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo answer as this router writes it (`return_tokens_as_token_ids`).
    fn answer(tokens: &[&str], logprobs: &[Option<f64>], tops: &[Option<Value>]) -> Value {
        json!({"choices": [{"index": 0, "logprobs": {
            "tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops,
            "text_offset": vec![0; tokens.len()]}}]})
    }

    #[test]
    fn token_names_parse_ids_and_texts() {
        assert_eq!(TokenName::parse("token_id:42"), TokenName::Id(42));
        assert_eq!(TokenName::parse(" the"), TokenName::Text(" the".into()));
        assert_eq!(
            TokenName::parse("token_id:x"),
            TokenName::Text("token_id:x".into())
        );
    }

    #[test]
    fn parses_an_echo_and_drops_generated_tokens() {
        let a = answer(
            &["token_id:5", "token_id:7", "token_id:9"],
            &[None, Some(-1.5), Some(-0.25)],
            &[
                None,
                Some(json!({"token_id:7": -1.5, "token_id:3": -0.5})),
                Some(json!({"token_id:8": -0.1})),
            ],
        );
        let s = parse_echo(&a, 2).unwrap();
        assert_eq!(s.logprobs, [None, Some(-1.5)]);
        assert_eq!(s.top1, [None, Some(TokenName::Id(3))]);
        assert_eq!(s.tokens, [TokenName::Id(5), TokenName::Id(7)]);
        assert!(s.by_id());
        // Too few entries, or no logprobs at all, are errors naming the field.
        let e = parse_echo(&a, 4).unwrap_err().to_string();
        assert!(e.contains("tokens has 3 entries"), "{e}");
        let e = parse_echo(&json!({"choices": [{}]}), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("logprobs.tokens"), "{e}");
    }

    #[test]
    fn top1_ties_go_to_the_lower_id_and_texts_are_kept() {
        let tied = json!({"token_id:9": -0.5, "token_id:4": -0.5, "token_id:6": -2.0});
        assert_eq!(
            most_likely(tied.as_object().unwrap()),
            Some(TokenName::Id(4))
        );
        let texts = json!({" a": -3.0, " b": -0.5});
        assert_eq!(
            most_likely(texts.as_object().unwrap()),
            Some(TokenName::Text(" b".into()))
        );
        let a = answer(&[" x", " y"], &[None, Some(-0.5)], &[None, Some(texts)]);
        assert!(!parse_echo(&a, 2).unwrap().by_id());
    }

    #[test]
    fn windows_score_from_token_one_on() {
        let side = |lps: [f64; 3], tops: [u32; 3]| WindowScores {
            logprobs: std::iter::once(None)
                .chain(lps.iter().map(|&l| Some(l)))
                .collect(),
            top1: std::iter::once(None)
                .chain(tops.iter().map(|&t| Some(TokenName::Id(t))))
                .collect(),
            tokens: (0..4).map(TokenName::Id).collect(),
        };
        let b = side([-1.0, -2.0, -3.0], [1, 2, 3]);
        let c = side([-1.0, -1.0, -1.0], [1, 5, 3]);
        let mut t = QualityTally::new();
        score_window(&mut t, 0, &b, &c).unwrap();
        let s = t.summary().unwrap();
        assert_eq!(s.scored, 3);
        assert!((s.mean_nll_baseline - 2.0).abs() < 1e-12);
        assert!((s.perplexity_candidate - 1f64.exp()).abs() < 1e-12);
        assert_eq!(s.top1_agree, 2);
        assert_eq!(s.kl_mean, None);
        // `score_from` 2 scores tokens 2 and 3 only.
        let mut t = QualityTally::new();
        score_window(&mut t, 2, &b, &c).unwrap();
        assert_eq!(t.summary().unwrap().scored, 2);
        // A scored token without a log-probability is an error.
        let mut broken = c.clone();
        broken.logprobs[2] = None;
        assert!(score_window(&mut QualityTally::new(), 0, &b, &broken).is_err());
    }
}
