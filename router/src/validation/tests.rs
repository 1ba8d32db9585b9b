use super::*;
use crate::request::{GenerationRequest, Prompt};
use inference_proto::public::{ChatMessage, GenerateRequest};
use inference_proto::sampling_limits::SamplingConfig;
use tonic::Status;

/// The router's default limits (the `limits` settings' defaults).
fn limits() -> RequestLimits {
    RequestLimits::default()
}

/// `check_request` on a gRPC request, as the gRPC front runs it.
fn check(r: &GenerateRequest) -> Result<SamplingConfig, Status> {
    let req = GenerationRequest::try_from(r.clone())?;
    Ok(check_request(&req, &limits())?)
}

fn req() -> GenerateRequest {
    GenerateRequest {
        prompt: "hi".into(),
        ..Default::default()
    }
}

fn err(r: &GenerateRequest) -> String {
    let status = check(r).unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    status.message().to_string()
}

fn off() -> SamplingConfig {
    SamplingConfig {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        logit_bias: Vec::new(),
        top_logprobs: 0,
    }
}

#[test]
fn accepts_defaults() {
    let s = check(&req()).unwrap();
    assert_eq!(s, off());
}

#[test]
fn accepts_sampling_extremes_and_normalises() {
    let r = GenerateRequest {
        temperature: 0.7,
        top_k: 40,
        top_p: Some(0.9),
        min_p: 1.0,
        repetition_penalty: 10.0,
        frequency_penalty: -2.0,
        presence_penalty: 2.0,
        logit_bias: (0..300)
            .map(|id| (299 - id, id as f32 / 3.0 - 50.0))
            .collect(),
        logprobs: true,
        top_logprobs: 20,
        ..req()
    };
    let s = check(&r).unwrap();
    assert_eq!(s.logit_bias.len(), 300);
    assert!(s.logit_bias.windows(2).all(|w| w[0].0 < w[1].0), "sorted");
    assert_eq!(s.logit_bias[0], (0, 299.0 / 3.0 - 50.0));
    assert_eq!(
        (s.min_p, s.repetition_penalty, s.top_logprobs),
        (1.0, 10.0, 20)
    );
    let wire = sampling_params(&s, 42);
    assert_eq!(wire.seed, 42);
    assert_eq!(wire.top_p, 0.9);
    assert_eq!(wire.top_k, 40);
    assert_eq!(wire.min_p, 1.0);
    assert_eq!(wire.repetition_penalty, 10.0);
    assert_eq!((wire.frequency_penalty, wire.presence_penalty), (-2.0, 2.0));
    assert_eq!(wire.logit_bias.len(), 300);
    assert_eq!(wire.logit_bias[&299], -50.0);
    assert_eq!(wire.top_logprobs, 20);
    // repetition_penalty 0 (unset) is off, which the worker receives as 1.
    let s = check(&GenerateRequest {
        repetition_penalty: 0.0,
        ..req()
    })
    .unwrap();
    assert_eq!(s.repetition_penalty, 1.0);
    assert_eq!(sampling_params(&s, 0).repetition_penalty, 1.0);
}

#[test]
fn rejects_min_p_outside_0_1() {
    for bad in [-0.1, 1.5, f32::NAN] {
        let m = err(&GenerateRequest {
            min_p: bad,
            ..req()
        });
        assert!(m.contains("min_p must be in [0, 1]"), "{m}");
        assert!(m.contains(&bad.to_string()), "{m}");
    }
}

#[test]
fn rejects_repetition_penalty_outside_0_10() {
    for bad in [-1.0, 10.5, f32::INFINITY, f32::NAN] {
        let m = err(&GenerateRequest {
            repetition_penalty: bad,
            ..req()
        });
        assert!(m.contains("repetition_penalty must be in (0, 10]"), "{m}");
        assert!(m.contains(&bad.to_string()), "{m}");
    }
}

#[test]
fn rejects_frequency_and_presence_penalties_outside_2() {
    let m = err(&GenerateRequest {
        frequency_penalty: 2.5,
        ..req()
    });
    assert_eq!(m, "frequency_penalty must be in [-2, 2] (0 = off), got 2.5");
    let m = err(&GenerateRequest {
        presence_penalty: -3.0,
        ..req()
    });
    assert_eq!(m, "presence_penalty must be in [-2, 2] (0 = off), got -3");
    assert!(err(&GenerateRequest {
        presence_penalty: f32::NAN,
        ..req()
    })
    .contains("presence_penalty"));
}

