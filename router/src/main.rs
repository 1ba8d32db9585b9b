//! `router --workers HOST:PORT[,HOST:PORT...] --listen 127.0.0.1:PORT`: serves the public API.
//! With `tls_cert`/`tls_key` both public ports speak only TLS (the files re-read on change); with
//! `worker_tls_ca` the workers are dialled over TLS; `health_listen` serves health alone in plain
//! text.
//!
//! On SIGTERM (or Ctrl-C) the router drains: new `Generate` calls get `UNAVAILABLE`, running ones
//! finish (up to `drain_timeout_ms`; those still running then end with `UNAVAILABLE`, "drain
//! timeout expired", on both fronts), then it exits 0.

use std::process::ExitCode;
use std::time::Duration;

use inference_proto::public::text_generation_server::TextGenerationServer;
use router::config::{Cli, RouterSettings};
use router::drain::Drain;
use router::metrics::RouterMetrics;
use router::pool::WorkerPool;
use router::request_guard::RequestGuard;
use router::service::TextGenerationService;
use tls_certs::Alpn;

/// How long the calls cut off by the drain timeout have to send their `UNAVAILABLE` before the
/// servers stop.
const CUT_OFF_GRACE: Duration = Duration::from_secs(2);

fn main() -> ExitCode {
    let cli: Cli = settings_file::flags::parse_flags(&RouterSettings::default());
    let loaded = RouterSettings::load(&cli);
    let settings = match observability::process::checked_settings(
        "router",
        loaded,
        RouterSettings::validate,
    ) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if cli.check_config {
        // The effective settings (defaults < file < environment < flags), e.g. for a Helm chart's CI.
        return observability::process::print_settings(&settings);
    }
    let telemetry = observability::telemetry::TelemetrySettings {
        service_name: "router",
        log_filter: settings.log.clone(),
        otlp_endpoint: settings.otlp_endpoint.clone(),
    };
    observability::process::run_service(telemetry, None, || run(settings))
}

