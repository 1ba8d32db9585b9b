//! Finish reasons and stop strings on the real model, through real router and worker processes.
//!
//! The english reference prompt greedily continues with " Paris.\n\nThe answer is: 1." (tokens
//! " Paris", ".", "\n", "\n", "The", " answer", " is", ":" ...), which the stop-string cases rely on.

use inference_proto::public::{ChatMessage, FinishReason, GenerateRequest};
use integration_tests::{generate, greedy, real_model, reference, Cluster};

fn english_prompt() -> String {
    reference()["prompts"][0]["text"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_reasons_and_stop_strings() {
    let cluster = Cluster::start(&real_model()).await;
    let mut client = cluster.client().await;
    let prompt = english_prompt();

    // max_new_tokens = N gives exactly N tokens.
    for n in [1, 7] {
        let g = generate(&mut client, greedy(&prompt, n)).await.unwrap();
        assert_eq!(g.token_ids.len(), n as usize);
        assert_eq!(g.finish_reason, FinishReason::MaxNewTokens);
        assert_eq!(g.usage.unwrap().generated_tokens, n);
    }

    // A chat prompt ends on <|im_end|> with EOS_TOKEN, and that text is not emitted.
    let chat = GenerateRequest {
        messages: vec![ChatMessage {
            role: "user".into(),
            content: "What is the capital of France?".into(),
            ..Default::default()
        }],
        max_new_tokens: Some(64),
        ..Default::default()
    };
    let g = generate(&mut client, chat).await.unwrap();
    assert_eq!(g.finish_reason, FinishReason::EosToken, "{g:?}");
    assert_eq!(*g.token_ids.last().unwrap(), 2, "ends with <|im_end|>");
    assert!(g.text.contains("Paris"), "{:?}", g.text);
    assert!(!g.text.contains("<|im_end|>"), "{:?}", g.text);

    // A stop string that straddles two tokens (" is" + ":"): cut before it, not emitted.
    let mut req = greedy(&prompt, 20);
    req.stop = vec!["is:".into()];
    let g = generate(&mut client, req).await.unwrap();
    assert_eq!(g.finish_reason, FinishReason::StopSequence);
    assert_eq!(g.stop_sequence, "is:");
    assert_eq!(g.text, " Paris.\n\nThe answer ");
    assert_eq!(
        g.token_ids.len(),
        8,
        "stops on the token that completes the stop string"
    );

    // A stop string that ends inside a token (" answer"): the token's text before it is kept.
    let mut req = greedy(&prompt, 20);
    req.stop = vec!["nothing like this".into(), "answ".into()];
    let g = generate(&mut client, req).await.unwrap();
    assert_eq!(g.finish_reason, FinishReason::StopSequence);
    assert_eq!(g.stop_sequence, "answ");
    assert_eq!(g.text, " Paris.\n\nThe ");
    assert_eq!(g.token_ids.len(), 6);
}
