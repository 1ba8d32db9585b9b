//! Where the requests go ([`Target`]): connecting to a router, a worker (`--worker`) or an OpenAI
//! server (`--openai`), waiting until it is ready and checking the settings against its model.
//!
//! Every setup call (ModelInfo, Tokenize; with `--worker`: Health, Info, opening the stream) has
//! its own 30 s limit. With `--api-key`, every call to a router carries
//! `authorization: Bearer KEY` metadata (and every HTTP call the header, see [`super::openai`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use inference_proto::public::{
    text_generation_client::TextGenerationClient, ModelInfoRequest, ModelInfoResponse,
    TokenizeRequest,
};
use inference_proto::status::code_name;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use super::direct::{self, LocalTokenizer, WorkerStream};
use super::openai::{self, HttpTokenizer, OpenAiServer};
use super::plan::{plan, Planned};
use super::prompt::PromptTokenizer;
use super::BenchArgs;

/// Limit on each setup RPC (ModelInfo, Tokenize).
const SETUP_RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests in flight per HTTP/2 connection at most (servers commonly cap streams per
/// connection at 100-200); more concurrency opens more connections.
const STREAMS_PER_CONNECTION: usize = 100;

/// One connection to the router's public API, with the `authorization` metadata to send.
#[derive(Clone)]
pub struct RouterClient {
    /// The client.
    pub client: TextGenerationClient<Channel>,
    /// `Bearer KEY` with `--api-key`.
    authorization: Option<MetadataValue<Ascii>>,
}

impl RouterClient {
    /// `message` as a request carrying the API key, if any.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        request
    }

    /// `message` as a request carrying `key` (`authorization: Bearer KEY`) in place of the
    /// `--api-key`, when given (`--tenant-mix`; a key that is not visible ASCII is sent as none,
    /// and the router refuses the call).
    pub fn request_with_key<T>(&self, message: T, key: Option<&str>) -> tonic::Request<T> {
        let Some(key) = key else {
            return self.request(message);
        };
        let mut request = tonic::Request::new(message);
        if let Ok(value) = format!("Bearer {key}").parse::<MetadataValue<Ascii>>() {
            request.metadata_mut().insert("authorization", value);
        }
        request
    }
}

/// Where requests go.
#[derive(Clone)]
pub enum Target {
    /// The router's public `Generate`, spread over these connections.
    Router(Vec<RouterClient>),
    /// One worker's `Generate` stream (`--worker`).
    Worker {
        /// The stream.
        stream: WorkerStream,
        /// Sent as `stop_token_ids` unless `--ignore-eos` (the worker's EOS ids, as the router
        /// does).
        eos_token_ids: Vec<u32>,
        /// The model's context (for the finish reason, as the router derives it).
        context_length: u32,
        /// The worker's tokenizer (decodes constrained outputs for their check).
        tokenizer: LocalTokenizer,
    },
    /// An OpenAI-compatible HTTP server (`--openai`).
    OpenAi(OpenAiServer),
}

impl Target {
    /// `"router"`, `"worker"` or `"openai"` (the JSON's `config.mode`).
    pub fn mode(&self) -> &'static str {
        match self {
            Target::Router(_) => "router",
            Target::Worker { .. } => "worker",
            Target::OpenAi(_) => "openai",
        }
    }
}

/// A connected target: the model it serves, every planned request (warmup first) and the number
/// of connections opened.
pub struct Connected {
    /// Where requests go.
    pub target: Target,
    /// The model's name and context (what the target reports of them).
    pub info: ModelInfoResponse,
    /// The warmup requests, then the measured ones.
    pub plans: Vec<Planned>,
    /// HTTP/2 connections (1 with `--worker` and `--openai`).
    pub connections: usize,
}

/// Connects to what `args` name, waits until it is ready, checks the settings and builds the
/// prompts.
///
/// Errors: no connection, not ready within `--wait-ready-secs` (a refused API key shows here),
/// settings that do not fit the model, or prompts that cannot be built.
pub async fn connect(args: &BenchArgs) -> anyhow::Result<Connected> {
    match (&args.worker, &args.openai) {
        (Some(address), _) => connect_worker(args, address).await,
        (None, Some(url)) => connect_openai(args, url).await,
        (None, None) => connect_router(args).await,
    }
}

