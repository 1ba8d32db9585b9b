//! Structured output: a JSON schema, regex, Lark grammar or choice list from the input, checked as
//! the router checks a request's constraint ([`router::validation::check_constraint`]) and, when
//! accepted, compiled as the worker compiles it and driven for a few tokens, over the tiny model's
//! vocabulary ([`crate::tiny_model`]).
//!
//! Properties: no panic; a refusal is a typed `INVALID_ARGUMENT` naming `constraint`; an accepted
//! constraint compiles and has a first mask (what the router's check promises the worker), and a
//! token the mask allows is never rejected when the state advances by it.

use inference_proto::public::{constraint::Kind, ChoiceList, Constraint, GenerateRequest};
use router::request::GenerationRequest;
use router::validation::check_constraint;
use structured_output::{MatchError, Progress};
use structured_wire::constraint_spec;

use crate::tiny_model;

/// Tokens a compiled constraint is driven for at most.
const MAX_STEPS: usize = 16;

/// `constraint`. First byte modulo 4: 0 `json_schema`, 1 `regex`, 2 `lark`, 3 `choice` (the rest
/// split at NUL bytes); the rest of the input, lossily as UTF-8, is the constraint's text.
pub fn constraint(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest).into_owned();
    let kind = match kind % 4 {
        0 => Kind::JsonSchema(text),
        1 => Kind::Regex(text),
        2 => Kind::Lark(text),
        _ => Kind::Choice(ChoiceList {
            choices: text.split('\0').map(str::to_string).collect(),
        }),
    };
    let constraint = Constraint { kind: Some(kind) };
    let request = GenerateRequest {
        prompt: "hi".into(),
        constraint: Some(constraint.clone()),
        ..Default::default()
    };
    let request = GenerationRequest::try_from(request).expect("a plain prompt converts");
    let model = tiny_model::model();
    if let Err(e) = check_constraint(&request, model) {
        assert_eq!(e.field(), "constraint", "{e:?}");
        assert_eq!(e.grpc_code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(!e.to_string().is_empty());
        return;
    }
    let compiler = model.constraints.wait().expect("the tiny model's compiler");
    let spec = constraint_spec(&constraint).expect("a constraint with a kind");
    let mut state = compiler
        .compile(spec)
        .expect("a constraint the router accepted compiles");
    let eos = &model.eos_token_ids;
    for step in 0..MAX_STEPS {
        let mask = match state.compute_mask() {
            Ok(mask) => mask,
            Err(e) => {
                assert!(
                    step > 0,
                    "the router accepted a constraint with no first mask: {e}"
                );
                assert!(matches!(e, MatchError::Internal(_)), "{e:?}");
                return;
            }
        };
        let Some(token) =
            (0..compiler.vocab_size() as u32).find(|id| mask.allows(*id) && !eos.contains(id))
        else {
            return; // only EOS: complete
        };
        match state.advance(token) {
            Ok(Progress::Complete) => return,
            Ok(Progress::Open) => {}
            Err(MatchError::Rejected { .. }) => {
                panic!("token {token} allowed by the mask and then rejected")
            }
            Err(e) => {
                assert!(matches!(e, MatchError::Internal(_)), "{e:?}");
                return;
            }
        }
    }
}
