//! `frostdb`: the command line of frostdb-rs. Store pprof files, list what is stored, merge
//! and report (top, folded, pprof, flame graph JSON or SVG), run SQL.
//!
//! ```text
//! frostdb ingest --data DIR --name NAME [--label k=v]... [--delta] PATH...
//! frostdb types --data DIR [--tenant ID]
//! frostdb query --data DIR [--tenant ID] SELECTOR [--from T] [--to T] --format top|folded|pprof|json|flamegraph-svg|dot [--aggregation sum|average|latest] [--max-nodes N] [-o FILE]
//! frostdb sql --data DIR [--tenant ID] 'SELECT ...'
//! frostdb serve [--data DIR] [--listen ADDR] [--config FILE] [--token TOKEN] [--ebpf] [--retention 30d]
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use frostdb_core::{Db, DbOptions};
use frostdb_examples::time::parse_time;
use frostdb_pprof::report;
use frostdb_pprof::{Aggregation, IngestOptions, MergeOptions, ProfileStore, StoreOptions};
use frostdb_query::Selector;
use frostdb_query::profile::TimeRange;

#[derive(Parser)]
#[command(
    name = "frostdb",
    version,
    about = "A continuous-profiling database: store pprof, query flame graphs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Store pprof files (gzip or raw; directories are walked).
    Ingest {
        /// Database directory.
        #[arg(long)]
        data: PathBuf,
        /// Profile name: the first part of the profile types (process_cpu, memory, ...).
        #[arg(long)]
        name: String,
        /// A series label for every sample, `key=value` (repeatable).
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Store cumulative types (allocs, contentions, delay) as deltas between the files of
        /// a series, in the order given.
        #[arg(long)]
        delta: bool,
        /// Files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// List the stored profile types.
    Types {
        /// Database directory, or a server's data directory.
        #[arg(long)]
        data: PathBuf,
        /// The tenant, when `--data` is a server's data directory (its databases are under
        /// `tenants/`; default `anonymous` there).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Merge what a selector selects and print a report.
    Query {
        /// Database directory, or a server's data directory.
        #[arg(long)]
        data: PathBuf,
        /// The tenant, when `--data` is a server's data directory (its databases are under
        /// `tenants/`; default `anonymous` there).
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        args: QueryArgs,
    },
    /// Run the continuous-profiling server: push, scrape, query API and web page.
    Serve {
        /// Database directory (default: the config's, else `frostdb-data`).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Address to listen on (default: the config's, else 127.0.0.1:7070).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// TOML configuration: limits, bearer token, scrape targets.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Require `Authorization: Bearer TOKEN` (default: the config's, else none).
        #[arg(long, env = "FROSTDB_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Profile every process on this host with eBPF (needs root, or CAP_BPF and
        /// CAP_PERFMON) into the store, as profile type `ebpf_cpu`.
        #[arg(long)]
        ebpf: bool,
        /// eBPF samples per second per CPU (default: the config's, else 19).
        #[arg(long, requires = "ebpf")]
        ebpf_frequency: Option<u64>,
        /// Keep samples this long, e.g. `30d` (default: the config's `retention`, else for
        /// ever); tenants with their own `[tenants.<id>] retention` keep theirs.
        #[arg(long, value_parser = parse_retention)]
        retention: Option<std::time::Duration>,
    },
    /// Run SQL over the stored tables and print the result.
    Sql {
        /// Database directory, or a server's data directory.
        #[arg(long)]
        data: PathBuf,
        /// The tenant, when `--data` is a server's data directory (its databases are under
        /// `tenants/`; default `anonymous` there).
        #[arg(long)]
        tenant: Option<String>,
        /// The query.
        query: String,
    },
}

/// The CLI's names of the library's formats ([`report::Format`]).
#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// The top table, as `go tool pprof -top` prints it.
    Top,
    /// Folded stacks, `root;caller;leaf value`.
    Folded,
    /// A gzipped pprof file.
    Pprof,
    /// The flame graph tree as JSON.
    Json,
    /// The flame graph as SVG.
    FlamegraphSvg,
    /// The call graph in Graphviz DOT, as `go tool pprof -dot`.
    Dot,
}