/// `--worker`: connects to the worker, checks the settings against its context and builds the
/// prompts with its tokenizer.
async fn connect_worker(args: &BenchArgs, address: &str) -> anyhow::Result<Connected> {
    let worker = direct::connect(address, Duration::from_secs(args.wait_ready_secs)).await?;
    let info = ModelInfoResponse {
        model_name: worker.info.model_name.clone(),
        max_context_tokens: worker.info.context_length,
        ..Default::default()
    };
    check_fits(args, &info)?;
    let tokenizer = worker.tokenizer.clone();
    let plans = plan(args, tokenizer.clone(), "local tokenizations", || {
        tokenizer.calls.load(Ordering::Relaxed)
    })
    .await?;
    let target = Target::Worker {
        stream: worker.stream,
        eos_token_ids: worker.info.eos_token_ids.clone(),
        context_length: worker.info.context_length,
        tokenizer: worker.tokenizer,
    };
    Ok(Connected {
        target,
        info,
        plans,
        connections: 1,
    })
}

/// `--openai`: waits for the server to list a model and builds the prompts with its `/tokenize`.
/// The context is not checked here (OpenAI servers do not report it uniformly): a request that
/// does not fit fails with the server's error.
async fn connect_openai(args: &BenchArgs, url: &str) -> anyhow::Result<Connected> {
    let wait = Duration::from_secs(args.wait_ready_secs);
    let server = openai::connect(
        url,
        args.openai_model.as_deref(),
        args.api_key.as_deref(),
        wait,
    )
    .await?;
    let info = ModelInfoResponse {
        model_name: server.model.clone(),
        ..Default::default()
    };
    let tokenizer = HttpTokenizer {
        server: server.clone(),
        calls: Arc::default(),
    };
    let plans = plan(args, tokenizer.clone(), "/tokenize calls", || {
        tokenizer.calls.load(Ordering::Relaxed)
    })
    .await?;
    Ok(Connected {
        target: Target::OpenAi(server),
        info,
        plans,
        connections: 1,
    })
}

/// Connects to the router, waits for a ready worker, checks the settings and builds the prompts
/// with the router's `Tokenize`.
async fn connect_router(args: &BenchArgs) -> anyhow::Result<Connected> {
    let connections = args
        .effective_concurrency()
        .div_ceil(STREAMS_PER_CONNECTION)
        .clamp(1, 16);
    // With `--tenant-mix`, the set-up calls (ModelInfo, Tokenize) go as its first tenant.
    let setup_key = args.api_key.as_ref().or_else(|| {
        args.tenant_mix
            .as_ref()
            .and_then(|mix| mix.tenants.first())
            .map(|t| &t.key)
    });
    let authorization = setup_key
        .map(|key| format!("Bearer {key}").parse::<MetadataValue<Ascii>>())
        .transpose()
        .context("--api-key must be printable ASCII")?;
    let tls = tls_certs::ClientTls::load(
        args.tls_ca.as_deref().unwrap_or(""),
        args.tls_server_name.as_deref().unwrap_or(""),
    )?;
    let mut endpoint = Endpoint::from_shared(tls_certs::ClientTls::uri(tls.as_ref(), &args.router))
        .with_context(|| format!("bad router address {:?}", args.router))?
        .connect_timeout(Duration::from_secs(10));
    if let Some(tls) = &tls {
        endpoint = endpoint.tls_config(tls.tonic_config())?;
    }
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("connecting to the router at {}", args.router))?;
        clients.push(RouterClient {
            client: TextGenerationClient::new(channel),
            authorization: authorization.clone(),
        });
    }
    let info = wait_ready(&clients[0], Duration::from_secs(args.wait_ready_secs)).await?;
    check_fits(args, &info)?;
    let tokenizer = RpcTokenizer {
        client: clients[0].clone(),
        calls: Arc::default(),
    };
    let plans = plan(args, tokenizer.clone(), "Tokenize calls", || {
        tokenizer.calls.load(Ordering::Relaxed)
    })
    .await?;
    Ok(Connected {
        target: Target::Router(clients),
        info,
        plans,
        connections,
    })
}

