//! Greedy token-exactness through real processes: router + CPU worker on the real SmolLM2-135M, against
//! the float32 reference (fixtures/reference.json).

use inference_proto::public::{FinishReason, TokenizeRequest};
use integration_tests::{generate, greedy, real_model, reference, Cluster};

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_ids_match_the_reference() {
    let cluster = Cluster::start(&real_model()).await;
    let mut client = cluster.client().await;
    let reference = reference();
    for prompt in reference["prompts"].as_array().expect("prompts") {
        let name = prompt["name"].as_str().unwrap();
        let text = prompt["text"].as_str().unwrap();
        let expected_prompt = ids(&prompt["prompt_ids"]);
        let expected = ids(&prompt["greedy_ids"]);

        let tokenized = client
            .tokenize(TokenizeRequest {
                text: text.into(),
                add_special_tokens: true,
            })
            .await
            .expect("Tokenize")
            .into_inner();
        assert_eq!(tokenized.ids, expected_prompt, "{name}: prompt ids");

        // Special tokens included so the text can be compared with the reference decode.
        let mut request = greedy(text, expected.len() as u32);
        request.include_special_tokens = true;
        let g = generate(&mut client, request).await.expect("Generate");
        assert_eq!(g.token_ids, expected, "{name}: greedy ids");
        assert_eq!(g.finish_reason, FinishReason::MaxNewTokens, "{name}");
        let usage = g.usage.expect("usage");
        assert_eq!(
            usage.prompt_tokens as usize,
            expected_prompt.len(),
            "{name}"
        );
        assert_eq!(usage.generated_tokens as usize, expected.len(), "{name}");
        if let Some(want) = prompt["greedy_text"].as_str() {
            assert_eq!(g.text, want, "{name}: text");
        }
    }
}
