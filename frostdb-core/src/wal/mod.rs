//! The write-ahead log of a database: segmented files of checksummed records (one per
//! transaction, whatever tables it writes), appended before a write is acknowledged, replayed
//! on open, deleted segment by segment once every table has persisted what they hold.

pub(crate) mod objects;
pub(crate) mod record;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::fs::{FileSystem, WritableFile};
use crate::options::Durability;
use record::{End, MAGIC, SegmentReader};

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}

/// One segment file.
#[derive(Debug, Clone)]
struct Segment {
    path: PathBuf,
    /// Highest transaction the segment holds (0 when empty).
    last_tx: u64,
    /// Its size (of closed segments).
    bytes: u64,
}

struct Writer {
    file: Arc<dyn WritableFile>,
    current: Segment,
    /// Length of the current segment's valid prefix.
    current_len: u64,
    closed: Vec<Segment>,
    /// Bytes appended since the WAL was opened, across segments: the position ("LSN") that
    /// `sync` makes durable.
    written: u64,
}

/// A database's WAL: segment files in its directory, or objects in the bucket it shares.
#[derive(Debug)]
pub(crate) enum Wal {
    Files(FileWal),
    Objects(objects::ObjectWal),
}

/// Why a WAL stopped accepting writes, if it has: set once, by the first failure after
/// which what is durable is unknown (a failed fsync or upload) or by the loss of the
/// database's lease; checked before every write. The first reason stays.
#[derive(Debug, Default)]
pub(crate) struct Poison(Mutex<Option<String>>);

impl Poison {
    /// Stops the log for `reason` (logged the first time).
    pub(crate) fn set(&self, reason: impl Into<String>) {
        let mut cell = self.0.lock();
        if cell.is_none() {
            let reason = reason.into();
            tracing::error!("the database stops accepting writes: {reason}");
            *cell = Some(reason);
        }
    }

    /// Why the log refuses writes, if it does.
    pub(crate) fn reason(&self) -> Option<String> {
        self.0.lock().clone()
    }

    /// [`Error::Poisoned`] once set.
    pub(crate) fn check(&self) -> Result<()> {
        match self.reason() {
            Some(reason) => Err(Error::Poisoned { reason }),
            None => Ok(()),
        }
    }
}

impl Wal {
    fn poison_cell(&self) -> &Poison {
        match self {
            Self::Files(w) => &w.poisoned,
            Self::Objects(w) => &w.poisoned,
        }
    }

    /// Why the WAL refuses writes, if it does.
    pub(crate) fn poisoned(&self) -> Option<String> {
        self.poison_cell().reason()
    }

    /// Appends a record for `tx`; returns the position `sync` must reach for it.
    pub(crate) fn append(&self, tx: u64, payload: &[u8]) -> Result<u64> {
        match self {
            Self::Files(w) => w.append(tx, payload),
            Self::Objects(w) => w.append(tx, payload),
        }
    }

    /// Makes everything up to `position` durable, sharing the work between writers.
    pub(crate) fn sync(&self, position: u64) -> Result<()> {
        match self {
            Self::Files(w) => w.sync(position),
            Self::Objects(w) => w.sync(position),
        }
    }

    /// Records, syncs and bytes since open.
    pub(crate) fn stats(&self) -> WalStats {
        match self {
            Self::Files(w) => w.stats(),
            Self::Objects(w) => w.stats(),
        }
    }

    /// The position up to which everything is durable.
    pub(crate) fn durable_position(&self) -> u64 {
        match self {
            Self::Files(w) => w.durable_position(),
            Self::Objects(w) => w.durable_position(),
        }
    }

    /// Starts a new segment (files; objects start one at every sync).
    pub(crate) fn rotate(&self) -> Result<()> {
        match self {
            Self::Files(w) => w.rotate(),
            Self::Objects(_) => Ok(()),
        }
    }

    /// Deletes what holds only transactions up to `tx`.
    pub(crate) fn truncate_through(&self, tx: u64) -> Result<usize> {
        match self {
            Self::Files(w) => w.truncate_through(tx),
            Self::Objects(w) => w.truncate_through(tx),
        }
    }

