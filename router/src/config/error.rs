//! Why the router's settings cannot be used ([`SettingsError`]).

use crate::auth::KeyFileError;
use crate::model_context::ChatTemplateFileError;
use crate::tenants::file::TenantFileError;

/// Why the settings cannot be used. Every message names the setting (or its file); a message that
/// holds a cause's text has no separate source, so it is printed once.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// Neither `workers` nor `discovery_dns` is set.
    #[error(
        "no workers given: set `workers` (--workers HOST:PORT[,HOST:PORT...], ROUTER_WORKERS) or \
         `discovery_dns` (--discovery-dns NAME:PORT)"
    )]
    NoWorkers,
    /// A worker address or the discovery target that is not `HOST:PORT`.
    #[error("{setting} {value:?} is not HOST:PORT")]
    NotHostPort {
        /// `workers entry` or `discovery_dns`.
        setting: &'static str,
        /// The value as given.
        value: String,
    },
    /// A listen address that is not `IP:PORT`.
    #[error("{setting} {value:?} is not an IP:PORT address")]
    NotListenAddress {
        /// The setting.
        setting: &'static str,
        /// The value as given (trimmed).
        value: String,
    },
    /// `health_interval_ms` below 10.
    #[error("health_interval_ms {0} is below 10")]
    HealthIntervalTooShort(u64),
    /// `stall_timeout_ms` below `health_interval_ms`.
    #[error(
        "stall_timeout_ms ({stall_timeout_ms}) must be at least health_interval_ms \
         ({health_interval_ms}): a worker's progress is only seen that often"
    )]
    StallTimeoutTooShort {
        /// The `stall_timeout_ms` setting.
        stall_timeout_ms: u64,
        /// The `health_interval_ms` setting.
        health_interval_ms: u64,
    },
    /// An `allowed_origins` entry is not an origin.
    #[error(transparent)]
    AllowedOrigins(crate::openai::cors::NotAnOrigin),
    /// `kv_prefill_weight` is negative or not a number.
    #[error("kv_prefill_weight must be a number >= 0 (got {0})")]
    KvPrefillWeight(f64),
    /// `kv_decode_weight` is negative or not a number.
    #[error("kv_decode_weight must be a number >= 0 (got {0})")]
    KvDecodeWeight(f64),
    /// `replicas` is 0.
    #[error("replicas must be at least 1 (the router replicas sharing the tenant limits)")]
    NoReplicas,
    /// `limits.max_new_tokens` or `limits.default_max_new_tokens` is 0.
    #[error("limits.max_new_tokens and limits.default_max_new_tokens must be at least 1")]
    NoNewTokens,
    /// The `chat_template` file cannot be read or compiled.
    #[error("{0}")]
    ChatTemplate(ChatTemplateFileError),
    /// The `api_keys_file` cannot be read.
    #[error("{0}")]
    ApiKeys(KeyFileError),
    /// The `tenants_file` cannot be read or is invalid (the message names the tenant and field).
    #[error("tenants_file: {0}")]
    Tenants(TenantFileError),
    /// A TLS setting or file that cannot be used (half a pair, an unreadable or invalid file, an
    /// invalid server name).
    #[error("{0}")]
    Tls(tls_certs::TlsError),
    /// `worker_tls_server_name` without `worker_tls_ca`.
    #[error("`worker_tls_server_name` is set but `worker_tls_ca` is not")]
    ServerNameWithoutCa,
}
