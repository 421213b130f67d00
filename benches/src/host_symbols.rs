//! `frostdb-bench symbolize`: the symbolizer over every binary this machine's processes run.
//!
//! ```text
//! frostdb-bench symbolize --work DIR [--addresses 200] [--cache-bytes N] [--workers 2]
//!                         [--under /usr/]
//!     finds every executable file mapped by a process (/proc/*/maps) that has a GNU build
//!     id, copies them under DIR/served for Debian's debuginfod, stores one profile of
//!     --addresses file offsets per binary (addresses only: no names), then names them as
//!     the server does: a cold query (every debug file fetched), the same query warm (all
//!     named, nothing resolved), and the background resolver over a second store with the
//!     cache warm. Prints JSON: what resolved from where, the cache's hits, misses and
//!     evictions, the times, and the peak memory while naming (VmHWM, reset before).
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::proto::{Location, Mapping, Profile, Sample, ValueType};
use frostdb_pprof::symbolize::{Symbolizer, SymbolizerOptions, file_build_id};
use frostdb_pprof::{IngestOptions, ProfileStore, StoreOptions, validate};
use frostdb_profile::{Selector, TimeRange};

use crate::external::BoxError;
use crate::scale::{number, rss_mib};

/// An executable file some process maps, and the file range of its code.
struct Binary {
    path: PathBuf,
    build_id: String,
    /// File offsets of its executable mappings.
    code: Vec<(u64, u64)>,
}

/// Every executable file under `under` mapped by a process now, with a GNU build id.
fn binaries(under: &str) -> Vec<Binary> {
    let mut code: BTreeMap<PathBuf, Vec<(u64, u64)>> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(maps) = std::fs::read_to_string(entry.path().join("maps")) else {
            continue;
        };
        for line in maps.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 || !f[1].contains('x') || !f[5].starts_with(under) {
                continue;
            }
            let Some((start, end)) = f[0].split_once('-') else {
                continue;
            };
            let hex = |s: &str| u64::from_str_radix(s, 16).unwrap_or(0);
            let offset = hex(f[2]);
            let range = (offset, offset + hex(end).saturating_sub(hex(start)));
            let ranges = code.entry(PathBuf::from(f[5])).or_default();
            if !ranges.contains(&range) {
                ranges.push(range);
            }
        }
    }
    code.into_iter()
        .filter_map(|(path, code)| {
            let build_id = file_build_id(&path).ok().flatten()?;
            Some(Binary {
                path,
                build_id,
                code,
            })
        })
        .collect()
}

