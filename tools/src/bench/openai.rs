//! `--openai URL`: the same load against an OpenAI-compatible HTTP server (this router's HTTP
//! front, vLLM, llama.cpp's `llama-server`), so the fronts and engines compare under one load.
//!
//! Prompts are fitted with the server's `POST /tokenize` (vLLM and llama-server have it, and so
//! does this router's HTTP front), so each prompt has the same exact token count as through gRPC.
//! Each request is one streamed `POST /v1/completions` (`stream_options.include_usage`, the vLLM
//! extensions `top_k` and `ignore_eos`). TTFT runs from sending the request to the first event
//! with text; each text event counts as one token's arrival for the inter-token gaps (the usage
//! chunk's `completion_tokens` is the generated count). Server-side timings are not reported.
//! With `--api-key` every call carries `Authorization: Bearer KEY`; a structured-output constraint
//! goes in the body ([`super::constraint::ConstraintSpec::add_to_openai_body`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt as _;
use serde_json::{json, Value};

use super::prompt::PromptTokenizer;
use super::report::RequestError;

/// Limit on each setup call (models, tokenize).
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// An OpenAI-compatible server.
#[derive(Debug, Clone)]
pub struct OpenAiServer {
    client: reqwest::Client,
    /// Base URL without `/v1`, e.g. `http://127.0.0.1:8000`.
    pub base: String,
    /// The model name sent in requests.
    pub model: String,
}

