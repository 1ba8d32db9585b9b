//! Operations on real processes: the standard gRPC health service (router readiness follows its
//! workers), gRPC reflection (a grpcurl-style dynamic call built only from reflected descriptors)
//! and the Prometheus endpoints (parse as Prometheus text and count what the test sent). The
//! worker's drain is in `worker_drain.rs`.

use std::time::{Duration, Instant};

use integration_tests::ops::{
    channel, health, metric, metric_sum, parse_metrics, scrape, wait_health,
};
use integration_tests::{free_port, generate, greedy, start_router, tiny_model, Cluster, Process};
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, Value};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

/// One reflection request's answer.
async fn reflect(addr: &str, request: MessageRequest) -> MessageResponse {
    let mut client = ServerReflectionClient::new(channel(addr).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::once(request))
        .await
        .expect("reflection call")
        .into_inner();
    let answer = answers.message().await.expect("reflection answer");
    answer
        .and_then(|a| a.message_response)
        .expect("a reflection answer")
}

/// The services `addr` lists through reflection.
async fn list_services(addr: &str) -> Vec<String> {
    match reflect(addr, MessageRequest::ListServices(String::new())).await {
        MessageResponse::ListServicesResponse(list) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection answer {other:?}"),
    }
}

/// The services `addr` lists through `grpc.reflection.v1alpha` (what the Python
/// `grpcio-reflection` client and older grpcurl ask).
async fn list_services_v1alpha(addr: &str) -> Vec<String> {
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    let mut client = ServerReflectionClient::new(channel(addr).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let answer = client
        .server_reflection_info(tokio_stream::once(request))
        .await
        .expect("v1alpha reflection call")
        .into_inner()
        .message()
        .await
        .expect("v1alpha reflection answer")
        .and_then(|a| a.message_response);
    match answer {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected v1alpha reflection answer {other:?}"),
    }
}

/// A descriptor pool built from the file that defines `symbol`, fetched through reflection.
async fn reflected_pool(addr: &str, symbol: &str) -> DescriptorPool {
    let files = match reflect(addr, MessageRequest::FileContainingSymbol(symbol.into())).await {
        MessageResponse::FileDescriptorResponse(files) => files.file_descriptor_proto,
        other => panic!("unexpected reflection answer {other:?}"),
    };
    let mut pool = DescriptorPool::new();
    for file in files {
        pool.decode_file_descriptor_proto(file.as_slice())
            .expect("a valid reflected file descriptor");
    }
    pool
}

/// A codec for messages known only by their reflected descriptor (what grpcurl does).
struct DynamicCodec(MessageDescriptor);

struct DynamicEncoder;
struct DynamicDecoder(MessageDescriptor);

impl Codec for DynamicCodec {
    type Encode = DynamicMessage;
    type Decode = DynamicMessage;
    type Encoder = DynamicEncoder;
    type Decoder = DynamicDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        DynamicEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        DynamicDecoder(self.0.clone())
    }
}

impl Encoder for DynamicEncoder {
    type Item = DynamicMessage;
    type Error = Status;

    fn encode(&mut self, item: DynamicMessage, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        prost::Message::encode(&item, dst).map_err(|e| Status::internal(e.to_string()))
    }
}

