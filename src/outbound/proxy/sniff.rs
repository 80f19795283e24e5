//! Reading the proxy's status line while hyper-util's [`Tunnel`] sets up a CONNECT: its
//! error says only "unsuccessful", and an operator needs to know whether the proxy
//! answered 401, 403 or 502. The bytes are seen on their way to the tunnel; once the line
//! is complete, reads go straight through.
//!
//! [`Tunnel`]: hyper_util::client::legacy::connect::proxy::Tunnel

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor};
use hyper_util::client::legacy::connect::HttpConnector;

use super::{BoxError, BoxFuture, EgressIo};
use crate::outbound::resolver::GuardedResolver;

/// The proxy's answer to CONNECT, as far as its status line (hyper-util's tunnel error
/// does not say which status it was).
#[derive(Clone, Default)]
pub(super) struct StatusLine(Arc<Mutex<Vec<u8>>>);

/// The longest status line kept: `HTTP/1.1 407 Proxy Authentication Required` fits.
const STATUS_LINE_MAX: usize = 96;

impl StatusLine {
    /// `407 Proxy Authentication Required`, or empty when nothing was read.
    pub(super) fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let line = String::from_utf8_lossy(&bytes);
        let line = line.split("\r\n").next().unwrap_or_default();
        let status = line.split_once(' ').map_or("", |(_, rest)| rest);
        status.chars().filter(|c| !c.is_control()).collect()
    }

    /// Keeps `read` while the line is not complete; whether it now is.
    pub(super) fn record(&self, read: &[u8]) -> bool {
        let mut bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let room = STATUS_LINE_MAX.saturating_sub(bytes.len());
        bytes.extend_from_slice(&read[..read.len().min(room)]);
        bytes.len() >= STATUS_LINE_MAX || bytes.windows(2).any(|w| w == b"\r\n")
    }
}

/// The proxy connector under [`Tunnel`], recording the proxy's status line.
#[derive(Clone)]
pub(super) struct Sniffing {
    pub(super) inner: HttpConnector<GuardedResolver>,
    pub(super) line: StatusLine,
}

impl tower_service::Service<Uri> for Sniffing {
    type Response = EgressIo;
    type Error = BoxError;
    type Future = BoxFuture<EgressIo>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (connecting, line) = (self.inner.call(uri), self.line.clone());
        Box::pin(async move {
            Ok(EgressIo {
                io: connecting.await?,
                line: Some(line),
                proxied: false,
            })
        })
    }
}

impl Read for EgressIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, mut buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(line) = &this.line else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        // Read into a small buffer of our own to see the bytes, then hand them on.
        let mut tmp = [0u8; STATUS_LINE_MAX];
        let want = buf.remaining().min(tmp.len());
        let mut own = hyper::rt::ReadBuf::new(&mut tmp[..want]);
        std::task::ready!(Pin::new(&mut this.io).poll_read(cx, own.unfilled()))?;
        let read = own.filled();
        if line.record(read) || read.is_empty() {
            this.line = None;
        }
        buf.put_slice(read);
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_is_kept_across_reads_and_bounded() {
        let line = StatusLine::default();
        assert!(!line.record(b"HTTP/1.0 40"));
        assert!(line.record(b"1 Unauthorized\r\nServer: tinyproxy\r\n"));
        assert_eq!(line.text(), "401 Unauthorized");
        let long = StatusLine::default();
        assert!(long.record(&[b'x'; 500]));
        assert_eq!(long.0.lock().unwrap().len(), STATUS_LINE_MAX);
        assert_eq!(StatusLine::default().text(), "");
    }
}
