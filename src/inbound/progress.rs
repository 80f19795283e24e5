//! Whether a connection is still making progress, and when it must end.
//!
//! A connection slot is held from the accept to the close, so every state a connection can
//! be in needs a deadline, or one client that stops reading holds its slot for good (4,096
//! such clients lock a listener out). The states and their deadlines:
//!
//! | state | deadline | then |
//! | --- | --- | --- |
//! | no complete first head yet | `header_read_timeout` (capped by `idle_timeout`) from the connect | dropped |
//! | a write to the socket that the client does not take (a full TCP window) | `send_timeout` from when it blocked | dropped |
//! | an answer whose body the connection has not taken (an HTTP/2 stream window left at zero) | `send_timeout` from the last answer taken | dropped |
//! | nothing in progress, nothing to send | `idle_timeout` from then | closed gracefully (HTTP/2: `GOAWAY`) |
//! | told to close (idle), nothing in progress | `send_timeout` from the close | dropped |
//! | told to close (stop) | `drain_timeout` from the stop | dropped |
//!
//! A handler that is still running has no deadline here: ingress bounds its own (the body
//! read timeout, the commit), admin's answers are immediate.
//!
//! [`Activity`] is the connection's state, kept in a `watch` its task waits on: requests
//! count themselves in and out ([`InProgress`], [`Unsent`]), and the socket wrapper
//! ([`Watched`]) says when a write blocks and when it moves again. [`next_deadline`] is the
//! table above as a pure function of that state and the time. The task's timer looks again
//! at most [`Timeouts::horizon`] after it is set ([`wake_at`]), so the deadlines an answer
//! starts (its `send_timeout`, then the idle time) fall at or after it: while the timer is
//! set ([`Activity::armed`]) an answer made or taken wakes no one, and a deadline put off is
//! found when the timer fires. A change with no timer set wakes the task, as do a blocked
//! write and a handler that ends without an answer (the grace of a connection already told
//! to close may then be past). So a busy keep-alive connection's task wakes for none of its
//! requests' answers; the price is that an idle one looks at its deadlines every
//! `min(send_timeout, idle_timeout)` (10 s by default) instead of once at the idle timeout.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::Instant;

/// What an answer carries: `serve`'s body type (spelled out here, as `serve` uses this module).
type Body = http_body_util::Full<Bytes>;

/// What one connection is doing, as its task sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Activity {
    /// Requests whose handler is running.
    pub open: usize,
    /// Requests ever started on the connection.
    pub started: u64,
    /// Answers made whose body the connection has not taken yet.
    pub unsent: usize,
    /// When an answer was last taken (or the first of the unsent ones was made).
    pub sent_at: Instant,
    /// When the connection last had nothing in progress and nothing to send.
    pub quiet_since: Instant,
    /// Since when a write to the socket has been waiting for the client to read.
    pub blocked: Option<Instant>,
    /// When the connection's task looks at its deadlines next (its timer); `None` when it
    /// has none. Set by the task with what it read, under the same lock.
    pub armed: Option<Instant>,
}

impl Activity {
    /// A connection accepted at `now`.
    pub fn new(now: Instant) -> Self {
        Activity {
            open: 0,
            started: 0,
            unsent: 0,
            sent_at: now,
            quiet_since: now,
            blocked: None,
            armed: None,
        }
    }

    /// Nothing in progress and nothing to send.
    fn quiet(&self) -> bool {
        self.open == 0 && self.unsent == 0
    }
}

/// The shared cell the connection's parts update and its task watches.
pub(super) type Shared = Arc<watch::Sender<Activity>>;

/// Why a connection was told to close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Closing {
    /// It was idle for `idle_timeout`.
    Idle(Instant),
    /// The listener is stopping.
    Stop(Instant),
}

/// What to do when a deadline passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// Close gracefully: finish what is in progress, take no new request.
    Close,
    /// Drop the connection now; its slot is free.
    Drop,
}

/// The timeouts [`next_deadline`] applies.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timeouts {
    pub first_head: Instant,
    pub idle: Duration,
    pub send: Duration,
    pub drain: Duration,
}

impl Timeouts {
    /// The longest the task's timer waits: no longer than any deadline a request starts.
    fn horizon(&self) -> Duration {
        self.send.min(self.idle)
    }
}

/// When the task, having read `a` at `now`, looks again: at its next deadline, or sooner,
/// one [`Timeouts::horizon`] on (a deadline starting later cannot come before that), or
/// never (`None`: it has none, so the next change must wake it).
pub(super) fn wake_at(a: &Activity, closing: Option<Closing>, t: &Timeouts, now: Instant) -> Option<Instant> {
    next_deadline(a, closing, t).map(|(at, _)| at.min(now + t.horizon()))
}

