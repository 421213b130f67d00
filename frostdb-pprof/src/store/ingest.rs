//! Ingest, in the order a profile passes: checked against what is stored already (a
//! profile pushed again), decoded and prepared ([`crate::normalize`]), its series admitted
//! under the series limit, then handed to the group commit ([`super::commit`]).

use super::*;

/// Cumulative sample types a series may have (a Go heap profile has two, allocations in
/// objects and in bytes; contentions and delay two more): the previous values kept for
/// deltas are bounded by this many per series the store may hold.
const MAX_BASELINES_PER_SERIES: usize = 4;

impl ProfileStore {
    /// Decodes `bytes` (gzip or raw pprof) and stores the profile.
    ///
    /// # A profile stored again
    /// A profile is stored once: pushed again (a client retrying a push, a file ingested
    /// twice), nothing is written and the summary says so ([`IngestSummary::duplicate`], no
    /// rows). A profile is recognised by a fingerprint of its series (profile name and
    /// series labels), its timestamp and its content as normalized: sample types, period,
    /// duration, and each stack's summed values per sample label set, whatever the order
    /// of its samples or the ids it gives its symbols. So:
    /// - the same profile at the same series and time is stored once, pushed twice in a
    ///   row, at once from two threads, into one group commit, or before and after a
    ///   restart;
    /// - a different profile at the same series and time is stored too, the values adding
    ///   up (two profiles taken within a second are both kept);
    /// - the same profile at another time, or of another series, is stored again (a steady
    ///   process can produce the same profile a minute apart).
    ///
    /// Profiles are recognised within [`StoreOptions::dedup_window`] (an hour by default)
    /// of the newest stored, 262,144 at most; an older one pushed again is stored again, as
    /// is one stored before the store kept fingerprints. A profile pushed while its twin is
    /// still being committed waits for it, and fails if it fails (a retry then stores it).
    /// With [`IngestOptions::delta`], the profile is recognised as received, before deltas.
    pub fn ingest(&self, bytes: &[u8], options: &IngestOptions) -> Result<IngestSummary> {
        let mut coming = Coming::new(self);
        let profile = decode(bytes, &self.options.limits)?;
        self.ingest_coming(&profile, options, &mut coming)
    }

    /// Stores a validated profile: its new symbols and its samples in one transaction; once
    /// (see [`ProfileStore::ingest`] on profiles stored again).
    pub fn ingest_profile(
        &self,
        profile: &ValidProfile,
        options: &IngestOptions,
    ) -> Result<IngestSummary> {
        self.ingest_coming(profile, options, &mut Coming::new(self))
    }

    /// Stores several profiles as one: all of them in one transaction, durable together, or
    /// none of them (a request carrying many profiles, as Pyroscope's push and OTLP exports
    /// do, is stored whole or refused whole). Each is checked as [`ProfileStore::ingest_profile`]
    /// checks one, and any failing fails them all; one stored already (or twice in
    /// `profiles`) is recognised as [`ProfileStore::ingest`] says and not stored again. A
    /// summary per profile, in order.
    ///
    /// With [`IngestOptions::delta`], a profile's deltas are taken from the profile of its
    /// series before it in `profiles`, else from the one stored last.
    pub fn ingest_all(
        &self,
        profiles: &[(&ValidProfile, &IngestOptions)],
    ) -> Result<Vec<IngestSummary>> {
        self.ingest_all_at(profiles, |i| format!("profiles[{i}]"))
    }

