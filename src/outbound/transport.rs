//! The transport seam: what a delivery worker sends through. The worker sees only the
//! [`Transport`] trait, so component tests inject a scripted fake and the real
//! [`crate::outbound::client::HttpTransport`] stays out of the retry logic.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

/// One attempt, ready to send: headers final (signatures included).
#[derive(Debug, Clone)]
pub struct OutboundRequest {
    /// HTTP method.
    pub method: http::Method,
    /// Where to send it: the stored target (normalised by `url` at ingest), parsed once,
    /// straight into the type the client sends.
    pub url: http::Uri,
    /// Headers in order (lowercase names): courier's own names are static, so sending them
    /// allocates nothing; values move into the request without a copy.
    pub headers: Vec<(Cow<'static, str>, Vec<u8>)>,
    /// The body.
    pub body: Bytes,
    /// The whole attempt's time limit: the message's policy's `request_timeout`.
    pub timeout: std::time::Duration,
}

/// What the receiver answered.
#[derive(Debug, Clone)]
pub struct InboundResponse {
    /// Status code.
    pub status: u16,
    /// The `Retry-After` header, raw.
    pub retry_after: Option<String>,
    /// The start of the body, at most `max_response_body` bytes.
    pub body: Bytes,
    /// The `Courier-Receipt` header, raw (a courier's ingress proving it stored a
    /// hand-off: `crate::signing::receipt`).
    pub receipt: Option<String>,
}

/// Why an attempt got no response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The egress policy refused every address of the target.
    #[error("egress denied: {0}")]
    EgressDenied(String),
    /// No connection within `connect_timeout`, or no complete answer within `request_timeout`.
    #[error("timeout: {0}")]
    Timeout(String),
    /// DNS, refused, reset, TLS and other network failures.
    #[error("{0}")]
    Network(String),
}

/// A boxed send future.
pub type SendFuture<'a> = Pin<Box<dyn Future<Output = Result<InboundResponse, TransportError>> + Send + 'a>>;

/// Sends one attempt.
pub trait Transport: Send + Sync + 'static {
    /// Sends `req` and returns the receiver's answer or why there was none.
    fn send(&self, req: OutboundRequest) -> SendFuture<'_>;

    /// Takes what a reloaded config changes for the transport (the egress policy, TLS
    /// material) for the connections made from now on; an error leaves the running ones in
    /// place. Transports without such settings (the test doubles) ignore it.
    fn reconfigure(&self, _config: &crate::config::Config) -> Result<(), String> {
        Ok(())
    }
}
