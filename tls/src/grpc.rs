//! Serving a tonic server on a listener, in plain text or over TLS, behind one future type.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::net::TcpListener;
use tonic::transport::server::{Router, TcpIncoming};

use crate::server::{server_config, Alpn, TlsIncoming};
use crate::ReloadingCert;

/// The future of a running gRPC server.
pub type Serving = Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

/// Serves `router` on `listener` until `shutdown` resolves: over TLS with `cert` (ALPN `h2`;
/// plain-text clients are refused), in plain text without one. TCP_NODELAY either way.
///
/// Errors: the listener has no local address.
pub fn serve(
    router: Router,
    listener: TcpListener,
    cert: Option<Arc<ReloadingCert>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<Serving> {
    Ok(match cert {
        Some(cert) => {
            let incoming = TlsIncoming::new(listener, server_config(cert, Alpn::H2))?;
            Box::pin(router.serve_with_incoming_shutdown(incoming, shutdown))
        }
        None => Box::pin(router.serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )),
    })
}
