//! Generated gRPC types for the service's two protocols.
//!
//! - [`inference::v1`]: the public `TextGeneration` API the router serves.
//! - [`inference::worker::v1`]: the bidirectional router<->worker protocol.
//!
//! Both are served and called through [`codec::WireCodec`], which reports a message that does not
//! decode as `INVALID_ARGUMENT` naming the field. [`status::code_name`] spells a status code as
//! the metrics label it.

pub mod codec;
pub mod status;

#[allow(clippy::all, missing_docs)]
pub mod inference {
    pub mod v1 {
        tonic::include_proto!("inference.v1");
    }
    pub mod worker {
        pub mod v1 {
            tonic::include_proto!("inference.worker.v1");
        }
    }
}

/// The accepted ranges of the sampling parameters (`GenerateRequest` and the worker protocol's
/// `SamplingParams`): the router checks requests against them, and the worker checks again because
/// it does not trust its callers. One definition, so the two can never disagree.
pub mod sampling_limits {
    /// Largest accepted `min_p` (a probability ratio).
    pub const MAX_MIN_P: f32 = 1.0;
    /// Largest accepted `repetition_penalty` (CTRL; 1 = off).
    pub const MAX_REPETITION_PENALTY: f32 = 10.0;
    /// Largest accepted magnitude of `frequency_penalty` and `presence_penalty` (OpenAI's range).
    pub const MAX_ABS_PENALTY: f32 = 2.0;
    /// Largest accepted magnitude of a `logit_bias` value (OpenAI's range).
    pub const MAX_ABS_LOGIT_BIAS: f32 = 100.0;
    /// Most `logit_bias` entries per request (OpenAI's limit).
    pub const MAX_LOGIT_BIAS_ENTRIES: usize = 300;
    /// Largest accepted `top_logprobs` (OpenAI's limit).
    pub const MAX_TOP_LOGPROBS: u32 = 20;
}

/// Encoded `FileDescriptorSet` of both protocols (for gRPC reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));

pub use inference::v1 as public;
pub use inference::worker::v1 as worker;
