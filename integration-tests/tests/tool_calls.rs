//! Tool calling (issue 29) with the official `openai` Python SDK against a real worker and router
//! on the real SmolLM2 model (the built-in Hermes format): `required`, a named function, `auto`,
//! `none`, parallel calls, the tool result fed back, streaming assembled by the SDK, 24 sampled
//! calls over 12 schemas validated with `jsonschema`, the refusals, and a tool request in a batch of
//! plain ones. Runs integration-tests/python/test_tools.py (scripts/install-openai-sdk installs
//! the SDK and `jsonschema`).
use integration_tests::openai::{run_sdk_test, start};
use integration_tests::real_model;

const MODEL: &str = "smollm2";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_with_the_official_sdk_on_the_real_model() {
    let h = start(&real_model(), &[], &["--served-model-name", MODEL], &[]).await;
    let report = run_sdk_test(
        "test_tools.py",
        &format!("{}/v1", h.base),
        &[("MODEL", MODEL.as_ref())],
        || h.cluster.router.log_text(),
    )
    .await;
    assert!(report.contains("Ran 10 tests"), "{report}");
    assert!(report.contains("sampled: 24 calls validated"), "{report}");
}
