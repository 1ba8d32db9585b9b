//! Malformed requests on the wire, sent as raw bytes through real gRPC to a real router (and
//! worker): each gets its precise status code, is counted in `router_requests_total{code}` and
//! logged, and the router keeps serving.

use std::time::Duration;

use bytes::{Buf as _, BufMut as _};
use integration_tests::ops::{channel, metric_sum, parse_metrics, scrape};
use integration_tests::{
    connect_ready, free_port, generate, greedy, start_router, start_worker, tiny_model,
};
use prost::Message as _;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

/// Sends and receives message payloads as raw bytes (whatever they hold).
#[derive(Clone, Copy)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// Calls the server-streaming `path` at `addr` with `payload` as the request message's bytes and
/// reads the whole answer; the first error status, if any.
async fn raw_stream_call(addr: &str, path: &str, payload: Vec<u8>) -> Result<(), Status> {
    let mut grpc = tonic::client::Grpc::new(channel(addr).await);
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(e.to_string()))?;
    let mut answers = grpc
        .server_streaming(
            tonic::Request::new(payload),
            path.parse().unwrap(),
            RawCodec,
        )
        .await?
        .into_inner();
    while answers.message().await?.is_some() {}
    Ok(())
}

/// Field `number` as a length-delimited record holding `payload` (payload below 128 bytes).
fn field(number: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 128);
    let mut out = vec![(number << 3) | 2, payload.len() as u8];
    out.extend_from_slice(payload);
    out
}

/// `max_new_tokens = 4` (field 3, varint), so a request that did decode would be short.
const FOUR_TOKENS: [u8; 2] = [3 << 3, 4];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_precise_codes_are_counted_and_logged() {
    let (_dir, model) = tiny_model(21);
    let (_worker, worker_addr) = start_worker(&model).await;
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let (router, router_addr) =
        start_router(&[&worker_addr], &["--metrics-listen", &metrics_addr]).await;
    let mut client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    const GENERATE: &str = "/inference.v1.TextGeneration/Generate";

    let valid = greedy("The capital of France is", 4).encode_to_vec();
    let bad_content = [field(1, b"user"), field(2, b"hi \xc3\x28")].concat();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "garbage bytes",
            vec![0xff; 24],
            "failed to decode Protobuf message",
        ),
        (
            "truncated message",
            valid[..valid.len() - 3].to_vec(),
            "failed to decode Protobuf message",
        ),
        (
            "wrong wire type",
            [vec![1 << 3, 7], FOUR_TOKENS.to_vec()].concat(),
            "wire type",
        ),
        (
            "invalid UTF-8 in prompt",
            [field(1, b"caf\xe9"), FOUR_TOKENS.to_vec()].concat(),
            "GenerateRequest.prompt: invalid string value: data is not UTF-8 encoded",
        ),
        (
            "invalid UTF-8 in stop",
            [field(1, b"ok"), field(8, b"\xff"), FOUR_TOKENS.to_vec()].concat(),
            "GenerateRequest.stop: invalid string value: data is not UTF-8 encoded",
        ),
        (
            "invalid UTF-8 in messages",
            [field(2, &bad_content), FOUR_TOKENS.to_vec()].concat(),
            "ChatMessage.content: GenerateRequest.messages: invalid string value: data is not UTF-8 encoded",
        ),
    ];
    for (what, payload, reason) in &cases {
        let status = raw_stream_call(&router_addr, GENERATE, payload.clone())
            .await
            .expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(status.message().contains(reason), "{what}: {status:?}");
    }

    // 5 MB against the default max_request_bytes (1 MiB): refused from the frame header, naming
    // the configured limit and the request's size.
    let huge = [field(1, b"x"), vec![0; 5_000_000]].concat();
    let huge_len = huge.len();
    let status = raw_stream_call(&router_addr, GENERATE, huge)
        .await
        .expect_err("a 5 MB request");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("max_request_bytes = 1048576")
            && status.message().contains(&huge_len.to_string()),
        "{status:?}"
    );

    // The router still serves, and the raw path itself is fine with a valid message.
    raw_stream_call(&router_addr, GENERATE, valid)
        .await
        .expect("a valid raw request");
    let g = generate(&mut client, greedy("hello", 3))
        .await
        .expect("generation");
    assert_eq!(g.usage.expect("usage").generated_tokens, 3);

    let r = parse_metrics(&scrape(&metrics_addr).await);
    assert_eq!(
        metric_sum(&r, "router_requests_total", &[("code", "INVALID_ARGUMENT")]),
        cases.len() as f64
    );
    assert_eq!(
        metric_sum(
            &r,
            "router_requests_total",
            &[("code", "RESOURCE_EXHAUSTED")]
        ),
        1.0
    );
    assert_eq!(
        metric_sum(&r, "router_requests_total", &[("code", "OK")]),
        2.0
    );
    let log = router.log_text();
    let rejected: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("request rejected before the handler"))
        .collect();
    assert_eq!(rejected.len(), cases.len() + 1, "{log}");
    assert!(
        rejected
            .iter()
            .any(|l| l.contains("RESOURCE_EXHAUSTED") && l.contains("max_request_bytes")),
        "{log}"
    );
    assert!(
        rejected
            .iter()
            .all(|l| l.contains("INFO") && l.contains("Generate")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_answers_an_undecodable_message_with_invalid_argument() {
    let (_dir, model) = tiny_model(22);
    let (_worker, worker_addr) = start_worker(&model).await;
    let mut grpc = tonic::client::Grpc::new(channel(&worker_addr).await);
    grpc.ready().await.unwrap();
    let status = grpc
        .unary(
            tonic::Request::new(vec![0xff; 24]),
            "/inference.worker.v1.Worker/Info".parse().unwrap(),
            RawCodec,
        )
        .await
        .expect_err("garbage bytes");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("failed to decode Protobuf message"),
        "{status:?}"
    );
}