    /// Bytes of the WAL, as written.
    pub(crate) fn total_bytes(&self) -> u64 {
        match self {
            Self::Files(w) => w.total_bytes(),
            Self::Objects(w) => w.total_bytes(),
        }
    }

    /// Bytes the WAL holds in storage.
    pub(crate) fn disk_bytes(&self) -> u64 {
        match self {
            Self::Files(w) => w.disk_bytes(),
            Self::Objects(w) => w.total_bytes(),
        }
    }

    /// Stops accepting writes (the database's lease was lost).
    pub(crate) fn poison(&self, reason: String) {
        self.poison_cell().set(reason);
    }
}

/// A WAL of segment files.
pub(crate) struct FileWal {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    durability: Durability,
    segment_bytes: u64,
    writer: Mutex<Writer>,
    /// Serialises fsyncs; the leader syncs for everyone waiting.
    sync_lock: Mutex<()>,
    durable: AtomicU64,
    /// Set by the first failed fsync: after it, what reached the disk is unknown (a later
    /// fsync may report success for pages the kernel already dropped), so nothing more is
    /// ever reported durable.
    poisoned: Poison,
    /// Records appended and fsyncs done since open (for [`WalStats`]).
    records: AtomicU64,
    syncs: AtomicU64,
    sync_nanos: AtomicU64,
}

/// What the write-ahead log did since the database opened: with concurrent writers, one
/// fsync covers many records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WalStats {
    /// Records (transactions) appended.
    pub records: u64,
    /// fsyncs of the log (each made one or more records durable).
    pub syncs: u64,
    /// Bytes appended.
    pub bytes: u64,
    /// Time spent making records durable: in fsyncs (uploads, for a WAL in a bucket), which
    /// every acknowledged write waits for.
    pub sync_time: Duration,
}

impl std::fmt::Debug for FileWal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// Adds the time since `started` to a nanosecond counter.
pub(crate) fn add_time(nanos: &AtomicU64, started: std::time::Instant) {
    let spent = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    nanos.fetch_add(spent, Ordering::Relaxed);
}

fn segment_path(dir: &Path, first_tx: u64) -> PathBuf {
    dir.join(format!("{first_tx:020}.wal"))
}

fn sync_dir(fs: &dyn FileSystem, dir: &Path) -> Result<()> {
    fs.sync_dir(dir)
        .map_err(io_err(format!("syncing directory {}", dir.display())))
}

fn create_segment(
    fs: &dyn FileSystem,
    dir: &Path,
    first_tx: u64,
) -> Result<(Arc<dyn WritableFile>, Segment)> {
    let path = segment_path(dir, first_tx);
    let file = fs
        .create(&path)
        .map_err(io_err(format!("creating WAL segment {}", path.display())))?;
    if let Err(e) = file.write_all(MAGIC).and_then(|_| file.sync_data()) {
        // A segment cut short would read as damage once a later segment follows it: take it
        // away (it holds nothing), so a full disk fails this call and nothing after it.
        drop(file);
        if let Err(undo) = fs.remove(&path).and_then(|_| fs.sync_dir(dir)) {
            tracing::error!(segment = %path.display(), error = %undo, "cannot remove a WAL segment whose creation failed");
        }
        return Err(io_err(format!("writing WAL segment {}", path.display()))(e));
    }
    sync_dir(fs, dir)?;
    Ok((
        Arc::from(file),
        Segment {
            path,
            last_tx: 0,
            bytes: 0,
        },
    ))
}

/// Segment files of `dir` in transaction order.
fn list_segments(fs: &dyn FileSystem, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut segments = Vec::new();
    let names = match fs.list(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(segments),
        Err(e) => {
            return Err(io_err(format!("listing WAL directory {}", dir.display()))(
                e,
            ));
        }
    };
    for name in names {
        let Some(first_tx) = name
            .strip_suffix(".wal")
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        segments.push((first_tx, dir.join(name)));
    }
    segments.sort();
    Ok(segments)
}

/// What replay calls for each record: `(tx, payload, (segment or object, offset))`.
pub(crate) type Apply<'a> = dyn FnMut(u64, Vec<u8>, (&str, u64)) -> Result<()> + 'a;

/// A segment that replay read and that stays until its transactions are persisted.
#[derive(Debug, Clone)]
pub(crate) struct KeptSegment {
    last_tx: u64,
    path: PathBuf,
    bytes: u64,
}

