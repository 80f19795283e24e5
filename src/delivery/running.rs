//! An attempt's place in the in-flight registry, from its dispatch until its result is
//! settled.
//!
//! The registry is what shutdown waits on and cuts off, and what the metrics count. An
//! attempt's task ends once its result is handed to the store writer, which ends the
//! attempt when the result is written (see `lifecycle`), so the entry is not the task's: it
//! is this guard, which moves from the task to the store writer and back to delivery.
//! Dropped before it is settled (the attempt panicked, or was cut off at shutdown) it first
//! puts the message back in the queue, with no attempt counted: courier's failure, not the
//! receiver's. A task of
//! its own per attempt used to watch for that; the guard costs no task and no wake-up.

use std::sync::Arc;

use super::{Deliverer, SELF_FAILURE_DELAY};

/// One attempt counted as running (see the module doc).
pub(crate) struct Running {
    d: Arc<Deliverer>,
    key: Key,
    settled: bool,
}

/// An attempt's place in the registry: its message's id and its dispatch number. Each
/// guard leaves with its own key: an attempt's end that comes late never takes away the
/// entry of the message's next attempt.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    pub(super) id: Arc<str>,
    pub(super) n: u64,
}

impl Running {
    /// The entry of `key`; the caller puts it in the registry.
    pub(super) fn new(d: Arc<Deliverer>, key: Key) -> Self {
        Running { d, key, settled: false }
    }

    /// Its message's id.
    pub(super) fn id(&self) -> &str {
        &self.key.id
    }

    /// The attempt ended as it should (its result written, or its message put back by the
    /// attempt itself): the entry goes.
    pub(super) fn settle(mut self) {
        self.settled = true;
    }

    /// Puts an abandoned attempt's message back in the queue, then leaves the registry (the
    /// guard is already settled: cut off itself, it just leaves).
    async fn abandon(self, panicked: bool) {
        let d = &self.d;
        d.ctx.metrics().attempt_abandoned();
        let now = d.ctx.clock().now_ms();
        let due = if panicked {
            tracing::error!(delivery_id = %self.key.id, "delivery worker panicked; message requeued without counting an attempt");
            now + SELF_FAILURE_DELAY.as_millis() as u64
        } else {
            now
        };
        // Cut off while a retry of its result waited to be written (see `lifecycle`): let that
        // write land first, so the release below finds the message no longer in flight
        // and leaves it.
        d.flush_results().await;
        d.requeue(&self.key.id, due).await;
        // Its host permit went back with the task, unseen by its host's line.
        d.start_all_waiting();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.settled {
            self.d.left(&self.key);
            return;
        }
        // Still in the registry while its message goes back (shutdown waits for that). On a
        // runtime already shut down the task is dropped unrun and just leaves: the message
        // stays in flight on disk, and startup puts it back.
        let rest = Running {
            d: self.d.clone(),
            key: self.key.clone(),
            settled: true,
        };
        let panicked = std::thread::panicking();
        self.d.ctx.runtime().spawn(rest.abandon(panicked));
    }
}
