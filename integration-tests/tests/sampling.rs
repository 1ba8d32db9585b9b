//! Per-request sampling through real router and worker processes on the tiny random-weight model:
//! seeded reproducibility with every parameter set (also on a second worker process), `logit_bias`
//! forcing greedy output, `top_logprobs`, INVALID_ARGUMENT for out-of-range values, and the worker's
//! own check of the sampling parameters (it does not trust the router).

use std::time::Duration;

use inference_proto::public::{GenerateRequest, ModelInfoRequest, Token};
use inference_proto::worker::worker_client::WorkerClient;
use inference_proto::worker::{
    router_message, worker_message, AddRequest, RequestError, RouterMessage, SamplingParams,
};
use integration_tests::{greedy, tiny_model, Cluster, PublicClient};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

/// Every token of `request`'s stream, in order.
async fn tokens(
    client: &mut PublicClient,
    request: GenerateRequest,
) -> Result<Vec<Token>, tonic::Status> {
    let mut stream = client.generate(request).await?.into_inner();
    let mut out = Vec::new();
    while let Some(message) = stream.message().await? {
        out.extend(message.tokens);
    }
    Ok(out)
}

/// A request with every sampling parameter set.
fn everything(seed: u64) -> GenerateRequest {
    GenerateRequest {
        temperature: 0.9,
        top_k: 40,
        top_p: Some(0.95),
        min_p: 0.01,
        repetition_penalty: 1.2,
        frequency_penalty: 0.3,
        presence_penalty: 0.2,
        logit_bias: [(70, 1.5), (71, -2.0)].into(),
        logprobs: true,
        top_logprobs: 3,
        seed: Some(seed),
        ..greedy("the quick brown fox", 24)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_parameters_end_to_end() {
    let (_dir, model) = tiny_model(7);
    let cluster = Cluster::start(&model).await;
    let mut client = cluster.client().await;
    let vocab = client
        .model_info(ModelInfoRequest::default())
        .await
        .unwrap()
        .into_inner()
        .vocab_size;

    // Seeded sampling with every parameter set is reproducible, logprobs included.
    let a = tokens(&mut client, everything(42)).await.unwrap();
    let b = tokens(&mut client, everything(42)).await.unwrap();
    assert_eq!(a.len(), 24);
    assert_eq!(a, b);
    for t in &a {
        assert_eq!(t.top_logprobs.len(), 3, "{t:?}");
        assert!(t.logprob <= 0.0 && t.logprob.is_finite(), "{t:?}");
    }
    // ... and is a function of (seed, position), not of the process: a fresh worker draws the same.
    let other = Cluster::start(&model).await;
    let mut other_client = other.client().await;
    let c = tokens(&mut other_client, everything(42)).await.unwrap();
    assert_eq!(a, c);
    drop(other);

    // logit_bias +100 on one id makes greedy output it every time.
    let forced = vocab / 2;
    let request = GenerateRequest {
        logit_bias: [(forced, 100.0)].into(),
        ..greedy("the quick brown fox", 12)
    };
    let got = tokens(&mut client, request).await.unwrap();
    assert_eq!(got.len(), 12);
    assert!(got.iter().all(|t| t.id == forced), "{got:?}");
    // Its logprob is still the raw model's (bias not included), so below 0.
    assert!(got.iter().all(|t| t.logprob < 0.0), "{got:?}");

    // top_logprobs = 5: five alternatives, most likely first (ties: lower id), the greedy token first.
    let request = GenerateRequest {
        top_logprobs: 5,
        ..greedy("hello there", 10)
    };
    let got = tokens(&mut client, request).await.unwrap();
    assert_eq!(got.len(), 10);
    for t in &got {
        let alts = &t.top_logprobs;
        assert_eq!(alts.len(), 5, "{t:?}");
        for w in alts.windows(2) {
            assert!(
                w[0].logprob > w[1].logprob || (w[0].logprob == w[1].logprob && w[0].id < w[1].id),
                "not sorted: {alts:?}"
            );
        }
        assert_eq!(alts[0].id, t.id, "{t:?}");
        assert_eq!(alts[0].logprob, t.logprob, "{t:?}");
        assert_eq!(alts[0].text, t.text, "{t:?}");
        let total: f32 = alts.iter().map(|a| a.logprob.exp()).sum();
        assert!(total <= 1.0 + 1e-4, "{alts:?}");
    }
    // Without top_logprobs: none, but logprob still filled.
    let got = tokens(&mut client, greedy("hello there", 3)).await.unwrap();
    assert!(got
        .iter()
        .all(|t| t.top_logprobs.is_empty() && t.logprob < 0.0));

    // Out-of-range values: INVALID_ARGUMENT with the numbers.
    let ok = greedy("hello", 2);
    let cases: Vec<(GenerateRequest, String)> = vec![
        (
            GenerateRequest {
                min_p: 1.5,
                ..ok.clone()
            },
            "min_p must be in [0, 1] (0 = off), got 1.5".into(),
        ),
        (
            GenerateRequest {
                repetition_penalty: -1.0,
                ..ok.clone()
            },
            "repetition_penalty must be in (0, 10]".into(),
        ),
        (
            GenerateRequest {
                repetition_penalty: 11.0,
                ..ok.clone()
            },
            "got 11".into(),
        ),
        (
            GenerateRequest {
                frequency_penalty: 3.0,
                ..ok.clone()
            },
            "frequency_penalty must be in [-2, 2] (0 = off), got 3".into(),
        ),
        (
            GenerateRequest {
                presence_penalty: -2.5,
                ..ok.clone()
            },
            "presence_penalty must be in [-2, 2] (0 = off), got -2.5".into(),
        ),
        (
            GenerateRequest {
                logit_bias: [(3, 150.0)].into(),
                ..ok.clone()
            },
            "logit_bias[3] must be in [-100, 100], got 150".into(),
        ),
        (
            GenerateRequest {
                logit_bias: [(vocab, 1.0)].into(),
                ..ok.clone()
            },
            format!(
                "logit_bias token id {vocab} is outside this model's vocabulary of {vocab} tokens"
            ),
        ),
        (
            GenerateRequest {
                logit_bias: (0..301).map(|id| (id, 1.0)).collect(),
                ..ok.clone()
            },
            "logit_bias has 301 entries; the limit is 300".into(),
        ),
        (
            GenerateRequest {
                top_logprobs: 21,
                ..ok.clone()
            },
            "top_logprobs is 21; the limit is 20".into(),
        ),
    ];
    for (request, want) in cases {
        let status = tokens(&mut client, request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains(&want),
            "{:?} lacks {want:?}",
            status.message()
        );
    }
    // Serving goes on.
    assert_eq!(tokens(&mut client, ok).await.unwrap().len(), 2);
}

/// Sends `sampling` straight to the worker (no router) and returns the worker's error for it.
async fn worker_rejection(worker_addr: &str, sampling: SamplingParams) -> RequestError {
    let mut worker = WorkerClient::connect(format!("http://{worker_addr}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(RouterMessage {
        kind: Some(router_message::Kind::Add(AddRequest {
            request_id: "direct".into(),
            prompt_ids: vec![5, 6, 7],
            sampling: Some(sampling),
            max_new_tokens: 2,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut out = worker
        .generate(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let wait = async {
        while let Some(message) = out.message().await.unwrap() {
            let Some(worker_message::Kind::Step(step)) = message.kind else {
                continue;
            };
            assert!(step.tokens.is_empty(), "the worker sampled: {step:?}");
            if let Some(error) = step.errors.into_iter().find(|e| e.request_id == "direct") {
                return error;
            }
        }
        panic!("the worker closed the stream without answering");
    };
    let error = tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .expect("the worker answers within 20 s");
    drop(tx);
    error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_checks_sampling_parameters_itself() {
    let (_dir, model) = tiny_model(8);
    let cluster = Cluster::start(&model).await;
    let valid = SamplingParams {
        top_p: 1.0,
        seed: 1,
        ..Default::default()
    };
    let cases = [
        (
            SamplingParams {
                min_p: 2.0,
                ..valid.clone()
            },
            "min_p must be in [0, 1], got 2",
        ),
        (
            SamplingParams {
                repetition_penalty: -0.5,
                ..valid.clone()
            },
            "repetition_penalty must be in (0, 10]",
        ),
        (
            SamplingParams {
                frequency_penalty: 2.5,
                ..valid.clone()
            },
            "frequency_penalty must be in [-2, 2], got 2.5",
        ),
        (
            SamplingParams {
                logit_bias: [(4, -250.0)].into(),
                ..valid.clone()
            },
            "logit_bias[4] must be in [-100, 100], got -250",
        ),
        (
            SamplingParams {
                top_logprobs: 50,
                ..valid.clone()
            },
            "top_logprobs is 50; the limit is 20",
        ),
    ];
    for (sampling, want) in cases {
        let error = worker_rejection(&cluster.worker_addr, sampling).await;
        assert_eq!(error.code, Code::InvalidArgument as i32, "{error:?}");
        assert!(
            error.message.contains(want),
            "{:?} lacks {want:?}",
            error.message
        );
    }
}
