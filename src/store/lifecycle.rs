//! Opening and closing the store: RocksDB tuning, the column families and their merge
//! operator, the private data directory, the readiness probe and the flush at close.
//!
//! Kept apart from the operations because it is the one place that decides how RocksDB
//! is configured; nothing here runs on the delivery path.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rocksdb::{BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBCompressionType, Options, WriteOptions, DB};

use super::counters::add_counter;
use super::{floor, format, keys, sealing, Faults, KeyId, Store, StoreError, StoreOptions, LOCK_STRIPES};

impl Store {
    /// Opens (creating if needed) the store in `dir`, which is created with mode 0700.
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        // A data dir the store keys cannot open is refused before RocksDB opens it for
        // writing (which replays and rewrites its log, manifest and options files): the
        // refused start leaves every file as it was.
        match keys_in_data_dir(dir) {
            Ok(Some(needed)) => sealing::check_keys(&needed, &options.keyring)?,
            Ok(None) => {}
            Err(e @ StoreError::NewerFormat { .. }) => return Err(e),
            // Never a reason to refuse a start: `check_at_open` checks the keys again
            // below, before anything is written.
            Err(e) => {
                tracing::warn!(error = %e, "reading the data dir's store keys before opening it failed; they are checked once it is open")
            }
        }
        create_private_dir(dir)?;
        let db = Arc::new(open_db(dir, &options)?);
        // Refused first, marked last: a start refused for either writes no marker.
        let found = format::in_data(&db)?;
        format::check(found)?;
        sealing::check_at_open(&db, &options.keyring)?;
        if found.is_none_or(|f| f < format::FORMAT) {
            format::mark(&db)?;
        }
        let ids = crate::model::IdSeq::after(newest_id(&db)?.as_deref());
        let due_floor = Arc::new(floor::DueFloor::default());
        let faults = Arc::new(Faults::default());
        Ok(Store {
            db,
            due_floor,
            accepting: Mutex::new(()),
            stripes: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            synced: {
                let mut w = WriteOptions::default();
                w.set_sync(true);
                w
            },
            operator_syncs: std::sync::atomic::AtomicU64::new(0),
            ids,
            leases: Default::default(),
            deleted_in_flight: Default::default(),
            lines: Default::default(),
            faults,
            counter_gate: Default::default(),
            options,
            path: dir.to_path_buf(),
        })
    }

    /// Whether the store can still write (a cheap unsynced probe write): readiness.
    pub fn writable(&self) -> bool {
        self.db.put_cf(self.cf(keys::META), b"probe", b"").is_ok()
    }

    /// Flushes the WAL and memtables so the next start has little to replay (called once
    /// nothing writes: the store writer stopped first).
    pub fn close(&self) {
        if let Err(e) = self.db.flush_wal(true) {
            tracing::warn!(error = %e, "flushing the WAL at close failed");
        }
        for name in keys::CF_NAMES {
            if let Err(e) = self.db.flush_cf(self.cf(name)) {
                tracing::warn!(error = %e, cf = name, "flushing at close failed");
            }
        }
    }
}

/// The newest delivery id stored (ids sort by acceptance time): one seek.
fn newest_id(db: &DB) -> Result<Option<String>, StoreError> {
    let mut it = db.raw_iterator_cf(super::cf_of(db, keys::MESSAGES));
    it.seek_to_last();
    it.status()?;
    Ok(it.key().and_then(|k| String::from_utf8(k.to_vec()).ok()))
}

/// Every column family's descriptor, tuned by `options`.
fn descriptors(options: &StoreOptions) -> impl Iterator<Item = ColumnFamilyDescriptor> + '_ {
    let table = table_options(options.block_cache_bytes);
    let sealed = options.keyring.sealing().is_some();
    // The unused `default` column family is opened with our small write buffer too:
    // with RocksDB's own 64 MiB, the free space RocksDB waits for before it resumes
    // writing after a disk-full error (it reserves the largest write buffer) would be
    // 64 MiB, and on a small volume courier would never accept again by itself.
    keys::CF_NAMES
        .iter()
        .chain(std::iter::once(&rocksdb::DEFAULT_COLUMN_FAMILY_NAME))
        .map(move |name| {
            ColumnFamilyDescriptor::new(*name, cf_options(name, &table, options.write_buffer_bytes, sealed))
        })
}

