//! The `frostdb-bench` commands: frostdb-rs as an external engine of `shared/bench` (see its
//! README), measured on the product's own layout: `frostdb_pprof`'s samples and symbol
//! tables, loaded through [`ProfileStore`] and queried with the functions the server calls.
//!
//! ```text
//! frostdb-bench ingest --data DATA_DIR --store STORE_DIR [--threads N] [--batch-rows N]
//!     stores the rows of DATA_DIR/profiles/*.parquet as they are through
//!     ProfileStore::ingest_arrow, in calls of about --batch-rows rows (default 1,048,576)
//!     on --threads threads (default: one per core),
//!     stacks by id into stacktraces.parquet (given once, as ArrowStacks); prints {"rows": N, "load_s": seconds,
//!     "compact_s": seconds, "stored_s": seconds}: load_s until every row is acknowledged
//!     (durable in the write-ahead log, and queryable), as shared/bench times chDB's
//!     INSERT; compact_s for the rollups and the Parquet blocks after it, as it times
//!     chDB's OPTIMIZE; stored_s the two together
//! frostdb-bench ingest --per-profile --data DATA_DIR --store STORE_DIR [--threads N]
//!     builds one profile per (type, series, timestamp) from the same rows (frames from
//!     stacktraces.parquet, one location per function, as pprof ingest stores them) and
//!     stores each through ProfileStore::ingest_profile
//! frostdb-bench ingest --pprof --data DATA_DIR --store STORE_DIR [--threads N] [--from-disk]
//!     first gunzips and decodes every file of DATA_DIR/pprof/index.tsv on all cores (the
//!     raw rate), then ingests them through ProfileStore::ingest; prints both rates. The
//!     files are read into memory before either is timed (up to 4 GiB of them), unless
//!     --from-disk: then each timed pass reads them file by file
//! frostdb-bench query --data DATA_DIR --store STORE_DIR --queries Q.json --runs N --out OUT
//!     Q1..Q6 through ProfileStore::merge / range / label_values and the top table; writes
//!     OUT/timings.json ({"Q1": [ms, ...], ...}) and OUT/Qn.parquet (the results, stack ids
//!     mapped to the bench's ids outside the timed region)
//!
//! A store shared through a bucket (S3 or compatible) instead of STORE_DIR:
//!   --bucket s3://NAME/PREFIX [--endpoint http://HOST:PORT --allow-http]
//! ingest writes it (its writer), query reads it; with --workers URL,URL query's merges
//! read the persisted blocks on worker processes:
//! frostdb-bench worker --bucket s3://NAME/PREFIX --listen HOST:PORT
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Int64Type, Schema as ArrowSchema, UInt64Type};
use frostdb_core::{Db, DbOptions};
use frostdb_pprof::proto::{Function, Line, Location, Profile, Sample, ValueType};
use frostdb_pprof::report::top::flat_by_function;
use frostdb_pprof::{IngestOptions, Merged, ProfileStore, StoreOptions};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;
use frostdb_profile::distributed::{Cluster, ClusterOptions, Node, StackSource};
use frostdb_profile::schema::column::{
    DURATION, LABEL_PREFIX, NAME, PERIOD, PERIOD_TYPE, PERIOD_UNIT, SAMPLE_TYPE, SAMPLE_UNIT,
    STACKTRACE_ID, TIMESTAMP, VALUE, label_column,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// Errors of the bench commands.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The profile type the bench's queries read.
pub const CPU: &str = "cpu:cpu:nanoseconds:cpu:nanoseconds";

pub(crate) fn arg(args: &[String], name: &str) -> Result<PathBuf, BoxError> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .ok_or_else(|| format!("missing {name}").into())
}

pub(crate) fn number(args: &[String], name: &str, default: usize) -> Result<usize, BoxError> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{name} needs a number").into()),
    }
}

/// Concurrent ingests: enough that group commit fills each fsync (a few ms here) while
/// decoding keeps every core busy.
const DEFAULT_THREADS: usize = 64;

pub(crate) fn open_store(dir: &Path) -> Result<ProfileStore, BoxError> {
    let db = Db::open(dir, DbOptions::default())?;
    Ok(ProfileStore::open(db, StoreOptions::default())?)
}

/// The bucket `--bucket s3://name/prefix` names (with `--endpoint URL` of an S3-compatible
/// server and `--allow-http` for a loopback one; credentials from the environment), if any.
fn bucket(args: &[String]) -> Result<Option<frostdb_core::Bucket>, BoxError> {
    let Ok(url) = arg(args, "--bucket") else {
        return Ok(None);
    };
    let mut bucket = frostdb_core::Bucket::new(url.display().to_string())
        .allow_http(args.iter().any(|a| a == "--allow-http"));
    if let Ok(endpoint) = arg(args, "--endpoint") {
        bucket = bucket.endpoint(endpoint.display().to_string());
    }
    Ok(Some(bucket))
}

/// A reader of the database in `bucket`, refused where no writer ever stored one: a reader
/// of an empty prefix (a mistyped one) would answer every query with nothing.
fn open_bucket_reader(bucket: &frostdb_core::Bucket) -> Result<Db, BoxError> {
    let db = Db::open_reader(bucket.store()?, bucket.prefix()?, DbOptions::default())?;
    if db.get_table(frostdb_pprof::schema::SAMPLES).is_none() {
        return Err(format!(
            "{}: no database here (run ingest --bucket first)",
            bucket.url
        )
        .into());
    }
    Ok(db)
}

