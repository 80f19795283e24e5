//! One simulated run: the real store, store writer, scheduler loop, delivery workers,
//! endpoint table, operator actions and retention, on a [`ManualClock`] and the
//! simulated receivers, driven step by step from one seeded RNG.
//!
//! Determinism: nothing runs beside the simulation. The node's runtime is a current-thread
//! runtime with tokio's time paused, driven only while the simulator waits for a step to
//! settle ([`World::run_until`]); the store writer is stepped
//! batchers run between its polls; blocking calls (a pass, a release, a resume's pages)
//! run inline on the simulator's thread; receivers answer from the seeded RNG.
//!
//! A crash drops the runtime (every attempt task with it), the delivery context and the
//! store without any shutdown code running, then reopens the same data dir and runs the
//! same recovery as `app::start`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::receiver::SimTransport;
use crate::batcher::stepped::Step;
use crate::clock::{Clock, ManualClock};
use crate::config::Config;
use crate::delivery::Deliverer;
use crate::envelope::Envelope;
use crate::metrics::Metrics;
use crate::model::{Jitter, State};
use crate::scheduler::{Asleep, Limits, LoopEvent, Nap, Scheduler, Walks};
use crate::store::{Accepted, HandOff, ItemFault, ListFilter, SigningChoice, Store, StoreError, StoreOptions};

/// Whether `id` is stored (read past any broken item: the simulator's own look).
fn store_has(store: &Store, id: &str) -> bool {
    store.quietly(|| store.message(id).ok().flatten().is_some())
}

/// Most messages broken at once: fewer than the attempt permits, so what a broken message
/// holds never holds up the rest.
const BROKEN_MAX: usize = 2;

/// The endpoints of a run: two on one host (its cap is shared), one on another, and one
/// ordered endpoint on each host (`on_dead = "skip"` on h1, `"block"` on h2).
pub const TARGETS: [&str; 5] = [
    "https://h1.sim/a",
    "https://h1.sim/b",
    "https://h2.sim/c",
    "https://h1.sim/fifo",
    "https://h2.sim/fifo-block",
];
/// The ordered endpoints among [`TARGETS`], with what their dead heads do.
pub const ORDERED: [(&str, crate::model::OnDead); 2] = [
    ("https://h1.sim/fifo", crate::model::OnDead::Skip),
    ("https://h2.sim/fifo-block", crate::model::OnDead::Block),
];
const T0: u64 = 1_750_000_000_000;
/// One seed in this many is a large run.
pub const LARGE_EVERY: u64 = 25;

/// What the simulator knows must be true.
#[derive(Debug, Default)]
pub struct Model {
    /// Every message acknowledged (202) and not deleted: id → (event id, target, body).
    pub acked: BTreeMap<String, (String, String, Vec<u8>)>,
    /// (event id, target) → id, for duplicates.
    pub by_event: BTreeMap<(String, String), String>,
    /// Ids an operator deleted → (event id, target): an attempt under way may still end.
    pub deleted: BTreeMap<String, (String, String)>,
    /// Ids seen finished (delivered or dead) in the store: retention may remove them.
    pub finished: BTreeSet<String>,
    /// Per event id: attempts cut by a crash or a shutdown (in flight then).
    pub cut: BTreeMap<String, u32>,
    /// Handed off (`courier drain`), by event id: how many attempts the receivers had seen
    /// then. The peer delivers them now; none may be attempted here again.
    pub handed_off: BTreeMap<String, usize>,
    /// Deleted by an operator, by event id: how many attempts the receivers had seen then.
    /// An attempt already under way may finish; none may start after.
    pub deleted_events: BTreeMap<String, usize>,
    next_event: u64,
}

struct Node {
    rt: tokio::runtime::Runtime,
    store: Arc<Store>,
    d: Arc<Deliverer>,
    /// The store writer's batcher, run as steps of the simulation
    /// (see [`World::run_until`]).
    steppers: Vec<Arc<dyn Step>>,
    /// Draws how many queued jobs each batch takes, so batch boundaries come from the seed.
    batches: std::cell::RefCell<StdRng>,
    /// Whether the scheduler's loop is asleep, until when, and from where it walks next.
    nap: Nap,
    /// The loop's walks and sleeps since the last check (see [`World::owed_kept`]).
    walks: Walks,
    /// Stops the scheduler's loop (a graceful stop).
    stop: tokio::sync::watch::Sender<bool>,
}

impl Node {
    /// Runs every stepper once, each batch as large as the seed says; how many jobs ran.
    fn step_batchers(&self) -> usize {
        let mut moved = 0;
        for s in &self.steppers {
            if s.queued() > 0 {
                let max = match self.batches.borrow_mut().random_range(0..4) {
                    0 => 1,
                    1 => 2,
                    _ => usize::MAX,
                };
                moved += s.step(max);
            }
        }
        moved
    }

    /// Whether a stepper has jobs queued.
    fn batches_waiting(&self) -> bool {
        self.steppers.iter().any(|s| s.queued() > 0)
    }

    /// The loop's sleep, if it is asleep with no wake-up pending (see `scheduler::Nap`).
    pub fn asleep(&self) -> Option<Asleep> {
        let nap = self.nap.lock().unwrap_or_else(|p| p.into_inner()).clone();
        nap.filter(|a| a.wakes == self.d.context().wake_signal().rung())
    }
}

