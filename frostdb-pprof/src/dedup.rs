//! Profiles stored once: a profile pushed again (a client retrying a push whose answer it
//! did not get, a file ingested twice) is recognised and not stored a second time, as
//! Pyroscope recognises a profile by its id.
//!
//! A profile is recognised by its content fingerprint, a 128-bit hash of its series,
//! timestamp and samples (see `Prepared::fingerprint` in `normalize`): two profiles have the
//! same one when they would store the same rows. Each stored profile's fingerprint is a row
//! of [`schema::FINGERPRINTS`](crate::schema::FINGERPRINTS), committed in the same
//! transaction as its samples: after a crash both are there or neither.
//!
//! The group commit (in `store`) checks, as a profile joins a group, the fingerprints
//! [`Recent`] holds (profiles committed and durable) and those of the groups still being
//! committed; a profile found in either is not stored, and one found in a group waits for
//! that group and answers as its members do (an error if it failed: the retry then stores
//! it). The check and the joining happen under the pipeline's lock, so two profiles stored
//! at once, or in one group, are one.
//!
//! Memory is bounded: [`Recent`] keeps the fingerprints of the profiles whose timestamps
//! lie within [`StoreOptions::dedup_window`](crate::StoreOptions::dedup_window) of the newest
//! stored (or of now, if that is earlier), at most [`MAX_KEPT`] of them, and reads those back
//! from the table when the store opens. A profile older than that, pushed again, is stored
//! again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, FixedSizeBinaryArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use frostdb_core::{Scalar, ScanRequest, Table, col};

use crate::error::{Error, Result};
use crate::schema::column::TIMESTAMP;

/// A profile's content fingerprint.
pub(crate) type ContentFingerprint = u128;

/// Most fingerprints a store keeps in memory (about 50 bytes each, some 13 MiB in all):
/// past it, the oldest stored are forgotten first.
pub(crate) const MAX_KEPT: usize = 1 << 18;

/// The fingerprints of the profiles stored lately (see the module docs).
#[derive(Debug)]
pub(crate) struct Recent {
    kept: std::collections::HashSet<ContentFingerprint, foldhash::fast::RandomState>,
    /// The fingerprints kept and their profiles' timestamps, in the order they were
    /// stored: the front is forgotten first.
    order: VecDeque<(i64, ContentFingerprint)>,
    /// The newest timestamp stored.
    newest: i64,
    /// How far behind the newest timestamp fingerprints are kept (0: none is).
    window_ms: i64,
}

impl Default for Recent {
    fn default() -> Self {
        Self::new(Duration::ZERO)
    }
}

impl Recent {
    /// None kept yet, keeping those within `window` (none when it is zero).
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            kept: Default::default(),
            order: VecDeque::new(),
            newest: i64::MIN,
            window_ms: i64::try_from(window.as_millis()).unwrap_or(i64::MAX),
        }
    }

    /// Those of `table` ([`crate::schema::fingerprints`]) within `window` of its newest.
    /// Reads the two columns of the rows of the window only (the table is sorted by time).
    pub(crate) fn open(table: &Table, window: Duration) -> Result<Self> {
        let mut recent = Self::new(window);
        if !recent.enabled() {
            return Ok(recent);
        }
        let started = std::time::Instant::now();
        let snapshot = table.snapshot();
        let newest = match snapshot.column_stats(TIMESTAMP).and_then(|s| s.max) {
            Some(Scalar::Int(newest)) => newest,
            _ => return Ok(recent), // no rows
        };
        recent.newest = newest;
        let request = ScanRequest::new()
            .project([TIMESTAMP, "fingerprint"])
            .filter(col(TIMESTAMP).gt_eq(recent.cutoff()));
        let mut stored: Vec<(i64, ContentFingerprint)> = Vec::new();
        for batch in snapshot.scan(&request)? {
            let batch = batch?;
            let (timestamps, fingerprints) = columns(&batch)?;
            for i in 0..batch.num_rows() {
                stored.push((timestamps.value(i), decode(fingerprints.value(i))?));
            }
        }
        let rows = stored.len();
        stored.sort_unstable();
        recent.insert(stored);
        tracing::debug!(
            rows,
            kept = recent.len(),
            seconds = started.elapsed().as_secs_f64(),
            "read the fingerprints of the recent profiles"
        );
        Ok(recent)
    }

    /// Whether profiles are recognised at all.
    pub(crate) fn enabled(&self) -> bool {
        self.window_ms > 0
    }

    /// Fingerprints kept.
    pub(crate) fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether a profile of this fingerprint is stored (and kept).
    pub(crate) fn contains(&self, fingerprint: ContentFingerprint) -> bool {
        self.kept.contains(&fingerprint)
    }

    /// Keeps the fingerprints of profiles stored (`(timestamp, fingerprint)`, oldest first),
    /// then forgets those out of the window, and the oldest past [`MAX_KEPT`].
    pub(crate) fn insert(&mut self, stored: impl IntoIterator<Item = (i64, ContentFingerprint)>) {
        if !self.enabled() {
            return;
        }
        for (timestamp, fingerprint) in stored {
            if self.kept.insert(fingerprint) {
                self.order.push_back((timestamp, fingerprint));
                self.newest = self.newest.max(timestamp);
            }
        }
        let cutoff = self.cutoff();
        while let Some(&(timestamp, fingerprint)) = self.order.front()
            && (timestamp < cutoff || self.order.len() > MAX_KEPT)
        {
            self.order.pop_front();
            self.kept.remove(&fingerprint);
        }
    }

    /// The oldest timestamp kept: the window behind the newest stored, or behind now when
    /// that is earlier (a profile from the future would otherwise push every other out).
    fn cutoff(&self) -> i64 {
        self.newest
            .min(frostdb_core::now_ms())
            .saturating_sub(self.window_ms)
    }
}

