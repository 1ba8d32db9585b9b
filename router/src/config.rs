//! Router settings: defaults < TOML file < environment (`ROUTER_*`) < command-line flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use figment::providers::Env;
use serde::{Deserialize, Deserializer, Serialize};

use crate::admission::AdmissionLimits;
use crate::affinity::AffinityPolicy;
use crate::auth::ApiKeys;
use crate::model_choice::ModelNaming;
use crate::model_context::ChatTemplateFile;
use crate::pool::PoolSettings;
use crate::tenants::Callers;
use crate::validation::RequestLimits;
use routing::kv_aware::KvAwarePolicy;
use routing::Routing;

mod error;
pub use error::SettingsError;

/// Command-line flags. Every flag is optional here so that the file and environment can supply it.
#[derive(Debug, Parser, Serialize)]
#[command(
    name = "router",
    version = build_info::VERSION,
    about = "Serves the public TextGeneration gRPC API over a set of workers"
)]
pub struct Cli {
    /// TOML settings file (also `ROUTER_CONFIG`).
    #[arg(long, env = "ROUTER_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Worker addresses, comma separated: HOST:PORT[,HOST:PORT...].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<String>,
    /// Address to serve the public gRPC API on, e.g. 127.0.0.1:50051.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Discover workers by DNS: NAME:PORT re-resolved periodically (e.g. a Kubernetes headless
    /// service).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery_dns: Option<String>,
    /// The router replicas' own DNS name: NAME:PORT (e.g. a headless service); each replica
    /// enforces 1/N of every tenant limit, N = the addresses it resolves to.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_discovery_dns: Option<String>,
    /// The router replicas sharing the tenant limits, when not discovered by DNS (default 1).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// Address of the Prometheus endpoint (`GET /metrics`), e.g. 127.0.0.1:9090; empty = off.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
    /// Address of the OpenAI-compatible HTTP API (`/v1/chat/completions`, `/v1/completions`,
    /// `/v1/models`, `/health`), e.g. 127.0.0.1:8000; empty = off.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_listen: Option<String>,
    /// Origins browser clients may call the HTTP API from (CORS), comma separated: each
    /// scheme://host[:port], or * for any; empty = CORS off.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_origins: Option<String>,
    /// The default model's public name (listed, reported, accepted in `model`); empty = its id.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_model_name: Option<String>,
    /// The id of the model requests without `model` get; empty = the only model served.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_model: Option<String>,
    /// Other model names the HTTP API accepts, comma separated.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_aliases: Option<String>,
    /// OTLP gRPC endpoint that receives the router's spans, e.g. http://127.0.0.1:4317; empty = off.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// A worker with work that shows no progress for this many ms leaves rotation (its requests
    /// fail over) until it moves again.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stall_timeout_ms: Option<u64>,
    /// A worker whose stream falls silent (no step, no heartbeat) for this many ms leaves rotation
    /// and its requests fail over; 0 = off.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat_timeout_ms: Option<u64>,
    /// A new request that finds no worker of its model ready, while one lost its stream within
    /// this many ms, waits for it to reconnect (at most this long after the loss) instead of being
    /// refused at once; 0 = refuse at once.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reconnect_grace_ms: Option<u64>,
    /// A response stream whose client reads nothing for this many ms while its buffer is full is
    /// cancelled.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow_client_timeout_ms: Option<u64>,
    /// Which policy picks each request's worker: affinity, round_robin or kv_aware.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routing: Option<String>,
    /// A Jinja chat template file that replaces the model's own (and the built-in one).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// An API key requests must carry (`authorization: Bearer KEY`), as vLLM's `--api-key`;
    /// repeat it or separate keys with commas. Like every flag it wins over the `api_keys` of the
    /// file and of `ROUTER_API_KEYS`; the keys of `api_keys_file` count too. A key on the command line is visible to every local user in the
    /// process list: prefer the file or the environment on shared machines.
    #[arg(long = "api-key", value_delimiter = ',')]
    #[serde(rename = "api_keys", skip_serializing_if = "Vec::is_empty")]
    pub api_key: Vec<String>,
    /// A file of API keys (one per line; blank lines and `#` comments ignored), re-read on change;
    /// requests then need `authorization: Bearer KEY` on both fronts. Keys can also be given as
    /// `ROUTER_API_KEYS="k1,k2"`.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_keys_file: Option<String>,
    /// A TOML file of tenants (`[[tenant]]` tables: name, keys, weight, priority, max_priority and
    /// optional limits), re-read on change; see the README.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenants_file: Option<String>,
    /// TLS certificate chain (PEM, leaf first) of the public ports (gRPC `listen` and
    /// `http_listen`); needs `--tls-key`. Re-read on change.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<String>,
    /// TLS private key (PEM) of `--tls-cert`.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<String>,
    /// CA certificates (PEM) the workers' TLS certificates must chain to; set = dial workers over
    /// TLS.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_tls_ca: Option<String>,
    /// The name the workers' certificates must carry; empty = the host of each worker address.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_tls_server_name: Option<String>,
    /// Address (`IP:PORT`) of a plain-text port serving only `grpc.health.v1` (for probes that
    /// cannot speak TLS); empty = off.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_listen: Option<String>,
    /// Load and validate the settings, print the effective settings (JSON) and exit: 0 when they
    /// are valid, 2 with the error otherwise. Starts nothing.
    #[arg(long)]
    #[serde(skip)]
    pub check_config: bool,
}

