//! frostdb tables as DataFusion tables.
//!
//! ```text
//!  SQL / DataFrame ──► DataFusion optimizer ──► FrostTable::scan(projection, filters, limit)
//!                                                   │  filters the engine evaluates exactly:
//!                                                   │  `Exact` (DataFusion drops its Filter);
//!                                                   │  the others stay with DataFusion
//!                                                   ▼
//!                             FrostScanExec ── n partitions of one engine scan
//!                                  │  pruned at plan time: blocks by the manifest, row
//!                                  │  groups and pages by Parquet statistics, parts and
//!                                  │  granules by their exact statistics
//!                                  ▼
//!                       batches of the projected columns only
//! ```
//!
//! A [`FrostTable`] reads one snapshot: the one taken when it was made. The schema provider
//! of [`register_db`] makes a fresh one each time a query names a table, so each query sees
//! the table as of its planning, consistently (statistics included).
//!
//! Scans are strict: a block that cannot be read fails the query with an error naming it.
//! [`lenient_session`] (or [`FrostTable::lenient`]) skips such blocks instead and counts
//! them in a [`BlocksFailed`] the caller reports, and in `EXPLAIN` / `EXPLAIN ANALYZE`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::datatypes::{DataType, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, Session, TableProvider};
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, ScalarValue, Statistics};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use frostdb_core::{Db, Scalar, ScanRequest, Snapshot, Table};
use parking_lot::RwLock;

use crate::Spill;
use crate::exec::FrostScanExec;
use crate::filter::to_predicate;

/// The persisted blocks lenient scans skipped because they could not be read: what a
/// partial answer lacks. Shared by every scan of a lenient session.
#[derive(Debug, Clone, Default)]
pub struct BlocksFailed(Arc<AtomicUsize>);

impl BlocksFailed {
    /// Blocks skipped so far (a query's count is complete once its stream has ended).
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    pub(crate) fn add(&self, blocks: usize) {
        self.0.fetch_add(blocks, Ordering::Relaxed);
    }
}

/// A frostdb table, as of one snapshot, for DataFusion.
#[derive(Debug)]
pub struct FrostTable {
    table: Table,
    snapshot: Snapshot,
    schema: SchemaRef,
    statistics: Statistics,
    lenient: Option<BlocksFailed>,
}

impl FrostTable {
    /// The table as of now; a scan that cannot read a block fails.
    pub fn new(table: Table) -> Self {
        let snapshot = table.snapshot();
        let schema = snapshot.schema().arrow_schema().clone();
        let statistics = statistics(&snapshot, &schema);
        Self {
            table,
            snapshot,
            schema,
            statistics,
            lenient: None,
        }
    }

    /// The table as of now; scans skip blocks they cannot read and count them in `failed`.
    pub fn lenient(table: Table, failed: BlocksFailed) -> Self {
        Self {
            lenient: Some(failed),
            ..Self::new(table)
        }
    }
}

/// Row count and exact column statistics of a snapshot.
fn statistics(snapshot: &Snapshot, schema: &SchemaRef) -> Statistics {
    let column_statistics = schema
        .fields()
        .iter()
        .map(|field| {
            let Some(stats) = snapshot.column_stats(field.name()) else {
                return ColumnStatistics::new_unknown();
            };
            let value = |s: &Option<Scalar>| match s
                .as_ref()
                .and_then(|s| scalar_value(s, field.data_type()))
            {
                Some(v) => Precision::Exact(v),
                None => Precision::Absent,
            };
            ColumnStatistics {
                null_count: Precision::Exact(stats.null_count),
                min_value: value(&stats.min),
                max_value: value(&stats.max),
                ..ColumnStatistics::new_unknown()
            }
        })
        .collect();
    Statistics {
        num_rows: Precision::Exact(snapshot.rows()),
        total_byte_size: Precision::Absent,
        column_statistics,
    }
}

