//! Power loss on a real filesystem: courier's data dir on powercut (tests/powercut), a FUSE
//! filesystem that keeps every write in memory until `fsync`/`fdatasync` of the file (and
//! every create, rename and unlink until an fsync of its directory) and on a cut drops
//! everything unsynced. A kill -9 keeps the kernel's page cache; a cut does not.
//!
//! `filesystem_keeps_only_what_was_synced` shows the filesystem really drops unsynced data.
//! `acknowledged_messages_survive_power_cuts` runs courier under load, cuts the power (drops
//! the unsynced data and SIGKILLs courier at the same moment) again and again, restarts it
//! on what is left, and checks every message answered 202 is delivered. Payloads are sealed
//! at rest in every run here (`[store] encryption_key_files`).
//!
//! The filesystem's binary comes from `COURIER_TEST_POWERCUT` (scripts/verifiers.sh builds
//! it); without it, or without the right to mount, the tests fail (`support::skip`: only
//! `COURIER_TEST_ALLOW_SKIP=1` lets them pass without running, never under CI's
//! `COURIER_TEST_REQUIRE_VERIFIERS=1`). `COURIER_POWER_CUTS` (default 10) sets the number of
//! cuts, e.g. `COURIER_POWER_CUTS=200` for a soak; the schedule's seed is printed and
//! `COURIER_POWER_SEED` replays it.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::support::load::{client, config, env_number, sealed, seed, send, Acked, Load, Tally};
use crate::support::*;

/// A mounted powercut filesystem, driven through its stdin.
struct PowerFs {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    mnt: PathBuf,
}

impl PowerFs {
    /// Mounts powercut on `mnt`, or says why it cannot (the test then skips or fails).
    fn mount(mnt: &Path) -> Result<PowerFs, String> {
        let bin = std::env::var("COURIER_TEST_POWERCUT")
            .map_err(|_| "COURIER_TEST_POWERCUT is not set (scripts/verifiers.sh builds tests/powercut)".to_string())?;
        std::fs::create_dir_all(mnt).unwrap();
        let mut child = Command::new(&bin)
            .arg(mnt)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {bin}: {e}"))?;
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        if line.trim() != "mounted" {
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            let _ = child.wait();
            return Err(format!("powercut did not mount on {}: {}", mnt.display(), err.trim()));
        }
        Ok(PowerFs {
            child,
            stdin,
            out,
            mnt: mnt.to_path_buf(),
        })
    }

    fn command(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "powercut exited on {cmd:?}");
        line.trim().to_string()
    }

    /// Drops everything unsynced; until [`PowerFs::thaw`] every operation fails with EIO.
    fn cut(&mut self) -> String {
        let answer = self.command("cut");
        assert!(answer.starts_with("cut "), "{answer}");
        answer
    }

    fn thaw(&mut self) {
        assert_eq!(self.command("thaw"), "thawed");
    }
}

impl Drop for PowerFs {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// Mounts powercut under `dir`, or skips the test (fails it when skipping is not allowed).
fn mount_or_skip(dir: &Path) -> Option<PowerFs> {
    match PowerFs::mount(&dir.join("mnt")) {
        Ok(fs) => Some(fs),
        Err(reason) => {
            skip(&reason);
            None
        }
    }
}

fn fsync_dir(dir: &Path) {
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
}

fn write_file(path: &Path, bytes: &[u8], sync: bool) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(bytes).unwrap();
    if sync {
        f.sync_all().unwrap();
    }
}

