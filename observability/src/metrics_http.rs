//! The Prometheus endpoint: `GET /metrics` over plain HTTP/1.1 answers the OpenMetrics text the
//! caller renders when the request's `Accept` names `application/openmetrics-text` (what Prometheus
//! sends), and otherwise the same metrics in the Prometheus text format 0.0.4
//! ([`crate::text_format`]; what `curl` and `promtool check metrics` expect), as the Go client does.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context as _;
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::HeaderMap;
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
    let app = metrics_route(axum::Router::new(), render);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint failed");
        }
    });
    Ok(bound)
}

/// Adds `GET /metrics` with the text `render` produces (OpenMetrics or text 0.0.4, as the
/// `Accept` header asks) to `app`, e.g. the router's OpenAI HTTP front, which serves it beside the
/// API as vLLM does.
pub fn metrics_route<S, F, Fut>(app: axum::Router<S>, render: F) -> axum::Router<S>
where
    S: Clone + Send + Sync + 'static,
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    app.route(
        "/metrics",
        get(move |headers: HeaderMap| {
            let render = render.clone();
            async move {
                let text = render().await;
                if wants_openmetrics(&headers) {
                    ([(CONTENT_TYPE, CONTENT_TYPE_OPENMETRICS)], text).into_response()
                } else {
                    let text = crate::text_format::from_openmetrics(&text);
                    (
                        [(CONTENT_TYPE, crate::text_format::CONTENT_TYPE_TEXT)],
                        text,
                    )
                        .into_response()
                }
            }
        }),
    )
}

/// Whether the request's `Accept` header names the OpenMetrics text format.
fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"))
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

    async fn get(addr: SocketAddr, extra_headers: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let request =
            format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{extra_headers}Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        response
    }

    #[tokio::test]
    async fn serves_openmetrics_when_asked_and_text_0_0_4_otherwise() {
        let addr = serve("127.0.0.1:0".parse().unwrap(), || async {
            "# TYPE x counter\nx_total 1\n# EOF\n".to_string()
        })
        .await
        .unwrap();
        let accept = "Accept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n";
        let openmetrics = get(addr, accept).await;
        assert!(openmetrics.contains("openmetrics-text"), "{openmetrics}");
        assert!(
            openmetrics.ends_with("# TYPE x counter\nx_total 1\n# EOF\n"),
            "{openmetrics}"
        );
        let text = get(addr, "").await;
        assert!(text.contains("text/plain; version=0.0.4"), "{text}");
        assert!(
            text.ends_with("\r\n# TYPE x_total counter\nx_total 1\n"),
            "{text}"
        );
    }
}
