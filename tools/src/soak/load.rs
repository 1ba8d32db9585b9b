//! The soak's load: closed-loop clients, each drawing its next request from a seeded mix and
//! recording how it ended ([`Record`]).
//!
//! The mix (per request): the gRPC `Generate` stream or the HTTP front's `/v1/completions` (half
//! each), at a random router; 35 % greedy on one of the reference prompts (`ignore_eos`,
//! [`GREEDY_NEW`] tokens, checked against its solo output: token ids on gRPC, text on HTTP, a
//! prefix when the request did not complete), 10 % JSON-schema constrained (checked when it ends
//! by the constraint, not by length), the rest seeded sampling (temperature 0.8, top-p 0.95);
//! HTTP requests stream 60 % of the time and ask for `n` = 2 or 3 choices 20 % of the time; 25 %
//! of streams are cancelled by the client after a random number of tokens (about 20 % of all).
//!
//! Every wait (the call, each message, a non-streamed body) is limited to the hang limit: a
//! request that gets neither its end nor an error status within it is recorded as hung.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use inference_proto::public::text_generation_client::TextGenerationClient;
use inference_proto::public::{FinishReason, GenerateRequest};
use inference_proto::status::code_name;
use serde::Serialize;
use serde_json::{json, Value};
use tonic::transport::Channel;

use crate::bench::constraint::{ConstraintSpec, OutputCheck};
use crate::bench::openai::next_sse_data;
use crate::bench::rng::SplitMix64;

/// New tokens of every greedy request (and of its solo reference).
pub const GREEDY_NEW: u32 = 32;

/// A prompt and its token count.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// The text sent.
    pub text: String,
    /// Its tokens (the router's count).
    pub tokens: usize,
}

/// A greedy prompt's solo output (on the idle pool, before any fault).
#[derive(Debug, Clone)]
pub struct Reference {
    /// Its token ids.
    pub ids: Vec<u32>,
    /// Its text.
    pub text: String,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It ran to its end.
    Completed,
    /// The client cancelled it mid-stream (as planned).
    Cancelled,
    /// An error status (`code`).
    Failed,
    /// No answer within the hang limit.
    Hung,
}

/// Which part of the schedule sent a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tag {
    /// The steady load.
    Normal,
    /// The 5x burst.
    Burst,
    /// The client that stops reading its stream.
    Stuck,
    /// Greedy streams sent just before a worker fault (see [`Load::probes`]).
    Probe,
}

/// One request's record.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// `grpc` or `http`.
    pub front: &'static str,
    /// The router's index.
    pub router: usize,
    /// Who sent it.
    pub tag: Tag,
    /// Seconds from the load's start to sending, and to its end.
    pub sent_s: f64,
    /// See `sent_s`.
    pub end_s: f64,
    /// How it ended.
    pub outcome: Outcome,
    /// The error status (`UNAVAILABLE`, `HTTP 503`, `HTTP stream: unavailable`, ...).
    pub code: Option<String>,
    /// Prompt tokens, `max_new_tokens`, choices, streamed or not.
    pub prompt_tokens: usize,
    /// See `prompt_tokens`.
    pub max_new: u32,
    /// See `prompt_tokens`.
    pub n: u32,
    /// See `prompt_tokens`.
    pub stream: bool,
    /// Tokens received (text events on HTTP).
    pub tokens: usize,
    /// The router's failover count (gRPC usage).
    pub failovers: u32,
    /// Greedy: whether the output equals (or, unfinished, is a prefix of) the solo output.
    pub greedy_match: Option<bool>,
    /// Constrained and ended by the constraint: whether every choice satisfies the schema.
    pub valid: Option<bool>,
}

/// One request to send.
#[derive(Debug, Clone)]
pub struct Spec {
    http: bool,
    router: usize,
    prompt: usize,
    greedy: bool,
    max_new: u32,
    temperature: f32,
    seed: u64,
    ignore_eos: bool,
    stream: bool,
    n: u32,
    constrained: bool,
    cancel_after: Option<usize>,
    stuck: Option<Duration>,
    tag: Tag,
}

/// What the clients share: where to send, what, and the records.
pub struct Load {
    /// gRPC clients, one per router.
    pub grpc: Vec<TextGenerationClient<Channel>>,
    /// HTTP front base URLs, one per router.
    pub http: Vec<String>,
    client: reqwest::Client,
    /// The reference prompts first (index = reference), then the pool.
    pub prompts: Vec<Prompt>,
    /// The solo outputs of the reference prompts.
    pub refs: Vec<Reference>,
    constraint: ConstraintSpec,
    check: OutputCheck,
    hang: Duration,
    /// When the load started.
    pub start: Instant,
    /// Every ended request.
    pub records: Mutex<Vec<Record>>,
    /// Requests sent and not yet ended.
    pub in_flight: AtomicUsize,
    /// Set to stop every client after its current request.
    pub stop: AtomicBool,
}