/// The store to load: `--store DIR`, or the writer of `--bucket` (shared with worker
/// processes; the bench writes as `frostdb-bench`, so a rerun takes its lease at once).
fn store_to_load(args: &[String]) -> Result<ProfileStore, BoxError> {
    let Some(bucket) = bucket(args)? else {
        return open_store(&arg(args, "--store")?);
    };
    let shared = frostdb_core::SharedOptions::new("frostdb-bench");
    let db = Db::open_shared(
        bucket.store()?,
        bucket.prefix()?,
        DbOptions::default(),
        shared,
    )?;
    Ok(ProfileStore::open(db, StoreOptions::default())?)
}

/// The bench's single store as a [`StackSource`]: whatever the tenant, its tables.
#[derive(Debug)]
struct BenchSource(Db);

impl StackSource for BenchSource {
    fn table(&self, _tenant: &str, table: &str) -> frostdb_query::Result<frostdb_core::Table> {
        self.0.get_table(table).ok_or_else(|| {
            frostdb_query::Error::Config(format!("the store has no table {table:?}"))
        })
    }
}

/// The store to query: `--store DIR`, or a reader of `--bucket`, whose merges read
/// persisted blocks on the worker processes `--workers URL,URL` when given.
fn store_to_query(args: &[String]) -> Result<(ProfileStore, Option<Arc<Cluster>>), BoxError> {
    let Some(bucket) = bucket(args)? else {
        let dir = arg(args, "--store")?;
        if !dir.join("manifest.json").exists() && !dir.join("wal").exists() {
            return Err(format!("{}: no database here (run ingest first)", dir.display()).into());
        }
        return Ok((open_store(&dir)?, None));
    };
    let db = open_bucket_reader(&bucket)?;
    let mut options = StoreOptions::default();
    let mut cluster = None;
    if let Ok(workers) = arg(args, "--workers") {
        let workers: Vec<String> = workers
            .display()
            .to_string()
            .split(',')
            .map(str::to_owned)
            .collect();
        let source: Arc<dyn StackSource> = Arc::new(BenchSource(db.clone()));
        let node = runtime()?.block_on(Node::start(
            &ClusterOptions::default().workers(workers),
            source,
        ))?;
        if let Some(c) = node.cluster() {
            options.block_merger = Some(c.merger("bench"));
            cluster = Some(c.clone());
        }
    }
    Ok((ProfileStore::open_reader(db, options)?, cluster))
}

fn runtime() -> Result<tokio::runtime::Runtime, BoxError> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// `worker --bucket URL --listen ADDR`: serves distributed merges of the bucket's store
/// (read-only) until killed.
pub fn worker(args: &[String]) -> Result<(), BoxError> {
    let bucket = bucket(args)?.ok_or("worker needs --bucket")?;
    let listen = arg(args, "--listen")?.display().to_string();
    let listen: std::net::SocketAddr = listen
        .parse()
        .map_err(|e| format!("--listen {listen}: {e}"))?;
    let db = open_bucket_reader(&bucket)?;
    let source: Arc<dyn StackSource> = Arc::new(BenchSource(db));
    runtime()?.block_on(async move {
        let node = Node::start(&ClusterOptions::default().listen(listen), source).await?;
        eprintln!(
            "frostdb-bench worker listening on http://{}",
            node.listening().ok_or("not listening")?
        );
        node.serve().await.map_err(BoxError::from)
    })
}

/// CPU seconds (user and system) this process has used so far, from `/proc/self/stat`, or
/// `None` where there is no such file.
fn cpu_seconds() -> Option<f64> {
    let (_, cpu) = stat_cpu(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    Some(cpu)
}

/// CPU seconds of this process's live threads by name (compaction, persistence and other
/// background threads; workers that have exited are only in the process total).
fn cpu_by_thread() -> std::collections::BTreeMap<String, f64> {
    let mut by_name = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return by_name;
    };
    for task in tasks.flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        if let Some((name, cpu)) = stat_cpu(&stat) {
            *by_name.entry(name.to_owned()).or_insert(0.0) += cpu;
        }
    }
    by_name
}

/// The command name and CPU seconds (user and system) of a process's or thread's `stat`.
fn stat_cpu(stat: &str) -> Option<(&str, f64)> {
    // Fields after the command name (which may hold spaces) in parentheses: utime and
    // stime are the 12th and 13th, in clock ticks (100 a second on Linux).
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let mut fields = stat.get(close + 2..)?.split(' ').skip(11);
    let user: f64 = fields.next()?.parse().ok()?;
    let system: f64 = fields.next()?.parse().ok()?;
    Some((stat.get(open + 1..close)?, (user + system) / 100.0))
}

/// Runs `work(i)` for every `i` in `0..n` on `threads` threads, printing progress.
fn parallel(
    n: usize,
    threads: usize,
    what: &str,
    work: impl Fn(usize) -> Result<(), BoxError> + Sync,
) -> Result<(), BoxError> {
    let next = AtomicUsize::new(0);
    let step = (n / 10).max(1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| -> Result<(), BoxError> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(());
                        }
                        work(i)?;
                        if (i + 1).is_multiple_of(step) {
                            eprintln!("  {what}: {}/{n}", i + 1);
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|_| BoxError::from("a thread panicked"))?)
    })
}

