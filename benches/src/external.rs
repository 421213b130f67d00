//! The `frostdb-bench` commands: frostdb-rs as an external engine of `shared/bench` (see its README).
//!
//! ```text
//! frostdb-bench ingest --data DATA_DIR --store STORE_DIR
//!     loads DATA_DIR/profiles/*.parquet and stacktraces.parquet into a database at
//!     STORE_DIR, persists everything, prints {"rows": N, "load_s": seconds}
//! frostdb-bench query --data DATA_DIR --store STORE_DIR --queries Q.json --runs N --out OUT
//!     runs Q1..Q6 N times each through DataFusion on the store, writes OUT/timings.json
//!     ({"Q1": [ms, ...], ...}), OUT/Qn.parquet (the results) and OUT/scan.json (what each
//!     query's scans read and pruned)
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use frostdb_core::{
    ColumnDef, Db, DbOptions, Durability, Encoding, Schema, SortingColumn, TableOptions,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// Errors of the bench commands.
pub type BoxError = Box<dyn std::error::Error>;

/// The bench fleet's rows: profile type, labels, stack, time, value.
pub fn profiles_schema() -> Result<Schema, BoxError> {
    let dict = |name: &str| ColumnDef::new(name, DataType::Utf8).encoding(Encoding::RleDictionary);
    // Dictionary pages for integers that repeat (stack ids across profiles of a series,
    // values, constant periods); measured 35% smaller than plain on the small fleet.
    let int = |name: &str| ColumnDef::new(name, DataType::Int64).encoding(Encoding::RleDictionary);
    Ok(Schema::builder("profiles")
        .column(dict("name"))
        .column(dict("sample_type"))
        .column(dict("sample_unit"))
        .column(dict("period_type"))
        .column(dict("period_unit"))
        .column(ColumnDef::dynamic("labels", DataType::Utf8).encoding(Encoding::RleDictionary))
        .column(ColumnDef::new("stacktrace_id", DataType::UInt64).encoding(Encoding::RleDictionary))
        .column(int("timestamp").encoding(Encoding::DeltaBinaryPacked))
        .column(int("duration"))
        .column(int("period"))
        .column(int("value"))
        .sort_by(SortingColumn::asc("name"))
        .sort_by(SortingColumn::asc("sample_type"))
        .sort_by(SortingColumn::asc("sample_unit"))
        .sort_by(SortingColumn::asc("period_type"))
        .sort_by(SortingColumn::asc("period_unit"))
        .sort_by(SortingColumn::asc("labels"))
        .sort_by(SortingColumn::asc("timestamp"))
        .sort_by(SortingColumn::asc("stacktrace_id"))
        .build()?)
}

/// Stacks: id, frames (leaf first, joined by newlines), and the leaf function on its own,
/// as a profile store keeps the function of each location apart from the whole stack.
pub fn stacktraces_schema() -> Result<Schema, BoxError> {
    Ok(Schema::builder("stacktraces")
        .column(ColumnDef::new("stacktrace_id", DataType::UInt64))
        .column(ColumnDef::new("frames", DataType::Utf8))
        .column(ColumnDef::new("leaf", DataType::Utf8).encoding(Encoding::RleDictionary))
        .sort_by(SortingColumn::asc("stacktrace_id"))
        .build()?)
}

fn parquet_batches(
    path: &Path,
) -> Result<impl Iterator<Item = Result<RecordBatch, BoxError>>, BoxError> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)?
        .with_batch_size(64 * 1024)
        .build()?;
    Ok(reader.map(|b| b.map_err(BoxError::from)))
}

