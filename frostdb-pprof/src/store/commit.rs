//! Group commit: profiles prepared on many threads join the open group; its leader
//! interns their symbols, writes their rows and the derived rows ([`super::derived`]) in one
//! transaction, and every member learns when it is durable.
//!
//! Why profiles' rows are coalesced here, not in the engine's commit log: the engine
//! ([`frostdb_core::Transaction`]) already shares fsyncs between concurrent transactions of
//! any tables, so what this group adds is fewer and larger transactions (one WAL record,
//! one Arrow batch and one chunk for dozens of profiles of ~150 rows, instead of a chunk
//! per profile left for compaction to merge). What goes into one is profile knowledge the
//! engine has no words for: the symbols a partition gained since its previous group
//! (written with the rows that use them), the content fingerprints that make a profile
//! pushed twice stored once, the series admitted under the series limit, and the series
//! index and totals rows computed over the group's batch. Coalescing generic inserts in the
//! engine would still leave all of that here, so the group stays the store's, and the
//! engine's commit log stays about durability and publication order.

use super::*;

/// Most sample rows a group of profiles commits in one transaction.
pub(super) const MAX_GROUP_ROWS: usize = 64 * 1024;
/// The rows the samples table takes in one insert (its `max_batch_rows`, the default): a
/// group is sealed before it would hold more.
pub(super) const MAX_BATCH_ROWS: usize = 4 << 20;

/// Where a group of profiles stands.
pub(super) enum SlotState {
    /// Profiles are joining it, or it waits for its turn.
    Waiting,
    /// The leader handed over: the member that sees this commits the next groups.
    Lead,
    /// In the WAL (not yet known durable), or failed.
    Done(std::result::Result<Arc<Submitted>, Arc<Error>>),
}

/// What the members of a group wait on. std's mutex and condvar, like the pipeline's (see
/// [`ProfileStore::pipeline`]): a group's members, woken together, each take the mutex
/// briefly.
pub(super) struct Slot {
    pub(super) state: std::sync::Mutex<SlotState>,
    pub(super) ready: std::sync::Condvar,
}

impl Slot {
    pub(super) fn new() -> Self {
        Self {
            state: std::sync::Mutex::new(SlotState::Waiting),
            ready: std::sync::Condvar::new(),
        }
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn finish(&self, result: std::result::Result<Arc<Submitted>, Arc<Error>>) {
        *self.state() = SlotState::Done(result);
        self.ready.notify_all();
    }

    pub(super) fn hand_lead(&self) {
        *self.state() = SlotState::Lead;
        self.ready.notify_one();
    }
}

/// Profiles' sample rows committed as one transaction, with the symbols their partition
/// gained since the partition's previous group.
pub(super) struct Group {
    pub(super) partition: Arc<Partition>,
    /// The partition's symbols from here (to `to`) are written with the group.
    pub(super) from: Counts,
    pub(super) to: Counts,
    pub(super) rows: SampleRows,
    /// Rows of the samples labelled with a span (the `spans` table).
    pub(super) spans: SampleRows,
    /// The series keys of its profiles, with their days ([`crate::limits`]).
    pub(super) keys: Vec<(u64, i64)>,
    /// Its profiles' timestamps and content fingerprints ([`crate::dedup`]).
    pub(super) fingerprints: Vec<(i64, ContentFingerprint)>,
    pub(super) slot: Arc<Slot>,
    /// Why a profile's rows could not be appended whole, if one could not.
    pub(super) broken: Option<String>,
}

impl Group {
    pub(super) fn new(partition: Arc<Partition>, from: Counts) -> Self {
        Self {
            partition,
            from,
            to: from,
            rows: SampleRows::default(),
            spans: SampleRows::default(),
            keys: Vec::new(),
            fingerprints: Vec::new(),
            slot: Arc::new(Slot::new()),
            broken: None,
        }
    }
}

/// The groups of a store.
#[derive(Default)]
pub(super) struct Pipeline {
    /// The group profiles join.
    pub(super) open: Option<Group>,
    /// Groups closed to new profiles, in commit order.
    pub(super) sealed: VecDeque<Group>,
    /// Per partition (newest few), the symbols up to which a group writes them.
    pub(super) cuts: Vec<(u32, Counts)>,
    /// Whether a member is committing groups (or the lead is being handed to one).
    pub(super) leading: bool,
    /// Partitions a group of failed to commit: nothing more of them commits.
    pub(super) failed: Vec<u32>,
    /// The group committed last (its slot, transaction and fingerprints), until it is
    /// durable: the leader lets the open group gather profiles while its fsync runs,
    /// rather than committing groups of one, and then wakes its members.
    pub(super) in_flight: Option<InFlight>,
    /// Whether the leader is waiting on [`ProfileStore::joined`] for company: only then
    /// is it signalled (a signal is a system call, waiter or not).
    pub(super) gathering: bool,
    /// The fingerprints of the profiles of the groups not yet durable (open, sealed,
    /// committing, in flight), with their group's slot: a profile stored again meanwhile
    /// waits for that group ([`crate::dedup`]).
    pub(super) pending:
        std::collections::HashMap<ContentFingerprint, Arc<Slot>, foldhash::fast::RandomState>,
    /// The fingerprints of the profiles stored lately (durable).
    pub(super) recent: Recent,
}

/// A group's profiles' timestamps and content fingerprints ([`crate::dedup`]).
pub(super) type Fingerprints = Vec<(i64, ContentFingerprint)>;

/// A group committed, until it is durable.
pub(super) type InFlight = (Arc<Slot>, Arc<Submitted>, Fingerprints);

/// Whether a profile joining a group was stored already.
pub(super) enum Stored {
    /// No: it joins the group.
    No,
    /// Yes, durably.
    Yes,
    /// By this group, not yet durable.
    By(Arc<Slot>),
}

impl Pipeline {
    /// Closes the open group to new profiles: it writes its partition's symbols up to now.
    /// Symbols being added meanwhile may be included; a profile using them joins later.
    pub(super) fn seal(&mut self) {
        if let Some(mut group) = self.open.take() {
            group.to = group.partition.counts();
            let id = group.partition.id();
            self.cuts.retain(|(p, _)| *p != id);
            self.cuts.push((id, group.to));
            if self.cuts.len() > 4 {
                self.cuts.remove(0);
            }
            self.sealed.push_back(group);
        }
    }

