//! OpenAI's error object (`{"error": {"message", "type", "param", "code"}}`) and the mapping of the
//! router's errors ([`RouteError`] and the front's own) onto HTTP statuses: the only place where
//! they meet HTTP. The message is the error's own text, the same as the gRPC front's.
//!
//! | router error | HTTP | `type` | `code` |
//! |---|---|---|---|
//! | body not JSON, wrong type or value, [`ValidationError::Invalid`], worker [`WorkerFailureKind::Rejected`] | 400 | `invalid_request_error` | `invalid_type` / `invalid_value` / `invalid_json` |
//! | unknown model ([`RouteError::Model`]) | 404 | `invalid_request_error` | `model_not_found` |
//! | no model named while several are served | 400 | `invalid_request_error` | `model_required` |
//! | unknown path / served path with another method | 404 / 405 | `invalid_request_error` | `unknown_url` / `method_not_allowed` |
//! | body above `max_request_bytes` | 413 | `invalid_request_error` | `request_too_large` |
//! | admission queue full ([`RouteError::Overloaded`]), displaced sheddable request, worker [`WorkerFailureKind::DoesNotFit`] | 429 | `rate_limit_error` | `overloaded` |
//! | tenant quota ([`RouteError::Quota`]) or tenant queue share (`max_queued`) | 429 | `rate_limit_exceeded` | the limit: `requests_per_second`, `tokens_per_minute`, `max_concurrent`, `max_queued` |
//! | no worker ready (known, in time, left), failovers exhausted, draining (a new request, or one cut off by the drain timeout: a stream's last event), worker [`WorkerFailureKind::HandedBack`] | 503 | `server_error` | `unavailable` |
//! | deadline passed | 504 | `server_error` | `timeout` |
//! | no, malformed or wrong API key ([`Refusal`]) | 401 | `invalid_request_error` | `invalid_api_key` |
//! | [`ValidationError::Unsupported`] | 501 | `invalid_request_error` | `not_implemented` |
//! | anything else (worker failure, router fault) | 500 | `server_error` | `internal_error` |
//!
//! A refusal with a retry hint ([`RouteError::retry_after`]: a tenant's bucket quota) carries it
//! as `Retry-After` (whole seconds, rounded up, at least 1) and `retry-after-ms` headers.

use std::time::Duration;

use crate::admission::QueueFull;
use crate::auth::Refusal;
use crate::model_choice::ModelChoiceError;
use crate::route_error::{RouteError, WorkerFailureKind};
use crate::validation::ValidationError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The endpoint an error came from: a few of the router's field names read differently in
/// OpenAI's request bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
}

impl Endpoint {
    /// The request-body field that carries the router field `field` (e.g. `max_new_tokens` is
    /// `max_tokens`, a chat's `prompt` is `messages`).
    pub fn param(self, field: &'static str) -> &'static str {
        match (self, field) {
            (_, "max_new_tokens") => "max_tokens",
            (_, "constraint") => "response_format",
            (Endpoint::Chat, "prompt") => "messages",
            (Endpoint::Completions, "top_logprobs" | "prompt_logprobs") => "logprobs",
            (_, field) => field,
        }
    }
}

/// The endpoints this front serves, as the 404 and 405 answers list them.
const SERVED: &str = "POST /v1/chat/completions, POST /v1/completions, POST /tokenize, \
                      POST /detokenize, GET /tokenizer_info, GET /v1/models, \
                      GET /v1/models/{id} and GET /health";

/// HTTP status, OpenAI `type` and `code` of a class of router errors.
type Class = (StatusCode, &'static str, &'static str);
const INVALID: Class = (
    StatusCode::BAD_REQUEST,
    "invalid_request_error",
    "invalid_value",
);
const OVERLOADED: Class = (
    StatusCode::TOO_MANY_REQUESTS,
    "rate_limit_error",
    "overloaded",
);
const UNAVAILABLE: Class = (
    StatusCode::SERVICE_UNAVAILABLE,
    "server_error",
    "unavailable",
);
const INTERNAL: Class = (
    StatusCode::INTERNAL_SERVER_ERROR,
    "server_error",
    "internal_error",
);

/// One error response: an HTTP status and OpenAI's error object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApiError {
    /// The HTTP status (not serialized).
    #[serde(skip)]
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error class (`invalid_request_error`, `rate_limit_error`, `server_error`).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// A stable machine-readable code (see the module table).
    pub code: &'static str,
    /// When the client may retry (`Retry-After`, `retry-after-ms`; not serialized).
    #[serde(skip)]
    pub retry_after: Option<Duration>,
}