/// `s` as a DataFusion scalar of exactly `data_type` (dictionary columns are left out).
fn scalar_value(s: &Scalar, data_type: &DataType) -> Option<ScalarValue> {
    use DataType as T;
    Some(match (s, data_type) {
        (Scalar::Boolean(b), T::Boolean) => ScalarValue::Boolean(Some(*b)),
        (Scalar::Int(v), T::Int8) => ScalarValue::Int8(Some(i8::try_from(*v).ok()?)),
        (Scalar::Int(v), T::Int16) => ScalarValue::Int16(Some(i16::try_from(*v).ok()?)),
        (Scalar::Int(v), T::Int32) => ScalarValue::Int32(Some(i32::try_from(*v).ok()?)),
        (Scalar::Int(v), T::Int64) => ScalarValue::Int64(Some(*v)),
        (Scalar::UInt(v), T::UInt8) => ScalarValue::UInt8(Some(u8::try_from(*v).ok()?)),
        (Scalar::UInt(v), T::UInt16) => ScalarValue::UInt16(Some(u16::try_from(*v).ok()?)),
        (Scalar::UInt(v), T::UInt32) => ScalarValue::UInt32(Some(u32::try_from(*v).ok()?)),
        (Scalar::UInt(v), T::UInt64) => ScalarValue::UInt64(Some(*v)),
        (Scalar::Float(v), T::Float64) => ScalarValue::Float64(Some(*v)),
        (Scalar::Float(v), T::Float32) => ScalarValue::Float32(Some(*v as f32)),
        (Scalar::Utf8(v), T::Utf8) => ScalarValue::Utf8(Some(v.clone())),
        (Scalar::Binary(v), T::Binary) => ScalarValue::Binary(Some(v.clone())),
        (Scalar::Binary(v), T::FixedSizeBinary(n)) => {
            ScalarValue::FixedSizeBinary(*n, Some(v.clone()))
        }
        _ => return None,
    })
}

#[async_trait]
impl TableProvider for FrostTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut request = ScanRequest::new().lenient(self.lenient.is_some());
        if let Some(indices) = projection {
            let names: Vec<String> = indices
                .iter()
                .map(|&i| self.schema.field(i).name().clone())
                .collect();
            request = request.project(names);
        }
        let mut pushed = Vec::new();
        for f in filters {
            if let Some(p) = to_predicate(f, &self.schema) {
                request = request.filter(p);
                pushed.push(f.to_string());
            }
        }
        if let Some(n) = limit {
            request = request.limit(n);
        }
        let partitions = state.config().target_partitions().max(1);
        let exec = FrostScanExec::try_new(
            self.table.name().to_owned(),
            self.snapshot.clone(),
            request,
            partitions,
            pushed,
            limit,
            self.lenient.clone(),
        )?;
        Ok(Arc::new(exec))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| match to_predicate(f, &self.schema) {
                Some(_) => TableProviderFilterPushDown::Exact,
                None => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    fn statistics(&self) -> Option<Statistics> {
        Some(self.statistics.clone())
    }
}

/// The tables of a database, as a DataFusion schema: a fresh snapshot per lookup. Other
/// tables (views, in-memory tables) can be registered beside them.
#[derive(Debug)]
pub struct FrostSchema {
    db: Db,
    others: RwLock<HashMap<String, Arc<dyn TableProvider>>>,
    lenient: Option<BlocksFailed>,
}

impl FrostSchema {
    /// The tables of `db`, scanned strictly.
    pub fn new(db: Db) -> Self {
        Self {
            db,
            others: RwLock::new(HashMap::new()),
            lenient: None,
        }
    }

    /// The tables of `db`, scanned leniently (see [`FrostTable::lenient`]).
    pub fn lenient(db: Db, failed: BlocksFailed) -> Self {
        Self {
            lenient: Some(failed),
            ..Self::new(db)
        }
    }
}