/// What replay found.
#[derive(Debug, Default)]
pub(crate) struct Replayed {
    /// Records applied (after the persisted transaction).
    pub(crate) records: usize,
    /// Highest transaction seen.
    pub(crate) last_tx: u64,
    /// The highest first transaction a kept segment is named after: new transactions start
    /// at or above it, so that segment names keep the order of their records even when the
    /// newest segments hold none (their transactions failed, or were persisted and deleted).
    pub(crate) newest_segment: u64,
}

/// Reads the records of one segment (or object) `shown`, each of a transaction above the
/// one before (or the WAL is corrupt), and applies those above `after`: the segment's last
/// transaction (0 if it has none). What ends the segment is left to `reader.end()`.
fn apply_records<R: std::io::Read>(
    reader: &mut SegmentReader<R>,
    shown: &str,
    after: u64,
    replayed: &mut Replayed,
    apply: &mut Apply<'_>,
) -> Result<u64> {
    let mut last_tx = 0;
    for record in reader.by_ref() {
        let record = record?;
        if record.tx <= replayed.last_tx {
            return Err(Error::WalCorrupt {
                segment: shown.to_owned(),
                offset: record.offset,
                reason: format!(
                    "transaction {} does not follow transaction {}",
                    record.tx, replayed.last_tx
                ),
            });
        }
        replayed.last_tx = record.tx;
        last_tx = record.tx;
        if record.tx > after {
            apply(record.tx, record.payload, (shown, record.offset))?;
            replayed.records += 1;
        }
    }
    Ok(last_tx)
}

/// Replays the WAL in `dir`: calls `apply(tx, payload, (segment, offset))` for every record
/// with a transaction above `after`, in order, one record in memory at a time. A torn tail of
/// the last segment is cut off with a warning; damage anywhere else is an error naming
/// segment and offset.
pub(crate) fn replay(
    fs: &dyn FileSystem,
    dir: &Path,
    after: u64,
    apply: impl FnMut(u64, Vec<u8>, (&str, u64)) -> Result<()>,
) -> Result<(Replayed, Vec<KeptSegment>)> {
    replay_in(fs, dir, after, true, apply)
}

/// [`replay`] for a database opened read-only: the same records and the same errors, but a
/// torn tail is only skipped, not cut off, and nothing is synced: no file changes.
pub(crate) fn replay_read_only(
    fs: &dyn FileSystem,
    dir: &Path,
    apply: impl FnMut(u64, Vec<u8>, (&str, u64)) -> Result<()>,
) -> Result<Replayed> {
    replay_in(fs, dir, 0, false, apply).map(|(replayed, _)| replayed)
}

/// [`replay`]; `repair`: cut a torn tail off and sync what was read.
fn replay_in(
    fs: &dyn FileSystem,
    dir: &Path,
    after: u64,
    repair: bool,
    mut apply: impl FnMut(u64, Vec<u8>, (&str, u64)) -> Result<()>,
) -> Result<(Replayed, Vec<KeptSegment>)> {
    let segments = list_segments(fs, dir)?;
    let mut replayed = Replayed::default();
    let mut kept = Vec::new();
    for (i, (first_tx, path)) in segments.iter().enumerate() {
        let shown = path.display().to_string();
        let (file, len) = fs
            .open_read(path)
            .map_err(io_err(format!("opening WAL segment {shown}")))?;
        let mut reader = SegmentReader::new(shown.clone(), file, len)?;
        let last_tx = apply_records(&mut reader, &shown, after, &mut replayed, &mut apply)?;
        let mut bytes = len;
        if let Some(End::Torn { offset, reason }) = reader.end() {
            if i + 1 != segments.len() {
                return Err(Error::WalCorrupt {
                    segment: shown,
                    offset: *offset,
                    reason: format!("{reason}, and later segments follow"),
                });
            }
            if !repair {
                tracing::warn!(
                    segment = %shown,
                    offset,
                    %reason,
                    "skipping the torn tail of the WAL (an unacknowledged write cut short by a \
                     crash; opened read-only, so it stays until a writer opens the database)"
                );
                continue;
            }
            tracing::warn!(
                segment = %shown,
                offset,
                %reason,
                "dropping the torn tail of the WAL (an unacknowledged write cut short by a crash)"
            );
            if len < MAGIC.len() as u64 {
                // Created but cut off before its header was whole: it holds nothing, and
                // cutting it to its header's length would fill that with zeros.
                fs.remove(path)
                    .and_then(|_| fs.sync_dir(dir))
                    .map_err(io_err(format!("removing the headless WAL segment {shown}")))?;
                continue;
            }
            bytes = (*offset).max(MAGIC.len() as u64);
            fs.truncate(path, bytes)
                .map_err(io_err(format!("truncating the torn tail of {shown}")))?;
        } else if repair {
            // What replay read may never have been synced (a write whose fsync failed, or
            // a process killed before it synced): the records now get published, so make
            // them durable first. Otherwise a power loss after this open could tear a segment
            // that later segments follow, and the database would not open again.
            fs.sync_file(path)
                .map_err(io_err(format!("syncing WAL segment {shown}")))?;
        }
        replayed.newest_segment = *first_tx;
        kept.push(KeptSegment {
            last_tx,
            path: path.clone(),
            bytes,
        });
    }
    Ok((replayed, kept))
}

