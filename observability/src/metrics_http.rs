//! The Prometheus endpoint: `GET /metrics` over plain HTTP/1.1 answers the OpenMetrics text the
//! caller renders (Prometheus scrapes it as is).

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context as _;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;

/// Content type of the OpenMetrics text exposition format (what `prometheus-client` writes).
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Parses a `metrics_listen` setting: empty (or blank) means the endpoint is off.
///
/// Errors: a value that is not `HOST:PORT` with a numeric host.
pub fn parse_listen(setting: &str) -> anyhow::Result<Option<SocketAddr>> {
    let setting = setting.trim();
    if setting.is_empty() {
        return Ok(None);
    }
    setting
        .parse()
        .map(Some)
        .with_context(|| format!("metrics_listen {setting:?} is not an IP:PORT address"))
}

/// Binds `addr` for [`serve_on`] (bind early so a port in use fails at start).
///
/// Errors: the address cannot be bound (e.g. the port is in use).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for metrics on {addr}"))
}

/// Binds `addr` and serves `GET /metrics` with the text `render` produces, on the current tokio
/// runtime, until the process exits. Returns the bound address.
///
/// Errors: the address cannot be bound (e.g. the port is in use).
pub async fn serve<F, Fut>(addr: SocketAddr, render: F) -> anyhow::Result<SocketAddr>
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    serve_on(bind(addr).await?, render)
}

/// Serves `GET /metrics` on `listener` with the text `render` produces, on the current tokio
/// runtime, until the process exits. Returns the bound address.
///
/// Errors: the listener's address cannot be read.
pub fn serve_on<F, Fut>(listener: tokio::net::TcpListener, render: F) -> anyhow::Result<SocketAddr>
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    let bound = listener.local_addr()?;
    let app =
        axum::Router::new().route(
            "/metrics",
            get(move || {
                let render = render.clone();
                async move {
                    ([(CONTENT_TYPE, CONTENT_TYPE_OPENMETRICS)], render().await).into_response()
                }
            }),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint failed");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_setting() {
        assert_eq!(parse_listen("").unwrap(), None);
        assert_eq!(parse_listen("  ").unwrap(), None);
        assert_eq!(
            parse_listen("127.0.0.1:9090").unwrap(),
            Some("127.0.0.1:9090".parse().unwrap())
        );
        assert!(parse_listen("localhost").is_err());
    }

    #[tokio::test]
    async fn serves_the_rendered_text() {
        let addr = serve("127.0.0.1:0".parse().unwrap(), || async {
            "x_total 1\n# EOF\n".to_string()
        })
        .await
        .unwrap();
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains("openmetrics-text"), "{response}");
        assert!(response.ends_with("x_total 1\n# EOF\n"), "{response}");
    }
}
