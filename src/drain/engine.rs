//! The forwarding pass: every eligible message of a store to the peer, at most
//! `concurrency` at once, each marked handed off only after the peer's 202 (and its
//! receipt, when `[drain] token` is set: [`answer::classify`]).
//!
//! Order of work: first each ordered line, walked by one task head first (hand the head
//! over, which makes the next one the head, and so on), so the peer accepts a line in its
//! order; then every other pending message, a page of ids at a time in acceptance order.
//! A message the peer refuses stays pending here (and, in a line, so does the rest of the
//! line behind it). A busy or unreachable peer is tried again with backoff
//! ([`answer::retry_delay`]) up to [`answer::MAX_TRIES`] times; a message that exhausts
//! them, a wrong token, or an answer that is not a courier's stops the pass: no new
//! forwards start, the ones running finish, and everything not handed off stays pending.
//!
//! Store calls run on blocking threads. Memory is bounded by `concurrency` payloads and
//! one page of ids.

use std::sync::Arc;

use tokio::task::JoinSet;

use super::answer::{self, PeerAnswer};
use super::eligible::{verdict, Verdict, Why};
use super::progress::{Progress, Refusal};
use super::request::{forward_request, PeerAddr};
use crate::clock::SharedClock;
use crate::metrics::Metrics;
use crate::model::State;
use crate::outbound::transport::Transport;
use crate::redact::url_for_log;
use crate::store::{HandOff, MessageRecord, Payload, Store, StoreError};

/// Ids read per page of the pending index.
const PAGE: usize = 512;
/// Walks over the store at most (more than one only when messages became open during the
/// drain, e.g. replayed): a replay loop cannot keep a drain going forever.
pub const MAX_PASSES: usize = 4;

/// Everything one pass needs.
pub struct Engine {
    /// The store whose messages go.
    pub store: Arc<Store>,
    /// How requests reach the peer.
    pub transport: Arc<dyn Transport>,
    /// The peer.
    pub peer: PeerAddr,
    /// Time, for the budget left and the waits between tries.
    pub clock: SharedClock,
    /// `courier_handed_off_total`.
    pub metrics: Arc<Metrics>,
    /// Messages forwarded at once (1 or more).
    pub concurrency: usize,
    /// What the pass has done so far.
    pub progress: Arc<Progress>,
}

/// Runs a store call on a blocking thread.
async fn blocking<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .unwrap_or_else(|e| Err(StoreError::Panicked(e.to_string())))
}

impl Engine {
    /// Forwards until nothing eligible is left. Returns whether it went to the end;
    /// otherwise `progress.error()` says why it stopped.
    ///
    /// One pass walks the ids in acceptance order, so a message that becomes open behind the
    /// cursor (a dead message replayed during the drain keeps its id; an ordered line gets a
    /// replayed member after its walk ended) is not met. Hence after each pass the store's
    /// open count is read again: while more are open than the pass refused or left, another
    /// pass runs, up to [`MAX_PASSES`]. What is still open then shows as remaining, and the
    /// drain is not complete.
    pub async fn run(self: Arc<Self>) -> bool {
        let total = match self.open().await {
            Some(open) => open,
            None => return false,
        };
        self.progress.begin(total, self.clock.now_ms());
        tracing::info!(to = %url_for_log(self.peer.url.as_str()), open = total, concurrency = self.concurrency,
            "drain: forwarding open messages to the peer");
        self.warn_of_paused().await;
        for pass in 1..=MAX_PASSES {
            if pass > 1 {
                self.progress.new_pass();
            }
            self.clone().pass().await;
            if self.progress.stopped() {
                return false;
            }
            let Some(open) = self.open().await else { return false };
            self.progress.recount(open);
            let stayed = self.progress.stayed();
            if open <= stayed {
                return true;
            }
            tracing::info!(
                pass,
                open,
                stayed,
                "drain: messages became open during the pass (replayed?); walking the store again"
            );
        }
        tracing::warn!(
            passes = MAX_PASSES,
            "drain: messages kept becoming open during the drain; what is still open stays here (drain again)"
        );
        true
    }

