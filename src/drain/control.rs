//! A running courier's drain, which `POST /drain` starts and `GET /drain` shows
//! ([`super::front`]). Where it may send is checked before anything changes
//! ([`super::plan`]): a refused peer leaves courier serving.
//!
//! The steps, each finished before the next:
//! 1. ingress answers `503 shutting_down` and `/readyz` 503 (what a shutdown does first):
//!    nothing new comes in, and a Service stops routing here;
//! 2. with `deliver_for`, courier keeps delivering as usual until nothing is open or the
//!    time is up (it waits on attempts ending, never polls);
//! 3. the scheduler stops (no new attempts); new accepts (courier's own pause alerts, and
//!    ingress requests already past the `draining` check, which the drain waits for) go to
//!    the queue instead of to an attempt; the attempts running get `shutdown_grace` to
//!    finish, then are cut off and requeued, as at shutdown;
//! 4. the forwarding pass ([`super::engine`]) hands every open message to the peer.
//!
//! Afterwards courier stays up, drained: ingress refuses, nothing is attempted, until it is
//! stopped (a pod's `preStop` returns and the kubelet sends SIGTERM). A second `POST` with
//! the same peer joins the drain under way (a `preStop` retried, or the verb run again);
//! after a drain ended, it runs another pass (what the peer refused may go now). SIGTERM
//! during a drain stops it: what is not handed off stays pending, as after a kill.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use url::Url;

use super::plan::{DrainPlan, DrainRequest, NotStarted};
use super::progress::{Phase, Progress, Status};
use crate::delivery::Deliverer;
use crate::inbound::ingress::{AcceptsInProgress, ACCEPT_COMMIT_MARGIN, BODY_READ_TIMEOUT};
use crate::redact::url_for_log;

/// The drain under way (or the last one).
struct Current {
    to: Url,
    progress: Arc<Progress>,
    task: AbortHandle,
}

/// The drain of this running courier.
pub struct DrainControl {
    d: Arc<Deliverer>,
    draining: Arc<AtomicBool>,
    accepts: Arc<AcceptsInProgress>,
    stop_scheduler: Arc<watch::Sender<bool>>,
    scheduler_stopped: watch::Receiver<bool>,
    current: Mutex<Option<Current>>,
    /// Set by [`DrainControl::abort`] (shutdown): no drain starts after it.
    closed: AtomicBool,
    /// Bumped when a drain ends: `GET /drain?wait=` returns then.
    ended: watch::Sender<u64>,
}

/// The drain under way, if one is.
fn under_way(current: &Option<Current>) -> Option<&Current> {
    current.as_ref().filter(|c| !c.progress.update(|s| s.state.ended()))
}