impl ApiError {
    /// A 400 `invalid_value` error for `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::bad_request("invalid_value", Some(param.into()), message)
    }

    /// A 400 error with `code`.
    pub fn bad_request(
        code: &'static str,
        param: Option<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code,
            retry_after: None,
        }
    }

    /// 413 for a body above `limit` bytes.
    pub fn too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body is larger than the limit of {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: "request_too_large",
            retry_after: None,
        }
    }

    /// 401 `invalid_api_key` for a request refused by the API-key check (as OpenAI answers it,
    /// with `WWW-Authenticate: Bearer` added by [`IntoResponse`]).
    pub fn unauthorized(refusal: Refusal) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: refusal.to_string(),
            kind: "invalid_request_error",
            param: None,
            code: "invalid_api_key",
            retry_after: None,
        }
    }

    /// 404 for a path this server does not serve.
    pub fn no_route(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("no endpoint at {path}; this server serves {SERVED}"),
            kind: "invalid_request_error",
            param: None,
            code: "unknown_url",
            retry_after: None,
        }
    }

    /// 405 for a served path asked with another method (e.g. `GET /v1/chat/completions`).
    pub fn wrong_method(method: &axum::http::Method, path: &str) -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("{method} is not allowed on {path}; this server serves {SERVED}"),
            kind: "invalid_request_error",
            param: None,
            code: "method_not_allowed",
            retry_after: None,
        }
    }

    /// A validation error of `endpoint`'s request.
    pub fn from_validation(e: ValidationError, endpoint: Endpoint) -> Self {
        Self::from_route(e.into(), Some(endpoint))
    }

    /// A router error of a request to `endpoint` (`None` for an endpoint without a generation
    /// body, where `param` keeps the router's field name); see the module table.
    pub fn from_route(e: RouteError, endpoint: Option<Endpoint>) -> Self {
        let (status, kind, code) = match &e {
            RouteError::Invalid(ValidationError::Invalid { .. }) => INVALID,
            RouteError::Invalid(ValidationError::Unsupported { .. }) => (
                StatusCode::NOT_IMPLEMENTED,
                "invalid_request_error",
                "not_implemented",
            ),
            RouteError::Model(ModelChoiceError::Unknown { .. }) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
            ),
            RouteError::Model(ModelChoiceError::Unnamed { .. }) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "model_required",
            ),
            RouteError::Overloaded(QueueFull::TenantQueue { .. }) => rate_limited("max_queued"),
            RouteError::Overloaded(_) => OVERLOADED,
            RouteError::Quota(q) => rate_limited(q.limit_name()),
            RouteError::Draining
            | RouteError::DrainTimeout { .. }
            | RouteError::NoWorkersKnown
            | RouteError::NoWorkerReady { .. }
            | RouteError::NoWorkerInTime { .. }
            | RouteError::FailoversExhausted { .. }
            | RouteError::NoWorkerLeft { .. } => UNAVAILABLE,
            RouteError::DeadlineExceeded { .. } => {
                (StatusCode::GATEWAY_TIMEOUT, "server_error", "timeout")
            }
            RouteError::ClientTooSlow { .. } => (
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                "client_too_slow",
            ),
            RouteError::Worker(failure) => match failure.kind {
                WorkerFailureKind::Rejected => INVALID,
                WorkerFailureKind::DoesNotFit => OVERLOADED,
                WorkerFailureKind::HandedBack => UNAVAILABLE,
                WorkerFailureKind::Failed | WorkerFailureKind::Other(_) => INTERNAL,
            },
            RouteError::Internal(_) => INTERNAL,
        };
        let param = match &e {
            RouteError::Invalid(v) => Some(
                endpoint
                    .map_or(v.field(), |endpoint| endpoint.param(v.field()))
                    .to_string(),
            ),
            RouteError::Model(_) => Some("model".into()),
            _ => None,
        };
        // The message names the body's field too (`max_tokens`, a completion's `logprobs`).
        let message = match (&e, endpoint) {
            (RouteError::Invalid(v), Some(endpoint)) => {
                let (field, public) = (v.field(), endpoint.param(v.field()));
                if field != public
                    && matches!(field, "max_new_tokens" | "top_logprobs" | "prompt_logprobs")
                {
                    e.to_string().replace(field, public)
                } else {
                    e.to_string()
                }
            }
            _ => e.to_string(),
        };
        Self {
            status,
            message,
            kind,
            param,
            code,
            retry_after: e.retry_after(),
        }
    }

    /// The `{"error": ...}` JSON document.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({ "error": self })
    }
}

