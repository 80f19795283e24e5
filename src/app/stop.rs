//! Shutdown, in order, within `shutdown_grace` (see the module doc of `app`).

use super::*;

/// After the drain, how long the listeners at least get to finish the answers in progress.
const HTTP_DRAIN_MIN: std::time::Duration = std::time::Duration::from_secs(1);

/// What shutdown stops, in order, within `shutdown_grace`.
pub(super) struct Stopping {
    pub(super) deliverer: Arc<Deliverer>,
    pub(super) grace: std::time::Duration,
    pub(super) draining: Arc<AtomicBool>,
    pub(super) drain: Arc<DrainControl>,
    pub(super) stop_sched: watch::Sender<bool>,
    pub(super) stop_scheduler: Arc<watch::Sender<bool>>,
    pub(super) scheduler_task: JoinHandle<()>,
    pub(super) retention_task: JoinHandle<()>,
    pub(super) stop_http: watch::Sender<bool>,
    pub(super) http_tasks: Vec<JoinHandle<()>>,
    pub(super) socket_file: Option<SocketFile>,
    pub(super) store: Arc<Store>,
    pub(super) delivery_rt: DeliveryRuntime,
}

impl Stopping {
    pub(super) async fn run(self) {
        let d = &self.deliverer;
        tracing::info!(
            grace_ms = self.grace.as_millis() as u64,
            in_flight = d.in_flight_count(),
            "shutting down: draining"
        );
        // The whole stop is bounded by shutdown_grace (plus the store's close): a stalled
        // upload, a long retention sweep or a slow receiver cannot keep courier running.
        let deadline = tokio::time::Instant::now() + self.grace;
        self.draining.store(true, Ordering::SeqCst);
        // A drain under way stops here: what it has not handed off stays pending.
        self.drain.abort();
        let _ = self.stop_sched.send(true);
        let _ = self.stop_scheduler.send(true);
        let _ = self.scheduler_task.await;
        // A sweep stops at its next batch; one family's compaction cannot be cut short, so
        // the wait for it is bounded by the grace too (RocksDB finishes or drops it at close).
        let _ = tokio::time::timeout_at(deadline, self.retention_task).await;
        let cut = d
            .drain(deadline.saturating_duration_since(tokio::time::Instant::now()))
            .await;
        if cut > 0 {
            tracing::warn!(
                count = cut,
                "attempts still running at the end of shutdown_grace were cut off; they are retried after restart"
            );
        }
        let _ = self.stop_http.send(true);
        // The listeners let open requests finish until the deadline (at least a moment,
        // so answers already being written get out), then close what is left.
        let http_deadline = deadline.max(tokio::time::Instant::now() + HTTP_DRAIN_MIN);
        for task in self.http_tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout_at(http_deadline, task).await.is_err() {
                abort.abort();
            }
        }
        if let Some(file) = self.socket_file {
            file.remove();
        }
        let (s, d) = (self.store.clone(), self.deliverer.clone());
        let _ = tokio::task::spawn_blocking(move || {
            d.stop_writer();
            s.close()
        })
        .await;
        drop(self.delivery_rt);
        tracing::info!("stopped");
    }
}
