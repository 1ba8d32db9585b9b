//! `worker --model PATH.gguf --listen 127.0.0.1:PORT`: loads the model and serves it over gRPC.

use std::process::ExitCode;

use clap::Parser;
use inference_proto::worker::worker_server::WorkerServer;
use tokio_stream::wrappers::TcpListenerStream;
use worker::config::{Cli, WorkerSettings};
use worker::describe::describe_model;
use worker::engine::{spawn_engine, SequenceModel};
use worker::model::LlamaModel;
use worker::service::WorkerService;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match WorkerSettings::load(&cli) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("worker: invalid settings: {e}");
            return ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&settings.log));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    match runtime.block_on(run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("worker: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(settings: WorkerSettings) -> anyhow::Result<()> {
    let Some(model_path) = settings.model.clone() else {
        anyhow::bail!("no model given: pass --model PATH.gguf (or set WORKER_MODEL)");
    };
    if !model_path.is_file() {
        anyhow::bail!("model file {} does not exist", model_path.display());
    }
    if settings.threads > 0 {
        rayon::ThreadPoolBuilder::new()
            .num_threads(settings.threads)
            .build_global()
            .ok();
    }
    // Bind first so a port in use fails fast, before a long model load.
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", settings.listen))?;
    let started = std::time::Instant::now();
    let path = model_path.clone();
    let (model, description) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let model = LlamaModel::load(&path)?;
        let file = gguf::GgufFile::open(&path)?;
        let description = describe_model(&path, &file, model.context_length(), model.vocab_size())?;
        Ok((model, description))
    })
    .await??;
    tracing::info!(
        model = %model_path.display(),
        load_ms = started.elapsed().as_millis() as u64,
        "model loaded"
    );
    let engine = spawn_engine(model);
    let service = WorkerService::new(engine, description);
    println!(
        "worker ready: serving {} on {}",
        model_path.display(),
        settings.listen
    );
    tonic::transport::Server::builder()
        .add_service(WorkerServer::new(service))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown_signal())
        .await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutting down");
}