    /// Whether the profile of `fingerprint` is stored (or being stored).
    pub(super) fn stored(&self, fingerprint: ContentFingerprint) -> Stored {
        if let Some(slot) = self.pending.get(&fingerprint) {
            Stored::By(slot.clone())
        } else if self.recent.contains(fingerprint) {
            Stored::Yes
        } else {
            Stored::No
        }
    }

    /// A group's profiles are durable (`durable`), or failed: their fingerprints leave
    /// `pending`, for `recent` or (failed: a retry stores them) for nowhere.
    pub(super) fn settle(&mut self, fingerprints: Vec<(i64, ContentFingerprint)>, durable: bool) {
        for (_, fingerprint) in &fingerprints {
            self.pending.remove(fingerprint);
        }
        if durable {
            self.recent.insert(fingerprints);
        }
    }

    /// Where the next group of partition `id` starts writing its symbols.
    pub(super) fn cut(&self, id: u32) -> Counts {
        self.cuts
            .iter()
            .find(|(p, _)| *p == id)
            .map_or_else(Counts::default, |(_, c)| *c)
    }
}

/// Whether a leader whose open group holds `joined` profiles keeps it open for the `coming`
/// ones still being decoded. It waits while they are more than a quarter of the group: a
/// group then takes most of the profiles in motion, and the few still on their way keep
/// the cores busy while it commits and syncs, and start the next one. Waiting for every
/// last one instead had all of them joining one group, then nothing to do during its sync
/// (about 13% of two cores idle on the small fleet's ingest, against 9%).
pub(super) fn worth_waiting_for(coming: usize, joined: usize) -> bool {
    coming > 0 && coming * 4 > joined
}

/// A profile on its way to a group: counted in [`ProfileStore::coming`] from before its
/// decoding until it joins a group or fails.
pub(super) struct Coming<'a> {
    pub(super) store: &'a ProfileStore,
    pub(super) counted: bool,
}

impl<'a> Coming<'a> {
    pub(super) fn new(store: &'a ProfileStore) -> Self {
        store
            .coming
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Self {
            store,
            counted: true,
        }
    }

    /// The profile joined a group: how many others are still on their way.
    pub(super) fn arrive(&mut self) -> usize {
        use std::sync::atomic::Ordering;
        if std::mem::replace(&mut self.counted, false) {
            self.store.coming.fetch_sub(1, Ordering::AcqRel) - 1
        } else {
            self.store.coming.load(Ordering::Acquire)
        }
    }
}