#[test]
fn filesystem_keeps_only_what_was_synced() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut fs) = mount_or_skip(dir.path()) else {
        return;
    };
    let root = fs.mnt.clone();
    let at = |name: &str| root.join(name);

    // Durable files to start from (file and directory synced).
    write_file(&at("appended"), b"synced", true);
    write_file(&at("resynced"), b"first", true);
    write_file(&at("renamed.tmp"), b"rename me", true);
    write_file(&at("unlinked"), b"unlink me", true);
    std::fs::create_dir(at("sub")).unwrap();
    fsync_dir(&root);

    // A write without fsync: visible now, gone after the cut.
    let mut f = std::fs::OpenOptions::new().append(true).open(at("appended")).unwrap();
    f.write_all(b" and not").unwrap();
    drop(f);
    assert_eq!(std::fs::read(at("appended")).unwrap(), b"synced and not");
    // A write with fdatasync: stays.
    let mut f = std::fs::OpenOptions::new().append(true).open(at("resynced")).unwrap();
    f.write_all(b" second").unwrap();
    f.sync_data().unwrap();
    drop(f);
    // A new file synced with its directory synced: stays.
    write_file(&at("new-durable"), b"all synced", true);
    fsync_dir(&root);
    // A new file synced, its directory not: gone.
    write_file(&at("new-unlinked-dir"), b"data synced, name not", true);
    // In a directory that itself is durable only in name: its entries are not.
    write_file(&at("sub/inner"), b"x", true);
    // A rename and an unlink without a directory sync: undone.
    std::fs::rename(at("renamed.tmp"), at("renamed")).unwrap();
    std::fs::remove_file(at("unlinked")).unwrap();
    assert!(at("renamed").exists() && !at("unlinked").exists());
    // A new file never synced at all: gone.
    write_file(&at("never-synced"), b"y", false);

    let answer = fs.cut();
    // The power is off: nothing answers until it is back.
    let err = std::fs::read(at("resynced")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    fs.thaw();
    eprintln!("powercut self-test: {answer} (files gone, bytes dropped, then per file)");

    assert_eq!(
        std::fs::read(at("appended")).unwrap(),
        b"synced",
        "an unsynced append survived"
    );
    assert_eq!(
        std::fs::read(at("resynced")).unwrap(),
        b"first second",
        "an fdatasync'd write was lost"
    );
    assert!(
        !at("new-unlinked-dir").exists(),
        "a file whose directory was never synced survived"
    );
    assert!(
        at("sub").is_dir() && !at("sub/inner").exists(),
        "an entry of an unsynced directory survived"
    );
    assert_eq!(std::fs::read(at("new-durable")).unwrap(), b"all synced");
    assert!(
        at("renamed.tmp").exists() && !at("renamed").exists(),
        "an unsynced rename survived"
    );
    assert_eq!(
        std::fs::read(at("unlinked")).unwrap(),
        b"unlink me",
        "an unsynced unlink survived"
    );
    assert!(!at("never-synced").exists(), "a never-synced file survived");
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

/// Sums powercut's `cut` answers (`cut <files gone> <bytes> <name>:<bytes>...`) by kind of
/// RocksDB file: how many bytes each kind lost over the cuts, and in how many cuts.
fn dropped_by_kind(answers: &[String]) -> String {
    let mut kinds: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
    for answer in answers {
        let mut seen = std::collections::BTreeSet::new();
        for item in answer.split(' ').skip(3) {
            let Some((name, bytes)) = item.rsplit_once(':') else {
                continue;
            };
            let kind = match name {
                n if n.ends_with(".log") => "WAL",
                n if n.ends_with(".sst") => "SST",
                n if n.starts_with("MANIFEST") => "MANIFEST",
                n if n.starts_with("LOG") => "info LOG",
                n if n.starts_with("OPTIONS") => "OPTIONS",
                _ => "other",
            };
            let entry = kinds.entry(kind).or_default();
            entry.0 += bytes.parse::<usize>().unwrap_or(0);
            if seen.insert(kind) {
                entry.1 += 1;
            }
        }
    }
    let parts: Vec<String> = kinds
        .iter()
        .map(|(kind, (bytes, cuts))| format!("{kind} {bytes} bytes in {cuts} cuts"))
        .collect();
    format!("{} (of {} cuts)", parts.join(", "), answers.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_messages_survive_power_cuts() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut fs) = mount_or_skip(dir.path()) else {
        return;
    };
    let cuts = env_number("COURIER_POWER_CUTS", 10) as usize;
    let seed = seed("COURIER_POWER_SEED");
    eprintln!("power_loss: seed {seed}, {cuts} cuts (COURIER_POWER_SEED={seed} replays the schedule)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let started = Instant::now();
    // Half the messages held back in CI's short run; in a soak a tenth, retried less often,
    // so the retries of tens of thousands of held messages do not crowd out the load.
    let (hold_every, max_delay) = if cuts <= 20 { (2, "4s") } else { (10, "20s") };
    let tally = Tally::start(move |id| Reply::status(if refused_until_calm(id, hold_every) { 503 } else { 200 })).await;

    // courier makes the data dir itself and syncs its parent (see
    // `a_fresh_data_dir_survives_a_power_cut`).
    let data_dir = fs.mnt.join("data");
    let mut courier = Courier::start_with_data_dir(
        dir.path(),
        &data_dir,
        &sealed(dir.path(), &config("1s", max_delay)),
        &[],
    );
    let load = Load::start(courier.ingress, &tally.rx, "power", (5, 50));

    // The cuts: load for a random while, then power off (unsynced data dropped, courier
    // killed), power on, courier restarted on what is left.
    let mut dropped = Vec::new();
    for _ in 0..cuts {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
        let answer = tokio::task::block_in_place(|| {
            let answer = fs.cut();
            courier.kill();
            fs.thaw();
            courier.restart();
            answer
        });
        dropped.push(answer);
        load.moved(courier.ingress);
    }
    let (acked, refused) = load.stop().await;

    // Drain: the receiver takes everything; every acknowledged id must arrive.
    let drain_started = Instant::now();
    let missing = tally.calm_down(&acked, Duration::from_secs(180)).await;
    let (duplicates, _) = tally.duplicates(&acked);
    let refused_acked = acked
        .iter()
        .filter(|(id, _)| refused_until_calm(id, hold_every))
        .count();
    eprintln!(
        "power_loss: cuts {cuts}, acknowledged {} ({refused_acked} held back until the last restart), lost {}, \
         duplicates {duplicates}, not acknowledged {refused:?}, took {:?} (drain {:?})",
        acked.len(),
        missing.len(),
        started.elapsed(),
        drain_started.elapsed()
    );
    eprintln!(
        "power_loss: unsynced data the cuts dropped: {}",
        dropped_by_kind(&dropped)
    );
    if !missing.is_empty() {
        // What the store has for the first few lost messages, and a copy of what survived.
        let mut report = String::new();
        for (id, delivery) in missing.iter().take(5) {
            let answer = get(&courier.admin_url(&format!("/deliveries/{delivery}"))).await;
            report += &format!("\n  {id} ({delivery}): admin API {} {}", answer.status, answer.text());
        }
        let keep = std::env::temp_dir().join(format!("courier-power-loss-{seed}"));
        let _ = Command::new("cp").arg("-a").arg(&data_dir).arg(&keep).status();
        panic!(
            "{} acknowledged messages never arrived after {cuts} power cuts (seed {seed}); the store's data \
             copied to {}:{report}\ncourier log:\n{}",
            missing.len(),
            keep.display(),
            courier.log.all()
        );
    }
    assert!(
        acked.len() >= 100,
        "the senders got too few acks ({}) to mean anything",
        acked.len()
    );
    drop(courier);
}

/// courier's first start on a new data dir: the messages it acknowledged must survive a cut
/// even though nobody made the directory durable beforehand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_data_dir_survives_a_power_cut() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut fs) = mount_or_skip(dir.path()) else {
        return;
    };
    let rx = Receiver::scripted(|_, _| Reply::status(503)).await;
    let config = "[retry]\nbase_delay = \"1h\"\nmax_attempts = 1000\ngive_up_after = \"2h\"\n";
    let data_dir = fs.mnt.join("data");
    let mut courier = Courier::start_with_data_dir(dir.path(), &data_dir, &sealed(dir.path(), config), &[]);
    let acked = accept_ten(&courier, &rx, "fresh").await;
    let survived = tokio::task::block_in_place(|| {
        fs.cut();
        courier.kill();
        fs.thaw();
        // What the cut left, before courier (RocksDB) makes anything anew.
        let survived: Vec<String> = match std::fs::read_dir(&data_dir) {
            Ok(entries) => entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) => vec![format!("no data dir: {e}")],
        };
        courier.restart();
        survived
    });
    let lost = gone(&courier, &acked).await;
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged messages gone after a cut on a fresh data dir (what the cut left of it: \
         {survived:?}): {lost:?}",
        lost.len(),
        acked.len(),
    );
}

