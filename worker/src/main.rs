//! `worker --model PATH.gguf --listen 127.0.0.1:PORT`: loads the model and serves it over gRPC
//! (`--model DIR` serves a Hugging Face model folder, see [`model_files::hf`]).
//!
//! Besides the `Worker` service it serves `grpc.health.v1` (SERVING once the model is loaded and
//! the engine runs) and gRPC reflection, and optionally Prometheus metrics (`metrics_listen`) and
//! OTLP spans (`otlp_endpoint`); with `tls_cert`/`tls_key` the gRPC port speaks only TLS (the
//! files re-read on change), and `health_listen` serves health alone in plain text. On SIGTERM (or Ctrl-C) it drains: NOT_SERVING, new requests are
//! refused with `UNAVAILABLE` (the router fails them over), running sequences finish (up to
//! `drain_timeout_ms`), then it exits 0.
//!
//! The compute device is chosen at start (`device`: `cpu`, `cuda` or `auto`); `cuda` on a host
//! without a usable GPU exits with code 2 and a one-line message, like any invalid setting.

use std::process::ExitCode;
use std::time::Duration;

use backend_cpu::CpuModel;
use backend_cuda::{Backend, CudaModel, CudaOptions};
use engine::backend::BatchModel;
use engine::{spawn_engine_with_draft, EngineConfig};
use inference_proto::worker::worker_server::WorkerServer;
use observability::process::BadInput;
use worker::config::{Cli, WorkerCommand, WorkerSettings};
use worker::health::Lifecycle;
use worker::metrics::WorkerMetrics;
use worker::model_info::model_info;
use worker::service::WorkerService;

/// Reset-but-unaccepted HTTP/2 streams a connection may hold before the server closes it: at the
/// default 2 s health interval, over two hours of a frozen worker; at 100 ms, about 7 minutes.
const MAX_PENDING_RESETS: usize = 4096;

fn main() -> ExitCode {
    let cli: Cli = settings_file::flags::parse_flags(&WorkerSettings::default());
    if let Some(WorkerCommand::Inspect { model }) = &cli.command {
        let inspection = worker::inspect::inspect(model);
        print!("{}", inspection.report);
        return match inspection.unservable {
            None => ExitCode::SUCCESS,
            Some(_) => ExitCode::from(2),
        };
    }
    let loaded = WorkerSettings::load(&cli);
    let settings = match observability::process::checked_settings(
        "worker",
        loaded,
        WorkerSettings::validate,
    ) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if cli.check_config {
        // The effective settings (defaults < file < environment < flags), e.g. for a Helm chart's CI.
        return observability::process::print_settings(&settings.effective());
    }
    // The device is part of the settings: `--device cuda` without a usable GPU is exit code 2.
    let backend = match backend_cuda::choose_backend(settings.device, || {
        backend_cuda::probe(settings.cuda_device)
    }) {
        Ok(backend) => backend,
        Err(e) => {
            eprintln!("worker: invalid settings: {e}");
            return ExitCode::from(2);
        }
    };
    let telemetry = observability::telemetry::TelemetrySettings {
        service_name: "worker",
        log_filter: settings.log.clone(),
        otlp_endpoint: settings.otlp_endpoint.clone(),
    };
    observability::process::run_service(telemetry, Some(2), || run(settings, backend))
}