impl Drop for Coming<'_> {
    fn drop(&mut self) {
        // A profile that failed (or was empty) is not coming: a leader waiting for it asks
        // again whether the rest are worth waiting for.
        if self.counted {
            self.arrive();
            if self.store.pipeline().gathering {
                self.store.joined.notify_one();
            }
        }
    }
}

/// The group a leader holds (committing it, or waiting for its sync), with its
/// fingerprints. A leader that unwinds (a bug outside [`ProfileStore::commit_group`]'s own
/// catch) fails it and passes the lead on as it goes: unwound past, the group's members,
/// and every later profile of the store, waited for a leader that was gone.
struct InHand<'a> {
    store: &'a ProfileStore,
    held: Option<(Arc<Slot>, Fingerprints)>,
}

impl Drop for InHand<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        tracing::error!("a leader of group commits panicked: its group failed");
        if let Some((slot, fingerprints)) = self.held.take() {
            // Not known stored: a retry stores them (or finds them, if they were).
            self.store.pipeline().settle(fingerprints, false);
            slot.finish(Err(Arc::new(Error::Engine(frostdb_core::Error::Internal(
                "the leader of its group commit panicked (a bug, logged); the profiles may \
                 not be stored: retry"
                    .into(),
            )))));
        }
        // A group committed and not yet synced: its members learn of it from the next
        // leader, which waits for its sync.
        self.store.hand_lead();
    }
}

impl ProfileStore {
    /// The group commit pipeline. A std mutex: it spins briefly and then sleeps, where
    /// parking_lot's yields the CPU again and again, which with many clients on few cores
    /// cost more than the short critical sections it guards.
    pub(super) fn pipeline(&self) -> std::sync::MutexGuard<'_, Pipeline> {
        self.pipeline
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for `slot`'s group to be durable (or failed), committing groups when handed the
    /// lead.
    pub(super) fn await_group(&self, slot: &Arc<Slot>) -> Result<Arc<Submitted>> {
        let mut state = slot.state();
        loop {
            match &*state {
                SlotState::Done(Ok(submitted)) => return Ok(submitted.clone()),
                SlotState::Done(Err(e)) => return Err(Error::Group(e.clone())),
                SlotState::Lead => {
                    *state = SlotState::Waiting;
                    drop(state);
                    self.lead(slot);
                    state = slot.state();
                }
                SlotState::Waiting => {
                    state = slot
                        .ready
                        .wait(state)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                }
            }
        }
    }

    /// Commits groups in order until `mine` is durable, then hands the lead to a member of
    /// the next group (or gives it up when there is none).
    ///
    /// A committed group is in flight until its fsync returns: meanwhile profiles keep
    /// joining the open group, so the next fsync covers all of them (alone, nothing is in
    /// flight and nothing waits for company). Members are woken once, when their group is
    /// durable (or failed), rather than once when it is in the WAL and again when synced.
    pub(super) fn lead(&self, mine: &Arc<Slot>) {
        // What the leader holds whose members wait on it: failed if the leader unwinds.
        let mut hand = InHand {
            store: self,
            held: None,
        };
        loop {
            let in_flight = self.pipeline().in_flight.take();
            if let Some((slot, submitted, fingerprints)) = in_flight {
                hand.held = Some((slot, fingerprints));
                // The sync's error, if any, is the members' to see from `wait` themselves;
                // their profiles are not known stored, and a retry stores them.
                let durable = submitted.wait().is_ok();
                #[cfg(test)]
                tests::panic_if_asked();
                let (slot, fingerprints) = hand.held.take().expect("held above");
                if !fingerprints.is_empty() {
                    self.pipeline().settle(fingerprints, durable);
                }
                let was_mine = Arc::ptr_eq(&slot, mine);
                slot.finish(Ok(submitted));
                if was_mine {
                    self.hand_lead();
                    return;
                }
            }
            let mut group = {
                let mut pipeline = self.pipeline();
                let deadline = std::time::Instant::now() + self.options.group_wait;
                while pipeline.sealed.is_empty()
                    && pipeline.open.as_ref().is_some_and(|g| {
                        worth_waiting_for(
                            self.coming.load(std::sync::atomic::Ordering::Acquire),
                            g.rows.profiles(),
                        )
                    })
                {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    pipeline.gathering = true;
                    let (guard, waited) = self
                        .joined
                        .wait_timeout(pipeline, left)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    pipeline = guard;
                    pipeline.gathering = false;
                    if waited.timed_out() {
                        break;
                    }
                }
                if pipeline.sealed.is_empty() {
                    pipeline.seal();
                }
                match pipeline.sealed.pop_front() {
                    Some(group) => group,
                    None => {
                        pipeline.leading = false;
                        return;
                    }
                }
            };
            let fingerprints = std::mem::take(&mut group.fingerprints);
            let (slot, fingerprints) = hand.held.insert((group.slot.clone(), fingerprints));
            let slot = slot.clone();
            let committed = self.commit_group(group, fingerprints);
            let (_, fingerprints) = hand.held.take().expect("held above");
            match committed {
                Ok(submitted) => {
                    self.pipeline().in_flight = Some((slot, submitted, fingerprints));
                }
                Err(e) => {
                    // Before the members wake: their retries are not taken for duplicates.
                    self.pipeline().settle(fingerprints, false);
                    slot.finish(Err(e));
                    if Arc::ptr_eq(&slot, mine) {
                        self.hand_lead();
                        return;
                    }
                }
            }
        }
    }