fn report_layout(store: &ProfileStore, samples: usize, started: Instant) -> Result<(), BoxError> {
    // Every call has returned: every row is durable (in the write-ahead log) and queryable.
    let load_s = started.elapsed().as_secs_f64();
    // What the maintenance pass and the persistence workers do next, timed apart as the
    // bench times chDB's OPTIMIZE apart from its INSERT: roll up the closed hours and days,
    // then write every row to Parquet blocks.
    let rolling = Instant::now();
    let rolled = store.roll_up()?;
    eprintln!(
        "rolled up {} hours and {} days: {} rows read, {} rollup rows written, in {:.1} s",
        rolled.hours,
        rolled.days,
        rolled.rows_read,
        rolled.rows_written,
        rolling.elapsed().as_secs_f64()
    );
    store.db().flush()?;
    let stored_s = started.elapsed().as_secs_f64();
    let bytes = |name: &str| {
        store
            .db()
            .get_table(name)
            .map_or(0, |t| t.stats().block_bytes)
    };
    let sample_bytes = bytes("samples");
    let symbol_bytes: u64 = ["stacktraces", "locations", "functions", "mappings"]
        .iter()
        .map(|t| bytes(t))
        .sum();
    let stacks = store
        .db()
        .get_table("stacktraces")
        .map_or(0, |t| t.stats().rows);
    let rollup_bytes = bytes("rollups_1h") + bytes("rollups_1d");
    eprintln!(
        "{samples} sample rows acknowledged in {load_s:.1} s ({:.0} rows/s), rolled up and \
         persisted by {stored_s:.1} s ({:.0} rows/s); on disk: \
         samples {:.2} bytes/row, rollups {:.1} MB, symbols {:.1} MB for {stacks} stacks \
         ({:.1} bytes/stack)",
        samples as f64 / load_s,
        samples as f64 / stored_s,
        sample_bytes as f64 / samples.max(1) as f64,
        rollup_bytes as f64 / 1e6,
        symbol_bytes as f64 / 1e6,
        symbol_bytes as f64 / stacks.max(1) as f64,
    );
    println!(
        "{}",
        serde_json::json!({
            "rows": samples,
            "load_s": load_s,
            "compact_s": stored_s - load_s,
            "stored_s": stored_s,
        })
    );
    Ok(())
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
pub fn pprof_index(data: &Path) -> Result<Vec<PprofFile>, BoxError> {
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

/// `n` recording rules over the fleet's profiles, as a user might set them: per service,
/// the CPU of one of the ten hottest functions of `first` (anywhere in the stack, or as the
/// leaf) or of everything, cycling through the label names kept.
fn fleet_rules(
    job: &PprofFile,
    first: &[u8],
    n: usize,
) -> Result<Vec<frostdb_pprof::rules::RecordingRule>, BoxError> {
    let p = frostdb_pprof::decode(first, &Default::default())?.into_inner();
    let text = |i: i64| p.string_table[i as usize].clone();
    let period = p.period_type.unwrap_or_default();
    let t = &p.sample_type[p.sample_type.len() - 1];
    let profile_type = format!(
        "{}:{}:{}:{}:{}",
        job.name,
        text(t.r#type),
        text(t.unit),
        text(period.r#type),
        text(period.unit)
    );
    let mut flat: std::collections::HashMap<String, i64> = Default::default();
    for sample in &p.sample {
        let leaf = sample
            .location_id
            .first()
            .and_then(|id| p.location.iter().find(|l| l.id == *id))
            .and_then(|l| l.line.first())
            .and_then(|line| p.function.iter().find(|f| f.id == line.function_id));
        if let Some(f) = leaf {
            *flat.entry(text(f.name)).or_default() += sample.value.last().copied().unwrap_or(0);
        }
    }
    let mut hot: Vec<(String, i64)> = flat.into_iter().collect();
    hot.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    hot.truncate(10);
    let keys: Vec<String> = job.labels.iter().map(|(k, _)| k.clone()).collect();
    Ok((0..n)
        .map(|i| frostdb_pprof::rules::RecordingRule {
            name: format!("rule_{i}"),
            profile_type: profile_type.clone(),
            selector: String::new(),
            function: (i % 4 != 3 && !hot.is_empty()).then(|| hot[i % hot.len()].0.clone()),
            leaf_only: i % 4 == 1 && !hot.is_empty(),
            keep_labels: keys
                .iter()
                .take(1 + i % keys.len().max(1))
                .cloned()
                .collect(),
        })
        .collect())
}

/// `ingest --pprof`: the realistic path. Every file of `DATA/pprof/index.tsv` (gzipped
/// pprof, labels beside it as a scraper attaches them) is decoded, normalized and stored by
/// [`ProfileStore::ingest`], each acknowledged only when durable. Before that the same
/// files are only gunzipped and protobuf-decoded on all cores: the raw rate any pprof
/// consumer pays, printed beside ours. Both start from the files' bytes, read beforehand.
/// With `--rules N`, N recording rules count every profile as it is stored.
pub fn ingest_pprof(args: &[String]) -> Result<(), BoxError> {
    use prost::Message;
    let data = arg(args, "--data")?;
    let store = store_to_load(args)?;
    let threads = number(args, "--threads", DEFAULT_THREADS)?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let jobs = pprof_index(&data)?;
    let read = |f: &PprofFile| {
        std::fs::read(&f.path).map_err(|e| BoxError::from(format!("{}: {e}", f.path.display())))
    };
    // The timed passes take the files' bytes from memory, as a server takes pushes off the
    // network: opening and reading 108,000 small files costs about 11 us each in system
    // calls (the small fleet on this machine), the fleet's layout on disk rather than the
    // store's work. A fleet larger than HOLD_BYTES, or --from-disk, is read file by file
    // in the timed passes instead (from the page cache, which the first pass fills).
    const HOLD_BYTES: usize = 4 << 30;
    let mut hold = !args.iter().any(|a| a == "--from-disk");
    let mut held: Vec<std::sync::OnceLock<Vec<u8>>> = (0..if hold { jobs.len() } else { 0 })
        .map(|_| std::sync::OnceLock::new())
        .collect();
    let bytes = AtomicUsize::new(0);
    parallel(jobs.len(), cores, "read", |i| {
        let b = read(&jobs[i])?;
        let total = bytes.fetch_add(b.len(), Ordering::Relaxed) + b.len();
        if hold && total <= HOLD_BYTES {
            let _ = held[i].set(b);
        }
        Ok(())
    })?;
    if bytes.load(Ordering::Relaxed) > HOLD_BYTES {
        // All or none: every file is then read in the loop, as one method.
        (hold, held) = (false, Vec::new());
    }
    let file = |i: usize| -> Result<std::borrow::Cow<'_, [u8]>, BoxError> {
        Ok(match held.get(i).and_then(|b| b.get()) {
            Some(b) => std::borrow::Cow::Borrowed(b.as_slice()),
            None => std::borrow::Cow::Owned(read(&jobs[i])?),
        })
    };
    let source = if hold {
        "files held in memory"
    } else {
        "files read in the timed passes"
    };
    let started = Instant::now();
    parallel(jobs.len(), cores, "raw decode", |i| {
        let b = file(i)?;
        let raw = frostdb_pprof::inflate(&b, store.limits().max_decompressed_bytes)?;
        Profile::decode(raw.as_ref())?;
        Ok(())
    })?;
    let raw_s = started.elapsed().as_secs_f64();
    // The same with the store's own decoder (flat arrays, checked against the limits).
    let started = Instant::now();
    parallel(jobs.len(), cores, "flat decode", |i| {
        frostdb_pprof::decode(&file(i)?, store.limits())?;
        Ok(())
    })?;
    let flat_s = started.elapsed().as_secs_f64();

    // --rules N: N recording rules counting every profile as it is stored (issue 44's cost).
    let recorder = match number(args, "--rules", 0)? {
        0 => None,
        n => {
            let recorder = Arc::new(frostdb_pprof::rules::Recorder::new(
                frostdb_pprof::rules::RuleLimits {
                    max_rules: n,
                    max_series: 1_000_000,
                },
            ));
            recorder.set_rules(&fleet_rules(&jobs[0], &file(0)?, n)?)?;
            store.attach_recorder(recorder.clone());
            Some(recorder)
        }
    };
    let started = Instant::now();
    let cpu_before = cpu_seconds();
    let threads_before = cpu_by_thread();
    let samples = AtomicUsize::new(0);
    parallel(jobs.len(), threads, "ingest", |i| {
        let f = &jobs[i];
        let options = IngestOptions::default()
            .name(f.name.clone())
            .labels(f.labels.clone())
            .delta(false)
            .timestamp_ms(f.timestamp_ms);
        let summary = store
            .ingest(&file(i)?, &options)
            .map_err(|e| format!("{}: {e}", f.path.display()))?;
        samples.fetch_add(summary.rows, Ordering::Relaxed);
        Ok(())
    })?;
    let ingest_s = started.elapsed().as_secs_f64();
    let cpu = cpu_before.zip(cpu_seconds()).map(|(a, b)| b - a);
    let threads_after = cpu_by_thread();
    if let Some(recorder) = &recorder {
        let status = recorder.status();
        eprintln!(
            "{} recording rules recorded {} series",
            status.len(),
            status.iter().map(|s| s.series).sum::<usize>()
        );
    }
    let n = jobs.len() as f64;
    if let Some(wal) = store.db().wal_stats() {
        // fsyncs run one at a time, and a group's profiles wait for theirs: the share of
        // the load spent in them is time the clients of those groups could not work.
        let synced = wal.sync_time.as_secs_f64();
        eprintln!(
            "{} profiles committed in {} WAL records ({:.1} profiles, {:.1} KB each), {} fsyncs \
             taking {synced:.1} s ({:.0}% of the load's time, {:.2} ms each)",
            jobs.len(),
            wal.records,
            n / wal.records.max(1) as f64,
            wal.bytes as f64 / 1e3 / wal.records.max(1) as f64,
            wal.syncs,
            100.0 * synced / ingest_s,
            1e3 * synced / wal.syncs.max(1) as f64,
        );
    }
    eprintln!(
        "{} files, {:.1} MB, {source}: raw gunzip+decode {:.0} profiles/s ({raw_s:.1} s, \
         {cores} threads; {:.0}/s with the store's flat decoder and checks); \
         ingest {:.0} profiles/s ({ingest_s:.1} s, {threads} threads), {:.2}x the raw time",
        jobs.len(),
        bytes.load(Ordering::Relaxed) as f64 / 1e6,
        n / raw_s,
        n / flat_s,
        n / ingest_s,
        ingest_s / raw_s,
    );
    if let Some(cpu) = cpu {
        eprintln!(
            "ingest CPU (all threads, background work included): {:.1} s, {:.0} us a profile, \
             {:.0}% of {cores} cores",
            cpu,
            cpu * 1e6 / n,
            cpu * 100.0 / (ingest_s * cores as f64),
        );
        let background: Vec<String> = threads_after
            .iter()
            .map(|(name, s)| (name, s - threads_before.get(name).copied().unwrap_or(0.0)))
            .filter(|(_, s)| *s >= 0.05)
            .map(|(name, s)| format!("{name} {:.0} us", s * 1e6 / n))
            .collect();
        if !background.is_empty() {
            eprintln!(
                "  of which background threads, a profile: {}",
                background.join(", ")
            );
        }
    }
    report_layout(&store, samples.load(Ordering::Relaxed), started)
}

/// Reads every batch of a Parquet file.
fn parquet_batches(path: &Path) -> Result<Vec<RecordBatch>, BoxError> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(ParquetRecordBatchReaderBuilder::try_new(file)?
        .with_batch_size(64 * 1024)
        .build()?
        .collect::<Result<_, _>>()?)
}

/// The batches of a Parquet file, its string columns read as dictionaries (as the file's
/// pages hold them: no value is hashed again), as a store that keeps its rows in Parquet
/// would hand them to `ingest_arrow`.
fn dictionary_batches(path: &Path) -> Result<Vec<RecordBatch>, BoxError> {
    let open = || std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()));
    let schema = ParquetRecordBatchReaderBuilder::try_new(open()?)?
        .schema()
        .clone();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Utf8 => f.as_ref().clone().with_data_type(DataType::Dictionary(
                Box::new(DataType::Int32),
                Box::new(DataType::Utf8),
            )),
            _ => f.as_ref().clone(),
        })
        .collect();
    let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new()
        .with_schema(Arc::new(ArrowSchema::new(fields)));
    Ok(
        ParquetRecordBatchReaderBuilder::try_new_with_options(open()?, options)?
            .with_batch_size(64 * 1024)
            .build()?
            .collect::<Result<_, _>>()?,
    )
}

