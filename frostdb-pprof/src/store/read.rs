//! Reads: merges (strict or lenient, by series, over spans), series over time, label
//! names and values, profile types, each narrowed by the series index where it can.

use super::*;

/// One series of a merge kept apart: its labels (`(name, value)`, in name order) and its
/// stacks' values, in stack id order.
pub type SeriesSamples = (frostdb_profile::native::LabelSet, Vec<(StackId, i64)>);

/// One merged profile: the value of each stack summed over what a selector selected.
#[derive(Debug, Clone)]
pub struct Merged {
    /// Its profile type.
    pub profile_type: ProfileType,
    /// The sampling period (the largest seen).
    pub period: i64,
    /// Stacks and their values, in stack id order. A stack stored in two symbol partitions
    /// appears twice (reports merge by frames).
    pub samples: Vec<(StackId, i64)>,
    /// The symbols the stacks resolve with.
    pub symbols: Symbols,
    /// Sample rows read.
    pub rows: usize,
    /// Of `rows`, those read from rollups (each the sum of a stack's rows of one series
    /// over an hour or a day).
    pub rollup_rows: usize,
    /// Blocks a lenient merge skipped because they could not be read (the profile lacks
    /// their samples); always 0 for a strict merge, which fails instead.
    pub blocks_failed: usize,
    /// What the merge's scans read and skipped (blocks, row groups, pages, rows), summed
    /// over its raw and rollup pieces: the merge's `EXPLAIN ANALYZE`.
    pub metrics: frostdb_core::ScanMetrics,
    /// The same stacks and values per series (label set, `(name, value)` pairs in name
    /// order), when merged with [`MergeOptions::by_series`]; empty otherwise. A pprof
    /// export gives each sample its series' labels from it.
    pub series: Vec<SeriesSamples>,
}

impl Merged {
    /// Sum of all values.
    pub fn total(&self) -> i64 {
        self.samples
            .iter()
            .fold(0i64, |total, (_, v)| total.saturating_add(*v))
    }

    /// The frames of its stacks (inlined calls each a frame), each stack cut as reports cut
    /// it ([`crate::report::MAX_STACK_DEPTH`]): the most nodes a call tree of it can have.
    /// Stacks share their callers, so most trees have far fewer.
    pub fn frames(&self) -> usize {
        self.samples
            .iter()
            .filter_map(|(stack, _)| self.symbols.locations(*stack))
            .map(|(p, locations)| {
                let frames: usize = locations
                    .iter()
                    .map(|&l| crate::symbols::location_frame_count(p, l))
                    .sum();
                frames.min(crate::report::MAX_STACK_DEPTH + 1)
            })
            .fold(0usize, usize::saturating_add)
    }

    /// About the bytes a report of it writes for its frames: per frame of each stack (cut
    /// as [`Merged::frames`] cuts it), 100, or its function and file names and 40 more when
    /// that is longer; at most as many frames as a tree is built with
    /// ([`crate::report::tree::MAX_TREE_NODES`], twice) of the longest. Stacks share their
    /// callers, so most trees write less; but a report writes a frame's name at every node
    /// it is, and a long name down a deep stack is written thousands of times.
    ///
    /// Stops early once the request it is for has ended ([`frostdb_core::stopped_now`]),
    /// as the reports' walks do: nobody reads what it would have counted.
    pub fn frame_bytes(&self) -> usize {
        const PER_FRAME: usize = 100;
        let (mut total, mut longest) = (0usize, PER_FRAME);
        let mut pace = crate::decode::charge::Pace::new();
        // Escapes counted once per name (by where it is stored): a name of a megabyte
        // down a deep stack is met thousands of times.
        let mut escapes: std::collections::HashMap<
            (usize, usize),
            usize,
            foldhash::fast::RandomState,
        > = Default::default();
        let mut escapes_of = |s: &str| {
            *escapes
                .entry((s.as_ptr() as usize, s.len()))
                .or_insert_with(|| escaped(s))
        };
        for (stack, _) in &self.samples {
            if pace.tick().is_err() {
                break;
            }
            let mut depth = 0;
            self.symbols.for_each_frame(*stack, |f| {
                depth += 1;
                if depth > crate::report::MAX_STACK_DEPTH + 1 {
                    return;
                }
                let (name, file) = (f.function_name().unwrap_or(""), f.filename());
                let mut text = name.len() + file.len();
                if text + 40 > PER_FRAME {
                    // As written: JSON writes a control character as 6 bytes, SVG and DOT
                    // write `&` as 5; a short name is within the floor however written.
                    text += 5 * (escapes_of(name) + escapes_of(file));
                }
                let bytes = text.saturating_add(40).max(PER_FRAME);
                longest = longest.max(bytes);
                total = total.saturating_add(bytes);
            });
        }
        total.min((2 * crate::report::tree::MAX_TREE_NODES).saturating_mul(longest))
    }