impl FileWal {
    /// Opens the WAL in `dir` for appending, after [`replay`]: `existing` are the segments
    /// replay kept, `next_tx` the first transaction to be written. Appends always go to a new
    /// segment.
    pub(crate) fn open(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        durability: Durability,
        segment_bytes: u64,
        existing: Vec<KeptSegment>,
        next_tx: u64,
    ) -> Result<Self> {
        fs.create_dir_all(dir)
            .map_err(io_err(format!("creating {}", dir.display())))?;
        let (file, current) = create_segment(&*fs, dir, next_tx)?;
        let closed = existing
            .into_iter()
            .filter(|k| k.path != current.path)
            .map(|k| Segment {
                path: k.path,
                last_tx: k.last_tx,
                bytes: k.bytes,
            })
            .collect();
        Ok(Self {
            fs,
            dir: dir.to_path_buf(),
            durability,
            segment_bytes,
            writer: Mutex::new(Writer {
                file,
                current,
                current_len: MAGIC.len() as u64,
                closed,
                written: 0,
            }),
            sync_lock: Mutex::new(()),
            durable: AtomicU64::new(0),
            poisoned: Poison::default(),
            records: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            sync_nanos: AtomicU64::new(0),
        })
    }

    /// Appends a record for `tx` and returns the position `sync` must reach for it to be
    /// durable. On failure nothing of the record remains in the log.
    pub(crate) fn append(&self, tx: u64, payload: &[u8]) -> Result<u64> {
        self.poisoned.check()?;
        let frame = record::frame(tx, payload);
        let mut w = self.writer.lock();
        if w.current_len >= self.segment_bytes && w.current.last_tx > 0 {
            self.rotate_locked(&mut w, tx)?;
        }
        let path = w.current.path.display().to_string();
        if let Err(e) = w.file.write_all(&frame) {
            // Cut off whatever part of the record reached the file, so that the next append
            // does not follow garbage. (Shrinking needs no space.)
            let undo = w.file.set_len(w.current_len);
            if let Err(undo) = undo {
                tracing::error!(segment = %path, error = %undo, "cannot cut a failed WAL append");
                // The next record would follow the garbage, be acknowledged, and make the
                // log unreadable at the next open: no more appends to this log.
                self.poisoned.set(format!(
                    "a failed append to WAL segment {path} could not be cut off: {undo}"
                ));
            }
            return Err(io_err(format!("appending to WAL segment {path}"))(e));
        }
        w.current_len += frame.len() as u64;
        w.current.last_tx = tx;
        w.written += frame.len() as u64;
        self.records.fetch_add(1, Ordering::Relaxed);
        Ok(w.written)
    }

