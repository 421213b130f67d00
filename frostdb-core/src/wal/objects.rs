//! The WAL of a database shared through a bucket (`Db::open_shared`): in the bucket, so that
//! whichever process writes the database next replays every write this one acknowledged.
//!
//! Each sync uploads the records appended since the previous one as one object (several,
//! cut between records, when they are more than one may hold),
//! `<prefix>/wal/<seq:020>.wal`, in the file WAL's segment format (magic, then records), put
//! only if no object has that name (`PutMode::Create`). Sequence numbers have no gaps, and a
//! writer takes the next one only after its previous put succeeded. A new writer reads every
//! object there is, then creates the next one itself, empty: the fence. The old writer's
//! next put takes that name and fails, so it acknowledges nothing the new writer did not
//! read. Any failed put poisons the log (a put whose answer was lost may have landed, and
//! the next writer replays it: a write reported failed may appear, one reported durable
//! never disappears).
//!
//! Objects are whole or absent, so there is no torn tail: a damaged object is corruption.
//! Truncation deletes the objects whose transactions are all persisted in blocks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};
use parking_lot::Mutex;

use super::record::{self, End, MAGIC, SegmentReader};
use super::{Replayed, WalStats};
use crate::error::{Error, Result};
use crate::io::Io;
use crate::options::Durability;

/// An object of the log this process knows of.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    seq: u64,
    /// Highest transaction it holds (0 for an empty one, a fence).
    last_tx: u64,
    bytes: u64,
}

/// Records appended and not yet uploaded.
struct Pending {
    frames: Vec<u8>,
    /// Where each record in `frames` ends, and its transaction.
    ends: Vec<(usize, u64)>,
    /// Bytes appended since open: the position `sync` makes durable.
    written: u64,
    records: u64,
}

/// Objects written or replayed, and the next sequence number.
struct Uploaded {
    next_seq: u64,
    kept: Vec<Kept>,
}

/// The log of a shared database.
pub(crate) struct ObjectWal {
    store: Arc<dyn ObjectStore>,
    dir: ObjectPath,
    io: Io,
    durability: Durability,
    pending: Mutex<Pending>,
    /// Held by the writer uploading (the leader of a group), so objects go up in order.
    uploaded: Mutex<Uploaded>,
    durable: AtomicU64,
    pub(super) poisoned: super::Poison,
    syncs: AtomicU64,
    sync_nanos: AtomicU64,
}

impl std::fmt::Debug for ObjectWal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectWal")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn object_path(dir: &ObjectPath, seq: u64) -> ObjectPath {
    dir.clone().join(format!("{seq:020}.wal"))
}

fn store_err(context: String) -> impl FnOnce(object_store::Error) -> Error {
    move |source| Error::ObjectStore { context, source }
}

/// The log's objects from sequence number `from` on, in order.
fn list(
    store: &Arc<dyn ObjectStore>,
    dir: &ObjectPath,
    io: &Io,
    from: u64,
) -> Result<Vec<(u64, ObjectPath)>> {
    let (s, d) = (store.clone(), dir.clone());
    let listed = io.run(async move {
        use futures::TryStreamExt;
        s.list(Some(&d))
            .map_ok(|m| m.location)
            .try_collect::<Vec<_>>()
            .await
    })?;
    let listed = listed.map_err(store_err(format!("listing WAL objects under {dir}")))?;
    let mut objects: Vec<(u64, ObjectPath)> = listed
        .into_iter()
        .filter_map(|path| {
            let seq = path.filename()?.strip_suffix(".wal")?.parse::<u64>().ok()?;
            (seq >= from).then_some((seq, path))
        })
        .collect();
    objects.sort();
    Ok(objects)
}