/// The fleet's stacks: frames (leaf first) per stack id.
fn fleet_stacks(data: &Path) -> Result<HashMap<u64, Vec<Arc<str>>>, BoxError> {
    let mut names: HashMap<String, Arc<str>> = HashMap::new();
    let mut stacks = HashMap::new();
    for batch in parquet_batches(&data.join("stacktraces.parquet"))? {
        let ids = column(&batch, STACKTRACE_ID)?
            .as_primitive_opt::<UInt64Type>()
            .ok_or("stacktrace_id is not uint64")?;
        let frames = column(&batch, "frames")?
            .as_list_opt::<i32>()
            .ok_or("frames is not a list")?;
        for i in 0..batch.num_rows() {
            let list = frames.value(i);
            let list = list
                .as_string_opt::<i32>()
                .ok_or("frames are not strings")?;
            let frames = list
                .iter()
                .map(|f| {
                    let f = f.unwrap_or("");
                    names
                        .entry(f.to_owned())
                        .or_insert_with(|| Arc::from(f))
                        .clone()
                })
                .collect();
            stacks.insert(ids.value(i), frames);
        }
    }
    Ok(stacks)
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a dyn Array, BoxError> {
    batch
        .column_by_name(name)
        .map(|c| c.as_ref())
        .ok_or_else(|| format!("no column {name}").into())
}

/// A profile being built from fleet rows: one location and one function per distinct frame
/// name, as the generator's pprof files have them (minus the mapping: the rows have none).
#[derive(Default)]
struct ProfileBuilder {
    profile: Profile,
    strings: HashMap<Arc<str>, i64>,
    functions: HashMap<Arc<str>, u64>,
}

impl ProfileBuilder {
    fn new(types: [&str; 4], timestamp_ms: i64, duration: i64, period: i64) -> Self {
        let mut b = Self::default();
        b.string("");
        let [t, u, pt, pu] = types.map(|s| b.string(s));
        b.profile.sample_type = vec![ValueType { r#type: t, unit: u }];
        b.profile.period_type = Some(ValueType {
            r#type: pt,
            unit: pu,
        });
        b.profile.period = period;
        b.profile.time_nanos = timestamp_ms * 1_000_000;
        b.profile.duration_nanos = duration;
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(Arc::from(s), i);
        i
    }

    fn location(&mut self, name: &Arc<str>) -> u64 {
        if let Some(&id) = self.functions.get(name) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let s = self.string(name);
        self.profile.function.push(Function {
            id,
            name: s,
            system_name: s,
            ..Function::default()
        });
        self.profile.location.push(Location {
            id,
            line: vec![Line {
                function_id: id,
                ..Line::default()
            }],
            ..Location::default()
        });
        self.functions.insert(name.clone(), id);
        id
    }

    fn sample(&mut self, frames: &[Arc<str>], value: i64) {
        let location_id = frames.iter().map(|f| self.location(f)).collect();
        self.profile.sample.push(Sample {
            location_id,
            value: vec![value],
            label: Vec::new(),
        });
    }
}

/// One profile's worth of fleet rows: its name, series labels and the built profile.
type FleetProfile = (String, Vec<(String, String)>, i64, ProfileBuilder);

/// Groups a batch's rows into profiles (rows of a profile are contiguous in the fleet's files;
/// a profile split across batches is stored as two, which sums the same).
fn fleet_profiles(
    batch: &RecordBatch,
    stacks: &HashMap<u64, Vec<Arc<str>>>,
) -> Result<Vec<FleetProfile>, BoxError> {
    let strings = |name: &str| -> Result<&StringArray, BoxError> {
        column(batch, name)?
            .as_string_opt::<i32>()
            .ok_or_else(|| format!("{name} is not a string column").into())
    };
    let ints = |name: &str| -> Result<&Int64Array, BoxError> {
        column(batch, name)?
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| format!("{name} is not int64").into())
    };
    let types = [SAMPLE_TYPE, SAMPLE_UNIT, PERIOD_TYPE, PERIOD_UNIT]
        .map(&strings)
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let name = strings(NAME)?;
    let label_columns: Vec<(String, &StringArray)> = batch
        .schema()
        .fields()
        .iter()
        .filter_map(|f| f.name().strip_prefix(LABEL_PREFIX).map(str::to_owned))
        .map(|l| Ok((l.clone(), strings(&label_column(&l))?)))
        .collect::<Result<_, BoxError>>()?;
    let ids = column(batch, STACKTRACE_ID)?
        .as_primitive_opt::<UInt64Type>()
        .ok_or("stacktrace_id is not uint64")?;
    let (ts, duration, period, value) = (
        ints(TIMESTAMP)?,
        ints(DURATION)?,
        ints(PERIOD)?,
        ints(VALUE)?,
    );
    let same_profile = |a: usize, b: usize| {
        ts.value(a) == ts.value(b)
            && name.value(a) == name.value(b)
            && types.iter().all(|t| t.value(a) == t.value(b))
            && label_columns.iter().all(|(_, c)| c.value(a) == c.value(b))
    };
    let mut out: Vec<FleetProfile> = Vec::new();
    let mut start = 0;
    for i in 0..batch.num_rows() {
        if i == start || !same_profile(start, i) {
            start = i;
            let labels = label_columns
                .iter()
                .filter(|(_, c)| c.is_valid(i))
                .map(|(l, c)| (l.clone(), c.value(i).to_owned()))
                .collect();
            let builder = ProfileBuilder::new(
                [0, 1, 2, 3].map(|t| types[t].value(i)),
                ts.value(i),
                duration.value(i),
                period.value(i),
            );
            out.push((name.value(i).to_owned(), labels, ts.value(i), builder));
        }
        let frames = stacks
            .get(&ids.value(i))
            .ok_or_else(|| format!("stack {} is not in stacktraces.parquet", ids.value(i)))?;
        let current = &mut out.last_mut().expect("pushed above").3;
        current.sample(frames, value.value(i));
    }
    Ok(out)
}

/// Runs `read` on this thread, handing what it sends to `threads` threads running `store`
/// (at most `depth` waiting): the first error of either is the result. `read`'s `send`
/// answers false once every store thread has stopped on an error.
fn feed<T: Send>(
    threads: usize,
    depth: usize,
    read: impl FnOnce(&dyn Fn(T) -> bool) -> Result<(), BoxError>,
    store: impl Fn(T) -> Result<(), BoxError> + Sync,
) -> Result<(), BoxError> {
    let (send, receive) = std::sync::mpsc::sync_channel::<T>(depth);
    let receive = std::sync::Mutex::new(receive);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<(), BoxError> {
                    loop {
                        let next = receive.lock().map_err(|_| "poisoned")?.recv();
                        let Ok(item) = next else {
                            return Ok(()); // the reader is done
                        };
                        store(item)?;
                    }
                })
            })
            .collect();
        let read = read(&|item| send.send(item).is_ok());
        drop(send);
        for w in workers {
            w.join()
                .map_err(|_| BoxError::from("an ingest thread panicked"))??;
        }
        read
    })
}

