//! powercut: a FUSE filesystem for power-loss tests (the design of LazyFS, written anew).
//!
//! Everything lives in memory in two versions: what a program sees now, and what would
//! survive a power cut. A file's bytes become durable on `fsync`/`fdatasync` of that file;
//! a directory's entries (creates, renames, unlinks, mkdirs) on `fsync` of that directory.
//! Nothing else makes anything durable: `sync_file_range` never reaches a FUSE daemon
//! without a writeback cache (the kernel writes through to us and has nothing to flush),
//! so, as on a real disk, it promises nothing. Files are opened with direct I/O, so the
//! kernel's page cache holds nothing of ours that could outlive a cut.
//!
//! Two modes say what a cut does to a file's unsynced writes:
//! - drop (the default): all of them are lost; the file is as it was at its last sync.
//! - torn: a random prefix of them survives, as on a disk that wrote some of the queued
//!   writes, in order, before the power went: the first k whole (k from 0 to all) and, when
//!   k is not all, the first bytes of the next one (none to all but its last byte). Nothing
//!   synced is ever lost; a kept write may overwrite synced bytes, as it would on a disk. The
//!   choices come from a seeded generator walking the files in inode order, so the same seed
//!   and the same writes give the same cut. Directory entries stay all or nothing in both
//!   modes: a directory is as it was at its last fsync.
//!
//! `powercut <mountpoint>` mounts (as root, straight through the mount syscall, or through
//! fusermount3 otherwise), prints `mounted`, and reads commands on stdin, one per line,
//! answering each with one line:
//!   cut    power off: what the mode keeps of the unsynced writes stays, the rest is gone,
//!          and every later operation fails with EIO (the machine is off) until `thaw`.
//!          Answers `cut <files gone> <bytes dropped> <bytes kept>` and
//!          `<name>:<bytes dropped>:<bytes kept>` for each file that had unsynced writes
//!          (bytes written since the file's last sync).
//!   cut-in <suffix>
//!          `cut` once a file whose name ends with <suffix> holds unsynced writes (or after
//!          5 s), so the cut lands between such a write and its sync (`cut-in .log`:
//!          RocksDB's write-ahead log). Answers as `cut`.
//!   mode drop | mode torn <seed>
//!          the mode of the next cuts. Answers `mode drop` or `mode torn <seed>`.
//!   thaw   power back on: the filesystem serves what survived. Answers `thawed`.
//!   stats  `stats <nodes> <durable bytes> <unsynced bytes>`.
//!   ignore-sync <suffix>
//!          from now on an fsync of a file whose name ends with <suffix> does nothing (a
//!          disk that lies; the tests' negative control). Answers `ignoring <suffix>`.
//!   quit   (or end of input) unmount and exit.

// A test tool that keeps file times and waits in real time; `clippy.toml` guards courier's
// own code.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

// Torn mode: a file's unsynced changes, and which prefix of them a cut keeps.
mod torn;

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, MountOption, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow,
};
use torn::{Change, Keep, Rng};

/// Nothing is cached by the kernel: every lookup and attribute read comes to us, so a cut
/// shows at once.
const TTL: Duration = Duration::ZERO;
const ROOT: u64 = 1;

#[derive(Default)]
struct Node {
    dir: bool,
    perm: u16,
    uid: u32,
    gid: u32,
    mtime: Option<SystemTime>,
    /// A file's bytes as programs see them, and as they would survive a cut.
    data: Vec<u8>,
    synced: Vec<u8>,
    /// Written since the last sync: the byte range, and the shortest length the file had
    /// (a truncate then an extend must not bring old durable bytes back).
    dirty: Option<(usize, usize)>,
    min_len: usize,
    /// Every write and length change since the last sync, in order: what a torn cut keeps
    /// a prefix of.
    changes: Vec<Change>,
    /// A directory's entries now, and as they would survive a cut.
    entries: BTreeMap<OsString, u64>,
    synced_entries: BTreeMap<OsString, u64>,
}

impl Node {
    fn new(dir: bool, perm: u16, uid: u32, gid: u32) -> Node {
        Node {
            dir,
            perm,
            uid,
            gid,
            mtime: Some(SystemTime::now()),
            ..Node::default()
        }
    }