/// The [`crate::schema::fingerprints`] rows of profiles stored: `(timestamp, fingerprint)`.
pub(crate) fn rows(stored: &[(i64, ContentFingerprint)]) -> Result<RecordBatch> {
    let schema = Schema::new(vec![
        Field::new("fingerprint", DataType::FixedSizeBinary(16), false),
        Field::new(TIMESTAMP, DataType::Int64, false),
    ]);
    let fingerprints =
        FixedSizeBinaryArray::try_from_iter(stored.iter().map(|(_, f)| f.to_le_bytes()))?;
    let timestamps = Int64Array::from_iter_values(stored.iter().map(|(t, _)| *t));
    Ok(RecordBatch::try_new(
        Arc::new(schema),
        vec![Arc::new(fingerprints), Arc::new(timestamps)],
    )?)
}

/// The timestamp and fingerprint columns of a scan of the table.
fn columns(batch: &RecordBatch) -> Result<(&Int64Array, &FixedSizeBinaryArray)> {
    let timestamps = batch
        .column_by_name(TIMESTAMP)
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>());
    let fingerprints = batch
        .column_by_name("fingerprint")
        .and_then(|c| c.as_any().downcast_ref::<FixedSizeBinaryArray>());
    match (timestamps, fingerprints) {
        (Some(t), Some(f)) if t.null_count() == 0 && f.null_count() == 0 => Ok((t, f)),
        _ => Err(Error::Corrupt(
            "profile fingerprints are not a 16-byte fingerprint and an Int64 timestamp".into(),
        )),
    }
}

fn decode(bytes: &[u8]) -> Result<ContentFingerprint> {
    let bytes: [u8; 16] = bytes
        .try_into()
        .map_err(|_| Error::Corrupt(format!("a fingerprint of {} bytes", bytes.len())))?;
    Ok(u128::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_out_of_the_window_or_past_the_cap_are_forgotten() {
        const HOUR: i64 = 3_600_000;
        let mut recent = Recent::new(Duration::from_millis(HOUR as u64));
        let now = frostdb_core::now_ms();
        let t0 = now - 10 * HOUR;
        recent.insert([(t0, 1), (t0 + 1, 2)]);
        assert!(recent.contains(1) && recent.contains(2));
        // Kept again: no second entry.
        recent.insert([(t0, 1)]);
        assert_eq!(recent.len(), 2);
        recent.insert([(t0 + HOUR + 1, 3)]);
        assert!(!recent.contains(1), "more than an hour behind the newest");
        assert!(recent.contains(2) && recent.contains(3));
        recent.insert([(now, 5)]);
        assert!(!recent.contains(2) && !recent.contains(3));
        // A profile from the future does not push the present out.
        recent.insert([(now + 100 * 24 * HOUR, 4)]);
        assert!(recent.contains(4) && recent.contains(5));
        // The cap: the first stored go first.
        recent.insert((0..MAX_KEPT as u128).map(|i| (now, 100 + i)));
        assert_eq!(recent.len(), MAX_KEPT);
        assert!(!recent.contains(5) && !recent.contains(4));
        assert!(recent.contains(100) && recent.contains(99 + MAX_KEPT as u128));

        let mut off = Recent::new(Duration::ZERO);
        off.insert([(t0, 1)]);
        assert!(!off.contains(1));
    }
}
