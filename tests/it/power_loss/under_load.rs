//! courier under load on powercut, its power cut again and again in one mode (drop or
//! torn). After each cut, before courier starts again, `courier store check` audits the data
//! dir as the cut left it; at the end every message answered 202 must have been delivered,
//! and every repeated delivery must be one a cut explains (see `bound`).

use std::process::Command;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use super::bound::{self, Lived};
use crate::support::load::{config, env_number, sealed, seed, Load, Tally, MAX_IN_FLIGHT};
use crate::support::powercut::{mount_or_skip, unsynced_by_kind, Mode, PowerFs};
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_messages_survive_power_cuts() {
    cuts_under_load(|_| Mode::Drop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_messages_survive_torn_writes() {
    cuts_under_load(Mode::Torn).await;
}

/// One message in `every` is refused until the end, so it must come out of the store after
/// the last restart; the others are delivered at once (their results are written and cut
/// too).
fn refused_until_calm(event_id: &str, every: u64) -> bool {
    event_id
        .rsplit('-')
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|n| n % every == 1)
}

/// courier's config under load (`load::config`), with `delivery.max_in_flight` at the one
/// receiver host's cap: it bounds the attempts whose results are not written yet, which the
/// duplicate bound counts on (see `bound`).
fn capped_config(max_delay: &str) -> String {
    let config = config("1s", max_delay);
    let capped = config.replace(
        "[delivery]\n",
        &format!("[delivery]\nmax_in_flight = {MAX_IN_FLIGHT}\n"),
    );
    assert_ne!(config, capped, "load::config has a [delivery] section");
    capped
}

/// The cuts of one run: the schedule's generator, the mode, and what each cut left.
struct Cuts {
    rng: rand::rngs::StdRng,
    seed: u64,
    mode: Mode,
    /// powercut's answer to each cut.
    answers: Vec<String>,
    /// The courier processes the cuts ended.
    lives: Vec<Lived>,
    /// Messages in flight in the store after each cut, as the check counted them.
    in_flight: u64,
}

impl Cuts {
    /// Power off (at a random moment, or once the write-ahead log holds unsynced writes),
    /// courier killed, power on, the store checked, courier started again on what is left.
    fn cut(&mut self, fs: &mut PowerFs, courier: &mut Courier, started: Instant) -> Instant {
        let n = self.answers.len() + 1;
        let answer = if self.rng.random_bool(0.5) {
            fs.cut_in(".log")
        } else {
            fs.cut()
        };
        courier.kill();
        fs.thaw();
        self.in_flight += self.check(courier, n, &answer);
        let ended = Instant::now();
        courier.restart();
        self.answers.push(answer);
        self.lives.push(Lived { started, ended });
        ended
    }

    /// `courier store check` on the data dir as cut `n` left it; panics with its report
    /// (and a copy of the data dir) on any problem. Returns the messages it found in flight.
    fn check(&self, courier: &Courier, n: usize, answer: &str) -> u64 {
        let mut cmd = Command::new(bin());
        cmd.arg("store")
            .arg("check")
            .arg("--config")
            .arg(&courier.config_path)
            .arg("--data-dir")
            .arg(&courier.data_dir);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("COURIER_")) {
            cmd.env_remove(k);
        }
        let out = cmd.output().expect("run courier store check");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        if !out.status.success() {
            let keep = std::env::temp_dir().join(format!("courier-power-cut-{}-{n}", self.seed));
            let _ = Command::new("cp").arg("-a").arg(&courier.data_dir).arg(&keep).status();
            panic!(
                "the store check failed after cut {n} ({:?}, seed {}; powercut: {answer}); the data dir as the cut \
                 left it is copied to {}:\n{stdout}{stderr}",
                self.mode,
                self.seed,
                keep.display()
            );
        }
        // `… N open (M in flight, …`
        let in_flight = stdout.split(" open (").nth(1).and_then(|rest| rest.split(' ').next());
        in_flight
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("no in-flight count in {stdout:?}"))
    }
}