/// The `limits` settings table is validation's own [`RequestLimits`] (every key of it is a field
/// there, with its default), handed as it is to the fronts.
pub type Limits = RequestLimits;

/// The router's effective settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouterSettings {
    /// Public gRPC listen address.
    pub listen: SocketAddr,
    /// Worker addresses (`HOST:PORT`). A comma-separated string is accepted too.
    #[serde(deserialize_with = "string_or_list")]
    pub workers: Vec<String>,
    /// First reconnect delay after a worker connection fails, in ms (doubles up to the max).
    pub reconnect_initial_ms: u64,
    /// Longest reconnect delay, in ms.
    pub reconnect_max_ms: u64,
    /// DNS name and port (`NAME:PORT`) whose addresses are workers, re-resolved every
    /// `discovery_interval_ms`; empty = off. Works beside `workers`.
    pub discovery_dns: String,
    /// Period of the DNS re-resolution, in ms (workers and router replicas).
    pub discovery_interval_ms: u64,
    /// DNS name and port (`NAME:PORT`) of the router replicas themselves (a Kubernetes headless
    /// service over the router pods), re-resolved every `discovery_interval_ms`: each replica
    /// enforces `1/N` of every tenant limit (`max_concurrent` rounded up), N = the addresses it
    /// resolves to (a failed lookup keeps the last N). Empty = off: each replica enforces the
    /// whole limits.
    pub replica_discovery_dns: String,
    /// The router replicas sharing the tenant limits when `replica_discovery_dns` is off (a fixed
    /// deployment): each enforces `1/replicas` of every limit. Default 1 (at least 1). With
    /// `replica_discovery_dns`, the count starts here and follows DNS.
    pub replicas: u32,
    /// Period of each worker's `Health` probe, in ms (also its timeout); a worker whose answer says
    /// not ready takes no new requests. A probe without an answer changes nothing: a busy worker is
    /// not a down one.
    pub health_interval_ms: u64,
    /// A worker that has work (this router's requests in flight, or its health answer says
    /// `has_work`) and shows no progress for this many ms (no step message, no health answer with a
    /// recent step) leaves rotation: its requests fail over to another worker and it rejoins once
    /// it moves again.
    pub stall_timeout_ms: u64,
    /// A worker that sends heartbeats on its stream (every 500 ms, from a timer outside its engine
    /// loop) and whose stream then carries nothing for this many ms is taken for frozen or gone
    /// (a stopped process, a cut network): the stream is dropped, the worker leaves rotation at
    /// once and its requests fail over; it rejoins when it reconnects. 0 = off (only the HTTP/2
    /// keep-alive, 10 s + 5 s, notices). A long engine step never delays a heartbeat.
    pub heartbeat_timeout_ms: u64,
    /// A worker that was ready and lost its stream (it ended, broke, fell silent, or the worker
    /// closed it, e.g. past its `router_backlog_kib`) is usually back within a reconnect: the
    /// backoff's first delay plus a connect, `Info` and `Health`, about 100-200 ms on a LAN. For
    /// this many ms after such a loss, a new request that finds no worker of its model ready
    /// waits in the queue for one (as a request whose worker was lost does) instead of being
    /// refused at once with `UNAVAILABLE`; when none is back by then it fails with `UNAVAILABLE`
    /// naming the wait. A model none of whose workers was lost this recently is refused at once.
    /// 0 = always refuse at once.
    pub reconnect_grace_ms: u64,
    /// A response stream holds at most 64 messages for its client (beside its HTTP/2 window); when
    /// they stay unread for this many ms the request is cancelled on its worker and the stream
    /// ends with `RESOURCE_EXHAUSTED` (HTTP: `client_too_slow`) naming this setting. Until then the
    /// worker holds the request (out of its batch, generating nothing; `HoldRequest`), so a stuck
    /// client never slows other requests down. 0 = never cancel.
    pub slow_client_timeout_ms: u64,
    /// Which policy picks each request's worker: `kv_aware` (the default: lowest
    /// `kv_prefill_weight x tokens to prefill + load in tokens + kv_decode_weight x min(max_new_tokens,
    /// 128) x sequences` from the workers' reported KV caches and loads; its load bound uses
    /// `affinity_load_factor`), `affinity` (prefix affinity on the
    /// first `affinity_prefix_tokens` tokens with a load bound) or `round_robin` (each request to
    /// the next worker with room). See the `routing` crate.
    pub routing: Routing,
    /// Leading prompt tokens that define a request's prefix-affinity key (0 = no affinity; 64 = the
    /// first four 16-token KV blocks).
    pub affinity_prefix_tokens: u32,
    /// A request goes to its prefix's preferred worker while that worker's load is at most
    /// `(1 + affinity_load_factor) * average load + 1`; otherwise to the least loaded worker.
    pub affinity_load_factor: f64,
    /// `kv_aware`'s weight of the tokens a worker would prefill against its load in tokens: a
    /// worker holding the prompt's prefix keeps the request until its work ahead exceeds another
    /// worker's by this many times the tokens the hit saves (within the load bound). 1 = the
    /// request's own time to first token only; the default 4 also counts what a miss's
    /// recomputation costs the requests behind it (see `routing::kv_aware`). At least 0.
    pub kv_prefill_weight: f64,
    /// `kv_aware`'s weight of the tokens a request's decode steps compute for the sequences
    /// running beside it: `kv_decode_weight x min(max_new_tokens, 128) x the worker's running and
    /// waiting sequences` is added to each worker's cost, so that a worker crowded with short
    /// decodes does not collect long requests (their every token would wait for the whole batch).
    /// 1 (the default) counts those tokens as the load counts its own; 0 = the cost without it.
    /// At least 0.
    pub kv_decode_weight: f64,
    /// Most requests this router has in flight on one worker; more wait in the router's queue.
    pub max_inflight_per_worker: u32,
    /// Most requests waiting in the router's queue (accepted, not yet sent to a worker); beyond it
    /// new requests get `RESOURCE_EXHAUSTED`.
    pub max_waiting_requests: u32,
    /// Most tokens (prompt plus already generated) over the waiting requests; beyond it new requests
    /// get `RESOURCE_EXHAUSTED`.
    pub max_waiting_tokens: u64,
    /// How long a request whose worker was lost (or a queued request) waits for a ready worker when
    /// none is left before it fails with `UNAVAILABLE`, in ms.
    pub failover_timeout_ms: u64,
    /// Most times one request may move to another worker.
    pub max_failovers: u32,
    /// On SIGTERM, how long running requests may take to finish before the router exits, in ms.
    pub drain_timeout_ms: u64,
    /// Request validation limits.
    pub limits: Limits,
    /// Log filter in `tracing_subscriber::EnvFilter` syntax (also `RUST_LOG`).
    pub log: String,
    /// Address (`IP:PORT`) of the Prometheus text endpoint (`GET /metrics`); empty = off.
    pub metrics_listen: String,
    /// OTLP gRPC endpoint (e.g. `http://otel-collector:4317`) that receives the router's spans;
    /// empty = no trace export.
    pub otlp_endpoint: String,
    /// Address (`IP:PORT`) of the OpenAI-compatible HTTP API ([`crate::openai`]); empty = off.
    pub http_listen: String,
    /// Origins whose browser pages may call the HTTP API (CORS, [`crate::openai::cors`]): each
    /// `scheme://host[:port]`, or `*` for any; a comma-separated string is accepted too. Empty =
    /// CORS off (browsers refuse cross-origin calls).
    #[serde(deserialize_with = "string_or_list")]
    pub allowed_origins: Vec<String>,
    /// The default model's public name: what responses and `/v1/models` report for it, accepted
    /// in `model` on both APIs; empty = its id (the workers' `served_model_name`).
    pub served_model_name: String,
    /// The id of the model a request without `model` gets; empty = the only model served (with
    /// several, such a request is refused). See [`crate::model_choice`].
    pub default_model: String,
    /// Other names of the default model, accepted in `model` (listed by `/v1/models` too). A
    /// comma-separated string is accepted too.
    #[serde(deserialize_with = "string_or_list")]
    pub model_aliases: Vec<String>,
    /// A Jinja chat template file used instead of the model's own template (GGUF
    /// `tokenizer.chat_template` or `tokenizer_config.json`) and the built-in one; empty = none.
    pub chat_template: String,
    /// API keys accepted on both fronts (`authorization: Bearer KEY`), e.g. from
    /// `ROUTER_API_KEYS="k1,k2"`; shown as `"<redacted>"` by `--check-config`. Empty (and no
    /// `api_keys_file`) = no keys needed. See [`crate::auth`].
    #[serde(deserialize_with = "key_list", serialize_with = "redacted_list")]
    pub api_keys: Vec<String>,
    /// A file of API keys, one per line (blank lines and `#` comments ignored), re-read about
    /// every second; empty = none. Used together with `api_keys`.
    pub api_keys_file: String,
    /// A TOML file of tenants, one `[[tenant]]` table each (`name`, `keys`, `weight`, `priority`,
    /// `max_priority`, optional `max_concurrent`, `max_queued`, `requests_per_second`,
    /// `tokens_per_minute`), re-read about every second ([`crate::tenants`]); empty = none (all
    /// traffic is the tenant `default`).
    pub tenants_file: String,
    /// TLS certificate chain file (PEM, leaf first) of the public ports (`listen` and
    /// `http_listen`); with `tls_key`, both ports speak only TLS. Both files are re-read about
    /// every second: new connections get a changed pair; a broken one keeps the last good pair.
    /// Empty (with `tls_key`) = plain text.
    pub tls_cert: String,
    /// TLS private key file (PEM: PKCS#8, PKCS#1 or SEC1) of `tls_cert`.
    pub tls_key: String,
    /// CA certificate file (PEM) the workers' certificates must chain to; set = the router dials
    /// workers over TLS (and refuses a worker whose certificate does not verify). Empty = plain.
    pub worker_tls_ca: String,
    /// The name (DNS name or IP) the workers' certificates must carry; empty = the host of each
    /// worker address.
    pub worker_tls_server_name: String,
    /// Address (`IP:PORT`) of a plain-text port that serves only `grpc.health.v1` (the same
    /// statuses as on `listen`), for probes that cannot speak TLS; empty = off.
    pub health_listen: String,
}