    /// About the bytes a pprof export of it holds ([`crate::report::pprof::to_profile`],
    /// then its encoding): a sample of each stack with a location id per location (cut as
    /// reports cut stacks), and the encoded ids. Unlike a call tree's, an export's size has
    /// no node cap: it grows with every location of every stack, so it is charged them all.
    /// Series kept apart are charged their copies besides ([`Merged::series_bytes`]).
    pub fn export_bytes(&self) -> usize {
        // A location id in the sample, and its encoding (2 bytes, packed, mostly); a
        // sample's message, value and encoding.
        const PER_LOCATION: usize = 8 + 2;
        const PER_SAMPLE: usize = 96;
        let mut pace = crate::decode::charge::Pace::new();
        let mut total = 0usize;
        for (stack, _) in &self.samples {
            if pace.tick().is_err() {
                break;
            }
            let depth = self
                .symbols
                .depth(*stack)
                .min(crate::report::MAX_STACK_DEPTH + 1);
            total = total.saturating_add(depth * PER_LOCATION + PER_SAMPLE);
        }
        total
    }

    /// About the bytes a report of its series apart holds for them (a pprof export keeps
    /// each series' samples): every stack of every series, with its location ids (a stack
    /// in many series is copied into each) and the series' labels. A merge of few stacks
    /// deep in many series is charged what its copies take, which [`Merged::frame_bytes`]
    /// (each distinct stack once) is not. Zero when series are not kept.
    pub fn series_bytes(&self) -> usize {
        /// A sample besides its ids: its vectors, value and encoding.
        const PER_SAMPLE: usize = 96;
        /// A location id, in the sample and encoded.
        const PER_FRAME: usize = 10;
        let mut depths: std::collections::HashMap<StackId, usize> =
            std::collections::HashMap::new();
        let mut total = 0usize;
        for (labels, samples) in &self.series {
            let labels = labels
                .len()
                .saturating_mul(std::mem::size_of::<crate::proto::Label>());
            for (stack, _) in samples {
                let depth = *depths.entry(*stack).or_insert_with(|| {
                    self.symbols
                        .locations(*stack)
                        .map_or(0, |(_, l)| l.len().min(crate::report::MAX_STACK_DEPTH + 1))
                });
                total = total
                    .saturating_add(depth.saturating_mul(PER_FRAME))
                    .saturating_add(PER_SAMPLE + labels);
            }
        }
        total
    }

    /// An empty profile of `profile_type`.
    pub fn empty(profile_type: ProfileType) -> Self {
        Self {
            profile_type,
            period: 0,
            samples: Vec::new(),
            symbols: Symbols::default(),
            rows: 0,
            rollup_rows: 0,
            blocks_failed: 0,
            metrics: frostdb_core::ScanMetrics::default(),
            series: Vec::new(),
        }
    }
}

/// Bytes of `s` a report writes longer than they are: control characters (JSON's `\u00XX`),
/// and `&`, `<`, `>`, quotes and backslashes (SVG's and DOT's entities, JSON's escapes).
fn escaped(s: &str) -> usize {
    s.bytes()
        .filter(|&b| b < 0x20 || matches!(b, b'&' | b'<' | b'>' | b'"' | b'\\' | b'\''))
        .count()
}