impl Decoder for DynamicDecoder {
    type Item = DynamicMessage;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<DynamicMessage>, Status> {
        DynamicMessage::decode(self.0.clone(), src)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_workers_and_reflection_serves_a_dynamic_call() {
    let (_dir, model) = tiny_model(11);
    let worker_addr = format!("127.0.0.1:{}", free_port());
    // The router starts first: NOT_SERVING until its worker is up.
    let (_router, router_addr) = start_router(&[&worker_addr], &[]).await;
    for service in ["", "inference.v1.TextGeneration"] {
        assert_eq!(
            health(&router_addr, service).await.unwrap(),
            ServingStatus::NotServing,
            "router {service:?} before any worker"
        );
    }
    let unknown = health(&router_addr, "no.such.Service").await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    let model_arg = model.to_str().unwrap();
    let _worker = Process::start(
        "worker",
        &["--model", model_arg, "--listen", &worker_addr],
        "worker ready",
        Duration::from_secs(60),
    )
    .await
    .expect("worker starts");
    for service in ["", "inference.worker.v1.Worker"] {
        assert_eq!(
            health(&worker_addr, service).await.unwrap(),
            ServingStatus::Serving,
            "worker {service:?}"
        );
    }
    for service in ["", "inference.v1.TextGeneration"] {
        wait_health(
            &router_addr,
            service,
            ServingStatus::Serving,
            Duration::from_secs(30),
        )
        .await;
    }

    // Reflection lists each server's own API (plus health and reflection).
    let router_services = list_services(&router_addr).await;
    for want in [
        "inference.v1.TextGeneration",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            router_services.iter().any(|s| s == want),
            "{router_services:?}"
        );
    }
    assert!(!router_services.iter().any(|s| s.contains("worker")));
    // Both reflection versions are served, and list the same services.
    assert!(
        router_services
            .iter()
            .any(|s| s == "grpc.reflection.v1alpha.ServerReflection"),
        "{router_services:?}"
    );
    let mut v1alpha = list_services_v1alpha(&router_addr).await;
    let mut v1 = router_services.clone();
    v1alpha.sort();
    v1.sort();
    assert_eq!(
        v1alpha, v1,
        "router: v1alpha and v1 list different services"
    );
    let worker_services = list_services(&worker_addr).await;
    assert!(
        worker_services
            .iter()
            .any(|s| s == "inference.worker.v1.Worker"),
        "{worker_services:?}"
    );
    let worker_v1alpha = list_services_v1alpha(&worker_addr).await;
    assert!(
        worker_v1alpha
            .iter()
            .any(|s| s == "inference.worker.v1.Worker"),
        "{worker_v1alpha:?}"
    );

    // A grpcurl-style call: descriptors from reflection, a dynamic request, a dynamic answer.
    let pool = reflected_pool(&router_addr, "inference.v1.TextGeneration").await;
    let service = pool
        .get_service_by_name("inference.v1.TextGeneration")
        .expect("the reflected service");
    let method = service
        .methods()
        .find(|m| m.name() == "Tokenize")
        .expect("Tokenize");
    let mut request = DynamicMessage::new(method.input());
    request.set_field_by_name("text", Value::String("hello world".into()));
    let mut grpc = tonic::client::Grpc::new(channel(&router_addr).await);
    grpc.ready().await.unwrap();
    let path = format!("/{}/{}", service.full_name(), method.name());
    let response = grpc
        .unary(
            tonic::Request::new(request),
            path.parse().unwrap(),
            DynamicCodec(method.output()),
        )
        .await
        .expect("the reflected Tokenize call")
        .into_inner();
    let ids = response.get_field_by_name("ids").expect("ids field");
    let pieces = response.get_field_by_name("pieces").expect("pieces field");
    let (Value::List(ids), Value::List(pieces)) = (ids.as_ref(), pieces.as_ref()) else {
        panic!("unexpected Tokenize answer {response:?}");
    };
    assert!(!ids.is_empty());
    assert_eq!(ids.len(), pieces.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoints_parse_and_count_what_was_sent() {
    let (_dir, model) = tiny_model(12);
    let cluster = Cluster::start_with_metrics(&model).await;
    let (worker_metrics, router_metrics) = cluster.metrics.clone().expect("metrics on");
    let worker_addr = cluster.worker_addr.clone();
    let mut client = cluster.client().await;

    let (mut prompt_tokens, mut generated) = (0.0, 0.0);
    for (prompt, n) in [("one two", 5), ("three four five", 6), ("six", 7)] {
        let g = generate(&mut client, greedy(prompt, n))
            .await
            .expect("generation");
        let usage = g.usage.expect("usage");
        assert_eq!(usage.generated_tokens, n);
        prompt_tokens += f64::from(usage.prompt_tokens);
        generated += f64::from(usage.generated_tokens);
    }
    let invalid = generate(&mut client, greedy("x", 0)).await.unwrap_err();
    assert_eq!(invalid.code(), tonic::Code::InvalidArgument);

    let r = parse_metrics(&scrape(&router_metrics).await);
    assert_eq!(
        metric_sum(&r, "router_requests_total", &[("code", "OK")]),
        3.0
    );
    // Labelled by the model the requests got (its public name: not empty).
    assert!(
        r.keys().any(
            |k| k.starts_with("router_requests_total{code=\"OK\",model_name=\"")
                && !k.contains("model_name=\"\"")
        ),
        "{r:#?}"
    );
    assert_eq!(
        metric_sum(&r, "router_requests_total", &[("code", "INVALID_ARGUMENT")]),
        1.0
    );
    assert_eq!(
        metric_sum(
            &r,
            "router_finished_requests_total",
            &[("finish_reason", "max_new_tokens")]
        ),
        3.0
    );
    assert_eq!(
        metric_sum(&r, "router_generated_tokens_total", &[]),
        generated
    );
    assert_eq!(
        metric_sum(&r, "router_prompt_tokens_total", &[]),
        prompt_tokens
    );
    assert_eq!(
        metric_sum(&r, "router_time_to_first_token_seconds_count", &[]),
        3.0
    );
    assert_eq!(
        metric_sum(&r, "router_request_duration_seconds_count", &[]),
        3.0
    );
    assert_eq!(
        metric_sum(&r, "router_inter_token_latency_seconds_count", &[]),
        generated - 3.0
    );
    assert!(metric_sum(&r, "router_request_duration_seconds_sum", &[]) > 0.0);
    assert_eq!(
        metric_sum(
            &r,
            "router_request_duration_seconds_bucket",
            &[("le", "+Inf")]
        ),
        3.0
    );
    assert_eq!(metric(&r, "router_queue_waiting_requests"), 0.0);
    assert_eq!(metric(&r, "router_workers_ready"), 1.0);
    let ready = format!("router_worker_ready{{worker=\"{worker_addr}\"}}");
    assert_eq!(metric(&r, &ready), 1.0);
    let inflight = format!("router_worker_inflight{{worker=\"{worker_addr}\"}}");
    assert_eq!(metric(&r, &inflight), 0.0);
    assert_eq!(metric(&r, "router_dispatched_total"), 3.0);
    assert_eq!(metric(&r, "router_failovers_total"), 0.0);
    assert_eq!(metric(&r, "router_rejected_total"), 0.0);
    assert_eq!(metric(&r, "router_draining"), 0.0);

    // The step sampler reads the engine every few ms: wait until it has seen the steps.
    let deadline = Instant::now() + Duration::from_secs(10);
    let w = loop {
        let w = parse_metrics(&scrape(&worker_metrics).await);
        if metric(&w, "worker_batch_sequences_count") > 0.0 || Instant::now() > deadline {
            break w;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(metric(&w, "worker_generated_tokens_total"), generated);
    assert_eq!(metric(&w, "worker_prompt_tokens_total"), prompt_tokens);
    assert_eq!(metric(&w, "worker_finished_requests_total"), 3.0);
    assert_eq!(metric(&w, "worker_running_sequences"), 0.0);
    assert_eq!(metric(&w, "worker_waiting_sequences"), 0.0);
    assert_eq!(metric(&w, "worker_kv_blocks_used"), 0.0);
    assert!(metric(&w, "worker_kv_blocks_capacity") > 0.0);
    assert!(metric(&w, "worker_steps_total") >= generated);
    assert_eq!(metric(&w, "worker_serving"), 1.0);
    // Batch sizes are sampled per step (see worker::metrics): some steps, never more than ran.
    let sampled = metric(&w, "worker_batch_sequences_count");
    assert!(
        sampled > 0.0 && sampled <= metric(&w, "worker_steps_total"),
        "{sampled}"
    );
    assert!(metric(&w, "worker_batch_tokens_sum") >= sampled);
    assert!(metric(&w, "worker_step_duration_seconds_count") <= metric(&w, "worker_steps_total"));
}