/// `Tokenize` through the router, with special tokens as `Generate` adds them.
#[derive(Clone)]
pub struct RpcTokenizer {
    client: RouterClient,
    /// Calls made by this tokenizer and its clones.
    calls: Arc<AtomicUsize>,
}

impl RpcTokenizer {
    /// The tokenizer of the router behind `client` (no API key; `bench soak` fits its prompts so).
    pub fn new(client: TextGenerationClient<Channel>) -> RpcTokenizer {
        RpcTokenizer {
            client: RouterClient {
                client,
                authorization: None,
            },
            calls: Arc::default(),
        }
    }
}

impl PromptTokenizer for RpcTokenizer {
    async fn tokenize(&mut self, text: &str) -> anyhow::Result<Vec<u32>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let request = self.client.request(TokenizeRequest {
            text: text.to_string(),
            add_special_tokens: true,
        });
        let mut client = self.client.client.clone();
        let response = tokio::time::timeout(SETUP_RPC_TIMEOUT, client.tokenize(request))
            .await
            .context("Tokenize timed out")?
            .context("Tokenize failed")?;
        Ok(response.into_inner().ids)
    }
}

/// Polls `ModelInfo` until the router reports a ready worker or `budget` has passed.
async fn wait_ready(client: &RouterClient, budget: Duration) -> anyhow::Result<ModelInfoResponse> {
    let deadline = Instant::now() + budget;
    loop {
        let mut grpc = client.client.clone();
        let call = grpc.model_info(client.request(ModelInfoRequest::default()));
        let answer = tokio::time::timeout(SETUP_RPC_TIMEOUT, call).await;
        let why = match answer {
            Ok(Ok(info)) if info.get_ref().ready_workers > 0 => return Ok(info.into_inner()),
            Ok(Ok(_)) => "no ready worker".to_string(),
            Ok(Err(status)) if status.code() == tonic::Code::Unauthenticated => {
                bail!("the router refused the API key: {}", status.message())
            }
            Ok(Err(status)) => format!("{}: {}", code_name(status.code()), status.message()),
            Err(_) => "ModelInfo timed out".to_string(),
        };
        if Instant::now() >= deadline {
            bail!("the router has no ready worker after {budget:?}: {why}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Fails early when a request could not fit the model's context or input limit.
fn check_fits(args: &BenchArgs, info: &ModelInfoResponse) -> anyhow::Result<()> {
    let prompt = args.prompt_tokens_upper();
    let new = args.max_new_tokens_upper() as usize;
    let ctx = info.max_context_tokens as usize;
    if prompt + new > ctx {
        bail!(
            "prompts of up to {prompt} tokens + up to {new} new tokens exceed the model's context \
             of {ctx} tokens"
        );
    }
    if let Some(limits) = &info.limits {
        let max_input = limits.max_input_tokens as usize;
        if max_input > 0 && prompt > max_input {
            bail!(
                "prompts of up to {prompt} tokens exceed the router's input limit of {max_input}"
            );
        }
        if limits.max_new_tokens > 0 && new > limits.max_new_tokens as usize {
            bail!(
                "up to {new} new tokens exceed the router's max_new_tokens limit of {}",
                limits.max_new_tokens
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn context_check() {
        let args = BenchArgs::try_parse_from([
            "bench",
            "--prompt-tokens",
            "100",
            "--prompt-tokens-max",
            "200",
            "--max-new-tokens",
            "50",
        ])
        .unwrap();
        let info = |ctx| ModelInfoResponse {
            max_context_tokens: ctx,
            ..Default::default()
        };
        assert!(check_fits(&args, &info(250)).is_ok());
        assert!(check_fits(&args, &info(249)).is_err());
    }
}
