//! Tool calling (issue 29) with the official `openai` Python SDK against a real worker and router
//! on the real SmolLM2 model (the built-in Hermes format): `required`, a named function, `auto`,
//! `none`, parallel calls, the tool result fed back, streaming assembled by the SDK, 24 sampled
//! calls over 12 schemas validated with `jsonschema`, the refusals, and a tool request in a batch of
//! plain ones. Runs integration-tests/python/test_tools.py (scripts/install-openai-sdk installs
//! the SDK and `jsonschema`).
use integration_tests::openai::{sdk_python, start};
use integration_tests::real_model;

const MODEL: &str = "smollm2";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_with_the_official_sdk_on_the_real_model() {
    let python = sdk_python();
    let h = start(&real_model(), &[], &["--served-model-name", MODEL], &[]).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/test_tools.py");
    let output = tokio::process::Command::new(&python)
        .arg(script)
        .env("OPENAI_BASE", format!("{}/v1", h.base))
        .env("MODEL", MODEL)
        .output()
        .await
        .expect("running the Python test");
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the tool-calling SDK test failed:\n{report}\nrouter log:\n{}",
        h.cluster.router.log_text()
    );
    assert!(report.contains("Ran 10 tests"), "{report}");
    assert!(report.contains("sampled: 24 calls validated"), "{report}");
}
