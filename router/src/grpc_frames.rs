//! gRPC framing checked as a request body streams in ([`FrameGuard`]): each message's 5-byte frame
//! header (compression flag, big-endian length) is read as the bytes arrive.
//!
//! - **Size**: a header that declares a message above the limit fails the call with
//!   `RESOURCE_EXHAUSTED` naming `max_request_bytes` and the message's size, before its bytes are
//!   buffered. (tonic's own limit, also set to `max_request_bytes`, would answer `OUT_OF_RANGE`;
//!   the guard sees the header first.)
//! - **Framing**: a compression flag other than 0 or 1 (e.g. garbage bytes instead of a gRPC frame)
//!   and a body that ends inside a frame (a truncated message) are `INVALID_ARGUMENT`.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::Status;

/// Bytes of a gRPC frame header: a compression flag and a big-endian `u32` payload length.
const FRAME_HEADER_BYTES: usize = 5;

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
    use tonic::Code;

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