/// Opens RocksDB in `dir` with every column family, tuned by `options`.
fn open_db(dir: &Path, options: &StoreOptions) -> Result<DB, StoreError> {
    let descriptors = descriptors(options);
    DB::open_cf_descriptors(&db_options(options.write_buffer_bytes), dir, descriptors).map_err(|e| {
        let text = e.to_string();
        if text.contains("lock") && (text.contains("LOCK") || text.contains("unavailable")) {
            StoreError::Locked(dir.to_path_buf())
        } else {
            StoreError::Rocks(e)
        }
    })
}

/// The keys the payloads of the store in `dir` may be sealed with (`None`: no store there;
/// [`StoreError::NewerFormat`] for a store a newer courier wrote, see `format`),
/// read without opening it for writing: by a start before it opens the store (so a refused
/// start changes no file), and by `check-config` while a courier may be running on it.
/// A read-only open writes nothing in the data dir (RocksDB keeps no `LOG` for one) and
/// takes no lock.
pub fn keys_in_data_dir(dir: &Path) -> Result<Option<Vec<KeyId>>, StoreError> {
    if !dir.join("CURRENT").is_file() {
        return Ok(None);
    }
    let mut opts = db_options(0);
    opts.create_if_missing(false);
    // With its merge operator, as the store opens it: the log replayed holds counter merges.
    let mut meta = rocksdb::Options::default();
    meta.set_merge_operator_associative("courier_add_i64", add_counter);
    let meta = rocksdb::ColumnFamilyDescriptor::new(keys::META, meta);
    let db = DB::open_cf_descriptors_read_only(&opts, dir, [meta], false)?;
    format::check(format::in_data(&db)?)?;
    sealing::in_data(&db).map(Some)
}

/// The store in `dir` opened read-only, for an offline check: RocksDB replays its log in
/// memory as a start would, and writes nothing. The returned file holds a read lock on the
/// data dir's `LOCK` (the fcntl lock RocksDB takes for writing; a read-only open takes
/// none), so the check refuses a data dir a courier runs on ([`StoreError::Locked`]) and no
/// courier starts on it meanwhile. Only read access is needed (a disk mounted read-only).
pub(super) fn open_read_only(dir: &Path, options: &StoreOptions) -> Result<(DB, Option<std::fs::File>), StoreError> {
    let lock = lock_data_dir(dir)?;
    let db_opts = db_options(options.write_buffer_bytes);
    let db = DB::open_cf_descriptors_read_only(&db_opts, dir, descriptors(options), false)?;
    format::check(format::in_data(&db)?)?;
    Ok((db, lock))
}

/// A read lock on the data dir's `LOCK` file for as long as the returned file is open;
/// `None` when there is no such file (a copy of a store without it: nothing runs on it).
fn lock_data_dir(dir: &Path) -> Result<Option<std::fs::File>, StoreError> {
    use std::os::fd::AsRawFd;
    let path = dir.join("LOCK");
    let err = |source| StoreError::Dir {
        path: path.clone(),
        source,
    };
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    // SAFETY: a zeroed `flock` is a valid value of this plain C struct; its fields are set
    // below before the call.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_RDLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: fcntl on a descriptor `file` owns, with a pointer to a live `flock`.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) } == -1 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EACCES) => Err(StoreError::Locked(dir.to_path_buf())),
            _ => Err(err(e)),
        };
    }
    Ok(Some(file))
}

