//! The queries a profiler asks, as DataFusion plans over a samples table (columns `name`,
//! `sample_type`, `sample_unit`, `period_type`, `period_unit`, `labels.*`, `stacktrace_id`,
//! `timestamp` in milliseconds, `value`). Each returns a stream of Arrow batches.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use datafusion::dataframe::DataFrame;
use datafusion::error::Result;
use datafusion::functions_aggregate::expr_fn::{count, sum};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::prelude::{SessionContext, ident, lit};

use crate::selector::Selector;

use crate::TimeRange;
use crate::schema::column::{
    LABEL_PREFIX, PROFILE_TYPE, STACKTRACE_ID, TIMESTAMP, VALUE, label_column,
};

/// Label names of a table, from its schema (`labels.pod` gives `pod`).
fn label_columns(df: &DataFrame) -> Vec<String> {
    df.schema()
        .fields()
        .iter()
        .filter_map(|f| f.name().strip_prefix(LABEL_PREFIX).map(str::to_owned))
        .collect()
}

/// The rows of `table` that `selector` selects in `range`.
async fn selected(
    ctx: &SessionContext,
    table: &str,
    selector: Option<&Selector>,
    range: TimeRange,
) -> Result<DataFrame> {
    let df = ctx.table(table).await?;
    let schema: ArrowSchema = df.schema().as_arrow().clone();
    let mut filter = range.to_expr();
    if let Some(s) = selector {
        filter = filter.and(s.to_expr(&schema));
    }
    df.filter(filter)
}

/// Merge: the value summed per stack (`stacktrace_id`, `value`), for the rows `selector`
/// selects in `range`; with `group_by` labels, per stack and per value of those labels
/// (`stacktrace_id`, `labels.<l>`..., `value`), as Parca compares profiles along a label.
pub async fn merge(
    ctx: &SessionContext,
    table: &str,
    selector: &Selector,
    range: TimeRange,
    group_by: &[String],
) -> Result<SendableRecordBatchStream> {
    let df = selected(ctx, table, Some(selector), range).await?;
    let present = label_columns(&df);
    let mut keys = vec![ident(STACKTRACE_ID)];
    for label in group_by {
        if present.contains(label) {
            keys.push(ident(label_column(label)));
        } else {
            keys.push(lit(datafusion::common::ScalarValue::Utf8(None)).alias(label_column(label)));
        }
    }
    df.aggregate(keys, vec![sum(ident(VALUE)).alias(VALUE)])?
        .execute_stream()
        .await
}

/// Range: the value summed per series (its labels) and per `step_ms` bucket of time, for
/// the metrics graph. Columns: `labels.*`, `timestamp` (the bucket's start), `value`;
/// ordered by series, then time.
pub async fn range(
    ctx: &SessionContext,
    table: &str,
    selector: &Selector,
    range: TimeRange,
    step_ms: i64,
) -> Result<SendableRecordBatchStream> {
    let step = step_ms.max(1);
    let df = selected(ctx, table, Some(selector), range).await?;
    let labels = label_columns(&df);
    let bucket = (ident(TIMESTAMP) - (ident(TIMESTAMP) % lit(step))).alias(TIMESTAMP);
    let mut keys: Vec<Expr> = labels.iter().map(|l| ident(label_column(l))).collect();
    keys.push(bucket);
    let mut order: Vec<_> = labels
        .iter()
        .map(|l| ident(label_column(l)).sort(true, true))
        .collect();
    order.push(ident(TIMESTAMP).sort(true, true));
    df.aggregate(keys, vec![sum(ident(VALUE)).alias(VALUE)])?
        .sort(order)?
        .execute_stream()
        .await
}

fn strings_stream(name: &str, values: Vec<String>) -> Result<SendableRecordBatchStream> {
    let schema = Arc::new(ArrowSchema::new(vec![Field::new(
        name,
        DataType::Utf8,
        false,
    )]));
    let column: ArrayRef = Arc::new(StringArray::from(values));
    let batch = RecordBatch::try_new(schema.clone(), vec![column])?;
    Ok(Box::pin(MemoryStream::try_new(vec![batch], schema, None)?))
}