impl Default for RouterSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:50051".parse().expect("valid default address"),
            workers: Vec::new(),
            reconnect_initial_ms: 100,
            reconnect_max_ms: 5_000,
            discovery_dns: String::new(),
            discovery_interval_ms: 5_000,
            replica_discovery_dns: String::new(),
            replicas: 1,
            health_interval_ms: 2_000,
            stall_timeout_ms: 60_000,
            heartbeat_timeout_ms: 2_000,
            reconnect_grace_ms: 2_000,
            slow_client_timeout_ms: 30_000,
            routing: Routing::KvAware,
            affinity_prefix_tokens: 64,
            affinity_load_factor: 0.5,
            kv_prefill_weight: routing::kv_aware::DEFAULT_PREFILL_WEIGHT,
            kv_decode_weight: routing::kv_aware::DEFAULT_DECODE_WEIGHT,
            max_inflight_per_worker: 64,
            max_waiting_requests: 256,
            max_waiting_tokens: 262_144,
            failover_timeout_ms: 10_000,
            max_failovers: 3,
            drain_timeout_ms: 30_000,
            limits: Limits::default(),
            log: "info".into(),
            metrics_listen: String::new(),
            otlp_endpoint: String::new(),
            http_listen: String::new(),
            allowed_origins: Vec::new(),
            served_model_name: String::new(),
            default_model: String::new(),
            model_aliases: Vec::new(),
            chat_template: String::new(),
            api_keys: Vec::new(),
            api_keys_file: String::new(),
            tenants_file: String::new(),
            tls_cert: String::new(),
            tls_key: String::new(),
            worker_tls_ca: String::new(),
            worker_tls_server_name: String::new(),
            health_listen: String::new(),
        }
    }
}