    /// The store's open count; `None` (and the drain failed) when the store fails.
    async fn open(&self) -> Option<u64> {
        match blocking(&self.store, |s| s.counts()).await {
            Ok(counts) => Some(counts.open),
            Err(e) => {
                self.store_failed(e);
                None
            }
        }
    }

    /// One walk over the store: every ordered line, then every other pending message.
    async fn pass(self: Arc<Self>) {
        let mut tasks = JoinSet::new();
        let lines = match blocking(&self.store, |s| s.line_endpoints()).await {
            Ok(lines) => lines,
            Err(e) => {
                self.store_failed(e);
                return;
            }
        };
        for endpoint in lines {
            let engine = self.clone();
            self.spawn(&mut tasks, async move { engine.line(endpoint).await }).await;
        }
        let mut after: Option<String> = None;
        while !self.progress.stopped() {
            let cursor = after.clone();
            let page = match blocking(&self.store, move |s| {
                s.ids_after(State::Pending, cursor.as_deref(), PAGE)
            })
            .await
            {
                Ok(page) => page,
                Err(e) => {
                    self.store_failed(e);
                    break;
                }
            };
            let Some(last) = page.last() else { break };
            after = Some(last.clone());
            for id in page {
                if self.progress.stopped() {
                    break;
                }
                let engine = self.clone();
                self.spawn(&mut tasks, async move { engine.one(id).await }).await;
            }
        }
        while let Some(done) = tasks.join_next().await {
            if let Err(e) = done {
                self.progress.fail(format!("a forwarding task failed: {e}"));
            }
        }
    }

    /// The peer does not know which endpoints are paused here: their held messages go, and
    /// the peer delivers them unless the endpoint is paused there too. Said once per endpoint.
    async fn warn_of_paused(&self) {
        let paused = blocking(&self.store, |s| {
            let mut out = Vec::new();
            for (endpoint, _) in s.paused_endpoints()? {
                let open = s.open_of_endpoint(&endpoint)?;
                if open > 0 {
                    out.push((endpoint, open));
                }
            }
            Ok(out)
        });
        for (endpoint, open) in paused.await.unwrap_or_default() {
            tracing::warn!(endpoint = %url_for_log(&endpoint), open,
                "drain: this endpoint is paused here; its messages are handed over too, and the peer delivers them unless it is paused there (courier endpoints pause)");
        }
    }

    /// Spawns `task` once fewer than `concurrency` run.
    async fn spawn(&self, tasks: &mut JoinSet<()>, task: impl std::future::Future<Output = ()> + Send + 'static) {
        while tasks.len() >= self.concurrency.max(1) {
            if let Some(Err(e)) = tasks.join_next().await {
                self.progress.fail(format!("a forwarding task failed: {e}"));
            }
        }
        tasks.spawn(task);
    }

    fn store_failed(&self, e: StoreError) -> bool {
        self.progress.fail(format!("the store failed: {e}"));
        false
    }

    /// The message, its payload and whether an attempt holds it; `None` when it is gone.
    async fn read(&self, id: String) -> Option<(MessageRecord, Payload, bool)> {
        let read = blocking(&self.store, move |s| {
            let leased = s.is_leased(&id);
            let Some(rec) = s.message(&id)? else { return Ok(None) };
            Ok(s.payload(&id)?.map(|payload| (rec, payload, leased)))
        });
        match read.await {
            Ok(found) => found,
            Err(e) => {
                self.store_failed(e);
                None
            }
        }
    }

    /// One unordered message (an ordered one is its line's).
    async fn one(self: Arc<Self>, id: String) {
        let Some((rec, payload, leased)) = self.read(id).await else {
            return;
        };
        match verdict(&rec, leased, false) {
            Verdict::Forward => {
                self.forward(rec, payload).await;
            }
            Verdict::Leave(Why::InFlight) => self.progress.left(1),
            Verdict::WithItsLine | Verdict::Leave(_) => {}
        }
    }