/// Label names that have a value in some selected row (one column `name`, sorted).
pub async fn label_names(
    ctx: &SessionContext,
    table: &str,
    selector: Option<&Selector>,
    range: TimeRange,
) -> Result<SendableRecordBatchStream> {
    let df = selected(ctx, table, selector, range).await?;
    let labels = label_columns(&df);
    if labels.is_empty() {
        return strings_stream("name", Vec::new());
    }
    let counts: Vec<Expr> = labels
        .iter()
        .map(|l| count(ident(label_column(l))).alias(l.as_str()))
        .collect();
    let batches = df.aggregate(Vec::new(), counts)?.collect().await?;
    let mut names: Vec<String> = labels
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            batches.iter().any(|b| {
                b.column(*i)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .values()
                    .iter()
                    .any(|c| *c > 0)
            })
        })
        .map(|(_, l)| l.clone())
        .collect();
    names.sort();
    strings_stream("name", names)
}

/// The distinct values of label `name` in the selected rows (one column `value`, sorted).
pub async fn label_values(
    ctx: &SessionContext,
    table: &str,
    name: &str,
    selector: Option<&Selector>,
    range: TimeRange,
) -> Result<SendableRecordBatchStream> {
    let df = selected(ctx, table, selector, range).await?;
    if !label_columns(&df).iter().any(|l| l == name) {
        return strings_stream("value", Vec::new());
    }
    let column = ident(label_column(name));
    df.filter(column.clone().is_not_null())?
        .aggregate(vec![column.clone()], Vec::new())?
        .select(vec![
            datafusion::prelude::cast(column.clone(), DataType::Utf8).alias(VALUE),
        ])?
        .sort(vec![ident(VALUE).sort(true, false)])?
        .execute_stream()
        .await
}

/// The profile types present in `range` (columns `name`, `sample_type`, `sample_unit`,
/// `period_type`, `period_unit`, sorted).
pub async fn profile_types(
    ctx: &SessionContext,
    table: &str,
    range: TimeRange,
) -> Result<SendableRecordBatchStream> {
    let df = selected(ctx, table, None, range).await?;
    let parts = PROFILE_TYPE;
    let keys: Vec<Expr> = parts.iter().map(|p| ident(*p)).collect();
    let casts: Vec<Expr> = parts
        .iter()
        .map(|p| datafusion::prelude::cast(ident(*p), DataType::Utf8).alias(*p))
        .collect();
    df.aggregate(keys, Vec::new())?
        .select(casts)?
        .sort(parts.iter().map(|p| ident(*p).sort(true, false)).collect())?
        .execute_stream()
        .await
}

/// The timestamps of the profiles of the selected series, without reading sample values
/// (conprof's listing path): one column `timestamp`, distinct, ascending.
pub async fn timestamps(
    ctx: &SessionContext,
    table: &str,
    selector: &Selector,
    range: TimeRange,
) -> Result<SendableRecordBatchStream> {
    selected(ctx, table, Some(selector), range)
        .await?
        .aggregate(vec![ident(TIMESTAMP)], Vec::new())?
        .sort(vec![ident(TIMESTAMP).sort(true, false)])?
        .execute_stream()
        .await
}

/// The series the selector selects in `range`: each distinct profile type and label set
/// (columns `name`, `sample_type`, `sample_unit`, `period_type`, `period_unit`, `labels.*`),
/// sorted.
pub async fn series(
    ctx: &SessionContext,
    table: &str,
    selector: Option<&Selector>,
    range: TimeRange,
) -> Result<SendableRecordBatchStream> {
    let df = selected(ctx, table, selector, range).await?;
    let mut columns: Vec<String> = PROFILE_TYPE.map(String::from).to_vec();
    columns.extend(label_columns(&df).iter().map(|l| label_column(l)));
    let keys: Vec<Expr> = columns.iter().map(ident).collect();
    let order = columns.iter().map(|c| ident(c).sort(true, true)).collect();
    df.aggregate(keys, Vec::new())?
        .sort(order)?
        .execute_stream()
        .await
}