/// Connects to the server at `url` (with or without a trailing `/v1`) and waits up to `wait` for
/// `GET /v1/models` to list a model; `model` is the name to send (default: the first listed).
/// With `api_key`, every call sends `Authorization: Bearer KEY`.
///
/// Errors: a URL that is not `http://...`, a key that cannot be a header value, or no model listed
/// in time (a refused key shows as `GET /v1/models answered 401 ...`).
pub async fn connect(
    url: &str,
    model: Option<&str>,
    api_key: Option<&str>,
    wait: Duration,
) -> anyhow::Result<OpenAiServer> {
    let base = url
        .trim_end_matches('/')
        .trim_end_matches("/v1")
        .to_string();
    if !base.starts_with("http://") {
        bail!("--openai takes an http:// URL, got {url:?}");
    }
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = api_key {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
            .context("--api-key must be printable ASCII")?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .default_headers(headers)
        .build()?;
    let deadline = Instant::now() + wait;
    loop {
        let answer = client
            .get(format!("{base}/v1/models"))
            .timeout(SETUP_TIMEOUT)
            .send()
            .await;
        let why = match answer {
            Ok(r) if r.status().is_success() => {
                let listed: Value = r.json().await.context("reading /v1/models")?;
                let first = listed["data"][0]["id"].as_str().map(str::to_string);
                match (model, first) {
                    (Some(model), _) => break Ok(server(client, base, model.to_string())),
                    (None, Some(first)) => break Ok(server(client, base, first)),
                    (None, None) => "no model listed".to_string(),
                }
            }
            Ok(r) => {
                let status = r.status();
                let why = r.text().await.unwrap_or_default();
                if status == reqwest::StatusCode::UNAUTHORIZED {
                    bail!("the server refused the API key: GET /v1/models answered {status} {why}");
                }
                format!("GET /v1/models answered {status} {why}")
            }
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            bail!("the OpenAI server at {base} is not ready after {wait:?}: {why}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl OpenAiServer {
    /// The HTTP client (with the `Authorization` header when an API key was given).
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

fn server(client: reqwest::Client, base: String, model: String) -> OpenAiServer {
    OpenAiServer {
        client,
        base,
        model,
    }
}

/// The server's `POST /tokenize`, with special tokens added as a completions prompt gets them.
#[derive(Clone)]
pub struct HttpTokenizer {
    /// The server.
    pub server: OpenAiServer,
    /// Calls made by this tokenizer and its clones.
    pub calls: Arc<AtomicUsize>,
}

impl PromptTokenizer for HttpTokenizer {
    async fn tokenize(&mut self, text: &str) -> anyhow::Result<Vec<u32>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let s = &self.server;
        // llama-server reads `content` / `add_special`, vLLM `prompt` / `add_special_tokens`.
        let body = json!({"model": s.model, "content": text, "prompt": text,
                          "add_special": true, "add_special_tokens": true});
        let response = s
            .client
            .post(format!("{}/tokenize", s.base))
            .json(&body)
            .timeout(SETUP_TIMEOUT)
            .send()
            .await
            .context("POST /tokenize")?;
        let status = response.status();
        let answer: Value = response.json().await.context("reading /tokenize")?;
        if !status.is_success() {
            bail!("POST /tokenize answered {status}: {answer}");
        }
        serde_json::from_value(answer["tokens"].clone()).context("/tokenize's tokens")
    }
}

/// What one request's event stream delivered.
#[derive(Debug, Default)]
pub struct Followed {
    /// Events with a choice.
    pub messages: u32,
    /// ms from sending to the first event with text.
    pub first_token_ms: Option<f64>,
    /// (ms from sending, tokens) of each event with text.
    pub arrivals: Vec<(f64, usize)>,
    /// Events with text (each counted as one token).
    pub streamed_tokens: u32,
    /// OpenAI's finish reason (`stop`, `length`).
    pub finish_reason: Option<String>,
    /// The usage chunk's `completion_tokens`.
    pub completion_tokens: Option<u32>,
    /// The text of all events, joined.
    pub text: String,
}

/// The request body of one planned request.
#[allow(clippy::too_many_arguments)]
pub fn body(
    model: &str,
    prompt: &str,
    max_tokens: u32,
    temperature: f32,
    top_p: Option<f32>,
    top_k: u32,
    seed: u64,
    ignore_eos: bool,
) -> Value {
    let mut body = json!({
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
        "seed": seed as i64, "ignore_eos": ignore_eos, "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(p) = top_p {
        body["top_p"] = json!(p);
    }
    if top_k > 0 {
        body["top_k"] = json!(top_k);
    }
    body
}

/// Sends `body` to `/v1/completions` and follows its events to `[DONE]`; `on_tokens` sees each
/// event's token count as it arrives.
///
/// Errors: an HTTP error status (its OpenAI error message; 429 reads as `RESOURCE_EXHAUSTED`, 503
/// as `UNAVAILABLE`, 400 as `INVALID_ARGUMENT`, 401 as `UNAUTHENTICATED`), an error event, a broken stream, or a stream that
/// ends without `[DONE]`.
pub async fn follow(
    server: &OpenAiServer,
    body: &Value,
    sent: Instant,
    got: &mut Followed,
    on_tokens: impl Fn(usize),
) -> Result<(), RequestError> {
    let failed = |code: &str, message: String| RequestError {
        code: code.into(),
        message,
    };
    let response = server
        .client
        .post(format!("{}/v1/completions", server.base))
        .json(body)
        .send()
        .await
        .map_err(|e| failed("UNAVAILABLE", e.to_string()))?;
    let status = response.status();
    if !status.is_success() {
        let code = match status.as_u16() {
            400 => "INVALID_ARGUMENT",
            401 => "UNAUTHENTICATED",
            429 => "RESOURCE_EXHAUSTED",
            503 => "UNAVAILABLE",
            501 => "UNIMPLEMENTED",
            _ => "UNKNOWN",
        };
        let text = response.text().await.unwrap_or_default();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or(text);
        return Err(failed(code, format!("HTTP {status}: {message}")));
    }
    let mut stream = response.bytes_stream();
    let mut buffer = Vec::new();
    while let Some(bytes) = stream.next().await {
        let bytes = bytes.map_err(|e| failed("UNAVAILABLE", e.to_string()))?;
        let at = sent.elapsed().as_secs_f64() * 1e3;
        buffer.extend_from_slice(&bytes);
        while let Some(data) = next_sse_data(&mut buffer) {
            if data == "[DONE]" {
                return Ok(());
            }
            let chunk: Value = serde_json::from_str(&data)
                .map_err(|e| failed("INTERNAL", format!("bad event {data:?}: {e}")))?;
            if let Some(error) = chunk.get("error") {
                return Err(failed("INTERNAL", error.to_string()));
            }
            if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
                got.completion_tokens = Some(n as u32);
            }
            let Some(choice) = chunk["choices"].get(0) else {
                continue;
            };
            got.messages += 1;
            if let Some(text) = choice["text"].as_str().filter(|t| !t.is_empty()) {
                got.text.push_str(text);
                got.first_token_ms.get_or_insert(at);
                got.arrivals.push((at, 1));
                got.streamed_tokens += 1;
                on_tokens(1);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                got.finish_reason = Some(reason.to_string());
            }
        }
    }
    Err(failed(
        "INTERNAL",
        "the event stream ended without data: [DONE]".into(),
    ))
}

/// Takes the next complete server-sent event (ended by a blank line) off the front of `buffer`
/// and returns its `data:` payload, trimmed; events without data (comments, keep-alives) are
/// dropped. `None` when no complete event with data is buffered (the rest stays for more bytes).
pub fn next_sse_data(buffer: &mut Vec<u8>) -> Option<String> {
    while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
        let event: Vec<u8> = buffer.drain(..end + 2).collect();
        let event = String::from_utf8_lossy(&event);
        if let Some(data) = event.trim().strip_prefix("data:") {
            return Some(data.trim().to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::next_sse_data;

    #[test]
    fn events_come_out_whole_and_in_order() {
        let mut buffer =
            b": keep-alive\n\ndata: {\"a\":1}\n\ndata:  [DONE] \n\ndata: part".to_vec();
        assert_eq!(next_sse_data(&mut buffer).as_deref(), Some("{\"a\":1}"));
        assert_eq!(next_sse_data(&mut buffer).as_deref(), Some("[DONE]"));
        // An incomplete event stays for the bytes that complete it.
        assert_eq!(next_sse_data(&mut buffer), None);
        buffer.extend_from_slice(b"ial\n\n");
        assert_eq!(next_sse_data(&mut buffer).as_deref(), Some("partial"));
        assert!(buffer.is_empty());
    }
}