    fn set_len(&mut self, len: usize) {
        self.changes.push(Change::SetLen(len));
        self.data.resize(len, 0);
        self.min_len = self.min_len.min(len);
        if self.dirty.is_none() && self.data.len() != self.synced.len() {
            self.dirty = Some((len, len));
        }
    }

    fn write(&mut self, offset: usize, bytes: &[u8]) {
        self.changes.push(Change::Write(offset, bytes.to_vec()));
        let end = offset + bytes.len();
        if self.data.len() < end {
            self.data.resize(end, 0);
        }
        self.data[offset..end].copy_from_slice(bytes);
        let (lo, hi) = self.dirty.unwrap_or((offset, end));
        self.dirty = Some((lo.min(offset), hi.max(end)));
        self.mtime = Some(SystemTime::now());
    }

    /// fsync/fdatasync: the file's bytes now are what survives.
    fn sync(&mut self) {
        self.changes.clear();
        let Some((lo, hi)) = self.dirty.take() else {
            return;
        };
        let len = self.data.len();
        self.synced.truncate(self.min_len);
        self.synced.resize(len, 0);
        // The range written since the last sync (clipped to the length now), and anything
        // past the shortest length the file had since (appends, zeros from an extend).
        let (lo, hi) = (lo.min(len), hi.min(len));
        self.synced[lo..hi].copy_from_slice(&self.data[lo..hi]);
        let tail = self.min_len.min(len);
        self.synced[tail..].copy_from_slice(&self.data[tail..]);
        self.min_len = len;
    }

    fn unsynced_bytes(&self) -> usize {
        match self.dirty {
            Some((lo, hi)) => hi.saturating_sub(lo).max(self.data.len().abs_diff(self.synced.len())),
            None => 0,
        }
    }

    /// Power cut: the file becomes its synced bytes with `keep` of the unsynced changes
    /// applied on top, and that is now what is durable. Returns (bytes dropped, bytes kept)
    /// of the writes since the last sync.
    fn cut(&mut self, keep: Keep) -> (usize, usize) {
        let written: usize = self.changes.iter().map(Change::written).sum();
        let mut kept = 0;
        if self.dirty.take().is_some() || !self.changes.is_empty() {
            let mut data = std::mem::take(&mut self.synced);
            let changes = std::mem::take(&mut self.changes);
            for (i, change) in changes.iter().enumerate() {
                let part = match (i.cmp(&keep.whole), change) {
                    (std::cmp::Ordering::Less, _) => change.written(),
                    (std::cmp::Ordering::Equal, Change::Write(..)) => keep.torn,
                    _ => break,
                };
                change.apply(&mut data, part);
                kept += part;
            }
            self.data = data;
            self.synced = self.data.clone();
        }
        self.min_len = self.data.len();
        (written - kept, kept)
    }
}

#[derive(Default)]
struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    /// Open file handles and their inodes (an unlinked file stays readable while open).
    handles: HashMap<u64, u64>,
    next_fh: u64,
    /// Power is off: every operation fails until `thaw`.
    frozen: bool,
    /// fsyncs of files named with this suffix are ignored (`ignore-sync`).
    ignore_sync: Option<OsString>,
    /// Torn mode's generator (`mode torn <seed>`); drop mode when `None`.
    torn: Option<Rng>,
}

