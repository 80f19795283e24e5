//! Power loss on a real filesystem: courier's data dir on powercut (tests/powercut), a FUSE
//! filesystem that keeps every write in memory until `fsync`/`fdatasync` of the file (and
//! every create, rename and unlink until an fsync of its directory). A kill -9 keeps the
//! kernel's page cache; a cut does not. A cut drops the unsynced writes in one of two
//! modes: drop (all of them) or torn (a random prefix of each file's unsynced writes
//! survives: the first k whole and part of the next, as on a disk that wrote some of them
//! in order before the power went; seeded).
//!
//! `filesystem_keeps_only_what_was_synced` and `filesystem_tears_unsynced_writes_in_torn_mode`
//! show the filesystem does what it says. `under_load` runs courier under load, cuts the
//! power (the unsynced data dropped or torn, courier SIGKILLed at the same moment) again and
//! again, in each mode, half the cuts at a moment when the write-ahead log holds unsynced
//! writes; after each cut, before courier starts again, `courier store check` audits the
//! data dir as the cut left it, and at the end every message answered 202 must be delivered
//! and every repeated delivery must be one a cut can explain (`bound`: at most the
//! deliveries since the last durable accept's request was sent, plus
//! `delivery.max_in_flight`, per cut). Payloads are sealed at rest in every run here
//! (`[store] encryption_key_files`).
//!
//! The filesystem's binary comes from `COURIER_TEST_POWERCUT` (scripts/verifiers.sh builds
//! it); without it, or without the right to mount, the tests fail (`support::skip`: only
//! `COURIER_TEST_ALLOW_SKIP=1` lets them pass without running, never under CI's
//! `COURIER_TEST_REQUIRE_VERIFIERS=1`). `COURIER_POWER_CUTS` (default 10) sets the number of
//! cuts in each mode, e.g. `COURIER_POWER_CUTS=200` for a soak; the schedule's seed (also
//! torn mode's) is printed and `COURIER_POWER_SEED` replays it.

use std::io::Write;
use std::os::unix::fs::FileExt;

use crate::support::load::{client, sealed, send, Acked};
use crate::support::powercut::{fsync_dir, mount_or_skip, write_file, Mode};
use crate::support::*;

// The duplicate bound, and the load test in each mode.
mod bound;
mod under_load;

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
    eprintln!("powercut self-test: {answer} (files gone, bytes dropped, bytes kept, then per file)");

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

/// Every content a file written `synced` and synced, then `writes` unsynced, can have after
/// a torn cut: the first k writes whole and the first bytes of the next. Each with (k, bytes
/// kept of the next).
fn torn_outcomes(synced: &[u8], writes: &[(u64, &[u8])]) -> Vec<(usize, usize, Vec<u8>)> {
    let apply = |data: &mut Vec<u8>, (at, bytes): (u64, &[u8])| {
        let at = at as usize;
        if data.len() < at + bytes.len() {
            data.resize(at + bytes.len(), 0);
        }
        data[at..at + bytes.len()].copy_from_slice(bytes);
    };
    let mut out = Vec::new();
    for k in 0..=writes.len() {
        let mut data = synced.to_vec();
        for w in &writes[..k] {
            apply(&mut data, *w);
        }
        let next = writes.get(k).map_or(0, |(_, b)| b.len());
        for part in 0..next.max(1) {
            let mut torn = data.clone();
            if let Some((at, bytes)) = writes.get(k) {
                apply(&mut torn, (*at, &bytes[..part]));
            }
            out.push((k, part, torn));
        }
    }
    out
}

#[test]
fn filesystem_tears_unsynced_writes_in_torn_mode() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut fs) = mount_or_skip(dir.path()) else {
        return;
    };
    let root = fs.mnt.clone();
    // Appends and an overwrite of synced bytes, each its own write (the files are opened
    // with direct I/O: one write call, one write to the filesystem).
    let writes: [(u64, &[u8]); 4] = [(6, b"-one"), (10, b"-two"), (1, b"XY"), (14, b"-three")];
    fs.mode(Mode::Torn(41));
    let (mut none, mut some, mut torn, mut all) = (0, 0, 0, 0);
    for round in 0..16 {
        let (f, g) = (root.join(format!("f{round}")), root.join(format!("g{round}")));
        write_file(&f, b"synced", true);
        write_file(&g, b"all", false);
        fsync_dir(&root);
        let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
        for (at, bytes) in writes {
            file.write_all_at(bytes, at).unwrap();
        }
        // Unsynced writes, then a sync: nothing of it may be lost.
        let mut synced = std::fs::OpenOptions::new().append(true).open(&g).unwrap();
        synced.write_all(b" synced").unwrap();
        synced.sync_data().unwrap();
        let answer = fs.cut();
        fs.thaw();
        assert_eq!(
            std::fs::read(&g).unwrap(),
            b"all synced",
            "a synced write was lost: {answer}"
        );
        let survived = std::fs::read(&f).unwrap();
        let outcomes = torn_outcomes(b"synced", &writes);
        let Some((k, part, _)) = outcomes.iter().find(|(_, _, data)| *data == survived) else {
            panic!(
                "{:?} is not the synced bytes and a prefix of the writes ({answer})",
                String::from_utf8_lossy(&survived)
            );
        };
        match (k, part) {
            (0, 0) => none += 1,
            (4, _) => all += 1,
            (_, 0) => some += 1,
            _ => torn += 1,
        }
    }
    eprintln!("powercut torn self-test: of 16 cuts, {none} kept nothing, {some} some writes whole, {torn} tore a write, {all} kept all");
    assert!(
        none > 0 && some > 0 && torn > 0 && all > 0,
        "seed 41 draws each outcome"
    );

    // Back to drop mode: nothing unsynced survives.
    fs.mode(Mode::Drop);
    let f = root.join("dropped");
    write_file(&f, b"synced", true);
    fsync_dir(&root);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .write_all_at(b"-gone", 6)
        .unwrap();
    fs.cut();
    fs.thaw();
    assert_eq!(std::fs::read(&f).unwrap(), b"synced");
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