impl From<Format> for report::Format {
    fn from(f: Format) -> Self {
        match f {
            Format::Top => report::Format::TopText,
            Format::Folded => report::Format::Folded,
            Format::Pprof => report::Format::Pprof,
            Format::Json => report::Format::FlameGraph,
            Format::FlamegraphSvg => report::Format::Svg,
            Format::Dot => report::Format::Dot,
        }
    }
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not key=value"))?;
    if k.is_empty() {
        return Err(format!("{s:?} has an empty key"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

type BoxError = Box<dyn std::error::Error>;

fn open(data: &Path) -> Result<ProfileStore, BoxError> {
    let db = Db::open(data, DbOptions::default())
        .map_err(|e| format!("cannot open the database in {}: {e}", data.display()))?;
    Ok(ProfileStore::open(db, StoreOptions::default())?)
}

/// Whether `dir` holds a database (a manifest, or a WAL not yet persisted).
fn is_database(dir: &Path) -> bool {
    dir.join("manifest.json").is_file() || dir.join("wal").is_dir()
}

/// The database a read command reads: `data` itself, or in a server's data directory
/// (`data/tenants/<id>/`) the tenant's (`anonymous` when none is given). A path that holds
/// no database is an error naming the tenants there, never a new empty database.
fn database(data: &Path, tenant: Option<&str>) -> Result<PathBuf, BoxError> {
    let tenants = data.join("tenants");
    if tenant.is_none() && is_database(data) {
        return Ok(data.to_owned());
    }
    let id = tenant.unwrap_or(frostdb_examples::server::config::DEFAULT_TENANT);
    frostdb_examples::server::tenants::validate_tenant(id).map_err(|e| format!("--tenant: {e}"))?;
    let dir = tenants.join(id);
    if is_database(&dir) {
        return Ok(dir);
    }
    let mut present: Vec<String> = std::fs::read_dir(&tenants)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| is_database(&e.path()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    Err(if present.is_empty() {
        format!(
            "no database in {} (check --data, or ingest something first)",
            data.display()
        )
    } else {
        format!(
            "no tenant {id:?} in the server data directory {} (its tenants: {}; pick one with --tenant)",
            data.display(),
            present.join(", ")
        )
    }
    .into())
}

/// For commands that only read: a missing database is an error, not a new empty one.
fn existing(data: &Path) -> Result<&Path, BoxError> {
    if is_database(data) {
        Ok(data)
    } else {
        Err(format!(
            "no database in {} (check --data, or ingest something first)",
            data.display()
        )
        .into())
    }
}

/// Files under `paths`, directories walked, in name order.
fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, BoxError> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = paths.iter().rev().cloned().collect();
    while let Some(p) = stack.pop() {
        let meta = std::fs::metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        if meta.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(&p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            entries.sort();
            stack.extend(entries.into_iter().rev());
        } else {
            out.push(p);
        }
    }
    Ok(out)
}

fn ingest(
    data: &Path,
    name: String,
    labels: Vec<(String, String)>,
    delta: bool,
    paths: &[PathBuf],
) -> Result<ExitCode, BoxError> {
    let store = open(data)?;
    let files = files(paths)?;
    let options = IngestOptions {
        name,
        labels,
        delta,
        timestamp_ms: None,
    };
    let started = Instant::now();
    let mut last_report = Instant::now();
    let (mut ok, mut samples, mut bytes) = (0usize, 0usize, 0usize);
    let mut types = std::collections::BTreeSet::new();
    let mut rejected: Vec<(PathBuf, String)> = Vec::new();
    for (i, file) in files.iter().enumerate() {
        let result = std::fs::read(file)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                bytes += b.len();
                store.ingest(&b, &options).map_err(|e| e.to_string())
            });
        match result {
            Ok(summary) => {
                ok += 1;
                samples += summary.rows;
                types.extend(summary.profile_types);
            }
            Err(reason) => rejected.push((file.clone(), reason)),
        }
        if last_report.elapsed().as_secs() >= 1 {
            last_report = Instant::now();
            eprintln!("  {}/{} files, {samples} samples", i + 1, files.len());
        }
    }
    store.db().flush()?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "stored {ok} of {} files: {samples} samples, {:.1} MB of pprof in {secs:.2} s ({:.0} samples/s)",
        files.len(),
        bytes as f64 / 1e6,
        samples as f64 / secs.max(1e-9)
    );
    println!("profile types:");
    for t in &types {
        println!("  {t}");
    }
    if !rejected.is_empty() {
        println!("rejected {} files:", rejected.len());
        for (file, reason) in &rejected {
            println!("  {}: {reason}", file.display());
        }
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

fn runtime() -> Result<tokio::runtime::Runtime, BoxError> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn types(data: &Path) -> Result<ExitCode, BoxError> {
    let store = open(existing(data)?)?;
    let ctx = store.session()?;
    let batches = runtime()?.block_on(async {
        use futures::TryStreamExt;
        frostdb_query::profile::profile_types(&ctx, frostdb_pprof::schema::SAMPLES, TimeRange::ALL)
            .await?
            .try_collect::<Vec<_>>()
            .await
    })?;
    for b in &batches {
        for i in 0..b.num_rows() {
            let parts: Vec<String> = (0..b.num_columns())
                .map(|c| arrow::util::display::array_value_to_string(b.column(c), i))
                .collect::<Result<_, _>>()?;
            println!("{}", parts.join(":"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `frostdb query` merges and how it prints it.
#[derive(clap::Args)]
struct QueryArgs {
    /// `name:sample_type:sample_unit:period_type:period_unit{label="value", ...}`
    selector: String,
    /// Start (RFC 3339, Unix ms, or `now-1h`); default: the beginning.
    #[arg(long)]
    from: Option<String>,
    /// End, excluded (same forms); default: the end.
    #[arg(long)]
    to: Option<String>,
    /// What to print.
    #[arg(long, value_enum, default_value_t = Format::Top)]
    format: Format,
    /// How each series' profiles over the range combine: `sum`, `average` or `latest`
    /// (default: average for gauges such as memory in use, else sum).
    #[arg(long, value_parser = Aggregation::parse)]
    aggregation: Option<Aggregation>,
    /// Nodes kept: of a flame graph (json, flamegraph-svg; default 8192, the rest summed
    /// into `other`) or of the call graph (dot; default 100).
    #[arg(long)]
    max_nodes: Option<usize>,
    /// Write to this file instead of standard output.
    #[arg(short = 'o', long)]
    output: Option<PathBuf>,
}

fn query(data: &Path, args: QueryArgs) -> Result<ExitCode, BoxError> {
    let QueryArgs {
        selector,
        from,
        to,
        format,
        aggregation,
        max_nodes,
        output,
    } = args;
    let selector = Selector::parse(&selector)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let range = TimeRange {
        start_ms: from
            .map(|t| parse_time(&t, now))
            .transpose()?
            .unwrap_or(i64::MIN),
        end_ms: to
            .map(|t| parse_time(&t, now))
            .transpose()?
            .unwrap_or(i64::MAX),
    };
    let store = open(existing(data)?)?;
    let format = report::Format::from(format);
    let profile_type = selector
        .profile_type
        .clone()
        .ok_or("the selector needs a profile type (name:type:unit:period_type:period_unit)")?;
    let options = MergeOptions {
        aggregation: aggregation.unwrap_or_else(|| Aggregation::default_for(&profile_type)),
        by_series: format.keeps_series(),
        lenient: false,
    };
    let merged = store.merge_with(&selector, range, &options)?;
    if merged.samples.is_empty() {
        eprintln!(
            "nothing matches {selector:?} in that range",
            selector = selector_text(&selector)
        );
    }
    let render = report::RenderOptions {
        max_nodes,
        title: profile_type.to_string(),
        ..Default::default()
    };
    let bytes = report::render(&merged, format, &render)?;
    match output {
        Some(path) => {
            std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => std::io::stdout().write_all(&bytes)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn selector_text(s: &Selector) -> String {
    let t = s
        .profile_type
        .as_ref()
        .map(|t| t.to_string())
        .unwrap_or_default();
    let m: Vec<String> = s
        .matchers
        .iter()
        .map(|m| {
            format!(
                "{}{}{:?}",
                m.label,
                match m.op {
                    frostdb_query::MatchOp::Equal => "=",
                    frostdb_query::MatchOp::NotEqual => "!=",
                    frostdb_query::MatchOp::Regex => "=~",
                    frostdb_query::MatchOp::NotRegex => "!~",
                },
                m.value
            )
        })
        .collect();
    format!("{t}{{{}}}", m.join(","))
}

fn sql(data: &Path, q: &str) -> Result<ExitCode, BoxError> {
    let db = Db::open(existing(data)?, DbOptions::default())?;
    let ctx = frostdb_query::session(&db)?;
    let batches = runtime()?.block_on(async { ctx.sql(q).await?.collect().await })?;
    println!("{}", arrow::util::pretty::pretty_format_batches(&batches)?);
    Ok(ExitCode::SUCCESS)
}

fn parse_retention(s: &str) -> Result<std::time::Duration, String> {
    match frostdb_examples::time::parse_duration_ms(s)? {
        ms if ms > 0 => Ok(std::time::Duration::from_millis(ms as u64)),
        _ => Err(format!("{s:?}: retention must be positive")),
    }
}

fn serve(
    data: Option<PathBuf>,
    listen: Option<std::net::SocketAddr>,
    config: Option<PathBuf>,
    token: Option<String>,
    (ebpf, ebpf_frequency): (bool, Option<u64>),
    retention: Option<std::time::Duration>,
) -> Result<ExitCode, BoxError> {
    use frostdb_examples::server;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FROSTDB_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mut config = match config {
        Some(path) => server::Config::load(&path)?,
        None => server::Config::default(),
    };
    if let Some(data) = data {
        config.data = data;
    }
    if let Some(listen) = listen {
        config.listen = listen;
    }
    if token.is_some() {
        config.token = token;
    }
    if retention.is_some() {
        config.retention = retention;
    }
    if ebpf {
        let e = config.ebpf.get_or_insert_with(Default::default);
        if let Some(hz) = ebpf_frequency {
            e.frequency_hz = hz;
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(server::serve(config))?;
    Ok(ExitCode::SUCCESS)
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ingest {
            data,
            name,
            labels,
            delta,
            paths,
        } => ingest(&data, name, labels, delta, &paths),
        Command::Types { data, tenant } => {
            database(&data, tenant.as_deref()).and_then(|data| types(&data))
        }
        Command::Query { data, tenant, args } => {
            database(&data, tenant.as_deref()).and_then(|data| query(&data, args))
        }
        Command::Sql {
            data,
            tenant,
            query,
        } => database(&data, tenant.as_deref()).and_then(|data| sql(&data, &query)),
        Command::Serve {
            data,
            listen,
            config,
            token,
            ebpf,
            ebpf_frequency,
            retention,
        } => serve(
            data,
            listen,
            config,
            token,
            (ebpf, ebpf_frequency),
            retention,
        ),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("frostdb: {e}");
            ExitCode::FAILURE
        }
    }
}