#[test]
fn rejects_logit_bias_values_and_counts() {
    let m = err(&GenerateRequest {
        logit_bias: [(5, 1.0), (7, 100.5), (9, -101.0)].into(),
        ..req()
    });
    assert_eq!(m, "logit_bias[7] must be in [-100, 100], got 100.5");
    assert!(err(&GenerateRequest {
        logit_bias: [(3, f32::NAN)].into(),
        ..req()
    })
    .contains("logit_bias[3]"));
    let m = err(&GenerateRequest {
        logit_bias: (0..301).map(|id| (id, 1.0)).collect(),
        ..req()
    });
    assert_eq!(m, "logit_bias has 301 entries; the limit is 300");
}

#[test]
fn rejects_top_logprobs_above_20() {
    let m = err(&GenerateRequest {
        top_logprobs: 21,
        ..req()
    });
    assert_eq!(m, "top_logprobs is 21; the limit is 20");
}

#[test]
fn logit_bias_ids_against_the_vocabulary() {
    let s = SamplingConfig {
        logit_bias: vec![(3, 1.0), (99, -1.0), (100, 2.0), (500, 0.0)],
        ..off()
    };
    let e = check_vocab(&s, 100).unwrap_err();
    assert_eq!(e.field(), "logit_bias");
    let e = Status::from(e);
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        e.message(),
        "logit_bias token id 100 is outside this model's vocabulary of 100 tokens (ids 0..=99)"
    );
    assert!(check_vocab(&s, 501).is_ok());
    assert!(check_vocab(&off(), 1).is_ok());
}

#[test]
fn rejects_bad_shapes_and_ranges() {
    assert!(err(&GenerateRequest::default()).contains("prompt is empty"));
    let mut both = req();
    both.messages.push(ChatMessage {
        role: "user".into(),
        content: "x".into(),
        ..Default::default()
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
fn empty_prompts_are_named() {
    // (A constraint passes these checks: it is compiled against the vocabulary by
    // `check_constraint`, covered by the structured-output integration tests.)
    let r = GenerateRequest {
        constraint: Some(inference_proto::public::Constraint::default()),
        ..req()
    };
    assert!(check(&r).is_ok());
    let l = limits();
    for (prompt, field, message) in [
        (Prompt::Chat(Vec::new()), "messages", "messages is empty"),
        (
            Prompt::Ids(Vec::new()),
            "prompt",
            "prompt is empty (no token ids)",
        ),
    ] {
        let req = GenerationRequest {
            prompt,
            ..Default::default()
        };
        let e = check_request(&req, &l).unwrap_err();
        assert_eq!((e.field(), e.to_string().as_str()), (field, message));
    }
}

#[test]
fn token_id_prompts_against_the_vocabulary() {
    assert!(check_prompt_ids(&Prompt::Ids(vec![0, 99]), 100).is_ok());
    let e = check_prompt_ids(&Prompt::Ids(vec![5, 100, 200]), 100).unwrap_err();
    assert_eq!(
        e.to_string(),
        "prompt token 1 is id 100, outside this model's vocabulary of 100 tokens"
    );
    let text = Prompt::Text {
        text: "x".into(),
        plain_text: false,
    };
    assert!(check_prompt_ids(&text, 1).is_ok());
}

#[test]
fn prompt_against_context() {
    let l = limits();
    assert_eq!(check_prompt(10, None, 100, &l).unwrap(), 90);
    assert_eq!(check_prompt(10, Some(5), 100, &l).unwrap(), 5);
    assert!(check_prompt(100, None, 100, &l)
        .unwrap_err()
        .to_string()
        .contains("prompt is 100 tokens; this model's context is 100 tokens"));
    assert!(check_prompt(10, Some(91), 100, &l)
        .unwrap_err()
        .to_string()
        .contains("at most 90"));
    assert!(check_prompt(0, None, 100, &l).is_err());
    // A maximum lowered below the default lowers the default with it.
    let low = RequestLimits {
        max_new_tokens: 7,
        ..limits()
    };
    assert_eq!(low.default_new_tokens(), 7);
    assert_eq!(check_prompt(10, None, 100, &low).unwrap(), 7);
    assert_eq!(check_prompt(95, None, 100, &low).unwrap(), 5);
    let l = RequestLimits {
        max_input_tokens: 5,
        ..limits()
    };
    assert!(check_prompt(6, None, 100, &l)
        .unwrap_err()
        .to_string()
        .contains("limit is 5"));
}
