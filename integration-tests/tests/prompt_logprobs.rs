//! Prompt logprobs (issue 29) with real router and worker processes: over gRPC
//! (`GenerateRequest.prompt_logprobs`) a prompt's tokens are scored, bitwise as a greedy generation
//! of the same tokens (teacher forcing) reports them; over HTTP completions' `echo` with
//! `logprobs` gives the same through the official `openai` Python SDK
//! (integration-tests/python/test_echo.py), also with `max_tokens: 0` and a long prompt. On the tiny
//! model (context 4,096, a 4,000-token prompt) and on SmolLM2 (a 1,000-token prompt).
use std::path::Path;

use inference_proto::public::{GenerateRequest, GenerateResponse};
use integration_tests::openai::{run_sdk_test, start};
use integration_tests::{real_model, tiny_model_with_context};
use serde_json::json;

const PROMPT: &str = "The quick brown fox jumps over the lazy dog because";

/// One streamed call's messages.
async fn messages(
    client: &mut integration_tests::PublicClient,
    request: GenerateRequest,
) -> Vec<GenerateResponse> {
    let mut stream = client.generate(request).await.unwrap().into_inner();
    let mut out = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        out.push(m);
    }
    out
}

async fn check(model: &Path, long_prompt: usize) {
    let h = start(model, &[], &["--served-model-name", "m"], &[]).await;
    let mut grpc = h.cluster.client().await;
    let request = GenerateRequest {
        prompt: PROMPT.into(),
        max_new_tokens: Some(12),
        ignore_eos: true,
        top_logprobs: 5,
        prompt_logprobs: Some(5),
        ..Default::default()
    };
    let out = messages(&mut grpc, request.clone()).await;
    let prompt = &out[0].prompt_tokens;
    assert!(out[1..].iter().all(|m| m.prompt_tokens.is_empty()));
    assert!(prompt.len() > 5);
    assert!(prompt[0].logprob.is_none() && prompt[0].top_logprobs.is_empty());
    assert!(prompt[1..]
        .iter()
        .all(|t| t.logprob.is_some_and(|l| l <= 0.0) && t.top_logprobs.len() == 5));
    let generated: Vec<_> = out.iter().flat_map(|m| m.tokens.clone()).collect();
    let text: String = out.iter().map(|m| m.text.as_str()).collect();
    // Without prompt_logprobs the same request sends no prompt tokens and the same generation.
    let plain = messages(
        &mut grpc,
        GenerateRequest {
            prompt_logprobs: None,
            ..request
        },
    )
    .await;
    assert!(plain.iter().all(|m| m.prompt_tokens.is_empty()));
    let plain_ids: Vec<u32> = plain
        .iter()
        .flat_map(|m| m.tokens.iter().map(|t| t.id))
        .collect();
    assert_eq!(
        plain_ids,
        generated.iter().map(|t| t.id).collect::<Vec<_>>()
    );
    // Bad counts are refused.
    let err = grpc
        .generate(GenerateRequest {
            prompt: PROMPT.into(),
            prompt_logprobs: Some(21),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("prompt_logprobs"),
        "{}",
        err.message()
    );

    let prompt_ids: Vec<u32> = prompt.iter().map(|t| t.id).collect();
    let long_ids: Vec<u32> = prompt_ids
        .iter()
        .copied()
        .cycle()
        .take(long_prompt)
        .collect();
    let expected = json!({
        "prompt": PROMPT,
        "prompt_ids": prompt_ids,
        "generated_ids": generated.iter().map(|t| t.id).collect::<Vec<_>>(),
        "logprobs": generated.iter().map(|t| f64::from(t.logprob)).collect::<Vec<_>>(),
        "top": generated.iter().map(|t| {
            t.top_logprobs.iter().map(|a| (a.text.clone(), json!(f64::from(a.logprob))))
                .collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
        "generated_text": text,
        "long_ids": long_ids,
    });
    let dir = tempfile::tempdir().unwrap();
    let expected_path = dir.path().join("expected.json");
    std::fs::write(&expected_path, expected.to_string()).unwrap();
    let report = run_sdk_test(
        "test_echo.py",
        &format!("{}/v1", h.base),
        &[
            ("MODEL", "m".as_ref()),
            ("EXPECTED", expected_path.as_os_str()),
        ],
        || h.cluster.router.log_text(),
    )
    .await;
    assert!(report.contains("Ran 4 tests"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_equal_teacher_forcing_on_the_tiny_model() {
    let (_dir, model) = tiny_model_with_context(7, 4096);
    check(&model, 4000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_equal_teacher_forcing_on_smollm2() {
    check(&real_model(), 1000).await;
}
