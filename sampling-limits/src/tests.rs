//! Tests of the range check: every bound, the order of the checks, the messages and the fields.

use super::*;

#[test]
fn validate_checks_every_range_and_check_vocab_the_bias_ids() {
    let ok = SamplingConfig {
        temperature: 0.7,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.05,
        repetition_penalty: 1.0,
        frequency_penalty: -2.0,
        presence_penalty: 2.0,
        logit_bias: vec![(2, -100.0), (9, 1.5)],
        top_logprobs: 20,
    };
    assert_eq!(ok.validate(), Ok(()));
    assert!(ok.check_vocab(10).is_ok());
    assert_eq!(
        ok.check_vocab(9).unwrap_err().to_string(),
        "logit_bias token id 9 is outside the vocabulary (size 9)"
    );
    let err = |f: &dyn Fn(&mut SamplingConfig)| {
        let mut c = ok.clone();
        f(&mut c);
        c.validate().unwrap_err().to_string()
    };
    assert!(err(&|c| c.temperature = -1.0).contains("temperature"));
    assert!(err(&|c| c.temperature = f32::INFINITY).contains("finite"));
    assert!(err(&|c| c.top_p = 0.0).contains("top_p must be in (0, 1], got 0"));
    assert!(err(&|c| c.top_p = f32::NAN).contains("top_p"));
    assert!(err(&|c| c.min_p = 1.5).contains("min_p must be in [0, 1], got 1.5"));
    assert!(err(&|c| c.min_p = -0.1).contains("min_p"));
    assert!(err(&|c| c.repetition_penalty = -1.0).contains("repetition_penalty"));
    assert!(err(&|c| c.repetition_penalty = 10.5).contains("(0, 10]"));
    assert!(err(&|c| c.frequency_penalty = 2.5)
        .contains("frequency_penalty must be in [-2, 2], got 2.5"));
    assert!(err(&|c| c.presence_penalty = f32::NAN).contains("presence_penalty"));
    let many = |c: &mut SamplingConfig| c.logit_bias = (0..301).map(|id| (id, 1.0)).collect();
    assert_eq!(err(&many), "logit_bias has 301 entries; the limit is 300");
    assert!(err(&|c| c.logit_bias.push((4, 101.0)))
        .contains("logit_bias[4] must be in [-100, 100], got 101"));
    assert!(err(&|c| c.top_logprobs = 21).contains("top_logprobs is 21; the limit is 20"));
    // repetition_penalty 10 is the top of the range; 300 bias entries are accepted.
    let mut c = ok.clone();
    c.repetition_penalty = 10.0;
    c.logit_bias = (0..300).map(|id| (id, 1.0)).collect();
    assert_eq!(c.validate(), Ok(()));
}

#[test]
fn errors_name_their_field_and_the_first_failing_check_wins() {
    let bad = SamplingConfig {
        temperature: -1.0,
        top_p: 0.0,
        top_logprobs: 21,
        ..SamplingConfig::default()
    };
    assert_eq!(bad.validate(), Err(SamplingError::Temperature(-1.0)));
    let fields = [
        (SamplingError::Temperature(-1.0), "temperature"),
        (SamplingError::TopP(0.0), "top_p"),
        (SamplingError::MinP(2.0), "min_p"),
        (SamplingError::RepetitionPenalty(0.0), "repetition_penalty"),
        (
            SamplingError::Penalty {
                name: "presence_penalty",
                value: 3.0,
            },
            "presence_penalty",
        ),
        (SamplingError::LogitBiasEntries(301), "logit_bias"),
        (
            SamplingError::LogitBias { id: 1, bias: 101.0 },
            "logit_bias",
        ),
        (SamplingError::TopLogprobs(21), "top_logprobs"),
        (
            SamplingError::LogitBiasOutsideVocab {
                id: 9,
                vocab_size: 9,
            },
            "logit_bias",
        ),
    ];
    for (error, field) in fields {
        assert_eq!(error.field(), field, "{error}");
    }
}