async fn run(settings: RouterSettings) -> anyhow::Result<()> {
    let l = &settings.limits;
    if l.default_max_new_tokens > l.max_new_tokens {
        tracing::info!(
            default_max_new_tokens = l.default_max_new_tokens,
            max_new_tokens = l.max_new_tokens,
            "requests without max_new_tokens get limits.max_new_tokens ({}): the default is capped \
             by the maximum",
            l.max_new_tokens
        );
    }
    let discovery = settings.discovery();
    if settings.workers.is_empty() && discovery.is_none() {
        anyhow::bail!(
            "no workers given: pass --workers HOST:PORT[,HOST:PORT...] (or set ROUTER_WORKERS), \
             or --discovery-dns NAME:PORT"
        );
    }
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", settings.listen))?;
    let mut pool_settings = settings.pool_settings();
    pool_settings.chat_template = settings.chat_template_file()?.map(std::sync::Arc::new);
    pool_settings.worker_tls = settings.worker_tls()?;
    if let Some(tls) = &pool_settings.worker_tls {
        tls.watch(observability::reload::RELOAD_PERIOD);
        tracing::info!(ca = %tls.ca.display(), "dialling workers over TLS");
    }
    // TLS of the public ports: one certificate for both, re-read on change.
    let cert = settings.tls_cert()?;
    if let Some(cert) = &cert {
        cert.watch(observability::reload::RELOAD_PERIOD);
        tracing::info!(cert = %cert.files().cert.display(), "TLS on the public ports");
    }
    let pool = WorkerPool::start(pool_settings, &settings.workers);
    if let Some((target, interval)) = discovery.clone() {
        tokio::spawn(router::discovery::run(pool.clone(), target, interval));
    }
    let keys = settings.callers()?;
    keys.watch();
    keys.quotas().set_replicas(settings.replicas);
    if let Some((target, interval)) = settings.replica_discovery() {
        tokio::spawn(router::discovery::run_replicas(
            keys.quotas().clone(),
            target,
            interval,
        ));
    }
    if keys.enforced() {
        tracing::info!("API keys required on the public gRPC and HTTP APIs");
    }
    if !settings.tenants_file.trim().is_empty() {
        tracing::info!(tenants = keys.table().tenants.len(), "tenants file loaded");
    }
    let drain = Drain::new();
    // Readiness (grpc.health.v1): NOT_SERVING until a worker is ready, and from SIGTERM on.
    let (health, health_service) = tonic_health::server::health_reporter();
    router::health::set_all(&health, tonic_health::ServingStatus::NotServing).await;
    // Liveness ("liveness", what the Helm chart's liveness probe asks): SERVING while the process
    // serves, whatever the workers do, so a router waiting for workers is not restarted.
    health
        .set_service_status("liveness", tonic_health::ServingStatus::Serving)
        .await;
    if let Some(addr) = settings.health_listen() {
        let bound = observability::grpc::serve_health(addr, health_service.clone()).await?;
        tracing::info!(%bound, "serving grpc.health.v1 in plain text (health_listen)");
    }
    tokio::spawn(router::health::maintain(
        health,
        pool.clone(),
        drain.clone(),
    ));
    let metrics = RouterMetrics::with_tenants(pool.clone(), drain.clone(), keys.clone());
    if let Some(addr) = observability::metrics_http::parse_listen(&settings.metrics_listen)? {
        let m = metrics.clone();
        let bound =
            observability::metrics_http::serve(addr, move || std::future::ready(m.render()))
                .await?;
        tracing::info!(%bound, "serving Prometheus metrics at /metrics");
    }
    // The OpenAI HTTP front: same pool, limits, drain and metrics; stops with the gRPC server.
    let (http_stop_tx, http_stop_rx) = tokio::sync::watch::channel(false);
    let http_server = match settings.http_listen() {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (http_listen): {e}"))?;
            let front = router::openai::OpenAiFront::new(
                pool.clone(),
                settings.limits.clone(),
                drain.clone(),
                Some(metrics.clone()),
                keys.clone(),
            );
            let cors = settings.cors()?;
            let mut stop = http_stop_rx;
            let shutdown = async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            };
            tracing::info!(%addr, tls = cert.is_some(), "serving the OpenAI HTTP API");
            Some(match &cert {
                Some(cert) => {
                    let config = tls_certs::server::server_config(cert.clone(), Alpn::Http11);
                    let incoming = tls_certs::TlsIncoming::new(listener, config)?;
                    tokio::spawn(router::openai::serve(incoming, front, cors, shutdown))
                }
                None => tokio::spawn(router::openai::serve(
                    router::openai::plain_listener(listener),
                    front,
                    cors,
                    shutdown,
                )),
            })
        }
        None => None,
    };
    let ready_pool = pool.clone();
    let service = TextGenerationService::new(pool, settings.limits.clone(), drain.clone())
        .with_metrics(metrics.clone())
        .with_callers(keys.clone());
    // The decode limit follows max_request_bytes; the request guard checks the API key, answers
    // an oversized message with RESOURCE_EXHAUSTED naming it, and counts and logs calls refused
    // before the handler.
    let max_request_bytes = settings.limits.max_request_bytes as usize;
    let public_api = RequestGuard::new(
        TextGenerationServer::new(service).max_decoding_message_size(max_request_bytes),
        keys,
        max_request_bytes,
        Some(metrics),
    );
    let mut sources = settings.workers.clone();
    if let Some((target, _)) = &discovery {
        sources.push(format!("dns:{target}"));
    }
    let http = settings
        .http_listen()
        .map(|addr| format!("; OpenAI HTTP API on {addr}"))
        .unwrap_or_default();
    let tls = if cert.is_some() { " over TLS" } else { "" };
    let mut ready_workers = ready_pool.ready_watch();
    let connected = *ready_workers.borrow_and_update();
    println!(
        "router ready: serving inference.v1.TextGeneration on {}{tls} (workers: {}; {}){http}",
        settings.listen,
        sources.join(", "),
        workers_ready_text(connected, ready_pool.configured_workers()),
    );
    // Every later change of the count, on the same stream, so that whoever waits on the log
    // (a person, `serve`, a script) sees when the router can answer.
    tokio::spawn(async move {
        while ready_workers.changed().await.is_ok() {
            let ready = *ready_workers.borrow_and_update();
            println!(
                "router workers: {}",
                workers_ready_text(ready, ready_pool.configured_workers())
            );
        }
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let router = tonic::transport::Server::builder()
        // An oversized header is that request's error, not the connection's (see the constant).
        .http2_max_header_list_size(router::auth::MAX_HEADER_LIST_BYTES)
        .add_service(public_api)
        .add_service(health_service)
        .add_service(observability::grpc::reflection_service(&[
            "inference.v1.TextGeneration",
        ]))
        .add_service(observability::grpc::reflection_service_v1alpha(&[
            "inference.v1.TextGeneration",
        ]));
    let mut server = tls_certs::grpc::serve(router, listener, cert, async {
        let _ = stop_rx.await;
    })?;
    tokio::select! {
        result = &mut server => return Ok(result?),
        () = shutdown_signal() => {}
    }
    // Drain: refuse new calls, let running ones finish (up to the timeout), then stop serving.
    drain.start();
    let timeout = settings.drain_timeout();
    tracing::info!(
        running = drain.active(),
        timeout_ms = timeout.as_millis() as u64,
        "draining"
    );
    tokio::select! {
        result = &mut server => return Ok(result?),
        finished = drain.wait_idle(timeout) => {
            if finished {
                tracing::info!("drained; shutting down");
            } else {
                tracing::warn!(
                    running = drain.active(),
                    "drain timeout passed; ending the calls still running with UNAVAILABLE"
                );
                // Each front ends its running calls with a definite status (and cancels their
                // requests); give them a moment to send it before the servers stop.
                drain.expire(timeout);
                if !drain.wait_idle(CUT_OFF_GRACE).await {
                    tracing::warn!(running = drain.active(), "calls still open after their cut-off");
                }
            }
        }
    }
    let _ = stop_tx.send(());
    let _ = http_stop_tx.send(true);
    // Graceful close of the connections; cut them if a client lingers.
    match tokio::time::timeout(Duration::from_secs(2), server).await {
        Ok(result) => result?,
        Err(_) => tracing::warn!("connections still open after shutdown; closing them"),
    }
    if let Some(http) = http_server {
        match tokio::time::timeout(Duration::from_secs(2), http).await {
            Ok(Ok(result)) => result?,
            Ok(Err(e)) => tracing::warn!(error = %e, "the HTTP server task failed"),
            Err(_) => tracing::warn!("HTTP connections still open after shutdown; closing them"),
        }
    }
    Ok(())
}

/// `1 of 2 workers ready`, or `no worker ready yet` before the first.
fn workers_ready_text(ready: usize, known: usize) -> String {
    match ready {
        0 => format!("no worker ready yet, {known} known"),
        n => format!("{n} of {known} workers ready"),
    }
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutdown signal received");
}