/// The load test in one filesystem mode (`mode_of` the run's seed).
async fn cuts_under_load(mode_of: impl Fn(u64) -> Mode) {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut fs) = mount_or_skip(dir.path()) else {
        return;
    };
    let count = env_number("COURIER_POWER_CUTS", 10) as usize;
    let seed = seed("COURIER_POWER_SEED");
    let mode = mode_of(seed);
    fs.mode(mode);
    eprintln!("power_loss {mode:?}: seed {seed}, {count} cuts (COURIER_POWER_SEED={seed} replays the schedule)");
    let mut cuts = Cuts {
        rng: rand::rngs::StdRng::seed_from_u64(seed),
        seed,
        mode,
        answers: Vec::new(),
        lives: Vec::new(),
        in_flight: 0,
    };
    let began = Instant::now();
    // Half the messages held back in CI's short run; in a soak a tenth, retried less often,
    // so the retries of tens of thousands of held messages do not crowd out the load.
    let (hold_every, max_delay) = if count <= 20 { (2, "4s") } else { (10, "20s") };
    let tally = Tally::start(move |id| Reply::status(if refused_until_calm(id, hold_every) { 503 } else { 200 })).await;

    // courier makes the data dir itself and syncs its parent (see
    // `a_fresh_data_dir_survives_a_power_cut`).
    let data_dir = fs.mnt.join("data");
    let config = sealed(dir.path(), &capped_config(max_delay));
    let mut started = Instant::now();
    let mut courier = Courier::start_with_data_dir(dir.path(), &data_dir, &config, &[]);
    let load = Load::start(courier.ingress, &tally.rx, "power", (5, 50));
    for _ in 0..count {
        tokio::time::sleep(Duration::from_millis(cuts.rng.random_range(200..1500))).await;
        started = tokio::task::block_in_place(|| cuts.cut(&mut fs, &mut courier, started));
        load.moved(courier.ingress);
    }
    let stamps = load.stamps();
    let (acked, refused) = load.stop().await;

    // Drain: the receiver takes everything; every acknowledged id must arrive.
    let drain_started = Instant::now();
    let missing = tally.calm_down(&acked, Duration::from_secs(180)).await;
    let refused_acked = acked
        .iter()
        .filter(|(id, _)| refused_until_calm(id, hold_every))
        .count();
    let repeats = bound::check(&cuts.lives, &stamps, &tally.arrivals(), &acked, MAX_IN_FLIGHT);
    eprintln!(
        "power_loss {mode:?}: {count} cuts, each audited (in flight after them: {}), acknowledged {} \
         ({refused_acked} held back until the last restart), lost {}, {}, not acknowledged {refused:?}, took {:?} \
         (drain {:?})",
        cuts.in_flight,
        acked.len(),
        missing.len(),
        match &repeats {
            Ok(r) => format!("duplicates {} (bound {}{})", r.duplicates, r.bound, r.by_cut()),
            Err(e) => format!("duplicates unexplained: {e}"),
        },
        began.elapsed(),
        drain_started.elapsed()
    );
    eprintln!(
        "power_loss {mode:?}: unsynced data at the cuts: {}",
        unsynced_by_kind(&cuts.answers)
    );
    if !missing.is_empty() {
        lost(&courier, &missing, &cuts, &data_dir).await;
    }
    let repeats = repeats.unwrap_or_else(|e| panic!("{e} ({mode:?}, seed {seed})"));
    assert!(repeats.duplicates <= repeats.bound, "{repeats:?}");
    assert!(
        acked.len() >= 100,
        "the senders got too few acks ({}) to mean anything",
        acked.len()
    );
    drop(courier);
}

/// Fails the test on acknowledged messages that never arrived: what the store says of the
/// first few, and a copy of what survived.
async fn lost(courier: &Courier, missing: &[crate::support::load::Acked], cuts: &Cuts, data_dir: &std::path::Path) {
    let mut report = String::new();
    for (id, delivery) in missing.iter().take(5) {
        let answer = get(&courier.admin_url(&format!("/deliveries/{delivery}"))).await;
        report += &format!("\n  {id} ({delivery}): admin API {} {}", answer.status, answer.text());
    }
    let keep = std::env::temp_dir().join(format!("courier-power-loss-{}", cuts.seed));
    let _ = Command::new("cp").arg("-a").arg(data_dir).arg(&keep).status();
    panic!(
        "{} acknowledged messages never arrived after {} power cuts ({:?}, seed {}); the store's data copied to \
         {}:{report}\ncourier log:\n{}",
        missing.len(),
        cuts.answers.len(),
        cuts.mode,
        cuts.seed,
        keep.display(),
        courier.log.all()
    );
}