    /// Makes everything up to `position` durable (fsync), sharing one fsync between
    /// concurrent writers; with group commit the syncing writer first waits up to the delay.
    pub(crate) fn sync(&self, position: u64) -> Result<()> {
        if self.durable.load(Ordering::Acquire) >= position {
            return Ok(());
        }
        let _leader = self.sync_lock.lock();
        if self.durable.load(Ordering::Acquire) >= position {
            return Ok(());
        }
        self.poisoned.check()?;
        if let Durability::GroupCommit { max_delay } = self.durability
            && max_delay > Duration::ZERO
        {
            std::thread::sleep(max_delay);
        }
        let (file, target, path) = {
            let w = self.writer.lock();
            let file = w.file.clone();
            (file, w.written, w.current.path.display().to_string())
        };
        let started = std::time::Instant::now();
        if let Err(e) = file.sync_data() {
            let error = io_err(format!("syncing WAL segment {path}"))(e);
            self.poisoned.set(format!("WAL sync failed: {error}"));
            return Err(error);
        }
        self.durable.fetch_max(target, Ordering::AcqRel);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        add_time(&self.sync_nanos, started);
        Ok(())
    }

    /// Records, fsyncs and bytes since open.
    pub(crate) fn stats(&self) -> WalStats {
        WalStats {
            records: self.records.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            bytes: self.writer.lock().written,
            sync_time: Duration::from_nanos(self.sync_nanos.load(Ordering::Relaxed)),
        }
    }

    /// The position up to which everything is durable.
    pub(crate) fn durable_position(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    fn rotate_locked(&self, w: &mut Writer, next_tx: u64) -> Result<()> {
        if let Err(e) = w.file.sync_data() {
            let error = io_err(format!("syncing {}", w.current.path.display()))(e);
            self.poisoned.set(format!("WAL sync failed: {error}"));
            return Err(error);
        }
        // Everything written so far is durable now.
        self.durable.fetch_max(w.written, Ordering::AcqRel);
        let (file, segment) = create_segment(&*self.fs, &self.dir, next_tx)?;
        let mut old = std::mem::replace(&mut w.current, segment);
        old.bytes = w.current_len;
        w.closed.push(old);
        w.file = file;
        w.current_len = MAGIC.len() as u64;
        Ok(())
    }

    /// Starts a new segment for the transactions appended from now on, so that the current
    /// one can be deleted once everything in it is persisted.
    pub(crate) fn rotate(&self) -> Result<()> {
        // After a failed fsync nothing may look durable: rotating would sync the segment and
        // advance the durable position past writes already reported failed.
        self.poisoned.check()?;
        let mut w = self.writer.lock();
        if w.current.last_tx == 0 {
            return Ok(());
        }
        let next = w.current.last_tx + 1;
        self.rotate_locked(&mut w, next)
    }

    /// Deletes the closed segments holding only transactions up to `tx`.
    pub(crate) fn truncate_through(&self, tx: u64) -> Result<usize> {
        let doomed: Vec<Segment> = {
            let mut w = self.writer.lock();
            let (doomed, kept) = w.closed.drain(..).partition(|s| s.last_tx <= tx);
            w.closed = kept;
            doomed
        };
        let (mut deleted, mut failed, mut error) = (0, Vec::new(), None);
        for s in doomed {
            match self.fs.remove(&s.path) {
                Ok(()) => deleted += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => deleted += 1,
                Err(e) => {
                    error.get_or_insert(io_err(format!("deleting {}", s.path.display()))(e));
                    failed.push(s);
                }
            }
        }
        if !failed.is_empty() {
            // Kept, and counted: the next truncation tries them again (the others went).
            let mut w = self.writer.lock();
            let kept = std::mem::take(&mut w.closed);
            w.closed = failed.into_iter().chain(kept).collect();
        }
        if deleted > 0 {
            sync_dir(&*self.fs, &self.dir)?;
        }
        match error {
            Some(error) => Err(error),
            None => Ok(deleted),
        }
    }

    /// Bytes of the WAL's segments, as written (no file system calls).
    pub(crate) fn total_bytes(&self) -> u64 {
        let w = self.writer.lock();
        w.closed.iter().map(|s| s.bytes).sum::<u64>() + w.current_len
    }

    /// Bytes held by the WAL's files. The closed segments' files are asked for their
    /// sizes outside the writer's lock: commits append meanwhile rather than wait on a
    /// `stat` per segment (a quota check runs this once a second per tenant).
    pub(crate) fn disk_bytes(&self) -> u64 {
        let (paths, current): (Vec<PathBuf>, u64) = {
            let w = self.writer.lock();
            (
                w.closed.iter().map(|s| s.path.clone()).collect(),
                w.current_len,
            )
        };
        let closed: u64 = paths.iter().filter_map(|p| self.fs.len(p).ok()).sum();
        closed + current
    }
}

#[cfg(test)]
mod tests {
    use std::fs::{self, OpenOptions};

