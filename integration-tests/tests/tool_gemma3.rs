//! Tool calling (issue 29) on the real Gemma 3 270M, whose chat template has no tool support, with
//! the official `openai` Python SDK against real worker and router processes: the built-in Hermes
//! format rendered inside Gemma's own turns (checked in the prompt `/tokenize` gives), `required`,
//! a named function, streaming assembled by the SDK's helper equal to the non-streamed calls of the
//! same seed, and 6 calls sampled at temperature 1 over 3 schemas validated with `jsonschema`.
//! (SmolLM2 with the built-in format: `tool_calls.rs`; the families' own templates:
//! `tool_families.rs`.) Runs integration-tests/python/test_tools_gemma3.py.

use integration_tests::openai::{run_sdk_test, start};

const MODEL: &str = "gemma3";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_on_gemma3_in_the_builtin_format() {
    let h = start(
        &integration_tests::gemma3_model(),
        &[],
        &["--served-model-name", MODEL],
        &[],
    )
    .await;
    let started = std::time::Instant::now();
    let report = run_sdk_test(
        "test_tools_gemma3.py",
        &format!("{}/v1", h.base),
        &[("MODEL", MODEL.as_ref())],
        || h.cluster.router.log_text(),
    )
    .await;
    eprintln!("{report}\nthe SDK test took {:?}", started.elapsed());
    assert!(report.contains("Ran 4 tests"), "{report}");
    assert!(report.trim_end().ends_with("OK"), "{report}");
    assert!(report.contains("sampled: 6 calls validated"), "{report}");
}
