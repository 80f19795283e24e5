//! The load harness of the crash tests (`chaos`: SIGKILLs, `power_loss`: power cuts): a
//! receiver that tallies the event ids it took, senders that post numbered messages to
//! courier's current ingress and record the ones it acknowledged, and the check after the
//! last restart that none of those is lost.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinHandle;

use super::{Receiver, Reply};

/// Senders posting at once.
pub const SENDERS: usize = 4;
/// Most attempts courier runs at once against the one receiver host.
pub const MAX_IN_FLIGHT: usize = 32;

/// A number the test (not courier) reads from the environment, `default` when unset.
pub fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}")),
        Err(_) => default,
    }
}

/// The random schedule's seed: `name` from the environment (a replay), else the time.
pub fn seed(name: &str) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    env_number(name, now.as_millis() as u64)
}

/// courier's config under load: retries from `base_delay` to `max_delay` with full jitter,
/// never given up during the test, [`MAX_IN_FLIGHT`] attempts at once to the receiver.
pub fn config(base_delay: &str, max_delay: &str) -> String {
    format!(
        "[retry]\nbase_delay = \"{base_delay}\"\nmax_delay = \"{max_delay}\"\njitter = \"full\"\nmax_attempts = 1000\n\
         give_up_after = \"1h\"\n[delivery]\nmax_in_flight_per_host = {MAX_IN_FLIGHT}\nrate_per_second = 10000\n"
    )
}

/// `config` with payloads sealed at rest: a new store key file in `dir`, listed in
/// `[store]`. The chaos and power-loss runs seal, so what they prove holds with sealing on.
pub fn sealed(dir: &std::path::Path, config: &str) -> String {
    use base64::Engine as _;
    use std::os::unix::fs::OpenOptionsExt;
    let key: [u8; 32] = rand::random();
    let path = dir.join("store.key");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(
        &mut file,
        base64::engine::general_purpose::STANDARD.encode(key).as_bytes(),
    )
    .unwrap();
    format!("{config}[store]\nencryption_key_files = [\"{}\"]\n", path.display())
}

/// The plain HTTP client the senders post with.
pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// A new [`HttpClient`].
pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Posts one message; its delivery id when courier answered 202, else the status (`None`
/// when the connection failed or no answer came: courier was being killed).
pub async fn send(client: &HttpClient, url: &str, event_id: &str) -> Result<String, Option<u16>> {
    let req = hyper::Request::post(url)
        .header("webhook-id", event_id)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!("{{\"id\":\"{event_id}\"}}"))))
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), client.request(req)).await {
        Ok(Ok(resp)) if resp.status() == 202 => {
            let id = resp.headers()["courier-delivery-id"].to_str().unwrap().to_string();
            let _ = resp.into_body().collect().await;
            Ok(id)
        }
        Ok(Ok(resp)) => Err(Some(resp.status().as_u16())),
        _ => Err(None),
    }
}

/// The receiver under load: answers as its `mood` says until [`Tally::calm_down`], then
/// only 200, and counts the 2xx answers it gave per event id.
pub struct Tally {
    /// The receiver itself.
    pub rx: Receiver,
    delivered: Arc<Mutex<HashMap<String, usize>>>,
    /// When each request answered 2xx arrived, and its event id.
    arrivals: Arc<Mutex<Vec<(Instant, String)>>>,
    calm: Arc<AtomicBool>,
    /// Signalled at each 2xx answer (a permit is kept when no one waits: none is lost).
    arrived: Arc<tokio::sync::Notify>,
}