    use super::*;
    use crate::fs::OsFs;

    fn os() -> Arc<dyn FileSystem> {
        Arc::new(OsFs)
    }

    fn collect(dir: &Path, after: u64) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        replay(&OsFs, dir, after, |tx, payload, _| {
            out.push((tx, payload));
            Ok(())
        })?;
        Ok(out)
    }

    /// The operating system's files, whose next deletions fail.
    #[derive(Debug, Default)]
    struct FailingRemoves(std::sync::atomic::AtomicUsize);

    impl FileSystem for FailingRemoves {
        fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
            OsFs.create_dir_all(dir)
        }
        fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
            OsFs.list(dir)
        }
        fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
            OsFs.read(path)
        }
        fn open_read(&self, path: &Path) -> std::io::Result<(Box<dyn std::io::Read + Send>, u64)> {
            OsFs.open_read(path)
        }
        fn create(&self, path: &Path) -> std::io::Result<Box<dyn crate::fs::WritableFile>> {
            OsFs.create(path)
        }
        fn sync_file(&self, path: &Path) -> std::io::Result<()> {
            OsFs.sync_file(path)
        }
        fn truncate(&self, path: &Path, len: u64) -> std::io::Result<()> {
            OsFs.truncate(path, len)
        }
        fn len(&self, path: &Path) -> std::io::Result<u64> {
            OsFs.len(path)
        }
        fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
            OsFs.rename(from, to)
        }
        fn remove(&self, path: &Path) -> std::io::Result<()> {
            let failing = self.0.load(Ordering::Acquire);
            if failing > 0 {
                self.0.store(failing - 1, Ordering::Release);
                return Err(std::io::Error::other("injected"));
            }
            OsFs.remove(path)
        }
        fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
            OsFs.sync_dir(dir)
        }
        fn lock(&self, dir: &Path) -> Result<Box<dyn Send + Sync>> {
            OsFs.lock(dir)
        }
    }

    /// A segment whose deletion failed stays listed and counted, the others go, and the
    /// next truncation deletes it (it was forgotten: on disk, uncounted, until the next
    /// open).
    #[test]
    fn a_segment_not_deleted_is_deleted_by_the_next_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let fs = Arc::new(FailingRemoves::default());
        let wal =
            FileWal::open(fs.clone(), dir.path(), Durability::Sync, 64, Vec::new(), 1).unwrap();
        for tx in 1..=6u64 {
            let at = wal.append(tx, &[tx as u8; 40]).unwrap();
            wal.sync(at).unwrap();
        }
        let on_disk = |wal: &FileWal| {
            let files = list_segments(&OsFs, dir.path()).unwrap();
            let bytes: u64 = files.iter().map(|(_, p)| OsFs.len(p).unwrap()).sum();
            (files.len(), bytes, wal.total_bytes())
        };
        let (before, ..) = on_disk(&wal);
        fs.0.store(1, Ordering::Release);
        assert!(wal.truncate_through(4).is_err());
        let (files, bytes, counted) = on_disk(&wal);
        assert!(
            files < before - 1,
            "the others were deleted: {files} of {before}"
        );
        assert_eq!(counted, bytes, "every file left is counted");
        assert_eq!(
            wal.truncate_through(4).unwrap(),
            1,
            "the one left is deleted"
        );
        let (after, bytes, counted) = on_disk(&wal);
        assert_eq!(after, files - 1);
        assert_eq!(counted, bytes);
    }

    #[test]
    fn appends_rotates_replays_and_truncates() {
        let dir = tempfile::tempdir().unwrap();
        let wal = FileWal::open(os(), dir.path(), Durability::Sync, 64, Vec::new(), 1).unwrap();
        for tx in 1..=10u64 {
            let at = wal.append(tx, &[tx as u8; 40]).unwrap();
            wal.sync(at).unwrap();
        }
        // 40-byte payloads and a 64-byte segment limit: one record per segment after the first.
        assert!(list_segments(&OsFs, dir.path()).unwrap().len() >= 5);
        let all = collect(dir.path(), 0).unwrap();
        assert_eq!(
            all.iter().map(|r| r.0).collect::<Vec<_>>(),
            (1..=10).collect::<Vec<_>>()
        );
        assert_eq!(collect(dir.path(), 7).unwrap().len(), 3);

        let removed = wal.truncate_through(6).unwrap();
        assert!(removed >= 5);
        let rest = collect(dir.path(), 0).unwrap();
        assert_eq!(rest.first().map(|r| r.0), Some(7));
        assert_eq!(rest.len(), 4);
    }

    #[test]
    fn reopening_continues_in_a_new_segment() {
        let dir = tempfile::tempdir().unwrap();
        let wal =
            FileWal::open(os(), dir.path(), Durability::Sync, 1 << 20, Vec::new(), 1).unwrap();
        wal.sync(wal.append(1, b"a").unwrap()).unwrap();
        drop(wal);
        let (replayed, kept) = replay(&OsFs, dir.path(), 0, |_, _, _| Ok(())).unwrap();
        assert_eq!((replayed.records, replayed.last_tx), (1, 1));
        let wal = FileWal::open(os(), dir.path(), Durability::Sync, 1 << 20, kept, 2).unwrap();
        wal.sync(wal.append(2, b"b").unwrap()).unwrap();
        assert_eq!(collect(dir.path(), 0).unwrap().len(), 2);
        wal.rotate().unwrap();
        assert_eq!(wal.truncate_through(2).unwrap(), 2);
        assert!(collect(dir.path(), 0).unwrap().is_empty());
    }

    #[test]
    fn a_torn_tail_is_cut_and_later_damage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let wal =
            FileWal::open(os(), dir.path(), Durability::Sync, 1 << 20, Vec::new(), 1).unwrap();
        for tx in 1..=3 {
            wal.sync(wal.append(tx, b"payload").unwrap()).unwrap();
        }
        drop(wal);
        let (_, path) = list_segments(&OsFs, dir.path()).unwrap().pop().unwrap();
        let len = fs::metadata(&path).unwrap().len();
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(len - 3).unwrap();
        assert_eq!(collect(dir.path(), 0).unwrap().len(), 2);
        assert_eq!(
            fs::metadata(&path).unwrap().len(),
            len - 27,
            "tail cut at the torn record"
        );

        // A second segment after damage turns the damage into corruption.
        let mut bytes = fs::read(&path).unwrap();
        bytes.extend([1u8; 5]);
        fs::write(&path, &bytes).unwrap();
        let next = segment_path(dir.path(), 9);
        let mut other = MAGIC.to_vec();
        other.extend(record::frame(9, b"x"));
        fs::write(&next, other).unwrap();
        let err = collect(dir.path(), 0).unwrap_err();
        assert!(
            matches!(&err, Error::WalCorrupt { segment, .. } if segment.contains("00000000000000000001")),
            "{err}"
        );
    }

    #[test]
    fn a_headless_last_segment_is_removed_and_new_segments_are_named_after_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let wal =
            FileWal::open(os(), dir.path(), Durability::Sync, 1 << 20, Vec::new(), 1).unwrap();
        wal.sync(wal.append(1, b"a").unwrap()).unwrap();
        wal.rotate().unwrap();
        drop(wal);
        // A segment whose creation was cut off after half its header (a full disk, a crash).
        fs::write(segment_path(dir.path(), 7), &MAGIC[..4]).unwrap();
        let (replayed, kept) = replay(&OsFs, dir.path(), 0, |_, _, _| Ok(())).unwrap();
        assert_eq!((replayed.records, replayed.last_tx), (1, 1));
        assert!(
            !segment_path(dir.path(), 7).exists(),
            "headless segment left"
        );
        assert_eq!(kept.len(), 2, "{kept:?}");
        // Segment 2 holds nothing yet: whatever comes next is named at or after it.
        assert_eq!(replayed.newest_segment, 2);
        let (again, _) = replay(&OsFs, dir.path(), 0, |_, _, _| Ok(())).unwrap();
        assert_eq!(again.records, 1, "the second open reads what the first did");
    }
}