/// A tenant's limit refused the request: 429 `rate_limit_exceeded`, coded by the limit.
fn rate_limited(limit: &'static str) -> Class {
    (StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded", limit)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body().to_string();
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(wait) = self.retry_after {
            let headers = response.headers_mut();
            let seconds = wait.as_millis().div_ceil(1000).max(1);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds as u64));
            let ms = wait.as_micros().div_ceil(1000) as u64;
            headers.insert("retry-after-ms", HeaderValue::from(ms));
        }
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body was not read: the connection cannot carry another request.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(kind: WorkerFailureKind) -> RouteError {
        RouteError::Worker(crate::route_error::WorkerFailure {
            kind,
            message: "worker says no".into(),
        })
    }

    #[test]
    fn every_route_error_maps_to_its_http_status_and_openai_codes() {
        let unavailable = (503, "server_error", "unavailable");
        let overloaded = (429, "rate_limit_error", "overloaded");
        let internal = (500, "server_error", "internal_error");
        let invalid = (400, "invalid_request_error", "invalid_value");
        let cases: Vec<(RouteError, (u16, &str, &str))> = vec![
            (ValidationError::invalid("stop", "bad stop").into(), invalid),
            (
                ValidationError::Unsupported {
                    field: "constraint",
                    message: "no".into(),
                }
                .into(),
                (501, "invalid_request_error", "not_implemented"),
            ),
            (RouteError::Draining, unavailable),
            (RouteError::DrainTimeout { timeout_ms: 30_000 }, unavailable),
            (RouteError::NoWorkersKnown, unavailable),
            (RouteError::NoWorkerReady { configured: 2 }, unavailable),
            (
                RouteError::NoWorkerInTime {
                    ready: 0,
                    configured: 1,
                    waited_ms: 10,
                },
                unavailable,
            ),
            (
                RouteError::FailoversExhausted {
                    reason: "lost".into(),
                    failovers: 3,
                    max_failovers: 3,
                    generated: 1,
                },
                unavailable,
            ),
            (
                RouteError::NoWorkerLeft {
                    reason: "lost".into(),
                    cause: Box::new(RouteError::NoWorkersKnown),
                    generated: 1,
                },
                unavailable,
            ),
            (
                crate::admission::QueueFull::Requests { waiting: 2, max: 2 }.into(),
                overloaded,
            ),
            (
                crate::admission::QueueFull::Tokens {
                    waiting: 2,
                    adding: 3,
                    max: 4,
                }
                .into(),
                overloaded,
            ),
            (
                RouteError::DeadlineExceeded {
                    elapsed_ms: 5,
                    generated: 0,
                },
                (504, "server_error", "timeout"),
            ),
            (
                RouteError::ClientTooSlow {
                    waited_ms: 5,
                    buffered: 63,
                    generated: 0,
                },
                (408, "invalid_request_error", "client_too_slow"),
            ),
            (worker(WorkerFailureKind::Rejected), invalid),
            (worker(WorkerFailureKind::DoesNotFit), overloaded),
            (worker(WorkerFailureKind::Failed), internal),
            (worker(WorkerFailureKind::HandedBack), unavailable),
            (worker(WorkerFailureKind::Other(5)), internal),
            (RouteError::Internal("broken".into()), internal),
        ];
        for (error, (http, kind, code)) in cases {
            let e = ApiError::from_route(error.clone(), Some(Endpoint::Completions));
            assert_eq!(
                (e.status.as_u16(), e.kind, e.code),
                (http, kind, code),
                "{error:?}"
            );
            // The same text as the gRPC front's status message.
            assert_eq!(e.message, tonic::Status::from(error.clone()).message());
            let param = matches!(error, RouteError::Invalid(_)).then(|| {
                if matches!(
                    error,
                    RouteError::Invalid(ValidationError::Unsupported { .. })
                ) {
                    "response_format".to_string()
                } else {
                    "stop".to_string()
                }
            });
            assert_eq!(e.param, param, "{error:?}");
        }
        // Without an endpoint a field keeps the router's name.
        let e = ApiError::from_route(ValidationError::invalid("max_new_tokens", "x").into(), None);
        assert_eq!(e.param.as_deref(), Some("max_new_tokens"));
        assert_eq!(e.body()["error"]["param"], "max_new_tokens");
    }

    #[test]
    fn unknown_paths_and_wrong_methods_list_every_served_endpoint() {
        let e = ApiError::no_route("/v1/embeddings");
        assert_eq!((e.status.as_u16(), e.code), (404, "unknown_url"));
        assert_eq!(
            e.message,
            "no endpoint at /v1/embeddings; this server serves POST /v1/chat/completions, \
             POST /v1/completions, POST /tokenize, POST /detokenize, GET /tokenizer_info, \
             GET /v1/models, GET /v1/models/{id} and GET /health"
        );
        let e = ApiError::wrong_method(&axum::http::Method::GET, "/tokenize");
        assert_eq!((e.status.as_u16(), e.code), (405, "method_not_allowed"));
        assert!(e.message.ends_with(SERVED), "{}", e.message);
    }

    #[test]
    fn validation_errors_name_the_openai_field() {
        let e = ApiError::from_validation(
            ValidationError::invalid("max_new_tokens", "max_new_tokens is 9; the limit is 8"),
            Endpoint::Chat,
        );
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            e.body(),
            serde_json::json!({"error": {
                "message": "max_tokens is 9; the limit is 8",
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": "invalid_value",
            }})
        );
        let e = ApiError::from_validation(ValidationError::invalid("prompt", "x"), Endpoint::Chat);
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = ApiError::from_validation(
            ValidationError::Unsupported {
                field: "constraint",
                message: "no".into(),
            },
            Endpoint::Completions,
        );
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref()),
            (501, Some("response_format"))
        );
        let e = ApiError::from_route(
            crate::model_choice::ModelChoiceError::Unknown {
                requested: "gpt-4".into(),
                served: vec!["smol".into(), "alias".into()],
            }
            .into(),
            None,
        );
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(e.code, "model_not_found");
        assert!(e.message.contains("`smol`, `alias`"), "{}", e.message);
        assert_eq!(e.param.as_deref(), Some("model"));
        let e = ApiError::from_route(
            crate::model_choice::ModelChoiceError::Unnamed {
                served: vec!["a".into(), "b".into()],
            }
            .into(),
            None,
        );
        assert_eq!((e.status.as_u16(), e.code), (400, "model_required"));
    }
}
