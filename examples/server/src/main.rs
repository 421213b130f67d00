//! `frostdb`: the command line of frostdb-rs. Store pprof files, list what is stored, merge
//! and report (top, folded, pprof, flame graph JSON or SVG), run SQL.
//!
//! ```text
//! frostdb ingest --data DIR [--tenant ID] [--name NAME] [--label k=v]... [--delta] PATH...
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
use frostdb_pprof::report;
use frostdb_pprof::{Aggregation, IngestOptions, MergeOptions, ProfileStore, StoreOptions};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;
use frostdb_server::time::parse_time;

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
    /// Store pprof files (gzip or raw; directories are walked, their other files skipped).
    Ingest {
        /// A server's data directory (the profiles go to a tenant's database under
        /// `tenants/`, which the server reads), a database directory, or a new one.
        #[arg(long)]
        data: PathBuf,
        /// The tenant of a server's data directory (default `anonymous`, the server's
        /// default tenant).
        #[arg(long)]
        tenant: Option<String>,
        /// Profile name: the first part of the profile types (process_cpu, memory, ...).
        /// Default: as Pyroscope names a profile by its sample types (CPU `process_cpu`,
        /// heap `memory`, `goroutines`, `mutex`, `block`, `wall`).
        #[arg(long)]
        name: Option<String>,
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
    /// Compare two selections profile by profile: the functions whose share of the total
    /// (self or total) rose by `--min-increase` in `--after`, significantly over the
    /// profiles (a Mann-Whitney U test per function, Benjamini-Hochberg over all), as the
    /// server compares a service's versions. Exit status 0, or 3 with `--fail-on-regression`
    /// when one is found.
    Compare {
        /// Database directory, or a server's data directory.
        #[arg(long)]
        data: PathBuf,
        /// The tenant, when `--data` is a server's data directory.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        args: CompareArgs,
    },
    /// Run the continuous-profiling server: push, scrape, query API and web page.
    #[command(after_long_help = SERVE_CONFIG_HELP)]
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
    /// Debug files for the symbolizer, on a running server.
    Debuginfo {
        #[command(subcommand)]
        command: DebuginfoCommand,
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

#[derive(Subcommand)]
enum DebuginfoCommand {
    /// Upload an ELF file (a binary as linked, with its symbols or DWARF, or a separate
    /// debug file) under its GNU build id: frames stored as addresses of that build id are
    /// then named by queries (`[symbolizer]`).
    Upload {
        /// The server.
        #[arg(long, default_value = "http://127.0.0.1:7070")]
        url: String,
        /// The tenant whose profiles it names (default: the server's default tenant).
        #[arg(long)]
        tenant: Option<String>,
        /// The server's bearer token.
        #[arg(long, env = "FROSTDB_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// The build id to keep it under (default: the file's GNU build id).
        #[arg(long)]
        build_id: Option<String>,
        /// Replace a file uploaded before for the build id.
        #[arg(long)]
        force: bool,
        /// The ELF file.
        file: PathBuf,
    },
}

/// `frostdb debuginfo upload`: streams `file` to the server's
/// `PUT /api/v1/debuginfo/{build_id}`.
fn debuginfo_upload(command: DebuginfoCommand) -> Result<ExitCode, BoxError> {
    let DebuginfoCommand::Upload {
        url,
        tenant,
        token,
        build_id,
        force,
        file,
    } = command;
    let build_id = match build_id {
        Some(id) => id,
        None => frostdb_pprof::symbolize::file_build_id(&file)?
            .ok_or_else(|| format!("{} has no GNU build id: give --build-id", file.display()))?,
    };
    let size = std::fs::metadata(&file)
        .map_err(|e| format!("{}: {e}", file.display()))?
        .len();
    runtime()?.block_on(async {
        let body = tokio::fs::File::open(&file)
            .await
            .map_err(|e| format!("{}: {e}", file.display()))?;
        let mut request = reqwest::Client::new()
            .put(format!(
                "{}/api/v1/debuginfo/{build_id}?force={force}",
                url.trim_end_matches('/')
            ))
            .header(reqwest::header::CONTENT_LENGTH, size)
            .body(reqwest::Body::from(body));
        if let Some(tenant) = &tenant {
            request = request.header("X-Scope-OrgID", tenant);
        }
        if let Some(token) = &token {
            request = request.bearer_auth(token);
        }
        let answer = request.send().await.map_err(|e| format!("{url}: {e}"))?;
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(format!("{url}: {status}: {text}").into());
        }
        println!("{} uploaded as {build_id} ({size} bytes)", file.display());
        Ok::<_, BoxError>(ExitCode::SUCCESS)
    })
}

/// `serve --help`: what the config file sets, section by section.
const SERVE_CONFIG_HELP: &str = "\
The config file (--config FILE, TOML; frostdb.example.toml in the repository lists every key
with its default, and the README says what each does):
  listen, data, token       where it listens and keeps its tenants, the bearer token every
                            API call then needs
  retention                 how long samples are kept (default: for ever); persisted blocks
                            wholly older are deleted, then the symbols only they used
  rollup_retention          how long the hourly and daily rollups are kept
  [tenants.<id>]            one tenant's own retention
  [limits]                  request sizes, profile and label limits, series per tenant,
                            query memory and concurrency, the server's memory budget,
                            tenants, connections and timeouts (each refusal a 4xx naming
                            its limit)
  [[scrape]]                Go programs' /debug/pprof to scrape, with labels and intervals
  [ebpf]                    the bundled eBPF sampler (as --ebpf): frequency, interval,
                            processes, tenant, unwind table memory
  [storage]                 every tenant in an S3 bucket instead of the data directory
  [cluster]                 this node's role over the bucket (writer or reader), leases,
                            flush and refresh intervals, merge workers and their secret
  [symbolizer]              names for frames stored as addresses: debuginfod servers, the
                            debug file cache's size, fetch timeout, a query's budget,
                            files read at once