/// What [`ProfileStore::profiles`] read: profiles kept apart, and their symbols.
#[derive(Debug, Clone)]
pub struct Profiles {
    /// Their profile type.
    pub profile_type: ProfileType,
    /// The symbols the stacks resolve with.
    pub symbols: Symbols,
    /// The profiles, their series' labels, rows read and blocks skipped.
    pub stacks: frostdb_profile::native::ProfileStacks,
}

/// What the series index says a merge's selector selects.
enum Narrowing {
    /// Too many series, or series the index cannot narrow by: read what the selector says.
    Unknown,
    /// No series: nothing to read.
    NoSeries,
    /// Rows of these series only.
    To(frostdb_core::Predicate),
}

/// How a read treats sample blocks it cannot read: strictly, failing with an error that
/// names the block, or leniently, skipping them and saying how many
/// ([`Read::blocks_failed`]). A lenient label, series or profile type read counts what it
/// skipped by reading the sample rows (at their exact times) instead of the series index.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadOptions {
    /// Skip sample blocks that cannot be read, counting them.
    pub lenient: bool,
}

impl ReadOptions {
    /// A block that cannot be read fails the read.
    pub const STRICT: ReadOptions = ReadOptions { lenient: false };
    /// Blocks that cannot be read are skipped and counted.
    pub const LENIENT: ReadOptions = ReadOptions { lenient: true };

    /// [`Self::LENIENT`] when `lenient`, else [`Self::STRICT`].
    pub fn lenient(lenient: bool) -> Self {
        ReadOptions { lenient }
    }
}

/// What a read answered, and the sample blocks it skipped: 0 unless it was lenient, when a
/// nonzero count says the answer is partial.
#[derive(Debug, Clone)]
pub struct Read<T> {
    /// The answer.
    pub value: T,
    /// Sample blocks a lenient read could not read.
    pub blocks_failed: usize,
}

impl<T> Read<T> {
    fn of((value, blocks_failed): (T, usize)) -> Self {
        Read {
            value,
            blocks_failed,
        }
    }
}

/// How [`ProfileStore::merge_with`] merges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeOptions {
    /// How each series' profiles over the range combine (series are summed together).
    pub aggregation: Aggregation,
    /// Keep series apart in [`Merged::series`].
    pub by_series: bool,
    /// Skip sample blocks that cannot be read, counting them in [`Merged::blocks_failed`].
    pub lenient: bool,
}

impl ProfileStore {
    /// A session seeing this database's tables (SQL, and the DataFusion profile queries).
    /// Its queries fail when they cannot read a block they need.
    pub fn session(&self) -> Result<SessionContext> {
        Ok(frostdb_query::session_with(
            &self.db,
            self.memory.clone(),
            &self.spill,
        )?)
    }

    /// A session whose scans skip blocks they cannot read, counting them in the returned
    /// [`frostdb_query::BlocksFailed`]: answers may be partial, and the count says so.
    pub fn lenient_session(&self) -> Result<(SessionContext, frostdb_query::BlocksFailed)> {
        Ok(frostdb_query::lenient_session_with(
            &self.db,
            self.memory.clone(),
            &self.spill,
        )?)
    }

    /// Merges what `selector` selects in `range` into one profile. The selector must name a
    /// profile type: values of different types do not add up. A selector matching on
    /// `span_id` or `trace_id` selects among the samples labelled with spans. A sample block
    /// that cannot be read fails the merge with an error naming it.
    ///
    /// The whole days and hours of `range` that are rolled up are read from their rollups,
    /// the rest from raw samples: the same answer, from fewer rows ([`crate::rollup`];
    /// [`Merged::rollup_rows`] says how many came from rollups).
    pub fn merge(&self, selector: &Selector, range: TimeRange) -> Result<Merged> {
        self.merge_reading(selector, range, false, true)
    }

    /// [`ProfileStore::merge`] from raw samples only, never from rollups: the answer rollups
    /// are checked against.
    pub fn merge_raw(&self, selector: &Selector, range: TimeRange) -> Result<Merged> {
        self.merge_reading(selector, range, false, false)
    }