    /// Passes the lead to a member of the next group, or gives it up when there is none.
    fn hand_lead(&self) {
        let mut pipeline = self.pipeline();
        match pipeline.sealed.front().or(pipeline.open.as_ref()) {
            Some(next) => next.slot.hand_lead(),
            None => pipeline.leading = false,
        }
    }

    /// Submits one group: its partition's new symbols, its samples and its profiles'
    /// `fingerprints`, one transaction.
    fn commit_group(
        &self,
        mut group: Group,
        fingerprints: &[(i64, ContentFingerprint)],
    ) -> std::result::Result<Arc<Submitted>, Arc<Error>> {
        let id = group.partition.id();
        if self.pipeline().failed.contains(&id) {
            return Err(Arc::new(Error::Unavailable(format!(
                "symbol partition {id} could not be written"
            ))));
        }
        // A panic storing the group (a bug, or an input no check foresaw) fails the group as
        // an error would: unwinding past the leader left the group's members, and every
        // later profile of the store, waiting for a leader that was gone.
        let submitted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if let Some(reason) = group.broken.take() {
                return Err(Error::Unavailable(format!(
                    "a profile stored in the same group failed: {reason}"
                )));
            }
            tracing::trace!(
                partition = id,
                profiles = group.rows.profiles(),
                rows = group.rows.len(),
                "committing a group of profiles"
            );
            let crate::normalize::Finished {
                batch: samples,
                series: keys,
                totals,
            } = group.rows.finish_sorted(&self.samples)?;
            let index = self.indexed.lock().new_rows(&samples, keys)?;
            let series_keys = match &self.series_keys {
                Some(table) => self
                    .series
                    .lock()
                    .new_rows(&group.keys)?
                    .map(|rows| (table, rows)),
                None => None,
            };
            let mut tx = self.db.transaction();
            for (table, batch) in
                self.symbols
                    .tables()
                    .batches(&group.partition, group.from, group.to)?
            {
                tx.insert(table, &batch)?;
            }
            // The index before the samples: a snapshot of the samples taken before one of
            // the index (see `merge_reading`) finds every series it holds in the index.
            if let Some((rows, _)) = &index {
                tx.insert(&self.series_index, rows)?;
            }
            if let Some((table, (rows, _))) = &series_keys {
                tx.insert(table, rows)?;
            }
            tx.insert(&self.samples, &samples)?;
            tx.insert(
                &self.totals,
                &derived::totals_from(&samples, &totals, self.totals_keyed)?,
            )?;
            if group.spans.len() > 0 {
                tx.insert(&self.spans, &group.spans.finish()?)?;
            }
            if let Some(table) = &self.fingerprints
                && !fingerprints.is_empty()
            {
                tx.insert(table, &crate::dedup::rows(fingerprints)?)?;
            }
            // Rows of hours already rolled up are added to their rollups, in this transaction.
            let submitted = self.rollups.submit(tx, &samples)?;
            if let Some((_, keys)) = index {
                self.indexed.lock().committed(keys);
            }
            if let Some((_, (_, keys))) = series_keys {
                self.series.lock().committed(keys);
            }
            Ok::<_, Error>(submitted)
        }))
        .unwrap_or_else(|panic| {
            let message = frostdb_core::panic_message(&*panic);
            tracing::error!(partition = id, %message, "storing a group of profiles panicked");
            Err(Error::Engine(frostdb_core::Error::Internal(format!(
                "storing a group of profiles panicked: {message}"
            ))))
        });
        match submitted {
            Ok(submitted) => {
                // Locations stored as addresses: named in the background, never here.
                self.naming.committed(&group.partition);
                Ok(submitted)
            }
            Err(e) => {
                // Its symbols may be used by later profiles, whose groups must not commit
                // without them: the partition takes no more, and nothing more of it commits.
                tracing::warn!(partition = id, error = %e, "a group of profiles failed to commit");
                self.pipeline().failed.push(id);
                self.symbols.rotate(id);
                Err(Arc::new(e))
            }
        }
    }

    /// Profiles in the open group: stored, waiting for their group to be committed (for
    /// tests of group commit).
    #[doc(hidden)]
    pub fn profiles_awaiting_commit(&self) -> usize {
        self.pipeline()
            .open
            .as_ref()
            .map_or(0, |g| g.rows.profiles())
    }
}

