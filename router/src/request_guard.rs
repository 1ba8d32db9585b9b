//! The guard in front of the public gRPC `TextGeneration` server: one tower service that refuses
//! calls before the handler runs, with precise errors, and accounts for them. Health and reflection
//! are separate services and are not wrapped, so they stay open.
//!
//! - **API keys**: a call whose `authorization` metadata does not carry a configured key is
//!   answered `UNAUTHENTICATED` ([`crate::auth`]); the call goes no further. A call that passes
//!   carries its key's tenant (`Arc<Tenant>`, [`crate::tenants::Callers`]) in its extensions.
//! - **Size and framing**: request bodies pass through a [`FrameGuard`] with `max_request_bytes`
//!   (`RESOURCE_EXHAUSTED` for a message above it, `INVALID_ARGUMENT` for broken framing; see
//!   [`crate::grpc_frames`]).
//! - **Decoding**: a frame whose payload is not a valid message (garbage, truncated, wrong wire
//!   types, invalid UTF-8 in a string) is `INVALID_ARGUMENT` from the codec
//!   ([`inference_proto::codec::WireCodec`]).
//! - **Accounting**: such a refusal happens before the handler runs, so [`RequestGuard`] looks at
//!   the response itself: a call whose handler never ran (no [`HandlerReached`] mark) and whose
//!   response carries an error status is logged (one INFO line with the code, the reason and the
//!   method) and, for `Generate`, counted in `router_requests_total{code}`. Calls that reach the
//!   handler are counted by the handler's own observer, so nothing is counted twice.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use inference_proto::status::code_name;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Code, Status};

use crate::grpc_frames::FrameGuard;
use crate::metrics::RouterMetrics;
use crate::tenants::Callers;

/// Path suffix of the method whose calls `router_requests_total` counts.
const GENERATE_METHOD: &str = "/Generate";

/// Set by a handler when a call reaches it (so the call's status is accounted there, not by
/// [`RequestGuard`]). [`RequestGuard`] puts one in every request's extensions.
#[derive(Debug, Clone, Default)]
pub struct HandlerReached(Arc<AtomicBool>);

impl HandlerReached {
    /// Marks `request` as having reached its handler (does nothing for a request that did not come
    /// through a [`RequestGuard`]).
    pub fn mark<T>(request: &tonic::Request<T>) {
        if let Some(reached) = request.extensions().get::<Self>() {
            reached.0.store(true, Ordering::Relaxed);
        }
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Wraps a generated gRPC server (e.g. `TextGenerationServer`): calls without one of the API keys
/// are refused, request bodies pass through a [`FrameGuard`] with `max_request_bytes`, and
/// refusals made before the handler are logged and counted (see the module docs).
#[derive(Debug, Clone)]
pub struct RequestGuard<S> {
    inner: S,
    keys: Arc<Callers>,
    max_request_bytes: usize,
    metrics: Option<Arc<RouterMetrics>>,
}

impl<S> RequestGuard<S> {
    /// Guards `inner`: reachable only with one of `keys` (everything passes when `keys` are not
    /// enforced); request messages above `max_request_bytes` (bytes of one encoded message) are
    /// refused; refusals are counted in `metrics` when given.
    pub fn new(
        inner: S,
        keys: Arc<Callers>,
        max_request_bytes: usize,
        metrics: Option<Arc<RouterMetrics>>,
    ) -> Self {
        Self {
            inner,
            keys,
            max_request_bytes,
            metrics,
        }
    }
}

impl<S: NamedService> NamedService for RequestGuard<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower_service::Service<http::Request<Body>> for RequestGuard<S>
where
    S: tower_service::Service<
        http::Request<Body>,
        Response = http::Response<Body>,
        Error = Infallible,
    >,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = request.uri().path().to_owned();
        let metrics = self.metrics.clone();
        let authorization = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        let tenant = match self.keys.identify(authorization) {
            Ok(tenant) => tenant,
            Err(refusal) => {
                let status = Status::unauthenticated(refusal.to_string());
                record_refusal(&method, &status, metrics.as_deref());
                return Box::pin(std::future::ready(Ok(status.into_http())));
            }
        };
        let reached = HandlerReached::default();
        let limit = self.max_request_bytes;
        let mut request = request.map(|body| Body::new(FrameGuard::new(body, limit)));
        request.extensions_mut().insert(reached.clone());
        request.extensions_mut().insert(tenant);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            if !reached.get() {
                if let Some(status) = Status::from_header_map(response.headers()) {
                    record_refusal(&method, &status, metrics.as_deref());
                }
            }
            Ok(response)
        })
    }
}

/// Logs (and for `Generate`, counts) a call refused before its handler ran.
fn record_refusal(method: &str, status: &Status, metrics: Option<&RouterMetrics>) {
    if status.code() == Code::Ok {
        return;
    }
    let code = code_name(status.code());
    tracing::info!(
        code,
        reason = status.message(),
        method,
        "request rejected before the handler"
    );
    if let Some(metrics) = metrics.filter(|_| method.ends_with(GENERATE_METHOD)) {
        metrics.count_rejection(status.code());
    }
}
