//! Speculative decoding (issue 28) through real router and worker processes on SmolLM2: with
//! `--speculation ngram` every stream (text, token ids, logprobs and alternatives, finish reason,
//! stop string) equals the stream of a worker with speculation off, on quoting prompts where
//! prompt lookup accepts a lot, with seeded sampling and penalties, a stop string inside the quoted
//! text, a short max_new_tokens, free writing and a per-request opt-out; the final usage reports the
//! draft counts. Bad settings are refused with exit code 2 naming the setting.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use inference_proto::public::{constraint::Kind, GenerateRequest};
use integration_tests::{
    constrained, greedy, real_model, run_to_exit, stream_all, wait_idle, Cluster,
};

const PASSAGE: &str = "The lighthouse keeper climbed the spiral stairs every evening at dusk, \
    carrying a brass lantern and a notebook in which he wrote the names of the ships that passed \
    the rocks below. In forty years he had never missed a night, and the harbour master said that \
    no vessel had been lost on that coast since he arrived.";

fn quoting(question: &str) -> String {
    format!("Text: {PASSAGE}\n\nQuestion: {question}\nAnswer by quoting the text exactly.\nAnswer: The lighthouse keeper")
}

/// The requests: greedy and sampled quoting, a stop string inside the quote, a short limit,
/// free writing, an opt-out, and structured output (a JSON schema with fixed keys and enums,
/// greedy; a regex, sampled), whose forced tokens are drafts too.
fn requests() -> Vec<GenerateRequest> {
    let sampled = GenerateRequest {
        temperature: 0.8,
        top_k: 40,
        top_p: Some(0.95),
        repetition_penalty: 1.1,
        frequency_penalty: 0.2,
        presence_penalty: 0.1,
        logit_bias: [(28, 1.0), (30, -1.0)].into(),
        logprobs: true,
        top_logprobs: 3,
        seed: Some(11),
        ..greedy(&quoting("What did the keeper carry?"), 48)
    };
    let stop = GenerateRequest {
        stop: vec!["notebook".into()],
        ..greedy(&quoting("What did the keeper carry?"), 60)
    };
    let opted_out = GenerateRequest {
        speculation: Some(false),
        ..greedy(&quoting("What did the harbour master say?"), 40)
    };
    let mut logprobs = greedy(&quoting("What did he write?"), 48);
    logprobs.logprobs = true;
    logprobs.top_logprobs = 2;
    vec![
        greedy(&quoting("What did the keeper do every evening?"), 64),
        sampled,
        stop,
        greedy(&quoting("What happened in forty years?"), 17),
        greedy("Once upon a time, in a small village by the sea,", 48),
        opted_out,
        logprobs,
        json_extraction(),
        constrained(
            &quoting("What did the keeper carry?"),
            Kind::Regex(
                r"The keeper carried a (brass lantern|notebook) every (evening|night)\.".into(),
            ),
            40,
            3,
        ),
    ]
}

/// Greedy extraction from the passage into a schema with fixed keys and enum values.
fn json_extraction() -> GenerateRequest {
    let schema = serde_json::json!({"type": "object", "properties": {
        "item": {"enum": ["brass lantern", "notebook", "spiral stairs"]},
        "years": {"type": "integer", "minimum": 0, "maximum": 100},
        "never_missed_a_night": {"type": "boolean"}},
        "required": ["item", "years", "never_missed_a_night"], "additionalProperties": false});
    let question = format!(
        "{PASSAGE}\n\nAs JSON: what the keeper carried, for how many years, and whether he \
         ever missed a night."
    );
    let mut r = constrained(&question, Kind::JsonSchema(schema.to_string()), 60, 1);
    r.temperature = 0.0;
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ngram_streams_equal_speculation_off_on_smollm2() {
    let (off, ngram) = streams_equal_speculation_off(&real_model(), &[]).await;
    // The stop string ended the quote inside the text.
    assert_eq!(off[2].stop_sequence, "notebook", "{:?}", off[2]);
    // The opt-out did not speculate; the first quoting request accepted proposals.
    assert_eq!(ngram[5].usage.unwrap().draft_tokens, 0);
    let first = ngram[0].usage.unwrap();
    assert!(first.accepted_draft_tokens > 0 && first.draft_tokens >= first.accepted_draft_tokens);
    // The constrained requests (their draft counts, forced tokens included, for the log).
    for g in &ngram[7..] {
        eprintln!("{:?} {:?} {:?}", g.text, g.finish_reason, g.usage);
    }
}

/// The same requests in the `fast` CPU numerics (8-bit activations): batch invariance makes the
/// verify pass give the tokens a plain decode gives, as in `exact`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ngram_streams_equal_speculation_off_in_fast_numerics_on_smollm2() {
    streams_equal_speculation_off(&real_model(), &["--numerics", "fast"]).await;
}