async fn run(settings: WorkerSettings, backend: Backend) -> anyhow::Result<()> {
    let Some(model_path) = settings.model.clone() else {
        anyhow::bail!("no model given: pass --model PATH.gguf (or set WORKER_MODEL)");
    };
    if !model_path.exists() {
        return Err(BadInput(anyhow::anyhow!(
            "model file {} does not exist",
            model_path.display()
        ))
        .into());
    }
    backend_cpu::pool::set_threads(settings.threads);
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| anyhow::anyhow!("installing the SIGTERM handler: {e}"))?;
    // Bind first so a port in use fails fast, before a long model load.
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", settings.listen))?;
    let metrics_listener =
        match observability::metrics_http::parse_listen(&settings.metrics_listen)? {
            Some(addr) => Some(observability::metrics_http::bind(addr).await?),
            None => None,
        };
    let (health, health_service) = tonic_health::server::health_reporter();
    let lifecycle = Lifecycle::new(health).await;
    if let Some(addr) = settings.health_listen() {
        let bound = observability::grpc::serve_health(addr, health_service.clone()).await?;
        tracing::info!(%bound, "serving grpc.health.v1 in plain text (health_listen)");
    }
    // TLS of the gRPC port, re-read on change (read before the model load: a bad file fails fast).
    // Its message alone (the message already holds its source's).
    let cert = settings.tls_cert().map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(cert) = &cert {
        cert.watch(observability::reload::RELOAD_PERIOD);
        tracing::info!(cert = %cert.files().cert.display(), "TLS on the gRPC port");
    }
    let prepared = Prepared {
        settings,
        model_path,
        term,
        listener,
        metrics_listener,
        lifecycle,
        health_service,
        cert,
    };
    match backend {
        Backend::Cpu { reason } => {
            let numerics = prepared.settings.cpu_numerics();
            tracing::info!(
                device = "cpu",
                %reason,
                numerics = numerics.as_str(),
                simd = backend_cpu::SimdPath::detect().as_str(),
                int8 = backend_cpu::IntPath::detect().as_str(),
                "compute device chosen"
            );
            let kv_dtype = prepared.settings.kv_cache_dtype;
            let load = move |file: &gguf::GgufFile| {
                CpuModel::from_source(file)
                    .map(|model| model.with_kv_dtype(kv_dtype).with_numerics(numerics))
            };
            let mode = RunMode {
                backend: "cpu",
                numerics: numerics.as_str(),
                line: match numerics {
                    backend_cpu::Numerics::Exact => "cpu, numerics exact".to_string(),
                    backend_cpu::Numerics::Fast => format!(
                        "cpu, numerics fast, {} integer kernels",
                        backend_cpu::IntPath::detect().as_str()
                    ),
                },
            };
            load_and_serve(prepared, mode, load, |_, _, _| Ok(())).await
        }
        Backend::Cuda(gpu) => {
            // `device = auto` chose the GPU: `numerics = fast` (a CPU mode) cannot run there.
            prepared
                .settings
                .check_numerics_on("cuda")
                .map_err(|e| BadInput(anyhow::anyhow!("invalid settings: {e}")))?;
            tracing::info!(
                device = "cuda",
                gpu = %gpu.name,
                ordinal = gpu.ordinal,
                arch = %gpu.arch,
                memory_mib = gpu.total_mem >> 20,
                numerics = prepared.settings.cuda_numerics.as_str(),
                graphs = prepared.settings.cuda_graphs,
                "compute device chosen"
            );
            let s = &prepared.settings;
            if s.kv_cache_dtype != backend_cpu::KvDtype::F32 {
                tracing::warn!(
                    "kv_cache_dtype is a CPU setting: the CUDA KV cache is f32 in exact mode and \
                     bf16 in fast mode (cuda_numerics)"
                );
            }
            let options = CudaOptions {
                numerics: s.cuda_numerics,
                graphs: s.cuda_graphs,
                cache_dir: backend_cuda::cache::cache_dir(&s.cuda_cache_dir),
                max_decode_batch: s.max_num_seqs,
            };
            let mode = RunMode {
                backend: "cuda",
                numerics: s.cuda_numerics.as_str(),
                line: format!("cuda, cuda_numerics {}", s.cuda_numerics.as_str()),
            };
            load_and_serve(
                prepared,
                mode,
                move |file: &gguf::GgufFile| {
                    CudaModel::from_source(file, gpu.clone(), options.clone())
                },
                |model: &CudaModel, kv_bytes_per_token: usize, config: &EngineConfig| {
                    let need = config.num_blocks * config.block_size * kv_bytes_per_token;
                    Ok(model.check_kv_bytes_fit(need)?)
                },
            )
            .await
        }
    }
}

/// Everything set up before the model loads (sockets bound first, so a port in use fails fast).
struct Prepared<H> {
    settings: WorkerSettings,
    model_path: std::path::PathBuf,
    term: tokio::signal::unix::Signal,
    listener: tokio::net::TcpListener,
    metrics_listener: Option<tokio::net::TcpListener>,
    lifecycle: std::sync::Arc<Lifecycle>,
    health_service: tonic_health::pb::health_server::HealthServer<H>,
    cert: Option<std::sync::Arc<tls_certs::ReloadingCert>>,
}

/// The backend and numeric mode that run: `Info` reports `backend` and `numerics`, the ready line
/// ends with `line` (e.g. `cpu, numerics fast, avx2 integer kernels`).
struct RunMode {
    /// `"cpu"` or `"cuda"` (`Info.backend`).
    backend: &'static str,
    /// `"exact"` or `"fast"`: the `numerics` setting on the CPU, `cuda_numerics` on CUDA
    /// (`Info.numerics`).
    numerics: &'static str,
    /// The ready line's description of both.
    line: String,
}