/// A profile of `n` file offsets spread over each binary's code, one sample each: frames
/// as an eBPF sampler stores them when it has no names (a mapping at 0, its build id).
fn profile(binaries: &[Binary], n: usize) -> Profile {
    let mut p = Profile {
        string_table: vec![String::new(), "cpu".into(), "nanoseconds".into()],
        sample_type: vec![ValueType { r#type: 1, unit: 2 }],
        period_type: Some(ValueType { r#type: 1, unit: 2 }),
        period: 10_000_000,
        ..Profile::default()
    };
    for (b, binary) in binaries.iter().enumerate() {
        let id = b as u64 + 1;
        p.string_table.push(binary.path.display().to_string());
        p.string_table.push(binary.build_id.clone());
        p.mapping.push(Mapping {
            id,
            memory_start: 0,
            memory_limit: u64::MAX,
            build_id: p.string_table.len() as i64 - 1,
            filename: p.string_table.len() as i64 - 2,
            ..Mapping::default()
        });
        let total: u64 = binary.code.iter().map(|(a, b)| b - a).sum();
        for k in 0..n as u64 {
            // The k-th of n points spread over the code ranges.
            let mut at = total * k / n as u64;
            let Some(offset) = binary.code.iter().find_map(|&(from, to)| {
                if at < to - from {
                    Some(from + at)
                } else {
                    at -= to - from;
                    None
                }
            }) else {
                continue;
            };
            let location = p.location.len() as u64 + 1;
            p.location.push(Location {
                id: location,
                mapping_id: id,
                address: offset,
                ..Location::default()
            });
            p.sample.push(Sample {
                location_id: vec![location],
                value: vec![1],
                ..Sample::default()
            });
        }
    }
    p
}

/// Whether `url` answers 200 to a GET (a bare HTTP/1.0 request).
fn serves(url: &str) -> bool {
    use std::io::{Read, Write};
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let Ok(mut s) = std::net::TcpStream::connect(host) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    if write!(s, "GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}

/// A running debuginfod, killed when dropped.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn store(dir: &Path) -> Result<ProfileStore, BoxError> {
    Ok(ProfileStore::open(
        Db::open(dir, DbOptions::default())?,
        StoreOptions::default(),
    )?)
}

/// `symbolize --work DIR [--addresses N] [--cache-bytes N] [--workers N] [--under PREFIX]`.
pub fn host(args: &[String]) -> Result<(), BoxError> {
    let work = args
        .iter()
        .position(|a| a == "--work")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .ok_or("missing --work")?;
    let addresses = number(args, "--addresses", 200)?;
    let cache_bytes = number(args, "--cache-bytes", 4 << 30)? as u64;
    let workers = number(args, "--workers", 2)?;
    let _ = std::fs::remove_dir_all(&work);
    let served = work.join("served");
    std::fs::create_dir_all(&served)?;

    let under = args
        .iter()
        .position(|a| a == "--under")
        .and_then(|i| args.get(i + 1))
        .map_or("/", String::as_str);
    let binaries = binaries(under);
    if binaries.is_empty() {
        return Err(format!("no process maps an executable file under {under}").into());
    }
    let mut bytes = 0;
    for (i, b) in binaries.iter().enumerate() {
        let name = b.path.file_name().unwrap_or_default().to_string_lossy();
        let to = served.join(format!("{i}-{name}"));
        if std::fs::hard_link(&b.path, &to).is_err() {
            std::fs::copy(&b.path, &to)?;
        }
        bytes += std::fs::metadata(&to)?.len();
    }
    eprintln!(
        "{} binaries with build ids ({} MiB), indexing them with debuginfod",
        binaries.len(),
        bytes >> 20
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let _debuginfod = Server(
        std::process::Command::new("debuginfod")
            .arg("-F")
            .arg(&served)
            .arg("-d")
            .arg(work.join("debuginfod.sqlite"))
            .args(["-p", &port.to_string(), "-t", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("debuginfod: {e} (apt-get install debuginfod)"))?,
    );
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    for b in &binaries {
        while !serves(&format!("{url}/buildid/{}/executable", b.build_id)) {
            if started.elapsed() > Duration::from_secs(300) {
                return Err(format!("debuginfod did not index {}", b.path.display()).into());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    eprintln!("indexed in {:.1} s", started.elapsed().as_secs_f64());

    let mut options = SymbolizerOptions::new(work.join("cache"));
    options.debuginfod_urls = vec![url];
    options.cache_bytes = cache_bytes;
    options.workers = workers;
    let symbolizer = Arc::new(Symbolizer::new(options)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let profile = validate(profile(&binaries, addresses), &Default::default())?;
    let locations = profile.location.len();
    let ingest = |s: &ProfileStore| {
        s.ingest_profile(
            &profile,
            &IngestOptions::default()
                .name("cpu")
                .delta(false)
                .timestamp_ms(1_000),
        )
    };
    let all = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds{}")?;

    // A query first: every debug file fetched, within a budget long enough for all.
    let a = store(&work.join("store-a"))?;
    a.attach_symbolizer(symbolizer.clone(), None);
    ingest(&a)?;
    let (rss_before, _) = rss_mib();
    // Resets VmHWM to the current RSS (Linux 4.0+).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let query =
        |s: &ProfileStore| -> Result<(f64, frostdb_pprof::symbolize::ProfileSymbolized), BoxError> {
            let started = Instant::now();
            let merged = s.merge(&all, TimeRange::ALL)?;
            let named = runtime.block_on(s.name_merged(&merged, Duration::from_secs(3600)))?;
            Ok((started.elapsed().as_secs_f64() * 1e3, named))
        };
    let (cold_ms, cold) = query(&a)?;
    let (_, peak_cold) = rss_mib();
    let after_cold = symbolizer.stats();
    let (warm_ms, warm) = query(&a)?;
    // The background resolver over a second store, the cache warm.
    let b = store(&work.join("store-b"))?;
    b.attach_symbolizer(symbolizer.clone(), None);
    ingest(&b)?;
    let started = Instant::now();
    let background = runtime.block_on(b.name_pending())?;
    let background_ms = started.elapsed().as_secs_f64() * 1e3;
    let (_, peak) = rss_mib();
    let stats = symbolizer.stats();

    // Per binary: how many of its addresses got names.
    let merged = a.merge(&all, TimeRange::ALL)?;
    let mut per_binary: HashMap<String, (usize, usize)> = HashMap::new();
    for &(stack, _) in &merged.samples {
        for f in merged.symbols.frames(stack).iter().filter(|f| !f.inlined()) {
            let Some((_, m)) = f.mapping() else { continue };
            let e = per_binary.entry(m.filename.to_owned()).or_default();
            e.0 += 1;
            e.1 += usize::from(f.function().is_some());
        }
    }
    let mut named_per_binary: Vec<String> = per_binary
        .iter()
        .map(|(path, (n, named))| format!("{path}: {named}/{n}"))
        .collect();
    named_per_binary.sort();
    let report = serde_json::json!({
        "binaries": binaries.len(),
        "binary_mib": bytes >> 20,
        "locations": locations,
        "workers": workers,
        "cache_limit_mib": cache_bytes >> 20,
        "cold_query": {
            "ms": cold_ms,
            "unsymbolized": cold.unsymbolized,
            "resolved": cold.resolved,
            "missing_build_ids": cold.missing.len(),
            "files_from_debuginfod": after_cold.from_debuginfod,
            "peak_rss_mib": peak_cold,
            "rss_before_mib": rss_before,
        },
        "warm_query": {"ms": warm_ms, "unsymbolized": warm.unsymbolized, "resolved": warm.resolved},
        "background_warm_cache": {
            "ms": background_ms,
            "resolved": background.symbolized.resolved,
            "stored": background.stored,
        },
        "named_per_binary": named_per_binary,
        "symbolizer": {
            "from_debuginfod": stats.from_debuginfod,
            "not_found": stats.not_found,
            "failed_fetches": stats.failed_fetches,
            "resolved": stats.resolved,
            "cache_hits": stats.cache.hits,
            "cache_misses": stats.cache.misses,
            "cache_added": stats.cache.added,
            "cache_evictions": stats.cache.evictions,
            "cache_mib": stats.cache.bytes >> 20,
            "cache_files": stats.cache.files,
        },
        "peak_rss_mib": peak,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