    /// [`ProfileStore::ingest_all`], the error of a profile at fault said to be `at(i)`
    /// (when there are several).
    pub(crate) fn ingest_all_at(
        &self,
        profiles: &[(&ValidProfile, &IngestOptions)],
        at: impl Fn(usize) -> String,
    ) -> Result<Vec<IngestSummary>> {
        let at = |i: usize, error: Error| match profiles.len() {
            1 => error,
            _ => error.at(at(i)),
        };
        let mut coming = Coming::new(self);
        if !profiles.iter().any(|(_, o)| o.delta) {
            let prepared = profiles
                .iter()
                .enumerate()
                .map(|(i, (p, o))| {
                    prepare(p, o, &[], &self.options.label_limits).map_err(|e| at(i, e))
                })
                .collect::<Result<Vec<_>>>()?;
            return self.store_all(&prepared, &mut coming, &at);
        }
        coming.arrive();
        let mut deltas = self.deltas.lock();
        let mut earlier = Deltas::default();
        let mut prepared = Vec::with_capacity(profiles.len());
        for (i, (p, o)) in profiles.iter().enumerate() {
            let one = prepare(p, o, &[&earlier, &deltas], &self.options.label_limits)
                .map_err(|e| at(i, e))?;
            earlier.apply(one.delta_states.clone());
            prepared.push(one);
        }
        self.admit_baselines(&deltas, &prepared)?;
        let summaries = self.store_all(&prepared, &mut coming, &at)?;
        // The baselines of the profiles stored, in order (not of one stored already: see
        // `ingest_coming`).
        for (one, summary) in prepared.into_iter().zip(&summaries) {
            if !summary.duplicate {
                deltas.apply(one.delta_states);
            }
        }
        Ok(summaries)
    }

    pub(super) fn ingest_coming(
        &self,
        profile: &ValidProfile,
        options: &IngestOptions,
        coming: &mut Coming<'_>,
    ) -> Result<IngestSummary> {
        if options.delta {
            // Deltas need the previous profile of the series: one delta ingest at a time,
            // so a leader has no company to wait for from one waiting for its turn.
            coming.arrive();
            let mut deltas = self.deltas.lock();
            let prepared = prepare(profile, options, &[&deltas], &self.options.label_limits)?;
            self.admit_baselines(&deltas, std::slice::from_ref(&prepared))?;
            let summary = self.store(&prepared, coming)?;
            // A profile stored already (a retry arriving late) is not the series' newest:
            // taken as the baseline, the next profile's difference from it counted again
            // what was stored since.
            if !summary.duplicate {
                deltas.apply(prepared.delta_states);
            }
            Ok(summary)
        } else {
            self.store(
                &prepare(profile, options, &[], &self.options.label_limits)?,
                coming,
            )
        }
    }

    /// Stores `profile` with its cumulative sample types (allocations, contentions, delay)
    /// as the difference from `previous`, the same process's profile taken earlier, as
    /// Pyroscope's `/ingest` does with a `prev_profile`. Other types are stored as they are.
    /// A profile stored already is not stored again (see [`ProfileStore::ingest`]).
    pub fn ingest_with_previous(
        &self,
        profile: &ValidProfile,
        previous: &ValidProfile,
        options: &IngestOptions,
    ) -> Result<IngestSummary> {
        let options = IngestOptions {
            delta: true,
            ..options.clone()
        };
        let mut baseline = Deltas::default();
        // Given as the one before, whatever its time says (the two often share theirs).
        let states = prepare(previous, &options, &[], &self.options.label_limits)?.delta_states;
        baseline.apply(
            states
                .into_iter()
                .map(|(key, (_, values))| (key, (i64::MIN, values)))
                .collect(),
        );
        self.store(
            &prepare(profile, &options, &[&baseline], &self.options.label_limits)?,
            &mut Coming::new(self),
        )
    }

    /// Stores a prepared profile (see [`ProfileStore::store_all`]).
    fn store(
        &self,
        prepared: &crate::normalize::Prepared<'_>,
        coming: &mut Coming<'_>,
    ) -> Result<IngestSummary> {
        let mut summaries = self.store_all(std::slice::from_ref(prepared), coming, &|_, e| e)?;
        summaries
            .pop()
            .ok_or_else(|| Error::Corrupt("a stored profile has no summary".into()))
    }