/// Reads the log in `dir` from sequence number `from` on: calls `apply(tx, payload,
/// (object, offset))` for every record, in order. Returns the objects read and the
/// sequence number after the highest listed.
pub(crate) fn replay(
    store: &Arc<dyn ObjectStore>,
    dir: &ObjectPath,
    io: &Io,
    from: u64,
    replayed: &mut Replayed,
    apply: &mut super::Apply<'_>,
) -> Result<(Vec<Kept>, u64)> {
    let mut kept = Vec::new();
    let listed = list(store, dir, io, from)?;
    let next = listed.last().map_or(from, |(seq, _)| seq + 1);
    for (seq, path) in listed {
        let shown = path.to_string();
        let (s, p) = (store.clone(), path.clone());
        let bytes = match io.run(async move {
            let got = s.get(&p).await?;
            crate::io::bytes_within(got, "WAL object", crate::io::MAX_WAL_OBJECT_BYTES).await
        })? {
            Ok(bytes) => bytes,
            // Deleted since the listing: truncation deletes only what blocks hold.
            Err(object_store::Error::NotFound { .. }) => continue,
            Err(e) => return Err(store_err(format!("reading WAL object {shown}"))(e)),
        };
        let mut reader = SegmentReader::new(shown.clone(), &bytes[..], bytes.len() as u64)?;
        // Every record is handed to `apply`, which skips what blocks hold.
        let last_tx = super::apply_records(&mut reader, &shown, 0, replayed, apply)?;
        if let Some(End::Torn { offset, reason }) = reader.end() {
            return Err(Error::WalCorrupt {
                segment: shown,
                offset: *offset,
                reason: format!("{reason} (a WAL object is written whole: it was damaged)"),
            });
        }
        kept.push(Kept {
            seq,
            last_tx,
            bytes: bytes.len() as u64,
        });
    }
    Ok((kept, next))
}

/// Creates WAL object `seq`, empty. `Ok(false)` when it exists already.
pub(crate) fn fence(
    store: &Arc<dyn ObjectStore>,
    dir: &ObjectPath,
    io: &Io,
    seq: u64,
) -> Result<bool> {
    let path = object_path(dir, seq);
    let shown = path.to_string();
    let s = store.clone();
    match io.run(async move {
        s.put_opts(
            &path,
            MAGIC.to_vec().into(),
            PutOptions::from(PutMode::Create),
        )
        .await
    })? {
        Ok(_) => Ok(true),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
        Err(e) => Err(store_err(format!("creating WAL object {shown}"))(e)),
    }
}

impl ObjectWal {
    /// The log in `dir`, after replay read the objects `kept` and the fence took `fence`.
    pub(crate) fn open(
        store: Arc<dyn ObjectStore>,
        dir: ObjectPath,
        io: Io,
        durability: Durability,
        mut kept: Vec<Kept>,
        fence: u64,
    ) -> Self {
        kept.push(Kept {
            seq: fence,
            last_tx: 0,
            bytes: MAGIC.len() as u64,
        });
        Self {
            store,
            dir,
            io,
            durability,
            pending: Mutex::new(Pending {
                frames: Vec::new(),
                ends: Vec::new(),
                written: 0,
                records: 0,
            }),
            uploaded: Mutex::new(Uploaded {
                next_seq: fence + 1,
                kept,
            }),
            durable: AtomicU64::new(0),
            poisoned: super::Poison::default(),
            syncs: AtomicU64::new(0),
            sync_nanos: AtomicU64::new(0),
        }
    }

    pub(crate) fn append(&self, tx: u64, payload: &[u8]) -> Result<u64> {
        self.poisoned.check()?;
        let frame = record::frame(tx, payload);
        let mut p = self.pending.lock();
        p.frames.extend_from_slice(&frame);
        let end = p.frames.len();
        p.ends.push((end, tx));
        p.written += frame.len() as u64;
        p.records += 1;
        Ok(p.written)
    }

    /// Uploads everything appended up to `position` (and whatever else is pending) as one
    /// object, or as several in order when it is more than one may hold (records appended
    /// while a slow upload ran): replay refuses an object over
    /// [`crate::io::MAX_WAL_OBJECT_BYTES`], and one acknowledged would have kept every
    /// writer from opening the database. Concurrent writers share the upload.
    pub(crate) fn sync(&self, position: u64) -> Result<()> {
        if self.durable.load(Ordering::Acquire) >= position {
            return Ok(());
        }
        let mut uploaded = self.uploaded.lock();
        if self.durable.load(Ordering::Acquire) >= position {
            return Ok(());
        }
        self.poisoned.check()?;
        if let Durability::GroupCommit { max_delay } = self.durability
            && max_delay > Duration::ZERO
        {
            std::thread::sleep(max_delay);
        }
        let started = std::time::Instant::now();
        let (frames, ends, target) = {
            let mut p = self.pending.lock();
            (
                std::mem::take(&mut p.frames),
                std::mem::take(&mut p.ends),
                p.written,
            )
        };
        let limit = crate::io::MAX_WAL_OBJECT_BYTES as usize - MAGIC.len();
        for (records, last_tx) in objects(&ends, limit) {
            self.upload(&mut uploaded, &frames[records], last_tx)?;
        }
        self.durable.fetch_max(target, Ordering::AcqRel);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        super::add_time(&self.sync_nanos, started);
        Ok(())
    }