/// Opens the model file, builds the model from it with `load` (on a blocking thread; a shutdown signal meanwhile ends the worker),
/// and with `speculation = draft` the draft model too (its vocabulary checked against the
/// model's), checks the engine settings against them with `check` (given the model, the KV bytes
/// per token of both models and the engine settings), then runs the engine and
/// serves until shutdown; `mode` (the device and numeric mode) goes into `Info` and the ready line.
async fn load_and_serve<H, M, E, L, C>(
    p: Prepared<H>,
    mode: RunMode,
    load: L,
    check: C,
) -> anyhow::Result<()>
where
    H: tonic_health::pb::health_server::Health,
    M: BatchModel,
    E: Into<anyhow::Error>,
    L: Fn(&gguf::GgufFile) -> Result<M, E> + Send + 'static,
    C: Fn(&M, usize, &EngineConfig) -> anyhow::Result<()>,
{
    let Prepared {
        settings,
        model_path,
        mut term,
        listener,
        metrics_listener,
        lifecycle,
        health_service,
        cert,
    } = p;
    let started = std::time::Instant::now();
    let path = model_path.clone();
    let served_model_name = settings.served_model_name.trim().to_string();
    let (backend, numerics) = (mode.backend, mode.numerics);
    let draft_path = match settings.speculation_config()?.proposer {
        engine::speculation::Proposer::Draft => settings.draft_model.clone(),
        _ => None,
    };
    let load = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        // A file that cannot be served is bad input (exit code 2), named in the message.
        let bad = |e: anyhow::Error| {
            let message = format!("{e:#}");
            let shown = path.display().to_string();
            match message.starts_with(&shown) {
                true => BadInput(e),
                false => BadInput(anyhow::anyhow!("{shown}: {message}")),
            }
        };
        // Opened once: the model and the description both read this (a Hugging Face folder is
        // converted only once).
        let file = model_files::open(&path).map_err(|e| bad(e.into()))?;
        let model = load(&file).map_err(|e| bad(e.into()))?;
        let mut description =
            model_info(&path, &file, model.context_length(), model.vocab_size()).map_err(bad)?;
        if !served_model_name.is_empty() {
            description.served_model_name = served_model_name;
        }
        description.backend = backend.into();
        description.numerics = numerics.into();
        let draft = match &draft_path {
            Some(draft_path) => Some(load_draft(draft_path, &file, &model, &load)?),
            None => None,
        };
        Ok((model, draft, description))
    });
    let (model, draft, description) = tokio::select! {
        loaded = load => loaded??,
        () = shutdown_signal(&mut term) => {
            tracing::info!("shutdown requested while the model was loading");
            return Ok(());
        }
    };
    tracing::info!(
        model = %model_path.display(),
        load_ms = started.elapsed().as_millis() as u64,
        "model loaded"
    );
    // With a draft model each KV block holds both models' K/V of its positions.
    let kv_bytes_per_token =
        model.kv_bytes_per_token() + draft.as_ref().map_or(0, |d| d.kv_bytes_per_token());
    let engine_config = settings
        .engine_config(kv_bytes_per_token)
        .map_err(|e| anyhow::anyhow!("invalid engine settings: {e}"))?;
    check(&model, kv_bytes_per_token, &engine_config)
        .map_err(|e| anyhow::anyhow!("invalid engine settings: {e}"))?;
    tracing::info!(?engine_config, "engine settings");
    let speculation_line = match (&settings.draft_model, draft.is_some()) {
        (Some(path), true) => format!(", speculation draft {}", path.display()),
        _ => String::new(),
    };
    let engine = spawn_engine_with_draft(model, draft, engine_config);
    if let Some(listener) = metrics_listener {
        let metrics = WorkerMetrics::new(engine.clone(), lifecycle.clone());
        tokio::spawn(metrics.clone().sample_steps());
        let bound = observability::metrics_http::serve_on(listener, move || {
            let metrics = metrics.clone();
            async move { metrics.render().await }
        })?;
        tracing::info!(%bound, "serving Prometheus metrics at /metrics");
    }
    let stall_timeout = Duration::from_millis(settings.engine_stall_timeout_ms);
    // Building the structured-output token environment takes 0.2 s to seconds: off the runtime.
    let service_engine = engine.clone();
    let service =
        tokio::task::spawn_blocking(move || WorkerService::new(service_engine, description))
            .await?
            .with_lifecycle(lifecycle.clone())
            .with_stall_timeout(stall_timeout)
            .with_router_backlog(
                usize::try_from(settings.router_backlog_kib.saturating_mul(1024))
                    .unwrap_or(usize::MAX),
            );
    lifecycle.set_serving().await;
    tokio::spawn(worker::health::watch_engine(
        lifecycle.clone(),
        engine.clone(),
        stall_timeout,
    ));
    // The bound address: with port 0 in `listen` the system picked one (`serve` starts it so).
    let bound = listener
        .local_addr()
        .map_err(|e| anyhow::anyhow!("reading the bound address: {e}"))?;
    println!(
        "worker ready: serving {} on {}{} ({}{speculation_line})",
        model_path.display(),
        bound,
        if cert.is_some() { " over TLS" } else { "" },
        mode.line
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let router = tonic::transport::Server::builder()
        // A router probes health on the connection that carries its stream, and gives up on (resets)
        // a probe after one health interval. While this process is frozen (SIGSTOP, a long GC-like
        // pause of the host) those resets pile up unread; hyper's default allows 20 before it
        // closes the whole connection (GOAWAY too_many_resets) on resume, dropping every stream.
        // Routers are trusted peers, so allow a long freeze's worth of them.
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_RESETS))
        .add_service(WorkerServer::new(service))
        .add_service(health_service)
        .add_service(observability::grpc::reflection_service(&[
            "inference.worker.v1.Worker",
        ]))
        .add_service(observability::grpc::reflection_service_v1alpha(&[
            "inference.worker.v1.Worker",
        ]));
    let mut server = tls_certs::grpc::serve(router, listener, cert, async {
        let _ = stop_rx.await;
    })?;
    tokio::select! {
        result = &mut server => return Ok(result?),
        () = shutdown_signal(&mut term) => {}
    }
    // Drain: NOT_SERVING, refuse new requests, let running sequences finish (up to the timeout).
    lifecycle.start_drain().await;
    let timeout = Duration::from_millis(settings.drain_timeout_ms);
    tracing::info!(timeout_ms = settings.drain_timeout_ms, "draining");
    tokio::select! {
        result = &mut server => return Ok(result?),
        idle = worker::health::wait_idle(&engine, timeout) => {
            if idle {
                tracing::info!("drained; shutting down");
            }
        }
    }
    // End the router streams (what still runs is failed over by the router), then stop serving.
    lifecycle.stop();
    let _ = stop_tx.send(());
    match tokio::time::timeout(Duration::from_secs(2), server).await {
        Ok(result) => result?,
        Err(_) => tracing::warn!("connections still open after shutdown; closing them"),
    }
    Ok(())
}

