//! The one forwarding pass both a running courier's drain and the offline verb run
//! ([`forward`]): every eligible message of a store to the peer, at most `concurrency` at
//! once, each marked handed off only after the peer's 202 (and its receipt, when `[drain]
//! token` is set: [`answer::classify`]).
//!
//! What goes: every open message no attempt holds — pending (due now or later), held by a
//! paused endpoint, or waiting in an ordered line. A message whose attempt is running stays
//! (its result decides; counted as left), and so do dead letters: a dead message is not owed
//! another attempt, and its record is what an operator replays from (replay it first).
//!
//! Order of work: first each ordered line, walked by one task head first (hand the head
//! over, which makes the next one the head, and so on), so the peer accepts a line in its
//! order; then every other pending message, a page of ids at a time in acceptance order.
//! A message the peer refuses stays pending here (and, in a line, so does the rest of the
//! line behind it). A busy or unreachable peer is tried again with backoff
//! ([`answer::RETRY`]) up to [`answer::MAX_TRIES`] times; a message that exhausts
//! them, a wrong token, or an answer that is not a courier's stops the pass: no new
//! forwards start, the ones running finish, and everything not handed off stays pending.
//!
//! Store calls run on blocking threads. Memory is bounded by `concurrency` payloads and
//! one page of ids.

use std::sync::Arc;

use tokio::task::JoinSet;

use super::answer::{self, PeerAnswer};
use super::plan::DrainPlan;
use super::progress::{Phase, Progress, Refusal};
use super::request::{forward_request, PeerAddr};
use crate::clock::SharedClock;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::model::{Jitter, State};
use crate::outbound::client::HttpTransport;
use crate::outbound::resolver::SystemResolver;
use crate::outbound::tls::TlsMaterial;
use crate::outbound::transport::Transport;
use crate::redact::url_for_log;
use crate::store::{HandOff, MessageRecord, Payload, Store, StoreError};

/// Ids read per page of the pending index.
const PAGE: usize = 512;
/// Walks over the store at most (more than one only when messages became open during the
/// drain, e.g. replayed): a replay loop cannot keep a drain going forever.
pub const MAX_PASSES: usize = 4;
/// Most of a peer's answer kept (its JSON is a few hundred bytes).
const PEER_ANSWER_BYTES: u64 = 16 << 10;

/// Forwards `store`'s open messages as `plan` says, with `progress` showing it: from
/// [`Phase::Forwarding`] to `Done`, or `Failed` with the reason. Returns whether it went
/// to the end.
pub async fn forward(
    store: Arc<Store>,
    config: Arc<Config>,
    plan: DrainPlan,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    progress: Arc<Progress>,
) -> bool {
    progress.set(Phase::Forwarding);
    let peer = PeerAddr {
        url: plan.to,
        token: config.drain.token.clone(),
        timeout: config.delivery.request_timeout,
    };
    let alert_url = config.alert_url.clone();
    // Reading the PEM files must not stall an async worker (a running courier's ingress
    // and admin API share them).
    let (concurrency, listed) = (plan.concurrency, plan.listed);
    let transport = tokio::task::spawn_blocking(move || peer_transport(&config, concurrency, listed)).await;
    let ok = match transport.unwrap_or_else(|e| Err(e.to_string())) {
        Ok(transport) => {
            let engine = Engine {
                store,
                transport,
                peer,
                alert_url,
                clock,
                metrics,
                concurrency: concurrency as usize,
                progress: progress.clone(),
            };
            Arc::new(engine).run().await
        }
        Err(e) => {
            progress.fail(format!("cannot make the peer client: {e}"));
            false
        }
    };
    progress.set(if ok { Phase::Done } else { Phase::Failed });
    ok
}

/// The HTTP client for the peer: courier's own, with a pool as large as the forwards
/// running at once, the TLS trust of `[tls]` (a tier behind https with a private CA), and
/// never the egress proxy (the tier is the operator's own). A `listed` peer is the
/// operator's explicit choice, typically on a private address: the egress policy is open
/// for it; any other (the offline verb's `--to`) is under `[egress]`, as a delivery is.
fn peer_transport(config: &Config, concurrency: u32, listed: bool) -> Result<Arc<dyn Transport>, String> {
    let tls = TlsMaterial::from_config(config).map_err(|e| e.to_string())?;
    let mut peer = config.clone();
    peer.egress.proxy = None;
    peer.egress.allow_private_targets |= listed;
    peer.delivery.max_response_body = PEER_ANSWER_BYTES;
    peer.delivery.max_in_flight_per_host = concurrency;
    peer.delivery.max_idle_connections = concurrency;
    Ok(Arc::new(HttpTransport::new(&peer, Arc::new(SystemResolver), tls)))
}

