//! CORS for browser clients of the HTTP front (the Fetch standard's CORS protocol, answered by
//! tower-http's `CorsLayer`): off unless `allowed_origins` names origins.
//!
//! With origins set, a request whose `Origin` is one of them (or any origin, for `*`) gets
//! `Access-Control-Allow-Origin` on its response, and a preflight `OPTIONS` is answered before the
//! API-key check (a browser sends no `authorization` on a preflight): methods GET and POST, the
//! request headers the preflight asks for (`authorization` and `content-type` included: a `*`
//! would not cover `authorization`), cached for 10 minutes. No cookies are involved (the key is a
//! header), so credentials are not allowed. Responses expose `retry-after` and `retry-after-ms`.

use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// An `allowed_origins` entry that is not an origin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "allowed_origins entry {0:?} is not an origin: give scheme://host[:port] (no path, e.g. \
     https://app.example.com) or * for any origin"
)]
pub struct NotAnOrigin(pub String);

/// The CORS layer of `origins` (each `scheme://host[:port]`, or `*` for any); `None` when the list
/// is empty (CORS off: browsers refuse cross-origin calls).
///
/// Errors: [`NotAnOrigin`] for an entry with a path, query, user info, a scheme other than
/// `http`/`https`, or bytes a header cannot carry.
pub fn layer(origins: &[String]) -> Result<Option<CorsLayer>, NotAnOrigin> {
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let values = origins
            .iter()
            .map(|o| origin_value(o))
            .collect::<Result<Vec<_>, _>>()?;
        AllowOrigin::list(values)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([
                HeaderName::from_static("retry-after"),
                HeaderName::from_static("retry-after-ms"),
            ])
            .max_age(Duration::from_secs(600)),
    ))
}

/// `origin` as the header value a browser sends (`scheme://host[:port]`, no trailing slash).
fn origin_value(origin: &str) -> Result<HeaderValue, NotAnOrigin> {
    let bad = || NotAnOrigin(origin.to_string());
    let (scheme, rest) = origin.split_once("://").ok_or_else(bad)?;
    let host_port = rest.strip_suffix('/').unwrap_or(rest);
    let valid = matches!(scheme, "http" | "https")
        && !host_port.is_empty()
        && !host_port.contains(['/', '?', '#', '@', ' '])
        && host_port.rsplit_once(':').is_none_or(|(host, port)| {
            !host.is_empty() && (host.ends_with(']') || port.parse::<u16>().is_ok())
        });
    if !valid {
        return Err(bad());
    }
    HeaderValue::from_str(&format!("{scheme}://{host_port}")).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_checked_and_an_empty_list_is_off() {
        assert!(layer(&[]).unwrap().is_none());
        for good in [
            "*",
            "https://app.example.com",
            "http://127.0.0.1:3000",
            "http://localhost:8080/",
            "http://[::1]:5173",
        ] {
            assert!(layer(&[good.to_string()]).unwrap().is_some(), "{good}");
        }
        for bad in [
            "app.example.com",
            "ftp://example.com",
            "https://example.com/path",
            "https://user@example.com",
            "https://example.com:port",
            "https://",
        ] {
            assert_eq!(
                layer(&[bad.to_string()]).unwrap_err(),
                NotAnOrigin(bad.to_string()),
                "{bad}"
            );
        }
    }
}