/// The JSON schema of the constrained requests.
fn schema() -> Value {
    json!({"type": "object", "additionalProperties": false, "required": ["name", "age"],
           "properties": {"name": {"type": "string", "maxLength": 12},
                          "age": {"type": "integer", "minimum": 0, "maximum": 120}}})
}

impl Load {
    /// The load over `routers` (gRPC channel and HTTP base URL of each), with `prompts` (the
    /// reference prompts first) and their solo outputs `refs`.
    pub fn new(
        routers: Vec<(Channel, String)>,
        prompts: Vec<Prompt>,
        refs: Vec<Reference>,
        hang: Duration,
    ) -> anyhow::Result<Load> {
        let constraint = ConstraintSpec::JsonSchema {
            path: "soak".into(),
            schema: schema(),
        };
        let check = OutputCheck::new(&constraint)?;
        let (grpc, http) = routers
            .into_iter()
            .map(|(c, h)| (TextGenerationClient::new(c), h))
            .unzip();
        Ok(Load {
            grpc,
            http,
            client: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .build()?,
            prompts,
            refs,
            constraint,
            check,
            hang,
            start: Instant::now(),
            records: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        })
    }

    /// Seconds since the load started.
    pub fn now_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Draws the next request of the mix.
    fn draw(&self, rng: &mut SplitMix64, tag: Tag) -> Spec {
        let http = rng.below(2) == 1;
        let router = rng.below(self.grpc.len() as u64) as usize;
        let pool = self.refs.len()..self.prompts.len();
        let roll = rng.below(100);
        let greedy = roll < 35;
        let constrained = (35..45).contains(&roll);
        let (prompt, max_new) = if greedy {
            (rng.below(self.refs.len() as u64) as usize, GREEDY_NEW)
        } else {
            let p = rng.between(pool.start as u64, pool.end as u64 - 1) as usize;
            (
                p,
                if constrained {
                    96
                } else {
                    rng.between(8, 64) as u32
                },
            )
        };
        let stream = !http || rng.below(100) < 60;
        let n = if http && rng.below(100) < 20 {
            rng.between(2, 3) as u32
        } else {
            1
        };
        let cancel_after = (stream && rng.below(100) < 25)
            .then(|| rng.between(1, (max_new as u64 / 2).max(2)) as usize);
        Spec {
            http,
            router,
            prompt,
            greedy,
            max_new,
            temperature: if greedy {
                0.0
            } else if constrained {
                0.7
            } else {
                0.8
            },
            // OpenAI's `seed` is an i64.
            seed: rng.next_u64() >> 1,
            ignore_eos: greedy || (!constrained && rng.below(2) == 0),
            stream,
            n,
            constrained,
            cancel_after,
            stuck: None,
            tag,
        }
    }

    /// One closed-loop client: requests from the mix (seeded by `seed`) until `until` or
    /// [`Load::stop`], with a short pause between them.
    pub async fn client(self: Arc<Self>, seed: u64, until: Instant, tag: Tag) {
        let mut rng = SplitMix64::new(seed);
        while Instant::now() < until && !self.stop.load(Ordering::Relaxed) {
            let spec = self.draw(&mut rng, tag);
            self.send(spec).await;
            tokio::time::sleep(Duration::from_millis(rng.between(50, 400))).await;
        }
    }

    /// Failover probes: `n` greedy gRPC streams on the shorter reference prompts, spread over
    /// the routers, sent just before a worker fault so that some are on the faulted worker.
    pub async fn probes(self: Arc<Self>, n: usize, seed: u64) {
        let mut rng = SplitMix64::new(seed);
        let specs: Vec<Spec> = (0..n)
            .map(|i| {
                let mut spec = self.draw(&mut rng, Tag::Probe);
                (spec.http, spec.router, spec.greedy) = (false, i % self.grpc.len(), true);
                spec.prompt = rng.below(3.min(self.refs.len() as u64)) as usize;
                (spec.temperature, spec.max_new, spec.ignore_eos) = (0.0, GREEDY_NEW, true);
                (spec.constrained, spec.cancel_after, spec.n) = (false, None, 1);
                spec
            })
            .collect();
        futures::future::join_all(specs.into_iter().map(|s| self.send(s))).await;
    }

