//! Standard gRPC plumbing both servers add: reflection (`grpc.reflection.v1`) over the service's
//! own protocol and `grpc.health.v1`, so `grpcurl` and similar tools work without .proto files.

use tonic_reflection::server::v1::{ServerReflection, ServerReflectionServer};

/// Name of the standard health service (for reflection and probes).
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

/// Name of the reflection service itself.
pub const REFLECTION_SERVICE: &str = "grpc.reflection.v1.ServerReflection";

/// The reflection service advertising `services` (fully qualified names, e.g.
/// `inference.v1.TextGeneration`) plus health and reflection themselves; descriptors of both
/// protocols and of `grpc.health.v1` are available.
///
/// Panics only if a compiled-in descriptor set is corrupt.
pub fn reflection_service(services: &[&str]) -> ServerReflectionServer<impl ServerReflection> {
    let mut builder = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(inference_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .with_service_name(HEALTH_SERVICE)
        .with_service_name(REFLECTION_SERVICE);
    for service in services {
        builder = builder.with_service_name(*service);
    }
    builder
        .build_v1()
        .expect("compiled-in descriptor sets are valid")
}
