//! Profiles in a frostdb database: ingest (decode, normalize, store durably) and merge
//! (a selector over a time range into one profile to report on).
//!
//! One profile is one transaction: the symbols it adds to the current partition and its
//! sample rows go into one WAL record, so after a crash either all of it is there or none.
//! Ingests run in parallel up to the symbol writer, which they hold only while they look up
//! and add symbols and append their record; the fsync is waited for outside it, so
//! concurrent ingests share fsyncs and a lone one waits for nobody.

use std::sync::{Arc, Weak};
use std::time::Duration;

use datafusion::prelude::SessionContext;
use frostdb_core::{Db, Maintenance, Scalar, Table, TableOptions};
use frostdb_query::profile::TimeRange;
use frostdb_query::profile::native::{StackTotals, merge_stacks};
use frostdb_query::{ProfileType, Selector};
use parking_lot::Mutex;

use crate::decode::{Limits, ValidProfile, decode};
use crate::error::{Error, Result};
use crate::normalize::{Deltas, IngestOptions, IngestSummary, prepare};
use crate::schema;
use crate::symbols::{StackId, SymbolOptions, SymbolStore, SymbolTables, Symbols, split_id};

/// How a [`ProfileStore`] stores and keeps profiles.
///
/// # Defaults
/// | option | default | meaning |
/// |---|---|---|
/// | `limits` | [`Limits::default`] | what a decoded profile may hold |
/// | `symbols` | [`SymbolOptions::default`] | symbol partitions and their cache |
/// | `samples` | [`TableOptions::default`] | the samples table (block size, granules, ...) |
/// | `retention` | none | samples older than this are deleted, then the symbols only they used |
/// | `query_threads` | the machine's cores | threads a merge reads with |
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Decoding limits.
    pub limits: Limits,
    /// Symbol partitions and cache.
    pub symbols: SymbolOptions,
    /// Options of the samples table when it is created.
    pub samples: TableOptions,
    /// How long samples are kept (`None`: forever).
    pub retention: Option<Duration>,
    /// Threads a merge reads with.
    pub query_threads: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            symbols: SymbolOptions::default(),
            samples: TableOptions::default(),
            retention: None,
            query_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        }
    }
}

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
        }
    }
}

/// Deletes symbol partitions no retained sample refers to (run after retention).
struct SymbolExpiry {
    samples: Table,
    symbols: Arc<SymbolStore>,
}

