//! Precise errors for requests that never reach a handler: a tower service around the public
//! `TextGeneration` server.
//!
//! - **Size**: [`FrameGuard`] reads the 5-byte gRPC frame header (compression flag, big-endian
//!   length) of every request message as the body arrives, and fails the call with
//!   `RESOURCE_EXHAUSTED` naming `max_request_bytes` and the message's size as soon as a header
//!   declares a message above the limit, before its bytes are buffered. (tonic's own limit, also set
//!   to `max_request_bytes`, would answer `OUT_OF_RANGE`; the guard sees the header first.)
//! - **Framing**: a compression flag other than 0 or 1 (e.g. garbage bytes instead of a gRPC frame)
//!   and a body that ends inside a frame (a truncated message) are `INVALID_ARGUMENT`.
//! - **Decoding**: a frame whose payload is not a valid message (garbage, truncated, wrong wire
//!   types, invalid UTF-8 in a string) is `INVALID_ARGUMENT` from the codec
//!   ([`inference_proto::codec::WireCodec`]).
//! - **Accounting**: such a rejection happens before the handler runs, so [`WireGuard`] looks at
//!   the response itself: a call whose handler never ran (no [`HandlerReached`] mark) and whose
//!   response carries an error status is logged (one INFO line with the code, the reason and the
//!   method) and, for `Generate`, counted in `router_requests_total{code}`. Calls that reach the
//!   handler are counted by the handler's own observer, so nothing is counted twice.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use inference_proto::status::code_name;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Code, Status};

use crate::metrics::RouterMetrics;

/// Bytes of a gRPC frame header: a compression flag and a big-endian `u32` payload length.
const FRAME_HEADER_BYTES: usize = 5;

/// Path suffix of the method whose calls `router_requests_total` counts.
const GENERATE_METHOD: &str = "/Generate";

/// Set by a handler when a call reaches it (so the call's status is accounted there, not by
/// [`WireGuard`]). [`WireGuard`] puts one in every request's extensions.
#[derive(Debug, Clone, Default)]
pub struct HandlerReached(Arc<AtomicBool>);

impl HandlerReached {
    /// Marks `request` as having reached its handler (does nothing for a request that did not come
    /// through a [`WireGuard`]).
    pub fn mark<T>(request: &tonic::Request<T>) {
        if let Some(reached) = request.extensions().get::<Self>() {
            reached.0.store(true, Ordering::Relaxed);
        }
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Wraps a generated gRPC server (e.g. `TextGenerationServer`): request bodies pass through a
/// [`FrameGuard`] with `max_request_bytes`, and rejections made before the handler are logged and
/// counted (see the module docs).
#[derive(Debug, Clone)]
pub struct WireGuard<S> {
    inner: S,
    max_request_bytes: usize,
    metrics: Option<Arc<RouterMetrics>>,
}

impl<S> WireGuard<S> {
    /// Guards `inner`: request messages above `max_request_bytes` (bytes of one encoded message)
    /// are refused; rejections are counted in `metrics` when given.
    pub fn new(inner: S, max_request_bytes: usize, metrics: Option<Arc<RouterMetrics>>) -> Self {
        Self {
            inner,
            max_request_bytes,
            metrics,
        }
    }
}

impl<S: NamedService> NamedService for WireGuard<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower_service::Service<http::Request<Body>> for WireGuard<S>
where
    S: tower_service::Service<
        http::Request<Body>,
        Response = http::Response<Body>,
        Error = Infallible,
    >,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let reached = HandlerReached::default();
        let method = request.uri().path().to_owned();
        let limit = self.max_request_bytes;
        let mut request = request.map(|body| Body::new(FrameGuard::new(body, limit)));
        request.extensions_mut().insert(reached.clone());
        let response = self.inner.call(request);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let response = response.await?;
            if !reached.get() {
                if let Some(status) = Status::from_header_map(response.headers()) {
                    record_rejection(&method, &status, metrics.as_deref());
                }
            }
            Ok(response)
        })
    }
}

/// Logs (and for `Generate`, counts) a call refused before its handler ran.
fn record_rejection(method: &str, status: &Status, metrics: Option<&RouterMetrics>) {
    if status.code() == Code::Ok {
        return;
    }
    let code = code_name(status.code());
    tracing::info!(
        code,
        reason = status.message(),
        method,
        "request rejected before the handler"
    );
    if let Some(metrics) = metrics.filter(|_| method.ends_with(GENERATE_METHOD)) {
        metrics.count_rejection(status.code());
    }
}

/// A request body that checks gRPC framing as it streams: each frame's declared length against the
/// limit (`RESOURCE_EXHAUSTED`), the compression flag, and that the body does not end inside a frame
/// (`INVALID_ARGUMENT`). The bytes themselves pass through unchanged. The error is a [`Status`],
/// which tonic's decoder passes on to the client as is.
#[derive(Debug)]
pub struct FrameGuard<B> {
    inner: B,
    limit: usize,
    scanner: FrameScanner,
}