    /// Merges what `selector` selects in `range` among the samples labelled with one of
    /// `span_ids`: [`ProfileStore::merge`] with a `span_id` matcher.
    pub fn merge_spans(
        &self,
        selector: &Selector,
        range: TimeRange,
        span_ids: &[&str],
    ) -> Result<Merged> {
        let mut selector = selector.clone();
        selector.matchers.push(
            frostdb_profile::Matcher::any_of("span_id", span_ids)
                .map_err(|e| Error::Query(format!("span ids: {e}")))?,
        );
        self.merge(&selector, range)
    }

    /// What a merge of `selector` reads: the samples table, or the spans table when the
    /// selector matches on a span label ([`schema::SPAN_LABELS`]: the samples table does not
    /// keep them), whether it is the spans, and the selector's profile type (required).
    fn merge_source(&self, selector: &Selector) -> Result<(&Table, bool, ProfileType)> {
        let by_span = reads_spans(selector)?;
        let table = if by_span { &self.spans } else { &self.samples };
        let profile_type = selector.profile_type.clone().ok_or_else(|| {
            Error::Query(
                "the selector needs a profile type (name:type:unit:period_type:period_unit)".into(),
            )
        })?;
        Ok((table, by_span, profile_type))
    }

    /// Merges from the table [`ProfileStore::merge_source`] picks.
    fn merge_reading(
        &self,
        selector: &Selector,
        range: TimeRange,
        lenient: bool,
        rollups: bool,
    ) -> Result<Merged> {
        let (table, by_span, profile_type) = self.merge_source(selector)?;
        // The samples first: the series index is written before them in each transaction,
        // so its later snapshot holds every series of this one.
        let snapshot = table.snapshot();
        // Rollups (before the index too: a series they hold is in it) of the whole hours and
        // days of the range; raw samples for the rest.
        let pieces = if by_span || !rollups || !self.rollups.enabled() {
            vec![crate::rollup::Piece {
                rollup: None,
                range,
            }]
        } else {
            self.rollups.plan(range, now_ms())
        };
        let narrow = if by_span || selector.matchers.is_empty() {
            None
        } else {
            // A series is kept when some piece has every column of its labels: the samples
            // table reopened after its old blocks expired no longer has the columns of
            // labels only older series had, which the rollups (kept longer) still hold.
            let schemas: Vec<_> = std::iter::once(&snapshot)
                .chain(pieces.iter().filter_map(|p| p.rollup.as_ref()))
                .map(|s| s.schema())
                .collect();
            match self.narrowing(&schemas, selector, range)? {
                Narrowing::Unknown => None,
                // The index holds every series of the snapshot: none matches, nothing to read.
                Narrowing::NoSeries => return Ok(Merged::empty(profile_type)),
                Narrowing::To(predicate) => Some(predicate),
            }
        };
        let mut totals = StackTotals::default();
        let mut rollup_rows = 0;
        for piece in pieces {
            let read = piece.rollup.as_ref().unwrap_or(&snapshot);
            let blocks = read.blocks();
            let part = match &self.options.block_merger {
                // What is in memory here, the blocks over the cluster.
                Some(merger) if !blocks.is_empty() => {
                    let here = merge_stacks(
                        &read.memory(),
                        selector,
                        piece.range,
                        self.options.query_threads,
                        lenient,
                        &self.memory,
                        narrow.clone(),
                    )?;
                    let there = merger.merge_stacks(
                        read.table(),
                        blocks,
                        selector,
                        piece.range,
                        lenient,
                        narrow.clone(),
                        &self.memory,
                    )?;
                    here + there
                }
                _ => merge_stacks(
                    read,
                    selector,
                    piece.range,
                    self.options.query_threads,
                    lenient,
                    &self.memory,
                    narrow.clone(),
                )?,
            };
            if piece.rollup.is_some() {
                rollup_rows += part.rows;
            }
            totals = totals + part;
        }
        let StackTotals {
            stacks,
            period,
            rows,
            metrics,
            ..
        } = totals;
        let symbols = self.symbols_of(&stacks)?;
        Ok(Merged {
            profile_type,
            period,
            samples: stacks.into_iter().map(|(id, v)| (StackId(id), v)).collect(),
            symbols,
            rows,
            rollup_rows,
            blocks_failed: metrics.blocks_failed,
            metrics,
            series: Vec::new(),
        })
    }