    /// The client that stops reading: a long stream on each front of router 0 (the router
    /// restart hits the last one), not read for `hold` after its first tokens, then read to its
    /// end.
    pub async fn stuck(self: Arc<Self>, hold: Duration, seed: u64) {
        let mut rng = SplitMix64::new(seed);
        let mut specs = Vec::new();
        for http in [false, true] {
            let mut spec = self.draw(&mut rng, Tag::Stuck);
            spec.http = http;
            spec.router = 0;
            spec.prompt = self.refs.len();
            (spec.greedy, spec.constrained, spec.ignore_eos) = (false, false, true);
            (spec.temperature, spec.max_new, spec.n) = (0.8, 1024, 1);
            (spec.stream, spec.cancel_after, spec.stuck) = (true, None, Some(hold));
            specs.push(spec);
        }
        futures::future::join_all(specs.into_iter().map(|s| self.send(s))).await;
    }

    /// Sends `spec`, follows it to its end and records it.
    async fn send(self: &Arc<Self>, spec: Spec) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let sent_s = self.now_s();
        let got = if spec.http {
            self.follow_http(&spec).await
        } else {
            self.follow_grpc(&spec).await
        };
        let reference = spec.greedy.then(|| &self.refs[spec.prompt]);
        let greedy_match = reference.map(|r| {
            let whole = got.outcome == Outcome::Completed;
            let fits = |have: &[u32], want: &[u32]| {
                if whole {
                    have == want
                } else {
                    want.starts_with(have)
                }
            };
            match &got.ids {
                Some(ids) => fits(ids, &r.ids),
                None => got.texts.iter().all(|t| {
                    if whole {
                        *t == r.text
                    } else {
                        r.text.starts_with(t.as_str())
                    }
                }),
            }
        });
        let by_constraint = got.outcome == Outcome::Completed
            && !got
                .finish
                .iter()
                .any(|f| f == "length" || f == "MAX_NEW_TOKENS");
        let valid = (spec.constrained && by_constraint)
            .then(|| got.texts.iter().all(|t| self.check.accepts(t)));
        let record = Record {
            front: if spec.http { "http" } else { "grpc" },
            router: spec.router,
            tag: spec.tag,
            sent_s,
            end_s: self.now_s(),
            outcome: got.outcome,
            code: got.code,
            prompt_tokens: self.prompts[spec.prompt].tokens,
            max_new: spec.max_new,
            n: spec.n,
            stream: spec.stream,
            tokens: got.tokens,
            failovers: got.failovers,
            greedy_match,
            valid,
        };
        self.records.lock().expect("records").push(record);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// A `Generate` call on the router's gRPC front.
    async fn follow_grpc(&self, spec: &Spec) -> Got {
        let request = GenerateRequest {
            prompt: self.prompts[spec.prompt].text.clone(),
            max_new_tokens: Some(spec.max_new),
            temperature: spec.temperature,
            top_p: (spec.temperature > 0.0).then_some(0.95),
            seed: Some(spec.seed),
            ignore_eos: spec.ignore_eos,
            constraint: spec.constrained.then(|| self.constraint.to_proto()),
            ..Default::default()
        };
        let mut got = Got::new(1, true);
        let mut client = self.grpc[spec.router].clone();
        let mut stream = match tokio::time::timeout(self.hang, client.generate(request)).await {
            Err(_) => return got.end(Outcome::Hung, None),
            Ok(Err(status)) => return got.end(Outcome::Failed, Some(code_name(status.code()))),
            Ok(Ok(response)) => response.into_inner(),
        };
        let mut hold = spec.stuck;
        loop {
            if got.tokens > 0 {
                if let Some(hold) = hold.take() {
                    tokio::time::sleep(hold).await;
                }
            }
            let message = match tokio::time::timeout(self.hang, stream.message()).await {
                Err(_) => return got.end(Outcome::Hung, None),
                Ok(Err(status)) => return got.end(Outcome::Failed, Some(code_name(status.code()))),
                Ok(Ok(None)) => break,
                Ok(Ok(Some(message))) => message,
            };
            got.tokens += message.tokens.len();
            got.texts[0].push_str(&message.text);
            if let Some(ids) = &mut got.ids {
                ids.extend(message.tokens.iter().map(|t| t.id));
            }
            if let Some(usage) = message.usage {
                got.failovers = usage.failovers;
                let reason = FinishReason::try_from(message.finish_reason)
                    .map_or("UNKNOWN", |r| r.as_str_name());
                got.finish[0] = reason.to_string();
            } else if spec.cancel_after.is_some_and(|k| got.tokens >= k) {
                return got.end(Outcome::Cancelled, None);
            }
        }
        if got.finish[0].is_empty() {
            return got.end(Outcome::Failed, Some("INTERNAL (no final message)"));
        }
        got.end(Outcome::Completed, None)
    }

