//! The public gRPC service (`inference.v1.TextGeneration`).
//!
//! The gRPC edge: the router's [`RouteError`]s become `tonic::Status`es here (mapped by
//! [`crate::grpc_status`]), after the metrics have counted them.
//!
//! `Generate` is refused with `UNAVAILABLE` while the router drains ([`Drain`]); each running call is
//! counted until its response stream ends, so a drain can wait for it, and one still running when
//! the drain timeout passes ends with `UNAVAILABLE` ([`RouteError::DrainTimeout`]; its request is
//! cancelled on its worker). The call's `grpc-timeout`
//! becomes the request's deadline ([`crate::deadline`]). Every handler marks its call as reached
//! ([`HandlerReached`]), so [`crate::request_guard::RequestGuard`] accounts only calls refused before
//! a handler.
//!
//! The caller's tenant is what [`crate::request_guard::RequestGuard`] identified from its key (put
//! in the request's extensions; without a guard, the `default` tenant); the request's `priority`
//! resolves against the tenant ([`Callers::caller`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::Stream;
use inference_proto::public::{
    text_generation_server::TextGeneration, GenerateRequest, GenerateResponse, ModelInfoRequest,
    ModelInfoResponse, TokenizeRequest, TokenizeResponse, ValidationLimits,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::deadline::grpc_timeout;
use crate::drain::{ActiveCall, CutOff, Drain};
use crate::generate::{self, CallContext};
use crate::metrics::{RequestObserver, RouterMetrics};
use crate::pool::{ServedModel, WorkerPool};
use crate::request_guard::HandlerReached;
use crate::route_error::RouteError;
use crate::tenants::{Callers, Tenant};
use crate::tool_call_stream::ToolCallStream;
use crate::validation::RequestLimits;

/// The router's public service.
pub struct TextGenerationService {
    pool: Arc<WorkerPool>,
    limits: RequestLimits,
    drain: Arc<Drain>,
    metrics: Option<Arc<RouterMetrics>>,
    callers: Arc<Callers>,
}

impl TextGenerationService {
    /// Serves requests over `pool`, validated against `limits`; refuses new calls once `drain` has
    /// started.
    pub fn new(pool: Arc<WorkerPool>, limits: RequestLimits, drain: Arc<Drain>) -> Self {
        Self {
            pool,
            limits,
            drain,
            metrics: None,
            callers: Callers::open(),
        }
    }

    /// Resolves callers' tenants, priorities and quotas with `callers` (the same as the request
    /// guard's).
    pub fn with_callers(mut self, callers: Arc<Callers>) -> Self {
        self.callers = callers;
        self
    }

    /// Records every `Generate` call in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<RouterMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The served model named `requested` (`None`: the default model).
    fn model(&self, requested: Option<&str>) -> Result<Arc<ServedModel>, Status> {
        Ok(self.pool.resolve_model(requested)?)
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<GenerateResponse, Status>> + Send>>;

/// A response stream that counts as a running call until it is dropped, splits off the tool calls
/// of a request with tools ([`ToolCallStream`]), shows each message to the call's metrics observer
/// and turns an error into its gRPC status. Once the drain timeout passes ([`ActiveCall::cut_off`])
/// it ends with [`RouteError::DrainTimeout`], dropping its channel (which cancels the request on
/// its worker).
///
/// It yields one message per poll (after each message it answers `Pending` once, with its waker
/// woken): tonic's encoder otherwise takes every message ready in the buffer into one body chunk,
/// and hyper asks for the next chunk only when the whole chunk went out within the client's
/// HTTP/2 window. The router's response buffer then drained in bursts of up to 63 messages, as
/// slowly as the client read all of them, and a client reading steadily through a small window
/// looked as if it read nothing for `slow_client_timeout_ms`. One message per chunk makes the
/// buffer drain at the pace the client reads.
struct CountedStream {
    /// `None` once the stream was cut off.
    inner: Option<ReceiverStream<Result<GenerateResponse, RouteError>>>,
    /// The last poll yielded a message (the next one answers `Pending` once).
    yielded: bool,
    _call: ActiveCall,
    cut_off: CutOff,
    observer: Option<RequestObserver>,
    tool_calls: Option<ToolCallStream>,
}

impl Stream for CountedStream {
    type Item = Result<GenerateResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.inner.is_none() {
            return Poll::Ready(None);
        }
        if std::mem::take(&mut self.yielded) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let mut item = match self.cut_off.as_mut().poll(cx) {
            Poll::Ready(error) => {
                self.inner = None;
                Some(Err(error))
            }
            Poll::Pending => {
                let inner = self.inner.as_mut().expect("checked above");
                std::task::ready!(Pin::new(inner).poll_next(cx))
            }
        };
        if let (Some(splitter), Some(Ok(message))) = (self.tool_calls.as_mut(), item.as_mut()) {
            splitter.rewrite(message);
        }
        if let (Some(observer), Some(item)) = (self.observer.as_mut(), item.as_ref()) {
            observer.on_item(item);
        }
        self.yielded = item.is_some();
        Poll::Ready(item.map(|item| item.map_err(Status::from)))
    }
}

#[tonic::async_trait]
impl TextGeneration for TextGenerationService {
    type GenerateStream = ResponseStream;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        HandlerReached::mark(&request);
        let span = crate::telemetry::request_span(request.metadata());
        let tenant = request
            .extensions()
            .get::<Arc<Tenant>>()
            .cloned()
            .unwrap_or_else(|| self.callers.table().default.clone());
        span.record("tenant", &*tenant.name);
        let observer = self.metrics.as_ref().map(|m| {
            let model = crate::metrics::model_label(&self.pool, request.get_ref().model.as_deref());
            m.request_for(span.clone(), &tenant.name, &model)
        });
        let started = async {
            let call = self.drain.admit()?;
            let context = CallContext {
                arrival: Instant::now(),
                deadline: grpc_timeout(request.metadata()).map(|t| Instant::now() + t),
                caller: self
                    .callers
                    .caller(tenant, request.get_ref().priority)?
                    .with_cache_salt(request.get_ref().cache_salt.as_deref())?,
            };
            let started =
                generate::start(&self.pool, &self.limits, request.into_inner(), &context).await?;
            Ok::<_, RouteError>((call, started))
        }
        .instrument(span.clone())
        .await;
        let (call, started) = match started {
            Ok(started) => started,
            Err(e) => {
                match observer {
                    Some(observer) => observer.refused(&e),
                    None => crate::telemetry::record_error(&span, &e),
                }
                return Err(e.into());
            }
        };
        Ok(Response::new(Box::pin(CountedStream {
            inner: Some(ReceiverStream::new(started.responses)),
            yielded: false,
            cut_off: call.cut_off(),
            _call: call,
            observer,
            tool_calls: started.tool_calls.map(ToolCallStream::new),
        })))
    }

    async fn tokenize(
        &self,
        request: Request<TokenizeRequest>,
    ) -> Result<Response<TokenizeResponse>, Status> {
        HandlerReached::mark(&request);
        // `TokenizeRequest` names no model: the default model's tokenizer.
        let model = self.model(None)?.context.clone();
        let req = request.into_inner();
        if req.text.len() > self.limits.max_request_bytes as usize {
            return Err(Status::invalid_argument(format!(
                "text is {} bytes; the limit is {} bytes",
                req.text.len(),
                self.limits.max_request_bytes
            )));
        }
        // CPU work (a 1 MiB text takes about 0.7 s): off the async runtime's threads.
        let (ids, pieces) = tokio::task::spawn_blocking(move || {
            model
                .tokenizer
                .encode_with_pieces(&req.text, req.add_special_tokens)
        })
        .await
        .map_err(|e| RouteError::Internal(format!("tokenization failed: {e}")))?
        .map_err(|e| Status::invalid_argument(format!("cannot tokenize: {e}")))?;
        Ok(Response::new(TokenizeResponse { ids, pieces }))
    }

    async fn model_info(
        &self,
        request: Request<ModelInfoRequest>,
    ) -> Result<Response<ModelInfoResponse>, Status> {
        HandlerReached::mark(&request);
        let served = self.model(request.get_ref().model.as_deref())?;
        let model = &served.context;
        let listed = self.pool.served_models();
        let served_model_name = listed
            .iter()
            .find(|(m, _)| m.id == served.id)
            .map_or_else(|| served.id.to_string(), |(_, names)| names[0].clone());
        let served_models = listed.iter().map(|(_, names)| names[0].clone()).collect();
        let l = &self.limits;
        let max_input_tokens = if l.max_input_tokens == 0 {
            model.context_length.saturating_sub(1)
        } else {
            l.max_input_tokens
        };
        Ok(Response::new(ModelInfoResponse {
            model_name: model.model_name.clone(),
            max_context_tokens: model.context_length,
            vocab_size: model.vocab_size,
            eos_token_ids: model.eos_token_ids.clone(),
            limits: Some(ValidationLimits {
                max_stop_sequences: l.max_stop_sequences,
                max_stop_sequence_chars: l.max_stop_sequence_chars,
                max_new_tokens: l.max_new_tokens,
                default_max_new_tokens: l.default_new_tokens(),
                max_input_tokens,
                max_request_bytes: l.max_request_bytes,
            }),
            bos_token_id: model.bos_token_id,
            add_bos_token: model.add_bos_token,
            chat_template: model.chat_template_source.clone(),
            chat_template_origin: model.chat_template_origin.clone(),
            architecture: model.architecture.clone(),
            ready_workers: self.pool.ready_workers_of(&served.id) as u32,
            numerics: self.pool.numerics_of(&served.id),
            served_model_name,
            served_models,
        }))
    }
}
