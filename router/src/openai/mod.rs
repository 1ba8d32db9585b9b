//! The OpenAI-compatible HTTP front (axum, on `http_listen`): `POST /v1/chat/completions`,
//! `POST /v1/completions`, `GET /v1/models` and `GET /health`, plus `POST /tokenize` and
//! `POST /detokenize` as vLLM and llama.cpp's server have them ([`tokenize`]; what `bench
//! --openai` fits its prompts with), vLLM's `GET /tokenizer_info`, and `GET /metrics`
//! (the router's Prometheus metrics, also on `metrics_listen`; open like `/health`, as vLLM's).
//!
//! It shares everything behind the gRPC front: the drain, one validation pass
//! ([`crate::generate::prepare`]), the admission queue and workers ([`crate::generate::launch`],
//! once per choice), the detokenizer and stop strings, and the metrics. The API key's tenant
//! ([`Callers`]) and the body's `priority` (an extension field, the gRPC request's meaning) place
//! each request in the tenants' fair share and priority classes.
//!
//! - [`schema`]: request bodies and their translation into [`crate::request::GenerationRequest`]s;
//! - [`reply`]: response documents and chunks;
//! - [`run`]: gathering or streaming the choices;
//! - [`tokenize`]: `/tokenize`, `/detokenize` and `/tokenizer_info`;
//! - [`cors`]: CORS for browser clients (`allowed_origins`);
//! - [`tools`]: the tool-calling fields (`tools`, `tool_choice`, the messages' calls);
//! - [`error`]: OpenAI's error object and the HTTP statuses.

pub mod cors;
pub mod echo;
pub mod error;
pub mod reply;
pub mod run;
pub mod schema;
pub mod tokenize;
pub mod tools;

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tracing::Instrument as _;

use crate::drain::Drain;
use crate::generate::{self, new_request_id, CallContext};
use crate::metrics::RouterMetrics;
use crate::pool::{ServedModel, WorkerPool};
use crate::route_error::RouteError;
use crate::tenants::quota::CallPart;
use crate::tenants::{Callers, Tenant};
use crate::validation::RequestLimits;
use echo::EchoPrompt;
use error::{ApiError, Endpoint};
use reply::Reply;
use run::Choice;

/// What the HTTP front serves over.
pub struct OpenAiFront {
    pool: Arc<WorkerPool>,
    limits: RequestLimits,
    drain: Arc<Drain>,
    metrics: Option<Arc<RouterMetrics>>,
    keys: Arc<Callers>,
}

impl OpenAiFront {
    /// A front over `pool` (whose models answer to the names of its
    /// [`crate::model_choice::ModelNaming`]), validating against `limits`, refusing new requests
    /// once `drain` has started, recording requests in `metrics`, to callers with one of `keys`
    /// (`GET /health` is open to all).
    pub fn new(
        pool: Arc<WorkerPool>,
        limits: RequestLimits,
        drain: Arc<Drain>,
        metrics: Option<Arc<RouterMetrics>>,
        keys: Arc<Callers>,
    ) -> Arc<Self> {
        Arc::new(Self {
            pool,
            limits,
            drain,
            metrics,
            keys,
        })
    }

    /// The axum application: the API routes behind the API-key check, `/health` open.
    pub fn router(self: &Arc<Self>) -> axum::Router {
        let keys = self.keys.clone();
        let api = axum::Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/completions", post(completions))
            .route("/v1/models", get(models))
            .route("/v1/models/{*id}", get(model))
            .route("/tokenize", post(tokenize))
            .route("/detokenize", post(detokenize))
            .route("/tokenizer_info", get(tokenizer_info))
            .route_layer(axum::middleware::from_fn(
                move |mut request: axum::extract::Request, next: axum::middleware::Next| {
                    let checked = keys.identify(
                        request
                            .headers()
                            .get(header::AUTHORIZATION)
                            .map(|v| v.as_bytes()),
                    );
                    async move {
                        match checked {
                            Ok(tenant) => {
                                request.extensions_mut().insert(tenant);
                                next.run(request).await
                            }
                            Err(refusal) => ApiError::unauthorized(refusal).into_response(),
                        }
                    }
                },
            ));
        let api = match &self.metrics {
            Some(metrics) => {
                let metrics = metrics.clone();
                api.route_layer(axum::middleware::from_fn(
                    move |request: axum::extract::Request, next: axum::middleware::Next| {
                        let metrics = metrics.clone();
                        let route = request
                            .extensions()
                            .get::<axum::extract::MatchedPath>()
                            .map_or_else(|| "other".to_string(), |p| p.as_str().to_string());
                        async move {
                            let response = next.run(request).await;
                            metrics.count_http(&route, response.status().as_u16());
                            response
                        }
                    },
                ))
            }
            None => api,
        };
        let api = match &self.metrics {
            Some(metrics) => {
                let metrics = metrics.clone();
                observability::metrics_http::metrics_route(api, move || {
                    std::future::ready(metrics.render())
                })
            }
            None => api,
        };
        api.route("/health", get(health))
            .fallback(|uri: Uri| async move { ApiError::no_route(uri.path()) })
            .method_not_allowed_fallback(|method: axum::http::Method, uri: Uri| async move {
                ApiError::wrong_method(&method, uri.path())
            })
            .with_state(self.clone())
    }

