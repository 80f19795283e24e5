//! The deadline table of [`next_deadline`], row by row, and the counting of requests,
//! answers and blocked writes into [`Activity`].

use std::time::Duration;

use super::*;

const S: Duration = Duration::from_secs(1);

fn timeouts(t0: Instant) -> Timeouts {
    Timeouts {
        first_head: t0 + 10 * S,
        idle: 60 * S,
        send: 5 * S,
        drain: 30 * S,
    }
}

fn started(t0: Instant) -> Activity {
    Activity {
        started: 1,
        ..Activity::new(t0)
    }
}

#[test]
fn before_the_first_head_the_header_timeout_drops_it_even_when_closing() {
    let t0 = Instant::now();
    let t = timeouts(t0);
    let a = Activity::new(t0);
    assert_eq!(next_deadline(&a, None, &t), Some((t0 + 10 * S, Action::Drop)));
    assert_eq!(
        next_deadline(&a, Some(Closing::Stop(t0)), &t),
        Some((t0 + 10 * S, Action::Drop))
    );
    // An idle timeout shorter than the header timeout caps it.
    let short = Timeouts { idle: 2 * S, ..t };
    assert_eq!(next_deadline(&a, None, &short), Some((t0 + 2 * S, Action::Drop)));
}

#[test]
fn a_quiet_connection_is_closed_gracefully_after_the_idle_timeout() {
    let t0 = Instant::now();
    let a = Activity {
        quiet_since: t0 + 3 * S,
        ..started(t0)
    };
    assert_eq!(
        next_deadline(&a, None, &timeouts(t0)),
        Some((t0 + 63 * S, Action::Close))
    );
}

#[test]
fn a_running_handler_has_no_deadline_here() {
    let t0 = Instant::now();
    let a = Activity { open: 1, ..started(t0) };
    assert_eq!(next_deadline(&a, None, &timeouts(t0)), None);
    // Closed for idleness while a handler that raced in runs: still none.
    assert_eq!(next_deadline(&a, Some(Closing::Idle(t0)), &timeouts(t0)), None);
}

#[test]
fn an_answer_not_taken_within_the_send_timeout_drops_the_connection() {
    let t0 = Instant::now();
    let a = Activity {
        unsent: 1,
        sent_at: t0 + 2 * S,
        ..started(t0)
    };
    assert_eq!(next_deadline(&a, None, &timeouts(t0)), Some((t0 + 7 * S, Action::Drop)));
    // A handler running beside it does not extend it.
    let busy = Activity { open: 3, ..a };
    assert_eq!(
        next_deadline(&busy, None, &timeouts(t0)),
        Some((t0 + 7 * S, Action::Drop))
    );
}

#[test]
fn a_write_the_client_does_not_take_drops_the_connection_whatever_else_runs() {
    let t0 = Instant::now();
    let t = timeouts(t0);
    for a in [
        started(t0),
        Activity { open: 2, ..started(t0) },
        Activity {
            unsent: 1,
            sent_at: t0 + 9 * S,
            ..started(t0)
        },
    ] {
        let blocked = Activity {
            blocked: Some(t0 + S),
            ..a
        };
        assert_eq!(
            next_deadline(&blocked, None, &t),
            Some((t0 + 6 * S, Action::Drop)),
            "{a:?}"
        );
        assert_eq!(
            next_deadline(&blocked, Some(Closing::Stop(t0)), &t),
            Some((t0 + 6 * S, Action::Drop))
        );
    }
}

#[test]
fn a_connection_told_to_close_is_dropped_after_its_grace() {
    let t0 = Instant::now();
    let t = timeouts(t0);
    let a = started(t0);
    // Idle: GOAWAY sent, nothing in progress, yet the client keeps it open.
    assert_eq!(
        next_deadline(&a, Some(Closing::Idle(t0 + 60 * S)), &t),
        Some((t0 + 65 * S, Action::Drop))
    );
    // Stop: the drain timeout, whatever runs.
    let busy = Activity { open: 1, ..a };
    assert_eq!(
        next_deadline(&busy, Some(Closing::Stop(t0 + S)), &t),
        Some((t0 + 31 * S, Action::Drop))
    );
}

#[tokio::test]
async fn requests_answers_and_taken_bodies_are_counted() {
    let t0 = Instant::now();
    let shared: Shared = Arc::new(watch::Sender::new(Activity::new(t0)));
    let a = InProgress::enter(&shared);
    let b = InProgress::enter(&shared);
    assert_eq!((shared.borrow().open, shared.borrow().started), (2, 2));
    let unsent = a.answered();
    assert_eq!((shared.borrow().open, shared.borrow().unsent), (1, 1));
    drop(b); // a client that gave up before its answer
    assert_eq!((shared.borrow().open, shared.borrow().unsent), (0, 1));
    let before = shared.borrow().quiet_since;
    let answer = Answer::new(http_body_util::Full::new(Bytes::from_static(b"x")), unsent);
    drop(answer);
    let now = *shared.borrow();
    assert_eq!((now.open, now.unsent, now.started), (0, 0, 2));
    assert!(now.quiet_since >= before && now.sent_at >= t0);
}