#[cfg(test)]
mod tests {
    use frostdb_core::DbOptions;

    use super::*;
    use crate::decode::validate;
    use crate::testing::{profile, total};

    #[test]
    fn profiles_stored_while_a_group_commits_share_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
        let before = store.db().wal_stats().unwrap().records;
        // A leader is busy committing: profiles join the open group and wait for it.
        store.pipeline().leading = true;
        const N: u64 = 6;
        std::thread::scope(|s| {
            let store = &store;
            let workers: Vec<_> = (0..N)
                .map(|i| {
                    s.spawn(move || {
                        let p = validate(profile(i * 10, 10, 3), &Limits::default()).unwrap();
                        let options = IngestOptions {
                            name: "process_cpu".into(),
                            labels: vec![("pod".into(), format!("pod-{i}"))],
                            timestamp_ms: Some(1_700_000_000_000 + i as i64),
                            ..IngestOptions::default()
                        };
                        store.ingest_profile(&p, &options)
                    })
                })
                .collect();
            let slot = loop {
                if let Some(group) = &store.pipeline().open
                    && group.rows.profiles() == N as usize
                {
                    break group.slot.clone();
                }
                std::thread::yield_now();
            };
            assert_eq!(store.db().wal_stats().unwrap().records, before);
            store.lead(&slot);
            for w in workers {
                assert_eq!(w.join().unwrap().unwrap().rows, 10);
            }
        });
        assert_eq!(
            store.db().wal_stats().unwrap().records - before,
            1,
            "the group is one transaction"
        );
        assert!(!store.pipeline().leading, "the lead was given up");
        let selector = Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds{}").unwrap();
        let merged = store
            .merge(&selector, frostdb_profile::TimeRange::ALL)
            .unwrap();
        assert_eq!(merged.total(), total(0, N as usize * 10));
        // Each profile's series label went with its own rows.
        let pods = store
            .label_values(
                "pod",
                None,
                frostdb_profile::TimeRange::ALL,
                super::ReadOptions::STRICT,
            )
            .unwrap()
            .value;
        assert_eq!(pods.len(), N as usize);
    }

    /// A store whose lead is taken, as by a leader busy committing: profiles join the open
    /// group and wait there for the test to lead.
    fn store_led_elsewhere(dir: &std::path::Path) -> ProfileStore {
        let db = Db::open(dir, DbOptions::default()).unwrap();
        let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
        store.pipeline().leading = true;
        store
    }

    /// The options of the `i`th profile of a panic test.
    fn options(i: i64) -> IngestOptions {
        IngestOptions {
            name: "process_cpu".into(),
            timestamp_ms: Some(1_700_000_000_000 + i),
            ..IngestOptions::default()
        }
    }

    /// A group whose storing panics fails its profiles as an error would, and the store
    /// takes profiles after it: the unwinding leader left its group's members, and every
    /// later profile of the store, waiting for ever.
    #[test]
    fn a_group_that_panics_fails_its_profiles_and_the_store_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_led_elsewhere(dir.path());
        std::thread::scope(|s| {
            let store = &store;
            let push = s.spawn(move || {
                let p = validate(profile(0, 10, 3), &Limits::default()).unwrap();
                store.ingest_profile(&p, &options(0))
            });
            let slot = loop {
                let mut pipeline = store.pipeline();
                if let Some(group) = pipeline.open.as_mut()
                    && group.rows.profiles() == 1
                {
                    // A total naming a row the group does not have: its storing panics
                    // (an index out of bounds), as any bug in it would.
                    group.rows.totals.push(crate::normalize::Total {
                        row: 9_999,
                        sum: 1,
                        profile: 0,
                    });
                    break group.slot.clone();
                }
                drop(pipeline);
                std::thread::yield_now();
            };
            store.lead(&slot);
            let failed = push.join().unwrap().unwrap_err();
            assert!(failed.to_string().contains("panicked"), "{failed}");
        });
        assert!(!store.pipeline().leading, "the lead was given up");
        // The next profile is stored: its group has a leader, the failed partition is done.
        let p = validate(profile(100, 10, 3), &Limits::default()).unwrap();
        assert_eq!(store.ingest_profile(&p, &options(1)).unwrap().rows, 10);
        let selector = Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds{}").unwrap();
        let merged = store
            .merge(&selector, frostdb_profile::TimeRange::ALL)
            .unwrap();
        assert_eq!(merged.total(), total(100, 10), "only the second profile");
    }

    thread_local! {
        static PANIC_AFTER_SYNC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Panics once, when a test asked this thread to, where a leader has synced a group:
    /// a bug outside `commit_group`'s catch.
    pub(super) fn panic_if_asked() {
        if PANIC_AFTER_SYNC.with(|p| p.replace(false)) {
            panic!("a bug after a sync (injected by a test)");
        }
    }

    /// A leader that unwinds fails the group it holds and passes the lead on: its members
    /// are answered (an error to retry), the profile's fingerprint is not left pending (its
    /// retry is stored, not waiting on the failed group for ever), and later profiles are
    /// stored. Before, they all waited for a leader that was gone.
    #[test]
    fn a_leader_that_panics_outside_its_commit_fails_its_group_and_the_store_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_led_elsewhere(dir.path());
        let p = validate(profile(0, 10, 3), &Limits::default()).unwrap();
        std::thread::scope(|s| {
            let store = &store;
            let push = s.spawn(|| store.ingest_profile(&p, &options(0)));
            let slot = loop {
                if let Some(group) = &store.pipeline().open
                    && group.rows.profiles() == 1
                {
                    break group.slot.clone();
                }
                std::thread::yield_now();
            };
            PANIC_AFTER_SYNC.with(|p| p.set(true));
            let unwound =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| store.lead(&slot)));
            assert!(unwound.is_err(), "the injected panic did not happen");
            let failed = push.join().unwrap().unwrap_err();
            assert!(failed.to_string().contains("panicked"), "{failed}");
        });
        {
            let pipeline = store.pipeline();
            assert!(!pipeline.leading, "the lead was not given up");
            assert!(
                pipeline.pending.is_empty(),
                "a failed group's profile is pending"
            );
        }
        // Retried, the profile is stored (not found pending on the failed group), and so is
        // the next one.
        let retried = store.ingest_profile(&p, &options(0)).unwrap();
        assert_eq!((retried.rows, retried.duplicate), (10, false));
        let next = validate(profile(100, 10, 3), &Limits::default()).unwrap();
        assert_eq!(store.ingest_profile(&next, &options(1)).unwrap().rows, 10);
    }

    #[test]
    fn a_profile_twice_in_one_group_is_stored_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
        let before = store.db().wal_stats().unwrap().records;
        // A leader is busy committing: the first joins the open group, the second finds it
        // there and waits for the group.
        store.pipeline().leading = true;
        let p = validate(profile(0, 10, 3), &Limits::default()).unwrap();
        let options = IngestOptions {
            name: "process_cpu".into(),
            timestamp_ms: Some(1_700_000_000_000),
            ..IngestOptions::default()
        };
        std::thread::scope(|s| {
            let pushes: Vec<_> = (0..2)
                .map(|_| s.spawn(|| store.ingest_profile(&p, &options)))
                .collect();
            // Both have arrived: one in the group, the other waiting for it.
            let slot = loop {
                let pipeline = store.pipeline();
                if store.coming.load(std::sync::atomic::Ordering::Acquire) == 0
                    && let Some(group) = &pipeline.open
                    && group.rows.profiles() == 1
                {
                    assert_eq!(pipeline.pending.len(), 1);
                    break group.slot.clone();
                }
                drop(pipeline);
                std::thread::yield_now();
            };
            store.lead(&slot);
            let mut summaries: Vec<IngestSummary> = pushes
                .into_iter()
                .map(|p| p.join().unwrap().unwrap())
                .collect();
            summaries.sort_by_key(|s| s.duplicate);
            assert_eq!((summaries[0].rows, summaries[0].duplicate), (10, false));
            assert_eq!((summaries[1].rows, summaries[1].duplicate), (0, true));
        });
        assert_eq!(store.db().wal_stats().unwrap().records - before, 1);
        let pipeline = store.pipeline();
        assert!(pipeline.pending.is_empty(), "durable: no longer pending");
        assert_eq!(pipeline.recent.len(), 1);
        drop(pipeline);
        let selector = Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds{}").unwrap();
        let merged = store
            .merge(&selector, frostdb_profile::TimeRange::ALL)
            .unwrap();
        assert_eq!(merged.total(), total(0, 10));
    }

    #[test]
    fn a_leader_waits_for_a_few_profiles_on_their_way_but_not_for_the_last_few_of_many() {
        assert!(!worth_waiting_for(0, 1), "alone, nothing to wait for");
        assert!(worth_waiting_for(1, 1), "two writers share one fsync");
        assert!(worth_waiting_for(10, 39));
        // The last ones of many start the next group while this one syncs.
        assert!(!worth_waiting_for(10, 40));
        assert!(!worth_waiting_for(1, 4));
    }

    #[test]
    fn a_leader_waits_for_profiles_on_their_way_and_for_nobody_else() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        // A wait long enough that a leader waiting it out is told apart from one that stopped.
        let wait = Duration::from_secs(120);
        let store = ProfileStore::open(
            db,
            StoreOptions {
                group_wait: wait,
                ..StoreOptions::default()
            },
        )
        .unwrap();
        let records = || store.db().wal_stats().unwrap().records;
        let options = |i: u64| IngestOptions {
            name: "process_cpu".into(),
            labels: vec![("pod".into(), format!("pod-{i}"))],
            timestamp_ms: Some(1_700_000_000_000 + i as i64),
            ..IngestOptions::default()
        };
        let valid = |i: u64| validate(profile(i * 10, 10, 3), &Limits::default()).unwrap();
        let joined_open_group = || loop {
            if store
                .pipeline()
                .open
                .as_ref()
                .is_some_and(|g| g.rows.profiles() == 1)
            {
                return;
            }
            std::thread::yield_now();
        };

        // Alone, with nothing on its way: committed at once, not after the wait.
        let started = std::time::Instant::now();
        let before = records();
        store.ingest_profile(&valid(0), &options(0)).unwrap();
        assert_eq!(records(), before + 1);
        assert!(
            started.elapsed() < wait / 2,
            "a lone profile waited for company"
        );

        // A profile being decoded elsewhere: the leader keeps its group open for it, and the
        // two commit as one transaction.
        let before = records();
        let mut coming = Coming::new(&store);
        std::thread::scope(|s| {
            let first = s.spawn(|| store.ingest_profile(&valid(1), &options(1)));
            joined_open_group();
            assert_eq!(
                records(),
                before,
                "the leader committed without the profile on its way"
            );
            store
                .ingest_coming(&valid(2), &options(2), &mut coming)
                .unwrap();
            first.join().unwrap().unwrap();
        });
        assert_eq!(
            records(),
            before + 1,
            "the two profiles are one transaction"
        );

        // A profile on its way that fails (here: given up): the leader stops waiting for it.
        let started = std::time::Instant::now();
        let before = records();
        let coming = Coming::new(&store);
        std::thread::scope(|s| {
            let first = s.spawn(|| store.ingest_profile(&valid(3), &options(3)));
            joined_open_group();
            drop(coming);
            first.join().unwrap().unwrap();
        });
        assert_eq!(records(), before + 1);
        assert!(
            started.elapsed() < wait / 2,
            "the leader waited for a failed profile"
        );

        let selector = Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds{}").unwrap();
        let merged = store
            .merge(&selector, frostdb_profile::TimeRange::ALL)
            .unwrap();
        assert_eq!(merged.total(), total(0, 40));
    }
}
