//! powercut (tests/powercut), the FUSE filesystem the power-loss tests cut the power under,
//! driven through its stdin: mounted under a test's temporary dir, cut in one of its two
//! modes (drop every unsynced write, or keep a torn prefix of them), thawed.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use super::skip;

/// What a cut does to each file's unsynced writes (powercut's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// All are lost.
    Drop,
    /// A prefix survives: the first k writes whole and part of the next, drawn from the seed.
    Torn(u64),
}

/// A mounted powercut filesystem.
pub struct PowerFs {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    /// Where it is mounted.
    pub mnt: PathBuf,
}

impl PowerFs {
    /// Mounts powercut on `mnt`, or says why it cannot (the test then skips or fails).
    pub fn mount(mnt: &Path) -> Result<PowerFs, String> {
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

    /// Sends one command; its one-line answer.
    pub fn command(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "powercut exited on {cmd:?}");
        line.trim().to_string()
    }

    /// Sets what the next cuts do to unsynced writes.
    pub fn mode(&mut self, mode: Mode) {
        let cmd = match mode {
            Mode::Drop => "mode drop".to_string(),
            Mode::Torn(seed) => format!("mode torn {seed}"),
        };
        assert_eq!(self.command(&cmd), cmd);
    }

    /// Power off: unsynced writes dropped (or torn); until [`PowerFs::thaw`] every
    /// operation fails with EIO. The answer: `cut <files gone> <bytes dropped> <bytes kept>
    /// <name>:<dropped>:<kept>…`.
    pub fn cut(&mut self) -> String {
        let answer = self.command("cut");
        assert!(answer.starts_with("cut "), "{answer}");
        answer
    }

    /// [`PowerFs::cut`] once a file named with `suffix` holds unsynced writes (or after 5 s).
    pub fn cut_in(&mut self, suffix: &str) -> String {
        let answer = self.command(&format!("cut-in {suffix}"));
        assert!(answer.starts_with("cut "), "{answer}");
        answer
    }

    /// Power back on.
    pub fn thaw(&mut self) {
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
pub fn mount_or_skip(dir: &Path) -> Option<PowerFs> {
    match PowerFs::mount(&dir.join("mnt")) {
        Ok(fs) => Some(fs),
        Err(reason) => {
            skip(&reason);
            None
        }
    }
}

/// fsync of a directory: its entries become durable.
pub fn fsync_dir(dir: &Path) {
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
}

/// Writes a whole file, synced or not.
pub fn write_file(path: &Path, bytes: &[u8], sync: bool) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(bytes).unwrap();
    if sync {
        f.sync_all().unwrap();
    }
}

/// Sums powercut's `cut` answers by kind of RocksDB file: how many unsynced bytes each kind
/// lost and kept over the cuts, and in how many cuts it had any.
pub fn unsynced_by_kind(answers: &[String]) -> String {
    let mut kinds: std::collections::BTreeMap<&str, (usize, usize, usize)> = Default::default();
    for answer in answers {
        let mut seen = std::collections::BTreeSet::new();
        for item in answer.split(' ').skip(4) {
            let mut parts = item.rsplitn(3, ':');
            let (Some(kept), Some(dropped), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
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
            entry.0 += dropped.parse::<usize>().unwrap_or(0);
            entry.1 += kept.parse::<usize>().unwrap_or(0);
            if seen.insert(kind) {
                entry.2 += 1;
            }
        }
    }
    let parts: Vec<String> = kinds
        .iter()
        .map(|(kind, (dropped, kept, cuts))| format!("{kind} {dropped} bytes dropped, {kept} kept, in {cuts} cuts"))
        .collect();
    format!("{} (of {} cuts)", parts.join("; "), answers.len())
}
