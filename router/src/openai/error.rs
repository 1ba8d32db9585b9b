//! OpenAI's error object (`{"error": {"message", "type", "param", "code"}}`) and the mapping of the
//! router's errors onto HTTP statuses: the only place where they meet HTTP.
//!
//! | router error | HTTP | `type` | `code` |
//! |---|---|---|---|
//! | body not JSON, wrong type or value, [`ValidationError::Invalid`], `INVALID_ARGUMENT` | 400 | `invalid_request_error` | `invalid_type` / `invalid_value` / `invalid_json` |
//! | unknown model | 404 | `invalid_request_error` | `model_not_found` |
//! | unknown path / served path with another method | 404 / 405 | `invalid_request_error` | `unknown_url` / `method_not_allowed` |
//! | body above `max_request_bytes` | 413 | `invalid_request_error` | `request_too_large` |
//! | admission queue full (`RESOURCE_EXHAUSTED`) | 429 | `rate_limit_error` | `overloaded` |
//! | no worker ready, draining (`UNAVAILABLE`) | 503 | `server_error` | `unavailable` |
//! | no, malformed or wrong API key ([`Refusal`]) | 401 | `invalid_request_error` | `invalid_api_key` |
//! | [`ValidationError::Unsupported`], `UNIMPLEMENTED` | 501 | `invalid_request_error` | `not_implemented` |
//! | anything else | 500 | `server_error` | `internal_error` |

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tonic::{Code, Status};

use crate::auth::Refusal;
use crate::generate::GenerateError;
use crate::validation::ValidationError;

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
            (Endpoint::Completions, "top_logprobs") => "logprobs",
            (_, field) => field,
        }
    }
}

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
        }
    }

    /// 404 `model_not_found` for the model `name`; `served` lists the names that are served.
    pub fn model_not_found(name: &str, served: &[String]) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "the model `{name}` does not exist; this server serves {}",
                served
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: "model_not_found",
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
        }
    }

    /// 404 for a path this server does not serve.
    pub fn no_route(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("no endpoint at {path}; this server serves POST /v1/chat/completions, POST /v1/completions, GET /v1/models and GET /health"),
            kind: "invalid_request_error",
            param: None,
            code: "unknown_url",
        }
    }

    /// 405 for a served path asked with another method (e.g. `GET /v1/chat/completions`).
    pub fn wrong_method(method: &axum::http::Method, path: &str) -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("{method} is not allowed on {path}; this server serves POST /v1/chat/completions, POST /v1/completions, POST /tokenize, GET /v1/models and GET /health"),
            kind: "invalid_request_error",
            param: None,
            code: "method_not_allowed",
        }
    }

    /// A validation error of `endpoint`'s request.
    pub fn from_validation(e: ValidationError, endpoint: Endpoint) -> Self {
        let param = Some(endpoint.param(e.field()).to_string());
        match e {
            ValidationError::Invalid { message, .. } => {
                Self::bad_request("invalid_value", param, message)
            }
            ValidationError::Unsupported { message, .. } => Self {
                status: StatusCode::NOT_IMPLEMENTED,
                message,
                kind: "invalid_request_error",
                param,
                code: "not_implemented",
            },
        }
    }

    /// A generation error of `endpoint`'s request.
    pub fn from_generate(e: GenerateError, endpoint: Endpoint) -> Self {
        match e {
            GenerateError::Invalid(e) => Self::from_validation(e, endpoint),
            GenerateError::Refused(status) => Self::from_status(&status),
        }
    }

    /// A gRPC status from the pool or a worker (see the module table).
    pub fn from_status(status: &Status) -> Self {
        let (http, kind, code) = match status.code() {
            Code::InvalidArgument => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_value",
            ),
            Code::ResourceExhausted => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "overloaded",
            ),
            Code::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "unavailable",
            ),
            Code::Unimplemented => (
                StatusCode::NOT_IMPLEMENTED,
                "invalid_request_error",
                "not_implemented",
            ),
            Code::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "server_error", "timeout"),
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal_error",
            ),
        };
        Self {
            status: http,
            message: status.message().to_string(),
            kind,
            param: None,
            code,
        }
    }

    /// The `{"error": ...}` JSON document.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({ "error": self })
    }
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

    #[test]
    fn statuses_map_to_http_and_openai_codes() {
        let cases = [
            (
                Status::resource_exhausted("full"),
                429,
                "rate_limit_error",
                "overloaded",
            ),
            (
                Status::unavailable("none"),
                503,
                "server_error",
                "unavailable",
            ),
            (
                Status::unimplemented("no"),
                501,
                "invalid_request_error",
                "not_implemented",
            ),
            (
                Status::invalid_argument("bad"),
                400,
                "invalid_request_error",
                "invalid_value",
            ),
            (Status::internal("x"), 500, "server_error", "internal_error"),
        ];
        for (status, http, kind, code) in cases {
            let e = ApiError::from_status(&status);
            assert_eq!((e.status.as_u16(), e.kind, e.code), (http, kind, code));
            assert_eq!(e.message, status.message());
        }
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
                "message": "max_new_tokens is 9; the limit is 8",
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
        let e = ApiError::model_not_found("gpt-4", &["smol".into(), "alias".into()]);
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(e.code, "model_not_found");
        assert!(e.message.contains("`smol`, `alias`"), "{}", e.message);
    }
}