/// The same requests on Gemma 3 270M (another architecture, tokenizer and K-quant format).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ngram_streams_equal_speculation_off_on_gemma3() {
    streams_equal_speculation_off(&integration_tests::gemma3_model(), &[]).await;
}

/// Runs [`requests`] on a worker of `model` (with `worker_args`) with speculation off, then on a
/// fresh one with `ngram`, and checks every stream equal, KV blocks back to 0 on both, and that
/// speculation drafted, accepted and took fewer steps. Returns the generations of both runs (off,
/// ngram).
async fn streams_equal_speculation_off(
    model: &std::path::Path,
    worker_args: &[&str],
) -> (
    Vec<integration_tests::Generation>,
    Vec<integration_tests::Generation>,
) {
    let requests = requests();
    let mut runs = Vec::new();
    for speculation in ["off", "ngram"] {
        let mut args = vec!["--speculation", speculation];
        args.extend_from_slice(worker_args);
        let cluster = Cluster::start_with(model, &args).await;
        let client = cluster.client().await;
        let streamed = stream_all(&client, &requests, Arc::new(AtomicUsize::new(0))).await;
        let generations: Vec<_> = streamed
            .into_iter()
            .map(|s| s.expect("generation").generation)
            .collect();
        let stats = wait_idle(&cluster.worker_addr, Duration::from_secs(30)).await;
        assert_eq!(stats.kv_blocks_used, 0, "{stats:?}");
        runs.push((generations, stats));
    }
    let (off, off_stats) = &runs[0];
    let (ngram, ngram_stats) = &runs[1];
    for (i, (a, b)) in off.iter().zip(ngram).enumerate() {
        let strip = |g: &integration_tests::Generation| {
            (
                g.text.clone(),
                g.token_ids.clone(),
                g.finish_reason,
                g.stop_sequence.clone(),
            )
        };
        assert_eq!(strip(a), strip(b), "request {i}");
        let usage = (a.usage.unwrap(), b.usage.unwrap());
        assert_eq!(
            usage.0.generated_tokens, usage.1.generated_tokens,
            "request {i}"
        );
        assert_eq!(
            (usage.0.draft_tokens, usage.0.accepted_draft_tokens),
            (0, 0)
        );
    }
    assert_eq!(off_stats.speculative_draft_tokens, 0);
    assert!(
        ngram_stats.speculative_accepted_tokens > 0,
        "{ngram_stats:?}"
    );
    assert!(
        ngram_stats.steps < off_stats.steps,
        "{off_stats:?} {ngram_stats:?}"
    );
    let ngram = runs.pop().expect("the ngram run").0;
    let off = runs.pop().expect("the off run").0;
    (off, ngram)
}

#[tokio::test]
async fn bad_speculation_settings_name_the_setting() {
    let model = real_model();
    let model = model.to_str().unwrap();
    let timeout = Duration::from_secs(30);
    let cases: [(&[&str], &str); 4] = [
        (
            &["--speculation", "draft"],
            "speculation = draft is not available",
        ),
        (&["--speculation", "eagle"], "speculation"),
        (
            &["--num-speculative-tokens", "0"],
            "num_speculative_tokens must be in 1..=16",
        ),
        (
            &["--num-speculative-tokens", "17"],
            "num_speculative_tokens must be in 1..=16",
        ),
    ];
    for (flags, needle) in cases {
        let mut args = vec!["--model", model, "--check-config"];
        args.extend_from_slice(flags);
        let (ok, text) = run_to_exit("worker", &args, timeout).await;
        assert!(!ok && text.contains(needle), "{flags:?}: {text}");
    }
    let (ok, text) = run_to_exit(
        "worker",
        &["--model", model, "--check-config", "--speculation", "ngram"],
        timeout,
    )
    .await;
    assert!(ok && text.contains("\"speculation\": \"ngram\""), "{text}");
}
