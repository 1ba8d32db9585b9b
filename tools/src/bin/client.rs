//! `client --router 127.0.0.1:PORT "prompt"`: calls `Generate` and prints the text as it arrives,
//! then the finish reason, token counts, time to first token and tokens/s on stderr. A prompt of
//! `-` is read from standard input (for prompts too long for a command line), less one final line
//! break. `--json-schema FILE`, `--json-object`, `--regex REGEX`, `--lark FILE` or `--choice TEXT`
//! (repeatable) constrain the output (structured output). `--tls-ca PATH` (and `--tls-server-name`)
//! call a router that serves TLS; `--api-key` (or `INFERENCE_API_KEY`) one that needs a key.
//! `--prompt-logprobs N` scores the prompt's own tokens (`GenerateRequest.prompt_logprobs`) and
//! prints them first, as one JSON line on stdout: `{"prompt_tokens": [{"id", "text", "logprob",
//! "top_logprobs": [{"id", "text", "logprob"}]}]}` (natural logs; the first token's `logprob` is
//! `null`), then the generated text as usual.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use inference_proto::public::{
    constraint::Kind, text_generation_client::TextGenerationClient, ChatMessage, ChoiceList,
    Constraint, FinishReason, GenerateRequest, ModelInfoRequest, PromptToken,
};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Adds `authorization: Bearer KEY` to every call when a key is given.
#[derive(Clone)]
struct BearerKey(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for BearerKey {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

type Client = TextGenerationClient<InterceptedService<Channel, BearerKey>>;

#[derive(Debug, Parser)]
#[command(
    name = "client",
    version = build_info::VERSION,
    about = "Streams one generation from the router"
)]
struct Args {
    /// Router address (HOST:PORT).
    #[arg(long, default_value = "127.0.0.1:50051")]
    router: String,
    /// Send the prompt as one user chat message (rendered with the model's chat template).
    #[arg(long)]
    chat: bool,
    /// Tokens to generate at most.
    #[arg(long)]
    max_new_tokens: Option<u32>,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Top-k (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: u32,
    /// Top-p in (0, 1].
    #[arg(long)]
    top_p: Option<f32>,
    /// Sampling seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Keep going past EOS.
    #[arg(long)]
    ignore_eos: bool,
    /// Tokenize a raw prompt as plain text: special-token text such as `<|im_start|>` in it stays
    /// text (`prompt_as_plain_text`; chat content is always plain text).
    #[arg(long)]
    plain_text: bool,
    /// Structured output: the text is one JSON value valid against the JSON Schema in this file.
    #[arg(long, value_name = "FILE", group = "constraint")]
    json_schema: Option<std::path::PathBuf>,
    /// Structured output: the text is one JSON object.
    #[arg(long, group = "constraint")]
    json_object: bool,
    /// Structured output: the whole text matches this regular expression.
    #[arg(long, value_name = "REGEX", group = "constraint")]
    regex: Option<String>,
    /// Structured output: the text is one sentence of the Lark grammar in this file (rule `start`).
    #[arg(long, value_name = "FILE", group = "constraint")]
    lark: Option<std::path::PathBuf>,
    /// Structured output: the text is exactly one of these strings (repeatable).
    #[arg(long, value_name = "TEXT", group = "constraint")]
    choice: Vec<String>,
    /// Score the prompt's tokens with this many alternatives each (0 to 20) and print them as one
    /// JSON line before the text (see the module docs).
    #[arg(long, value_name = "N")]
    prompt_logprobs: Option<u32>,
    /// Wait up to this many seconds for the router to have a ready worker (polling `ModelInfo`).
    #[arg(long, default_value_t = 0)]
    wait_ready_secs: u64,
    /// API key of a router that requires one (sent as `authorization: Bearer KEY`).
    #[arg(long, env = "INFERENCE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// CA certificate file (PEM) of a router that serves TLS: connect over TLS, trusting only it.
    #[arg(long, value_name = "PATH")]
    tls_ca: Option<String>,
    /// The name the router's certificate must carry (with `--tls-ca`); default: the host of
    /// `--router`.
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    tls_server_name: Option<String>,
    /// The prompt; `-` reads it from standard input (one final line break dropped).
    prompt: String,
}

/// The structured-output constraint the flags ask for (files read here).
fn constraint(args: &Args) -> anyhow::Result<Option<Constraint>> {
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))
    };
    let kind = if let Some(path) = &args.json_schema {
        Kind::JsonSchema(read(path)?)
    } else if args.json_object {
        Kind::JsonObject(true)
    } else if let Some(regex) = &args.regex {
        Kind::Regex(regex.clone())
    } else if let Some(path) = &args.lark {
        Kind::Lark(read(path)?)
    } else if !args.choice.is_empty() {
        Kind::Choice(ChoiceList {
            choices: args.choice.clone(),
        })
    } else {
        return Ok(None);
    };
    Ok(Some(Constraint { kind: Some(kind) }))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("client: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(mut args: Args) -> anyhow::Result<()> {
    if args.prompt == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| anyhow::anyhow!("reading the prompt from standard input: {e}"))?;
        // `echo "..." | client -` should send what was echoed, not its line break.
        let trimmed = text.strip_suffix('\n').unwrap_or(&text);
        args.prompt = trimmed.strip_suffix('\r').unwrap_or(trimmed).to_string();
    }
    // Accept HOST:PORT and http(s)://HOST:PORT; connect lazily so `--wait-ready-secs` also covers
    // a router that is not listening yet.
    let address = args
        .router
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .to_string();
    let tls = tls_certs::ClientTls::load(
        args.tls_ca.as_deref().unwrap_or(""),
        args.tls_server_name.as_deref().unwrap_or(""),
    )?;
    let mut endpoint =
        tonic::transport::Endpoint::from_shared(tls_certs::ClientTls::uri(tls.as_ref(), &address))
            .map_err(|e| anyhow::anyhow!("--router {address:?} is not HOST:PORT: {e}"))?;
    if let Some(tls) = &tls {
        endpoint = endpoint.tls_config(tls.tonic_config())?;
    }
    let channel = endpoint.connect_lazy();
    let key =
        match &args.api_key {
            Some(key) => Some(format!("Bearer {}", key.trim()).parse().map_err(|_| {
                anyhow::anyhow!("--api-key holds characters a header cannot carry")
            })?),
            None => None,
        };
    let mut client = TextGenerationClient::with_interceptor(channel, BearerKey(key));
    wait_ready(&mut client, Duration::from_secs(args.wait_ready_secs))
        .await
        .map_err(|e| anyhow::anyhow!("router at {address}: {e:#}"))?;
    let constraint = constraint(&args)?;
    let (prompt, messages) = if args.chat {
        let user = ChatMessage {
            role: "user".into(),
            content: args.prompt,
            ..Default::default()
        };
        (String::new(), vec![user])
    } else {
        (args.prompt, Vec::new())
    };
    let request = GenerateRequest {
        constraint,
        prompt,
        messages,
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
        stop: args.stop,
        ignore_eos: args.ignore_eos,
        prompt_as_plain_text: args.plain_text,
        prompt_logprobs: args.prompt_logprobs,
        ..Default::default()
    };
    let started = Instant::now();
    let mut stream = client.generate(request).await?.into_inner();
    let mut stdout = std::io::stdout();
    while let Some(message) = stream.message().await? {
        if !message.prompt_tokens.is_empty() {
            println!("{}", prompt_tokens_json(&message.prompt_tokens));
        }
        print!("{}", message.text);
        stdout.flush()?;
        if let Some(usage) = message.usage {
            let reason = FinishReason::try_from(message.finish_reason)
                .map(|r| r.as_str_name())
                .unwrap_or("UNKNOWN");
            let decode_s = (usage.total_ms - usage.time_to_first_token_ms) / 1e3;
            let rate = if usage.generated_tokens > 1 && decode_s > 0.0 {
                (usage.generated_tokens - 1) as f64 / decode_s
            } else {
                0.0
            };
            println!();
            eprintln!(
                "finish_reason={reason}{} prompt_tokens={} generated_tokens={} ttft_ms={:.1} \
                 total_ms={:.1} decode_tokens_per_s={rate:.1} (client wall {:.1} ms)",
                if message.stop_sequence.is_empty() {
                    String::new()
                } else {
                    format!(" stop_sequence={:?}", message.stop_sequence)
                },
                usage.prompt_tokens,
                usage.generated_tokens,
                usage.time_to_first_token_ms,
                usage.total_ms,
                started.elapsed().as_secs_f64() * 1e3,
            );
        }
    }
    Ok(())
}