impl State {
    fn new() -> State {
        let mut s = State {
            next_ino: ROOT + 1,
            next_fh: 1,
            ..State::default()
        };
        s.nodes.insert(ROOT, Node::new(true, 0o755, 0, 0));
        s
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let n = self.nodes.get(&ino)?;
        let t = n.mtime.unwrap_or(SystemTime::UNIX_EPOCH);
        Some(FileAttr {
            ino: INodeNo(ino),
            size: if n.dir { 4096 } else { n.data.len() as u64 },
            blocks: (n.data.len() as u64).div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: if n.dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: n.perm,
            nlink: if n.dir { 2 } else { 1 },
            uid: n.uid,
            gid: n.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn dir(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(n) if n.dir => Ok(n),
            Some(_) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn file(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(n) if !n.dir => Ok(n),
            Some(_) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn child(&mut self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        self.dir(parent)?.entries.get(name).copied().ok_or(Errno::ENOENT)
    }

    fn make(&mut self, req: &Request, parent: u64, name: &OsStr, dir: bool, mode: u32) -> Result<u64, Errno> {
        if self.dir(parent)?.entries.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes
            .insert(ino, Node::new(dir, (mode & 0o7777) as u16, req.uid(), req.gid()));
        let p = self.dir(parent)?;
        p.entries.insert(name.to_owned(), ino);
        p.mtime = Some(SystemTime::now());
        Ok(ino)
    }

    fn open_handle(&mut self, ino: u64) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, ino);
        fh
    }

    /// Forgets inodes nothing names (now or durably) and nothing holds open.
    fn collect(&mut self) {
        let mut keep: HashSet<u64> = self.handles.values().copied().collect();
        keep.insert(ROOT);
        for n in self.nodes.values() {
            keep.extend(n.entries.values().chain(n.synced_entries.values()));
        }
        self.nodes.retain(|ino, _| keep.contains(ino));
    }

    /// Power cut: every node goes back to its durable version (with, in torn mode, a prefix
    /// of its unsynced writes); whatever is no longer reachable from the root through
    /// durable entries is gone. Returns (nodes gone, bytes dropped, bytes kept, per file).
    fn cut(&mut self) -> (usize, usize, usize, Vec<String>) {
        let before = self.nodes.len();
        let names: HashMap<u64, OsString> = self
            .nodes
            .values()
            .flat_map(|d| d.entries.iter().map(|(name, ino)| (*ino, name.clone())))
            .collect();
        let (mut dropped, mut kept, mut files) = (0, 0, Vec::new());
        // In inode order: the generator's draws must not depend on a hash map's order.
        let mut inos: Vec<u64> = self.nodes.keys().copied().collect();
        inos.sort_unstable();
        for ino in inos {
            let n = self.nodes.get_mut(&ino).expect("listed above");
            let keep = match &mut self.torn {
                Some(rng) if !n.changes.is_empty() => rng.keep(&n.changes),
                _ => Keep { whole: 0, torn: 0 },
            };
            let (lost, saved) = n.cut(keep);
            if lost + saved > 0 {
                let name = names.get(&ino).map_or("?".into(), |n| n.to_string_lossy().into_owned());
                files.push(format!("{name}:{lost}:{saved}"));
            }
            (dropped, kept) = (dropped + lost, kept + saved);
            n.entries = n.synced_entries.clone();
        }
        self.handles.clear();
        let mut reachable = HashSet::from([ROOT]);
        let mut stack = vec![ROOT];
        while let Some(ino) = stack.pop() {
            if let Some(n) = self.nodes.get(&ino) {
                for child in n.entries.values() {
                    if reachable.insert(*child) {
                        stack.push(*child);
                    }
                }
            }
        }
        self.nodes.retain(|ino, _| reachable.contains(ino));
        self.frozen = true;
        files.sort();
        (before - self.nodes.len(), dropped, kept, files)
    }

    /// Whether a file named with `suffix` holds unsynced writes (`cut-in`).
    fn unsynced_in(&self, suffix: &str) -> bool {
        self.nodes.values().any(|d| {
            d.entries.iter().any(|(name, ino)| {
                name.as_encoded_bytes().ends_with(suffix.as_bytes())
                    && self.nodes.get(ino).is_some_and(|n| !n.changes.is_empty())
            })
        })
    }

    /// Whether an fsync of `ino` is to be ignored (`ignore-sync`): any of its names ends with
    /// the suffix.
    fn lies_about(&self, ino: u64) -> bool {
        let Some(suffix) = &self.ignore_sync else { return false };
        self.nodes.values().any(|d| {
            d.entries
                .iter()
                .any(|(name, i)| *i == ino && name.as_encoded_bytes().ends_with(suffix.as_encoded_bytes()))
        })
    }

    fn stats(&self) -> (usize, usize, usize) {
        let durable = self.nodes.values().map(|n| n.synced.len()).sum();
        let unsynced = self.nodes.values().map(Node::unsynced_bytes).sum();
        (self.nodes.len(), durable, unsynced)
    }
}

struct PowerCut(Arc<Mutex<State>>);

impl PowerCut {
    /// The state, or EIO while the power is off.
    fn state(&self) -> Result<MutexGuard<'_, State>, Errno> {
        let s = self.0.lock().unwrap();
        if s.frozen {
            Err(Errno::EIO)
        } else {
            Ok(s)
        }
    }

    fn entry(&self, reply: ReplyEntry, f: impl FnOnce(&mut State) -> Result<u64, Errno>) {
        let mut s = match self.state() {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        match f(&mut s).and_then(|ino| s.attr(ino).ok_or(Errno::ENOENT)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn empty(&self, reply: ReplyEmpty, f: impl FnOnce(&mut State) -> Result<(), Errno>) {
        match self.state().and_then(|mut s| f(&mut s)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

impl Filesystem for PowerCut {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(reply, |s| s.child(parent.0, name));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state().and_then(|s| s.attr(ino.0).ok_or(Errno::ENOENT)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = self.state().and_then(|mut s| {
            if let Some(size) = size {
                s.file(ino.0)?.set_len(size as usize);
            }
            let n = s.nodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?;
            if let Some(mode) = mode {
                n.perm = (mode & 0o7777) as u16;
            }
            n.uid = uid.unwrap_or(n.uid);
            n.gid = gid.unwrap_or(n.gid);
            match mtime {
                Some(TimeOrNow::SpecificTime(t)) => n.mtime = Some(t),
                Some(TimeOrNow::Now) => n.mtime = Some(SystemTime::now()),
                None => {}
            }
            s.attr(ino.0).ok_or(Errno::ENOENT)
        });
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        self.entry(reply, |s| s.make(req, parent.0, name, true, mode & !umask));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(reply, |s| {
            let ino = s.child(parent.0, name)?;
            if s.dir(ino).is_ok() {
                return Err(Errno::EISDIR);
            }
            s.dir(parent.0)?.entries.remove(name);
            s.collect();
            Ok(())
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(reply, |s| {
            let ino = s.child(parent.0, name)?;
            if !s.dir(ino)?.entries.is_empty() {
                return Err(Errno::ENOTEMPTY);
            }
            s.dir(parent.0)?.entries.remove(name);
            s.collect();
            Ok(())
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.empty(reply, |s| {
            if flags.contains(RenameFlags::RENAME_EXCHANGE) || flags.contains(RenameFlags::RENAME_WHITEOUT) {
                return Err(Errno::EINVAL);
            }
            let ino = s.child(parent.0, name)?;
            if let Ok(old) = s.child(newparent.0, newname) {
                if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                    return Err(Errno::EEXIST);
                }
                let (from_dir, to_dir) = (s.dir(ino).is_ok(), s.dir(old).is_ok());
                if to_dir && !s.dir(old)?.entries.is_empty() {
                    return Err(Errno::ENOTEMPTY);
                }
                if from_dir != to_dir {
                    return Err(if to_dir { Errno::EISDIR } else { Errno::ENOTDIR });
                }
            }
            s.dir(parent.0)?.entries.remove(name);
            s.dir(newparent.0)?.entries.insert(newname.to_owned(), ino);
            s.collect();
            Ok(())
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let result = self.state().and_then(|mut s| {
            s.file(ino.0)?;
            Ok(s.open_handle(ino.0))
        });
        match result {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let result = self.state().and_then(|mut s| {
            let ino = match s.child(parent.0, name) {
                Ok(_) if flags & libc::O_EXCL != 0 => return Err(Errno::EEXIST),
                Ok(ino) => {
                    if flags & libc::O_TRUNC != 0 {
                        s.file(ino)?.set_len(0);
                    }
                    ino
                }
                Err(_) => s.make(req, parent.0, name, false, mode & !umask)?,
            };
            let fh = s.open_handle(ino);
            Ok((s.attr(ino).ok_or(Errno::ENOENT)?, fh))
        });
        match result {
            Ok((attr, fh)) => reply.created(&TTL, &attr, Generation(0), FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let mut s = match self.state() {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        match s.file(ino.0) {
            Ok(n) => {
                let start = (offset as usize).min(n.data.len());
                let end = (start + size as usize).min(n.data.len());
                reply.data(&n.data[start..end]);
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.state().and_then(|mut s| {
            s.file(ino.0)?.write(offset as usize, data);
            Ok(())
        }) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _owner: fuser::LockOwner, reply: ReplyEmpty) {
        // close() makes nothing durable.
        self.empty(reply, |_| Ok(()));
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Also while frozen: the killed process's files are closed by the kernel.
        let mut s = self.0.lock().unwrap();
        if s.handles.remove(&fh.0).is_some() {
            s.collect();
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.empty(reply, |s| {
            if !s.lies_about(ino.0) {
                s.file(ino.0)?.sync();
            }
            Ok(())
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().and_then(|mut s| s.dir(ino.0).map(|_| ())) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let mut s = match self.state() {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        let entries: Vec<(u64, bool, OsString)> = match s.dir(ino.0) {
            Ok(d) => d
                .entries
                .iter()
                .map(|(name, ino)| (*ino, false, name.clone()))
                .collect(),
            Err(e) => return reply.error(e),
        };
        let mut all = vec![(ino.0, true, OsString::from(".")), (ino.0, true, OsString::from(".."))];
        for (child, _, name) in entries {
            let dir = s.dir(child).is_ok();
            all.push((child, dir, name));
        }
        for (i, (child, dir, name)) in all.into_iter().enumerate().skip(offset as usize) {
            let kind = if dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            if reply.add(INodeNo(child), (i + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.empty(reply, |s| {
            let d = s.dir(ino.0)?;
            d.synced_entries = d.entries.clone();
            s.collect();
            Ok(())
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // 64 GiB, nearly all free: courier checks free space before accepting.
        let blocks = 16 << 20;
        reply.statfs(
            blocks,
            blocks - 1024,
            blocks - 1024,
            1 << 20,
            (1 << 20) - 1024,
            4096,
            255,
            4096,
        );
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        self.empty(reply, |_| Ok(()));
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.empty(reply, |s| {
            let n = s.file(ino.0)?;
            match mode {
                // Reserving space changes nothing a reader sees.
                libc::FALLOC_FL_KEEP_SIZE => Ok(()),
                0 => {
                    let end = (offset + length) as usize;
                    if n.data.len() < end {
                        let len = n.data.len();
                        n.write(len, &vec![0; end - len]);
                    }
                    Ok(())
                }
                _ => Err(Errno::EOPNOTSUPP),
            }
        });
    }
}

/// `cut`'s answer: `cut <files gone> <bytes dropped> <bytes kept> <name>:<dropped>:<kept>…`.
fn cut(state: &mut State) -> String {
    let (nodes, dropped, kept, files) = state.cut();
    format!("cut {nodes} {dropped} {kept} {}", files.join(" "))
}

fn main() {
    let mountpoint = match std::env::args_os().nth(1) {
        Some(m) => m,
        None => {
            eprintln!("usage: powercut <mountpoint>  (commands on stdin: cut, cut-in, mode, thaw, stats, quit)");
            std::process::exit(2);
        }
    };
    let state = Arc::new(Mutex::new(State::new()));
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("powercut".into()), MountOption::NoAtime];
    let session = match fuser::spawn_mount(PowerCut(state.clone()), &mountpoint, &config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("powercut: cannot mount on {}: {e}", mountpoint.to_string_lossy());
            std::process::exit(1);
        }
    };
    let mut out = std::io::stdout();
    let say = |out: &mut std::io::Stdout, line: String| {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    say(&mut out, "mounted".into());
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "cut" => say(&mut out, cut(&mut state.lock().unwrap())),
            other if other.starts_with("cut-in ") => {
                let suffix = &other["cut-in ".len()..];
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                let answer = loop {
                    let mut s = state.lock().unwrap();
                    if s.unsynced_in(suffix) || std::time::Instant::now() > deadline {
                        break cut(&mut s);
                    }
                    drop(s);
                    std::thread::sleep(Duration::from_micros(200));
                };
                say(&mut out, answer);
            }
            "mode drop" => {
                state.lock().unwrap().torn = None;
                say(&mut out, "mode drop".into());
            }
            other if other.starts_with("mode torn ") => match other["mode torn ".len()..].parse::<u64>() {
                Ok(seed) => {
                    state.lock().unwrap().torn = Some(Rng(seed));
                    say(&mut out, format!("mode torn {seed}"));
                }
                Err(_) => say(&mut out, format!("error not a seed: {other:?}")),
            },
            "thaw" => {
                state.lock().unwrap().frozen = false;
                say(&mut out, "thawed".into());
            }
            "stats" => {
                let (nodes, durable, unsynced) = state.lock().unwrap().stats();
                say(&mut out, format!("stats {nodes} {durable} {unsynced}"));
            }
            "quit" => break,
            other if other.starts_with("ignore-sync ") => {
                let suffix = other["ignore-sync ".len()..].to_string();
                state.lock().unwrap().ignore_sync = Some(suffix.clone().into());
                say(&mut out, format!("ignoring {suffix}"));
            }
            other => say(&mut out, format!("error unknown command {other:?}")),
        }
    }
    if let Err(e) = session.umount_and_join() {
        eprintln!("powercut: unmount: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncate_then_extend_does_not_bring_back_old_durable_bytes() {
        let mut n = Node::new(false, 0o644, 0, 0);
        n.write(0, b"hello world");
        n.sync();
        n.set_len(2);
        n.set_len(8);
        n.sync();
        assert_eq!(n.synced, b"he\0\0\0\0\0\0");
    }

    #[test]
    fn only_synced_bytes_survive_a_cut() {
        let mut s = State::new();
        let ino = s.next_ino;
        s.next_ino += 1;
        s.nodes.insert(ino, Node::new(false, 0o644, 0, 0));
        s.nodes.get_mut(&ROOT).unwrap().entries.insert("f".into(), ino);
        let root = s.nodes.get_mut(&ROOT).unwrap();
        root.synced_entries = root.entries.clone();
        let f = s.nodes.get_mut(&ino).unwrap();
        f.write(0, b"durable");
        f.sync();
        f.write(7, b" and not");
        s.cut();
        assert_eq!(s.nodes[&ino].data, b"durable");
        assert!(s.frozen);
    }

    #[test]
    fn a_torn_cut_keeps_a_prefix_of_the_unsynced_writes_in_order() {
        let node = || {
            let mut n = Node::new(false, 0o644, 0, 0);
            n.write(0, b"0123456789");
            n.sync();
            n.write(10, b"abc");
            n.write(2, b"XY");
            n.set_len(6);
            n.write(6, b"zz");
            n
        };
        let cases: [(usize, usize, &[u8]); 6] = [
            (0, 0, b"0123456789"),
            (0, 2, b"0123456789ab"),
            (1, 0, b"0123456789abc"),
            (1, 1, b"01X3456789abc"),
            (3, 1, b"01XY45z"),
            (4, 0, b"01XY45zz"),
        ];
        for (whole, torn, survives) in cases {
            let mut n = node();
            let now = n.data.clone();
            let (dropped, kept) = n.cut(Keep { whole, torn });
            assert_eq!(n.data, survives, "{whole} whole, {torn} torn");
            assert_eq!(n.synced, n.data, "what survived is durable");
            assert_eq!(dropped + kept, 7);
            if whole == 4 {
                assert_eq!(n.data, now, "keeping every change is the file as it was");
            }
        }
    }

    #[test]
    fn an_overwrite_inside_the_file_is_durable_after_sync() {
        let mut n = Node::new(false, 0o644, 0, 0);
        n.write(0, b"aaaaaaaa");
        n.sync();
        n.write(2, b"bb");
        n.write(8, b"cc");
        n.sync();
        assert_eq!(n.synced, b"aabbaaaacc");
    }
}
