//! Profiles in a frostdb database: ingest (decode, normalize, store durably) and merge
//! (a selector over a time range into one profile to report on).
//!
//! One profile is one transaction: the symbols it adds to the current partition and its
//! sample rows go into one WAL record, so after a crash either all of it is there or none.
//! Ingests run in parallel up to the symbol writer, which they hold only while they look up
//! and add symbols and append their record; the fsync is waited for outside it, so
//! concurrent ingests share fsyncs and a lone one waits for nobody.
//!
//! The files, in the order a profile passes them:
//! - [`options`]: how a store is set up, and the options of the tables it makes;
//! - this file: [`ProfileStore`], opening its tables (rebuilding derived ones that are
//!   missing) and what it holds;
//! - [`ingest`]: a profile recognised if stored already, decoded and prepared
//!   ([`crate::normalize`]), its series admitted under the series limit;
//! - [`commit`]: the group commit, symbols, sample rows and derived rows in one
//!   transaction;
//! - [`derived`]: the tables derived from the samples (totals, the series index);
//! - [`read`]: merges, series over time, label names and values, profile types;
//! - [`maintenance`]: symbol expiry, symbol partition rotation, rollups.

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

mod commit;
mod derived;
mod ingest;
mod maintenance;
mod naming;
mod options;
mod read;

use commit::{
    Coming, Group, MAX_BATCH_ROWS, MAX_GROUP_ROWS, Pipeline, Slot, Stored, worth_waiting_for,
};
use derived::{SeriesSeen, build_series_index, build_totals};
pub(crate) use derived::{series_runs, series_words};
use maintenance::{SymbolExpiry, partitions_used};
pub use naming::NamingSummary;
pub use options::StoreOptions;
use options::symbol_table_options;
pub use read::{MergeOptions, Merged, Profiles, Read, ReadOptions, SeriesSamples};

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
    /// Whether the totals hold [`schema::column::PROFILE_KEY`] (those made before it do
    /// not, and stay so).
    totals_keyed: bool,
    /// Series index rows committed since open (key -> hour), so each is written once; hours
    /// long past are forgotten.
    indexed: Mutex<SeriesSeen>,
    /// The pool every query of the store reserves memory from.
    memory: Arc<dyn datafusion::execution::memory_pool::MemoryPool>,
    /// Where its SQL sessions spill ([`StoreOptions::query_spill`]).
    spill: frostdb_query::Spill,
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
    /// The label names stored and admitted since open, against
    /// [`StoreOptions::max_label_names`]: read from the samples table's columns when first
    /// needed (`None` until then, and always without a limit).
    label_names: Mutex<Option<std::collections::HashSet<String>>>,
    /// Their keys' table ([`schema::SERIES_KEYS`]); none in a reader.
    series_keys: Option<Table>,
    /// The stored profiles' fingerprints ([`schema::FINGERPRINTS`]); none in a reader, or
    /// with [`StoreOptions::dedup_window`] zero.
    fingerprints: Option<Table>,
    /// Frames stored as addresses named in the background and by queries
    /// ([`ProfileStore::attach_symbolizer`]).
    naming: naming::Naming,
    /// Recording rules counting the profiles stored ([`ProfileStore::attach_recorder`]).
    recorder: std::sync::OnceLock<Arc<crate::rules::Recorder>>,
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

impl ProfileStore {
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
        // rows it indexes, so no sample outlives the row that indexes it, and no rollup
        // either (merges narrow the rollups they read by the index too: rollups kept 90 days
        // beside samples kept 30 were read as holding no series).
        set_ttl(
            &series_index,
            options
                .rollups
                .longest_kept(options.retention)
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
        // A row a profile: kept as long as the rollups, so that the time series of a range
        // they answer merges for are answered too (they were empty past the samples').
        set_ttl(&totals, options.rollups.kept_longest(options.retention))?;
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
        // Names found later: made by a writer, read if its writer made it by a reader.
        let names = if read_only {
            db.get_table(schema::SYMBOL_NAMES)
        } else {
            Some(db.table(
                schema::SYMBOL_NAMES,
                schema::symbol_names(),
                symbol_table_options(),
            )?)
        };
        let tables = SymbolTables {
            stacktraces,
            locations,
            functions,
            mappings,
            names,
        };
        let rollups = Arc::new(Rollups::open(
            &db,
            &samples,
            &series_index,
            &options.samples,
            options.retention,
            options.rollups.clone(),
            read_only,
        )?);
        // Every table whose rows refer to stacks: a symbol partition is kept while any of
        // them holds a row of it (rollups may be kept longer than samples).
        let stack_users: Vec<Table> = [samples.clone(), spans.clone()]
            .into_iter()
            .chain(rollups.tables())
            .collect();
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
        let task: Arc<dyn Maintenance> = rollups.clone();
        db.add_maintenance(Arc::downgrade(&task) as Weak<dyn Maintenance>);
        drop(task);
        Ok(Self {
            db,
            samples,
            spans,
            series_index,
            totals_keyed: schema::has_profile_keys(&totals),
            totals,
            indexed: Mutex::new(SeriesSeen::default()),
            memory: frostdb_query::budgeted_memory_pool(
                options.query_memory,
                options.memory_budget.as_ref(),
            ),
            spill: options.query_spill.clone(),
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
            label_names: Mutex::new(None),
            series_keys,
            fingerprints,
            naming: naming::Naming::default(),
            recorder: std::sync::OnceLock::new(),
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

    /// Counts every profile stored from now on (once: a profile stored again is not) in
    /// `recorder`'s recording rules, after it is durable. Returns false, changing nothing,
    /// when one is attached already.
    pub fn attach_recorder(&self, recorder: Arc<crate::rules::Recorder>) -> bool {
        self.recorder.set(recorder).is_ok()
    }

    /// The recorder attached ([`ProfileStore::attach_recorder`]), if one is.
    pub fn recorder(&self) -> Option<&Arc<crate::rules::Recorder>> {
        self.recorder.get()
    }

    /// Bytes of symbols in memory (the current partition and the cache).
    pub fn symbol_memory_bytes(&self) -> usize {
        self.symbols.memory_bytes()
    }

    /// Bytes the previous values of cumulative series hold (what deltas are taken from).
    pub fn baseline_memory_bytes(&self) -> usize {
        self.deltas.lock().memory_bytes()
    }

    /// Takes the previous values of the cumulative series (the store keeps none after),
    /// for a store opened later on the same data to go on from: kept only in memory, they
    /// are what makes a series' next profile a delta rather than a baseline that stores
    /// nothing.
    pub fn take_baselines(&self) -> Baselines {
        Baselines(std::mem::take(&mut *self.deltas.lock()))
    }

    /// Goes on from `baselines` ([`ProfileStore::take_baselines`] of this data's store
    /// before): a series the store has values of keeps its own.
    pub fn restore_baselines(&self, baselines: Baselines) {
        let mut deltas = self.deltas.lock();
        let mine = std::mem::take(&mut *deltas);
        *deltas = baselines.0;
        deltas.merge(mine);
    }
}

/// The previous values of a store's cumulative series ([`ProfileStore::take_baselines`]).
#[derive(Debug, Default)]
pub struct Baselines(Deltas);

impl Baselines {
    /// Bytes they hold.
    pub fn memory_bytes(&self) -> usize {
        self.0.memory_bytes()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
}
