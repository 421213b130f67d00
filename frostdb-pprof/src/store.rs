//! Profiles in a frostdb database: ingest (decode, normalize, store durably) and merge
//! (a selector over a time range into one profile to report on).
//!
//! One profile is one transaction: the symbols it adds to the current partition and its
//! sample rows go into one WAL record, so after a crash either all of it is there or none.
//! Ingests run in parallel up to the symbol writer, which they hold only while they look up
//! and add symbols and append their record; the fsync is waited for outside it, so
//! concurrent ingests share fsyncs and a lone one waits for nobody.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::Duration;

use datafusion::prelude::SessionContext;
use frostdb_core::{Db, Maintenance, Scalar, Submitted, Table, TableOptions, now_ms};
use frostdb_profile::native::{StackTotals, merge_stacks};
use frostdb_profile::{Aggregation, TimeRange};
use frostdb_profile::{ProfileType, Selector};
use parking_lot::Mutex;

use crate::decode::{Limits, ValidProfile, decode};
use crate::dedup::{ContentFingerprint, Recent};
use crate::error::{Error, Result};
use crate::limits::{LabelLimits, SeriesKeys};
use crate::normalize::{Deltas, IngestOptions, IngestSummary, SampleRows, prepare};
use crate::rollup::{RollupOptions, RollupSummary, Rollups};
use crate::schema;
use crate::schema::column::{LABEL_PREFIX, STACKTRACE_ID, TIMESTAMP};
use crate::symbols::{
    Counts, Partition, StackId, SymbolOptions, SymbolStore, SymbolTables, Symbols, split_id,
};

/// How a [`ProfileStore`] stores and keeps profiles.
///
/// # Defaults
/// | option | default | meaning |
/// |---|---|---|
/// | `limits` | [`Limits::default`] | what a decoded profile may hold |
/// | `label_limits` | [`LabelLimits::default`] | labels per series (30), label name (1024 bytes) and value (2048 bytes) lengths |
/// | `max_series` | no limit | series the store may hold, counted across restarts |
/// | `symbols` | [`SymbolOptions::default`] | symbol partitions and their cache |
/// | `samples` | [`TableOptions::default`] with a level fanout of 8 | the samples table (block size, granules, ...) |
/// | `retention` | none | samples older than this are deleted, then the symbols only they used |
/// | `query_threads` | the machine's cores | threads a merge reads with |
/// | `rollups` | [`RollupOptions::default`] | hourly and daily rollups merges read |
/// | `block_merger` | none | where merges read persisted blocks: here, or spread over a cluster's workers |
/// | `group_wait` | 10 ms | longest a group commit waits for profiles still being decoded |
/// | `memory_budget` | none | a process-wide budget queries reserve from, besides `query_memory` |
/// | `dedup_window` | 1 hour | how far behind the newest profile one pushed again is still recognised |
///
/// Set with the setters (`StoreOptions::default().retention(d).max_series(n)`): fields are
/// added as the store grows, which a struct literal outside this crate would not survive.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreOptions {
    /// Decoding limits.
    pub limits: Limits,
    /// Bounds on each series' labels; a profile over one is refused whole.
    pub label_limits: LabelLimits,
    /// Symbol partitions and cache.
    pub symbols: SymbolOptions,
    /// Options of the samples table when it is created.
    pub samples: TableOptions,
    /// How long samples are kept (`None`: forever).
    pub retention: Option<Duration>,
    /// Threads a merge reads with.
    pub query_threads: usize,
    /// Memory the store's queries may hold at once, merges and SQL together (`None`: no
    /// limit). Over it a SQL operator spills where it can; otherwise the query fails with a
    /// "resources exhausted" error naming the limit.
    pub query_memory: Option<usize>,
    /// A process-wide memory budget the store's queries also reserve from (`None`: only
    /// `query_memory` bounds them).
    pub memory_budget: Option<frostdb_core::MemoryBudget>,
    /// Series the store may hold (profile name and every label, pprof sample labels
    /// included; [`crate::limits`]): those stored before it was opened count, read from
    /// the series keys when it opens; a profile that would add more is refused whole.
    /// Series whose samples have expired stop counting at the next open.
    pub max_series: usize,
    /// Hourly and daily rollups ([`crate::rollup`]).
    pub rollups: RollupOptions,
    /// Where merges read persisted blocks (`None`: in this process). With a merger (the
    /// workers of a cluster reading the same bucket), what is in memory is read here and
    /// the blocks there; the sums are added, exactly.
    pub block_merger: Option<Arc<dyn frostdb_profile::native::BlockMerger>>,
    /// Longest a group commit's leader keeps the open group open, once the group before it
    /// is durable, for profiles already being decoded on other threads to join it (as
    /// PostgreSQL's `commit_delay` waits only while `commit_siblings` are active): each
    /// group costs a WAL record, an fsync and a part per table, whatever its size. It
    /// waits only while those on their way are more than a quarter of the group; with
    /// nothing on its way, a group commits at once.
    pub group_wait: Duration,
    /// How long a profile pushed again is recognised and stored once (see
    /// [`ProfileStore::ingest`]): profiles whose timestamps lie within this of the newest
    /// stored (or of now, if earlier). Their fingerprints are kept in memory, at most
    /// 262,144 of them (some 13 MiB), and read again when the store opens. Zero: profiles
    /// are not recognised, each push is stored.
    pub dedup_window: Duration,
}