Tenants: the X-Scope-OrgID header picks one (default anonymous); each has its own database
under DATA/tenants/<id>/, which `frostdb types|query|sql --data DATA --tenant ID` read
when the server is stopped.";

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

/// Whether `dir` holds a database (a manifest, or a WAL not yet persisted).
fn is_database(dir: &Path) -> bool {
    dir.join("manifest.json").is_file() || dir.join("wal").is_dir()
}

/// Whether `dir` is a server's data directory: its tenants' databases are under `tenants/`.
fn is_server_data(dir: &Path) -> bool {
    dir.join("tenants").is_dir()
}

/// `--tenant` given for a plain database directory.
fn not_server_data(data: &Path) -> BoxError {
    format!(
        "--tenant: {} is a database, not a server's data directory (which holds tenants/)",
        data.display()
    )
    .into()
}

/// The tenant named, checked as the server checks it, or the server's default.
fn tenant_id(tenant: Option<&str>) -> Result<&str, BoxError> {
    let id = tenant.unwrap_or(frostdb_server::config::DEFAULT_TENANT);
    frostdb_server::tenants::validate_tenant(id).map_err(|e| format!("--tenant: {e}"))?;
    Ok(id)
}

/// The database a read command reads: in a server's data directory (`data/tenants/<id>/`)
/// the tenant's (`anonymous` when none is given), else `data` itself. A path that holds no
/// database is an error naming the tenants there; nothing is created.
fn database(data: &Path, tenant: Option<&str>) -> Result<PathBuf, BoxError> {
    if !is_server_data(data) {
        if is_database(data) {
            if tenant.is_some() {
                return Err(not_server_data(data));
            }
            return Ok(data.to_owned());
        }
        return Err(format!(
            "no database in {} (check --data, or ingest something first)",
            data.display()
        )
        .into());
    }
    let id = tenant_id(tenant)?;
    if is_database(data) {
        eprintln!(
            "note: {} also holds a database outside tenants/ (written by an older `frostdb ingest`), which the server does not read; reading tenant {id:?}",
            data.display()
        );
    }
    let dir = data.join("tenants").join(id);
    if is_database(&dir) {
        return Ok(dir);
    }
    let mut present: Vec<String> = std::fs::read_dir(data.join("tenants"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| is_database(&e.path()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    Err(if present.is_empty() {
        format!(
            "the server data directory {} has no tenant yet (push or ingest something first)",
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

/// The database `ingest` writes: a tenant's in a server's data directory (where the server
/// reads it), an existing database, or a new one in a new or empty directory. Never a new
/// database beside a server's tenants, nor among files that are not a database's.
fn ingest_database(data: &Path, tenant: Option<&str>) -> Result<PathBuf, BoxError> {
    if is_server_data(data) || tenant.is_some() {
        if tenant.is_some() && is_database(data) && !is_server_data(data) {
            return Err(not_server_data(data));
        }
        let id = tenant_id(tenant)?;
        return Ok(data.join("tenants").join(id));
    }
    if is_database(data) {
        return Ok(data.to_owned());
    }
    match std::fs::read_dir(data) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(format!(
                    "{} holds files but no database: not creating one among them (give a new or empty directory, a database, or a server's data directory)",
                    data.display()
                )
                .into());
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("--data {}: {e}", data.display()).into()),
    }
    Ok(data.to_owned())
}

/// Opens a database to write (creating it if needed).
fn open(data: &Path) -> Result<ProfileStore, BoxError> {
    let db = Db::open(data, DbOptions::default())
        .map_err(|e| format!("cannot open the database in {}: {e}", data.display()))?;
    Ok(ProfileStore::open(db, StoreOptions::default())?)
}

/// Opens a database to read: nothing is written, no file changes, and a server running on
/// it is named rather than waited for.
fn open_read(data: &Path) -> Result<ProfileStore, BoxError> {
    let db = Db::open_read_only(data, DbOptions::default())
        .map_err(|e| format!("cannot read the database in {}: {e}", data.display()))?;
    Ok(ProfileStore::open_reader(db, StoreOptions::default())?)
}

/// Whether a file met while walking a directory looks like a profile: gzip, or named as
/// pprof files are. Files named on the command line are always tried.
fn looks_like_profile(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    if [".pb", ".pb.gz", ".pprof", ".prof", ".gz"]
        .iter()
        .any(|ext| name.ends_with(ext))
    {
        return true;
    }
    let mut magic = [0u8; 2];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| magic == [0x1f, 0x8b])
}

/// Files under `paths`, directories walked in name order (skipping what is not a profile,
/// returned second). A path that does not exist is an error.
fn files(paths: &[PathBuf]) -> Result<(Vec<PathBuf>, Vec<PathBuf>), BoxError> {
    let (mut out, mut skipped) = (Vec::new(), Vec::new());
    let mut stack: Vec<(PathBuf, bool)> = paths.iter().rev().map(|p| (p.clone(), true)).collect();
    while let Some((p, named)) = stack.pop() {
        let meta = std::fs::metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        if meta.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(&p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            entries.sort();
            stack.extend(entries.into_iter().rev().map(|e| (e, false)));
        } else if named || looks_like_profile(&p) {
            out.push(p);
        } else {
            skipped.push(p);
        }
    }
    Ok((out, skipped))
}

/// What `ingest` stores and how.
struct IngestArgs {
    name: Option<String>,
    labels: Vec<(String, String)>,
    delta: bool,
}

fn ingest(data: &Path, args: IngestArgs, paths: &[PathBuf]) -> Result<ExitCode, BoxError> {
    // Every path is checked before anything is created.
    let (files, skipped) = files(paths)?;
    if files.is_empty() {
        return Err(format!(
            "no profiles in {} (skipped {} files that are not pprof)",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            skipped.len()
        )
        .into());
    }
    let store = open(data)?;
    eprintln!("storing into {}", data.display());
    let started = Instant::now();
    let mut last_report = Instant::now();
    let (mut ok, mut samples, mut bytes, mut duplicates) = (0usize, 0usize, 0usize, 0usize);
    let mut types = std::collections::BTreeSet::new();
    let mut rejected: Vec<(PathBuf, String)> = Vec::new();
    for (i, file) in files.iter().enumerate() {
        let result = std::fs::read(file)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                bytes += b.len();
                let profile = frostdb_pprof::decode(&b, &store.options().limits)
                    .map_err(|e| e.to_string())?;
                let options = IngestOptions::default()
                    .name(
                        args.name
                            .clone()
                            .unwrap_or_else(|| frostdb_pprof::convert::profile_name(&profile)),
                    )
                    .labels(args.labels.clone())
                    .delta(args.delta)
                    .timestamp_ms(None);
                store
                    .ingest_profile(&profile, &options)
                    .map_err(|e| e.to_string())
            });
        match result {
            Ok(summary) if summary.duplicate => duplicates += 1,
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
    println!("stored {ok} of {} files: {samples} samples", files.len());
    eprintln!(
        "{:.2} MB of pprof in {secs:.2} s ({:.0} samples/s)",
        bytes as f64 / 1e6,
        samples as f64 / secs.max(1e-9)
    );
    if duplicates > 0 {
        println!(
            "{duplicates} already stored (the same series, time and samples), not stored again"
        );
    }
    if !skipped.is_empty() {
        let names: Vec<String> = skipped.iter().map(|p| p.display().to_string()).collect();
        println!(
            "skipped {} files that are not pprof: {}",
            skipped.len(),
            names.join(", ")
        );
    }
    if !types.is_empty() {
        println!("profile types:");
        for t in &types {
            println!("  {t}");
        }
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
    let store = open_read(data)?;
    let types = store
        .profile_types(TimeRange::ALL, frostdb_pprof::ReadOptions::STRICT)?
        .value;
    if types.is_empty() {
        return Err(format!("nothing is stored in {}", data.display()).into());
    }
    for t in &types {
        println!("{t}");
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

#[derive(clap::Args)]
struct CompareArgs {
    /// The selection compared with: `type{service_name="api",version="1.4"}`.
    #[arg(long)]
    before: String,
    /// The selection compared, of the same profile type.
    #[arg(long)]
    after: String,
    /// Start of both sides' range (RFC 3339, Unix ms, or `now-1h`); default: the beginning.
    #[arg(long)]
    from: Option<String>,
    /// End of both sides' range, excluded; default: the end.
    #[arg(long)]
    to: Option<String>,
    /// Start of the before side's range, when it differs.
    #[arg(long)]
    before_from: Option<String>,
    /// End of the before side's range, when it differs.
    #[arg(long)]
    before_to: Option<String>,
    /// The rise of a share that counts (0.01: one percentage point).
    #[arg(long, default_value_t = frostdb_pprof::regress::CompareOptions::default().min_increase)]
    min_increase: f64,
    /// The false discovery rate over the comparison's tests.
    #[arg(long, default_value_t = frostdb_pprof::regress::CompareOptions::default().significance)]
    significance: f64,
    /// Profiles each side needs.
    #[arg(long, default_value_t = frostdb_pprof::regress::CompareOptions::default().min_profiles)]
    min_profiles: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Exit with status 3 when a regression is found (for a deploy pipeline).
    #[arg(long)]
    fail_on_regression: bool,
}

/// A range from optional start and end texts, given by the flags `names`.
fn time_range(
    from: Option<&str>,
    to: Option<&str>,
    names: (&str, &str),
    now: i64,
) -> Result<TimeRange, BoxError> {
    let range = TimeRange {
        start_ms: from
            .map(|t| parse_time(t, now))
            .transpose()?
            .unwrap_or(i64::MIN),
        end_ms: to
            .map(|t| parse_time(t, now))
            .transpose()?
            .unwrap_or(i64::MAX),
    };
    if range.start_ms >= range.end_ms {
        return Err(format!(
            "the range is empty: {} ({}) is not before {} ({}); is it reversed?",
            names.0,
            show_time(range.start_ms),
            names.1,
            show_time(range.end_ms)
        )
        .into());
    }
    Ok(range)
}

fn compare(data: &Path, args: CompareArgs) -> Result<ExitCode, BoxError> {
    let now = frostdb_server::time::now_ms();
    let range = time_range(
        args.from.as_deref(),
        args.to.as_deref(),
        ("--from", "--to"),
        now,
    )?;
    let before_range = match (&args.before_from, &args.before_to) {
        (None, None) => range,
        (f, t) => time_range(
            f.as_deref().or(args.from.as_deref()),
            t.as_deref().or(args.to.as_deref()),
            ("--before-from", "--before-to"),
            now,
        )?,
    };
    let options = frostdb_pprof::regress::CompareOptions {
        min_increase: args.min_increase,
        significance: args.significance,
        min_profiles: args.min_profiles,
        ..Default::default()
    };
    options.validate()?;
    let parse = |what: &str, text: &str| -> Result<Selector, BoxError> {
        let s = Selector::parse(text).map_err(|e| format!("--{what}: {e}"))?;
        if s.profile_type.is_none() {
            return Err(format!(
                "--{what} needs a profile type (name:type:unit:period_type:period_unit{{...}})"
            )
            .into());
        }
        Ok(s)
    };
    let (before, after) = (parse("before", &args.before)?, parse("after", &args.after)?);
    let store = open_read(data)?;
    let started = std::time::Instant::now();
    let read = frostdb_pprof::ReadOptions::STRICT;
    let b = store.profiles(&before, before_range, read)?;
    let a = store.profiles(&after, range, read)?;
    let found = frostdb_pprof::regress::compare(&b, &a, &options)?;
    let took = started.elapsed();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&found)?);
    } else {
        println!(
            "before: {} profiles ({} rows); after: {} profiles ({} rows); {} functions, {} rose by {} or more; {:.0} ms",
            found.before.profiles,
            b.stacks.rows,
            found.after.profiles,
            a.stacks.rows,
            found.functions,
            found.tested,
            pct(options.min_increase),
            took.as_secs_f64() * 1e3
        );
        if found.regressions.is_empty() {
            println!("no regression");
        } else {
            println!(
                "{:>9} {:>9} {:>9} {:>9} {:>9}  {:<14} function",
                "self was", "self now", "total was", "total now", "p", "kind"
            );
            for r in &found.regressions {
                println!(
                    "{:>9} {:>9} {:>9} {:>9} {:>9.1e}  {:<14} {}",
                    pct(r.self_before),
                    pct(r.self_after),
                    pct(r.total_before),
                    pct(r.total_after),
                    r.p_self.min(r.p_total),
                    r.kind,
                    frostdb_pprof::report::printable(&r.function, '\u{FFFD}')
                );
            }
        }
    }
    Ok(
        if args.fail_on_regression && !found.regressions.is_empty() {
            ExitCode::from(3)
        } else {
            ExitCode::SUCCESS
        },
    )
}

/// A share as a percentage.
fn pct(share: f64) -> String {
    format!("{:.2}%", share * 100.0)
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
    let now = frostdb_server::time::now_ms();
    let range = time_range(from.as_deref(), to.as_deref(), ("--from", "--to"), now)?;
    let store = open_read(data)?;
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
        // A selector that can never match is named with what is stored; one that matches
        // outside the range says where the data is.
        store.check_selection(&selector, range)?;
        let span = match store.time_span()? {
            Some((oldest, newest)) => format!(
                "stored profiles span {} to {}",
                show_time(oldest),
                show_time(newest)
            ),
            None => "nothing is stored".to_owned(),
        };
        return Err(format!(
            "nothing matches {} from {} to {}: {span}",
            selector_text(&selector),
            show_time(range.start_ms),
            show_time(range.end_ms)
        )
        .into());
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
                    frostdb_profile::MatchOp::Equal => "=",
                    frostdb_profile::MatchOp::NotEqual => "!=",
                    frostdb_profile::MatchOp::Regex => "=~",
                    frostdb_profile::MatchOp::NotRegex => "!~",
                },
                m.value
            )
        })
        .collect();
    format!("{t}{{{}}}", m.join(","))
}