impl RouterSettings {
    /// Merges defaults, the TOML file named by `cli.config`, `ROUTER_*` variables (nested keys with
    /// `__`, e.g. `ROUTER_LIMITS__MAX_NEW_TOKENS`) and `cli`.
    ///
    /// Errors: an unreadable or invalid file, a key in the file that is not a setting (nested ones
    /// too, e.g. `limits.max_new_tokenz`), or a value of the wrong type.
    pub fn load(cli: &Cli) -> Result<Self, Box<figment::Error>> {
        settings_file::load(
            &Self::default(),
            cli.config.as_deref(),
            Env::prefixed("ROUTER_").split("__"),
            cli,
        )
    }

    /// The reconnect backoff bounds.
    pub fn backoff(&self) -> (Duration, Duration) {
        (
            Duration::from_millis(self.reconnect_initial_ms.max(1)),
            Duration::from_millis(self.reconnect_max_ms.max(self.reconnect_initial_ms.max(1))),
        )
    }

    /// The worker pool's settings (without the chat template file and the worker TLS, which read
    /// files: see [`Self::chat_template_file`] and [`Self::worker_tls`]).
    pub fn pool_settings(&self) -> PoolSettings {
        PoolSettings {
            backoff: self.backoff(),
            health_interval: Duration::from_millis(self.health_interval_ms.max(10)),
            stall_timeout: Duration::from_millis(self.stall_timeout_ms.max(1)),
            heartbeat_timeout: (self.heartbeat_timeout_ms > 0)
                .then(|| Duration::from_millis(self.heartbeat_timeout_ms)),
            // 0: never cancel (as `heartbeat_timeout_ms = 0` turns its check off).
            slow_client_timeout: match self.slow_client_timeout_ms {
                0 => Duration::MAX,
                ms => Duration::from_millis(ms),
            },
            max_inflight_per_worker: self.max_inflight_per_worker.max(1) as usize,
            admission: AdmissionLimits {
                max_waiting_requests: self.max_waiting_requests as usize,
                max_waiting_tokens: self.max_waiting_tokens,
            },
            routing: self.routing,
            affinity: AffinityPolicy {
                prefix_tokens: self.affinity_prefix_tokens as usize,
                load_factor: self.affinity_load_factor.max(0.0),
            },
            kv_aware: KvAwarePolicy {
                load_factor: self.affinity_load_factor.max(0.0),
                prefill_weight: self.kv_prefill_weight,
                decode_weight: self.kv_decode_weight,
            },
            failover_timeout: Duration::from_millis(self.failover_timeout_ms),
            reconnect_grace: Duration::from_millis(self.reconnect_grace_ms),
            max_failovers: self.max_failovers,
            chat_template: None,
            worker_tls: None,
            naming: self.model_naming(),
        }
    }