/// The default options of the samples, spans and totals tables: the engine's, with a level
/// fanout of 8 instead of 4. At fleet rates compaction is a tenth of the ingest CPU, and
/// every sample row is rewritten once per level it passes; with 8 runs merged at a time a
/// block of four million rows passes three levels instead of four. (`frostdb-bench ingest
/// --pprof` on shared/bench's small fleet, six interleaved runs: compaction 20 against
/// 24 us a profile, 9,091 against 8,494 profiles a second.) Queries of the block being
/// written merge up to seven runs a level, where they merged three.
fn samples_table_options() -> TableOptions {
    TableOptions::default().level_fanout(8)
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            label_limits: LabelLimits::default(),
            symbols: SymbolOptions::default(),
            samples: samples_table_options(),
            retention: None,
            query_memory: None,
            memory_budget: None,
            query_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            max_series: usize::MAX,
            rollups: RollupOptions::default(),
            block_merger: None,
            group_wait: Duration::from_millis(10),
            dedup_window: Duration::from_secs(3600),
        }
    }
}

impl StoreOptions {
    /// Sets [`Self::limits`].
    pub fn limits(mut self, value: Limits) -> Self {
        self.limits = value;
        self
    }

    /// Sets [`Self::label_limits`].
    pub fn label_limits(mut self, value: LabelLimits) -> Self {
        self.label_limits = value;
        self
    }

    /// Sets [`Self::symbols`].
    pub fn symbols(mut self, value: SymbolOptions) -> Self {
        self.symbols = value;
        self
    }

    /// Sets [`Self::samples`].
    pub fn samples(mut self, value: TableOptions) -> Self {
        self.samples = value;
        self
    }

    /// Sets [`Self::retention`] (`None`: forever).
    pub fn retention(mut self, value: impl Into<Option<Duration>>) -> Self {
        self.retention = value.into();
        self
    }

    /// Sets [`Self::query_threads`].
    pub fn query_threads(mut self, value: usize) -> Self {
        self.query_threads = value;
        self
    }

    /// Sets [`Self::query_memory`] (`None`: no limit).
    pub fn query_memory(mut self, value: impl Into<Option<usize>>) -> Self {
        self.query_memory = value.into();
        self
    }

    /// Sets [`Self::memory_budget`].
    pub fn memory_budget(mut self, value: impl Into<Option<frostdb_core::MemoryBudget>>) -> Self {
        self.memory_budget = value.into();
        self
    }

    /// Sets [`Self::max_series`].
    pub fn max_series(mut self, value: usize) -> Self {
        self.max_series = value;
        self
    }

    /// Sets [`Self::rollups`].
    pub fn rollups(mut self, value: RollupOptions) -> Self {
        self.rollups = value;
        self
    }

    /// Sets [`Self::block_merger`].
    pub fn block_merger(
        mut self,
        value: impl Into<Option<Arc<dyn frostdb_profile::native::BlockMerger>>>,
    ) -> Self {
        self.block_merger = value.into();
        self
    }

    /// Sets [`Self::group_wait`].
    pub fn group_wait(mut self, value: Duration) -> Self {
        self.group_wait = value;
        self
    }

    /// Sets [`Self::dedup_window`].
    pub fn dedup_window(mut self, value: Duration) -> Self {
        self.dedup_window = value;
        self
    }
}

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
        self.samples.iter().map(|(_, v)| *v).sum()
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