impl DrainControl {
    /// The control over a courier's delivery: `draining` is the flag ingress and `/readyz`
    /// read; `accepts` counts the ingress requests under way; `stop_scheduler` stops the
    /// scheduler, which sets `scheduler_stopped` once it has returned.
    pub fn new(
        d: Arc<Deliverer>,
        draining: Arc<AtomicBool>,
        accepts: Arc<AcceptsInProgress>,
        stop_scheduler: Arc<watch::Sender<bool>>,
        scheduler_stopped: watch::Receiver<bool>,
    ) -> Self {
        DrainControl {
            d,
            draining,
            accepts,
            stop_scheduler,
            scheduler_stopped,
            current: Mutex::new(None),
            closed: AtomicBool::new(false),
            ended: watch::channel(0).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current (or last) drain's status.
    pub fn status(&self) -> Status {
        let Some(progress) = self.lock().as_ref().map(|c| c.progress.clone()) else {
            return Status::default();
        };
        let mut status = progress.status(self.d.context().clock().now_ms());
        // Nothing undoes the drain's stop short of a restart: say so where it is read.
        status.delivery_stopped = status.state == Phase::Failed;
        status
    }

    /// The status once the drain under way has ended, or `wait` is over.
    pub async fn status_after(&self, wait: Duration) -> Status {
        let mut ended = self.ended.subscribe();
        if under_way(&self.lock()).is_some() && !wait.is_zero() {
            let _ = tokio::time::timeout(wait, ended.changed()).await;
        }
        self.status()
    }

    /// Starts a drain, or joins the one under way to the same peer; the request is checked
    /// before anything changes.
    pub fn start(self: &Arc<Self>, request: DrainRequest) -> Result<Status, NotStarted> {
        let plan = request.plan(&self.d.context().config().drain, true)?;
        let mut current = self.lock();
        // Read under the lock `abort` takes after setting it: a drain either starts before
        // the abort (which then stops it) or not at all.
        if self.closed.load(Ordering::SeqCst) {
            // A drain started now would be cut off at once.
            let why = "courier is shutting down; drain its data dir once it has stopped (courier drain --data-dir)";
            return Err(NotStarted("shutting_down", why.into()));
        }
        if let Some(c) = under_way(&current) {
            if c.to != plan.to {
                let why = "wait for it (GET /drain) or drain to the same peer";
                let running = url_for_log(c.to.as_str());
                return Err(NotStarted(
                    "drain_running",
                    format!("a drain to {running} is under way; {why}"),
                ));
            }
        } else {
            let first = if plan.deliver_for.is_zero() {
                Phase::Stopping
            } else {
                Phase::Delivering
            };
            let progress = Arc::new(Progress::new(url_for_log(plan.to.as_str()), first));
            let to = plan.to.clone();
            let task = tokio::spawn(self.clone().run(plan, progress.clone()));
            let task = task.abort_handle();
            *current = Some(Current { to, progress, task });
        }
        drop(current);
        Ok(self.status())
    }

    /// Stops a drain under way (shutdown): what is not handed off stays pending.
    pub fn abort(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(c) = under_way(&self.lock()) {
            c.task.abort();
            c.progress.fail("courier is shutting down".into());
            c.progress.set(Phase::Failed);
            self.ended.send_modify(|n| *n += 1);
        }
    }

    async fn run(self: Arc<Self>, plan: DrainPlan, progress: Arc<Progress>) {
        self.draining.store(true, Ordering::SeqCst);
        tracing::info!(to = %url_for_log(plan.to.as_str()), deliver_for_ms = plan.deliver_for.as_millis() as u64,
            "drain: started; ingress refuses new messages from now on");
        if !plan.deliver_for.is_zero() {
            self.deliver_until_empty(plan.deliver_for).await;
            progress.set(Phase::Stopping);
        }
        self.stop_attempts().await;
        let d = &self.d;
        let ctx = d.context();
        let (store, clock, metrics) = (ctx.store().clone(), ctx.clock().clone(), ctx.metrics().clone());
        let ok = super::engine::forward(store, ctx.config(), plan, clock, metrics, progress.clone()).await;
        let status = progress.status(ctx.clock().now_ms());
        tracing::info!(
            handed_off = status.handed_off,
            already_at_peer = status.already_at_peer,
            refused = status.refused,
            left = status.left,
            error = status.error.as_deref(),
            "drain: {}",
            status.state.as_str()
        );
        if !ok {
            tracing::warn!("drain: delivery stays stopped until courier restarts (ingress refuses, nothing is attempted); restart it, or drain again");
        }
        self.ended.send_modify(|n| *n += 1);
    }

    /// Step 3: no attempt holds a message any more, and none starts.
    async fn stop_attempts(&self) {
        // What is accepted from now on (courier's own alerts, requests already past
        // ingress's check) waits in the queue rather than starting an attempt at accept.
        // Set before the scheduler stops, so no accept dispatches between its last pass and
        // the stop; and again after, as that last pass may have cleared it.
        self.d.set_queue_waiting(true);
        let _ = self.stop_scheduler.send(true);
        let _ = self.scheduler_stopped.clone().wait_for(|s| *s).await;
        self.d.set_queue_waiting(true);
        // Requests that passed ingress's `draining` check before it was set commit their
        // message now: wait for them, so the walk sees it. Bounded by the time a body has
        // to arrive; one that still commits later is met by the engine's re-count.
        let under_way = self.accepts.count();
        if under_way > 0 {
            tracing::info!(count = under_way, "drain: waiting for ingress requests under way");
        }
        if !self.accepts.wait_idle(BODY_READ_TIMEOUT + ACCEPT_COMMIT_MARGIN).await {
            tracing::warn!(
                count = self.accepts.count(),
                "drain: ingress requests were still under way after the body timeout; forwarding anyway"
            );
        }
        let cut = self.d.drain(self.d.context().config().shutdown_grace).await;
        if cut > 0 {
            tracing::warn!(
                count = cut,
                "drain: attempts still running after shutdown_grace were cut off; they are forwarded"
            );
        }
    }

    /// Delivers as usual until nothing is open or `budget` is over, checking each time the
    /// attempts in flight run out (the only moment the open count can reach zero).
    async fn deliver_until_empty(&self, budget: Duration) {
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let idle = self.d.next_idle();
            let store = self.d.context().store().clone();
            let open = tokio::task::spawn_blocking(move || store.counts().map(|c| c.open)).await;
            if matches!(open, Ok(Ok(0))) {
                tracing::info!("drain: nothing open is left; nothing to forward");
                return;
            }
            tokio::select! {
                _ = idle => {}
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    }
}