/// `ingest`: the fleet's Parquet rows stored as they are through
/// [`ProfileStore::ingest_arrow`], a call per `--batch-rows` rows (read and concatenated on
/// one thread, stored on `--threads`), the stacks batch `stacktraces.parquet`; or, with
/// `--per-profile`, as profiles ([`ingest_per_profile`]).
pub fn ingest(args: &[String]) -> Result<(), BoxError> {
    if args.iter().any(|a| a == "--per-profile") {
        return ingest_per_profile(args);
    }
    let data = arg(args, "--data")?;
    let store = store_to_load(args)?;
    // A call is CPU work until it joins the group commit: as many at once as there are
    // cores (more only hold more rows in memory: 64 held the whole medium fleet at once).
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads = number(args, "--threads", cores)?.max(1);
    let batch_rows = number(args, "--batch-rows", 1 << 20)?.max(1);
    let stack_batches = parquet_batches(&data.join("stacktraces.parquet"))?;
    let stacks = arrow::compute::concat_batches(
        &stack_batches
            .first()
            .map(|b| b.schema())
            .ok_or("stacktraces.parquet is empty")?,
        &stack_batches,
    )?;
    // Checked and indexed once; each call looks up the stacks its rows use.
    let stacks = store.arrow_stacks(&stacks)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(data.join("profiles"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    files.sort();
    let started = Instant::now();
    let (samples, calls) = (AtomicUsize::new(0), AtomicUsize::new(0));
    feed(
        threads,
        1,
        |send| {
            let mut pending: Vec<RecordBatch> = Vec::new();
            let mut rows = 0;
            // A call's rows, concatenated; false once every store thread has stopped.
            let send_pending = |pending: &mut Vec<RecordBatch>| -> Result<bool, BoxError> {
                let Some(first) = pending.first() else {
                    return Ok(true);
                };
                let batch = arrow::compute::concat_batches(&first.schema(), pending.iter())?;
                pending.clear();
                Ok(send(batch))
            };
            for file in &files {
                for batch in dictionary_batches(file)? {
                    rows += batch.num_rows();
                    pending.push(batch);
                    if rows >= batch_rows {
                        rows = 0;
                        if !send_pending(&mut pending)? {
                            return Ok(());
                        }
                    }
                }
                // Files may differ in their label columns: a call takes one file's rows.
                rows = 0;
                if !send_pending(&mut pending)? {
                    return Ok(());
                }
                let table = store.samples().stats();
                eprintln!(
                    "  read {}: {} rows stored so far ({:.0} rows/s); samples in memory: {} MB, \
                     {} blocks waiting to be persisted",
                    file.display(),
                    samples.load(Ordering::Relaxed),
                    samples.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64(),
                    table.memory_bytes >> 20,
                    table.frozen_blocks,
                );
            }
            Ok(())
        },
        |batch: RecordBatch| {
            let summary = store.ingest_arrow_with(&batch, &stacks)?;
            samples.fetch_add(summary.rows, Ordering::Relaxed);
            calls.fetch_add(1, Ordering::Relaxed);
            Ok(())
        },
    )?;
    let n = samples.load(Ordering::Relaxed) as f64;
    eprintln!(
        "{n} rows stored in {} calls at {:.0} rows/s",
        calls.load(Ordering::Relaxed),
        n / started.elapsed().as_secs_f64()
    );
    report_layout(&store, samples.load(Ordering::Relaxed), started)
}

/// `ingest --per-profile`: the fleet's Parquet rows, grouped back into the profiles they
/// came from (one per type, series and timestamp, frames from `stacktraces.parquet`), each
/// validated and stored through [`ProfileStore::ingest_profile`] as pprof ingest stores a
/// decoded file. One thread reads and groups rows; `--threads` store the profiles.
pub fn ingest_per_profile(args: &[String]) -> Result<(), BoxError> {
    let data = arg(args, "--data")?;
    let store = store_to_load(args)?;
    let threads = number(args, "--threads", DEFAULT_THREADS)?.max(1);
    let stacks = fleet_stacks(&data)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(data.join("profiles"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    files.sort();
    let started = Instant::now();
    let (samples, profiles) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let limits = *store.limits();
    feed(
        threads,
        threads * 4,
        |send| {
            for file in &files {
                for batch in parquet_batches(file)? {
                    for profile in fleet_profiles(&batch, &stacks)? {
                        if !send(profile) {
                            return Ok(());
                        }
                    }
                }
                let n = profiles.load(Ordering::Relaxed);
                eprintln!(
                    "  read {}: {n} profiles stored so far ({:.0} profiles/s)",
                    file.display(),
                    n as f64 / started.elapsed().as_secs_f64()
                );
            }
            Ok(())
        },
        |(name, labels, ts, builder): FleetProfile| {
            let profile = frostdb_pprof::validate(builder.profile, &limits)?;
            let options = IngestOptions::default()
                .name(name)
                .labels(labels)
                .delta(false)
                .timestamp_ms(ts);
            let summary = store.ingest_profile(&profile, &options)?;
            samples.fetch_add(summary.rows, Ordering::Relaxed);
            profiles.fetch_add(1, Ordering::Relaxed);
            Ok(())
        },
    )?;
    let n = profiles.load(Ordering::Relaxed) as f64;
    eprintln!(
        "{n} profiles built from Parquet rows and stored at {:.0} profiles/s",
        n / started.elapsed().as_secs_f64()
    );
    report_layout(&store, samples.load(Ordering::Relaxed), started)
}

/// The bench's id of a stack: the first 8 bytes, little-endian, of BLAKE2b-64 of its frames
/// (leaf first) joined by newlines.
pub fn bench_stack_id<'a>(leaf_first: impl IntoIterator<Item = &'a str>) -> u64 {
    use blake2::Digest;
    let mut h = blake2::Blake2b::<blake2::digest::consts::U8>::new();
    for (i, name) in leaf_first.into_iter().enumerate() {
        if i > 0 {
            h.update(b"\n");
        }
        h.update(name.as_bytes());
    }
    u64::from_le_bytes(h.finalize().into())
}

/// A merged profile as the bench's rows: value per bench stack id (stacks with equal frames
/// but different mappings or partitions summed under one id), in id order.
pub fn by_bench_id(merged: &Merged) -> Vec<(u64, i64)> {
    let mut totals: HashMap<u64, i64> = HashMap::new();
    frostdb_pprof::report::tree::each_named_stack(merged, |root_first, value| {
        *totals
            .entry(bench_stack_id(root_first.iter().rev().copied()))
            .or_default() += value;
    });
    let mut rows: Vec<(u64, i64)> = totals.into_iter().collect();
    rows.sort_unstable();
    rows
}

/// What a query returned, before its rows are shaped for the bench.
enum Answer {
    Merged(Box<Merged>),
    Series(Vec<frostdb_profile::native::Series>),
    Values(Vec<String>),
    Top(Vec<(String, i64)>),
}

fn batch(fields: Vec<(&str, DataType)>, columns: Vec<Arc<dyn Array>>) -> RecordBatch {
    let schema = ArrowSchema::new(
        fields
            .into_iter()
            .map(|(n, t)| Field::new(n, t, false))
            .collect::<Vec<_>>(),
    );
    RecordBatch::try_new(Arc::new(schema), columns).expect("columns match their fields")
}

impl Answer {
    /// The result rows with the columns of the bench's reference SQL.
    fn rows(&self) -> RecordBatch {
        match self {
            Answer::Merged(m) => {
                let (ids, totals): (Vec<u64>, Vec<i64>) = by_bench_id(m).into_iter().unzip();
                batch(
                    vec![
                        (STACKTRACE_ID, DataType::UInt64),
                        ("total", DataType::Int64),
                    ],
                    vec![
                        Arc::new(UInt64Array::from(ids)),
                        Arc::new(Int64Array::from(totals)),
                    ],
                )
            }
            Answer::Series(series) => {
                let (mut pods, mut buckets, mut totals) = (Vec::new(), Vec::new(), Vec::new());
                for s in series {
                    let pod = s
                        .labels
                        .iter()
                        .find(|(k, _)| k == "pod")
                        .map_or("", |(_, v)| v.as_str());
                    for &(t, v) in &s.points {
                        pods.push(pod.to_owned());
                        buckets.push(t);
                        totals.push(v);
                    }
                }
                batch(
                    vec![
                        ("pod", DataType::Utf8),
                        ("bucket", DataType::Int64),
                        ("total", DataType::Int64),
                    ],
                    vec![
                        Arc::new(StringArray::from(pods)),
                        Arc::new(Int64Array::from(buckets)),
                        Arc::new(Int64Array::from(totals)),
                    ],
                )
            }
            Answer::Values(values) => batch(
                vec![("pod", DataType::Utf8)],
                vec![Arc::new(StringArray::from(values.clone()))],
            ),
            Answer::Top(rows) => {
                let (names, totals): (Vec<String>, Vec<i64>) = rows.iter().cloned().unzip();
                batch(
                    vec![("fn", DataType::Utf8), ("total", DataType::Int64)],
                    vec![
                        Arc::new(StringArray::from(names)),
                        Arc::new(Int64Array::from(totals)),
                    ],
                )
            }
        }
    }
}

/// The six queries of shared/bench as profile queries: (id, the query).
type Query<'a> = (&'static str, Box<dyn Fn() -> Result<Answer, BoxError> + 'a>);

fn profile_queries<'a>(
    store: &'a ProfileStore,
    q: &serde_json::Value,
) -> Result<Vec<Query<'a>>, BoxError> {
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
    let window = TimeRange {
        start_ms: int("window_start_ms")?,
        end_ms: int("window_end_ms")?,
    };
    let (bucket, top) = (int("bucket_ms")?, int("top_n")? as usize);
    let by_pod = Selector::parse(&format!("{CPU}{{pod=\"{pod}\"}}"))?;
    let by_ns = Selector::parse(&format!("{CPU}{{namespace=\"{ns}\"}}"))?;
    let ns_any_type = Selector::parse(&format!("{{namespace=\"{ns}\"}}"))?;
    let cpu = Selector::parse(&format!("{CPU}{{}}"))?;
    let group = vec!["pod".to_owned()];
    Ok(vec![
        (
            "Q1",
            Box::new(move || Ok(Answer::Merged(Box::new(store.merge(&by_pod, window)?)))),
        ),
        (
            "Q2",
            Box::new({
                let by_ns = by_ns.clone();
                move || {
                    Ok(Answer::Merged(Box::new(
                        store.merge(&by_ns, TimeRange::ALL)?,
                    )))
                }
            }),
        ),
        (
            "Q3",
            Box::new(move || {
                Ok(Answer::Series(
                    store
                        .range(
                            &by_ns,
                            TimeRange::ALL,
                            bucket,
                            Some(&group),
                            frostdb_pprof::ReadOptions::STRICT,
                        )?
                        .value,
                ))
            }),
        ),
        (
            "Q4",
            Box::new(move || {
                Ok(Answer::Values(
                    store
                        .label_values(
                            "pod",
                            Some(&ns_any_type),
                            TimeRange::ALL,
                            frostdb_pprof::ReadOptions::STRICT,
                        )?
                        .value,
                ))
            }),
        ),
        (
            "Q5",
            Box::new({
                let cpu = cpu.clone();
                move || {
                    // Leaf functions by self value: the top table's flat column alone.
                    let merged = store.merge(&cpu, TimeRange::ALL)?;
                    let mut rows = flat_by_function(&merged);
                    rows.truncate(top);
                    Ok(Answer::Top(rows))
                }
            }),
        ),
        (
            "Q6",
            Box::new(move || Ok(Answer::Merged(Box::new(store.merge(&cpu, TimeRange::ALL)?)))),
        ),
    ])
}

/// `query --store S --queries Q --runs N --out O [--only Q2,Q6] [--explain]` (`--data` is
/// accepted and unused); `--only` runs the named queries alone, to profile one; `--explain`
/// prints what each merge read and skipped.
pub fn query(args: &[String]) -> Result<(), BoxError> {
    let queries: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(arg(args, "--queries")?)?)?;
    let runs = number(args, "--runs", 5)?.max(1);
    let out = arg(args, "--out")?;
    std::fs::create_dir_all(&out)?;
    let opened = Instant::now();
    let (store, cluster) = store_to_query(args)?;
    eprintln!("opened in {:.1} ms", opened.elapsed().as_secs_f64() * 1e3);
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .map(|i| {
            args.get(i + 1)
                .map(|v| v.split(',').map(str::to_owned).collect())
                .ok_or("--only needs query ids, e.g. Q2,Q6")
        })
        .transpose()?;
    let explain = args.iter().any(|a| a == "--explain");
    let mut timings = serde_json::Map::new();
    for (id, run) in profile_queries(&store, &queries)? {
        if only.as_ref().is_some_and(|o| !o.iter().any(|q| q == id)) {
            continue;
        }
        let mut times = Vec::new();
        let mut answer = None;
        for _ in 0..runs {
            let started = Instant::now();
            answer = Some(run()?);
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        let answer = answer.expect("runs >= 1");
        if explain && let Answer::Merged(m) = &answer {
            eprintln!("{id}: {} rows, {:?}", m.rows, m.metrics);
        }
        let rows = answer.rows();
        write_result(&out, id, &rows, &times)?;
        timings.insert(id.to_owned(), serde_json::json!(times));
    }
    std::fs::write(
        out.join("timings.json"),
        serde_json::Value::Object(timings).to_string(),
    )?;
    if let Some(cluster) = cluster {
        eprintln!(
            "workers {}: {} bytes moved between processes",
            cluster.workers().len(),
            cluster.bytes_moved()
        );
    }
    Ok(())
}

/// Writes a query's result to `out/<id>.parquet` (the peer harness checksums it) and prints
/// its median time.
fn write_result(out: &Path, id: &str, rows: &RecordBatch, times: &[f64]) -> Result<(), BoxError> {
    let file = std::fs::File::create(out.join(format!("{id}.parquet")))?;
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, rows.schema(), None)?;
    writer.write(rows)?;
    writer.close()?;
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    eprintln!(
        "{id}: median {:.1} ms, {} rows",
        sorted[sorted.len() / 2],
        rows.num_rows()
    );
    Ok(())
}