    /// The `chat_template` setting's file, read and compiled; `None` when the setting is empty.
    ///
    /// Errors: [`SettingsError::ChatTemplate`], naming the file and the problem.
    pub fn chat_template_file(&self) -> Result<Option<ChatTemplateFile>, SettingsError> {
        let path = self.chat_template.trim();
        if path.is_empty() {
            return Ok(None);
        }
        ChatTemplateFile::read(path)
            .map(Some)
            .map_err(SettingsError::ChatTemplate)
    }

    /// The router replicas' DNS target and its period, when `replica_discovery_dns` is set.
    pub fn replica_discovery(&self) -> Option<(String, Duration)> {
        let target = self.replica_discovery_dns.trim();
        (!target.is_empty()).then(|| {
            (
                target.to_string(),
                Duration::from_millis(self.discovery_interval_ms.max(100)),
            )
        })
    }

    /// The DNS discovery target and period, when discovery is on.
    pub fn discovery(&self) -> Option<(String, Duration)> {
        let target = self.discovery_dns.trim();
        (!target.is_empty()).then(|| {
            (
                target.to_string(),
                Duration::from_millis(self.discovery_interval_ms.max(100)),
            )
        })
    }

    /// The OpenAI HTTP API's address, when it is on.
    pub fn http_listen(&self) -> Option<SocketAddr> {
        let value = self.http_listen.trim();
        (!value.is_empty()).then(|| value.parse().expect("checked by validate"))
    }