#[async_trait]
impl SchemaProvider for FrostSchema {
    fn table_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .db
            .tables()
            .iter()
            .map(|t| t.name().to_owned())
            .collect();
        names.extend(self.others.read().keys().cloned());
        names.sort();
        names.dedup();
        names
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        if let Some(t) = self.others.read().get(name) {
            return Ok(Some(t.clone()));
        }
        Ok(self.db.get_table(name).map(|t| {
            Arc::new(match &self.lenient {
                Some(failed) => FrostTable::lenient(t, failed.clone()),
                None => FrostTable::new(t),
            }) as Arc<dyn TableProvider>
        }))
    }

    fn register_table(
        &self,
        name: String,
        table: Arc<dyn TableProvider>,
    ) -> Result<Option<Arc<dyn TableProvider>>> {
        if self.db.get_table(&name).is_some() {
            return Err(DataFusionError::Plan(format!(
                "{name:?} is a frostdb table and cannot be replaced"
            )));
        }
        Ok(self.others.write().insert(name, table))
    }

    fn deregister_table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        Ok(self.others.write().remove(name))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.db.get_table(name).is_some() || self.others.read().contains_key(name)
    }
}

/// Makes every table of `db` visible to `ctx` under its name (the default schema).
pub fn register_db(ctx: &SessionContext, db: &Db) -> Result<()> {
    register_schema(ctx, FrostSchema::new(db.clone()))
}

fn register_schema(ctx: &SessionContext, schema: FrostSchema) -> Result<()> {
    let catalog = ctx
        .catalog("datafusion")
        .ok_or_else(|| DataFusionError::Internal("the default catalog is missing".into()))?;
    catalog.register_schema("public", Arc::new(schema))?;
    Ok(())
}

/// A session that sees every table of `db`, using all cores. A query that cannot read a
/// block it needs fails.
pub fn session(db: &Db) -> Result<SessionContext> {
    session_with(db, crate::memory_pool(None), &Spill::none())
}

/// [`session`] whose operators reserve memory from `pool` ([`crate::memory_pool`]): over its
/// limit a query spills to `spill` where it can and otherwise fails with "resources
/// exhausted".
pub fn session_with(db: &Db, pool: Arc<dyn MemoryPool>, spill: &Spill) -> Result<SessionContext> {
    let ctx = context(pool, spill)?;
    register_db(&ctx, db)?;
    Ok(ctx)
}

/// A session reserving from `pool` and spilling to `spill`, its windows' inputs charged
/// ([`crate::window_input`]).
pub(crate) fn context(pool: Arc<dyn MemoryPool>, spill: &Spill) -> Result<SessionContext> {
    let mut runtime = RuntimeEnvBuilder::new().with_memory_pool(pool.clone());
    runtime.disk_manager = Some(spill.manager()?);
    let state = datafusion::execution::SessionStateBuilder::new()
        .with_config(SessionConfig::new())
        .with_runtime_env(runtime.build_arc()?)
        .with_default_features()
        .with_physical_optimizer_rule(Arc::new(crate::window_input::ChargeWindowInputs))
        .build();
    let ctx = SessionContext::new_with_state(state);
    // Functions whose output an argument sizes reserve it from the same pool.
    crate::functions::bound_functions(&ctx, &pool)?;
    Ok(ctx)
}

/// A session like [`session`] whose scans skip blocks they cannot read, counted in the
/// returned [`BlocksFailed`]: answers may be partial, and the count says when they are.
pub fn lenient_session(db: &Db) -> Result<(SessionContext, BlocksFailed)> {
    lenient_session_with(db, crate::memory_pool(None), &Spill::none())
}

/// [`lenient_session`] reserving memory from `pool` and spilling to `spill`, as
/// [`session_with`].
pub fn lenient_session_with(
    db: &Db,
    pool: Arc<dyn MemoryPool>,
    spill: &Spill,
) -> Result<(SessionContext, BlocksFailed)> {
    let ctx = context(pool, spill)?;
    let failed = BlocksFailed::default();
    register_schema(&ctx, FrostSchema::lenient(db.clone(), failed.clone()))?;
    Ok((ctx, failed))
}