    /// An ordered line, head first, until it is empty or its head cannot go.
    async fn line(self: Arc<Self>, endpoint: String) {
        while !self.progress.stopped() {
            let key = endpoint.clone();
            let line = match blocking(&self.store, move |s| s.line(&key)).await {
                Ok(Some(line)) => line,
                Ok(None) => return,
                Err(e) => {
                    self.store_failed(e);
                    return;
                }
            };
            // The line's members behind the head stay with it if the head does not go.
            let behind = line.waiting;
            if line.blocked {
                tracing::warn!(endpoint = %url_for_log(&endpoint), waiting = behind, head = %line.head,
                    "drain: an ordered line is blocked behind a dead message; its messages stay here (resume the endpoint or replay the head, then drain again)");
                self.progress.left(behind);
                return;
            }
            let Some((rec, payload, leased)) = self.read(line.head).await else {
                return;
            };
            match verdict(&rec, leased, true) {
                Verdict::Forward => {
                    if !self.forward(rec, payload).await {
                        self.progress.left(behind);
                        return;
                    }
                }
                Verdict::Leave(Why::InFlight) => {
                    self.progress.left(1 + behind);
                    return;
                }
                Verdict::WithItsLine | Verdict::Leave(_) => return,
            }
        }
    }

    /// Forwards one message until the peer holds it, refuses it, or the pass stops; marks
    /// it handed off after the peer's 202. Returns whether it was handed off.
    async fn forward(&self, rec: MessageRecord, payload: Payload) -> bool {
        let req = match forward_request(&self.peer, &rec, payload, self.clock.now_ms()) {
            Ok(req) => req,
            Err(e) => {
                self.refused(&rec, 0, "unreadable_record", e.to_string());
                return false;
            }
        };
        let mut tries = 0;
        loop {
            if self.progress.stopped() {
                return false;
            }
            tries += 1;
            let result = self.transport.send(req.clone()).await;
            let receipt_key = self.peer.token.as_ref().map(|t| t.expose().as_bytes());
            match answer::classify(&rec.id, &rec.event_id, receipt_key, &result) {
                PeerAnswer::Accepted { peer_id, duplicate } => return self.handed_off(&rec, &peer_id, duplicate).await,
                PeerAnswer::Retry(why) if tries < answer::MAX_TRIES => {
                    tracing::debug!(delivery_id = %rec.id, tries, error = %why, "drain: the peer is busy; trying again");
                    let wait = answer::retry_delay(tries, &mut crate::clock::rng());
                    self.clock
                        .sleep_until(self.clock.now_ms() + wait.as_millis() as u64)
                        .await;
                }
                PeerAnswer::Retry(why) => {
                    self.progress
                        .fail(format!("the peer did not take {} after {tries} tries: {why}", rec.id));
                    return false;
                }
                PeerAnswer::Refused { status, code, message } => {
                    self.refused(&rec, status, &code, message);
                    return false;
                }
                PeerAnswer::Stop(why) => {
                    self.progress.fail(why);
                    return false;
                }
            }
        }
    }

    async fn handed_off(&self, rec: &MessageRecord, peer_id: &str, duplicate: bool) -> bool {
        let (id, now) = (rec.id.clone(), self.clock.now_ms());
        match blocking(&self.store, move |s| s.hand_off(&id, now)).await {
            Ok(HandOff::Done) => {
                self.metrics.handed_off();
                self.progress.handed_off(duplicate);
                tracing::debug!(delivery_id = %rec.id, event_id = %rec.event_id, peer_delivery_id = peer_id, duplicate, "drain: handed off");
                true
            }
            Ok(other) => {
                // The peer has it and will deliver it; here it moved on meanwhile (deleted, or
                // an attempt took it): at-least-once either way.
                tracing::warn!(delivery_id = %rec.id, now = ?other, "drain: the peer took a message that changed here meanwhile");
                self.progress.left(1);
                false
            }
            Err(e) => self.store_failed(e),
        }
    }

