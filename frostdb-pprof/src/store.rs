//! Profiles in a frostdb database: ingest (decode, normalize, store durably) and merge
//! (a selector over a time range into one profile to report on).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use datafusion::prelude::SessionContext;
use frostdb_core::{Db, Table, TableOptions};
use frostdb_query::profile::{self, TimeRange};
use frostdb_query::{ProfileType, Selector};
use futures::TryStreamExt;
use parking_lot::{Mutex, RwLock};

use crate::decode::{Limits, decode};
use crate::error::{Error, Result};
use crate::normalize::{Deltas, IngestOptions, IngestSummary, Normalized, normalize};
use crate::proto::Profile;
use crate::schema;
use crate::symbols::{Id, Symbols};

/// One merged profile: the value of each stack summed over what a selector selected.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    /// Its profile type.
    pub profile_type: ProfileType,
    /// The sampling period (the largest seen).
    pub period: i64,
    /// Stacks and their values, in stack id order.
    pub samples: Vec<(Id, i64)>,
}

impl Merged {
    /// Sum of all values.
    pub fn total(&self) -> i64 {
        self.samples.iter().map(|(_, v)| *v).sum()
    }
}

/// A database of profiles: the samples table and the symbol tables, and the symbols in
/// memory.
pub struct ProfileStore {
    db: Db,
    samples: Table,
    stacktraces: Table,
    locations: Table,
    functions: Table,
    mappings: Table,
    symbols: RwLock<Arc<Symbols>>,
    deltas: Mutex<Deltas>,
    limits: Limits,
}

impl std::fmt::Debug for ProfileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfileStore")
            .field("db", &self.db)
            .finish_non_exhaustive()
    }
}