    /// The name a response reports for a request naming `requested`: that name, or the default
    /// model's public name when it names none (empty while no worker has described a model).
    ///
    /// Errors: 404 `model_not_found` for a name that is not served, 400 `model_required` for none
    /// where several models are served without a default (checked again when the request is
    /// prepared; here so that they come before the body's other checks).
    fn reported_model(&self, requested: Option<&str>) -> Result<String, ApiError> {
        let model = match self.pool.resolve_model(requested) {
            Ok(model) => model,
            Err(e @ RouteError::Model(_)) => return Err(ApiError::from_route(e, None)),
            Err(_) => return Ok(requested.unwrap_or_default().to_string()),
        };
        if let Some(name) = requested.filter(|name| !name.is_empty()) {
            return Ok(name.to_string());
        }
        Ok(self.public_name(&model))
    }

    /// `model`'s public name: the first name `GET /v1/models` lists it under (its id while no
    /// worker has described it).
    fn public_name(&self, model: &ServedModel) -> String {
        self.pool
            .served_models()
            .into_iter()
            .find(|(m, _)| m.id == model.id)
            .map_or_else(|| model.id.to_string(), |(_, names)| names[0].clone())
    }

    /// One generation request from its body to the response.
    async fn complete(
        self: Arc<Self>,
        endpoint: Endpoint,
        tenant: Arc<Tenant>,
        headers: HeaderMap,
        body: Body,
    ) -> Result<Response, ApiError> {
        let arrival = Instant::now();
        let limit = self.limits.max_request_bytes as usize;
        let bytes = axum::body::to_bytes(body, limit)
            .await
            .map_err(|_| ApiError::too_large(limit))?;
        let body = schema::parse(&bytes)?;
        let requested = body.model.clone();
        let model = self.reported_model(requested.as_deref())?;
        let priority = body.priority()?;
        let cache_salt = body.cache_salt.clone();
        let (requests, shape) = body.into_requests(endpoint, bytes.len())?;
        let caller = self
            .keys
            .caller(tenant, priority)
            .and_then(|caller| caller.with_cache_salt(cache_salt.as_deref()))
            .map_err(|e| ApiError::from_validation(e, endpoint))?;
        let call = self
            .drain
            .admit()
            .map_err(|e| ApiError::from_route(e, Some(endpoint)))?;
        let span =
            crate::telemetry::request_span(&tonic::metadata::MetadataMap::from_headers(headers));
        span.record("tenant", &*caller.tenant.name);
        let context = CallContext {
            arrival,
            deadline: None,
            caller,
        };
        let mut prepared = Vec::with_capacity(requests.len());
        for request in requests {
            let result = generate::prepare(&self.pool, &self.limits, requested.as_deref(), request)
                .instrument(span.clone())
                .await;
            prepared.push(result.map_err(|e| ApiError::from_route(e, Some(endpoint)))?);
        }
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        };
        let id = format!("{prefix}-{}", new_request_id());
        let mut choices = Vec::new();
        let mut prompt_tokens = 0u64;
        let label = crate::metrics::model_label(&self.pool, requested.as_deref());
        for (prompt_index, (model_context, valid)) in prepared.iter().enumerate() {
            prompt_tokens += valid.prompt_ids.len() as u64;
            let echo = shape.echo.as_ref().map(|e| EchoPrompt {
                text: e.prompt_texts[prompt_index].clone().unwrap_or_else(|| {
                    model_context
                        .context
                        .tokenizer
                        .decode(&valid.prompt_ids, false)
                }),
                generate: e.generate,
            });
            for n in 0..shape.n {
                let index = choices.len();
                let observer = self
                    .metrics
                    .as_ref()
                    .map(|m| m.request_for(span.clone(), &context.caller.tenant.name, &label));
                let launched = span.in_scope(|| {
                    generate::launch(
                        &self.pool,
                        model_context.clone(),
                        valid,
                        valid.choice_seed(n.into()),
                        format!("{id}-{index}"),
                        &context,
                        if index == 0 {
                            CallPart::First
                        } else {
                            CallPart::Further
                        },
                    )
                });
                match launched {
                    Ok(rx) => choices.push(Choice {
                        index,
                        rx,
                        observer,
                        echo: echo.clone(),
                        first: None,
                    }),
                    Err(e) => {
                        if let Some(observer) = observer {
                            observer.refused(&e);
                        }
                        return Err(ApiError::from_route(e, Some(endpoint)));
                    }
                }
            }
        }
        let reply = Reply {
            endpoint,
            id,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model,
            logprobs: shape.logprobs,
            include_usage: shape.include_usage,
            tool_syntax: prepared
                .first()
                .filter(|_| shape.tool_calls)
                .map(|(model, _)| model.context.tool_syntax),
            token_ids: shape.token_ids,
        };
        if shape.stream {
            // The response's status waits for the first message: an error before it is a status.
            let choices = run::started(choices, &call)
                .await
                .map_err(|e| ApiError::from_route(e, Some(endpoint)))?;
            let body = run::events(reply, choices, prompt_tokens, call);
            return Ok((
                [
                    (header::CONTENT_TYPE, "text/event-stream"),
                    (header::CACHE_CONTROL, "no-cache"),
                ],
                body,
            )
                .into_response());
        }
        let document = run::gather(&reply, choices, prompt_tokens, &call).await?;
        drop(call);
        Ok(json_response(StatusCode::OK, &document))
    }
}

