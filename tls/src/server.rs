//! The server side: a listener that accepts TCP connections, completes their TLS handshakes off
//! the accept loop (a slow or silent client holds up no one) and hands the finished ones to tonic
//! or axum. A client that does not speak TLS (plain-text gRPC or HTTP) fails its handshake and is
//! closed; that is logged at DEBUG.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::cert::{provider, ReloadingCert};

/// Longest TLS handshake; a client that takes longer is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the server to take them.
const BACKLOG: usize = 64;

/// The application protocol a port speaks (offered by ALPN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// HTTP/2 (`h2`): gRPC; tonic's TLS clients require it.
    H2,
    /// HTTP/1.1 (`http/1.1`): the OpenAI HTTP API.
    Http11,
}

/// The rustls server configuration serving `cert` (TLS 1.2 and 1.3, no client certificates).
pub fn server_config(cert: Arc<ReloadingCert>, alpn: Alpn) -> Arc<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default protocol versions")
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![match alpn {
        Alpn::H2 => b"h2".to_vec(),
        Alpn::Http11 => b"http/1.1".to_vec(),
    }];
    Arc::new(config)
}

/// TLS connections accepted on a listener, as a `Stream` (for tonic's `serve_with_incoming*`) and
/// as an [`axum::serve::Listener`]. The accept task ends when this is dropped.
pub struct TlsIncoming {
    connections: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
}

impl TlsIncoming {
    /// Starts accepting on `listener` with `config` (TCP_NODELAY on every connection).
    ///
    /// Errors: the listener has no local address.
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let (tx, connections) = mpsc::channel(BACKLOG);
        tokio::spawn(accept_loop(listener, TlsAcceptor::from(config), tx));
        Ok(Self {
            connections,
            local_addr,
        })
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let accepted = tokio::select! {
            () = tx.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl futures::Stream for TlsIncoming {
    type Item = std::io::Result<TlsStream<TcpStream>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.connections
            .poll_recv(cx)
            .map(|next| next.map(|(tls, _)| Ok(tls)))
    }
}

impl axum::serve::Listener for TlsIncoming {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.connections.recv().await {
            Some(connection) => connection,
            // The accept task only ends when this is dropped; never reached while it lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_ca::TestCa;
    use futures::StreamExt as _;
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, ServerName};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};

    /// A TLS client that trusts only `ca_pem`; the leaf certificate the server showed.
    async fn leaf_seen(addr: SocketAddr, ca_pem: &str) -> std::io::Result<CertificateDer<'static>> {
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let tcp = TcpStream::connect(addr).await?;
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await?;
        tls.write_all(b"ping").await?;
        let mut echo = [0u8; 4];
        tls.read_exact(&mut echo).await?;
        assert_eq!(&echo, b"ping");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        Ok(tls.get_ref().1.peer_certificates().unwrap()[0].clone())
    }

    #[tokio::test]
    async fn serves_the_current_certificate_and_drops_plain_clients() {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("ca");
        let (_, files) = ca.write(dir.path(), "server", &["localhost"]);
        let cert = ReloadingCert::load(files.clone()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut incoming =
            TlsIncoming::new(listener, server_config(cert.clone(), Alpn::H2)).unwrap();
        let addr = axum::serve::Listener::local_addr(&incoming).unwrap();
        tokio::spawn(async move {
            while let Some(Ok(mut tls)) = incoming.next().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4];
                    if tls.read_exact(&mut buf).await.is_ok() {
                        let _ = tls.write_all(&buf).await;
                        let _ = tls.flush().await;
                    }
                });
            }
        });
        // A plain-text client gets its connection closed, not an answer.
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let _ = plain.read_to_end(&mut buf).await;
        assert!(!buf.windows(4).any(|w| w == b"PRI "), "{buf:?}");

        assert_eq!(leaf_seen(addr, &ca.pem).await.unwrap(), cert.chain()[0]);
        // Rotation to another CA: new connections see the new certificate; the old CA no longer
        // verifies it.
        let ca2 = TestCa::new("ca2");
        ca2.write_server(&files, &["localhost"]);
        assert!(cert.reload().unwrap());
        assert_eq!(leaf_seen(addr, &ca2.pem).await.unwrap(), cert.chain()[0]);
        let err = leaf_seen(addr, &ca.pem).await.unwrap_err().to_string();
        assert!(
            err.contains("UnknownIssuer") || err.contains("unknown issuer"),
            "{err}"
        );
    }
}
