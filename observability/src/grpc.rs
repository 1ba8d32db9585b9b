//! Standard gRPC plumbing both servers add: reflection over the service's own protocol, in both
//! versions clients speak (`grpc.reflection.v1`, and `grpc.reflection.v1alpha` for the Python
//! `grpcio-reflection` client and older grpcurl), and `grpc.health.v1`, so `grpcurl` and similar
//! tools work without .proto files.

use tonic_reflection::server::{v1, v1alpha, Builder};

/// Name of the standard health service (for reflection and probes).
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

/// Name of the reflection service itself (current version).
pub const REFLECTION_SERVICE: &str = "grpc.reflection.v1.ServerReflection";

/// Name of the pre-release reflection service, still what many clients ask for.
pub const REFLECTION_SERVICE_V1ALPHA: &str = "grpc.reflection.v1alpha.ServerReflection";

/// The `grpc.reflection.v1` service advertising `services` (fully qualified names, e.g.
/// `inference.v1.TextGeneration`) plus health and both reflection versions; descriptors of both
/// of this project's protocols, of `grpc.health.v1` and of both reflection versions are available.
/// Serve it together with [`reflection_service_v1alpha`].
///
/// Panics only if a compiled-in descriptor set is corrupt.
pub fn reflection_service(
    services: &[&str],
) -> v1::ServerReflectionServer<impl v1::ServerReflection> {
    builder(services)
        .build_v1()
        .expect("compiled-in descriptor sets are valid")
}

/// The same as [`reflection_service`] in the `grpc.reflection.v1alpha` protocol (the same
/// messages under the older package name).
///
/// Panics only if a compiled-in descriptor set is corrupt.
pub fn reflection_service_v1alpha(
    services: &[&str],
) -> v1alpha::ServerReflectionServer<impl v1alpha::ServerReflection> {
    builder(services)
        .build_v1alpha()
        .expect("compiled-in descriptor sets are valid")
}

/// One reflection configuration for both versions: the same descriptors, the same service list.
fn builder(services: &[&str]) -> Builder<'static> {
    let mut builder = Builder::configure()
        // Both reflection versions' descriptors, registered here rather than by each build_*.
        .include_reflection_service(false)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(inference_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .with_service_name(HEALTH_SERVICE)
        .with_service_name(REFLECTION_SERVICE)
        .with_service_name(REFLECTION_SERVICE_V1ALPHA);
    for service in services {
        builder = builder.with_service_name(*service);
    }
    builder
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_versions_build_from_the_compiled_in_descriptors() {
        let _v1 = reflection_service(&["inference.v1.TextGeneration"]);
        let _v1alpha = reflection_service_v1alpha(&["inference.worker.v1.Worker"]);
    }
}