/// The table options every column family shares: one bounded block cache, bloom filters.
fn table_options(block_cache_bytes: usize) -> BlockBasedOptions {
    let cache = Cache::new_lru_cache(block_cache_bytes);
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(&cache);
    table.set_bloom_filter(10.0, false);
    // Index and filter blocks live in the bounded block cache, not in memory per table
    // (they grow with the data: a retention window of delivered messages). They are
    // partitioned, with only their small top level pinned: a point read then loads one
    // index partition of a few KiB. Unpartitioned, a large table's index block (MiBs) was
    // evicted by data blocks and read and checksummed again for every lookup, which made
    // resuming a large backlog cost more than delivering it.
    table.set_cache_index_and_filter_blocks(true);
    table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
    table.set_partition_filters(true);
    table.set_pin_top_level_index_and_filter(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    table
}

/// One column family's options: payloads compressed (unless they are sealed: each body is
/// compressed on its own before it is sealed, and RocksDB would only spend CPU failing to
/// shrink ciphertext), counters merged by addition.
fn cf_options(name: &str, table: &BlockBasedOptions, write_buffer_bytes: usize, sealed: bool) -> Options {
    let mut o = Options::default();
    o.set_block_based_table_factory(table);
    o.set_write_buffer_size(write_buffer_bytes);
    o.set_max_write_buffer_number(3);
    o.set_compression_type(if name == keys::PAYLOADS && !sealed {
        DBCompressionType::Lz4
    } else {
        DBCompressionType::None
    });
    o.set_level_compaction_dynamic_level_bytes(true);
    // Ids, and so the keys of most families, grow with time: a level-0 compaction overlaps
    // only the newest table below it, and rewrites that one whole. At 8 MiB rather than the
    // default 64 that rewrite is small (compaction CPU in a 30 s probe at 12,500/s: 1.1 s
    // against 1.9-2.3 s); the cost is more, smaller tables for the table cache.
    o.set_target_file_size_base(8 << 20);
    if name == keys::EVENTS {
        // Every accept asks for its event id and nearly every answer is no: a memtable
        // bloom filter answers that without walking the memtable.
        o.set_memtable_whole_key_filtering(true);
        o.set_memtable_prefix_bloom_ratio(0.02);
    }
    if name == keys::META {
        o.set_merge_operator_associative("courier_add_i64", add_counter);
    }
    o
}

/// The database-wide options: background work, WAL and log sizes, open files.
pub(super) fn db_options(write_buffer_bytes: usize) -> Options {
    let mut db_opts = Options::default();
    db_opts.create_if_missing(true);
    db_opts.create_missing_column_families(true);
    db_opts.set_max_background_jobs(2);
    db_opts.set_max_total_wal_size(64 << 20);
    db_opts.set_db_write_buffer_size(write_buffer_bytes * 8);
    db_opts.set_keep_log_file_num(3);
    db_opts.set_max_log_file_size(8 << 20);
    db_opts.set_max_open_files(256);
    // RocksDB opens each family's tables at start with 16 threads of its own, made and
    // ended per family (about 200 threads per open here); one per core opens as fast.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    db_opts.set_max_file_opening_threads(cores.min(16) as i32);
    db_opts.set_recycle_log_file_num(4);
    db_opts
}

/// Creates `dir` (mode 0700) or tightens an existing one to 0700.
fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let err = |source| StoreError::Dir {
        path: dir.to_path_buf(),
        source,
    };
    if !dir.exists() {
        // The directories about to be made: each one's entry lives in its parent, which
        // must be synced too, or a power cut soon after the first start loses the whole
        // store (RocksDB syncs the files it writes inside, never this).
        let made: Vec<&Path> = dir
            .ancestors()
            .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
            .collect();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
        for new in made.iter().rev() {
            let parent = match new.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(err)?;
        }
    }
    let meta = std::fs::metadata(dir).map_err(err)?;
    if !meta.is_dir() {
        return Err(err(std::io::Error::other("not a directory")));
    }
    // Per-message signing secrets are stored with their messages: keep the dir private.
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
    }
    Ok(())
}