impl<B> FrameGuard<B> {
    /// Checks `inner`'s frames against `limit` bytes per message.
    pub fn new(inner: B, limit: usize) -> Self {
        Self {
            inner,
            limit,
            scanner: FrameScanner::default(),
        }
    }
}

impl<B> HttpBody for FrameGuard<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        let item = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(status) = this.scanner.scan(data, this.limit) {
                        return Poll::Ready(Some(Err(status)));
                    }
                }
                Some(Ok(frame))
            }
            Some(Err(e)) => Some(Err(Status::from_error(e.into()))),
            None => this.scanner.finish().err().map(Err),
        };
        Poll::Ready(item)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Where a byte stream of gRPC frames stands: inside a header (bytes of it seen so far) or inside a
/// payload (bytes still to come).
#[derive(Debug, Default)]
struct FrameScanner {
    header: [u8; FRAME_HEADER_BYTES],
    header_filled: usize,
    payload_len: usize,
    payload_left: usize,
}

impl FrameScanner {
    /// Follows `data`, the next bytes of the stream; fails on a frame above `limit` bytes or with an
    /// invalid compression flag.
    fn scan(&mut self, mut data: &[u8], limit: usize) -> Result<(), Status> {
        while !data.is_empty() {
            if self.payload_left > 0 {
                let n = self.payload_left.min(data.len());
                self.payload_left -= n;
                data = &data[n..];
                continue;
            }
            let n = (FRAME_HEADER_BYTES - self.header_filled).min(data.len());
            self.header[self.header_filled..self.header_filled + n].copy_from_slice(&data[..n]);
            self.header_filled += n;
            data = &data[n..];
            if self.header_filled < FRAME_HEADER_BYTES {
                break;
            }
            self.header_filled = 0;
            let flag = self.header[0];
            if flag > 1 {
                return Err(Status::invalid_argument(format!(
                    "malformed gRPC frame: compression flag {flag} (valid flags are 0 and 1)"
                )));
            }
            let len = u32::from_be_bytes([
                self.header[1],
                self.header[2],
                self.header[3],
                self.header[4],
            ]) as usize;
            if len > limit {
                return Err(Status::resource_exhausted(format!(
                    "request message is {len} bytes; the limit is max_request_bytes = {limit} bytes"
                )));
            }
            self.payload_len = len;
            self.payload_left = len;
        }
        Ok(())
    }

    /// Called at the end of the stream: fails when it ended inside a frame.
    fn finish(&self) -> Result<(), Status> {
        if self.header_filled > 0 {
            return Err(Status::invalid_argument(format!(
                "truncated request: the body ended inside a gRPC frame header ({} of {FRAME_HEADER_BYTES} bytes)",
                self.header_filled
            )));
        }
        if self.payload_left > 0 {
            return Err(Status::invalid_argument(format!(
                "truncated request: the body ended inside a message ({} of {} bytes arrived)",
                self.payload_len - self.payload_left,
                self.payload_len
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(flag: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn whole_frames_in_any_split_pass() {
        let mut stream = frame(0, b"hello");
        stream.extend(frame(0, b""));
        stream.extend(frame(1, &[7; 40]));
        for split in 0..=stream.len() {
            let mut scanner = FrameScanner::default();
            scanner.scan(&stream[..split], 40).unwrap();
            scanner.scan(&stream[split..], 40).unwrap();
            scanner.finish().unwrap();
        }
        // Byte by byte.
        let mut scanner = FrameScanner::default();
        for b in &stream {
            scanner.scan(std::slice::from_ref(b), 40).unwrap();
        }
        scanner.finish().unwrap();
    }

    #[test]
    fn oversized_frame_is_resource_exhausted_from_its_header_alone() {
        let mut scanner = FrameScanner::default();
        let header = &frame(0, &[0; 5_000_000])[..FRAME_HEADER_BYTES];
        let status = scanner.scan(header, 1 << 20).unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(
            status.message(),
            "request message is 5000000 bytes; the limit is max_request_bytes = 1048576 bytes"
        );
    }

    #[test]
    fn a_frame_of_exactly_the_limit_passes() {
        let mut scanner = FrameScanner::default();
        scanner.scan(&frame(0, &[1; 64]), 64).unwrap();
        scanner.finish().unwrap();
    }

    #[test]
    fn garbage_flag_is_invalid_argument() {
        let mut scanner = FrameScanner::default();
        let status = scanner.scan(b"GET / HTTP/1.1", 1 << 20).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().contains("compression flag 71"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn truncated_frames_are_invalid_argument() {
        let whole = frame(0, b"0123456789");
        let mut in_payload = FrameScanner::default();
        in_payload.scan(&whole[..8], 100).unwrap();
        let status = in_payload.finish().unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().contains("3 of 10 bytes"),
            "{}",
            status.message()
        );
        let mut in_header = FrameScanner::default();
        in_header.scan(&whole[..2], 100).unwrap();
        assert_eq!(
            in_header.finish().unwrap_err().code(),
            Code::InvalidArgument
        );
    }
}