/// The scored prompt tokens as one JSON object (see the module docs).
fn prompt_tokens_json(tokens: &[PromptToken]) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = tokens
        .iter()
        .map(|t| {
            let top: Vec<serde_json::Value> = t
                .top_logprobs
                .iter()
                .map(|a| serde_json::json!({"id": a.id, "text": a.text, "logprob": a.logprob}))
                .collect();
            serde_json::json!({"id": t.id, "text": t.text, "logprob": t.logprob,
                               "top_logprobs": top})
        })
        .collect();
    serde_json::json!({ "prompt_tokens": entries })
}

/// Polls `ModelInfo` until the router reports a ready worker or `budget` has passed.
async fn wait_ready(client: &mut Client, budget: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + budget;
    loop {
        let status = match client.model_info(ModelInfoRequest::default()).await {
            Ok(info) if info.get_ref().ready_workers > 0 => return Ok(()),
            // Reachable: without a wait budget, let Generate report why it cannot serve.
            Ok(_) if budget.is_zero() => return Ok(()),
            Ok(_) => "no ready worker".to_string(),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                anyhow::bail!(
                    "this address does not serve inference.v1.TextGeneration (a worker's port?)"
                )
            }
            Err(status) => status.message().to_string(),
        };
        if budget.is_zero() {
            anyhow::bail!("unreachable: {status}");
        }
        if Instant::now() >= deadline {
            anyhow::bail!("not ready after {budget:?}: {status}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
