//! `--worker` mode: one worker driven directly over its bidirectional `Generate` stream, the way
//! the router drives it (`router/src/pool/link.rs`), so that the same load measured through a
//! router and directly shows what the router adds.
//!
//! - [`connect`] waits for the worker's `Health` to say ready, fetches its `Info` (the model's
//!   context, EOS ids and tokenizer spec) and opens ONE `Generate` stream that carries every
//!   request of the run, warmup included;
//! - prompts are tokenized locally with the worker's own tokenizer ([`LocalTokenizer`], built from
//!   the `TokenizerSpec` exactly as the router builds it), so the prompt ids are the ones the
//!   router would send for the same prompt text;
//! - a background task reads the worker's step messages, stamps each with its arrival time and
//!   routes each request's tokens and errors to that request ([`Event`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use inference_proto::worker::{
    router_message, worker_client::WorkerClient, worker_message, AddRequest, CancelRequest,
    HealthRequest, InfoRequest, InfoResponse, RouterMessage, TokenOutput,
};
use tokenizer::TextTokenizer;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Endpoint;

use super::prompt::PromptTokenizer;

/// Limit on each setup RPC (Health, Info, opening the stream).
const SETUP_RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// What one request hears from the stream.
#[derive(Debug)]
pub enum Event {
    /// The tokens one step message carried for the request (usually one), and when it arrived.
    Tokens(Instant, Vec<TokenOutput>),
    /// The worker rejected or could not finish the request.
    Failed {
        /// Its gRPC status code (a number the worker sent outside `google.rpc.Code` reads as
        /// `Unknown`).
        code: tonic::Code,
        /// The worker's message.
        message: String,
    },
    /// The stream ended or broke; holds the reason.
    Lost(String),
}

#[derive(Default)]
struct Routes {
    /// Requests in flight, by request id.
    open: HashMap<String, mpsc::UnboundedSender<Event>>,
    /// Why the stream ended, once it has.
    closed: Option<String>,
}

/// Why [`WorkerStream::add`] cannot send a request.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// The stream has ended; the reason it ended.
    #[error("{0}")]
    StreamEnded(String),
    /// A request with this id is already open on the stream.
    #[error("request id {0:?} is already open")]
    AlreadyOpen(String),
    /// The stream's sending half is gone.
    #[error("the stream's sender is closed")]
    SenderClosed,
}

/// The open `Generate` stream of one worker, shared by all requests.
#[derive(Clone)]
pub struct WorkerStream {
    outbound: mpsc::UnboundedSender<RouterMessage>,
    routes: Arc<Mutex<Routes>>,
}

impl WorkerStream {
    /// Registers `add.request_id` and sends `add`; returns the request's events.
    ///
    /// Errors: the stream has ended (the reason), or the id is already open.
    pub fn add(&self, add: AddRequest) -> Result<mpsc::UnboundedReceiver<Event>, AddError> {
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut routes = self.routes.lock().expect("routes lock");
            if let Some(why) = &routes.closed {
                return Err(AddError::StreamEnded(why.clone()));
            }
            if routes.open.contains_key(&add.request_id) {
                return Err(AddError::AlreadyOpen(add.request_id.clone()));
            }
            routes.open.insert(add.request_id.clone(), tx);
        }
        let message = RouterMessage {
            kind: Some(router_message::Kind::Add(add)),
        };
        self.outbound
            .send(message)
            .map_err(|_| AddError::SenderClosed)?;
        Ok(rx)
    }

    /// Forgets `request_id` (it finished or failed); with `cancel`, also tells the worker to drop
    /// it.
    pub fn close(&self, request_id: &str, cancel: bool) {
        self.routes
            .lock()
            .expect("routes lock")
            .open
            .remove(request_id);
        if cancel {
            let _ = self.outbound.send(RouterMessage {
                kind: Some(router_message::Kind::Cancel(CancelRequest {
                    request_id: request_id.to_string(),
                })),
            });
        }
    }
}

/// The worker's tokenizer, used in place of the router's `Tokenize` (special tokens added, as the
/// router encodes a `Generate` prompt).
#[derive(Clone)]
pub struct LocalTokenizer {
    /// The tokenizer built from the worker's `TokenizerSpec`.
    pub tokenizer: Arc<TextTokenizer>,
    /// Calls made by this tokenizer and its clones.
    pub calls: Arc<std::sync::atomic::AtomicUsize>,
}