/// The next deadline of a connection in state `a` (told to close when `closing`), and what
/// to do at it; `None` while a handler runs with nothing else pending.
pub(super) fn next_deadline(a: &Activity, closing: Option<Closing>, t: &Timeouts) -> Option<(Instant, Action)> {
    if a.started == 0 {
        // No head yet: `quiet_since` is the connect.
        return Some((t.first_head.min(a.quiet_since + t.idle), Action::Drop));
    }
    let mut next: Option<(Instant, Action)> = None;
    let mut consider = |at: Instant, action: Action| {
        if next.is_none_or(|(n, _)| at < n) {
            next = Some((at, action));
        }
    };
    if let Some(since) = a.blocked {
        consider(since + t.send, Action::Drop);
    }
    if a.unsent > 0 {
        consider(a.sent_at + t.send, Action::Drop);
    }
    match closing {
        None if a.quiet() => consider(a.quiet_since + t.idle, Action::Close),
        None => {}
        Some(Closing::Stop(at)) => consider(at + t.drain, Action::Drop),
        // Told to close with nothing in progress yet still open: the client holds it (an
        // answer the stream or TCP window has not let out); a grace, then it goes.
        Some(Closing::Idle(at)) if a.open == 0 => consider(at.max(a.quiet_since) + t.send, Action::Drop),
        Some(Closing::Idle(_)) => {}
    }
    next
}

/// One request's handler running; counts itself out when dropped (the handler ended or
/// the client gave up), or hands over to [`Unsent`] when its answer is made.
pub(super) struct InProgress(Option<Shared>);

impl InProgress {
    /// Counts a request in on `shared`.
    pub fn enter(shared: &Shared) -> Self {
        // A running handler takes deadlines away, never brings one: no wake-up.
        shared.send_if_modified(|a| {
            a.open += 1;
            a.started += 1;
            false
        });
        InProgress(Some(shared.clone()))
    }

    /// The handler made its answer: it now waits for the connection to take it.
    pub fn answered(mut self) -> Unsent {
        let shared = self.0.take().expect("counted in");
        shared.send_if_modified(|a| {
            a.open -= 1;
            a.unsent += 1;
            let first = a.unsent == 1;
            if first {
                a.sent_at = tokio::time::Instant::now();
            }
            first && a.armed.is_none()
        });
        Unsent(shared)
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            shared.send_if_modified(|a| {
                a.open -= 1;
                if a.quiet() {
                    a.quiet_since = tokio::time::Instant::now();
                }
                // Not only when no timer is set: a connection told to close for idleness
                // may now be past its grace.
                a.open == 0
            });
        }
    }
}

/// An answer the connection has not taken yet; taken when its body is dropped.
pub(super) struct Unsent(Shared);

impl Drop for Unsent {
    fn drop(&mut self) {
        self.0.send_if_modified(|a| {
            a.unsent -= 1;
            let now = tokio::time::Instant::now();
            a.sent_at = now;
            let quiet = a.quiet();
            if quiet {
                a.quiet_since = now;
            }
            quiet && a.armed.is_none()
        });
    }
}

/// An answer's body, counted [`Unsent`] until the connection has taken all of it: HTTP/1.1
/// drops it once written to its buffer, HTTP/2 once the stream's window let it out.
pub(super) struct Answer {
    body: Body,
    _unsent: Unsent,
}

impl Answer {
    /// `body`, counted as unsent by `unsent`.
    pub fn new(body: Body, unsent: Unsent) -> Self {
        Answer { body, _unsent: unsent }
    }
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A connection's stream that tells [`Activity::blocked`] when a write waits for the client
/// to read, and when it moves again. Only the changes touch the shared state.
pub(super) struct Watched<S> {
    inner: S,
    shared: Shared,
    blocked: bool,
}

impl<S> Watched<S> {
    /// `inner`, reporting to `shared`.
    pub fn new(inner: S, shared: Shared) -> Self {
        Watched {
            inner,
            shared,
            blocked: false,
        }
    }

    /// Notes what a write (or flush) came to.
    fn note<T>(&mut self, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match (&poll, self.blocked) {
            (Poll::Pending, false) => {
                self.blocked = true;
                self.shared
                    .send_modify(|a| a.blocked = Some(tokio::time::Instant::now()));
            }
            (Poll::Ready(_), true) => {
                self.blocked = false;
                self.shared.send_if_modified(|a| {
                    a.blocked = None;
                    false
                });
            }
            _ => {}
        }
        poll
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let poll = Pin::new(&mut me.inner).poll_write(cx, buf);
        me.note(poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let poll = Pin::new(&mut me.inner).poll_write_vectored(cx, bufs);
        me.note(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let poll = Pin::new(&mut me.inner).poll_flush(cx);
        me.note(poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[path = "progress_tests.rs"]
mod tests;