/// A time as the CLI prints it: RFC 3339 (the open ends of a range as words).
fn show_time(ms: i64) -> String {
    match ms {
        i64::MIN => "the beginning".to_owned(),
        i64::MAX => "the end".to_owned(),
        ms => jiff::Timestamp::from_millisecond(ms)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| format!("{ms} ms")),
    }
}

/// Runs read-only SQL: what the server's SQL API refuses is refused here, with the same
/// message.
fn sql(data: &Path, q: &str) -> Result<ExitCode, BoxError> {
    use frostdb_server::query::MAX_SQL_BYTES;
    if q.trim().is_empty() {
        return Err("empty SQL".into());
    }
    if q.len() > MAX_SQL_BYTES {
        return Err(format!(
            "the SQL text has {} bytes, over the limit of {MAX_SQL_BYTES}",
            q.len()
        )
        .into());
    }
    frostdb_query::check_sql_shape(q, &frostdb_query::SqlLimits::default())?;
    let store = open_read(data)?;
    let ctx = frostdb_query::session(store.db())?;
    let batches =
        runtime()?.block_on(async { frostdb_query::read_sql(&ctx, q).await?.collect().await })?;
    println!("{}", arrow::util::pretty::pretty_format_batches(&batches)?);
    Ok(ExitCode::SUCCESS)
}