    /// The symbols of `stacks` (ids ascending); a stack they lack is corruption.
    fn symbols_of(&self, stacks: &[(u64, i64)]) -> Result<Symbols> {
        let mut partitions: Vec<u32> = stacks.iter().map(|(id, _)| split_id(*id).0).collect();
        partitions.dedup();
        let mut symbols = self
            .symbols
            .view(partitions.iter().copied(), &self.memory)?;
        if self.db.is_read_only()
            && let Some((id, _)) = stacks
                .iter()
                .find(|(id, _)| !symbols.has_stack(StackId(*id)))
        {
            // A reader's cached partition from before its writer added to it: read again.
            self.symbols.forget(split_id(*id).0);
            symbols = self.symbols.view(partitions, &self.memory)?;
        }
        if let Some((id, _)) = stacks
            .iter()
            .find(|(id, _)| !symbols.has_stack(StackId(*id)))
        {
            let (p, i) = split_id(*id);
            return Err(Error::Corrupt(format!(
                "stack {p}:{i} of a selected sample is not in the symbol tables"
            )));
        }
        Ok(symbols)
    }

    /// [`ProfileStore::merge`] as `options` say: each series' profiles summed, averaged or
    /// the latest ([`Aggregation`]; gauges such as memory in use average), series kept
    /// apart in [`Merged::series`] (so an export can label each sample with its series'
    /// labels), leniently or not (a lenient merge counts the sample blocks it skipped in
    /// [`Merged::blocks_failed`]; symbols are always read strictly: a stack that cannot be
    /// resolved is an error, never a frame left out). A sum that does not keep series apart
    /// is [`ProfileStore::merge`]'s read; the rest read raw samples per series (rollups and
    /// the series index's narrowing sum series together).
    pub fn merge_with(
        &self,
        selector: &Selector,
        range: TimeRange,
        options: &MergeOptions,
    ) -> Result<Merged> {
        if options.aggregation == Aggregation::Sum && !options.by_series {
            return self.merge_reading(selector, range, options.lenient, true);
        }
        let what = match options.by_series {
            true => "a merge keeping series apart (a pprof export)".to_owned(),
            false => format!("a merge by {}", options.aggregation.name()),
        };
        self.within_raw_samples(range, &what)?;
        let (table, _, profile_type) = self.merge_source(selector)?;
        let read = frostdb_profile::native::merge_stacks_by_series(
            &table.snapshot(),
            selector,
            range,
            options.aggregation,
            options.lenient,
            &self.memory,
        )?;
        let stacks = read.merged;
        let symbols = self.symbols_of(&stacks)?;
        Ok(Merged {
            profile_type,
            period: read.period,
            samples: stacks.into_iter().map(|(id, v)| (StackId(id), v)).collect(),
            symbols,
            rows: read.rows,
            rollup_rows: 0,
            blocks_failed: read.blocks_failed,
            metrics: frostdb_core::ScanMetrics::default(),
            series: if !options.by_series {
                Vec::new()
            } else {
                read.series
            }
            .into_iter()
            .map(|(labels, stacks)| {
                let stacks = stacks.into_iter().map(|(id, v)| (StackId(id), v));
                (labels, stacks.collect())
            })
            .collect(),
        })
    }

    /// Refuses a merge that reads raw samples only (see [`ProfileStore::merge_with`]) of a
    /// range that starts before the samples kept, an hour and more, while rollups kept
    /// longer hold what it would leave out: it would answer for what was kept as if it
    /// were the range (a 90-day memory flame graph averaged over the last 30 days).
    fn within_raw_samples(&self, range: TimeRange, what: &str) -> Result<()> {
        let Some(kept) = self.options.retention else {
            return Ok(());
        };
        let rolled = self.options.rollups.kept_longest(Some(kept));
        if rolled.is_some_and(|rolled| rolled <= kept) {
            return Ok(()); // nothing older is kept anywhere
        }
        let oldest = now_ms().saturating_sub(kept.as_millis() as i64);
        if range.start_ms >= oldest.saturating_sub(schema::SERIES_BUCKET_MS) {
            return Ok(());
        }
        let starts = match range.start_ms {
            i64::MIN => "has no start".to_owned(),
            start => format!(
                "starts {} days ago",
                now_ms().saturating_sub(start.max(0)) / 86_400_000
            ),
        };
        Err(Error::Query(format!(
            "{what} reads the raw samples, kept {} days, and the range {starts}: only a sum \
             merge reads the rollups kept longer (aggregation=sum, or a range within the \
             samples kept)",
            kept.as_secs() / 86_400,
        )))
    }