/// Every record in `state`, page by page.
fn records_in(store: &Arc<Store>, state: State) -> Vec<crate::store::MessageRecord> {
    let filter = ListFilter {
        state: Some(state),
        ..ListFilter::default()
    };
    let mut out = Vec::new();
    let mut cursor = None;
    store.quietly(|| loop {
        let page = store.list(&filter, 1000, cursor.as_deref()).expect("list");
        out.extend(page.items);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    })
}

/// Drops the old node's store once this is its last handle, so RocksDB closes here,
/// before the next open. Threads that outlive a runtime shut down in the background (the
/// store writer writing the results still queued, a scheduler pass on a blocking thread)
/// hold it a moment longer; an open racing their close could fail on RocksDB's own files
/// (the info log it rotates), not on its lock, which the opener waits for.
fn let_go(store: Arc<Store>) {
    for _ in 0..30_000 {
        if Arc::strong_count(&store) == 1 {
            return drop(store);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("the old node's store was never let go: something holds it for ever");
}

/// One wait for attempts to move on: first by yielding (the other tasks, and the result
/// writer's thread, usually finish within microseconds), then a millisecond at a time
/// (an attempt that waits on a timer).
async fn pause(spins: &mut u32) {
    *spins += 1;
    if *spins < 200 {
        tokio::task::yield_now().await;
        std::thread::yield_now();
    } else {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Where an armed crash lands: after this many more writes, or record reads.
#[derive(Debug, Clone, Copy)]
pub enum CrashAt {
    /// At the write after this many.
    Write(usize),
    /// At the record read after this many.
    Read(usize),
}

/// A simulated courier and its receivers.
pub struct World {
    /// The run's randomness (workload and faults).
    pub rng: StdRng,
    _dir: tempfile::TempDir,
    data: PathBuf,
    /// The clock every component reads.
    pub clock: Arc<ManualClock>,
    /// The receivers.
    pub rx: Arc<SimTransport>,
    config: Arc<Config>,
    node: Option<Node>,
    /// What must be true.
    pub model: Model,
    /// What happened, one line per step (printed when an invariant breaks).
    pub trace: Vec<String>,
    /// Messages whose reads fail now: (id, how, the step that heals it).
    pub broken: Vec<(String, ItemFault, usize)>,
    /// How much one pass may do: courier's limits, or small ones so a few dozen messages
    /// reach the long-backlog paths.
    pub limits: Limits,
    /// A large run: thousands of messages against courier's own limits.
    pub large: bool,
    /// Passes that stopped on a long blocked run and left a resume point.
    pub resume_points: usize,
    /// The store keys of the next start, the sealing one first (see `start_node`).
    store_keys: Vec<[u8; 32]>,
    /// Starts so far.
    starts: u32,
    /// A store fault is armed (see [`World::store_fault`]): an I/O error is no bug.
    faulting: bool,
    /// Per start, how many attempts the receivers had seen then: a new process starts with
    /// full token buckets.
    pub started_at_log: Vec<usize>,
    /// How far courier's time went back at restarts, added up: a restart reads the wall
    /// clock afresh, held only at the newest acceptance the store holds, so what a step back
    /// still being absorbed had scheduled may wait that much longer.
    pub clock_drops: u64,
    /// The earliest wake time a walk of the running loop asked for since its last walk from
    /// the floor, as the simulator counts it from the loop's reports.
    owed: Option<u64>,
}

/// The settings of every run: short delays so a run covers many retries, small caps so
/// limits bind.
pub fn sim_config() -> Config {
    let mut c = Config::default();
    c.retry.base_delay = Duration::from_secs(1);
    c.retry.max_delay = Duration::from_secs(60);
    c.retry.jitter = Jitter::Equal;
    c.retry.max_attempts = 6;
    c.retry.max_attempts_404 = 3;
    c.retry.give_up_after = Duration::from_secs(3600);
    c.retry.max_retry_after = Duration::from_secs(300);
    c.delivery.max_in_flight_per_host = 3;
    // Below the sum of the host caps (2 hosts × 3), so the global bound binds too.
    c.delivery.max_in_flight = 4;
    c.delivery.rate_per_second = 5;
    c.delivery.pause_after_permanent_failures = 3;
    // Trips often (the simulated receivers fail a third of the time): open breakers must
    // never strand a message or let attempts past the caps.
    c.circuit.failures = 3;
    c.circuit.probe_delay = Duration::from_secs(2);
    c.circuit.probe_max_delay = Duration::from_secs(30);
    c.retention = Duration::from_secs(2 * 3600);
    c.dead_retention = Duration::from_secs(4 * 3600);
    c.signing.secrets = vec![crate::signing::Secret::new("whsec_c2ltdWxhdGlvbi1zZWNyZXQ=".into())];
    c.endpoints = ORDERED
        .iter()
        .map(|(key, on_dead)| crate::config::EndpointConfig {
            key: key.to_string(),
            rate_per_second: None,
            fifo: Some(*on_dead),
            policy: Default::default(),
        })
        .collect();
    // One endpoint capped below its host's cap, so the endpoint cap binds too (no other
    // policy key: the gap check assumes the global backoff).
    c.endpoints.push(crate::config::EndpointConfig {
        key: TARGETS[0].to_string(),
        rate_per_second: None,
        fifo: None,
        policy: crate::config::PolicyOverrides {
            max_in_flight: Some(1),
            ..Default::default()
        },
    });
    c
}

impl World {
    /// A fresh world for `seed`.
    pub fn new(seed: u64) -> World {
        // In memory where the machine has it: the simulator asserts nothing about fsync
        // (a crash here keeps completed writes), and thousands of seeds should not wait on
        // a disk.
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        }
        .expect("temp dir");
        let data = dir.path().join("data");
        let clock = ManualClock::new(T0);
        let rx = SimTransport::new(clock.clone(), StdRng::seed_from_u64(seed ^ 0x005e_ed0f_7ece_1e7e));
        // The run's class, from its own stream (the workload's stays what it was).
        let mut class = StdRng::seed_from_u64(seed ^ 0x0c1a_55e5);
        let large = seed.is_multiple_of(LARGE_EVERY);
        let mut config = sim_config();
        let limits = if !large && class.random_bool(0.3) {
            let limits = Limits {
                scan_budget: class.random_range(8..64),
                claim_batch: class.random_range(1..16),
                skip_run: class.random_range(1..16),
            };
            // Half of these rate every endpoint at 1/s: walks cut by the budget then meet
            // endpoints out of tokens, and the loop sleeps owing their wake times behind a
            // resume point (at 5/s that was about one seed in a thousand).
            if class.random_bool(0.5) {
                config.delivery.rate_per_second = 1;
            }
            limits
        } else {
            Limits::DEFAULT
        };
        // One run in three lifts the global bound above the host caps (2 hosts × 3) and the
        // rate well above what a step sends: the host caps bind first, and new messages
        // wait in their host's line at accept (`delivery::waiting`) rather than in the
        // queue. (The kept seeds are not of them.)
        if seed.is_multiple_of(3) {
            config.delivery.max_in_flight = 8;
            config.delivery.rate_per_second = 100;
        }
        rx.order.set_ordered(ORDERED.iter().map(|(e, _)| e.to_string()));
        // Blocking calls (a scheduler pass, a release, a resume's pages) run on this thread,
        // so nothing runs beside the simulation (see `Drop for World`).
        crate::sys::blocking::inline::set(true);
        let mut w = World {
            rng: StdRng::seed_from_u64(seed),
            _dir: dir,
            data,
            clock,
            rx,
            config: Arc::new(config),
            node: None,
            model: Model::default(),
            trace: Vec::new(),
            broken: Vec::new(),
            limits,
            large,
            resume_points: 0,
            // Sealing is on in most runs from the first start; in one run in four the store
            // starts plain and sealing is turned on at the first restart (plain payloads
            // must stay readable beside sealed ones).
            store_keys: if seed % 4 == 1 { Vec::new() } else { vec![[0xa0; 32]] },
            starts: 0,
            faulting: false,
            started_at_log: Vec::new(),
            clock_drops: 0,
            owed: None,
        };
        w.trace.push(format!(
            "class: {}, limits {limits:?}",
            if large { "large" } else { "small" }
        ));
        w.start_node();
        w
    }

    fn node(&self) -> &Node {
        self.node.as_ref().expect("a running node")
    }

    /// The running delivery context.
    pub fn d(&self) -> Arc<Deliverer> {
        self.node().d.clone()
    }

    /// The running store.
    pub fn store(&self) -> Arc<Store> {
        self.node().store.clone()
    }

    fn start_node(&mut self) {
        // Every other restart brings a new sealing key, the old ones still listed: payloads
        // sealed with each key are read side by side, as after an operator's rotation.
        if self.starts > 0 && self.starts % 2 == 1 {
            self.store_keys.insert(0, [self.starts as u8; 32]);
        }
        self.starts += 1;
        self.started_at_log.push(self.rx.log_len());
        // A new process reads the clock afresh (`Context::new` holds it at the store's newest).
        let before = self.clock.now_ms();
        self.clock.restart();
        let keyring = crate::store::Keyring::new(&self.store_keys);
        // The last process may still be letting go of the directory's lock (a thread that
        // held the store finishing): wait for it, as a restarted process would.
        let mut tries = 0;
        // The store writer becomes a step of the simulation.
        crate::batcher::stepped::begin();
        let store = loop {
            match Store::open(
                &self.data,
                StoreOptions {
                    retention_ms: self.config.retention.as_millis() as u64,
                    dead_retention_ms: self.config.dead_retention.as_millis() as u64,
                    keyring: keyring.clone(),
                    ..StoreOptions::default()
                },
            ) {
                Ok(s) => break Arc::new(s),
                Err(StoreError::Locked(_)) if tries < 500 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("reopening the store: {e}"),
            }
        };
        // Tokio's own timers (a result tried again, a release waiting for its record) move
        // only when nothing else can: a seed replays however fast the machine is.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        let d = {
            let _g = rt.enter();
            let ctx = crate::context::Context::new(
                store.clone(),
                self.clock.clone(),
                self.config.clone(),
                Arc::new(Metrics::default()),
                Arc::new(crate::sys::wake::Wake::default()),
                rt.handle().clone(),
            )
            .expect("delivery context");
            Deliverer::new(ctx, self.rx.clone(), StdRng::seed_from_u64(self.rng.random()), None)
        };
        self.clock_drops += before.saturating_sub(self.clock.now_ms());
        // A restart never sets courier's clock before what the store accepted last (a new
        // id would sort before it, and what a step back had scheduled would stall).
        let newest = [State::Pending, State::InFlight, State::Delivered, State::Dead]
            .into_iter()
            .flat_map(|state| records_in(&store, state))
            .map(|r| r.accepted_at_ms)
            .max()
            .unwrap_or(0);
        assert!(
            self.clock.now_ms() >= newest,
            "courier's clock reads {} ms after a restart, before the newest acceptance stored ({newest} ms)",
            self.clock.now_ms()
        );
        d.set_result_retry(Duration::from_millis(1));
        // What is broken is on the disk: a restarted process reads it broken too (an I/O
        // error is healed by the restart: see `crash`).
        for (id, how, _) in &self.broken {
            store.faults().break_item(id, *how);
        }
        let steppers = crate::batcher::stepped::take();
        assert_eq!(steppers.len(), 1, "the store writer is stepped");
        d.recover_at_start().expect("startup recovery");
        self.rx.watch_store(&store);
        // courier's own scheduler loop, as `app::start` runs it.
        let nap = Nap::default();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        // Inside a pass (between its scan and its writes) the store writer may take a
        // batch, as it does beside a pass on its blocking thread: results land and accepts
        // are stored while the pass runs, and what the writer handed back may be started
        // and ended then too (permits back, registry entries gone, wake-ups), as delivery's
        // runtime does beside a pass; else once the runtime runs again.
        let inside = steppers.clone();
        let rng = std::sync::Mutex::new(StdRng::seed_from_u64(self.rng.random()));
        let handed = d.clone();
        let between: crate::scheduler::Between = Arc::new(move || {
            let mut rng = rng.lock().unwrap_or_else(|p| p.into_inner());
            for s in &inside {
                if rng.random_bool(0.3) {
                    s.step(rng.random_range(1..4));
                }
            }
            if rng.random_bool(0.5) {
                handed.settle_handed_back();
            }
        });
        let walks = Walks::default();
        self.owed = None;
        let scheduler = Scheduler::observed(d.clone(), self.limits, nap.clone())
            .with_between(between)
            .with_walks(walks.clone());
        rt.spawn(scheduler.run(stopped));
        self.node = Some(Node {
            rt,
            store,
            d,
            steppers,
            batches: std::cell::RefCell::new(StdRng::seed_from_u64(self.rng.random())),
            nap,
            walks,
            stop,
        });
    }

    /// Ids in flight now (from the store's state index), with their event ids.
    fn in_flight_ids(&self) -> Vec<(String, String)> {
        self.records(State::InFlight)
            .into_iter()
            .map(|r| (r.id, r.event_id))
            .collect()
    }

    /// Kill -9: nothing of the node runs again; reopen and recover.
    pub fn crash(&mut self) {
        for (_, event) in self.in_flight_ids() {
            *self.model.cut.entry(event).or_default() += 1;
        }
        self.rx.drop_held();
        // A failing disk is what a restart would not survive: the new process finds it
        // healed (a record that does not decode stays so).
        self.heal(usize::MAX, Some(ItemFault::Io));
        let Node {
            rt, store, d, steppers, ..
        } = self.node.take().expect("running");
        rt.shutdown_background();
        drop((d, steppers));
        let_go(store);
        self.start_node();
    }

    /// A crash inside the next writes: `writes` more land, then the process dies at the
    /// next one (whichever component makes it), `step` runs on to its end against the dead
    /// store, and the node is dropped and reopened. Returns what `step` said.
    pub fn crash_inside(
        &mut self,
        at: CrashAt,
        step: impl FnOnce(&mut World) -> Result<String, String>,
    ) -> Result<String, String> {
        // Attempts under way at the crash point may have reached their receiver without
        // their result being written; which ones, only the moment of the crash tells. So
        // every attempt in flight before the step or started during it counts as cut (an
        // upper bound: a crash allows these to be seen once more than recorded).
        let (in_flight, log_start) = (self.in_flight_ids(), self.rx.log_len());
        match at {
            CrashAt::Write(n) => self.store().faults().crash_after(n),
            CrashAt::Read(n) => self.store().faults().crash_at_read(n),
        }
        let what = step(self)?;
        let crashed = self.store().faults().crashed();
        let started = self.rx.log_from(log_start).into_iter().map(|s| s.event_id);
        for event in in_flight.into_iter().map(|(_, event)| event).chain(started) {
            *self.model.cut.entry(event).or_default() += 1;
        }
        self.crash();
        Ok(format!(
            "{what}; crash at {at:?}{}",
            if crashed { "" } else { " (after it)" }
        ))
    }

    /// A failing disk for one step: the next one or two writes (of any kind), record reads
    /// or iterator walks fail, wherever they are, while `step` runs and its effects settle;
    /// then the disk heals. The process lives on: each path must retry, hold the message
    /// back or give the operator an error, and strand nothing.
    pub fn store_fault(&mut self, step: impl FnOnce(&mut World) -> Result<String, String>) -> Result<String, String> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.rng.random_range(1..3);
        let store = self.store();
        let kind = match self.rng.random_range(0..3) {
            0 => {
                store.faults().fail_writes.store(n, SeqCst);
                "writes"
            }
            1 => {
                store.faults().fail_reads.store(n, SeqCst);
                "record reads"
            }
            _ => {
                crate::store::fail_walks(n);
                "iterator walks"
            }
        };
        self.faulting = true;
        let done = step(self).and_then(|what| self.settle().map(|()| what));
        store.faults().fail_writes.store(0, SeqCst);
        store.faults().fail_reads.store(0, SeqCst);
        crate::store::fail_walks(0);
        self.faulting = false;
        Ok(format!("{}; the next {n} {kind} failed", done?))
    }

    /// Running attempts cut off and put back uncounted, the node running on (what a
    /// running courier's drain does before it forwards): each message is released where it
    /// was, its lease ended and the due floor lowered, with no reopen to hide a slip.
    pub fn cut_off(&mut self) -> usize {
        for (_, event) in self.in_flight_ids() {
            *self.model.cut.entry(event).or_default() += 1;
        }
        let d = self.node().d.clone();
        // The receivers see each cut attempt end as its request is dropped; the scheduler's
        // loop runs on and may start the released messages again at once.
        self.run_until(async move { d.drain(Duration::ZERO).await })
    }

    /// SIGTERM with no grace: running attempts are cut off and put back uncounted.
    pub fn graceful_restart(&mut self) {
        for (_, event) in self.in_flight_ids() {
            *self.model.cut.entry(event).or_default() += 1;
        }
        self.heal(usize::MAX, Some(ItemFault::Io));
        let d = self.d();
        self.node().stop.send_replace(true);
        self.run_until(async move { d.drain(Duration::ZERO).await });
        self.rx.drop_held();
        let Node {
            rt, store, d, steppers, ..
        } = self.node.take().expect("running");
        rt.shutdown_background();
        drop((d, steppers));
        store.close();
        let_go(store);
        self.start_node();
    }

    /// Attempts that may be waiting on an I/O error of their message's record (their
    /// result write is tried until the disk heals, holding the attempt: by design, as for a
    /// store-wide failure): at most the in-flight messages broken so whose answer is not
    /// held by their receiver. A held one is counted among the held already; counting it
    /// twice let a step end before another attempt it had dispatched started (seed 226681).
    fn stalled_by_io(&self) -> usize {
        let io: Vec<&String> = (self.broken.iter())
            .filter(|(_, how, _)| *how == ItemFault::Io)
            .map(|(id, _, _)| id)
            .collect();
        if io.is_empty() {
            return 0;
        }
        // An ordered line whose member reads with I/O errors: its head's result moves the
        // line on and must read the member first (all or nothing), so it waits too.
        let io_lines: BTreeSet<String> = (self.model.acked.iter())
            .filter(|(id, (_, target, _))| io.contains(id) && self.rx.order.is_ordered(target))
            .map(|(_, (_, target, _))| target.clone())
            .collect();
        let held = self.rx.held_events();
        let stored = (self.records(State::InFlight).into_iter())
            .filter(|r| !held.contains(&r.event_id))
            .filter(|r| io.contains(&&r.id) || io_lines.contains(&r.target))
            .count();
        // A head deleted during its attempt: the attempt's end still moves its line on, so
        // it waits on the broken member too (seed 8328).
        let deleted = (self.node().d.in_flight_ids().iter())
            .filter_map(|id| self.model.deleted.get(id))
            .filter(|(event, target)| !held.contains(event) && io_lines.contains(target))
            .count();
        stored + deleted
    }

    /// Runs `fut` on the node's runtime to its end. Between its polls every task that can
    /// run runs, and then the batchers take a batch each (their sizes drawn from the seed);
    /// `fut` is polled only when neither moved, so what it checks is settled.
    fn run_until<F: std::future::Future>(&self, fut: F) -> F::Output {
        use std::task::Poll;
        let node = self.node();
        node.rt.block_on(async {
            let mut fut = std::pin::pin!(fut);
            let mut spins = 0u32;
            loop {
                pause(&mut spins).await;
                if node.step_batchers() > 0 {
                    spins = 0;
                    continue;
                }
                let polled = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
                if let Poll::Ready(out) = polled {
                    return out;
                }
            }
        })
    }

    /// Lets every attempt that can finish finish (held ones stay), their results land and
    /// the scheduler's loop go back to sleep.
    pub fn settle(&mut self) -> Result<(), String> {
        let node = self.node();
        let (d, rx) = (node.d.clone(), self.rx.clone());
        // What I/O errors stall changes as the loop starts attempts: counted as it goes.
        let settled = || {
            node.asleep().is_some()
                && !node.batches_waiting()
                && (d.in_flight_count() <= rx.held() || d.in_flight_count() <= rx.held() + self.stalled_by_io())
        };
        self.run_until(async {
            let waited = tokio::time::timeout(Duration::from_secs(30), async {
                let mut spins = 0u32;
                while !settled() {
                    pause(&mut spins).await;
                }
            })
            .await;
            waited.map_err(|_| {
                format!(
                    "never settled: {} attempts in flight ({} held by receivers, {} stalled by I/O, {} waiting to read), \
                     the scheduler {}, batches {}",
                    d.in_flight_count(),
                    rx.held(),
                    self.stalled_by_io(),
                    d.waiting_to_read(),
                    if node.asleep().is_some() { "asleep" } else { "awake" },
                    if node.batches_waiting() { "waiting" } else { "done" }
                )
            })
        })
    }

    /// Lets the node's attempts run for up to `at_most` (of the runtime's paused time), or
    /// until every one that can finish has (see [`World::settle`]).
    pub fn let_run(&mut self, at_most: Duration) {
        let stalled = self.stalled_by_io();
        let (d, rx) = (self.node().d.clone(), self.rx.clone());
        self.run_until(async {
            let _ = tokio::time::timeout(at_most, async {
                let mut spins = 0u32;
                while d.in_flight_count() > rx.held() + stalled {
                    pause(&mut spins).await;
                }
            })
            .await;
        });
    }

    /// Lets the node's background tasks run for `for_` of the runtime's (paused) time.
    pub fn idle(&mut self, for_: Duration) {
        // Made inside the runtime: a timer needs its reactor.
        self.run_until(async move { tokio::time::sleep(for_).await });
    }

    /// Accepts `n` messages concurrently (so some share a commit batch), some of them
    /// duplicates of earlier or of each other. Checks that a duplicate is acknowledged only
    /// when its original is.
    pub fn accept(&mut self, n: usize, fail_write: bool) -> Result<(), String> {
        let now = self.clock.now_ms();
        let store = self.store();
        let (mut batch, mut msgs) = (Vec::new(), Vec::new());
        for _ in 0..n {
            // A duplicate of a message still stored (a deleted or swept one frees its event
            // id, and a new message under it would blur what the receiver saw per event).
            let dup_of_old = !self.model.by_event.is_empty() && self.rng.random_bool(0.15);
            let dup_in_batch = !batch.is_empty() && self.rng.random_bool(0.15);
            let old = if dup_of_old {
                let i = self.rng.random_range(0..self.model.by_event.len());
                let (key, id) = self.model.by_event.iter().nth(i).expect("index in range");
                let stored = self.model.acked.contains_key(id) && store_has(&store, id);
                stored.then(|| key.clone())
            } else {
                None
            };
            // A duplicate sends its original's event id as an app would, a made one too (it
            // had it in the 202); a new message sometimes sends none, and courier makes one
            // from its delivery id (found again by that id: store format 3).
            let (event, target) = if let Some((e, t)) = old {
                (Some(e), t)
            } else if dup_in_batch {
                let i = self.rng.random_range(0..batch.len());
                let (e, t, _): &(String, String, Vec<u8>) = &batch[i];
                (Some(e.clone()), t.clone())
            } else {
                self.model.next_event += 1;
                let t = TARGETS[self.rng.random_range(0..TARGETS.len())];
                let made = self.rng.random_bool(0.3);
                ((!made).then(|| format!("evt-{}", self.model.next_event)), t.to_string())
            };
            let n = self.rng.random::<u32>();
            let env = Envelope {
                target: url::Url::parse(&target).expect("sim targets are URLs"),
                endpoint: None,
                route: None,
                event_id: event,
                method: "POST".into(),
                headers: vec![("content-type".into(), b"application/json".to_vec())],
                body: Vec::new(),
                scheme: None,
                signing: SigningChoice::Default,
                max_attempts: self.config.retry.max_attempts,
                give_up_after: self.config.retry.give_up_after,
            };
            let mut msg = env.into_message(now, &mut self.rng, store.ids());
            let event = msg.record.event_id.clone();
            let body = format!("{{\"event\":\"{event}\",\"n\":{n}}}").into_bytes();
            msg.payload.body = body.clone();
            batch.push((event, target, body));
            msgs.push(msg);
        }
        if fail_write {
            store
                .faults()
                .fail_accepts
                .store(1, std::sync::atomic::Ordering::SeqCst);
        }
        let ids: Vec<String> = msgs.iter().map(|m| m.record.id.clone()).collect();
        let d = self.node().d.clone();
        let answers = self.run_until(async move {
            let tasks: Vec<_> = msgs
                .into_iter()
                .map(|m| {
                    // Through delivery's accept, as ingress does: a message may start at
                    // accept, written already claimed.
                    let d = d.clone();
                    tokio::spawn(async move { d.accept(m, ()).await })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.expect("accept task"));
            }
            out
        });
        self.store()
            .faults()
            .fail_accepts
            .store(0, std::sync::atomic::Ordering::SeqCst);
        // New ones first: a duplicate in the same batch refers to one of them. Sent together,
        // they share one generation of the ordering model.
        let generation = self.rx.order.next_generation();
        let mut duplicates = Vec::new();
        for ((answer, id), (event, target, body)) in answers.into_iter().zip(ids).zip(batch) {
            match answer {
                Ok(Accepted::New) => {
                    if self.rx.order.is_ordered(&target) {
                        self.rx.order.accepted(&event, &id, &target, generation);
                    }
                    self.model.by_event.insert((event.clone(), target.clone()), id.clone());
                    self.model.acked.insert(id, (event, target, body));
                }
                Ok(Accepted::Duplicate { id: first }) => duplicates.push((first, event, target)),
                // Only an injected fault (a failing write, an armed crash) may fail an accept.
                Err(e) if !fail_write && !self.faulting && !self.store().faults().crashed() => {
                    return Err(format!("accept of {event} failed with no fault: {e}"))
                }
                Err(_) => {}
            }
        }
        for (first, event, target) in duplicates {
            // The original must be stored, under the same event and target: a duplicate is
            // acknowledged only when what it duplicates is durable.
            let store = self.store();
            let stored = store.quietly(|| store.message(&first).ok().flatten());
            match stored {
                Some(rec) if rec.event_id == event && rec.target == target => {}
                Some(rec) => {
                    return Err(format!(
                        "duplicate of ({event}, {target}) answered with {first}, which is ({}, {})",
                        rec.event_id, rec.target
                    ))
                }
                None => {
                    return Err(format!(
                        "duplicate of ({event}, {target}) acknowledged as {first}, which is not stored"
                    ))
                }
            }
            if !self.model.acked.contains_key(&first) {
                return Err(format!(
                    "duplicate acknowledged as {first}, which was never acknowledged itself"
                ));
            }
        }
        Ok(())
    }

    /// A wake-up of the scheduler's loop, as an accept or a freed permit gives (its pass
    /// runs when the step settles). With `mid_pass_operator`, first a pass made here, from
    /// the floor, with an operator action after its scan decided and before its writes (the
    /// interleaving a real resume or delete can hit); the wake-up then has the loop walk
    /// again, so the wake times that pass found are the loop's to keep. Returns what the
    /// operator did.
    pub fn pass(&mut self, mid_pass_operator: bool) -> Option<String> {
        let d = self.d();
        let mut note = None;
        if mid_pass_operator {
            let handle = self.node().rt.handle().clone();
            let _g = handle.enter();
            let limits = self.limits;
            let (_, resume) = crate::scheduler::pass::pass_with(&d, &limits, None, &mut || {
                note = Some(self.operator());
            });
            self.resume_points += usize::from(resume.is_some());
        }
        d.context().wake();
        note
    }

    /// How many times the node started (a crash or a restart starts it again).
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// The loop kept what it owes: every sleep since the last check ended no later than
    /// the earliest wake time a walk asked for since the last walk from the floor. A walk
    /// from a resume point does not see what lies before it, so what that asked for (a
    /// token, a breaker's probe) is owed across sleeps until a walk from the floor asks
    /// anew; a loop that forgot it sleeps past it whenever its later walks ask for later.
    pub fn owed_kept(&mut self) -> Result<(), String> {
        let events = std::mem::take(&mut *self.node().walks.lock().unwrap_or_else(|p| p.into_inner()));
        for event in events {
            match event {
                LoopEvent::Walked { from_floor, wake_at } => {
                    let before = if from_floor { None } else { self.owed };
                    self.owed = crate::scheduler::earliest(before, wake_at);
                }
                LoopEvent::Slept { until } => {
                    if let Some(owed) = self.owed {
                        if until.is_none_or(|u| u > owed) {
                            return Err(format!(
                                "the loop slept until {until:?}, though a walk since its last walk from the floor asked to wake at {owed}"
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The scheduler loop's sleep, if it is asleep (it is after [`World::settle`]).
    pub fn asleep(&self) -> Option<Asleep> {
        self.node().asleep()
    }

    /// Endpoints, by index into [`TARGETS`] (their keys are the targets).
    pub fn endpoint(&mut self) -> String {
        TARGETS[self.rng.random_range(0..TARGETS.len())].to_string()
    }

    /// One operator action chosen at random, as the admin API runs it.
    pub fn operator(&mut self) -> String {
        let d = self.d();
        let now = self.clock.now_ms();
        let give_up = now + self.config.retry.give_up_after.as_millis() as u64;
        match self.rng.random_range(0..7) {
            0 => {
                let ep = self.endpoint();
                self.live(d.context().set_paused(&ep, true), "pause");
                format!("pause {ep}")
            }
            1 | 2 => {
                let ep = self.endpoint();
                self.live(d.context().set_paused(&ep, false), "resume");
                format!("resume {ep}")
            }
            3 => {
                let dead = self.list(State::Dead);
                match dead.get(self.rng.random_range(0..dead.len().max(1))) {
                    Some(id) => {
                        let ordered = d.context().store().quietly(|| {
                            self.rx
                                .order
                                .before_replay(d.context().store(), std::slice::from_ref(id))
                        });
                        let r = self.live(d.context().store().replay(id, now, |_| give_up), "replay");
                        if r.is_some() {
                            self.rx.order.after_replay(ordered);
                        }
                        // As the admin API does.
                        if r == Some(Some(true)) {
                            d.context().wake();
                        }
                        format!("replay {id}: {r:?}")
                    }
                    None => "replay: nothing dead".into(),
                }
            }
            4 => {
                let dead = self.list(State::Dead);
                let mut ordered = d
                    .context()
                    .store()
                    .quietly(|| self.rx.order.before_replay(d.context().store(), &dead));
                let n = self.live(
                    d.context()
                        .store()
                        .replay_dead(&ListFilter::default(), now, |_| give_up),
                    "bulk replay",
                );
                if n.is_some_and(|n| n > 0) {
                    d.context().wake();
                }
                if n.is_none() {
                    // A crash cut the replay between pages: only what left `dead` was replayed.
                    let still: BTreeSet<String> = self.list(State::Dead).into_iter().collect();
                    let replayed: BTreeSet<&String> = dead
                        .iter()
                        .filter(|id| !still.contains(*id))
                        .filter_map(|id| self.model.acked.get(id).map(|(event, _, _)| event))
                        .collect();
                    ordered.retain(|(event, _)| replayed.contains(event));
                }
                self.rx.order.after_replay(ordered);
                format!("bulk replay: {n:?}")
            }
            5 => {
                // What `courier drain` does after the peer's 202; the store refuses it for a
                // message an attempt holds.
                let pending = self.list(State::Pending);
                match pending.get(self.rng.random_range(0..pending.len().max(1))) {
                    Some(id) => {
                        let done = matches!(
                            self.live(d.context().store().hand_off(id, now), "hand off"),
                            Some(HandOff::Done)
                        );
                        if done {
                            // A real drain has stopped the scheduler and forwards an ordered
                            // line's next too; here the node runs on and the next is its own,
                            // due now, as after a delete.
                            d.context().wake();
                            if let Some((event, _, _)) = self.model.acked.remove(id) {
                                self.model.handed_off.insert(event, self.rx.log().len());
                            }
                        }
                        format!("hand off {id}: {done}")
                    }
                    None => "hand off: nothing pending".into(),
                }
            }
            _ => {
                let ids: Vec<String> = self.model.acked.keys().cloned().collect();
                match ids.get(self.rng.random_range(0..ids.len().max(1))) {
                    Some(id) => {
                        let Some(gone) = self.live(d.context().store().delete(id, now), "delete") else {
                            return format!("delete {id}: cut by the crash");
                        };
                        if gone {
                            // As the admin API does: an ordered line's next is due now.
                            d.context().wake();
                        }
                        if let Some((event, target, _)) = self.model.acked.remove(id) {
                            self.rx.order.deleted(&event);
                            if gone {
                                self.model.deleted_events.insert(event.clone(), self.rx.log().len());
                            }
                            self.model.deleted.insert(id.clone(), (event, target));
                        }
                        format!("delete {id}: {gone}")
                    }
                    None => "delete: nothing".into(),
                }
            }
        }
    }

    /// Ids in `state`.
    pub fn list(&self, state: State) -> Vec<String> {
        self.records(state).into_iter().map(|r| r.id).collect()
    }

    /// Records in `state` (read past any broken item).
    pub fn records(&self, state: State) -> Vec<crate::store::MessageRecord> {
        records_in(&self.store(), state)
    }

    /// Forgets "finished" for messages that are back in the store unfinished (replayed), so
    /// that losing one of them is seen as the loss it is. Cheap: run after every step.
    pub fn forget_unfinished(&mut self) {
        let store = self.store();
        let finished = &mut self.model.finished;
        store.quietly(|| {
            finished.retain(|id| {
                store
                    .message(id)
                    .ok()
                    .flatten()
                    .is_none_or(|r| matches!(r.state, State::Delivered | State::Dead))
            })
        });
    }

    /// Records which messages are finished (retention may remove them after this). A message
    /// noted earlier that is back in the store unfinished (replayed) is no longer finished:
    /// losing it now would be a real loss.
    pub fn note_finished(&mut self) {
        let store = self.store();
        let finished = &mut self.model.finished;
        store.quietly(|| finished.retain(|id| store.message(id).ok().flatten().is_none()));
        for state in [State::Delivered, State::Dead] {
            for id in self.list(state) {
                self.model.finished.insert(id);
            }
        }
    }

    /// A retention sweep now.
    pub fn sweep(&mut self) -> usize {
        self.note_finished();
        let removed = self.live(crate::retention::sweep(&self.store(), self.clock.now_ms()), "sweep");
        self.live(self.d().context().expire_endpoints(), "forgetting idle endpoints");
        removed.unwrap_or(0)
    }

    /// `r`'s value; an error is a bug, unless an armed crash happened (then the process is
    /// dead and whatever it was doing fails) or a broken message explains it: the record
    /// that did not decode is a broken one, or an I/O error while one reads with I/O errors
    /// (nothing tells those from a failing disk).
    fn live<T>(&self, r: Result<T, StoreError>, what: &str) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(_) if self.store().faults().crashed() => None,
            Err(e) if self.explains(&e) => None,
            Err(e) => panic!("{what}: {e} (broken: {:?})", self.broken),
        }
    }

    /// Whether a broken message explains `e` (see [`World::live`]).
    fn explains(&self, e: &StoreError) -> bool {
        match e {
            StoreError::Codec { key, .. } => self
                .broken
                .iter()
                .any(|(id, how, _)| key == id && *how == ItemFault::Corrupt),
            StoreError::Injected => self.faulting || self.broken.iter().any(|(_, how, _)| *how == ItemFault::Io),
            _ => false,
        }
    }

    /// Breaks one stored message's reads (a record that does not decode, a missing
    /// payload, an I/O error) until step `heal_at`; whatever state it is in.
    pub fn break_one(&mut self, heal_at: usize) -> String {
        if self.broken.len() >= BROKEN_MAX {
            return "break: enough broken".into();
        }
        // Half the time one of a paused endpoint's (parked, or to be parked): few messages
        // are, and a resume must not leave one behind.
        let paused = self.paused();
        let of_paused = self.rng.random_bool(0.5);
        let ids: Vec<String> = self
            .model
            .acked
            .iter()
            .filter(|(_, (_, target, _))| !of_paused || paused.contains(&target.as_str()))
            .map(|(id, _)| id.clone())
            .collect();
        let Some(id) = ids.get(self.rng.random_range(0..ids.len().max(1))).cloned() else {
            return "break: nothing".into();
        };
        if !store_has(&self.store(), &id) || self.broken.iter().any(|(b, _, _)| *b == id) {
            return format!("break {id}: not stored");
        }
        let how = [ItemFault::Corrupt, ItemFault::NoPayload, ItemFault::Io][self.rng.random_range(0..3)];
        self.store().faults().break_item(&id, how);
        self.broken.push((id.clone(), how, heal_at));
        format!("break {id} ({how:?}) until step {heal_at}")
    }

    /// Heals what is due by `step` (all with `usize::MAX`); `only` narrows it to one kind.
    pub fn heal(&mut self, step: usize, only: Option<ItemFault>) -> Vec<String> {
        let store = self.store();
        let mut healed = Vec::new();
        self.broken.retain(|(id, how, at)| {
            let due = *at <= step && only.is_none_or(|k| k == *how);
            if due {
                store.faults().heal(id);
                healed.push(id.clone());
            }
            !due
        });
        healed
    }

    /// The endpoints paused now.
    pub fn paused(&self) -> Vec<&'static str> {
        let d = self.d();
        TARGETS
            .into_iter()
            .filter(|ep| d.context().endpoints().is_paused(ep))
            .collect()
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }
}

impl Drop for World {
    fn drop(&mut self) {
        crate::sys::blocking::inline::set(false);
    }
}
