//! Request validation: every check returns `INVALID_ARGUMENT` with a message that gives the numbers.
//!
//! Checks run in two phases: [`check_request`] before tokenization (shape, ranges, stop strings,
//! size) and [`check_prompt`] after it (prompt length against the context and the limits).

use inference_proto::public::GenerateRequest;
use prost::Message;
use tonic::Status;

use crate::config::Limits;

/// Sampling parameters after validation, with defaults applied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// In (0, 1]; 1 = off.
    pub top_p: f32,
}

/// Checks everything that does not need the tokenizer. Returns the sampling parameters.
///
/// Errors: `INVALID_ARGUMENT` for a request larger than `max_request_bytes`, both or neither of
/// `prompt`/`messages`, an empty message role, `max_new_tokens` of 0 or above the limit, a negative or
/// non-finite temperature, `top_p` outside (0, 1], too many, empty or too long stop strings.
pub fn check_request(req: &GenerateRequest, limits: &Limits) -> Result<Sampling, Status> {
    let size = req.encoded_len();
    if size > limits.max_request_bytes as usize {
        return invalid(format!(
            "request is {size} bytes; the limit is {} bytes",
            limits.max_request_bytes
        ));
    }
    match (req.prompt.is_empty(), req.messages.is_empty()) {
        (false, false) => return invalid("set either prompt or messages, not both".into()),
        (true, true) => return invalid("prompt is empty (set prompt or messages)".into()),
        _ => {}
    }
    if let Some(i) = req.messages.iter().position(|m| m.role.is_empty()) {
        return invalid(format!("messages[{i}].role is empty"));
    }
    if let Some(n) = req.max_new_tokens {
        if n == 0 {
            return invalid("max_new_tokens must be at least 1".into());
        }
        if n > limits.max_new_tokens {
            return invalid(format!(
                "max_new_tokens is {n}; the limit is {}",
                limits.max_new_tokens
            ));
        }
    }
    if !(req.temperature.is_finite() && req.temperature >= 0.0) {
        return invalid(format!(
            "temperature must be a finite number >= 0 (0 = greedy), got {}",
            req.temperature
        ));
    }
    let top_p = req.top_p.unwrap_or(1.0);
    if top_p.is_nan() || top_p <= 0.0 || top_p > 1.0 {
        return invalid(format!("top_p must be in (0, 1], got {top_p}"));
    }
    if req.stop.len() > limits.max_stop_sequences as usize {
        return invalid(format!(
            "{} stop sequences given; the limit is {}",
            req.stop.len(),
            limits.max_stop_sequences
        ));
    }
    for (i, stop) in req.stop.iter().enumerate() {
        let chars = stop.chars().count();
        if chars == 0 {
            return invalid(format!("stop[{i}] is empty"));
        }
        if chars > limits.max_stop_sequence_chars as usize {
            return invalid(format!(
                "stop[{i}] is {chars} characters; the limit is {}",
                limits.max_stop_sequence_chars
            ));
        }
    }
    Ok(Sampling {
        temperature: req.temperature,
        top_k: req.top_k,
        top_p,
    })
}

/// Checks the tokenized prompt and returns the effective `max_new_tokens`.
///
/// Unset `max_new_tokens` becomes `default_max_new_tokens`, capped by the room left in the context.
///
/// Errors: `INVALID_ARGUMENT` for a prompt with no tokens, a prompt that leaves no room in the context
/// or passes `max_input_tokens`, and a `max_new_tokens` that does not fit in the context after the
/// prompt.
pub fn check_prompt(
    prompt_tokens: usize,
    requested_max_new: Option<u32>,
    context_length: u32,
    limits: &Limits,
) -> Result<u32, Status> {
    let ctx = context_length as usize;
    if prompt_tokens == 0 {
        return invalid("prompt encodes to no tokens".into());
    }
    if prompt_tokens >= ctx {
        return invalid(format!(
            "prompt is {prompt_tokens} tokens; this model's context is {ctx} tokens \
             (the prompt must leave room for at least one new token)"
        ));
    }
    let max_input = limits.max_input_tokens as usize;
    if max_input > 0 && prompt_tokens > max_input {
        return invalid(format!(
            "prompt is {prompt_tokens} tokens; the limit is {max_input} tokens"
        ));
    }
    let room = (ctx - prompt_tokens) as u32;
    match requested_max_new {
        Some(n) if n > room => invalid(format!(
            "prompt ({prompt_tokens} tokens) + max_new_tokens ({n}) exceeds this model's \
             context of {ctx} tokens; at most {room} new tokens fit"
        )),
        Some(n) => Ok(n),
        None => Ok(limits.default_max_new_tokens.min(room).max(1)),
    }
}

fn invalid<T>(message: String) -> Result<T, Status> {
    Err(Status::invalid_argument(message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use inference_proto::public::ChatMessage;

    fn req() -> GenerateRequest {
        GenerateRequest {
            prompt: "hi".into(),
            ..Default::default()
        }
    }

    fn err(r: &GenerateRequest) -> String {
        let status = check_request(r, &Limits::default()).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        status.message().to_string()
    }

    #[test]
    fn accepts_defaults() {
        let s = check_request(&req(), &Limits::default()).unwrap();
        assert_eq!(
            s,
            Sampling {
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0
            }
        );
    }

    #[test]
    fn rejects_bad_shapes_and_ranges() {
        assert!(err(&GenerateRequest::default()).contains("prompt is empty"));
        let mut both = req();
        both.messages.push(ChatMessage {
            role: "user".into(),
            content: "x".into(),
        });
        assert!(err(&both).contains("not both"));
        assert!(err(&GenerateRequest {
            max_new_tokens: Some(0),
            ..req()
        })
        .contains("at least 1"));
        assert!(err(&GenerateRequest {
            max_new_tokens: Some(5000),
            ..req()
        })
        .contains("4096"));
        assert!(err(&GenerateRequest {
            temperature: -0.5,
            ..req()
        })
        .contains("-0.5"));
        assert!(err(&GenerateRequest {
            temperature: f32::NAN,
            ..req()
        })
        .contains("finite"));
        assert!(err(&GenerateRequest {
            top_p: Some(0.0),
            ..req()
        })
        .contains("(0, 1]"));
        assert!(err(&GenerateRequest {
            top_p: Some(1.5),
            ..req()
        })
        .contains("1.5"));
        let stops = GenerateRequest {
            stop: vec!["a".into(); 9],
            ..req()
        };
        assert!(err(&stops).contains("9 stop sequences given; the limit is 8"));
        assert!(err(&GenerateRequest {
            stop: vec![String::new()],
            ..req()
        })
        .contains("stop[0] is empty"));
        let big = GenerateRequest {
            prompt: "x".repeat(2 << 20),
            ..req()
        };
        assert!(err(&big).contains("bytes"));
    }

    #[test]
    fn prompt_against_context() {
        let l = Limits::default();
        assert_eq!(check_prompt(10, None, 100, &l).unwrap(), 90);
        assert_eq!(check_prompt(10, Some(5), 100, &l).unwrap(), 5);
        assert!(check_prompt(100, None, 100, &l)
            .unwrap_err()
            .message()
            .contains("prompt is 100 tokens; this model's context is 100 tokens"));
        assert!(check_prompt(10, Some(91), 100, &l)
            .unwrap_err()
            .message()
            .contains("at most 90"));
        assert!(check_prompt(0, None, 100, &l).is_err());
        let l = Limits {
            max_input_tokens: 5,
            ..Limits::default()
        };
        assert!(check_prompt(6, None, 100, &l)
            .unwrap_err()
            .message()
            .contains("limit is 5"));
    }
}