impl SymbolExpiry {
    fn run_once(&self) -> Result<usize> {
        let current = self.symbols.current().id();
        let oldest_used = match self.samples.snapshot().column_stats("stacktrace_id") {
            Some(stats) => match stats.min {
                Some(Scalar::UInt(min)) => split_id(min).0.min(current),
                _ => current,
            },
            None => current,
        };
        let tables = self.symbols.tables();
        let mut deleted = 0;
        for (table, column) in [
            (&tables.stacktraces, "stacktrace_id"),
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

/// A database of profiles: the samples table and the symbol tables.
pub struct ProfileStore {
    db: Db,
    samples: Table,
    symbols: Arc<SymbolStore>,
    expiry: Arc<SymbolExpiry>,
    deltas: Mutex<Deltas>,
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

impl ProfileStore {
    /// Opens (creating if needed) the profile tables of `db`. Reads no symbols: they are
    /// read per partition when a merge needs them.
    pub fn open(db: Db, options: StoreOptions) -> Result<Self> {
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
        let samples = db.table(schema::SAMPLES, schema::samples(), options.samples.clone())?;
        samples.set_ttl(options.retention)?;
        let tables = SymbolTables {
            stacktraces,
            locations,
            functions,
            mappings,
        };
        let newest_used = match samples.snapshot().column_stats("stacktrace_id") {
            Some(stats) => match stats.max {
                Some(Scalar::UInt(max)) => split_id(max).0,
                _ => 0,
            },
            None => 0,
        };
        let newest = tables.newest_partition().max(newest_used);
        let symbols = Arc::new(SymbolStore::open(tables, options.symbols, newest));
        let expiry = Arc::new(SymbolExpiry {
            samples: samples.clone(),
            symbols: symbols.clone(),
        });
        let task: Arc<dyn Maintenance> = expiry.clone();
        db.add_maintenance(Arc::downgrade(&task) as Weak<dyn Maintenance>);
        drop(task);
        Ok(Self {
            db,
            samples,
            symbols,
            expiry,
            deltas: Mutex::new(Deltas::default()),
            options,
        })
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
    pub fn ingest(&self, bytes: &[u8], options: &IngestOptions) -> Result<IngestSummary> {
        let profile = decode(bytes, &self.options.limits)?;
        self.ingest_profile(&profile, options)
    }

    /// Stores a validated profile: its new symbols and its samples in one transaction.
    pub fn ingest_profile(
        &self,
        profile: &ValidProfile,
        options: &IngestOptions,
    ) -> Result<IngestSummary> {
        if options.delta {
            // Deltas need the previous profile of the series: one delta ingest at a time.
            let mut deltas = self.deltas.lock();
            let prepared = prepare(profile, options, Some(&deltas))?;
            let summary = self.store(&prepared)?;
            deltas.apply(prepared.delta_states);
            Ok(summary)
        } else {
            self.store(&prepare(profile, options, None)?)
        }
    }

    /// Stores `profile` with its cumulative sample types (allocations, contentions, delay)
    /// as the difference from `previous`, the same process's profile taken earlier, as
    /// Pyroscope's `/ingest` does with a `prev_profile`. Other types are stored as they are.
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
        self.store(&prepare(profile, &options, Some(&baseline))?)
    }

    fn store(&self, prepared: &crate::normalize::Prepared<'_>) -> Result<IngestSummary> {
        if prepared.is_empty() {
            return Ok(IngestSummary {
                timestamp_ms: prepared.timestamp(),
                ..IngestSummary::default()
            });
        }
        loop {
            let partition = self.symbols.current();
            let Some(mut writer) = partition.writer() else {
                continue; // closed by a rotation meanwhile: take the next one
            };
            let before = partition.counts();
            let submitted = (|| {
                let stacks = prepared.intern(&mut writer)?;
                let after = partition.counts();
                let (samples, mut summary) = prepared.samples(partition.id(), &stacks)?;
                summary.new_stacks = after.stacks - before.stacks;
                let mut tx = self.db.transaction();
                for (table, batch) in self.symbols.tables().batches(&partition, before, after)? {
                    tx.insert(table, &batch)?;
                }
                tx.insert(&self.samples, &samples)?;
                Ok::<_, Error>((tx.submit()?, summary))
            })();
            drop(writer);
            return match submitted {
                Ok((commit, summary)) => {
                    commit.wait()?;
                    Ok(summary)
                }
                Err(e) => {
                    // Symbols added for a transaction that never reached the WAL are in
                    // memory only; a new partition makes sure no later profile uses them.
                    if partition.counts() != before {
                        self.symbols.rotate(partition.id());
                    }
                    Err(e)
                }
            };
        }
    }

    /// A session seeing this database's tables (SQL, and the DataFusion profile queries).
    pub fn session(&self) -> Result<SessionContext> {
        Ok(frostdb_query::session(&self.db)?)
    }

    /// Merges what `selector` selects in `range` into one profile. The selector must name a
    /// profile type: values of different types do not add up.
    pub fn merge(&self, selector: &Selector, range: TimeRange) -> Result<Merged> {
        let profile_type = selector.profile_type.clone().ok_or_else(|| {
            Error::Query(
                "the selector needs a profile type (name:type:unit:period_type:period_unit)".into(),
            )
        })?;
        let StackTotals {
            stacks,
            period,
            rows,
            ..
        } = merge_stacks(
            &self.samples.snapshot(),
            selector,
            range,
            self.options.query_threads,
        )?;
        let mut partitions: Vec<u32> = stacks.iter().map(|(id, _)| split_id(*id).0).collect();
        partitions.dedup();
        let symbols = self.symbols.view(partitions)?;
        if let Some((id, _)) = stacks
            .iter()
            .find(|(id, _)| !symbols.has_stack(StackId(*id)))
        {
            let (p, i) = split_id(*id);
            return Err(Error::Corrupt(format!(
                "stack {p}:{i} of a selected sample is not in the symbol tables"
            )));
        }
        Ok(Merged {
            profile_type,
            period,
            samples: stacks.into_iter().map(|(id, v)| (StackId(id), v)).collect(),
            symbols,
            rows,
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
    ) -> Result<Vec<frostdb_query::profile::native::Series>> {
        Ok(frostdb_query::profile::native::range(
            &self.samples.snapshot(),
            selector,
            range,
            step_ms,
            group_by,
        )?)
    }

    /// The values label `name` has in what `selector` (if any) selects in `range`, sorted.
    pub fn label_values(
        &self,
        name: &str,
        selector: Option<&Selector>,
        range: TimeRange,
    ) -> Result<Vec<String>> {
        Ok(frostdb_query::profile::native::label_values(
            &self.samples.snapshot(),
            name,
            selector,
            range,
        )?)
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
