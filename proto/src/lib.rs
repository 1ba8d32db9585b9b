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

/// The accepted ranges of the sampling parameters (see the `sampling-limits` crate): the router
/// checks requests against them, and the worker checks again because it does not trust its callers.
pub use sampling_limits;

/// Encoded `FileDescriptorSet` of both protocols (for gRPC reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));

pub use inference::v1 as public;
pub use inference::worker::v1 as worker;
