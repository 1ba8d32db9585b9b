//! Worker settings: defaults < TOML file < environment (`WORKER_*`) < command-line flags.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use figment::providers::Env;
use serde::{Deserialize, Serialize};

use crate::speculation_setting::{speculation_config, SpeculationSetting, SpeculationSettingError};
use backend_cpu::{KvDtype, Numerics as CpuNumerics};
use backend_cuda::{DeviceKind, Numerics};
use engine::{EngineConfig, SchedulerConfig};

/// Command-line flags. Every flag is optional here so that the file and environment can supply it.
#[derive(Debug, Parser, Serialize)]
#[command(
    name = "worker",
    version = build_info::VERSION,
    about = "Loads a GGUF model and serves it to routers over gRPC"
)]
pub struct Cli {
    /// TOML settings file (also `WORKER_CONFIG`).
    #[arg(long, env = "WORKER_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// The model: a GGUF file, or a Hugging Face model folder (`config.json`, safetensors,
    /// tokenizer files).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// The name routers serve the model under (requests' `model`); empty = the model's name made
    /// an id (e.g. `smollm2-135m-instruct`).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_model_name: Option<String>,
    /// Address to serve gRPC on, e.g. 127.0.0.1:50061.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Compute threads (0 = one per core).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// KV cache memory budget, in MiB.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_mib: Option<usize>,
    /// KV blocks in the pool; overrides `kv_cache_mib` when non-zero.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_blocks: Option<usize>,
    /// KV cache element type: f32 (exact, default) or f16 (half the memory and bandwidth).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_dtype: Option<String>,
    /// Most tokens in one engine step (decodes plus prefill chunks).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_batch_tokens: Option<usize>,
    /// Most sequences running at once.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_num_seqs: Option<usize>,
    /// Most tokens of one sequence's prefill chunk while others run or wait (0 = no cap).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub long_prefill_token_threshold: Option<usize>,
    /// Most tokens of sheddable (negative-priority) requests in one step (0 = no cap).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sheddable_batch_tokens: Option<usize>,
    /// Speculative decoding: off, ngram (prompt lookup) or draft (a draft model, `--draft-model`);
    /// outputs are identical either way.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculation: Option<String>,
    /// The draft model of `speculation = draft`: a GGUF file or Hugging Face folder with the
    /// model's vocabulary.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<PathBuf>,
    /// Most tokens proposed per sequence and step (1..=16).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_speculative_tokens: Option<usize>,
    /// Shortest suffix the n-gram proposer matches, in tokens.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ngram_min: Option<usize>,
    /// Longest suffix the n-gram proposer matches, in tokens.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ngram_max: Option<usize>,
    /// Reuse cached prompt-prefix KV blocks (true/false).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_caching: Option<bool>,
    /// Address of the Prometheus endpoint (`GET /metrics`), e.g. 127.0.0.1:9091; empty = off.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
    /// OTLP gRPC endpoint that receives the worker's spans, e.g. http://127.0.0.1:4317; empty = off.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// On SIGTERM, how long running sequences may take to finish before the worker exits, in ms.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_timeout_ms: Option<u64>,
    /// Report NOT_SERVING (grpc.health.v1 and Health) while the engine has work and finished no step
    /// for this many ms.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_stall_timeout_ms: Option<u64>,
    /// Most KiB of step messages one router's stream may leave unread (a stopped or stuck router)
    /// before the worker closes that stream and cancels its requests (0 = no limit).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub router_backlog_kib: Option<u64>,
    /// Compute device: cpu, cuda, or auto (CUDA when a driver and a GPU are present, else CPU).
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceKind>,
    /// CUDA device ordinal (the GPU the CUDA backend runs on).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_device: Option<usize>,
    /// CPU numeric mode: fast (the default on the CPU: 8-bit activations and integer dot
    /// products for quantized weights, deterministic and batch invariant) or exact (f32
    /// activations, the float32 reference). CPU only: fast is an error with device cuda.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numerics: Option<String>,
    /// CUDA numeric mode: exact (f32, reference-equal greedy ids, batch invariant) or fast (bf16).
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_numerics: Option<Numerics>,
    /// Replay decode steps from CUDA graphs per batch-size bucket (true/false).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_graphs: Option<bool>,
    /// Folder of compiled CUDA kernel modules; empty = $XDG_CACHE_HOME/smollm-serve/cuda.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_cache_dir: Option<String>,
    /// TLS certificate chain (PEM, leaf first) of the gRPC port; needs `--tls-key`. Re-read on
    /// change.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<String>,
    /// TLS private key (PEM) of `--tls-cert`.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<String>,
    /// Address (`IP:PORT`) of a plain-text port serving only `grpc.health.v1` (for probes that
    /// cannot speak TLS); empty = off.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_listen: Option<String>,
    /// Load and validate the settings, print the effective settings (JSON) and exit: 0 when they
    /// are valid, 2 with the error otherwise. Loads no model (the file need not exist here).
    #[arg(long)]
    #[serde(skip)]
    pub check_config: bool,
    /// A command instead of serving (`worker inspect MODEL`).
    #[command(subcommand)]
    #[serde(skip)]
    pub command: Option<WorkerCommand>,
}