    /// Stores prepared profiles, all in one group. Profiles stored concurrently are
    /// committed together: each interns its symbols (looking them up under a shared lock,
    /// or adding new ones alone) and appends its rows to the open group; one of them (the
    /// leader) commits groups one at a time, in order, each as one transaction (one WAL
    /// record) holding the symbols its partition gained since the previous group and the
    /// group's samples, while the others wait. The leader seals the open group only once
    /// the group before it is durable, so everything stored during an fsync shares the next
    /// one, and, while more than a quarter as many profiles as it holds are still being
    /// decoded on other threads, up to [`StoreOptions::group_wait`] later, for them to
    /// join. Members are woken when their group is durable. A lone profile is a group of
    /// one, committed at once.
    fn store_all(
        &self,
        prepared: &[crate::normalize::Prepared<'_>],
        coming: &mut Coming<'_>,
        at: &dyn Fn(usize, Error) -> Error,
    ) -> Result<Vec<IngestSummary>> {
        let mut summaries: Vec<IngestSummary> = prepared
            .iter()
            .map(|p| IngestSummary {
                timestamp_ms: p.timestamp(),
                ..IngestSummary::default()
            })
            .collect();
        // The profiles with samples (by their index in `prepared`); the others store nothing.
        let at_index: Vec<usize> = (0..prepared.len())
            .filter(|&i| !prepared[i].is_empty())
            .collect();
        let storing: Vec<&crate::normalize::Prepared<'_>> =
            at_index.iter().map(|&i| &prepared[i]).collect();
        if storing.is_empty() {
            return Ok(summaries);
        }
        for (p, &i) in storing.iter().zip(&at_index) {
            p.check_labels(&self.options.label_limits)
                .map_err(|e| at(i, e))?;
            self.check_retained(p.timestamp(), "time")
                .map_err(|e| at(i, e))?;
        }
        self.admit_label_names(storing.iter().flat_map(|p| p.label_names()))?;
        let series: Vec<Vec<(u64, usize)>> = storing.iter().map(|p| p.series()).collect();
        self.admit(&storing, &series)?;
        let mut interned: Vec<crate::normalize::InternState> =
            storing.iter().map(|_| Default::default()).collect();
        let (slot, twins, lead, stored) = loop {
            let partition = self.symbols.current();
            // Profiles whose symbols the partition has (the usual case) only look them up,
            // alongside others; ones with new symbols intern them alone. The pin keeps the
            // partition open until the profiles have joined a group; the indexes are held
            // only while interning.
            let Some(_pin) = partition.pin() else {
                continue; // closed by a rotation meanwhile: take the next one
            };
            let Some(mut writer) = partition.lookup() else {
                continue; // closed by a rotation meanwhile: take the next one
            };
            let mut stacks = Vec::with_capacity(storing.len());
            let mut new_stacks = vec![0; storing.len()];
            for (p, state) in storing.iter().zip(&mut interned) {
                match p.intern(&mut writer, state)? {
                    Some(s) => stacks.push(s),
                    None => break,
                }
            }
            if stacks.len() < storing.len() {
                drop(writer);
                let Some(exclusive) = partition.writer() else {
                    continue;
                };
                writer = exclusive;
                // The profiles the lookup found whole keep their stacks (their states gave
                // them up); the rest are interned from where they stopped.
                let found = stacks.len();
                for ((p, state), new) in storing
                    .iter()
                    .zip(&mut interned)
                    .zip(&mut new_stacks)
                    .skip(found)
                {
                    let before = partition.counts().stacks;
                    // Symbols added by a profile that fails here are written with the next
                    // group of their partition (nothing refers to them), or never.
                    stacks.push(p.intern(&mut writer, state)?.ok_or_else(|| {
                        Error::Corrupt("an exclusive symbol writer added nothing".into())
                    })?);
                    *new = partition.counts().stacks - before;
                }
            }
            drop(writer);
            let mut pipeline = self.pipeline();
            if pipeline.failed.contains(&partition.id()) {
                return Err(Error::Unavailable(format!(
                    "symbol partition {} could not be written",
                    partition.id()
                )));
            }
            // Checked here, under the lock that orders profiles into groups: of two
            // profiles alike, the one that comes second finds the first's fingerprint.
            let dedup = self.fingerprints.is_some();
            let mut joining: Vec<(usize, Option<ContentFingerprint>)> = Vec::new();
            let mut twins: Vec<Arc<Slot>> = Vec::new();
            for (k, p) in storing.iter().enumerate() {
                if !dedup {
                    joining.push((k, None));
                    continue;
                }
                let fingerprint = p.fingerprint();
                let twin_here = joining.iter().any(|&(_, f)| f == Some(fingerprint));
                match pipeline.stored(fingerprint) {
                    Stored::No if !twin_here => joining.push((k, Some(fingerprint))),
                    stored => {
                        if let Stored::By(slot) = stored {
                            twins.push(slot);
                        }
                        summaries[at_index[k]].duplicate = true;
                        tracing::debug!(
                            timestamp_ms = p.timestamp(),
                            "a profile stored already was not stored again"
                        );
                    }
                }
            }
            if joining.is_empty() {
                coming.arrive();
                if pipeline.gathering {
                    self.joined.notify_one(); // one fewer to wait for
                }
                break (None, twins, false, Vec::new());
            }
            // A group is one insert, which the samples table refuses past its rows: joined
            // by profiles that would take it past them, it is sealed first (a profile near
            // the limit failed every profile of the group it joined).
            let joining_rows: usize = joining.iter().map(|&(k, _)| storing[k].row_count()).sum();
            if pipeline.open.as_ref().is_some_and(|g| {
                g.partition.id() != partition.id()
                    || g.rows.len().saturating_add(joining_rows) > MAX_BATCH_ROWS
            }) {
                pipeline.seal();
            }
            if pipeline.open.is_none() {
                let from = pipeline.cut(partition.id());
                pipeline.open = Some(Group::new(partition.clone(), from));
            }
            let group = pipeline.open.as_mut().expect("opened above");
            for &(k, fingerprint) in &joining {
                let p = storing[k];
                let appended = p
                    .append_samples(partition.id(), &stacks[k], &mut group.rows)
                    .and_then(|summary| {
                        p.append_spans(partition.id(), &stacks[k], &mut group.spans)?;
                        Ok(summary)
                    });
                let summary = &mut summaries[at_index[k]];
                *summary = match appended {
                    Ok(summary) => summary,
                    Err(e) => {
                        // The group's rows are no longer whole: it fails as a whole.
                        group.broken = Some(e.to_string());
                        return Err(e);
                    }
                };
                summary.new_stacks = new_stacks[k];
                let day = crate::limits::day_of(p.timestamp());
                group
                    .keys
                    .extend(series[k].iter().map(|&(key, _)| (key, day)));
                if let Some(fingerprint) = fingerprint {
                    group.fingerprints.push((p.timestamp(), fingerprint));
                }
            }
            let slot = group.slot.clone();
            let full = group.rows.len() >= MAX_GROUP_ROWS;
            let joined = group.rows.profiles();
            if full {
                pipeline.seal();
            }
            for (_, fingerprint) in &joining {
                if let Some(fingerprint) = fingerprint {
                    pipeline.pending.insert(*fingerprint, slot.clone());
                }
            }
            let coming = coming.arrive();
            if pipeline.gathering && (full || !worth_waiting_for(coming, joined)) {
                // A leader gathering company commits now.
                self.joined.notify_one();
            }
            let lead = !std::mem::replace(&mut pipeline.leading, true);
            let stored: Vec<usize> = joining.iter().map(|&(k, _)| k).collect();
            break (Some(slot), twins, lead, stored);
        };
        if let Some(slot) = slot {
            if lead {
                self.lead(&slot);
            }
            self.await_group(&slot)?.wait()?;
            // Durable: the recording rules count each profile stored here, once (a profile
            // stored again is not among them).
            if let Some(recorder) = self.recorder.get().filter(|r| r.active()) {
                for k in stored {
                    storing[k].record(recorder);
                }
            }
        }
        // A profile stored already answers once the one stored first is durable, with its
        // error if storing it failed.
        for twin in twins {
            self.await_group(&twin)?.wait()?;
        }
        Ok(summaries)
    }

    /// Admits the profiles' series, all or none: known ones always pass, new ones while the
    /// store is under [`StoreOptions::max_series`].
    fn admit(
        &self,
        prepared: &[&crate::normalize::Prepared<'_>],
        series: &[Vec<(u64, usize)>],
    ) -> Result<()> {
        let limit = self.options.max_series;
        if limit == usize::MAX {
            return Ok(());
        }
        // Each series with its place: (profile, label set), numbered across the profiles.
        let places: Vec<(usize, usize)> = series
            .iter()
            .enumerate()
            .flat_map(|(p, sets)| sets.iter().map(move |&(_, set)| (p, set)))
            .collect();
        let keys: Vec<(u64, usize)> = series
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, &(key, _))| (key, i))
            .collect();
        self.admit_series(&keys, |example| {
            let (p, set) = places[example];
            prepared[p].series_text(set)
        })
    }