    /// The HTTP API's CORS layer ([`crate::openai::cors::layer`]); `None` = off.
    ///
    /// Errors: [`SettingsError::AllowedOrigins`] for an entry that is not an origin.
    pub fn cors(&self) -> Result<Option<tower_http::cors::CorsLayer>, SettingsError> {
        crate::openai::cors::layer(&self.allowed_origins).map_err(SettingsError::AllowedOrigins)
    }

    /// The default model and its names ([`crate::model_choice`]), on both APIs.
    pub fn model_naming(&self) -> ModelNaming {
        ModelNaming {
            default_model: self.default_model.trim().to_string(),
            served_model_name: self.served_model_name.trim().to_string(),
            aliases: self.model_aliases.clone(),
        }
    }

    /// The API keys of `api_keys` and `api_keys_file` (not enforced when both are empty).
    ///
    /// Errors: [`SettingsError::ApiKeys`] when the key file cannot be read (the message names it).
    pub fn api_keys(&self) -> Result<Arc<ApiKeys>, SettingsError> {
        let file = self.api_keys_file.trim();
        let file = (!file.is_empty()).then(|| std::path::Path::new(file));
        ApiKeys::load(&self.api_keys, file).map_err(SettingsError::ApiKeys)
    }

    /// Who may call and as which tenant: the API keys and the `tenants_file`, read now.
    ///
    /// Errors: [`SettingsError::ApiKeys`] / [`SettingsError::Tenants`] when a file cannot be read
    /// or is invalid (the message names it, and the tenant and field at fault).
    pub fn callers(&self) -> Result<Arc<Callers>, SettingsError> {
        let file = self.tenants_file.trim();
        let file = (!file.is_empty()).then(|| std::path::Path::new(file));
        Callers::load(self.api_keys()?, file).map_err(SettingsError::Tenants)
    }

    /// The public ports' certificate files, when TLS is on.
    ///
    /// Errors: [`SettingsError::Tls`] when only one of `tls_cert` and `tls_key` is set.
    pub fn tls_cert_files(&self) -> Result<Option<tls_certs::CertFiles>, SettingsError> {
        tls_certs::CertFiles::from_settings(
            ("tls_cert", &self.tls_cert),
            ("tls_key", &self.tls_key),
        )
        .map_err(SettingsError::Tls)
    }

    /// The public ports' certificate, read now (re-read by its `watch`), when TLS is on.
    ///
    /// Errors: [`SettingsError::Tls`] for half a pair, or a file that cannot be read or is invalid
    /// (the message names it).
    pub fn tls_cert(&self) -> Result<Option<Arc<tls_certs::ReloadingCert>>, SettingsError> {
        self.tls_cert_files()?
            .map(|files| tls_certs::ReloadingCert::load(files).map_err(SettingsError::Tls))
            .transpose()
    }

    /// How the router dials workers: over TLS trusting `worker_tls_ca`, or plain (`None`).
    ///
    /// Errors: [`SettingsError::ServerNameWithoutCa`]; [`SettingsError::Tls`] for an unreadable
    /// or invalid CA file (named) or an invalid server name.
    pub fn worker_tls(&self) -> Result<Option<tls_certs::ClientTls>, SettingsError> {
        if self.worker_tls_ca.trim().is_empty() && !self.worker_tls_server_name.trim().is_empty() {
            return Err(SettingsError::ServerNameWithoutCa);
        }
        tls_certs::ClientTls::load(&self.worker_tls_ca, &self.worker_tls_server_name)
            .map_err(SettingsError::Tls)
    }