/// What the `worker` binary can do besides serving.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum WorkerCommand {
    /// Print what a GGUF file or Hugging Face folder holds (architecture, sizes, tensor formats, tokenizer) and whether
    /// this worker can serve it, by loading it as serving would. Exit code 0 when it can, 2 when
    /// it cannot (the last line says why).
    Inspect {
        /// The GGUF model file or Hugging Face model folder.
        model: PathBuf,
    },
}

/// The worker's effective settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSettings {
    /// The model: a GGUF file or a Hugging Face model folder. Required.
    pub model: Option<PathBuf>,
    /// The name routers serve the model under (`Info.served_model_name`, requests' `model`); empty
    /// = the model's name made an id ([`crate::model_info::model_id`]).
    pub served_model_name: String,
    /// gRPC listen address.
    pub listen: SocketAddr,
    /// Compute threads; 0 means one per available core.
    pub threads: usize,
    /// Log filter in `tracing_subscriber::EnvFilter` syntax (also `RUST_LOG`).
    pub log: String,
    /// KV cache memory budget, in MiB (sizes the block pool).
    pub kv_cache_mib: usize,
    /// KV blocks in the pool; when non-zero it overrides `kv_cache_mib`.
    pub kv_cache_blocks: usize,
    /// KV cache element type, `f32` (default: the model's float32 behaviour) or `f16` (half the
    /// memory per token, so twice the blocks for the same `kv_cache_mib`, and half the attention
    /// bandwidth; greedy output may leave the float32 reference, see BENCHMARKS.md).
    pub kv_cache_dtype: KvDtype,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Most tokens in one engine step (decodes plus prefill chunks).
    pub max_batch_tokens: usize,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens of one sequence's prefill chunk in a step that also runs decodes or other
    /// prefills (0 = no cap): bounds the step time, so running streams' inter-token gaps and a new
    /// request's wait for the step in progress stay short while a long prompt prefills. A prompt
    /// alone on the worker still takes `max_batch_tokens` per step.
    pub long_prefill_token_threshold: usize,
    /// Most tokens that sheddable (negative-priority) sequences take in one step, their decodes
    /// and prefill chunks together (0 = no cap, the default). A step of sheddable work then lasts
    /// at most about this many tokens' compute, which bounds how long a higher-priority arrival
    /// waits for the step in progress; the price is the sheddable work's own throughput (smaller
    /// steps). Higher-priority prefill always takes a step without sheddable work in it.
    pub max_sheddable_batch_tokens: usize,
    /// Reuse cached prompt-prefix KV blocks.
    pub prefix_caching: bool,
    /// Speculative decoding (issue 28): `off` (default), `ngram` (prompt lookup) or `draft` (the
    /// `draft_model` proposes), verified so that every output is bitwise the same as with `off`.
    pub speculation: SpeculationSetting,
    /// The draft model of `speculation = draft` (a GGUF file or Hugging Face folder whose
    /// vocabulary is the model's, checked at start-up); required by `draft`, refused otherwise.
    pub draft_model: Option<PathBuf>,
    /// Most tokens proposed per sequence and step, 1..=16 (the engine picks 0 up to this).
    pub num_speculative_tokens: usize,
    /// Shortest suffix the n-gram proposer matches, in tokens (1 <= ngram_min <= ngram_max).
    pub ngram_min: usize,
    /// Longest suffix the n-gram proposer matches, in tokens (tried first; at most 64).
    pub ngram_max: usize,
    /// Fraction of the KV blocks kept free at admission (headroom for running decodes).
    pub kv_watermark: f64,
    /// Address (`IP:PORT`) of the Prometheus text endpoint (`GET /metrics`); empty = off.
    pub metrics_listen: String,
    /// OTLP gRPC endpoint (e.g. `http://otel-collector:4317`) that receives the worker's spans;
    /// empty = no trace export.
    pub otlp_endpoint: String,
    /// On SIGTERM the worker reports NOT_SERVING, refuses new requests with `UNAVAILABLE` (the
    /// router sends them elsewhere) and lets running sequences finish for up to this many ms before
    /// it exits (those still running then are failed over by the router).
    pub drain_timeout_ms: u64,
    /// The engine is *stalled* when it has running or waiting sequences and has finished no step
    /// for this many ms (counted from its last step, or from when work arrived while it was idle):
    /// `grpc.health.v1` and the `Health` RPC then say `NOT_SERVING` / not ready, and `SERVING`
    /// again once it moves. Generous by default: one CPU step of a long prefill can take seconds.
    pub engine_stall_timeout_ms: u64,
    /// Most KiB of step messages one router's stream may leave unread before the worker closes
    /// that stream (`RESOURCE_EXHAUSTED`) and cancels its requests; the router fails them over and
    /// resyncs from a new snapshot (`service::backlog`). 0 = no limit. The engine never waits for
    /// a router either way; this bounds the memory a stopped router can make it hold.
    pub router_backlog_kib: u64,
    /// Compute device: `cpu`, `cuda` (exit code 2 at start when no usable GPU is present) or `auto`
    /// (CUDA when a driver and a GPU are present, else the CPU; the log says which).
    pub device: DeviceKind,
    /// CUDA device ordinal.
    pub cuda_device: usize,
    /// Numeric mode of the CPU backend, as set: `fast` (block-quantized weights multiplied with
    /// 8-bit activations and integer dot products; deterministic and batch invariant, but not
    /// equal to the f32 reference) or `exact` (f32 activations against exactly decoded weights,
    /// the float32 reference up to summation order). Unset (`None`) runs `fast` on the CPU
    /// ([`Self::cpu_numerics`]); set to `fast` with the CUDA device it is an error (the CUDA
    /// backend's own mode is `cuda_numerics`).
    #[serde(default)]
    pub numerics: Option<CpuNumerics>,
    /// Numeric mode of the CUDA backend: `exact` (f32; greedy ids equal the CPU reference, batch
    /// invariant) or `fast` (bf16 activations and KV cache).
    pub cuda_numerics: Numerics,
    /// Replay pure decode steps from CUDA graphs captured per batch-size bucket.
    pub cuda_graphs: bool,
    /// Folder of the compiled-kernel cache; empty = `$XDG_CACHE_HOME/smollm-serve/cuda` (else
    /// `~/.cache/smollm-serve/cuda`).
    pub cuda_cache_dir: String,
    /// TLS certificate chain file (PEM, leaf first) of the gRPC port; with `tls_key`, the port
    /// speaks only TLS (routers then need `worker_tls_ca`). Both files are re-read about every
    /// second: new connections get a changed pair; a broken one keeps the last good pair. Empty
    /// (with `tls_key`) = plain text.
    pub tls_cert: String,
    /// TLS private key file (PEM: PKCS#8, PKCS#1 or SEC1) of `tls_cert`.
    pub tls_key: String,
    /// Address (`IP:PORT`) of a plain-text port that serves only `grpc.health.v1` (the same
    /// statuses as on `listen`), for probes that cannot speak TLS; empty = off.
    pub health_listen: String,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            model: None,
            served_model_name: String::new(),
            listen: "127.0.0.1:50061".parse().expect("valid default address"),
            threads: 0,
            log: "info".into(),
            kv_cache_mib: 1024,
            kv_cache_blocks: 0,
            kv_cache_dtype: KvDtype::F32,
            block_size: 16,
            max_batch_tokens: 512,
            max_num_seqs: 128,
            long_prefill_token_threshold: 256,
            max_sheddable_batch_tokens: 0,
            prefix_caching: true,
            speculation: SpeculationSetting::Off,
            draft_model: None,
            num_speculative_tokens: 5,
            ngram_min: 1,
            ngram_max: 3,
            kv_watermark: 0.01,
            metrics_listen: String::new(),
            otlp_endpoint: String::new(),
            drain_timeout_ms: 30_000,
            engine_stall_timeout_ms: 60_000,
            router_backlog_kib: (crate::service::DEFAULT_ROUTER_BACKLOG_BYTES / 1024) as u64,
            device: DeviceKind::Auto,
            cuda_device: 0,
            numerics: None,
            cuda_numerics: Numerics::Exact,
            cuda_graphs: true,
            cuda_cache_dir: String::new(),
            tls_cert: String::new(),
            tls_key: String::new(),
            health_listen: String::new(),
        }
    }
}