    /// Refuses cumulative profiles whose previous values would be kept for more series
    /// than [`MAX_BASELINES_PER_SERIES`] times [`StoreOptions::max_series`], and checks the
    /// labels of those that store nothing (the first of a series, its baseline), as a
    /// stored profile's are: a baseline names a series, and its values are kept in memory
    /// until the next profile of it. Before, a client inventing series keys had each
    /// first profile's values kept, and none of them counted.
    fn admit_baselines(
        &self,
        deltas: &crate::normalize::Deltas,
        prepared: &[crate::normalize::Prepared<'_>],
    ) -> Result<()> {
        for p in prepared.iter().filter(|p| p.is_empty()) {
            p.check_labels(&self.options.label_limits)?;
        }
        let limit = self
            .options
            .max_series
            .saturating_mul(MAX_BASELINES_PER_SERIES);
        let new: std::collections::BTreeSet<&str> = prepared
            .iter()
            .flat_map(|p| p.delta_states.iter().map(|(key, _)| key.as_str()))
            .filter(|key| !deltas.has(key))
            .collect();
        match new.first() {
            Some(example) if deltas.len() + new.len() > limit => Err(Error::SeriesLimit {
                limit,
                new: new.len(),
                example: format!(
                    "the previous values of cumulative series {:?}",
                    example.replace('\0', " ")
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Admits the label names of what is being stored (`names`, repeats allowed), all or
    /// none: names the store holds always pass, new ones while it holds fewer than
    /// [`StoreOptions::max_label_names`]. Each name is a column of every labelled table:
    /// a client inventing names (a label per request id) would otherwise grow every scan
    /// and every block's footer without bound.
    fn admit_label_names<'a>(&self, names: impl Iterator<Item = &'a str>) -> Result<()> {
        let limit = self.options.max_label_names;
        if limit == usize::MAX {
            return Ok(());
        }
        let mut held = self.label_names.lock();
        let held = held.get_or_insert_with(|| {
            let snapshot = self.samples.snapshot();
            snapshot
                .schema()
                .arrow_schema()
                .fields()
                .iter()
                .filter_map(|f| f.name().strip_prefix(LABEL_PREFIX))
                .map(str::to_string)
                .collect()
        });
        let new: std::collections::BTreeSet<&str> =
            names.filter(|name| !held.contains(*name)).collect();
        if let Some(example) = new.first()
            && held.len() + new.len() > limit
        {
            return Err(Error::LabelNamesLimit {
                limit,
                new: new.len(),
                example: example.to_string(),
            });
        }
        held.extend(new.into_iter().map(str::to_string));
        Ok(())
    }

    /// Admits series `keys` (`(key, i)`), all or none, under [`StoreOptions::max_series`];
    /// `describe(i)` names the series of `i` in the error.
    fn admit_series(
        &self,
        keys: &[(u64, usize)],
        describe: impl Fn(usize) -> String,
    ) -> Result<()> {
        let limit = self.options.max_series;
        if limit == usize::MAX {
            return Ok(());
        }
        self.series
            .lock()
            .admit(keys, limit)
            .map_err(|(new, example)| Error::SeriesLimit {
                limit,
                new,
                example: describe(example),
            })
    }

    /// Stores sample rows given as Arrow columns: `samples` as [`crate::FRAMES`]'s module
    /// describes them (profile type, `labels.*`, time, value, and a stack given inline as
    /// frames or as an id into `stacks`), in one transaction, as pprof profiles are stored:
    /// the same tables, each distinct stack interned once, the series index, totals,
    /// series keys and rollups kept. Returns once the rows are durable.
    ///
    /// The batches are checked as strictly as a pprof profile: a column of the wrong type,
    /// a null, a time outside 1970 to 9999, a label name that is not one, a label over the
    /// store's [`LabelLimits`](crate::LabelLimits), a series over
    /// [`StoreOptions::max_series`], a stack id the stacks batch lacks: an error naming the
    /// batch, column and row, and nothing is stored. Rows are not checked for having been
    /// stored before (as a profile pushed again is, [`ProfileStore::ingest`]): storing the
    /// same rows twice adds them twice.
    pub fn ingest_arrow(
        &self,
        samples: &arrow::array::RecordBatch,
        stacks: Option<&arrow::array::RecordBatch>,
    ) -> Result<crate::ArrowSummary> {
        let stacks = stacks.map(|s| self.arrow_stacks(s)).transpose()?;
        self.ingest_arrow_at(samples, stacks.as_ref())
    }

    /// Checks and indexes a stacks batch once, for many calls of
    /// [`ProfileStore::ingest_arrow_with`] (see [`crate::ArrowStacks`]): a stacks batch is
    /// checked as [`ProfileStore::ingest_arrow`] checks it.
    pub fn arrow_stacks(&self, stacks: &arrow::array::RecordBatch) -> Result<crate::ArrowStacks> {
        crate::ArrowStacks::new(stacks, &self.options.limits)
    }

    /// Refuses a time older than the store's retention: stored, it would be acknowledged
    /// and then deleted by the next retention pass (a backfill, or an agent catching up
    /// after an outage, lost its profiles behind a 200).
    pub(crate) fn check_retained(&self, timestamp_ms: i64, field: &'static str) -> Result<()> {
        let Some(retention) = self.options.retention else {
            return Ok(());
        };
        let kept = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let now = frostdb_core::now_ms();
        if timestamp_ms >= now.saturating_sub(kept) {
            return Ok(());
        }
        Err(Error::Invalid {
            field,
            reason: format!(
                "{timestamp_ms} ms is {} s before now, older than the store's retention of \
                 {} s: it would be deleted as soon as stored",
                now.saturating_sub(timestamp_ms) / 1000,
                retention.as_secs()
            ),
        })
    }

    /// [`ProfileStore::ingest_arrow`], the stacks batch given as [`crate::ArrowStacks`]:
    /// what a loader sending many samples batches against one stacks batch calls.
    pub fn ingest_arrow_with(
        &self,
        samples: &arrow::array::RecordBatch,
        stacks: &crate::ArrowStacks,
    ) -> Result<crate::ArrowSummary> {
        self.ingest_arrow_at(samples, Some(stacks))
    }

    fn ingest_arrow_at(
        &self,
        samples: &arrow::array::RecordBatch,
        stacks: Option<&crate::ArrowStacks>,
    ) -> Result<crate::ArrowSummary> {
        use crate::columnar::{Input, InternedStacks, not_added};
        // Stacks checked by another store, under looser limits, are not this store's to
        // take unchecked.
        if let Some(stacks) = stacks
            && !stacks.0.limits.within(&self.options.limits)
        {
            return Err(Error::Invalid {
                field: "stacks",
                reason: "checked under looser limits than this store's: make them with its \
                         arrow_stacks"
                    .into(),
            });
        }
        let input = Input::check(
            samples,
            stacks,
            &self.options.limits,
            &self.options.label_limits,
        )?;
        if input.len() == 0 {
            return Ok(crate::ArrowSummary::default());
        }
        if let Some(oldest) = input.timestamp.values().iter().min() {
            self.check_retained(*oldest, "samples.timestamp")?;
        }
        let series = input.series()?;
        let series_keys = input.series_keys(&series, &self.options.label_limits)?;
        self.admit_label_names(
            (input.labels.iter().chain(&input.span_labels)).map(|(name, _)| name.as_str()),
        )?;
        let admitting: Vec<(u64, usize)> = series_keys.iter().copied().zip(0..).collect();
        self.admit_series(&admitting, |s| input.series_text(&series, s))?;
        let mut derived = input.derive(&series, &series_keys);
        // Each series' place in the samples table's order: the rows are stored sorted, so
        // compaction and persistence find them so and sort nothing.
        let mut rank = vec![0u32; series.len()];
        let series_order = self.samples.sort_indices(&input.series_rows(&series)?)?;
        for (place, &s) in series_order.iter().enumerate() {
            rank[s as usize] = place as u32;
        }
        let keys = input.stacks.keys();
        // The stacks found so far, and in which partition.
        let mut found: (u32, Vec<u32>) = (u32::MAX, Vec::new());
        loop {
            let partition = self.symbols.current();
            if found.0 != partition.id() {
                found = (partition.id(), Vec::new());
            }
            // Stacks the partition has are only looked up, alongside other ingests; new
            // ones are added alone. Either keeps the partition open until the rows have
            // joined their group.
            let Some(mut writer) = partition.lookup() else {
                continue; // closed by a rotation meanwhile: take the next one
            };
            let mut new = 0;
            if !input.stacks.intern(&keys, &mut writer, &mut found.1)? {
                drop(writer);
                let Some(exclusive) = partition.writer() else {
                    continue;
                };
                writer = exclusive;
                let before = partition.counts().stacks;
                if !input.stacks.intern(&keys, &mut writer, &mut found.1)? {
                    return Err(not_added());
                }
                new = partition.counts().stacks - before;
            }
            let interned = InternedStacks {
                partition: partition.id(),
                index: std::mem::take(&mut found.1),
            };
            let stack_ids = interned.ids_of(&input.stacks);
            let order = input.order(&series, &rank, &stack_ids);
            let (samples, spans) = input.batches(stack_ids, order.as_deref())?;
            // What the recording rules count once the rows are durable.
            let recorder = self.recorder.get().filter(|r| r.active());
            let observed = recorder.map(|_| samples.clone());
            if let Some(order) = &order {
                derived.reorder(order);
            }
            derived.summary.new_stacks = new;
            let mut pipeline = self.pipeline();
            if pipeline.failed.contains(&partition.id()) {
                return Err(Error::Unavailable(format!(
                    "symbol partition {} could not be written",
                    partition.id()
                )));
            }
            // A group of its own, after every group before it: the rows are one
            // transaction, with the symbols their partition gained up to now.
            pipeline.seal();
            let mut group = Group::new(partition.clone(), pipeline.cut(partition.id()));
            group.rows = SampleRows::built(
                samples,
                derived.index,
                derived.totals,
                derived.summary.profiles,
            );
            if let Some(spans) = spans {
                group.spans = SampleRows::built(spans, Vec::new(), Vec::new(), 0);
            }
            group.keys = derived.keys;
            let slot = group.slot.clone();
            pipeline.open = Some(group);
            pipeline.seal();
            let lead = !std::mem::replace(&mut pipeline.leading, true);
            drop(pipeline);
            drop(writer);
            if lead {
                self.lead(&slot);
            }
            self.await_group(&slot)?.wait()?;
            if let (Some(recorder), Some(rows)) = (recorder, observed) {
                match self.symbols.view([partition.id()], &self.memory) {
                    Ok(symbols) => recorder.observe_batch(&rows, &symbols),
                    // Stored, but not counted: said, never silent.
                    Err(error) => tracing::warn!(
                        %error,
                        rows = rows.num_rows(),
                        "recording rules: the stored rows' stacks could not be read; not counted"
                    ),
                }
            }
            return Ok(derived.summary);
        }
    }

    /// Series counted against [`StoreOptions::max_series`]: those stored when the store
    /// opened and those admitted since (0 for a store without the limit, which counts none).
    pub fn series_count(&self) -> usize {
        if self.options.max_series == usize::MAX {
            return 0;
        }
        self.series.lock().len()
    }
}