    /// Uploads `frames` (whole records, the last of transaction `last_tx`) as the next
    /// object; a failure poisons the log.
    fn upload(&self, uploaded: &mut Uploaded, frames: &[u8], last_tx: u64) -> Result<()> {
        let mut body = Vec::with_capacity(MAGIC.len() + frames.len());
        body.extend_from_slice(MAGIC);
        body.extend_from_slice(frames);
        let bytes = body.len() as u64;
        let seq = uploaded.next_seq;
        let path = object_path(&self.dir, seq);
        let shown = path.to_string();
        let store = self.store.clone();
        let put = self.io.run(async move {
            store
                .put_opts(&path, body.into(), PutOptions::from(PutMode::Create))
                .await
        });
        let error = match put {
            Ok(Ok(_)) => None,
            Ok(Err(object_store::Error::AlreadyExists { .. })) => Some(Error::Fenced {
                prefix: self.dir.to_string(),
                reason: format!(
                    "WAL object {shown} was written by another writer, which took over"
                ),
            }),
            Ok(Err(e)) => Some(store_err(format!("writing WAL object {shown}"))(e)),
            Err(e) => Some(e),
        };
        if let Some(error) = error {
            self.poisoned.set(format!("WAL upload failed: {error}"));
            return Err(error);
        }
        uploaded.next_seq += 1;
        uploaded.kept.push(Kept {
            seq,
            last_tx,
            bytes,
        });
        Ok(())
    }

    pub(crate) fn durable_position(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    pub(crate) fn stats(&self) -> WalStats {
        let p = self.pending.lock();
        WalStats {
            records: p.records,
            syncs: self.syncs.load(Ordering::Relaxed),
            bytes: p.written,
            sync_time: std::time::Duration::from_nanos(self.sync_nanos.load(Ordering::Relaxed)),
        }
    }

    /// Deletes the objects holding only transactions up to `tx` (fences among them), but
    /// never the newest: its name keeps the sequence going for the next writer.
    pub(crate) fn truncate_through(&self, tx: u64) -> Result<usize> {
        let doomed: Vec<Kept> = {
            let mut u = self.uploaded.lock();
            let newest = u.kept.iter().map(|k| k.seq).max();
            let (doomed, kept) = u
                .kept
                .drain(..)
                .partition(|k| k.last_tx <= tx && Some(k.seq) != newest);
            u.kept = kept;
            doomed
        };
        for k in &doomed {
            let path = object_path(&self.dir, k.seq);
            let (store, p) = (self.store.clone(), path.clone());
            match self.io.run(async move { store.delete(&p).await })? {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(store_err(format!("deleting WAL object {path}"))(e)),
            }
        }
        Ok(doomed.len())
    }

    /// Bytes of the log's objects and of what is pending.
    pub(crate) fn total_bytes(&self) -> u64 {
        let kept: u64 = self.uploaded.lock().kept.iter().map(|k| k.bytes).sum();
        kept + self.pending.lock().frames.len() as u64
    }
}

/// The objects pending records (`ends`: where each ends, and its transaction) are uploaded
/// as: runs of whole records of at most `limit` bytes each (a record alone may be more),
/// and the last transaction of each.
fn objects(ends: &[(usize, u64)], limit: usize) -> Vec<(std::ops::Range<usize>, u64)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut last: Option<(usize, u64)> = None;
    for &(end, tx) in ends {
        if let Some((at, last_tx)) = last
            && end - start > limit
        {
            out.push((start..at, last_tx));
            start = at;
        }
        last = Some((end, tx));
    }
    if let Some((end, tx)) = last {
        out.push((start..end, tx));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pending records are uploaded in objects of at most the limit, cut between records,
    /// in order, none left out; a record over the limit is an object by itself.
    #[test]
    fn pending_records_are_cut_into_objects_replay_accepts() {
        // Records of 40, 40, 30, 90 and 10 bytes, transactions 1 to 5.
        let ends = [(40, 1), (80, 2), (110, 3), (200, 4), (210, 5)];
        assert_eq!(
            objects(&ends, 100),
            vec![(0..80, 2), (80..110, 3), (110..210, 5)]
        );
        assert_eq!(objects(&ends, 1_000), vec![(0..210, 5)]);
        assert_eq!(
            objects(&ends, 10),
            vec![
                (0..40, 1),
                (40..80, 2),
                (80..110, 3),
                (110..200, 4),
                (200..210, 5)
            ]
        );
        assert!(objects(&[], 100).is_empty());
    }
}
