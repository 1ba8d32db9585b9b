//! `router --workers HOST:PORT[,HOST:PORT...] --listen 127.0.0.1:PORT`: serves the public API.

use std::process::ExitCode;

use clap::Parser;
use inference_proto::public::text_generation_server::TextGenerationServer;
use router::config::{Cli, RouterSettings};
use router::pool::WorkerPool;
use router::service::TextGenerationService;
use tokio_stream::wrappers::TcpListenerStream;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match RouterSettings::load(&cli) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("router: invalid settings: {e}");
            return ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&settings.log));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    match runtime.block_on(run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("router: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(settings: RouterSettings) -> anyhow::Result<()> {
    if settings.workers.is_empty() {
        anyhow::bail!(
            "no workers given: pass --workers HOST:PORT[,HOST:PORT...] (or set ROUTER_WORKERS)"
        );
    }
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", settings.listen))?;
    let pool = WorkerPool::start(&settings.workers, settings.backoff());
    let service = TextGenerationService::new(pool, settings.limits.clone());
    println!(
        "router ready: serving inference.v1.TextGeneration on {} (workers: {})",
        settings.listen,
        settings.workers.join(", ")
    );
    tonic::transport::Server::builder()
        .add_service(TextGenerationServer::new(service))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown_signal())
        .await?;
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutting down");
}