    /// The plain health port's address, when it is on.
    pub fn health_listen(&self) -> Option<SocketAddr> {
        let value = self.health_listen.trim();
        (!value.is_empty()).then(|| value.parse().expect("checked by validate"))
    }

    /// How long a drain may take.
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }

    /// Checks what the file and environment cannot type-check: a worker source is given, addresses
    /// are `HOST:PORT`, `metrics_listen`, `http_listen` and `health_listen` are empty or `IP:PORT`,
    /// the TLS files are complete pairs that can be read and used.
    ///
    /// Errors: a [`SettingsError`] naming the setting.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.workers.is_empty() && self.discovery().is_none() {
            return Err(SettingsError::NoWorkers);
        }
        let host_port = |setting: &'static str, value: &str| match value.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
            _ => Err(SettingsError::NotHostPort {
                setting,
                value: value.to_string(),
            }),
        };
        for worker in &self.workers {
            host_port("workers entry", worker)?;
        }
        if let Some((target, _)) = self.discovery() {
            host_port("discovery_dns", &target)?;
        }
        if let Some((target, _)) = self.replica_discovery() {
            host_port("replica_discovery_dns", &target)?;
        }
        if self.replicas == 0 {
            return Err(SettingsError::NoReplicas);
        }
        if !(self.kv_prefill_weight.is_finite() && self.kv_prefill_weight >= 0.0) {
            return Err(SettingsError::KvPrefillWeight(self.kv_prefill_weight));
        }
        if !(self.kv_decode_weight.is_finite() && self.kv_decode_weight >= 0.0) {
            return Err(SettingsError::KvDecodeWeight(self.kv_decode_weight));
        }
        for (setting, value) in [
            ("metrics_listen", &self.metrics_listen),
            ("http_listen", &self.http_listen),
            ("health_listen", &self.health_listen),
        ] {
            let value = value.trim();
            if !value.is_empty() && value.parse::<SocketAddr>().is_err() {
                return Err(SettingsError::NotListenAddress {
                    setting,
                    value: value.to_string(),
                });
            }
        }
        if self.health_interval_ms < 10 {
            return Err(SettingsError::HealthIntervalTooShort(
                self.health_interval_ms,
            ));
        }
        if self.stall_timeout_ms < self.health_interval_ms {
            return Err(SettingsError::StallTimeoutTooShort {
                stall_timeout_ms: self.stall_timeout_ms,
                health_interval_ms: self.health_interval_ms,
            });
        }
        self.chat_template_file()?;
        self.cors()?;
        self.callers()?;
        self.tls_cert()?;
        self.worker_tls()?;
        let l = &self.limits;
        if l.max_new_tokens == 0 || l.default_max_new_tokens == 0 {
            return Err(SettingsError::NoNewTokens);
        }
        Ok(())
    }
}

/// Serializes a list of secrets as as many `"<redacted>"` entries.
fn redacted_list<S: serde::Serializer>(items: &[String], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(items.iter().map(|_| "<redacted>"))
}

fn string_or_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(split_list(d)?.1)
}

/// A list setting as a comma-separated string or a list: whether anything but whitespace was
/// given, and its non-blank items, trimmed.
fn split_list<'de, D: Deserializer<'de>>(d: D) -> Result<(bool, Vec<String>), D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        One(String),
        Many(Vec<String>),
    }
    let items: Vec<String> = match Either::deserialize(d)? {
        Either::One(s) => s.split(',').map(str::to_string).collect(),
        Either::Many(v) => v,
    };
    let given = items.iter().any(|s| !s.trim().is_empty()) || items.len() > 1;
    let kept = items
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    Ok((given, kept))
}

/// `api_keys`: as [`string_or_list`], but a value that names no key (only commas and blanks,
/// e.g. `ROUTER_API_KEYS=" , "`) is an error rather than "no keys", which would leave the router
/// open to anyone.
fn key_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    match split_list(d)? {
        (true, keys) if keys.is_empty() => Err(serde::de::Error::custom(
            "api_keys is set but names no key (only commas and blanks); unset it for no keys",
        )),
        (_, keys) => Ok(keys),
    }
}

#[cfg(test)]
mod tests;