    /// A `POST /v1/completions` on the router's HTTP front.
    async fn follow_http(&self, spec: &Spec) -> Got {
        let mut body = json!({
            "prompt": self.prompts[spec.prompt].text, "max_tokens": spec.max_new,
            "temperature": spec.temperature, "seed": spec.seed, "ignore_eos": spec.ignore_eos,
            "n": spec.n, "stream": spec.stream,
        });
        if spec.temperature > 0.0 {
            body["top_p"] = json!(0.95);
        }
        if spec.stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        if spec.constrained {
            self.constraint.add_to_openai_body(&mut body);
        }
        let mut got = Got::new(spec.n as usize, false);
        let url = format!("{}/v1/completions", self.http[spec.router]);
        let post = self.client.post(url).json(&body).send();
        let response = match tokio::time::timeout(self.hang, post).await {
            Err(_) => return got.end(Outcome::Hung, None),
            Ok(Err(_)) => return got.end(Outcome::Failed, Some("HTTP transport")),
            Ok(Ok(r)) if !r.status().is_success() => {
                let status = r.status().as_u16();
                let answer = tokio::time::timeout(self.hang, r.json::<Value>()).await;
                let answer = answer.ok().and_then(Result::ok).unwrap_or_default();
                let code = answer["error"]["code"].as_str().unwrap_or("?");
                return got.end_owned(Outcome::Failed, Some(format!("HTTP {status} {code}")));
            }
            Ok(Ok(r)) => r,
        };
        if !spec.stream {
            let answer = match tokio::time::timeout(self.hang, response.json::<Value>()).await {
                Err(_) => return got.end(Outcome::Hung, None),
                Ok(Err(_)) => return got.end(Outcome::Failed, Some("HTTP transport")),
                Ok(Ok(answer)) => answer,
            };
            for choice in answer["choices"].as_array().into_iter().flatten() {
                got.choice(choice);
            }
            got.tokens = answer["usage"]["completion_tokens"].as_u64().unwrap_or(0) as usize;
            return got.end(Outcome::Completed, None);
        }
        let mut events = response.bytes_stream();
        let mut buffer = Vec::new();
        let mut hold = spec.stuck;
        loop {
            if got.tokens > 0 {
                if let Some(hold) = hold.take() {
                    tokio::time::sleep(hold).await;
                }
            }
            let bytes = match tokio::time::timeout(self.hang, events.next()).await {
                Err(_) => return got.end(Outcome::Hung, None),
                Ok(None) => return got.end(Outcome::Failed, Some("HTTP stream cut (no [DONE])")),
                Ok(Some(Err(_))) => return got.end(Outcome::Failed, Some("HTTP transport")),
                Ok(Some(Ok(bytes))) => bytes,
            };
            buffer.extend_from_slice(&bytes);
            while let Some(data) = next_sse_data(&mut buffer) {
                if data == "[DONE]" {
                    return got.end(Outcome::Completed, None);
                }
                let chunk: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                if let Some(error) = chunk.get("error") {
                    let code = error["code"].as_str().unwrap_or("unknown");
                    return got.end_owned(Outcome::Failed, Some(format!("HTTP stream: {code}")));
                }
                for choice in chunk["choices"].as_array().into_iter().flatten() {
                    got.choice(choice);
                }
                if spec.cancel_after.is_some_and(|k| got.tokens >= k) {
                    return got.end(Outcome::Cancelled, None);
                }
            }
        }
    }
}

/// What a request received.
struct Got {
    outcome: Outcome,
    code: Option<String>,
    /// Each choice's text.
    texts: Vec<String>,
    /// Token ids (gRPC).
    ids: Option<Vec<u32>>,
    /// Each choice's finish reason (empty until it has one).
    finish: Vec<String>,
    tokens: usize,
    failovers: u32,
}

impl Got {
    fn new(n: usize, ids: bool) -> Got {
        Got {
            outcome: Outcome::Failed,
            code: None,
            texts: vec![String::new(); n],
            ids: ids.then(Vec::new),
            finish: vec![String::new(); n],
            tokens: 0,
            failovers: 0,
        }
    }

    /// Adds an HTTP choice object (streamed chunk or whole): its text and finish reason.
    fn choice(&mut self, choice: &Value) {
        let index = choice["index"].as_u64().unwrap_or(0) as usize;
        let Some(text) = self.texts.get_mut(index) else {
            return;
        };
        if let Some(t) = choice["text"].as_str().filter(|t| !t.is_empty()) {
            text.push_str(t);
            self.tokens += 1;
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish[index] = reason.to_string();
        }
    }

    fn end(self, outcome: Outcome, code: Option<&str>) -> Got {
        self.end_owned(outcome, code.map(str::to_string))
    }

    fn end_owned(mut self, outcome: Outcome, code: Option<String>) -> Got {
        self.outcome = outcome;
        self.code = code.or_else(|| (outcome == Outcome::Hung).then(|| "HUNG".to_string()));
        self
    }
}