impl ProfileStore {
    /// Opens (creating if needed) the profile tables of `db` and loads the symbols.
    pub fn open(db: Db, options: TableOptions, limits: Limits) -> Result<Self> {
        let symbol_options = TableOptions::default();
        let samples = db.table(schema::SAMPLES, schema::samples(), options)?;
        let stacktraces = db.table(
            schema::STACKTRACES,
            schema::stacktraces(),
            symbol_options.clone(),
        )?;
        let locations = db.table(
            schema::LOCATIONS,
            schema::locations(),
            symbol_options.clone(),
        )?;
        let functions = db.table(
            schema::FUNCTIONS,
            schema::functions(),
            symbol_options.clone(),
        )?;
        let mappings = db.table(schema::MAPPINGS, schema::mappings(), symbol_options)?;
        let symbols = Symbols::load(&stacktraces, &locations, &functions, &mappings)?;
        Ok(Self {
            db,
            samples,
            stacktraces,
            locations,
            functions,
            mappings,
            symbols: RwLock::new(Arc::new(symbols)),
            deltas: Mutex::new(Deltas::default()),
            limits,
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
        &self.limits
    }

    /// The symbols known now.
    pub fn symbols(&self) -> Arc<Symbols> {
        self.symbols.read().clone()
    }

    /// Decodes `bytes` (gzip or raw pprof) and stores the profile.
    pub fn ingest(&self, bytes: &[u8], options: &IngestOptions) -> Result<IngestSummary> {
        let profile = decode(bytes, &self.limits)?;
        self.ingest_profile(&profile, options)
    }

    /// Stores a decoded, validated profile: symbols first, then the samples in one
    /// transaction, so a stored sample's stack is always resolvable.
    pub fn ingest_profile(
        &self,
        profile: &Profile,
        options: &IngestOptions,
    ) -> Result<IngestSummary> {
        let known = self.symbols();
        // Only deltas need the previous profiles; other ingests run in parallel.
        let normalized = if options.delta {
            let mut deltas = self.deltas.lock();
            normalize(profile, options, &known, Some(&mut deltas))?
        } else {
            normalize(profile, options, &known, None)?
        };
        self.store(normalized)
    }

    /// Stores `profile` with its cumulative sample types (allocations, contentions, delay)
    /// as the difference from `previous`, the same process's profile taken earlier, as
    /// Pyroscope's `/ingest` does with a `prev_profile`. Other types are stored as they are.
    pub fn ingest_with_previous(
        &self,
        profile: &Profile,
        previous: &Profile,
        options: &IngestOptions,
    ) -> Result<IngestSummary> {
        let known = self.symbols();
        let mut deltas = Deltas::default();
        normalize(previous, options, &known, Some(&mut deltas))?;
        let normalized = normalize(profile, options, &known, Some(&mut deltas))?;
        self.store(normalized)
    }

    fn store(&self, normalized: Normalized) -> Result<IngestSummary> {
        let new = &normalized.symbols;
        if !new.is_empty() {
            if !new.mappings.is_empty() {
                self.mappings.insert(&new.mappings_batch()?)?;
            }
            if !new.functions.is_empty() {
                self.functions.insert(&new.functions_batch()?)?;
            }
            if !new.locations.is_empty() {
                self.locations.insert(&new.locations_batch()?)?;
            }
            if !new.stacks.is_empty() {
                self.stacktraces.insert(&new.stacks_batch()?)?;
            }
            let mut symbols = self.symbols.write();
            let mut next = (**symbols).clone();
            next.extend(new);
            *symbols = Arc::new(next);
        }
        if let Some(batch) = &normalized.samples {
            self.samples.insert(batch)?;
        }
        Ok(normalized.summary)
    }

    /// A session seeing this database's tables.
    pub fn session(&self) -> Result<SessionContext> {
        Ok(frostdb_query::session(&self.db)?)
    }

    /// Merges what `selector` selects in `range` into one profile. The selector must name a
    /// profile type: values of different types do not add up.
    pub async fn merge(
        &self,
        ctx: &SessionContext,
        selector: &Selector,
        range: TimeRange,
    ) -> Result<Merged> {
        let profile_type = selector.profile_type.clone().ok_or_else(|| {
            Error::Query(
                "the selector needs a profile type (name:type:unit:period_type:period_unit)".into(),
            )
        })?;
        let batches: Vec<RecordBatch> = profile::merge(ctx, schema::SAMPLES, selector, range, &[])
            .await?
            .try_collect()
            .await?;
        let mut samples: HashMap<Id, i64> = HashMap::new();
        for b in &batches {
            let ids = b.column(0).as_fixed_size_binary();
            let values = b.column(1).as_primitive::<Int64Type>();
            for i in 0..b.num_rows() {
                if ids.is_null(i) || values.is_null(i) {
                    continue;
                }
                let id: Id = ids
                    .value(i)
                    .try_into()
                    .map_err(|_| Error::Corrupt("a stacktrace id is not 16 bytes".into()))?;
                *samples.entry(id).or_default() += values.value(i);
            }
        }
        let mut samples: Vec<(Id, i64)> = samples.into_iter().filter(|(_, v)| *v != 0).collect();
        samples.sort();
        let period = self.period(ctx, selector, range).await?;
        Ok(Merged {
            profile_type,
            period,
            samples,
        })
    }

    async fn period(
        &self,
        ctx: &SessionContext,
        selector: &Selector,
        range: TimeRange,
    ) -> Result<i64> {
        let df = ctx.table(schema::SAMPLES).await?;
        let schema = df.schema().as_arrow().clone();
        let mut filter = selector.to_expr(&schema);
        if range.start_ms != i64::MIN {
            filter = filter.and(
                datafusion::prelude::ident("timestamp")
                    .gt_eq(datafusion::prelude::lit(range.start_ms)),
            );
        }
        if range.end_ms != i64::MAX {
            filter = filter.and(
                datafusion::prelude::ident("timestamp").lt(datafusion::prelude::lit(range.end_ms)),
            );
        }
        let batches = df
            .filter(filter)?
            .aggregate(
                vec![],
                vec![
                    datafusion::functions_aggregate::expr_fn::max(datafusion::prelude::ident(
                        "period",
                    ))
                    .alias("period"),
                ],
            )?
            .collect()
            .await?;
        Ok(batches
            .first()
            .filter(|b| b.num_rows() > 0 && b.column(0).is_valid(0))
            .map_or(0, |b| b.column(0).as_primitive::<Int64Type>().value(0)))
    }
}