/// `frames` (a list of strings) joined by newlines, and the leaf (the first frame).
fn join_frames(batch: &RecordBatch) -> Result<RecordBatch, BoxError> {
    let ids = batch
        .column_by_name("stacktrace_id")
        .ok_or("no stacktrace_id")?
        .clone();
    let frames = batch.column_by_name("frames").ok_or("no frames")?;
    let list = frames.as_list_opt::<i32>().ok_or("frames is not a list")?;
    let joined: StringArray = (0..list.len())
        .map(|i| {
            list.is_valid(i).then(|| {
                let v = list.value(i);
                let s = v.as_string::<i32>();
                s.iter()
                    .map(|f| f.unwrap_or(""))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        })
        .collect();
    let leaf: StringArray = joined
        .iter()
        .map(|f| f.map(|f| f.split('\n').next().unwrap_or("").to_owned()))
        .collect();
    Ok(RecordBatch::try_new(
        Arc::new(ArrowSchema::new(vec![
            Field::new("stacktrace_id", DataType::UInt64, false),
            Field::new("frames", DataType::Utf8, true),
            Field::new("leaf", DataType::Utf8, true),
        ])),
        vec![
            ids,
            Arc::new(joined) as ArrayRef,
            Arc::new(leaf) as ArrayRef,
        ],
    )?)
}

fn arg(args: &[String], name: &str) -> Result<PathBuf, BoxError> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .ok_or_else(|| format!("missing {name}").into())
}

/// `ingest --data D --store S`.
pub fn ingest(args: &[String]) -> Result<(), BoxError> {
    let data = arg(args, "--data")?;
    let store = arg(args, "--store")?;
    // One writer: an fsync per batch costs less than waiting for company.
    let options = DbOptions::default().durability(Durability::Sync);
    let db = Db::open(&store, options)?;
    let profiles = db.table("profiles", profiles_schema()?, TableOptions::default())?;
    let stacks = db.table(
        "stacktraces",
        stacktraces_schema()?,
        TableOptions::default(),
    )?;
    let started = Instant::now();
    let mut files: Vec<PathBuf> = std::fs::read_dir(data.join("profiles"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    files.sort();
    let mut rows = 0usize;
    for file in &files {
        for batch in parquet_batches(file)? {
            let batch = batch?;
            rows += batch.num_rows();
            profiles.insert(&batch)?;
        }
        eprintln!("ingested {} ({rows} rows so far)", file.display());
    }
    for batch in parquet_batches(&data.join("stacktraces.parquet"))? {
        stacks.insert(&join_frames(&batch?)?)?;
    }
    db.flush()?;
    let load_s = started.elapsed().as_secs_f64();
    let stats = profiles.stats();
    eprintln!(
        "persisted {} blocks, {} bytes of Parquet for {rows} rows ({:.2} bytes per row)",
        stats.blocks,
        stats.block_bytes,
        stats.block_bytes as f64 / rows as f64
    );
    println!("{}", serde_json::json!({"rows": rows, "load_s": load_s}));
    Ok(())
}

/// The six queries of shared/bench, in DataFusion SQL over our tables (Q5 reads the leaf
/// function of each stack from its own column).
pub fn sql_queries(q: &serde_json::Value) -> Result<Vec<(String, String)>, BoxError> {
    let text = |k: &str| -> Result<String, BoxError> {
        q.get(k)
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .ok_or_else(|| format!("queries.json lacks {k}").into())
    };
    let int = |k: &str| -> Result<i64, BoxError> {
        q.get(k)
            .and_then(|v| v.as_i64())
            .ok_or_else(|| format!("queries.json lacks {k}").into())
    };
    let (pod, ns) = (text("pod")?, text("namespace")?);
    let (w0, w1, b, top) = (
        int("window_start_ms")?,
        int("window_end_ms")?,
        int("bucket_ms")?,
        int("top_n")?,
    );
    Ok(vec![
        (
            "Q1".into(),
            format!(
                "SELECT stacktrace_id, CAST(sum(value) AS BIGINT) AS total FROM profiles \
             WHERE name = 'cpu' AND \"labels.pod\" = '{pod}' AND timestamp >= {w0} AND timestamp < {w1} \
             GROUP BY stacktrace_id"
            ),
        ),
        (
            "Q2".into(),
            format!(
                "SELECT stacktrace_id, CAST(sum(value) AS BIGINT) AS total FROM profiles \
             WHERE name = 'cpu' AND \"labels.namespace\" = '{ns}' GROUP BY stacktrace_id"
            ),
        ),
        (
            "Q3".into(),
            format!(
                "SELECT CAST(\"labels.pod\" AS VARCHAR) AS pod, timestamp - (timestamp % {b}) AS bucket, \
             CAST(sum(value) AS BIGINT) AS total FROM profiles \
             WHERE name = 'cpu' AND \"labels.namespace\" = '{ns}' GROUP BY 1, 2"
            ),
        ),
        (
            "Q4".into(),
            format!(
                "SELECT CAST(pod AS VARCHAR) AS pod FROM (SELECT DISTINCT \"labels.pod\" AS pod \
             FROM profiles WHERE \"labels.namespace\" = '{ns}')"
            ),
        ),
        (
            "Q5".into(),
            format!(
                "SELECT CAST(s.leaf AS VARCHAR) AS fn, CAST(sum(a.v) AS BIGINT) AS total \
             FROM (SELECT stacktrace_id AS sid, sum(value) AS v FROM profiles WHERE name = 'cpu' \
             GROUP BY stacktrace_id) AS a JOIN stacktraces AS s ON a.sid = s.stacktrace_id \
             GROUP BY 1 ORDER BY total DESC, fn ASC LIMIT {top}"
            ),
        ),
        (
            "Q6".into(),
            "SELECT stacktrace_id, CAST(sum(value) AS BIGINT) AS total FROM profiles \
             WHERE name = 'cpu' GROUP BY stacktrace_id"
                .into(),
        ),
    ])
}

/// What the frostdb scans of a physical plan pruned and read.
fn scan_report(
    plan: &std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
) -> serde_json::Value {
    let mut out = Vec::new();
    let mut stack = vec![plan.clone()];
    while let Some(p) = stack.pop() {
        if let Some(scan) =
            (p.as_ref() as &dyn std::any::Any).downcast_ref::<frostdb_query::FrostScanExec>()
        {
            let m = scan.pruning();
            out.push(serde_json::json!({
                "table": scan.table(),
                "granules": m.chunks, "granules_pruned": m.chunks_pruned,
                "blocks": m.blocks, "blocks_pruned": m.blocks_pruned,
                "row_groups": m.row_groups, "row_groups_pruned": m.row_groups_pruned,
                "rows_skipped_by_pages": m.rows_skipped_by_pages, "rows_read": m.rows_read,
            }));
        }
        stack.extend(p.children().into_iter().cloned());
    }
    serde_json::Value::Array(out)
}

/// `query --data D --store S --queries Q --runs N --out O`.
pub fn query(args: &[String]) -> Result<(), BoxError> {
    let store = arg(args, "--store")?;
    let queries: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(arg(args, "--queries")?)?)?;
    let runs: usize = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let out = arg(args, "--out")?;
    std::fs::create_dir_all(&out)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let db = Db::open(&store, DbOptions::default())?;
    let ctx = frostdb_query::session(&db)?;
    let mut timings = serde_json::Map::new();
    let mut scans = serde_json::Map::new();
    for (id, sql) in sql_queries(&queries)? {
        let mut times = Vec::new();
        let mut result = Vec::new();
        for _ in 0..runs.max(1) {
            let started = Instant::now();
            let (batches, plan) = runtime.block_on(async {
                let df = ctx.sql(&sql).await?;
                let plan = df.clone().create_physical_plan().await?;
                let batches =
                    datafusion::physical_plan::collect(plan.clone(), ctx.task_ctx()).await?;
                Ok::<_, datafusion::error::DataFusionError>((batches, plan))
            })?;
            times.push(started.elapsed().as_secs_f64() * 1e3);
            scans.insert(id.clone(), scan_report(&plan));
            result = batches;
        }
        write_result(&out, &id, &result, &times)?;
        timings.insert(id, serde_json::json!(times));
    }
    std::fs::write(
        out.join("timings.json"),
        serde_json::Value::Object(timings).to_string(),
    )?;
    std::fs::write(
        out.join("scan.json"),
        serde_json::Value::Object(scans).to_string(),
    )?;
    Ok(())
}

/// Writes a query's result to `out/<id>.parquet` (the peer harness checksums it) and prints
/// its median time.
fn write_result(
    out: &std::path::Path,
    id: &str,
    result: &[RecordBatch],
    times: &[f64],
) -> Result<(), BoxError> {
    let schema = result
        .first()
        .map(|b| b.schema())
        .ok_or_else(|| format!("{id} returned no batch"))?;
    let file = std::fs::File::create(out.join(format!("{id}.parquet")))?;
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema, None)?;
    for b in result {
        writer.write(b)?;
    }
    writer.close()?;
    eprintln!("{id}: median {:.1} ms", median(&mut times.to_vec()));
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One generated pprof file: where it is, its timestamp, profile name (`__name__`) and labels.
#[derive(Debug, Clone)]
pub struct PprofFile {
    /// Path of the gzipped pprof.
    pub path: PathBuf,
    /// Timestamp (ms) the generator gave it.
    pub timestamp_ms: i64,
    /// Profile name.
    pub name: String,
    /// Series labels.
    pub labels: Vec<(String, String)>,
}

/// The files of a fleet's `pprof/index.tsv` (`gen_fleet.py --pprof`), in index order.
pub fn pprof_index(data: &std::path::Path) -> Result<Vec<PprofFile>, BoxError> {
    let path = data.join("pprof/index.tsv");
    let index = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "{}: {e} (generate with gen_fleet.py --pprof)",
            path.display()
        )
    })?;
    let mut files = Vec::new();
    for line in index.lines().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        let [file, ts, labels] = cols[..] else {
            return Err(format!("bad index line {line:?}").into());
        };
        let mut name = String::new();
        let mut pairs = Vec::new();
        for kv in labels.split(',') {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("bad label {kv:?}"))?;
            if k == "__name__" {
                name = v.to_owned();
            } else {
                pairs.push((k.to_owned(), v.to_owned()));
            }
        }
        files.push(PprofFile {
            path: data.join("pprof").join(file),
            timestamp_ms: ts.parse()?,
            name,
            labels: pairs,
        });
    }
    Ok(files)
}