    /// What `selector` selects in `range`, profile by profile: each profile (a series at a
    /// time) with its stacks' values, read from raw samples, and the symbols they resolve
    /// with. What a comparison of two selections tests over ([`crate::regress`]). Bounded
    /// by the store's query memory; a block that cannot be read fails the read unless
    /// `lenient` (counted in the read's `blocks_failed`).
    pub fn profiles(
        &self,
        selector: &Selector,
        range: TimeRange,
        read: ReadOptions,
    ) -> Result<Profiles> {
        self.within_raw_samples(range, "a comparison profile by profile")?;
        let (table, _, profile_type) = self.merge_source(selector)?;
        let stacks = frostdb_profile::native::stacks_by_profile(
            &table.snapshot(),
            selector,
            range,
            read.lenient,
            &self.memory,
        )?;
        let mut ids: Vec<(u64, i64)> = stacks
            .profiles
            .iter()
            .flat_map(|p| p.stacks.iter().map(|(id, _)| (*id, 0)))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let symbols = self.symbols_of(&ids)?;
        Ok(Profiles {
            profile_type,
            symbols,
            stacks,
        })
    }

    /// The value per series and per `step_ms` bucket for what `selector` selects in `range`
    /// (read from the profile totals, a row per profile); with `group_by`, series are the
    /// distinct values of those labels.
    pub fn range(
        &self,
        selector: &Selector,
        range: TimeRange,
        step_ms: i64,
        group_by: Option<&[String]>,
        read: ReadOptions,
    ) -> Result<Read<Vec<frostdb_profile::native::Series>>> {
        no_span_labels(Some(selector), "a time series")?;
        Ok(Read::of(frostdb_profile::native::range_counted(
            &self.totals.snapshot(),
            selector,
            range,
            step_ms,
            group_by,
            read.lenient,
            &self.memory,
        )?))
    }

    /// The times (ms, ascending) of the profiles `selector` selects in `range` (read from
    /// the profile totals, a row per profile).
    pub fn timestamps(
        &self,
        selector: &Selector,
        range: TimeRange,
        read: ReadOptions,
    ) -> Result<Read<Vec<i64>>> {
        no_span_labels(Some(selector), "the times of profiles")?;
        Ok(Read::of(frostdb_profile::native::timestamps_counted(
            &self.totals.snapshot(),
            selector,
            range,
            read.lenient,
            &self.memory,
        )?))
    }

    /// The values label `name` has in what `selector` (if any) selects in `range`, sorted.
    /// Strict: read from the series index (no sample row is read), at its granularity of an
    /// hour, as Prometheus and Pyroscope answer from the index of each block a range
    /// touches. Span labels are not series labels: they are not listed.
    pub fn label_values(
        &self,
        name: &str,
        selector: Option<&Selector>,
        range: TimeRange,
        read: ReadOptions,
    ) -> Result<Read<Vec<String>>> {
        no_span_labels(selector, "label values")?;
        let (snapshot, range) = self.label_source(range, read);
        Ok(Read::of(frostdb_profile::native::label_values_counted(
            &snapshot,
            name,
            selector,
            range,
            read.lenient,
        )?))
    }