/// What the series index says a merge's selector selects.
enum Narrowing {
    /// Too many series, or series the index cannot narrow by: read what the selector says.
    Unknown,
    /// No series: nothing to read.
    NoSeries,
    /// Rows of these series only.
    To(frostdb_core::Predicate),
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

/// Deletes symbol partitions no retained sample refers to (run after retention).
struct SymbolExpiry {
    /// The tables whose rows refer to stacks: samples and spans.
    stack_users: [Table; 2],
    symbols: Arc<SymbolStore>,
}

/// The oldest and newest symbol partitions the rows of `tables` refer to (`None`: no rows).
fn partitions_used(tables: &[Table]) -> Option<(u32, u32)> {
    tables
        .iter()
        .filter_map(|t| {
            let stats = t.snapshot().column_stats(STACKTRACE_ID)?;
            match (stats.min, stats.max) {
                (Some(Scalar::UInt(min)), Some(Scalar::UInt(max))) => {
                    Some((split_id(min).0, split_id(max).0))
                }
                _ => None,
            }
        })
        .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
}

impl SymbolExpiry {
    fn run_once(&self) -> Result<usize> {
        let current = self.symbols.current().id();
        let oldest_used =
            partitions_used(&self.stack_users).map_or(current, |(oldest, _)| oldest.min(current));
        let tables = self.symbols.tables();
        let mut deleted = 0;
        for (table, column) in [
            (&tables.stacktraces, STACKTRACE_ID),
            (&tables.locations, "location_id"),
            (&tables.functions, "function_id"),
            (&tables.mappings, "mapping_id"),
        ] {
            deleted += table
                .delete_blocks(|b| match b.stats_of(column).max {
                    Some(Scalar::UInt(max)) => split_id(max).0 < oldest_used,
                    _ => false,
                })?
                .len();
        }
        self.symbols.forget_below(oldest_used);
        if deleted > 0 {
            tracing::info!(
                blocks = deleted,
                oldest_partition_kept = oldest_used,
                "symbols no retained sample refers to deleted"
            );
        }
        Ok(deleted)
    }
}

impl Maintenance for SymbolExpiry {
    fn run(&self, _now_ms: i64) {
        if let Err(error) = self.run_once() {
            tracing::warn!(%error, "expiring symbols failed; retried at the next pass");
        }
    }
}

/// Most sample rows a group of profiles commits in one transaction.
const MAX_GROUP_ROWS: usize = 64 * 1024;

/// Where a group of profiles stands.
enum SlotState {
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
struct Slot {
    state: std::sync::Mutex<SlotState>,
    ready: std::sync::Condvar,
}

impl Slot {
    fn new() -> Self {
        Self {
            state: std::sync::Mutex::new(SlotState::Waiting),
            ready: std::sync::Condvar::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn finish(&self, result: std::result::Result<Arc<Submitted>, Arc<Error>>) {
        *self.state() = SlotState::Done(result);
        self.ready.notify_all();
    }

    fn hand_lead(&self) {
        *self.state() = SlotState::Lead;
        self.ready.notify_one();
    }
}

/// Profiles' sample rows committed as one transaction, with the symbols their partition
/// gained since the partition's previous group.
struct Group {
    partition: Arc<Partition>,
    /// The partition's symbols from here (to `to`) are written with the group.
    from: Counts,
    to: Counts,
    rows: SampleRows,
    /// Rows of the samples labelled with a span (the `spans` table).
    spans: SampleRows,
    /// The series keys of its profiles, with their days ([`crate::limits`]).
    keys: Vec<(u64, i64)>,
    /// Its profiles' timestamps and content fingerprints ([`crate::dedup`]).
    fingerprints: Vec<(i64, ContentFingerprint)>,
    slot: Arc<Slot>,
    /// Why a profile's rows could not be appended whole, if one could not.
    broken: Option<String>,
}

impl Group {
    fn new(partition: Arc<Partition>, from: Counts) -> Self {
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
struct Pipeline {
    /// The group profiles join.
    open: Option<Group>,
    /// Groups closed to new profiles, in commit order.
    sealed: VecDeque<Group>,
    /// Per partition (newest few), the symbols up to which a group writes them.
    cuts: Vec<(u32, Counts)>,
    /// Whether a member is committing groups (or the lead is being handed to one).
    leading: bool,
    /// Partitions a group of failed to commit: nothing more of them commits.
    failed: Vec<u32>,
    /// The group committed last (its slot, transaction and fingerprints), until it is
    /// durable: the leader lets the open group gather profiles while its fsync runs,
    /// rather than committing groups of one, and then wakes its members.
    in_flight: Option<InFlight>,
    /// Whether the leader is waiting on [`ProfileStore::joined`] for company: only then
    /// is it signalled (a signal is a system call, waiter or not).
    gathering: bool,
    /// The fingerprints of the profiles of the groups not yet durable (open, sealed,
    /// committing, in flight), with their group's slot: a profile stored again meanwhile
    /// waits for that group ([`crate::dedup`]).
    pending: std::collections::HashMap<ContentFingerprint, Arc<Slot>, foldhash::fast::RandomState>,
    /// The fingerprints of the profiles stored lately (durable).
    recent: Recent,
}

/// A group committed, until it is durable.
type InFlight = (Arc<Slot>, Arc<Submitted>, Vec<(i64, ContentFingerprint)>);

/// Whether a profile joining a group was stored already.
enum Stored {
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
    fn seal(&mut self) {
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
    fn stored(&self, fingerprint: ContentFingerprint) -> Stored {
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
    fn settle(&mut self, fingerprints: Vec<(i64, ContentFingerprint)>, durable: bool) {
        for (_, fingerprint) in &fingerprints {
            self.pending.remove(fingerprint);
        }
        if durable {
            self.recent.insert(fingerprints);
        }
    }

    /// Where the next group of partition `id` starts writing its symbols.
    fn cut(&self, id: u32) -> Counts {
        self.cuts
            .iter()
            .find(|(p, _)| *p == id)
            .map_or_else(Counts::default, |(_, c)| *c)
    }
}

/// A database of profiles: the samples table and the symbol tables.
pub struct ProfileStore {
    db: Db,
    samples: Table,
    spans: Table,
    /// The series index ([`schema::series`]), committed with the samples it indexes.
    series_index: Table,
    /// Per profile, type and label set, the sum of its samples ([`schema::totals`]),
    /// committed with them: what range queries read.
    totals: Table,
    /// Series index rows committed since open (key -> hour), so each is written once; hours
    /// long past are forgotten.
    indexed: Mutex<SeriesSeen>,
    /// The pool every query of the store reserves memory from.
    memory: Arc<dyn datafusion::execution::memory_pool::MemoryPool>,
    symbols: Arc<SymbolStore>,
    expiry: Arc<SymbolExpiry>,
    rollups: Arc<Rollups>,
    deltas: Mutex<Deltas>,
    pipeline: std::sync::Mutex<Pipeline>,
    /// Signalled when the open group is worth committing (see [`StoreOptions::group_wait`]).
    joined: std::sync::Condvar,
    /// Profiles being decoded or prepared, not yet in a group: the company a leader may
    /// wait for.
    coming: std::sync::atomic::AtomicUsize,
    /// The series stored (when limited) and admitted since open, against
    /// [`StoreOptions::max_series`].
    series: Mutex<SeriesKeys>,
    /// Their keys' table ([`schema::SERIES_KEYS`]); none in a reader.
    series_keys: Option<Table>,
    /// The stored profiles' fingerprints ([`schema::FINGERPRINTS`]); none in a reader, or
    /// with [`StoreOptions::dedup_window`] zero.
    fingerprints: Option<Table>,
    options: StoreOptions,
}

impl std::fmt::Debug for ProfileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfileStore")
            .field("db", &self.db)
            .field("symbols", &self.symbols)
            .finish_non_exhaustive()
    }
}

/// Options of the symbol tables: smaller blocks than samples', so that symbols persist (and
/// leave memory) steadily.
fn symbol_table_options() -> TableOptions {
    TableOptions::default().block_size(32 << 20)
}

/// Series index rows to write, and their keys and hours.
type IndexRows = (arrow::array::RecordBatch, Vec<(u64, i64)>);

/// Series index rows written since open: key -> hour.
#[derive(Default)]
struct SeriesSeen {
    keys: std::collections::HashMap<u64, i64, foldhash::fast::RandomState>,
    newest_hour: i64,
}

/// Hours of series index keys kept behind the newest: later profiles of older hours write
/// their index rows again (which queries read as one).
const SERIES_SEEN_HOURS: i64 = 3;

impl SeriesSeen {
    /// The index rows of a group's samples (`keys`: key and sample row) not written yet, and
    /// their keys and hours; `None` when all were.
    fn new_rows(
        &self,
        samples: &arrow::array::RecordBatch,
        keys: Vec<(u64, u32)>,
    ) -> Result<Option<IndexRows>> {
        let timestamps = samples
            .column_by_name(TIMESTAMP)
            .and_then(|c| c.as_any().downcast_ref::<arrow::array::Int64Array>())
            .ok_or_else(|| Error::Corrupt("sample rows without timestamps".into()))?;
        let mut new: Vec<(u64, i64)> = Vec::new();
        let mut rows: Vec<u32> = Vec::new();
        for (key, row) in keys {
            let hour = timestamps
                .value(row as usize)
                .div_euclid(schema::SERIES_BUCKET_MS);
            if !self.keys.contains_key(&key) && !new.iter().any(|(k, _)| *k == key) {
                new.push((key, hour));
                rows.push(row);
            }
        }
        if rows.is_empty() {
            return Ok(None);
        }
        Ok(Some((crate::normalize::series_rows(samples, &rows)?, new)))
    }

    /// Records keys whose rows were committed.
    fn committed(&mut self, keys: Vec<(u64, i64)>) {
        let newest = keys.iter().map(|(_, h)| *h).max().unwrap_or(i64::MIN);
        if newest > self.newest_hour {
            self.newest_hour = newest;
            let oldest = newest - SERIES_SEEN_HOURS;
            self.keys.retain(|_, hour| *hour >= oldest);
        }
        self.keys.extend(keys);
    }
}

/// Builds the totals of a store written before it had them, from its sample rows.
fn build_totals(db: &Db, samples: &Table, totals: &Table) -> Result<()> {
    let started = std::time::Instant::now();
    let (mut read, mut written) = (0usize, 0usize);
    let snapshot = samples.snapshot();
    let columns: Vec<String> = snapshot
        .schema()
        .arrow_schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| n != STACKTRACE_ID)
        .collect();
    // One transaction: a crash midway leaves no totals, and the next open builds them whole.
    let mut tx = db.transaction();
    for batch in snapshot.scan(&frostdb_core::ScanRequest::new().project(columns.iter()))? {
        let batch = batch?;
        read += batch.num_rows();
        let rows = crate::normalize::totals_rows(&batch)?;
        written += rows.num_rows();
        tx.insert(totals, &rows)?;
    }
    tx.commit()?;
    tracing::info!(
        sample_rows = read,
        total_rows = written,
        seconds = started.elapsed().as_secs_f64(),
        "built the profile totals of a store written without them"
    );
    Ok(())
}

/// Builds the series index of a store written before it had one, from its sample rows.
fn build_series_index(db: &Db, samples: &Table, index: &Table) -> Result<()> {
    use arrow::row::{OwnedRow, RowConverter, SortField};
    let started = std::time::Instant::now();
    let snapshot = samples.snapshot();
    let columns: Vec<String> = snapshot
        .schema()
        .arrow_schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| schema::is_series_column(n))
        .collect();
    // Rows seen, per set of columns (a batch's rows compare only with rows of its columns).
    let mut seen: std::collections::HashMap<Vec<String>, std::collections::HashSet<OwnedRow>> =
        Default::default();
    let (mut read, mut written) = (0usize, 0usize);
    for batch in snapshot.scan(&frostdb_core::ScanRequest::new().project(columns.iter()))? {
        let batch = batch?;
        read += batch.num_rows();
        let all: Vec<u32> = (0..batch.num_rows() as u32).collect();
        let rows = crate::normalize::series_rows(&batch, &all)?;
        let schema = rows.schema();
        let converter = RowConverter::new(
            schema
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )?;
        let keys = converter.convert_columns(rows.columns())?;
        let seen = seen
            .entry(schema.fields().iter().map(|f| f.name().clone()).collect())
            .or_default();
        let first: Vec<u32> = (0..keys.num_rows())
            .filter(|&i| seen.insert(keys.row(i).owned()))
            .map(|i| i as u32)
            .collect();
        if !first.is_empty() {
            let new = arrow::compute::take_record_batch(
                &rows,
                &arrow::array::UInt32Array::from(first.clone()),
            )?;
            let mut tx = db.transaction();
            tx.insert(index, &new)?;
            tx.submit()?.wait()?;
            written += first.len();
        }
    }
    tracing::info!(
        sample_rows = read,
        index_rows = written,
        seconds = started.elapsed().as_secs_f64(),
        "built the series index of a store written without one"
    );
    Ok(())
}

/// Whether a leader whose open group holds `joined` profiles keeps it open for the `coming`
/// ones still being decoded. It waits while they are more than a quarter of the group: a
/// group then takes most of the profiles in motion, and the few still on their way keep
/// the cores busy while it commits and syncs, and start the next one. Waiting for every
/// last one instead had all of them joining one group, then nothing to do during its sync
/// (about 13% of two cores idle on the small fleet's ingest, against 9%).
fn worth_waiting_for(coming: usize, joined: usize) -> bool {
    coming > 0 && coming * 4 > joined
}

/// A profile on its way to a group: counted in [`ProfileStore::coming`] from before its
/// decoding until it joins a group or fails.
struct Coming<'a> {
    store: &'a ProfileStore,
    counted: bool,
}

impl<'a> Coming<'a> {
    fn new(store: &'a ProfileStore) -> Self {
        store
            .coming
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Self {
            store,
            counted: true,
        }
    }

