//! Ingest, in the order a profile passes: checked against what is stored already (a
//! profile pushed again), decoded and prepared ([`crate::normalize`]), its series admitted
//! under the series limit, then handed to the group commit ([`super::commit`]).

use super::*;

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
            let prepared = prepare(profile, options, Some(&deltas))?;
            let summary = self.store(&prepared, coming)?;
            deltas.apply(prepared.delta_states);
            Ok(summary)
        } else {
            self.store(&prepare(profile, options, None)?, coming)
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
        baseline.apply(prepare(previous, &options, None)?.delta_states);
        self.store(
            &prepare(profile, &options, Some(&baseline))?,
            &mut Coming::new(self),
        )
    }

    /// Stores a prepared profile. Profiles stored concurrently are committed together: each
    /// interns its symbols (looking them up under a shared lock, or adding new ones alone)
    /// and appends its rows to the open group; one of them (the leader) commits groups one
    /// at a time, in order, each as one transaction (one WAL record) holding the symbols its
    /// partition gained since the previous group and the group's samples, while the others
    /// wait. The leader seals the open group only once the group before it is durable, so
    /// everything stored during an fsync shares the next one, and, while more than a quarter
    /// as many profiles as it holds are still being decoded on other threads, up to
    /// [`StoreOptions::group_wait`] later, for them to join. Members are woken when their
    /// group is durable. A lone profile is a group of one, committed at once.
    fn store(
        &self,
        prepared: &crate::normalize::Prepared<'_>,
        coming: &mut Coming<'_>,
    ) -> Result<IngestSummary> {
        if prepared.is_empty() {
            return Ok(IngestSummary {
                timestamp_ms: prepared.timestamp(),
                ..IngestSummary::default()
            });
        }
        prepared.check_labels(&self.options.label_limits)?;
        let series = prepared.series();
        self.admit(&series, prepared)?;
        let day = crate::limits::day_of(prepared.timestamp());
        let mut interned = crate::normalize::InternState::default();
        let (slot, summary, lead) = loop {
            let partition = self.symbols.current();
            // A profile whose symbols the partition has (the usual case) only looks them
            // up, alongside others; one with new symbols interns them alone. Either keeps
            // the partition open until the profile has joined a group.
            let Some(mut writer) = partition.lookup() else {
                continue; // closed by a rotation meanwhile: take the next one
            };
            let (stacks, new_stacks) = match prepared.intern(&mut writer, &mut interned)? {
                Some(stacks) => (stacks, 0),
                None => {
                    drop(writer);
                    let Some(exclusive) = partition.writer() else {
                        continue;
                    };
                    writer = exclusive;
                    let before = partition.counts().stacks;
                    // Symbols added by a profile that fails here are written with the next
                    // group of their partition (nothing refers to them), or never.
                    let stacks = prepared
                        .intern(&mut writer, &mut interned)?
                        .ok_or_else(|| {
                            Error::Corrupt("an exclusive symbol writer added nothing".into())
                        })?;
                    (stacks, partition.counts().stacks - before)
                }
            };
            let mut pipeline = self.pipeline();
            if pipeline.failed.contains(&partition.id()) {
                return Err(Error::Unavailable(format!(
                    "symbol partition {} could not be written",
                    partition.id()
                )));
            }
            // Checked here, under the lock that orders profiles into groups: of two
            // profiles alike, the one that comes second finds the first's fingerprint.
            let fingerprint = prepared.fingerprint();
            if self.fingerprints.is_some() {
                let stored = pipeline.stored(fingerprint);
                if !matches!(stored, Stored::No) {
                    coming.arrive();
                    if pipeline.gathering {
                        self.joined.notify_one(); // one fewer to wait for
                    }
                    drop(pipeline);
                    drop(writer);
                    return self.stored_already(prepared, stored);
                }
            }
            if pipeline
                .open
                .as_ref()
                .is_some_and(|g| g.partition.id() != partition.id())
            {
                pipeline.seal();
            }
            if pipeline.open.is_none() {
                let from = pipeline.cut(partition.id());
                pipeline.open = Some(Group::new(partition.clone(), from));
            }
            let group = pipeline.open.as_mut().expect("opened above");
            let appended = prepared
                .append_samples(partition.id(), &stacks, &mut group.rows)
                .and_then(|summary| {
                    prepared.append_spans(partition.id(), &stacks, &mut group.spans)?;
                    Ok(summary)
                });
            let mut summary = match appended {
                Ok(summary) => summary,
                Err(e) => {
                    // The group's rows are no longer whole: it fails as a whole.
                    group.broken = Some(e.to_string());
                    return Err(e);
                }
            };
            summary.new_stacks = new_stacks;
            group.keys.extend(series.iter().map(|&(key, _)| (key, day)));
            let dedup = self.fingerprints.is_some();
            if dedup {
                group.fingerprints.push((prepared.timestamp(), fingerprint));
            }
            let slot = group.slot.clone();
            let full = group.rows.len() >= MAX_GROUP_ROWS;
            let joined = group.rows.profiles();
            if full {
                pipeline.seal();
            }
            if dedup {
                pipeline.pending.insert(fingerprint, slot.clone());
            }
            let coming = coming.arrive();
            if pipeline.gathering && (full || !worth_waiting_for(coming, joined)) {
                // A leader gathering company commits now.
                self.joined.notify_one();
            }
            let lead = !std::mem::replace(&mut pipeline.leading, true);
            break (slot, summary, lead);
        };
        if lead {
            self.lead(&slot);
        }
        let submitted = self.await_group(&slot)?;
        submitted.wait()?;
        Ok(summary)
    }

    /// The answer to a profile stored already (`stored`): once the profile stored first is
    /// durable, nothing written; its error if storing it failed.
    fn stored_already(
        &self,
        prepared: &crate::normalize::Prepared<'_>,
        stored: Stored,
    ) -> Result<IngestSummary> {
        if let Stored::By(slot) = stored {
            self.await_group(&slot)?.wait()?;
        }
        tracing::debug!(
            timestamp_ms = prepared.timestamp(),
            "a profile stored already was not stored again"
        );
        Ok(IngestSummary {
            timestamp_ms: prepared.timestamp(),
            duplicate: true,
            ..IngestSummary::default()
        })
    }

    /// Admits the profile's series, all or none: known ones always pass, new ones while the
    /// store is under [`StoreOptions::max_series`].
    fn admit(
        &self,
        series: &[(u64, usize)],
        prepared: &crate::normalize::Prepared<'_>,
    ) -> Result<()> {
        let limit = self.options.max_series;
        if limit == usize::MAX {
            return Ok(());
        }
        self.series
            .lock()
            .admit(series, limit)
            .map_err(|(new, example)| Error::SeriesLimit {
                limit,
                new,
                example: prepared.series_text(example),
            })
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