/// A writer that blocks until told otherwise.
struct Gate(bool);

impl AsyncWrite for Gate {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.0 {
            Poll::Ready(Ok(buf.len()))
        } else {
            Poll::Pending
        }
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[test]
fn a_blocked_write_is_noted_once_and_cleared_when_it_moves() {
    let shared: Shared = Arc::new(watch::Sender::new(Activity::new(Instant::now())));
    let mut rx = shared.subscribe();
    let mut w = Watched::new(Gate(false), shared.clone());
    let mut cx = Context::from_waker(std::task::Waker::noop());
    assert!(Pin::new(&mut w).poll_write(&mut cx, b"abc").is_pending());
    assert!(rx.has_changed().unwrap());
    let since = rx.borrow_and_update().blocked.expect("blocked");
    // Still blocked: no second change.
    assert!(Pin::new(&mut w).poll_write(&mut cx, b"abc").is_pending());
    assert!(!rx.has_changed().unwrap());
    assert_eq!(shared.borrow().blocked, Some(since));
    w.inner.0 = true;
    assert!(Pin::new(&mut w).poll_write(&mut cx, b"abc").is_ready());
    // Cleared without a wake-up: the deadline it set is found gone when it fires.
    assert!(!rx.has_changed().unwrap());
    assert_eq!(rx.borrow_and_update().blocked, None);
}

#[test]
fn the_timer_looks_again_no_later_than_any_deadline_a_request_can_start() {
    let t0 = Instant::now();
    // A quiet connection: its idle deadline is 60 s away, but its task looks again after
    // the send timeout, the shorter of the two; with a shorter idle time, after that.
    let t = timeouts(t0);
    assert_eq!(wake_at(&started(t0), None, &t, t0), Some(t0 + 5 * S));
    let short_idle = Timeouts { idle: 2 * S, ..t };
    assert_eq!(wake_at(&started(t0), None, &short_idle, t0), Some(t0 + 2 * S));
    // A deadline sooner than that is kept; no deadline, no timer.
    let unsent = Activity {
        unsent: 1,
        sent_at: t0 - 4 * S,
        ..started(t0)
    };
    assert_eq!(wake_at(&unsent, None, &t, t0), Some(t0 + S));
    assert_eq!(wake_at(&Activity { open: 1, ..started(t0) }, None, &t, t0), None);
    // Whatever was read and whenever a request then starts a deadline (an answer to send,
    // or the idle time), that deadline is not before the timer.
    for (send, idle) in [(5, 60), (60, 5), (7, 7)] {
        let t = Timeouts {
            send: send * S,
            idle: idle * S,
            ..t
        };
        for read in [started(t0), unsent, Activity { open: 1, ..started(t0) }] {
            let Some(armed) = wake_at(&read, None, &t, t0) else {
                continue;
            };
            for later in [Duration::ZERO, S / 2, 3 * S] {
                let at = t0 + later;
                assert!(at + t.send >= armed && at + t.idle >= armed, "{send} {idle} {read:?}");
            }
        }
    }
}

#[test]
fn with_the_timer_set_requests_wake_no_one_and_without_it_they_do() {
    let t0 = Instant::now();
    for armed in [Some(t0 + 5 * S), None] {
        let shared: Shared = Arc::new(watch::Sender::new(Activity { armed, ..started(t0) }));
        let mut seen = shared.subscribe();
        seen.borrow_and_update();
        let request = InProgress::enter(&shared);
        assert!(!seen.has_changed().unwrap(), "a handler running brings no deadline");
        let unsent = request.answered();
        assert_eq!(seen.has_changed().unwrap(), armed.is_none(), "answered, {armed:?}");
        seen.borrow_and_update();
        drop(Answer::new(http_body_util::Full::new(Bytes::from_static(b"x")), unsent));
        assert_eq!(seen.has_changed().unwrap(), armed.is_none(), "taken, {armed:?}");
        seen.borrow_and_update();
        // A client that gave up: the last handler ending wakes the task either way (a
        // connection told to close may be past its grace then).
        drop(InProgress::enter(&shared));
        assert!(seen.has_changed().unwrap(), "given up, {armed:?}");
        assert_eq!((shared.borrow().open, shared.borrow().unsent), (0, 0));
    }
}