impl PromptTokenizer for LocalTokenizer {
    async fn tokenize(&mut self, text: &str) -> anyhow::Result<Vec<u32>> {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(self.tokenizer.encode(text, true)?)
    }
}

/// A connected worker.
pub struct Worker {
    /// Its `Info` answer.
    pub info: InfoResponse,
    /// Its tokenizer.
    pub tokenizer: LocalTokenizer,
    /// Its `Generate` stream.
    pub stream: WorkerStream,
}

/// Connects to the worker at `address`, waits up to `wait_ready` for its `Health` to say ready,
/// fetches `Info` and opens the `Generate` stream.
///
/// Errors: bad address, no connection, not ready in time, no tokenizer spec, or the stream does not
/// open.
pub async fn connect(address: &str, wait_ready: Duration) -> anyhow::Result<Worker> {
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .with_context(|| format!("bad worker address {address:?}"))?
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .with_context(|| format!("connecting to the worker at {address}"))?;
    let mut client = WorkerClient::new(channel);
    let deadline = Instant::now() + wait_ready;
    loop {
        let answer = tokio::time::timeout(SETUP_RPC_TIMEOUT, client.health(HealthRequest {})).await;
        let why = match answer {
            Ok(Ok(h)) if h.get_ref().ready => break,
            Ok(Ok(h)) => format!("not ready: {}", h.get_ref().status),
            Ok(Err(status)) => format!("{:?}: {}", status.code(), status.message()),
            Err(_) => "Health timed out".to_string(),
        };
        if Instant::now() >= deadline {
            bail!("the worker is not ready after {wait_ready:?}: {why}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let info = tokio::time::timeout(SETUP_RPC_TIMEOUT, client.info(InfoRequest {}))
        .await
        .context("Info timed out")?
        .context("Info failed")?
        .into_inner();
    let spec = info
        .tokenizer
        .as_ref()
        .context("the worker's Info has no tokenizer spec")?;
    let tokenizer = TextTokenizer::from_spec(spec).context("building the worker's tokenizer")?;

    let (outbound, rx) = mpsc::unbounded_channel();
    let mut inbound = tokio::time::timeout(
        SETUP_RPC_TIMEOUT,
        client.generate(UnboundedReceiverStream::new(rx)),
    )
    .await
    .context("opening the Generate stream timed out")?
    .context("opening the Generate stream")?
    .into_inner();
    let routes = Arc::new(Mutex::new(Routes::default()));
    let stream = WorkerStream {
        outbound,
        routes: routes.clone(),
    };
    tokio::spawn(async move {
        let why = loop {
            match inbound.message().await {
                Ok(Some(message)) => {
                    let at = Instant::now();
                    let Some(worker_message::Kind::Step(step)) = message.kind else {
                        continue;
                    };
                    // Group the step's tokens by request, keeping their order.
                    let mut by_request: Vec<(String, Vec<TokenOutput>)> = Vec::new();
                    for token in step.tokens {
                        match by_request
                            .iter_mut()
                            .find(|(id, _)| *id == token.request_id)
                        {
                            Some((_, tokens)) => tokens.push(token),
                            None => by_request.push((token.request_id.clone(), vec![token])),
                        }
                    }
                    let routes = routes.lock().expect("routes lock");
                    for (id, tokens) in by_request {
                        if let Some(tx) = routes.open.get(&id) {
                            let _ = tx.send(Event::Tokens(at, tokens));
                        }
                    }
                    for error in step.errors {
                        if let Some(tx) = routes.open.get(&error.request_id) {
                            let _ = tx.send(Event::Failed {
                                code: tonic::Code::from_i32(error.code),
                                message: error.message,
                            });
                        }
                    }
                }
                Ok(None) => break "the worker closed the Generate stream".to_string(),
                Err(status) => {
                    break format!(
                        "the Generate stream broke: {:?}: {}",
                        status.code(),
                        status.message()
                    )
                }
            }
        };
        let mut routes = routes.lock().expect("routes lock");
        for (_, tx) in routes.open.drain() {
            let _ = tx.send(Event::Lost(why.clone()));
        }
        routes.closed = Some(why);
    });
    Ok(Worker {
        info,
        tokenizer: LocalTokenizer {
            tokenizer: Arc::new(tokenizer),
            calls: Arc::default(),
        },
        stream,
    })
}