/// The negative control: the same cut against a disk that ignores the WAL's fsyncs (what a
/// store that acknowledged before its sync would look like) must lose acknowledged
/// messages, or the cuts above prove nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_loses_what_a_lying_disk_never_synced() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut fs) = mount_or_skip(dir.path()) else {
        return;
    };
    let rx = Receiver::scripted(|_, _| Reply::status(503)).await;
    let config = "[retry]\nbase_delay = \"1h\"\nmax_attempts = 1000\ngive_up_after = \"2h\"\n";
    let data_dir = fs.mnt.join("data");
    std::fs::create_dir(&data_dir).unwrap();
    fsync_dir(&fs.mnt);
    let mut courier = Courier::start_with_data_dir(dir.path(), &data_dir, &sealed(dir.path(), config), &[]);
    assert_eq!(fs.command("ignore-sync .log"), "ignoring .log");
    let acked = accept_ten(&courier, &rx, "lied").await;
    tokio::task::block_in_place(|| {
        fs.cut();
        courier.kill();
        fs.thaw();
        courier.restart();
    });
    let lost = gone(&courier, &acked).await.len();
    eprintln!(
        "power_loss: with the WAL's fsyncs ignored, a cut lost {lost} of {} acknowledged",
        acked.len()
    );
    assert!(lost > 0, "a cut lost nothing although no WAL write was ever synced");
}

/// Ten messages accepted by `courier` for `rx`, event ids `<tag>-<n>`: (event id, delivery id).
async fn accept_ten(courier: &Courier, rx: &Receiver, tag: &str) -> Vec<Acked> {
    let client = client();
    let mut acked = Vec::new();
    for n in 0..10 {
        let id = format!("{tag}-{n}");
        let delivery = send(&client, &courier.prefixed(&rx.url(&format!("/{tag}"))), &id).await;
        acked.push((id, delivery.expect("accepted")));
    }
    acked
}

/// The acknowledged messages `courier` no longer knows, each with what its admin API said.
async fn gone(courier: &Courier, acked: &[Acked]) -> Vec<String> {
    let mut lost = Vec::new();
    for (id, delivery) in acked {
        let answer = get(&courier.admin_url(&format!("/deliveries/{delivery}"))).await;
        if answer.status != 200 {
            lost.push(format!("{id} ({delivery}): {}", answer.status));
        }
    }
    lost
}