/// `ingest --pprof`: the realistic path. Every file of `DATA/pprof/index.tsv` (gzipped pprof,
/// labels beside it as a scraper attaches them) is decoded, normalized and stored by
/// `frostdb_pprof`, on two threads.
pub fn ingest_pprof(args: &[String]) -> Result<(), BoxError> {
    use frostdb_pprof::{IngestOptions, Limits, ProfileStore};
    let data = arg(args, "--data")?;
    let store_dir = arg(args, "--store")?;
    let jobs = pprof_index(&data)?;
    let db = Db::open(
        &store_dir,
        DbOptions::default().durability(Durability::Sync),
    )?;
    let store = ProfileStore::open(db, TableOptions::default(), Limits::default())?;
    let started = Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (samples, bytes) = (
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    );
    std::thread::scope(|s| -> Result<(), BoxError> {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(PprofFile {
                            path: file,
                            timestamp_ms: ts,
                            name,
                            labels,
                        }) = jobs.get(i)
                        else {
                            return Ok(());
                        };
                        let b =
                            std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
                        bytes.fetch_add(b.len(), std::sync::atomic::Ordering::Relaxed);
                        let options = IngestOptions {
                            name: name.clone(),
                            labels: labels.clone(),
                            delta: false,
                            timestamp_ms: Some(*ts),
                        };
                        let summary = store
                            .ingest(&b, &options)
                            .map_err(|e| format!("{}: {e}", file.display()))?;
                        samples.fetch_add(summary.rows, std::sync::atomic::Ordering::Relaxed);
                        if i.is_multiple_of(10_000) {
                            eprintln!("  {i}/{} files", jobs.len());
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| "an ingest thread panicked")??;
        }
        Ok(())
    })?;
    let ingest_s = started.elapsed().as_secs_f64();
    store.db().flush()?;
    let load_s = started.elapsed().as_secs_f64();
    let rows = samples.load(std::sync::atomic::Ordering::Relaxed);
    let mb = bytes.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6;
    let stats = store.samples().stats();
    eprintln!(
        "{} files, {mb:.1} MB of pprof, {rows} sample rows in {ingest_s:.1} s ({:.0} rows/s, {:.1} MB/s), persisted by {load_s:.1} s; samples on disk {:.2} bytes/row",
        jobs.len(),
        rows as f64 / ingest_s,
        mb / ingest_s,
        stats.block_bytes as f64 / rows as f64
    );
    println!("{}", serde_json::json!({"rows": rows, "load_s": load_s}));
    Ok(())
}