/// Whether `rec` goes: `Some(true)` now, `Some(false)` not while an attempt holds it
/// (`leased`: the scheduler claimed it), `None` never (dead, or finished).
fn goes(rec: &MessageRecord, leased: bool) -> Option<bool> {
    match rec.state {
        State::InFlight => Some(false),
        State::Pending => Some(!leased),
        State::Dead | State::Delivered | State::HandedOff => None,
    }
}

/// Everything one pass needs.
struct Engine {
    store: Arc<Store>,
    transport: Arc<dyn Transport>,
    peer: PeerAddr,
    /// What an alert's stored reference resolves to (see `delivery::alert`).
    alert_url: Option<url::Url>,
    /// Time, for the budget left and the waits between tries.
    clock: SharedClock,
    /// `courier_handed_off_total`.
    metrics: Arc<Metrics>,
    concurrency: usize,
    progress: Arc<Progress>,
}

impl Engine {
    /// Forwards until nothing eligible is left. Returns whether it went to the end;
    /// otherwise the progress says why it stopped.
    ///
    /// One pass walks the ids in acceptance order, so a message that becomes open behind the
    /// cursor (a dead message replayed during the drain keeps its id; an ordered line gets a
    /// replayed member after its walk ended) is not met. Hence after each pass the store's
    /// open count is read again: while more are open than the pass refused or left, another
    /// pass runs, up to [`MAX_PASSES`]. What is still open then shows as remaining, and the
    /// drain is not complete.
    async fn run(self: Arc<Self>) -> bool {
        let Some(total) = self.store(|s| s.counts()).await else {
            return false;
        };
        self.progress.begin(total.open, self.clock.now_ms());
        tracing::info!(to = %url_for_log(self.peer.url.as_str()), open = total.open, concurrency = self.concurrency,
            "drain: forwarding open messages to the peer");
        self.warn_of_paused().await;
        for pass in 1..=MAX_PASSES {
            if pass > 1 {
                // It meets again what the last one refused or left: those counts start over.
                self.progress.update(|s| (s.refused, s.left) = (0, 0));
            }
            self.clone().pass().await;
            if self.progress.stopped() {
                return false;
            }
            let Some(counts) = self.store(|s| s.counts()).await else {
                return false;
            };
            let open = counts.open;
            // The total becomes what was handed off plus what is open here, so a message
            // that became open during the drain counts.
            let stayed = self.progress.update(|s| {
                s.total = s.handed_off + open;
                s.refused + s.left
            });
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

    /// A store call on a blocking thread.
    async fn try_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .unwrap_or_else(|e| Err(StoreError::Panicked(e.to_string())))
    }

    /// [`Engine::try_store`]; `None`, and the drain stops, when the store fails.
    async fn store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Option<T> {
        let result = self.try_store(f).await;
        result
            .map_err(|e| self.progress.fail(format!("the store failed: {e}")))
            .ok()
    }

    /// One walk over the store: every ordered line, then every other pending message.
    async fn pass(self: Arc<Self>) {
        let mut tasks = JoinSet::new();
        let Some(lines) = self.store(|s| s.line_endpoints()).await else {
            return;
        };
        for endpoint in lines {
            let engine = self.clone();
            self.spawn(&mut tasks, async move { engine.line(endpoint).await }).await;
        }
        let mut after: Option<String> = None;
        while !self.progress.stopped() {
            let cursor = after.take();
            let page = self.store(move |s| s.ids_after(State::Pending, cursor.as_deref(), PAGE));
            let Some(page) = page.await else { break };
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
        let paused = self.try_store(|s| {
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

    /// The message, its payload and whether an attempt holds it; `None` when it is gone.
    async fn read(&self, id: String) -> Option<(MessageRecord, Payload, bool)> {
        let read = self.store(move |s| {
            let leased = s.is_leased(&id);
            let Some(rec) = s.message(&id)? else { return Ok(None) };
            Ok(s.payload(&id)?.map(|payload| (rec, payload, leased)))
        });
        read.await.flatten()
    }

    /// One unordered message (an ordered one goes with its line, head first).
    async fn one(self: Arc<Self>, id: String) {
        let Some((rec, payload, leased)) = self.read(id).await else {
            return;
        };
        match goes(&rec, leased) {
            Some(false) => self.progress.update(|s| s.left += 1),
            Some(true) if rec.fifo.is_none() => {
                self.forward(rec, payload).await;
            }
            _ => {}
        }
    }

    /// An ordered line, head first, until it is empty or its head cannot go.
    async fn line(self: Arc<Self>, endpoint: String) {
        while !self.progress.stopped() {
            let key = endpoint.clone();
            let Some(Some(line)) = self.store(move |s| s.line(&key)).await else {
                return;
            };
            // The line's members behind the head stay with it if the head does not go.
            let behind = line.waiting;
            if line.blocked {
                tracing::warn!(endpoint = %url_for_log(&endpoint), waiting = behind, head = %line.head,
                    "drain: an ordered line is blocked behind a dead message; its messages stay here (resume the endpoint or replay the head, then drain again)");
                return self.progress.update(|s| s.left += behind);
            }
            let Some((rec, payload, leased)) = self.read(line.head).await else {
                return;
            };
            let handed_off = match goes(&rec, leased) {
                Some(true) => self.forward(rec, payload).await,
                Some(false) => return self.progress.update(|s| s.left += 1 + behind),
                None => return,
            };
            if !handed_off {
                return self.progress.update(|s| s.left += behind);
            }
        }
    }

    /// Forwards one message until the peer holds it, refuses it, or the pass stops; marks
    /// it handed off after the peer's 202. Returns whether it was handed off.
    async fn forward(&self, mut rec: MessageRecord, payload: Payload) -> bool {
        // An alert goes with the URL its reference names (the peer stores it by reference
        // again when that is its alert_url too).
        match crate::delivery::alert::target_url(&rec.target, self.alert_url.as_ref()) {
            Ok(url) => rec.target = url.to_string(),
            Err(e) => return self.refused_here(&rec, e.code(), e.to_string()),
        }
        let req = match forward_request(&self.peer, &rec, payload, self.clock.now_ms()) {
            Ok(req) => req,
            Err(message) => return self.refused_here(&rec, "unreadable_record", message),
        };
        let receipt_key = self.peer.token.as_ref().map(|t| t.expose().as_bytes());
        for tries in 1.. {
            if self.progress.stopped() {
                break;
            }
            let result = self.transport.send(req.clone()).await;
            match answer::classify(&rec.id, &rec.event_id, receipt_key, &result) {
                PeerAnswer::Accepted { peer_id, duplicate } => return self.handed_off(&rec, &peer_id, duplicate).await,
                PeerAnswer::Retry(why) if tries < answer::MAX_TRIES => {
                    tracing::debug!(delivery_id = %rec.id, tries, error = %why, "drain: the peer is busy; trying again");
                    let wait = answer::RETRY.delay(tries, Jitter::Equal, &mut crate::clock::rng());
                    self.clock
                        .sleep_until(self.clock.now_ms() + wait.as_millis() as u64)
                        .await;
                }
                PeerAnswer::Retry(why) => {
                    let why = format!("the peer did not take {} after {tries} tries: {why}", rec.id);
                    self.progress.fail(why);
                    break;
                }
                PeerAnswer::Refused(refusal) => return self.refused(refusal),
                PeerAnswer::Stop(why) => {
                    self.progress.fail(why);
                    break;
                }
            }
        }
        false
    }

    async fn handed_off(&self, rec: &MessageRecord, peer_id: &str, duplicate: bool) -> bool {
        let (id, now) = (rec.id.clone(), self.clock.now_ms());
        match self.store(move |s| s.hand_off(&id, now)).await {
            Some(HandOff::Done) => {
                self.metrics.handed_off();
                self.progress.update(|s| {
                    s.handed_off += 1;
                    s.already_at_peer += u64::from(duplicate);
                });
                tracing::debug!(delivery_id = %rec.id, event_id = %rec.event_id, peer_delivery_id = peer_id, duplicate, "drain: handed off");
                true
            }
            Some(other) => {
                // The peer has it and will deliver it; here it moved on meanwhile (deleted, or
                // an attempt took it): at-least-once either way.
                tracing::warn!(delivery_id = %rec.id, now = ?other, "drain: the peer took a message that changed here meanwhile");
                self.progress.update(|s| s.left += 1);
                false
            }
            None => false,
        }
    }

    /// Counts a message that cannot be sent as it is (it stays pending here); always `false`.
    fn refused_here(&self, rec: &MessageRecord, code: &str, message: String) -> bool {
        self.refused(Refusal {
            seq: 0,
            id: rec.id.clone(),
            event_id: rec.event_id.clone(),
            status: 0,
            code: code.into(),
            message,
        })
    }

    /// Counts a message the peer refused (it stays pending here); always `false`.
    fn refused(&self, r: Refusal) -> bool {
        tracing::warn!(delivery_id = %r.id, event_id = %r.event_id, status = r.status, code = r.code.as_str(),
            message = %r.message, "drain: the peer refused a message; it stays pending here");
        self.progress.refused(r);
        false
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

    #[test]
    fn open_messages_no_attempt_holds_go_and_dead_letters_stay() {
        let mut rec = message("dlv_1", "evt_1", 1).record;
        let cases = [
            // (state, leased) → goes
            (State::Pending, false, Some(true)),
            (State::Pending, true, Some(false)),
            (State::InFlight, false, Some(false)),
            (State::Dead, false, None),
            (State::Delivered, false, None),
            (State::HandedOff, false, None),
        ];
        for (state, leased, want) in cases {
            rec.state = state;
            assert_eq!(goes(&rec, leased), want, "{state:?} leased {leased}");
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
            alert_url: None,
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
        progress.set(Phase::Done);
        let status = progress.status(1_000);
        assert_eq!((status.total, status.handed_off, status.remaining), (2, 2, 0));
        assert!(status.complete());
    }
}