    /// The profile joined a group: how many others are still on their way.
    fn arrive(&mut self) -> usize {
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

impl ProfileStore {
    /// The group commit pipeline. A std mutex: it spins briefly and then sleeps, where
    /// parking_lot's yields the CPU again and again, which with many clients on few cores
    /// cost more than the short critical sections it guards.
    fn pipeline(&self) -> std::sync::MutexGuard<'_, Pipeline> {
        self.pipeline
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens (creating if needed) the profile tables of `db`. Reads no symbols: they are
    /// read per partition when a merge needs them.
    pub fn open(db: Db, options: StoreOptions) -> Result<Self> {
        Self::open_in(db, options, false)
    }

    /// Opens the profile tables of a read-only database (a follower of a shared bucket,
    /// [`Db::open_reader`]): queries only, answered from what the writer persisted; see
    /// [`ProfileStore::refresh`]. The store's retention is the writer's (`options.retention`
    /// is not applied). [`Error::Unavailable`] when the writer has not created the tables
    /// yet (a tenant with no data in the bucket).
    pub fn open_reader(db: Db, options: StoreOptions) -> Result<Self> {
        if !db.is_read_only() {
            return Err(Error::Query(
                "open_reader takes a read-only database (Db::open_reader)".into(),
            ));
        }
        Self::open_in(db, options, true)
    }

    fn open_in(db: Db, options: StoreOptions, read_only: bool) -> Result<Self> {
        if read_only {
            for name in [schema::SAMPLES, schema::STACKTRACES, schema::TOTALS] {
                if db.get_table(name).is_none() {
                    return Err(Error::Unavailable(format!(
                        "no profiles stored yet: the bucket has no {name:?} table (its \
                         writer has not persisted any)"
                    )));
                }
            }
        }
        // Retention is the writer's to set; a reader only reads.
        let set_ttl = |table: &frostdb_core::Table, ttl: Option<Duration>| {
            if read_only {
                Ok(())
            } else {
                table.set_ttl(ttl)
            }
        };
        // Symbols first: a transaction is published table by table in the order it writes
        // them, and samples refer to symbols.
        let mappings = db.table(schema::MAPPINGS, schema::mappings(), symbol_table_options())?;
        let functions = db.table(
            schema::FUNCTIONS,
            schema::functions(),
            symbol_table_options(),
        )?;
        let locations = db.table(
            schema::LOCATIONS,
            schema::locations(),
            symbol_table_options(),
        )?;
        let stacktraces = db.table(
            schema::STACKTRACES,
            schema::stacktraces(),
            symbol_table_options(),
        )?;
        let samples = schema::open_series_table(&db, schema::SAMPLES, options.samples.clone())?;
        set_ttl(&samples, options.retention)?;
        let spans = schema::open_series_table(&db, schema::SPANS, options.samples.clone())?;
        set_ttl(&spans, options.retention)?;
        let series_index = schema::open_series_table(&db, schema::SERIES, TableOptions::default())?;
        // An index row stands for an hour from its timestamp: kept an hour longer than the
        // samples, so no sample outlives the row that indexes it.
        set_ttl(
            &series_index,
            options
                .retention
                .map(|r| r + Duration::from_millis(schema::SERIES_BUCKET_MS as u64)),
        )?;
        if !read_only && series_index.snapshot().rows() == 0 && samples.snapshot().rows() > 0 {
            build_series_index(&db, &samples, &series_index)?;
        }
        let series_keys = if read_only {
            None
        } else {
            let existed = db.get_table(schema::SERIES_KEYS).is_some();
            let keys = db.table(
                schema::SERIES_KEYS,
                schema::series_keys(),
                TableOptions::default(),
            )?;
            // A key row stands for a day: kept a day longer than the samples.
            keys.set_ttl(
                options
                    .retention
                    .map(|r| r + Duration::from_millis(schema::SERIES_KEYS_BUCKET_MS as u64)),
            )?;
            if !existed && series_index.snapshot().rows() > 0 {
                crate::limits::build_series_keys(&db, &series_index, &keys)?;
            }
            Some(keys)
        };
        let series = match &series_keys {
            Some(keys) => SeriesKeys::open(keys, options.max_series != usize::MAX)?,
            None => SeriesKeys::open_empty(),
        };
        let totals = schema::open_series_table(&db, schema::TOTALS, options.samples.clone())?;
        set_ttl(&totals, options.retention)?;
        // The fingerprints of a store written before them are not rebuilt: its profiles
        // are not recognised when pushed again.
        let fingerprints = if read_only || options.dedup_window.is_zero() {
            None
        } else {
            let table = db.table(
                schema::FINGERPRINTS,
                schema::fingerprints(),
                TableOptions::default(),
            )?;
            table.set_ttl(options.retention)?;
            Some(table)
        };
        let recent = match &fingerprints {
            Some(table) => Recent::open(table, options.dedup_window)?,
            None => Recent::default(),
        };
        if !read_only && totals.snapshot().rows() == 0 && samples.snapshot().rows() > 0 {
            build_totals(&db, &samples, &totals)?;
        }
        let tables = SymbolTables {
            stacktraces,
            locations,
            functions,
            mappings,
        };
        let stack_users = [samples.clone(), spans.clone()];
        let newest_used = partitions_used(&stack_users).map_or(0, |(_, newest)| newest);
        let newest = tables.newest_partition().max(newest_used);
        let symbols = Arc::new(if read_only {
            SymbolStore::open_reader(tables, options.symbols)
        } else {
            SymbolStore::open(tables, options.symbols, newest)
        });
        let expiry = Arc::new(SymbolExpiry {
            stack_users,
            symbols: symbols.clone(),
        });
        let task: Arc<dyn Maintenance> = expiry.clone();
        db.add_maintenance(Arc::downgrade(&task) as Weak<dyn Maintenance>);
        drop(task);
        let rollups = Arc::new(Rollups::open(
            &db,
            &samples,
            &series_index,
            &options.samples,
            options.retention,
            options.rollups.clone(),
            read_only,
        )?);
        let task: Arc<dyn Maintenance> = rollups.clone();
        db.add_maintenance(Arc::downgrade(&task) as Weak<dyn Maintenance>);
        drop(task);
        Ok(Self {
            db,
            samples,
            spans,
            series_index,
            totals,
            indexed: Mutex::new(SeriesSeen::default()),
            memory: frostdb_query::budgeted_memory_pool(
                options.query_memory,
                options.memory_budget.as_ref(),
            ),
            symbols,
            expiry,
            rollups,
            deltas: Mutex::new(Deltas::default()),
            pipeline: std::sync::Mutex::new(Pipeline {
                recent,
                ..Pipeline::default()
            }),
            joined: std::sync::Condvar::new(),
            coming: std::sync::atomic::AtomicUsize::new(0),
            series: Mutex::new(series),
            series_keys,
            fingerprints,
            options,
        })
    }

    /// Takes what the writer persisted since (a store opened by
    /// [`ProfileStore::open_reader`]; nothing to do otherwise): new blocks of every table,
    /// and rollups made meanwhile. Returns whether anything changed.
    pub fn refresh(&self) -> Result<bool> {
        if !self.db.refresh()? {
            return Ok(false);
        }
        self.rollups.reload()?;
        Ok(true)
    }

    /// The database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The samples table.
    pub fn samples(&self) -> &Table {
        &self.samples
    }

    /// The decoding limits.
    pub fn limits(&self) -> &Limits {
        &self.options.limits
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    /// Bytes of symbols in memory (the current partition and the cache).
    pub fn symbol_memory_bytes(&self) -> usize {
        self.symbols.memory_bytes()
    }

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

    fn ingest_coming(
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

    /// Waits for `slot`'s group to be durable (or failed), committing groups when handed the
    /// lead.
    fn await_group(&self, slot: &Arc<Slot>) -> Result<Arc<Submitted>> {
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
    fn lead(&self, mine: &Arc<Slot>) {
        loop {
            let in_flight = self.pipeline().in_flight.take();
            if let Some((slot, submitted, fingerprints)) = in_flight {
                // The sync's error, if any, is the members' to see from `wait` themselves;
                // their profiles are not known stored, and a retry stores them.
                let durable = submitted.wait().is_ok();
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
            let slot = group.slot.clone();
            let fingerprints = std::mem::take(&mut group.fingerprints);
            match self.commit_group(group, &fingerprints) {
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
        let submitted = (|| {
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
            let keys = std::mem::take(&mut group.rows.series);
            let totals = std::mem::take(&mut group.rows.totals);
            let samples = group.rows.finish()?;
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
                &crate::normalize::totals_from(&samples, &totals)?,
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
        })();
        match submitted {
            Ok(submitted) => Ok(submitted),
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

    /// A session seeing this database's tables (SQL, and the DataFusion profile queries).
    /// Its queries fail when they cannot read a block they need.
    pub fn session(&self) -> Result<SessionContext> {
        Ok(frostdb_query::session_with(&self.db, self.memory.clone())?)
    }

    /// A session whose scans skip blocks they cannot read, counting them in the returned
    /// [`frostdb_query::BlocksFailed`]: answers may be partial, and the count says so.
    pub fn lenient_session(&self) -> Result<(SessionContext, frostdb_query::BlocksFailed)> {
        Ok(frostdb_query::lenient_session_with(
            &self.db,
            self.memory.clone(),
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

    /// Rolls up, now, every closed hour and day not rolled up yet (the database's
    /// maintenance pass does it every retention interval).
    pub fn roll_up(&self) -> Result<RollupSummary> {
        self.roll_up_at(now_ms())
    }

    /// [`ProfileStore::roll_up`] as if the time were `now_ms` (hours that ended
    /// [`RollupOptions::delay`] before it are closed).
    pub fn roll_up_at(&self, now_ms: i64) -> Result<RollupSummary> {
        self.rollups.run_pass(now_ms)
    }

    /// [`ProfileStore::merge`], skipping sample blocks that cannot be read and counting them
    /// in [`Merged::blocks_failed`]. Symbols are always read strictly: a stack that cannot be
    /// resolved is an error, never a frame left out.
    pub fn merge_lenient(&self, selector: &Selector, range: TimeRange) -> Result<Merged> {
        self.merge_reading(selector, range, true, true)
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
        let by_span = selector
            .matchers
            .iter()
            .any(|m| schema::SPAN_LABELS.contains(&m.label.as_str()));
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
            match self.narrowing(&snapshot, selector, range)? {
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
        let mut symbols = self.symbols.view(partitions.iter().copied())?;
        if self.db.is_read_only()
            && let Some((id, _)) = stacks
                .iter()
                .find(|(id, _)| !symbols.has_stack(StackId(*id)))
        {
            // A reader's cached partition from before its writer added to it: read again.
            self.symbols.forget(split_id(*id).0);
            symbols = self.symbols.view(partitions)?;
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
    /// labels), leniently or not. A sum that does not keep series apart is
    /// [`ProfileStore::merge`] (or [`ProfileStore::merge_lenient`]); the rest read raw
    /// samples per series (rollups and the series index's narrowing sum series together).
    pub fn merge_with(
        &self,
        selector: &Selector,
        range: TimeRange,
        options: &MergeOptions,
    ) -> Result<Merged> {
        if options.aggregation == Aggregation::Sum && !options.by_series {
            return self.merge_reading(selector, range, options.lenient, true);
        }
        let (table, _, profile_type) = self.merge_source(selector)?;
        let read = frostdb_profile::native::merge_stacks_by_series(
            &table.snapshot(),
            selector,
            range,
            options.aggregation,
            options.lenient,
            &self.memory,
        )?;
        let mut sums: BTreeMap<u64, i64> = BTreeMap::new();
        for (_, stacks) in &read.series {
            for (id, v) in stacks {
                let sum = sums.entry(*id).or_default();
                *sum = sum.saturating_add(*v);
            }
        }
        let stacks: Vec<(u64, i64)> = sums.into_iter().filter(|(_, v)| *v != 0).collect();
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

    /// The value per series and per `step_ms` bucket for what `selector` selects in `range`;
    /// with `group_by`, series are the distinct values of those labels.
    pub fn range(
        &self,
        selector: &Selector,
        range: TimeRange,
        step_ms: i64,
        group_by: Option<&[String]>,
    ) -> Result<Vec<frostdb_profile::native::Series>> {
        // Profile totals: a row per profile rather than per sample.
        Ok(frostdb_profile::native::range(
            &self.totals.snapshot(),
            selector,
            range,
            step_ms,
            group_by,
        )?)
    }

    /// [`ProfileStore::range`] skipping the blocks it cannot read, with their count: a
    /// partial answer that says it is partial.
    pub fn range_lenient(
        &self,
        selector: &Selector,
        range: TimeRange,
        step_ms: i64,
        group_by: Option<&[String]>,
    ) -> Result<(Vec<frostdb_profile::native::Series>, usize)> {
        Ok(frostdb_profile::native::range_counted(
            &self.totals.snapshot(),
            selector,
            range,
            step_ms,
            group_by,
            true,
        )?)
    }

    /// The values label `name` has in what `selector` (if any) selects in `range`, sorted:
    /// read from the series index (no sample row is read), at its granularity of an hour,
    /// as Prometheus and Pyroscope answer from the index of each block a range touches.
    /// Span labels are not series labels: they are not listed.
    pub fn label_values(
        &self,
        name: &str,
        selector: Option<&Selector>,
        range: TimeRange,
    ) -> Result<Vec<String>> {
        let (snapshot, range) = self.label_source(range);
        Ok(frostdb_profile::native::label_values(
            &snapshot, name, selector, range,
        )?)
    }

    /// The names of the labels of what `selector` (if any) selects in `range`, sorted: from
    /// the series index, as [`ProfileStore::label_values`].
    pub fn label_names(
        &self,
        selector: Option<&Selector>,
        range: TimeRange,
    ) -> Result<Vec<String>> {
        let (snapshot, range) = self.label_source(range);
        Ok(frostdb_profile::native::label_names(
            &snapshot, selector, range,
        )?)
    }

    /// Each profile type and label set `selector` selects in `range`, sorted: from the series
    /// index (no sample row is read), as [`ProfileStore::label_values`]; with `only`, just the
    /// labels named.
    pub fn series(
        &self,
        selector: &Selector,
        range: TimeRange,
        only: Option<&[String]>,
    ) -> Result<Vec<frostdb_profile::native::SeriesLabels>> {
        let (snapshot, range) = self.label_source(range);
        Ok(frostdb_profile::native::series_labels(
            &snapshot, selector, range, only,
        )?)
    }

    /// [`ProfileStore::series`] read from the sample rows (at their exact times, not the
    /// index's hours), skipping the blocks it cannot read, with their count.
    pub fn series_lenient(
        &self,
        selector: &Selector,
        range: TimeRange,
    ) -> Result<(Vec<frostdb_profile::native::SeriesLabels>, usize)> {
        Ok(frostdb_profile::native::series_labels_counted(
            &self.samples.snapshot(),
            selector,
            range,
            None,
            true,
        )?)
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
    pub fn profile_types(&self, range: TimeRange) -> Result<Vec<frostdb_profile::ProfileType>> {
        let (snapshot, range) = self.label_source(range);
        Ok(frostdb_profile::native::profile_types(&snapshot, range)?)
    }

    /// A predicate that holds for every sample `selector` selects in `range`, for the merge's
    /// scan to prune by: the full label sets of the series it selects (label matchers alone,
    /// a pod say, fall on a column late in the sort order, which row group bounds hardly
    /// narrow; the whole label set starts at the first). `None` when it selects many.
    fn narrowing(
        &self,
        samples: &frostdb_core::Snapshot,
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
        let (index, hours) = self.label_source(range);
        let Some(sets) = frostdb_profile::native::series_of(&index, selector, hours, MAX_SERIES)?
        else {
            return Ok(Narrowing::Unknown);
        };
        if sets.iter().any(Vec::is_empty) {
            return Ok(Narrowing::Unknown); // a series without labels: nothing to narrow by
        }
        // A set with a column the samples lack has no samples.
        let known = |set: &frostdb_profile::native::LabelSet| {
            set.iter()
                .all(|(c, _)| samples.schema().index_of(c).is_some())
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

    /// The series index, and `range` widened to the whole hours its rows stand for.
    fn label_source(&self, range: TimeRange) -> (frostdb_core::Snapshot, TimeRange) {
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

    /// Deletes the symbols no retained sample refers to any more, now (the database does it
    /// after each retention pass). Returns the symbol blocks deleted.
    pub fn expire_symbols(&self) -> Result<usize> {
        self.expiry.run_once()
    }

    /// Closes the current symbol partition (the next ingest starts a new one).
    pub fn rotate_symbols(&self) {
        let id = self.symbols.current().id();
        self.symbols.rotate(id);
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
            .label_values("pod", None, frostdb_profile::TimeRange::ALL)
            .unwrap();
        assert_eq!(pods.len(), N as usize);
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
