//! Greedy token-exactness through real processes: router + CPU worker on the real SmolLM2-135M, against
//! the float32 reference (fixtures/reference.json).

use integration_tests::{check_reference_prompt, real_model, reference, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_ids_match_the_reference() {
    let cluster = Cluster::start(&real_model()).await;
    let mut client = cluster.client().await;
    let reference = reference();
    for prompt in reference["prompts"].as_array().expect("prompts") {
        check_reference_prompt(&mut client, prompt).await;
    }
}