/// Loads the draft model of `speculation = draft` from `path` with `load` and checks that its
/// vocabulary is the model's (`model`, opened from `model_file`).
///
/// Errors (all [`BadInput`], exit code 2, one line naming `draft_model` and the path): the file
/// cannot be opened or loaded, or its vocabulary differs (the first difference).
fn load_draft<M, E, L>(
    path: &std::path::Path,
    model_file: &gguf::GgufFile,
    model: &M,
    load: &L,
) -> anyhow::Result<M>
where
    M: BatchModel,
    E: Into<anyhow::Error>,
    L: Fn(&gguf::GgufFile) -> Result<M, E>,
{
    let bad = |e: &dyn std::fmt::Display| {
        BadInput(anyhow::anyhow!("draft_model {}: {e:#}", path.display()))
    };
    if !path.exists() {
        return Err(bad(&"does not exist").into());
    }
    let file = model_files::open(path).map_err(|e| bad(&e))?;
    let draft = load(&file).map_err(|e| bad(&format!("{:#}", e.into())))?;
    let vocabulary = |f: &gguf::GgufFile| gguf::TokenizerMetadata::from_gguf(f);
    let model_vocabulary = vocabulary(model_file).map_err(|e| bad(&format!("the model: {e}")))?;
    let draft_vocabulary = vocabulary(&file).map_err(|e| bad(&e))?;
    worker::draft_vocabulary::check_same_vocabulary(
        &model_vocabulary,
        model.vocab_size(),
        &draft_vocabulary,
        draft.vocab_size(),
    )
    .map_err(|e| bad(&e))?;
    tracing::info!(draft_model = %path.display(), "draft model loaded; its vocabulary is the model's");
    Ok(draft)
}

/// Resolves on SIGTERM (`term`) or Ctrl-C.
async fn shutdown_signal(term: &mut tokio::signal::unix::Signal) {
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutdown signal received");
}
