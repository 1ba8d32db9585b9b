//! Distributed tracing end to end: an in-process OTLP collector (the OTLP `TraceService` over gRPC on
//! 127.0.0.1) receives the spans of a real router and a real worker started with `--otlp-endpoint`,
//! and one request yields one connected trace: the caller's `traceparent` -> the router's
//! `generate` span -> its `tokenize`, `queue` and `generation` children and, across the process
//! boundary, the worker's `worker.request` span with its `prefill` and `decode` children.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inference_proto::public::text_generation_client::TextGenerationClient;
use integration_tests::{connect_ready, free_port, greedy, tiny_model, Process};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tonic::{Request, Response, Status};

/// A received span with the `service.name` of the process that sent it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    span: Span,
}

/// The in-process collector: keeps every span it is sent.
#[derive(Default, Clone)]
struct Collector {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.clone())
                .map(|v| match v {
                    Value::StringValue(s) => s,
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    spans.push(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// Starts the collector on a free 127.0.0.1 port; returns it and its endpoint URL.
async fn start_collector() -> (Collector, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let collector = Collector::default();
    let service = TraceServiceServer::new(collector.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .expect("the collector serves");
    });
    (collector, format!("http://{addr}"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn string_attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            other => Some(format!("{other:?}")),
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_yields_one_connected_router_and_worker_trace() {
    let (collector, endpoint) = start_collector().await;
    let (_dir, model) = tiny_model(21);
    // Export every 100 ms instead of the default 5 s.
    let env = [("OTEL_BSP_SCHEDULE_DELAY", "100")];
    let worker_addr = format!("127.0.0.1:{}", free_port());
    let model_arg = model.to_str().unwrap();
    let _worker = Process::start_with_env(
        "worker",
        &[
            "--model",
            model_arg,
            "--listen",
            &worker_addr,
            "--otlp-endpoint",
            &endpoint,
        ],
        &env,
        "worker ready",
        Duration::from_secs(60),
    )
    .await
    .expect("worker starts");
    let router_addr = format!("127.0.0.1:{}", free_port());
    let _router = Process::start_with_env(
        "router",
        &[
            "--workers",
            &worker_addr,
            "--listen",
            &router_addr,
            "--otlp-endpoint",
            &endpoint,
        ],
        &env,
        "router ready",
        Duration::from_secs(30),
    )
    .await
    .expect("router starts");
    let mut client: TextGenerationClient<_> =
        connect_ready(&router_addr, Duration::from_secs(30)).await;

    // The caller's own trace context: the router's span must continue it.
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let mut request = tonic::Request::new(greedy("tracing is fun", 6));
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{caller_trace}-{caller_span}-01")
            .parse()
            .unwrap(),
    );
    let mut stream = client.generate(request).await.unwrap().into_inner();
    let mut tokens = 0;
    while let Some(message) = stream.message().await.unwrap() {
        tokens += message.tokens.len();
    }
    assert_eq!(tokens, 6);

    let wanted = [
        ("router", "generate"),
        ("router", "tokenize"),
        ("router", "queue"),
        ("router", "generation"),
        ("worker", "worker.request"),
        ("worker", "prefill"),
        ("worker", "decode"),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans: HashMap<&str, Received> = loop {
        let received = collector.spans.lock().unwrap().clone();
        let found: HashMap<&str, Received> = wanted
            .iter()
            .filter_map(|(service, name)| {
                received
                    .iter()
                    .find(|r| {
                        r.service == *service
                            && r.span.name == *name
                            && hex(&r.span.trace_id) == caller_trace
                    })
                    .map(|r| (*name, r.clone()))
            })
            .collect();
        if found.len() == wanted.len() {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "missing spans after 30 s; have {:?}",
            received
                .iter()
                .map(|r| (&r.service, &r.span.name, hex(&r.span.trace_id)))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let id = |name: &str| hex(&spans[name].span.span_id);
    let parent = |name: &str| hex(&spans[name].span.parent_span_id);
    // All in the caller's trace (checked above), linked parent to child across both processes.
    assert_eq!(parent("generate"), caller_span);
    for child in ["tokenize", "queue", "generation", "worker.request"] {
        assert_eq!(parent(child), id("generate"), "parent of {child}");
    }
    for child in ["prefill", "decode"] {
        assert_eq!(parent(child), id("worker.request"), "parent of {child}");
    }
    let generate = &spans["generate"].span;
    assert_eq!(
        string_attribute(generate, "finish_reason").as_deref(),
        Some("max_new_tokens")
    );
    assert_eq!(
        string_attribute(&spans["generation"].span, "worker").as_deref(),
        Some(worker_addr.as_str())
    );
    // The worker's span covers less time than the router's.
    let worker_request = &spans["worker.request"].span;
    assert!(worker_request.start_time_unix_nano >= generate.start_time_unix_nano);
    assert!(worker_request.end_time_unix_nano <= generate.end_time_unix_nano);
}