impl WorkerSettings {
    /// Merges defaults, the TOML file named by `cli.config`, `WORKER_*` variables and `cli`.
    ///
    /// Errors: an unreadable or invalid file, a key in the file that is not a setting (a misspelling
    /// would otherwise be ignored), or a value of the wrong type (figment's message names the key and
    /// where it came from).
    pub fn load(cli: &Cli) -> Result<Self, Box<figment::Error>> {
        settings_file::load(
            &Self::default(),
            cli.config.as_deref(),
            Env::prefixed("WORKER_"),
            cli,
        )
    }

    /// Checks what the file and environment cannot type-check: a model path is given, the block
    /// size is at least 1, `metrics_listen` and `health_listen` are empty or `IP:PORT`, the TLS
    /// files are a complete pair that can be read and used. The model file is not opened.
    ///
    /// Errors: a [`SettingsError`] naming the setting.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.model.as_ref().is_none_or(|m| m.as_os_str().is_empty()) {
            return Err(SettingsError::NoModel);
        }
        if self.block_size == 0 {
            return Err(SettingsError::ZeroBlockSize);
        }
        if self.max_num_seqs == 0 || self.max_batch_tokens == 0 {
            return Err(SettingsError::ZeroBatch {
                max_num_seqs: self.max_num_seqs,
                max_batch_tokens: self.max_batch_tokens,
            });
        }
        if self.kv_cache_mib == 0 && self.kv_cache_blocks == 0 {
            return Err(SettingsError::NoKvCache);
        }
        if !(0.0..=0.5).contains(&self.kv_watermark) {
            return Err(SettingsError::KvWatermark(self.kv_watermark));
        }
        for (setting, value) in [
            ("metrics_listen", &self.metrics_listen),
            ("health_listen", &self.health_listen),
        ] {
            let value = value.trim();
            if !value.is_empty() && value.parse::<SocketAddr>().is_err() {
                return Err(SettingsError::NotAnAddress {
                    setting,
                    value: value.into(),
                });
            }
        }
        self.tls_cert()?;
        if self.engine_stall_timeout_ms == 0 {
            return Err(SettingsError::ZeroStallTimeout);
        }
        if self.device == DeviceKind::Cuda {
            self.check_numerics_on("cuda")?;
        }
        self.speculation_config()?;
        Ok(())
    }

    /// The CPU backend's numeric mode: `numerics` as set, `fast` when unset (the default since
    /// `fast` met its quality targets on both real models: perplexity within 0.5 % of `exact`
    /// and closer to it than llama.cpp's own; BENCHMARKS.md).
    pub fn cpu_numerics(&self) -> CpuNumerics {
        self.numerics.unwrap_or(CpuNumerics::Fast)
    }

    /// Settings as they run, for `--check-config`: `numerics` resolved ([`Self::cpu_numerics`];
    /// with `device = auto`, the mode of the CPU that auto falls back to) unless the device is
    /// `cuda`, where it does not apply (`null`; `cuda_numerics` is the mode that runs there).
    pub fn effective(&self) -> WorkerSettings {
        let numerics = match self.device {
            DeviceKind::Cuda => None,
            DeviceKind::Cpu | DeviceKind::Auto => Some(self.cpu_numerics()),
        };
        WorkerSettings {
            numerics,
            ..self.clone()
        }
    }

    /// Checks that `numerics` can run on the device `chosen` (`cuda` or `cpu`): `fast`, when set,
    /// is a CPU mode (unset, it does not apply to the CUDA backend).
    ///
    /// Errors: [`SettingsError::FastNumericsOnCuda`].
    pub fn check_numerics_on(&self, chosen: &'static str) -> Result<(), SettingsError> {
        match (self.numerics, chosen) {
            (Some(CpuNumerics::Fast), "cuda") => Err(SettingsError::FastNumericsOnCuda),
            _ => Ok(()),
        }
    }

    /// The gRPC port's certificate, read now (re-read by its `watch`), when TLS is on.
    ///
    /// Errors: only one of `tls_cert` and `tls_key` is set, or a file cannot be read or is invalid
    /// (the message names it).
    pub fn tls_cert(
        &self,
    ) -> Result<Option<std::sync::Arc<tls_certs::ReloadingCert>>, tls_certs::TlsError> {
        tls_certs::CertFiles::from_settings(
            ("tls_cert", &self.tls_cert),
            ("tls_key", &self.tls_key),
        )
        .and_then(|files| files.map(tls_certs::ReloadingCert::load).transpose())
    }

    /// The engine's speculation settings.
    ///
    /// Errors: [`SettingsError::Speculation`] naming the setting.
    pub fn speculation_config(
        &self,
    ) -> Result<engine::speculation::SpeculationConfig, SettingsError> {
        Ok(speculation_config(
            self.speculation,
            self.draft_model.as_deref(),
            self.num_speculative_tokens,
            self.ngram_min,
            self.ngram_max,
        )?)
    }

    /// The plain health port's address, when it is on.
    pub fn health_listen(&self) -> Option<SocketAddr> {
        let value = self.health_listen.trim();
        (!value.is_empty()).then(|| value.parse().expect("checked by validate"))
    }

    /// The engine settings for a model with `kv_bytes_per_token` bytes of K/V per token.
    ///
    /// Errors: a zero block size, or a KV budget smaller than one block.
    pub fn engine_config(&self, kv_bytes_per_token: usize) -> Result<EngineConfig, SettingsError> {
        if self.block_size == 0 {
            return Err(SettingsError::ZeroBlockSize);
        }
        let block_bytes = kv_bytes_per_token * self.block_size;
        let num_blocks = if self.kv_cache_blocks > 0 {
            self.kv_cache_blocks
        } else {
            self.kv_cache_mib * (1 << 20) / block_bytes.max(1)
        };
        if num_blocks == 0 {
            return Err(SettingsError::KvCacheTooSmall {
                kv_cache_mib: self.kv_cache_mib,
                block_size: self.block_size,
                block_bytes,
            });
        }
        Ok(EngineConfig {
            block_size: self.block_size,
            num_blocks,
            prefix_caching: self.prefix_caching,
            scheduler: SchedulerConfig {
                max_batch_tokens: self.max_batch_tokens,
                max_num_seqs: self.max_num_seqs,
                long_prefill_token_threshold: self.long_prefill_token_threshold,
                max_sheddable_batch_tokens: self.max_sheddable_batch_tokens,
                watermark_blocks: (num_blocks as f64 * self.kv_watermark.clamp(0.0, 0.5)) as usize,
            },
            speculation: self.speculation_config()?,
        })
    }
}

