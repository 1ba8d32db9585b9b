//! Requests on both fronts, through the router's one validation pass
//! ([`router::validation::validate`]) against the tiny model ([`crate::tiny_model`]).
//!
//! Properties: no panic; every rejection is a typed error of the front (an OpenAI [`ApiError`] with
//! a client status, a [`ValidationError`] answered `INVALID_ARGUMENT` or `UNIMPLEMENTED`) with a
//! message; and every accepted request is one a worker accepts too: a non-empty prompt of ids inside
//! the vocabulary that leaves room in the context for `max_new_tokens` (at least 1), within the
//! limits, with sampling parameters that pass the worker's own checks.

use inference_proto::public::GenerateRequest;
use prost::Message as _;
use router::openai::error::{ApiError, Endpoint};
use router::openai::schema;
use router::request::GenerationRequest;
use router::validation::{validate, RequestLimits, ValidRequest, ValidationError};
use tonic::Code;

use crate::tiny_model;

/// `openai-json`: `data` as the body of `POST /v1/chat/completions` and of `POST /v1/completions`:
/// parsing ([`schema::parse`]), `priority`, the translation into generation requests
/// ([`schema::CompletionBody::into_requests`]) and the validation of each, as the HTTP front runs
/// them.
pub fn openai_json(data: &[u8]) {
    let limits = RequestLimits::default();
    let body = match schema::parse(data) {
        Ok(body) => body,
        Err(e) => return check_api_error(&e),
    };
    if let Err(e) = body.priority() {
        check_api_error(&e);
    }
    for endpoint in [Endpoint::Chat, Endpoint::Completions] {
        let (requests, shape) = match body.clone().into_requests(endpoint, data.len()) {
            Ok(translated) => translated,
            Err(e) => {
                check_api_error(&e);
                continue;
            }
        };
        assert!(!requests.is_empty(), "a body accepted with no request");
        assert!((1..=16).contains(&shape.n), "n = {} accepted", shape.n);
        for request in requests {
            let request_stops = request.stop.len();
            match validate(request, tiny_model::model(), &limits) {
                Ok(valid) => check_valid(&valid, &limits, request_stops),
                Err(e) => check_api_error(&ApiError::from_validation(e, endpoint)),
            }
        }
    }
}

/// `generate-request`: `data` as a protobuf `GenerateRequest`, decoded as tonic decodes it, then
/// converted ([`GenerationRequest::try_from`]) and validated as the gRPC front runs it.
pub fn generate_request(data: &[u8]) {
    let limits = RequestLimits::default();
    let Ok(request) = GenerateRequest::decode(data) else {
        return; // answered by tonic as a decode error before the router sees it
    };
    let request = match GenerationRequest::try_from(request) {
        Ok(request) => request,
        Err(e) => return check_validation_error(&e),
    };
    let request_stops = request.stop.len();
    match validate(request, tiny_model::model(), &limits) {
        Ok(valid) => check_valid(&valid, &limits, request_stops),
        Err(e) => check_validation_error(&e),
    }
}

/// A refusal of the HTTP front: a client error (4xx) or 501 with an OpenAI error object.
fn check_api_error(e: &ApiError) {
    let status = e.status.as_u16();
    assert!(
        (400..500).contains(&status) || status == 501,
        "a bad request answered {status}: {e:?}"
    );
    assert!(!e.message.is_empty(), "an error without a message: {e:?}");
    assert_eq!(e.kind, "invalid_request_error", "{e:?}");
}

/// A refusal of the validation pass: typed, naming a field, with a message.
fn check_validation_error(e: &ValidationError) {
    assert!(!e.field().is_empty(), "an error naming no field: {e:?}");
    assert!(
        !e.to_string().is_empty(),
        "an error without a message: {e:?}"
    );
    let code = e.grpc_code();
    assert!(
        matches!(code, Code::InvalidArgument | Code::Unimplemented),
        "a bad request answered {code:?}: {e:?}"
    );
}

/// An accepted request is one the worker accepts.
fn check_valid(valid: &ValidRequest, limits: &RequestLimits, request_stops: usize) {
    let info = tiny_model::info();
    let prompt = valid.prompt_ids.len();
    assert!(prompt >= 1, "an empty prompt accepted");
    assert!(
        valid.prompt_ids.iter().all(|&id| id < info.vocab_size),
        "prompt ids outside the vocabulary accepted: {:?}",
        valid.prompt_ids
    );
    assert!(valid.max_new_tokens >= 1, "max_new_tokens 0 accepted");
    assert!(
        valid.max_new_tokens <= limits.max_new_tokens,
        "max_new_tokens {} above the limit",
        valid.max_new_tokens
    );
    assert!(
        prompt + valid.max_new_tokens as usize <= tiny_model::CONTEXT_LENGTH as usize,
        "prompt {prompt} + max_new_tokens {} past the context",
        valid.max_new_tokens
    );
    assert!(valid.stop.len() <= limits.max_stop_sequences as usize);
    assert_eq!(
        valid.stop.len(),
        request_stops,
        "stop strings dropped or added"
    );
    assert!(
        valid.stop.iter().all(|s| !s.is_empty()),
        "an empty stop string accepted"
    );
    assert!(
        valid.prompt_logprobs.is_none_or(|k| k <= 20),
        "prompt_logprobs {:?} accepted",
        valid.prompt_logprobs
    );
    valid
        .sampling
        .validate()
        .expect("the worker refuses sampling parameters the router accepted");
    valid
        .sampling
        .check_vocab(info.vocab_size as usize)
        .expect("the worker refuses a logit bias the router accepted");
}
