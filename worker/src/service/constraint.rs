//! Structured output at the service's edge: a request's constraint compiled and replayed over its
//! `generated_ids` before the request goes to the engine, on a blocking thread (llguidance builds
//! a JSON schema's or a grammar's parser in milliseconds to seconds, too long to hold an async
//! worker thread; the router's HTTP `Tokenize` runs off the runtime the same way).

use std::sync::Arc;

use inference_proto::worker::AddRequest;
use structured_output::{
    ConstraintCompiler, ConstraintError, ConstraintState, MatchError, VocabError,
};
use structured_wire::constraint_spec;
use tonic::Code;

/// Builds the compiler of the model a worker's `Info` describes (the router builds the same one).
pub use structured_wire::compiler_from_info;

/// Structured output over the model's vocabulary, or why this model cannot have it.
pub type Constraints = Result<ConstraintCompiler, VocabError>;

/// Why a request's constraint cannot be followed (the request is refused before the engine).
#[derive(Debug, thiserror::Error)]
pub enum ConstraintRefusal {
    /// This model's vocabulary cannot serve structured output.
    #[error("structured output is not available for this model: {reason}")]
    Unavailable {
        /// Why (the [`VocabError`]'s message).
        reason: String,
    },
    /// A constrained request without stop tokens could never end a complete output.
    #[error("a constrained request needs stop_token_ids (they end a complete output)")]
    NoStopTokens,
    /// The constraint does not compile (the message names the field).
    #[error(transparent)]
    Invalid(#[from] ConstraintError),
    /// The request's `generated_ids` (a resume) are not allowed by the constraint.
    #[error("generated_ids do not follow the constraint: {0}")]
    GeneratedIds(MatchError),
    /// The blocking task compiling the constraint panicked or was cancelled.
    #[error("compiling the constraint failed: {0}")]
    Failed(tokio::task::JoinError),
}

impl ConstraintRefusal {
    /// The status code of the refusal: `INTERNAL` when compiling failed by itself, else
    /// `INVALID_ARGUMENT` (the request cannot be followed).
    pub fn code(&self) -> Code {
        match self {
            Self::Failed(_) => Code::Internal,
            _ => Code::InvalidArgument,
        }
    }
}

/// A request refused for its constraint: its id, and why.
#[derive(Debug, thiserror::Error)]
#[error("request {request_id:?}: {reason}")]
pub struct Refused {
    /// The request's id.
    pub request_id: String,
    /// Why.
    pub reason: ConstraintRefusal,
}

/// The request's constraint compiled and advanced by its `generated_ids` (`None` when it has
/// none).
///
/// Errors: no structured output for this model, no stop token to end a complete output with, an
/// invalid constraint, or generated tokens the constraint does not allow.
pub fn compile_constraint(
    constraints: &Constraints,
    request: &AddRequest,
) -> Result<Option<Box<ConstraintState>>, ConstraintRefusal> {
    let Some(constraint) = &request.constraint else {
        return Ok(None);
    };
    let compiler = constraints
        .as_ref()
        .map_err(|reason| ConstraintRefusal::Unavailable {
            reason: reason.to_string(),
        })?;
    if request.stop_token_ids.is_empty() {
        return Err(ConstraintRefusal::NoStopTokens);
    }
    let mut state = compiler.compile(constraint_spec(constraint)?)?;
    state
        .replay(&request.generated_ids)
        .map_err(ConstraintRefusal::GeneratedIds)?;
    Ok(Some(Box::new(state)))
}

/// [`compile_constraint`] on a blocking thread, giving the request back with its state. A request
/// without a constraint does not leave the async runtime.
///
/// Errors: as [`compile_constraint`], and [`ConstraintRefusal::Failed`] when the blocking task
/// panics.
pub async fn compile_off_runtime(
    constraints: &Arc<Constraints>,
    request: AddRequest,
) -> Result<(AddRequest, Option<Box<ConstraintState>>), Refused> {
    if request.constraint.is_none() {
        return Ok((request, None));
    }
    let request_id = request.request_id.clone();
    let constraints = constraints.clone();
    let compiled = tokio::task::spawn_blocking(move || {
        compile_constraint(&constraints, &request).map(|state| (request, state))
    })
    .await;
    match compiled {
        Ok(Ok(compiled)) => Ok(compiled),
        Ok(Err(reason)) => Err(Refused { request_id, reason }),
        Err(e) => Err(Refused {
            request_id,
            reason: ConstraintRefusal::Failed(e),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inference_proto::public::{constraint::Kind, Constraint};
    use structured_output::VocabSource;

    /// A compiler over the vocabulary `<eos>` (control, id 0), `a`, `b`, `c`.
    fn abc() -> Constraints {
        let tokens: Vec<String> = ["<eos>", "a", "b", "c"].map(String::from).to_vec();
        Ok(ConstraintCompiler::new(VocabSource {
            model: "gpt2",
            tokens: &tokens,
            token_types: &[3, 1, 1, 1],
            vocab_size: 4,
            eos_token_ids: &[0],
        })
        .unwrap())
    }

    fn regex_request(regex: &str, generated: Vec<u32>, stops: Vec<u32>) -> AddRequest {
        AddRequest {
            request_id: "r".into(),
            prompt_ids: vec![1],
            max_new_tokens: 10,
            stop_token_ids: stops,
            generated_ids: generated,
            constraint: Some(Constraint {
                kind: Some(Kind::Regex(regex.into())),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn constraints_compile_and_replay_generated_ids_or_are_refused_with_the_reason() {
        let compiler = abc();
        let unconstrained = AddRequest::default();
        assert!(compile_constraint(&compiler, &unconstrained)
            .unwrap()
            .is_none());
        // Resumed after "ab": only "c" may follow, then the output is complete.
        let mut state = compile_constraint(&compiler, &regex_request("abc", vec![1, 2], vec![0]))
            .unwrap()
            .unwrap();
        assert_eq!(state.generated(), 2);
        let mask = state.compute_mask().unwrap();
        assert!(mask.allows(3) && mask.num_allowed() == 1);
        let refused = |request: AddRequest| {
            let e = compile_constraint(&compiler, &request).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e}");
            e.to_string()
        };
        let e = refused(regex_request("abc", vec![2], vec![0]));
        assert!(
            e.starts_with(
                "generated_ids do not follow the constraint: token 2 at generated index 0"
            ),
            "{e}"
        );
        let e = refused(regex_request("abc", vec![], vec![]));
        assert!(e.contains("needs stop_token_ids"), "{e}");
        let e = refused(regex_request("(", vec![], vec![0]));
        assert!(e.starts_with("constraint.regex is invalid"), "{e}");
        let unavailable: Constraints = Err(VocabError::Environment("no tokenizer".into()));
        let e = compile_constraint(&unavailable, &regex_request("a", vec![], vec![0])).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert_eq!(
            e.to_string(),
            "structured output is not available for this model: cannot build the token \
             environment: no tokenizer"
        );
    }

    #[test]
    fn an_empty_constraint_is_refused_as_invalid() {
        let mut empty = regex_request("a", vec![], vec![0]);
        empty.constraint = Some(Constraint { kind: None });
        let e = compile_constraint(&abc(), &empty).unwrap_err();
        assert!(matches!(
            e,
            ConstraintRefusal::Invalid(ConstraintError::Empty)
        ));
        assert_eq!(e.code(), Code::InvalidArgument);
        assert_eq!(
            e.to_string(),
            "constraint is empty: set one of json_schema, json_object, regex, lark, choice"
        );
    }

    #[tokio::test]
    async fn compiling_off_the_runtime_gives_the_request_back_or_its_id_with_the_reason() {
        let compiler = Arc::new(abc());
        let (request, state) = compile_off_runtime(&compiler, AddRequest::default())
            .await
            .unwrap();
        assert_eq!((request, state.is_none()), (AddRequest::default(), true));
        let constrained = regex_request("abc", vec![1], vec![0]);
        let (request, state) = compile_off_runtime(&compiler, constrained.clone())
            .await
            .unwrap();
        assert_eq!(request, constrained);
        assert_eq!(state.unwrap().generated(), 1);
        let mut bad = regex_request("(", vec![], vec![0]);
        bad.request_id = "bad".into();
        let refused = compile_off_runtime(&compiler, bad).await.unwrap_err();
        assert_eq!(refused.request_id, "bad");
        assert_eq!(refused.reason.code(), Code::InvalidArgument);
        assert!(
            refused
                .reason
                .to_string()
                .starts_with("constraint.regex is invalid"),
            "{refused}"
        );
    }
}