    fn refused(&self, rec: &MessageRecord, status: u16, code: &str, message: String) {
        tracing::warn!(delivery_id = %rec.id, event_id = %rec.event_id, status, code, message = %message,
            "drain: the peer refused a message; it stays pending here");
        self.progress.refused(Refusal {
            seq: 0,
            id: rec.id.clone(),
            event_id: rec.event_id.clone(),
            status,
            code: code.to_string(),
            message,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::clock::ManualClock;
    use crate::model::DeadReason;
    use crate::outbound::transport::{InboundResponse, OutboundRequest, SendFuture};
    use crate::store::tests::{claim, message};
    use crate::store::{AttemptRecord, StoreOptions, Transition};

    /// A courier peer that takes everything, and on its first forward replays a dead
    /// message here: an operator's `deliveries retry` racing the drain, made deterministic.
    struct ReplayingPeer {
        store: Arc<Store>,
        replay: Mutex<Option<String>>,
        events: Mutex<Vec<String>>,
    }

    impl Transport for ReplayingPeer {
        fn send(&self, req: OutboundRequest) -> SendFuture<'_> {
            Box::pin(async move {
                let event = req
                    .headers
                    .iter()
                    .find(|(k, _)| k == "webhook-id")
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default();
                self.events.lock().unwrap().push(event.clone());
                if let Some(id) = self.replay.lock().unwrap().take() {
                    assert_eq!(self.store.replay(&id, 500, |_| 100_000).unwrap(), Some(true));
                }
                let body = serde_json::json!({"id": format!("peer_{event}"), "event_id": event});
                Ok(InboundResponse {
                    status: 202,
                    retry_after: None,
                    body: serde_json::to_vec(&body).unwrap().into(),
                    receipt: None,
                })
            })
        }
    }

    #[tokio::test]
    async fn a_message_replayed_behind_the_cursor_is_handed_off_by_another_pass() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("data"), StoreOptions::default()).unwrap());
        // dlv_a sorts first and is dead when the pass starts; dlv_b is pending.
        store.accept(message("dlv_a", "evt_a", 100)).await.unwrap();
        store.accept(message("dlv_b", "evt_b", 100)).await.unwrap();
        claim(&store, "dlv_a");
        let attempt = AttemptRecord {
            at_ms: 150,
            status: Some(410),
            error: None,
            duration_ms: 3,
            policy_revision: None,
            span_id: None,
        };
        let dead = Transition::Dead(DeadReason::PermanentStatus);
        store.finish_attempt("dlv_a", &attempt, dead, 150).unwrap();
        let peer = Arc::new(ReplayingPeer {
            store: store.clone(),
            replay: Mutex::new(Some("dlv_a".into())),
            events: Mutex::new(Vec::new()),
        });
        let progress = Arc::new(Progress::default());
        let engine = Arc::new(Engine {
            store: store.clone(),
            transport: peer.clone(),
            peer: PeerAddr {
                url: "http://tier:8787/".parse().unwrap(),
                token: None,
                timeout: std::time::Duration::from_secs(5),
            },
            clock: ManualClock::new(1_000),
            metrics: Arc::new(Metrics::default()),
            concurrency: 1,
            progress: progress.clone(),
        });
        assert!(engine.run().await);
        assert_eq!(
            *peer.events.lock().unwrap(),
            ["evt_b", "evt_a"],
            "the replayed one in a second pass"
        );
        assert_eq!(store.message("dlv_a").unwrap().unwrap().state, State::HandedOff);
        assert_eq!(store.counts().unwrap().open, 0);
        let status = progress.status(super::super::progress::Phase::Done, None, 1_000);
        assert_eq!((status.total, status.handed_off, status.remaining), (2, 2, 0));
        assert!(status.complete());
    }
}
