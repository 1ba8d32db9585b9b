//! Standard gRPC plumbing both servers add: reflection over the service's own protocol, in both
//! versions clients speak (`grpc.reflection.v1`, and `grpc.reflection.v1alpha` for the Python
//! `grpcio-reflection` client and older grpcurl), and `grpc.health.v1`, so `grpcurl` and similar
//! tools work without .proto files; and [`peer_went_away`], which tells an ordinary close of a
//! stream (the peer exited) from a failure; [`serve_health`] serves health alone on a plain port.

use std::error::Error as _;
use std::io::ErrorKind;

use tonic::{Code, Status};
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

/// Serves only `grpc.health.v1` (`health`, a clone of the one on the main port, so both report the
/// same statuses) in plain text at `addr`, until the process exits: what Kubernetes' gRPC probes,
/// which cannot speak TLS, ask when the main port is TLS (`health_listen`). Returns the bound
/// address.
///
/// Errors: the address cannot be bound (the message names it).
pub async fn serve_health<H: tonic_health::pb::health_server::Health>(
    addr: std::net::SocketAddr,
    health: tonic_health::pb::health_server::HealthServer<H>,
) -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (health_listen): {e}"))?;
    let bound = listener.local_addr()?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tokio::spawn(async move {
        if let Err(e) = tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(incoming)
            .await
        {
            tracing::error!(error = %e, "the health port stopped");
        }
    });
    Ok(bound)
}

/// Whether `status`, the error of a stream's inbound side, only says the peer went away: the call
/// was cancelled, or the connection under it broke (an I/O error of kind broken pipe, connection
/// reset or aborted, or unexpected end of file anywhere in its source chain, including inside an
/// HTTP/2 error, e.g. hyper's "error reading a body from connection: stream closed because of a
/// broken pipe" when a router exits), or the peer reset the stream with CANCEL or NO_ERROR.
/// Such a close is logged at INFO, not as a failure.
pub fn peer_went_away(status: &Status) -> bool {
    if status.code() == Code::Cancelled {
        return true;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = status.source();
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if connection_closed(io) {
                return true;
            }
        }
        // h2's error does not expose its I/O cause as a source; ask it directly. A peer's
        // reset with CANCEL or NO_ERROR is a close too.
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            if h2.get_io().is_some_and(connection_closed)
                || matches!(h2.reason(), Some(h2::Reason::CANCEL | h2::Reason::NO_ERROR))
            {
                return true;
            }
        }
        source = error.source();
    }
    false
}

/// Whether `io` says the connection under a stream closed.
fn connection_closed(io: &std::io::Error) -> bool {
    matches!(
        io.kind(),
        ErrorKind::BrokenPipe
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::UnexpectedEof
    )
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

    /// An error with `inner` as its source (as hyper wraps the I/O error under a status).
    #[derive(Debug)]
    struct Wrapper(std::io::Error);

    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("error reading a body from connection")
        }
    }

    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn status_over(kind: ErrorKind) -> Status {
        let io = std::io::Error::new(kind, "stream closed");
        Status::from_error(Box::new(Wrapper(io)))
    }

    #[test]
    fn a_broken_pipe_or_reset_under_a_status_is_the_peer_going_away() {
        for kind in [ErrorKind::BrokenPipe, ErrorKind::ConnectionReset] {
            let status = status_over(kind);
            assert_eq!(status.code(), Code::Unknown);
            assert!(peer_went_away(&status), "{kind:?}");
        }
        assert!(peer_went_away(&Status::cancelled("client went away")));
        let h2_cancel = h2::Error::from(h2::Reason::CANCEL);
        assert!(peer_went_away(&Status::from_error(Box::new(h2_cancel))));
    }

    #[test]
    fn other_failures_are_not() {
        assert!(!peer_went_away(&status_over(ErrorKind::InvalidData)));
        assert!(!peer_went_away(&Status::internal("bad frame")));
        assert!(!peer_went_away(&Status::invalid_argument("not UTF-8")));
        let protocol = h2::Error::from(h2::Reason::PROTOCOL_ERROR);
        assert!(!peer_went_away(&Status::from_error(Box::new(protocol))));
    }
}