impl Tally {
    /// Starts the receiver; `mood` answers each message (by its event id) while not calm.
    pub async fn start(mood: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Tally {
        let delivered: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let arrivals: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        let calm = Arc::new(AtomicBool::new(false));
        let arrived = Arc::new(tokio::sync::Notify::new());
        let (tally, times, quiet, ring) = (delivered.clone(), arrivals.clone(), calm.clone(), arrived.clone());
        let rx = Receiver::scripted(move |_, seen| {
            let Some(id) = seen.header("webhook-id") else {
                return Reply::status(400);
            };
            let reply = if quiet.load(Ordering::SeqCst) {
                Reply::status(200)
            } else {
                mood(&id)
            };
            if (200..300).contains(&reply.status) {
                times.lock().unwrap().push((seen.at, id.clone()));
                *tally.lock().unwrap().entry(id).or_default() += 1;
                ring.notify_one();
            }
            reply
        })
        .await;
        Tally {
            rx,
            delivered,
            arrivals,
            calm,
            arrived,
        }
    }

    /// The 2xx answers given so far, per event id.
    pub fn delivered(&self) -> HashMap<String, usize> {
        self.delivered.lock().unwrap().clone()
    }

    /// Every request answered 2xx so far: when it arrived, and its event id.
    pub fn arrivals(&self) -> Vec<(Instant, String)> {
        self.arrivals.lock().unwrap().clone()
    }

    /// Calms the receiver down and waits up to `limit` for every acknowledged message:
    /// the ones that never arrived.
    pub async fn calm_down(&self, acked: &[Acked], limit: Duration) -> Vec<Acked> {
        self.calm.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + limit;
        loop {
            let missing: Vec<Acked> = {
                let got = self.delivered.lock().unwrap();
                acked.iter().filter(|(id, _)| !got.contains_key(id)).cloned().collect()
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if missing.is_empty() || left.is_zero() {
                return missing;
            }
            // Looks again at the next delivery (or at the deadline, to say what is missing).
            let _ = tokio::time::timeout(left, self.arrived.notified()).await;
        }
    }

    /// Deliveries of acknowledged messages beyond the first of each, and how many messages
    /// arrived that courier never acknowledged.
    pub fn duplicates(&self, acked: &[Acked]) -> (usize, usize) {
        let got = self.delivered();
        let duplicates = acked
            .iter()
            .map(|(id, _)| got.get(id).copied().unwrap_or(0).saturating_sub(1))
            .sum();
        let acked: HashSet<&String> = acked.iter().map(|(id, _)| id).collect();
        (duplicates, got.keys().filter(|id| !acked.contains(id)).count())
    }
}

/// An acknowledged message: (event id, delivery id).
pub type Acked = (String, String);

/// The answers other than 202 the senders got, by status (`None`: no answer).
pub type NotAcked = HashMap<Option<u16>, usize>;

/// [`SENDERS`] senders, each posting event ids `<tag>-<sender>-<n>` for the receiver's
/// `/s<sender>` to courier's current ingress, recording the acknowledged ones.
pub struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
    /// Per 202: when its request was sent, and when the 202 came.
    stamps: Arc<Mutex<Vec<(Instant, Instant)>>>,
    ingress: Arc<Mutex<SocketAddr>>,
    senders: Vec<JoinHandle<NotAcked>>,
}

impl Load {
    /// Starts the senders. Between posts each pauses `answered` ms, or `down` ms when no
    /// answer came (load shaping, not synchronisation: a longer pause while courier is down
    /// lets its restart have the cores rather than refused connections).
    pub fn start(ingress: SocketAddr, rx: &Receiver, tag: &str, (answered, down): (u64, u64)) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
        let stamps: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
        let ingress = Arc::new(Mutex::new(ingress));
        let mut senders = Vec::new();
        for s in 0..SENDERS {
            let (stop, acked, ingress) = (stop.clone(), acked.clone(), ingress.clone());
            let stamps = stamps.clone();
            let (target, tag) = (rx.url(&format!("/s{s}")), tag.to_string());
            senders.push(tokio::spawn(async move {
                let client = client();
                let mut other = NotAcked::new();
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let addr: SocketAddr = *ingress.lock().unwrap();
                    let id = format!("{tag}-{s}-{n}");
                    n += 1;
                    let sent = Instant::now();
                    let pause = match send(&client, &format!("http://{addr}/{target}"), &id).await {
                        Ok(delivery) => {
                            stamps.lock().unwrap().push((sent, Instant::now()));
                            acked.lock().unwrap().push((id, delivery));
                            answered
                        }
                        Err(status) => {
                            *other.entry(status).or_default() += 1;
                            if status.is_some() {
                                answered
                            } else {
                                down
                            }
                        }
                    };
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                other
            }));
        }
        Load {
            stop,
            acked,
            stamps,
            ingress,
            senders,
        }
    }

    /// courier restarted: its ingress is now `addr`.
    pub fn moved(&self, addr: SocketAddr) {
        *self.ingress.lock().unwrap() = addr;
    }

    /// Per 202 so far: when its request was sent, and when the 202 came.
    pub fn stamps(&self) -> Vec<(Instant, Instant)> {
        self.stamps.lock().unwrap().clone()
    }

    /// Stops the senders: the acknowledged messages, and the other answers.
    pub async fn stop(self) -> (Vec<Acked>, NotAcked) {
        self.stop.store(true, Ordering::SeqCst);
        let mut refused = NotAcked::new();
        for s in self.senders {
            for (k, v) in s.await.unwrap() {
                *refused.entry(k).or_default() += v;
            }
        }
        let acked = self.acked.lock().unwrap().clone();
        (acked, refused)
    }
}