    /// The names of the labels of what `selector` (if any) selects in `range`, sorted: from
    /// the series index, as [`ProfileStore::label_values`].
    pub fn label_names(
        &self,
        selector: Option<&Selector>,
        range: TimeRange,
        read: ReadOptions,
    ) -> Result<Read<Vec<String>>> {
        no_span_labels(selector, "label names")?;
        let (snapshot, range) = self.label_source(range, read);
        Ok(Read::of(frostdb_profile::native::label_names_counted(
            &snapshot,
            selector,
            range,
            read.lenient,
        )?))
    }

    /// Each profile type and label set `selector` selects in `range`, sorted: from the series
    /// index, as [`ProfileStore::label_values`]; with `only`, just the labels named.
    pub fn series(
        &self,
        selector: &Selector,
        range: TimeRange,
        only: Option<&[String]>,
        read: ReadOptions,
    ) -> Result<Read<Vec<frostdb_profile::native::SeriesLabels>>> {
        no_span_labels(Some(selector), "series")?;
        let (snapshot, range) = self.label_source(range, read);
        Ok(Read::of(frostdb_profile::native::series_labels_counted(
            &snapshot,
            selector,
            range,
            only,
            read.lenient,
            &self.memory,
        )?))
    }

    /// The times of the oldest and newest stored profiles (Unix ms), `None` when none is
    /// stored: read from the statistics of the profile totals, no row is read.
    pub fn time_span(&self) -> Result<Option<(i64, i64)>> {
        let Some(stats) = self.totals.snapshot().column_stats(TIMESTAMP) else {
            return Ok(None);
        };
        Ok(match (stats.min, stats.max) {
            (Some(frostdb_core::Scalar::Int(min)), Some(frostdb_core::Scalar::Int(max))) => {
                Some((min, max))
            }
            _ => None,
        })
    }

    /// The profile types stored in `range`, sorted: from the series index, as
    /// [`ProfileStore::label_values`].
    pub fn profile_types(
        &self,
        range: TimeRange,
        read: ReadOptions,
    ) -> Result<Read<Vec<frostdb_profile::ProfileType>>> {
        let (snapshot, range) = self.label_source(range, read);
        Ok(Read::of(frostdb_profile::native::profile_types_counted(
            &snapshot,
            range,
            read.lenient,
        )?))
    }