/// The bench's id of a stack: the first 8 bytes, little-endian, of BLAKE2b-64 of its frames
/// (leaf first) joined by newlines.
fn bench_stack_id(frames: &[String]) -> u64 {
    use blake2::Digest;
    let mut h = blake2::Blake2b::<blake2::digest::consts::U8>::new();
    h.update(frames.join("\n").as_bytes());
    u64::from_le_bytes(h.finalize().into())
}

/// `query --pprof`: the six queries over what `ingest --pprof` stored, stacks resolved
/// through the symbol tables (the bench's stack ids and leaf functions come from frames).
pub fn query_pprof(args: &[String]) -> Result<(), BoxError> {
    use std::collections::HashMap;

    use arrow::array::{Int64Array, UInt64Array};
    use frostdb_pprof::{Limits, ProfileStore};
    let store_dir = arg(args, "--store")?;
    let queries: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(arg(args, "--queries")?)?)?;
    let runs: usize = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let out = arg(args, "--out")?;
    std::fs::create_dir_all(&out)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let db = Db::open(&store_dir, DbOptions::default())?;
    let store = ProfileStore::open(db, TableOptions::default(), Limits::default())?;
    let ctx = store.session()?;
    let symbols = store.symbols();
    let mut ids: HashMap<frostdb_pprof::Id, (u64, String)> = HashMap::new();
    let mut resolve = |id: &[u8]| -> Result<(u64, String), BoxError> {
        let id: frostdb_pprof::Id = id.try_into()?;
        if let Some(v) = ids.get(&id) {
            return Ok(v.clone());
        }
        let frames: Vec<String> = symbols
            .frames(&id)
            .iter()
            .map(|f| f.display_name())
            .collect();
        let v = (
            bench_stack_id(&frames),
            frames.first().cloned().unwrap_or_default(),
        );
        ids.insert(id, v.clone());
        Ok(v)
    };
    let mut timings = serde_json::Map::new();
    for (id, sql) in sql_queries(&queries)? {
        let cpu = "name = 'cpu' AND sample_type = 'cpu'";
        let sql = sql
            .replace("FROM profiles", "FROM samples")
            .replace("name = 'cpu'", cpu);
        let top: usize = queries["top_n"].as_u64().unwrap_or(20) as usize;
        let mut times = Vec::new();
        let mut result: Vec<RecordBatch> = Vec::new();
        for _ in 0..runs.max(1) {
            let started = Instant::now();
            result = match id.as_str() {
                "Q5" => {
                    let per_stack = format!(
                        "SELECT stacktrace_id, sum(value) FROM samples WHERE {cpu} GROUP BY stacktrace_id"
                    );
                    let batches =
                        runtime.block_on(async { ctx.sql(&per_stack).await?.collect().await })?;
                    let mut leaves: HashMap<String, i64> = HashMap::new();
                    for b in &batches {
                        let sid = b.column(0).as_fixed_size_binary();
                        let v = b.column(1).as_primitive::<arrow::datatypes::Int64Type>();
                        for i in 0..b.num_rows() {
                            *leaves.entry(resolve(sid.value(i))?.1).or_default() += v.value(i);
                        }
                    }
                    let mut leaves: Vec<(String, i64)> = leaves.into_iter().collect();
                    leaves.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                    leaves.truncate(top);
                    let (names, totals): (Vec<String>, Vec<i64>) = leaves.into_iter().unzip();
                    vec![RecordBatch::try_new(
                        Arc::new(ArrowSchema::new(vec![
                            Field::new("fn", DataType::Utf8, false),
                            Field::new("total", DataType::Int64, false),
                        ])),
                        vec![
                            Arc::new(StringArray::from(names)),
                            Arc::new(Int64Array::from(totals)),
                        ],
                    )?]
                }
                _ => {
                    let batches =
                        runtime.block_on(async { ctx.sql(&sql).await?.collect().await })?;
                    // Stack ids leave as the bench's ids.
                    let mut out = Vec::new();
                    for b in batches {
                        match b.schema().index_of("stacktrace_id") {
                            Ok(c) => {
                                let sid = b.column(c).as_fixed_size_binary();
                                let mapped: Vec<u64> = (0..b.num_rows())
                                    .map(|i| resolve(sid.value(i)).map(|v| v.0))
                                    .collect::<Result<_, _>>()?;
                                let mut columns = b.columns().to_vec();
                                columns[c] = Arc::new(UInt64Array::from(mapped));
                                let mut fields: Vec<Field> =
                                    b.schema().fields().iter().map(|f| (**f).clone()).collect();
                                fields[c] = Field::new("stacktrace_id", DataType::UInt64, false);
                                out.push(RecordBatch::try_new(
                                    Arc::new(ArrowSchema::new(fields)),
                                    columns,
                                )?);
                            }
                            Err(_) => out.push(b),
                        }
                    }
                    out
                }
            };
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        write_result(&out, &id, &result, &times)?;
        timings.insert(id, serde_json::json!(times));
    }
    std::fs::write(
        out.join("timings.json"),
        serde_json::Value::Object(timings).to_string(),
    )?;
    Ok(())
}