/// A worker setting that cannot be used; every message names the setting.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// `model` is not set.
    #[error("no model given: set `model` (--model PATH.gguf, WORKER_MODEL)")]
    NoModel,
    /// `block_size` is 0.
    #[error("block_size must be at least 1")]
    ZeroBlockSize,
    /// `max_num_seqs` or `max_batch_tokens` is 0.
    #[error(
        "max_num_seqs ({max_num_seqs}) and max_batch_tokens ({max_batch_tokens}) must be at least 1"
    )]
    ZeroBatch {
        /// The `max_num_seqs` setting.
        max_num_seqs: usize,
        /// The `max_batch_tokens` setting.
        max_batch_tokens: usize,
    },
    /// Both `kv_cache_mib` and `kv_cache_blocks` are 0.
    #[error("kv_cache_mib is 0 and kv_cache_blocks is 0: the KV cache would be empty")]
    NoKvCache,
    /// `kv_watermark` outside [0, 0.5].
    #[error("kv_watermark {0} is outside [0, 0.5]")]
    KvWatermark(f64),
    /// `metrics_listen` or `health_listen` is neither empty nor `IP:PORT`.
    #[error("{setting} {value:?} is not an IP:PORT address")]
    NotAnAddress {
        /// The setting.
        setting: &'static str,
        /// Its value (trimmed).
        value: String,
    },
    /// The TLS settings or files cannot be used.
    #[error(transparent)]
    Tls(#[from] tls_certs::TlsError),
    /// `numerics = fast` with the CUDA device.
    #[error(
        "numerics = fast is a CPU mode and the device is cuda: set `numerics = exact` (or `device = \
         cpu`); the CUDA backend's fast mode is `cuda_numerics = fast`"
    )]
    FastNumericsOnCuda,
    /// A speculation setting that cannot run.
    #[error(transparent)]
    Speculation(#[from] SpeculationSettingError),
    /// `engine_stall_timeout_ms` is 0.
    #[error("engine_stall_timeout_ms must be at least 1")]
    ZeroStallTimeout,
    /// `kv_cache_mib` holds no whole KV block of this model.
    #[error(
        "kv_cache_mib = {kv_cache_mib} MiB holds no block of {block_size} tokens ({block_bytes} bytes)"
    )]
    KvCacheTooSmall {
        /// The `kv_cache_mib` setting.
        kv_cache_mib: usize,
        /// The `block_size` setting.
        block_size: usize,
        /// Bytes of one block of this model.
        block_bytes: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure signature
    fn precedence_file_env_flags() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "w.toml",
                "listen = '127.0.0.1:7000'\nthreads = 3\nmodel = 'a.gguf'",
            )?;
            jail.set_env("WORKER_THREADS", "5");
            let cli = Cli::parse_from(["worker", "--config", "w.toml", "--model", "b.gguf"]);
            let s = WorkerSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.listen.port(), 7000);
            assert_eq!(s.threads, 5);
            assert_eq!(s.model, Some(PathBuf::from("b.gguf")));
            assert_eq!(s.device, DeviceKind::Auto);
            assert_eq!(s.cuda_numerics, Numerics::Exact);
            assert!(s.cuda_graphs);
            assert_eq!(s.engine_stall_timeout_ms, 60_000);
            jail.set_env("WORKER_ENGINE_STALL_TIMEOUT_MS", "1500");
            let s = WorkerSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.engine_stall_timeout_ms, 1500);
            let flagged = Cli::parse_from(["worker", "--engine-stall-timeout-ms", "250"]);
            let s = WorkerSettings::load(&flagged).map_err(|e| e.to_string())?;
            assert_eq!(s.engine_stall_timeout_ms, 250);
            assert_eq!(s.router_backlog_kib, 65_536);
            jail.set_env("WORKER_ROUTER_BACKLOG_KIB", "64");
            let s = WorkerSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.router_backlog_kib, 64);
            let flagged = Cli::parse_from(["worker", "--router-backlog-kib", "0"]);
            let s = WorkerSettings::load(&flagged).map_err(|e| e.to_string())?;
            assert_eq!(s.router_backlog_kib, 0);
            jail.set_env("WORKER_DEVICE", "cpu");
            jail.set_env("WORKER_CUDA_GRAPHS", "false");
            let cli = Cli::parse_from(["worker", "--cuda-numerics", "fast", "--model", "m.gguf"]);
            let s = WorkerSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.device, DeviceKind::Cpu);
            assert_eq!(s.cuda_numerics, Numerics::Fast);
            assert!(!s.cuda_graphs);
            jail.set_env("WORKER_DEVICE", "tpu");
            let err = WorkerSettings::load(&cli).unwrap_err().to_string();
            assert!(
                err.contains("tpu") && err.to_lowercase().contains("device"),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure signature
    fn misspelt_file_key_is_an_error() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("w.toml", "model = 'a.gguf'\nkv_cache_mb = 64\n")?;
            let cli = Cli::parse_from(["worker", "--config", "w.toml"]);
            let err = WorkerSettings::load(&cli).unwrap_err().to_string();
            assert!(err.contains("unknown setting `kv_cache_mb`"), "{err}");
            assert!(err.contains("kv_cache_mib"), "{err}");
            jail.create_file("w.toml", "model = 'a.gguf'\nkv_cache_dtype = 'f16'\n")?;
            let s = WorkerSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.kv_cache_dtype, KvDtype::F16);
            Ok(())
        });
    }

    /// `numerics`: unset (`fast` on the CPU, nothing on CUDA) by default, `fast` or `exact` from
    /// the file, the environment or the flag; an unknown value and `fast` set on CUDA are errors
    /// naming the setting.
    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure signature
    fn numerics_setting() {
        figment::Jail::expect_with(|jail| {
            let cli = Cli::parse_from(["worker", "--config", "w.toml"]);
            jail.create_file("w.toml", "model = 'a.gguf'\n")?;
            let s = WorkerSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.numerics, None);
            assert_eq!(s.cpu_numerics(), CpuNumerics::Fast);
            assert_eq!(s.effective().numerics, Some(CpuNumerics::Fast));
            let unset_on_cuda = WorkerSettings {
                device: DeviceKind::Cuda,
                ..s.clone()
            };
            assert!(unset_on_cuda.validate().is_ok());
            assert_eq!(unset_on_cuda.effective().numerics, None);
            jail.create_file("w.toml", "model = 'a.gguf'\nnumerics = 'exact'\n")?;
            let s = WorkerSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.cpu_numerics(), CpuNumerics::Exact);
            jail.create_file("w.toml", "model = 'a.gguf'\nnumerics = 'fast'\n")?;
            let s = WorkerSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.numerics, Some(CpuNumerics::Fast));
            assert!(s.validate().is_ok());
            jail.set_env("WORKER_NUMERICS", "exact");
            let s = WorkerSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.numerics, Some(CpuNumerics::Exact));
            let flagged = Cli::parse_from(["worker", "--config", "w.toml", "--numerics", "fast"]);
            let s = WorkerSettings::load(&flagged).map_err(|e| e.to_string())?;
            assert_eq!(s.numerics, Some(CpuNumerics::Fast));
            let cuda = WorkerSettings {
                device: DeviceKind::Cuda,
                ..s.clone()
            };
            let err = cuda.validate().unwrap_err().to_string();
            assert!(err.starts_with("numerics = fast is a CPU mode"), "{err}");
            assert!(s.check_numerics_on("cpu").is_ok());
            assert!(s.check_numerics_on("cuda").is_err());
            jail.set_env("WORKER_NUMERICS", "quick");
            let err = WorkerSettings::load(&cli).unwrap_err().to_string();
            assert!(
                err.contains("quick") && err.to_lowercase().contains("numerics"),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn tls_and_health_settings_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let ca = tls_certs::test_ca::TestCa::new("ca");
        let (_, files) = ca.write(dir.path(), "worker", &["127.0.0.1"]);
        let ok = WorkerSettings {
            model: Some("m.gguf".into()),
            ..Default::default()
        };
        assert!(ok.validate().is_ok() && ok.tls_cert().unwrap().is_none());
        let tls = WorkerSettings {
            tls_cert: files.cert.to_str().unwrap().into(),
            tls_key: files.key.to_str().unwrap().into(),
            health_listen: "127.0.0.1:8".into(),
            ..ok.clone()
        };
        assert!(tls.validate().is_ok() && tls.tls_cert().unwrap().is_some());
        assert_eq!(tls.health_listen().unwrap().port(), 8);
        let err = WorkerSettings {
            tls_cert: String::new(),
            ..tls.clone()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("`tls_key` is set but `tls_cert` is not"),
            "{err}"
        );
        let err = WorkerSettings {
            tls_cert: "/nonexistent/w.crt".into(),
            ..tls.clone()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("cannot read TLS certificate file /nonexistent/w.crt"),
            "{err}"
        );
        let err = WorkerSettings {
            health_listen: "x".into(),
            ..tls
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert_eq!(err, "health_listen \"x\" is not an IP:PORT address");
    }
}