    /// A predicate that holds for every sample `selector` selects in `range`, for the merge's
    /// scan to prune by: the full label sets of the series it selects (label matchers alone,
    /// a pod say, fall on a column late in the sort order, which row group bounds hardly
    /// narrow; the whole label set starts at the first). `None` when it selects many.
    fn narrowing(
        &self,
        schemas: &[&frostdb_core::TableSchema],
        selector: &Selector,
        range: TimeRange,
    ) -> Result<Narrowing> {
        // Only checked against statistics (of blocks, row groups and pages), never against
        // rows; past EXACT_SETS, bounds per column keep the cost per page flat.
        const MAX_SERIES: usize = 64;
        // Up to this many, the label sets themselves; past it, each column's values.
        const EXACT_SETS: usize = 4;
        // Most columns the predicate names: each is checked against the statistics of every
        // block, row group and page, and a series of thousands of labels (which a store
        // written before the label limits may hold) made that cost minutes. Fewer columns
        // bound less tightly, never wrongly.
        const MAX_COLUMNS: usize = 32;
        let (index, hours) = self.label_source(range, ReadOptions::STRICT);
        let Some(sets) = frostdb_profile::native::series_of(&index, selector, hours, MAX_SERIES)?
        else {
            return Ok(Narrowing::Unknown);
        };
        if sets.iter().any(Vec::is_empty) {
            return Ok(Narrowing::Unknown); // a series without labels: nothing to narrow by
        }
        // A set with a column no table read has has no rows there.
        let known = |set: &frostdb_profile::native::LabelSet| {
            schemas
                .iter()
                .any(|schema| set.iter().all(|(c, _)| schema.index_of(c).is_some()))
        };
        let sets: Vec<frostdb_profile::native::LabelSet> = sets.into_iter().filter(known).collect();
        if sets.is_empty() {
            return Ok(Narrowing::NoSeries);
        }
        if sets.len() <= EXACT_SETS && sets.iter().all(|set| set.len() <= MAX_COLUMNS) {
            return Ok(sets
                .into_iter()
                .filter_map(|set| {
                    set.into_iter()
                        .map(|(column, value)| frostdb_core::col(column).eq(value))
                        .reduce(frostdb_core::Predicate::and)
                })
                .reduce(frostdb_core::Predicate::or)
                .map_or(Narrowing::Unknown, Narrowing::To));
        }
        // Many sets, or long ones: each column's values, a looser bound at a cost that does
        // not grow with the sets. A column some set lacks (null there) bounds nothing: per
        // column, its values and how many sets have it (a set names a column once).
        type Values<'a> = (std::collections::BTreeSet<&'a str>, usize);
        let mut columns: std::collections::BTreeMap<&str, Values<'_>> = Default::default();
        for set in &sets {
            for (column, value) in set {
                let (values, having) = columns.entry(column).or_default();
                values.insert(value);
                *having += 1;
            }
        }
        let mut shared: Vec<(&str, std::collections::BTreeSet<&str>)> = columns
            .into_iter()
            .filter(|(_, (_, having))| *having == sets.len())
            .map(|(column, (values, _))| (column, values))
            .collect();
        // The labels that lead the sort order first: they bound row groups best.
        shared.sort_by_key(|(column, _)| {
            let label = column.strip_prefix(LABEL_PREFIX).unwrap_or(column);
            schema::LABELS_FIRST
                .iter()
                .position(|first| *first == label)
                .unwrap_or(schema::LABELS_FIRST.len())
        });
        shared.truncate(MAX_COLUMNS);
        Ok(shared
            .into_iter()
            .map(|(column, values)| {
                frostdb_core::col(column).in_list(values.into_iter().map(str::to_owned))
            })
            .reduce(frostdb_core::Predicate::and)
            .map_or(Narrowing::Unknown, Narrowing::To))
    }

    /// Where a label read reads: strictly, the series index, and `range` widened to the
    /// whole hours its rows stand for; leniently, the sample rows and `range` as it is.
    fn label_source(
        &self,
        range: TimeRange,
        read: ReadOptions,
    ) -> (frostdb_core::Snapshot, TimeRange) {
        // Lenient: the sample rows at their exact times, so skipped blocks are counted.
        if read.lenient {
            return (self.samples.snapshot(), range);
        }
        let start_ms = match range.start_ms {
            i64::MIN => i64::MIN,
            t => t.div_euclid(schema::SERIES_BUCKET_MS) * schema::SERIES_BUCKET_MS,
        };
        (
            self.series_index.snapshot(),
            TimeRange {
                start_ms,
                end_ms: range.end_ms,
            },
        )
    }
}

/// Whether a merge of `selector` reads the spans table: when it matches on a span label
/// ([`schema::SPAN_LABELS`]). Only the samples labelled with a span are there, so a span
/// matcher that also accepts the empty value (`span_id!="x"`, `span_id=""`) would leave
/// out every sample without one and answer as if it had read them: refused.
fn reads_spans(selector: &Selector) -> Result<bool> {
    let mut by_span = false;
    for m in &selector.matchers {
        if !schema::SPAN_LABELS.contains(&m.label.as_str()) {
            continue;
        }
        if m.matches("") {
            return Err(Error::Query(format!(
                "the matcher {}{}{:?} also selects samples without a {}: a span matcher must \
                 name the spans it selects (= or =~ a list of ids)",
                m.label,
                m.op,
                crate::limits::shortened(&m.value),
                m.label
            )));
        }
        by_span = true;
    }
    Ok(by_span)
}

/// Refuses a span matcher in a read of `what` from the profile totals or the series index,
/// which keep no span labels: it would select nothing (or everything) and answer so.
fn no_span_labels(selector: Option<&Selector>, what: &str) -> Result<()> {
    let span = selector
        .into_iter()
        .flat_map(|s| &s.matchers)
        .find(|m| schema::SPAN_LABELS.contains(&m.label.as_str()));
    match span {
        Some(m) => Err(Error::Query(format!(
            "{what} cannot be selected by {}: span labels are kept on samples, not on series \
             (use it in a merge)",
            m.label
        ))),
        None => Ok(()),
    }
}