fn json_response(status: StatusCode, value: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// `POST /tokenize` ([`tokenize::tokenize`]).
async fn tokenize(State(front): State<Arc<OpenAiFront>>, body: Body) -> Response {
    let limit = front.limits.max_request_bytes as usize;
    match tokenize::tokenize(&front.pool, limit, body).await {
        Ok(value) => json_response(StatusCode::OK, &value),
        Err(e) => e.into_response(),
    }
}

/// `GET /tokenizer_info` ([`tokenize::tokenizer_info`]).
async fn tokenizer_info(State(front): State<Arc<OpenAiFront>>) -> Response {
    match tokenize::tokenizer_info(&front.pool) {
        Ok(value) => json_response(StatusCode::OK, &value),
        Err(e) => e.into_response(),
    }
}

/// `POST /detokenize` ([`tokenize::detokenize`]).
async fn detokenize(State(front): State<Arc<OpenAiFront>>, body: Body) -> Response {
    let limit = front.limits.max_request_bytes as usize;
    match tokenize::detokenize(&front.pool, limit, body).await {
        Ok(value) => json_response(StatusCode::OK, &value),
        Err(e) => e.into_response(),
    }
}

async fn chat(
    State(front): State<Arc<OpenAiFront>>,
    Extension(tenant): Extension<Arc<Tenant>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    front
        .complete(Endpoint::Chat, tenant, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completions(
    State(front): State<Arc<OpenAiFront>>,
    Extension(tenant): Extension<Arc<Tenant>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    front
        .complete(Endpoint::Completions, tenant, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/models`: every served model's public name, the default model's aliases after it, each
/// with `max_model_len` (its context length), `chat_template_origin`, `ready_workers` and
/// `numerics` (the numeric mode its workers run, as `ModelInfo.numerics`:
/// [`crate::pool::WorkerPool::numerics_of`]) (503 while no worker has described a model).
async fn models(State(front): State<Arc<OpenAiFront>>) -> Response {
    match model_entries(&front) {
        Ok(data) => json_response(StatusCode::OK, &json!({"object": "list", "data": data})),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/models/{id}` (the SDK's `models.retrieve`): the entry `GET /v1/models` lists under
/// `id`, or under the first name of the model `id` resolves to (its descriptive name, say).
///
/// Errors: 404 `model_not_found` naming the models served; 503 while no worker described a model.
async fn model(State(front): State<Arc<OpenAiFront>>, Path(id): Path<String>) -> Response {
    let entries = match model_entries(&front) {
        Ok(entries) => entries,
        Err(e) => return e.into_response(),
    };
    let listed = |name: &str| entries.iter().find(|e| e["id"] == name).cloned();
    if let Some(entry) = listed(&id) {
        return json_response(StatusCode::OK, &entry);
    }
    let model = match front.pool.resolve_model(Some(&id)) {
        Ok(model) => model,
        Err(e) => return ApiError::from_route(e, None).into_response(),
    };
    match listed(&front.public_name(&model)) {
        Some(entry) => json_response(StatusCode::OK, &entry),
        None => {
            let e = RouteError::no_worker(front.pool.configured_workers());
            ApiError::from_route(e, None).into_response()
        }
    }
}

/// The entries of `GET /v1/models`: one per served name of every model.
///
/// Errors: 503 (no worker) while no worker has described a model.
fn model_entries(front: &OpenAiFront) -> Result<Vec<serde_json::Value>, ApiError> {
    let served = front.pool.served_models();
    if served.is_empty() {
        let e = RouteError::no_worker(front.pool.configured_workers());
        return Err(ApiError::from_route(e, None));
    }
    // vLLM's `max_model_len`, and where chat requests' template comes from (a built-in one for a
    // model without its own, which may not suit it).
    let data: Vec<_> = served
        .iter()
        .flat_map(|(model, names)| {
            let ready = front.pool.ready_workers_of(&model.id);
            let numerics = front.pool.numerics_of(&model.id);
            names.iter().map(move |name| {
                json!({"id": name, "object": "model", "created": 0, "owned_by": "inference",
                       "max_model_len": model.context.context_length,
                       "chat_template_origin": model.context.chat_template_origin,
                       "ready_workers": ready, "numerics": numerics})
            })
        })
        .collect();
    Ok(data)
}

/// `GET /health`: 200 while a worker is ready and the router is not draining, 503 otherwise; the
/// body lists each worker with whether it is ready and its last connection error.
async fn health(State(front): State<Arc<OpenAiFront>>) -> Response {
    let ready_workers = front.pool.ready_workers();
    let draining = front.drain.is_draining();
    let (status, state) = match (ready_workers > 0, draining) {
        (_, true) => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
        (true, false) => (StatusCode::OK, "ready"),
        (false, false) => (StatusCode::SERVICE_UNAVAILABLE, "no_ready_worker"),
    };
    // Why a worker is not ready, e.g. its TLS certificate does not verify.
    let workers: Vec<_> = front
        .pool
        .workers()
        .into_iter()
        .map(|w| json!({"address": w.address, "ready": w.ready(), "error": w.last_error}))
        .collect();
    json_response(
        status,
        &json!({"status": state, "ready_workers": ready_workers, "workers": workers}),
    )
}

/// A plain-TCP listener for [`serve`] whose connections have `TCP_NODELAY` set: each
/// server-sent event is a small write, and without it Nagle's algorithm holds an event back until
/// the client acknowledges the previous segment (a delayed ACK, up to 40 ms; measured: the
/// 1-stream TTFT was 20 ms behind gRPC's). [`tls_certs::TlsIncoming`] sets it on its own.
pub fn plain_listener(
    listener: tokio::net::TcpListener,
) -> impl axum::serve::Listener<Addr = std::net::SocketAddr> {
    use axum::serve::ListenerExt;
    listener.tap_io(|tcp| {
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY on an HTTP connection");
        }
    })
}

/// Serves `front` on `listener` (a [`plain_listener`], or a [`tls_certs::TlsIncoming`]) until
/// `shutdown` resolves (then finishes the open responses), answering CORS with `cors` (see
/// [`cors::layer`]; `None` = off).
pub async fn serve<L>(
    listener: L,
    front: Arc<OpenAiFront>,
    cors: Option<tower_http::cors::CorsLayer>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let app = match cors {
        Some(cors) => front.router().layer(cors),
        None => front.router(),
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