fn parse_retention(s: &str) -> Result<std::time::Duration, String> {
    match frostdb_server::time::parse_duration_ms(s)? {
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FROSTDB_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A log line that cannot be written (stderr a closed pipe, or a file on a full
        // disk) is lost, not reported with `eprintln!`, which panics: on the group commit's
        // leader that left every later push of the tenant waiting for good, and SIGTERM
        // waiting for them.
        .log_internal_errors(false)
        .init();
    let mut config = match config {
        Some(path) => frostdb_server::Config::load(&path)?,
        None => frostdb_server::Config::default(),
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
    let grace = std::time::Duration::from_secs(config.limits.shutdown_grace_secs);
    let served = runtime.block_on(frostdb_server::serve(config));
    // Blocking work still running past the grace (a long merge, a regressions pass, a flush
    // over its bound) is left behind, not waited for without end: everything acknowledged
    // is in the WAL, and the next start replays it. Dropped, the runtime waited for each.
    runtime.shutdown_timeout(grace);
    served?;
    Ok(ExitCode::SUCCESS)
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ingest {
            data,
            tenant,
            name,
            labels,
            delta,
            paths,
        } => ingest_database(&data, tenant.as_deref()).and_then(|data| {
            ingest(
                &data,
                IngestArgs {
                    name,
                    labels,
                    delta,
                },
                &paths,
            )
        }),
        Command::Types { data, tenant } => {
            database(&data, tenant.as_deref()).and_then(|data| types(&data))
        }
        Command::Query { data, tenant, args } => {
            database(&data, tenant.as_deref()).and_then(|data| query(&data, args))
        }
        Command::Compare { data, tenant, args } => {
            database(&data, tenant.as_deref()).and_then(|data| compare(&data, args))
        }
        Command::Sql {
            data,
            tenant,
            query,
        } => database(&data, tenant.as_deref()).and_then(|data| sql(&data, &query)),
        Command::Debuginfo { command } => debuginfo_upload(command),
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
