//! The gRPC side of the API keys: a tower service around a generated server (the public
//! `TextGeneration` one) that answers `UNAUTHENTICATED` before the handler when the call's
//! `authorization` metadata does not carry a configured key. Health and reflection are separate
//! services and are not wrapped, so they stay open.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::server::NamedService;
use tonic::Status;

use super::{ApiKeys, Refusal};

/// The gRPC status of a refusal: `UNAUTHENTICATED` with its message.
pub fn status(refusal: Refusal) -> Status {
    Status::unauthenticated(refusal.to_string())
}

/// Guards `inner` with `keys` (see the module docs).
#[derive(Debug, Clone)]
pub struct KeyGuard<S> {
    inner: S,
    keys: Arc<ApiKeys>,
}

impl<S> KeyGuard<S> {
    /// `inner`, reachable only with one of `keys` (everything passes when `keys` are not enforced).
    pub fn new(inner: S, keys: Arc<ApiKeys>) -> Self {
        Self { inner, keys }
    }
}

impl<S: NamedService> NamedService for KeyGuard<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower_service::Service<http::Request<Body>> for KeyGuard<S>
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
        let authorization = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        match self.keys.check(authorization) {
            Ok(()) => Box::pin(self.inner.call(request)),
            Err(refusal) => {
                let response = status(refusal).into_http();
                Box::pin(std::future::ready(Ok(response)))
            }
        }
    }
}
