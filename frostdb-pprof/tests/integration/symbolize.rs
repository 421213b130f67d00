//! Symbolization from real components: a C program built with a build id and stripped, its
//! debug file kept apart; a profile of its addresses only is named from Debian's
//! `debuginfod` serving that file, and from the same file uploaded instead; a build id
//! nobody has stays an address; a dead debuginfod costs its timeout, once.
//!
//! Needs gcc, binutils and `debuginfod` (`scripts/test.sh` installs them).

use std::sync::Arc;
use std::time::{Duration, Instant};

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::debuginfo::DebugInfoStore;
use frostdb_pprof::proto::{Location, Mapping};
use frostdb_pprof::symbolize::{Origin, Symbolizer, SymbolizerOptions};
use frostdb_pprof::testing::stripped::{
    Built, Debuginfod, build, build_c, debuginfod, function_offsets, hot_function_offsets, names,
    profile_of,
};
use frostdb_pprof::{IngestOptions, ProfileStore, StoreOptions, validate};

/// The program built in `dir`, its `hot_function`'s file offsets, Debian's debuginfod
/// serving its files, and symbolizer options asking it (the cache in `dir/cache`).
async fn served(dir: &std::path::Path) -> (Built, Vec<u64>, Debuginfod, SymbolizerOptions) {
    let built = build(dir);
    let offsets = hot_function_offsets(&built);
    let (server, url) = debuginfod(&built.served, &dir.join("db"), &built.build_id).await;
    let mut options = SymbolizerOptions::new(dir.join("cache"));
    options.debuginfod_urls = vec![url];
    (built, offsets, server, options)
}

/// A tenant's uploads: debug files under `prefix/` of an object store on disk in `dir`.
fn uploads_in(dir: &std::path::Path, prefix: &str) -> DebugInfoStore {
    std::fs::create_dir_all(dir.join(prefix)).unwrap();
    DebugInfoStore::new(
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir).unwrap()),
        object_store::path::Path::from(prefix),
        1 << 30,
        Duration::from_secs(60),
    )
}

/// Uploads `file` to `to` under `build_id` (replacing one there with `force`).
async fn upload(to: &DebugInfoStore, build_id: &str, file: &std::path::Path, force: bool) {
    let bytes = std::fs::read(file).unwrap();
    let id = to
        .initiate(build_id, bytes.len() as i64, "sha256-of-the-file", force)
        .await
        .unwrap();
    to.upload(
        build_id,
        &id,
        futures::stream::iter([Ok(bytes::Bytes::from(bytes))]),
    )
    .await
    .unwrap();
    to.finish(build_id, &id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_programs_addresses_are_named_from_debuginfod() {
    let dir = tempfile::tempdir().unwrap();
    let (built, offsets, _server, options) = served(dir.path()).await;
    let s = std::sync::Arc::new(Symbolizer::new(options).unwrap());

    let base = 0x5555_5555_0000;
    let mut p = profile_of(&built, &offsets, base);
    // And one location of a build id nobody has.
    p.string_table.push("0badc0de".into());
    p.mapping.push(Mapping {
        id: 2,
        memory_start: 0x7000_0000,
        memory_limit: 0x7010_0000,
        build_id: p.string_table.len() as i64 - 1,
        ..Mapping::default()
    });
    p.location.push(Location {
        id: offsets.len() as u64 + 1,
        mapping_id: 2,
        address: 0x7000_1234,
        ..Location::default()
    });
    let summary = s
        .symbolize_profile(&mut p, None, Duration::from_secs(60))
        .await;
    assert_eq!(summary.unsymbolized, offsets.len() + 1);
    assert_eq!(
        summary.resolved,
        offsets.len(),
        "{summary:?} {:?}",
        s.stats()
    );
    assert_eq!(summary.missing, vec!["0badc0de".to_owned()]);
    // Every address of hot_function is named, the outermost frame hot_function, with its
    // file and a line; the inlined helper shows as a frame of its own inside it.
    for i in 0..offsets.len() {
        let n = names(&p, i);
        assert_eq!(n.last().map(String::as_str), Some("hot_function"), "{n:?}");
        let line = p.location[i].line.last().unwrap();
        let f = p
            .function
            .iter()
            .find(|f| f.id == line.function_id)
            .unwrap();
        assert!(p.string_table[f.filename as usize].ends_with("prog.c"));
        assert!(line.line > 0);
    }
    assert!(
        (0..offsets.len()).any(|i| names(&p, i) == ["inlined_helper", "hot_function"]),
        "the inlined helper is a frame of its own"
    );
    // The unknown build id stays an address, in its mapping.
    assert!(p.location.last().unwrap().line.is_empty());
    let stats = s.stats();
    assert_eq!(
        (stats.from_debuginfod, stats.not_found),
        (2, 2),
        "the debug file and the executable; the unknown build id's two"
    );

    // Again: from the cache and the remembered miss, nobody asked.
    let mut again = profile_of(&built, &offsets[..1], base);
    s.symbolize_profile(&mut again, None, Duration::from_secs(60))
        .await;
    assert_eq!(names(&again, 0), names(&p, 0));
    assert_eq!(s.stats().cache.hits, 2);
    assert_eq!(s.stats().from_debuginfod, 2);
}

#[tokio::test]
async fn uploaded_debug_info_names_the_addresses_and_a_dead_debuginfod_costs_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    let offsets = hot_function_offsets(&built);
    // The tenant's uploads, in an object store on disk: the program as linked, with its
    // symbols and DWARF (what `frostdb debuginfo upload` takes), whose own segments place
    // the file offsets.
    // Sent with its build id in upper case, as an agent may: kept under the lower case
    // the symbolizer looks up.
    let uploads = uploads_in(dir.path(), "objects");
    let sent_as = built.build_id.to_ascii_uppercase();
    upload(&uploads, &sent_as, &built.unstripped, false).await;

    // A debuginfod that accepts and never answers: asked only after the uploads, and
    // given up after its timeout when the uploads lack a build id.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut options = SymbolizerOptions::new(dir.path().join("cache"));
    options.debuginfod_urls = vec![format!("http://{}", silent.local_addr().unwrap())];
    options.fetch_timeout = Duration::from_secs(1);
    let s = std::sync::Arc::new(Symbolizer::new(options).unwrap());
    let mut p = profile_of(&built, &offsets[..4], 0x4000_0000);
    let summary = s
        .symbolize_profile(&mut p, Some(&uploads), Duration::from_secs(60))
        .await;
    assert_eq!(summary.resolved, 4, "{summary:?}");
    assert_eq!(
        names(&p, 0).last().map(String::as_str),
        Some("hot_function")
    );
    assert_eq!(s.stats().from_uploads, 1);
    let found = s.debug_file(&built.build_id, Some(&uploads)).await.unwrap();
    assert_eq!(found.map(|(_, o)| o), Some(Origin::Cache));

    let started = Instant::now();
    assert!(
        s.debug_file("0badc0de", Some(&uploads))
            .await
            .unwrap()
            .is_none()
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(20),
        "the silent server cost its timeout: {took:?}"
    );
    assert_eq!(s.stats().failed_fetches, 1);
    // A query's budget bounds it too: a profile of an unknown build id with a budget
    // shorter than the fetch timeout ends at the budget (the miss is remembered now,
    // so use another id).
    let mut unknown = profile_of(&built, &offsets[..1], 0x4000_0000);
    unknown.string_table[2] = "0badc0df".into();
    let started = Instant::now();
    let summary = s
        .symbolize_profile(&mut unknown, Some(&uploads), Duration::from_millis(200))
        .await;
    assert!(summary.out_of_budget, "{summary:?}");
    assert!(started.elapsed() < Duration::from_millis(900));
    assert!(unknown.location[0].line.is_empty());
}

/// `profile_of`'s addresses as a CPU profile: one sample per location, `i + 1` each.
fn sampled(built: &Built, offsets: &[u64], base: u64) -> frostdb_pprof::proto::Profile {
    use frostdb_pprof::proto::{Sample, ValueType};
    let mut p = profile_of(built, offsets, base);
    let cpu = p.string_table.len() as i64;
    p.string_table.push("cpu".into());
    p.string_table.push("nanoseconds".into());
    p.sample_type = vec![ValueType {
        r#type: cpu,
        unit: cpu + 1,
    }];
    p.period_type = Some(ValueType {
        r#type: cpu,
        unit: cpu + 1,
    });
    p.period = 10_000_000;
    p.sample = (0..offsets.len())
        .map(|i| Sample {
            location_id: vec![i as u64 + 1],
            value: vec![i as i64 + 1],
            ..Sample::default()
        })
        .collect();
    p
}

const CPU: &str = "cpu:cpu:nanoseconds:cpu:nanoseconds{}";

/// What a query of `selector` over every time has the store's symbolizer name.
async fn query_names(
    store: &ProfileStore,
    selector: &str,
) -> frostdb_pprof::symbolize::ProfileSymbolized {
    let selector = frostdb_profile::Selector::parse(selector).unwrap();
    let merged = store
        .merge(&selector, frostdb_profile::TimeRange::ALL)
        .unwrap();
    store
        .name_merged(&merged, Duration::from_secs(60))
        .await
        .unwrap()
}

fn open_store(dir: &std::path::Path) -> ProfileStore {
    ProfileStore::open(
        Db::open(dir, DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap()
}

fn ingest(store: &ProfileStore, p: frostdb_pprof::proto::Profile) {
    let profile = validate(p, store.limits()).unwrap();
    let options = IngestOptions::default()
        .name("cpu")
        .labels(vec![("service".into(), "prog".into())])
        .delta(false)
        .timestamp_ms(1_000);
    store.ingest_profile(&profile, &options).unwrap();
}

/// Per stack of the merge of every CPU profile: its frames' names and files, innermost
/// first, and its value.
fn merged_frames(store: &ProfileStore) -> Vec<(Vec<(String, String)>, i64)> {
    let selector = frostdb_profile::Selector::parse(CPU).unwrap();
    let merged = store
        .merge(&selector, frostdb_profile::TimeRange::ALL)
        .unwrap();
    let mut out: Vec<_> = merged
        .samples
        .iter()
        .map(|&(stack, value)| {
            let frames = merged
                .symbols
                .frames(stack)
                .iter()
                .map(|f| (f.display_name().into_owned(), f.filename().to_owned()))
                .collect();
            (frames, value)
        })
        .collect();
    out.sort_by_key(|(_, v)| *v);
    out
}

/// Whether every stack of `frames` is named `hot_function` outermost, with a source file
/// when `files`.
fn all_hot(frames: &[(Vec<(String, String)>, i64)], files: bool) -> bool {
    frames.iter().all(|(f, _)| {
        f.last().is_some_and(|(name, file)| {
            name == "hot_function" && (file.ends_with("prog.c") == files)
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_are_named_in_the_background_stored_and_read_back_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (built, offsets, _server, options) = served(dir.path()).await;
    let s = Arc::new(Symbolizer::new(options).unwrap());
    let data = dir.path().join("data");
    let store = open_store(&data);
    assert!(store.attach_symbolizer(s.clone(), None));
    assert!(
        !store.attach_symbolizer(s.clone(), None),
        "one symbolizer a store"
    );
    ingest(&store, sampled(&built, &offsets, 0x5555_0000_0000));
    // Ingest stored addresses and went on; the names come from the background pass.
    assert!(!all_hot(&merged_frames(&store), true));
    let pass = store.name_pending().await.unwrap();
    assert_eq!(pass.symbolized.unsymbolized, offsets.len(), "{pass:?}");
    assert_eq!(pass.symbolized.resolved, offsets.len(), "{pass:?}");
    assert_eq!(pass.stored, offsets.len());
    let named = merged_frames(&store);
    assert!(all_hot(&named, true), "{named:?}");
    // Nothing left for the next pass.
    let again = store.name_pending().await.unwrap();
    assert_eq!(again.symbolized.unsymbolized, 0, "{again:?}");
    store.db().flush().unwrap();
    drop(store);

    // Reopened without any symbolizer: the names are read from the names table.
    let store = open_store(&data);
    let reread = merged_frames(&store);
    assert_eq!(reread, named, "the names stored survive a restart");
    drop(store);
    // And closed without a flush: the names come back from the WAL.
    let data2 = dir.path().join("data2");
    let store = open_store(&data2);
    store.attach_symbolizer(s.clone(), None);
    ingest(&store, sampled(&built, &offsets[..8], 0x5555_0000_0000));
    assert_eq!(store.name_pending().await.unwrap().stored, 8);
    drop(store);
    let store = open_store(&data2);
    assert!(all_hot(&merged_frames(&store), true));
}

/// A debug file is walked by the DWARF check once (the verdict is kept while the file is
/// the same), and a store's background resolver reads one file at most once every
/// `BACKGROUND_REREAD`: a push of one new address after another does not parse the file
/// again each time (what comes meanwhile is named by queries, or a later pass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debug_file_is_checked_once_and_read_by_the_background_at_a_bounded_rate() {
    let dir = tempfile::tempdir().unwrap();
    let (built, offsets, _server, options) = served(dir.path()).await;
    let s = Arc::new(Symbolizer::new(options).unwrap());
    let store = open_store(&dir.path().join("data"));
    assert!(store.attach_symbolizer(s.clone(), None));
    let half = offsets.len() / 2;
    ingest(&store, sampled(&built, &offsets[..half], 0x5555_0000_0000));
    let first = store.name_pending().await.unwrap();
    assert_eq!(first.symbolized.resolved, half, "{first:?}");
    let after_first = s.stats();
    assert_eq!((after_first.files_checked, after_first.files_read), (1, 1));
    // New addresses of the same file at once: the background leaves them for later.
    ingest(&store, sampled(&built, &offsets[half..], 0x5555_0000_0000));
    let second = store.name_pending().await.unwrap();
    assert!(second.symbolized.out_of_budget, "{second:?}");
    assert_eq!(second.symbolized.resolved, 0, "{second:?}");
    assert_eq!(s.stats().files_read, 1);
    // A query names them now, reading the file again without checking it again.
    let selector = frostdb_profile::Selector::parse(CPU).unwrap();
    let merged = store
        .merge(&selector, frostdb_profile::TimeRange::ALL)
        .unwrap();
    let named = s
        .symbolize_merged(&merged, None, std::time::Duration::from_secs(30), None)
        .await;
    assert_eq!(named.resolved, offsets.len() - half, "{named:?}");
    let after = s.stats();
    assert_eq!((after.files_checked, after.files_read), (1, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_never_waits_for_a_debuginfod_that_does_not_answer() {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    let offsets = hot_function_offsets(&built);
    // Accepts connections, never answers: a fetch would wait its whole (hour-long) timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut options = SymbolizerOptions::new(dir.path().join("cache"));
    options.debuginfod_urls = vec![format!("http://{}", silent.local_addr().unwrap())];
    options.fetch_timeout = Duration::from_secs(3600);
    let store = Arc::new(open_store(&dir.path().join("data")));
    store.attach_symbolizer(Arc::new(Symbolizer::new(options).unwrap()), None);
    ingest(&store, sampled(&built, &offsets[..4], 0x4000_0000));
    // The background pass hangs on the silent server...
    let background = {
        let store = store.clone();
        tokio::spawn(async move { store.name_pending().await })
    };
    // ...while ingest goes on: the next profiles are stored and queried as addresses.
    for round in 0..3 {
        let store2 = store.clone();
        let p = sampled(&built, &offsets[4 + round..5 + round], 0x4000_0000);
        tokio::task::spawn_blocking(move || ingest(&store2, p))
            .await
            .unwrap();
    }
    assert_eq!(merged_frames(&store).len(), 7);
    assert!(!background.is_finished());
    background.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_info_uploaded_later_names_again_what_a_symbol_table_named() {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    let offsets = hot_function_offsets(&built);
    let uploads = uploads_in(dir.path(), "objects");
    // First the program with its symbol table and no DWARF (`strip --strip-debug`).
    let symbols_only = dir.path().join("prog.symtab");
    let status = std::process::Command::new("strip")
        .arg("--strip-debug")
        .arg(&built.unstripped)
        .arg("-o")
        .arg(&symbols_only)
        .status()
        .unwrap();
    assert!(status.success());
    upload(&uploads, &built.build_id, &symbols_only, false).await;

    let mut options = SymbolizerOptions::new(dir.path().join("cache"));
    options.debuginfod_urls = Vec::new();
    let symbolizer = Arc::new(Symbolizer::new(options).unwrap());
    let store = open_store(&dir.path().join("data"));
    store.attach_symbolizer(symbolizer.clone(), Some(uploads.clone()));
    ingest(&store, sampled(&built, &offsets, 0x5555_0000_0000));
    let first = store.name_pending().await.unwrap();
    assert_eq!(first.symbolized.resolved, offsets.len(), "{first:?}");
    let named = merged_frames(&store);
    assert!(all_hot(&named, false), "names, no files: {named:?}");
    // The partition leaves memory: on disk only, with its names.
    store.db().flush().unwrap();
    drop(store);
    let store = open_store(&dir.path().join("data"));
    store.attach_symbolizer(symbolizer, Some(uploads.clone()));

    // Then the program as linked, DWARF in it: the same frames named again, with files,
    // lines and the inlined helper, found on disk through the mappings of the build id.
    upload(&uploads, &built.build_id, &built.unstripped, true).await;
    store.name_again(&built.build_id);
    let second = store.name_pending().await.unwrap();
    assert_eq!(second.symbolized.resolved, offsets.len(), "{second:?}");
    let renamed = merged_frames(&store);
    assert!(all_hot(&renamed, true), "{renamed:?}");
    assert!(
        renamed
            .iter()
            .any(|(f, _)| f.first().is_some_and(|(n, _)| n == "inlined_helper"))
    );
    // A third pass finds nothing better to do.
    store.name_again(&built.build_id);
    assert_eq!(store.name_pending().await.unwrap().symbolized.resolved, 0);
    // Read back, the better names win over the first ones stored.
    store.db().flush().unwrap();
    drop(store);
    let store = open_store(&dir.path().join("data"));
    assert_eq!(merged_frames(&store), renamed);
}

/// Per profile type, the display names of the merged stacks' frames, innermost first.
fn every_frame(store: &ProfileStore) -> Vec<(String, Vec<Vec<String>>)> {
    let types = store
        .profile_types(frostdb_profile::TimeRange::ALL, Default::default())
        .unwrap()
        .value;
    types
        .iter()
        .map(|t| {
            let selector = frostdb_profile::Selector::parse(&format!("{t}{{}}")).unwrap();
            let merged = store
                .merge(&selector, frostdb_profile::TimeRange::ALL)
                .unwrap();
            let mut stacks: Vec<Vec<String>> = merged
                .samples
                .iter()
                .map(|&(stack, _)| {
                    merged
                        .symbols
                        .frames(stack)
                        .iter()
                        .map(|f| f.display_name().into_owned())
                        .collect()
                })
                .collect();
            stacks.sort();
            (t.to_string(), stacks)
        })
        .collect()
}

/// The unsymbolized profiles of shared/testdata (Parca's stripped Go CPU profile, the
/// OpenTelemetry eBPF profiler's export with native frames of libc and GLib) with no debug
/// info for their build ids anywhere: each build id of a mapping with unnamed frames is
/// asked of a real debuginfod once, missed, and the frames stay addresses in their binaries
/// (`0x7a9a1 [libc.so.6]`), every report as before. Their debug files are not to be had on
/// this machine; that the same path names frames whose debug info exists is what the tests
/// above check with a program built here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_unsymbolized_profiles_stay_addresses_without_their_debug_info() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, _server, options) = served(dir.path()).await;
    let symbolizer = Arc::new(Symbolizer::new(options).unwrap());
    let store = open_store(&dir.path().join("data"));
    store.attach_symbolizer(symbolizer.clone(), None);
    let testdata = frostdb_pprof::testing::shared_dir().join("testdata");

    let pprof = std::fs::read(testdata.join("pprof/parca__go-cpu-unsymbolized.pb.gz")).unwrap();
    let options = IngestOptions::default()
        .name("process_cpu")
        .labels(vec![("service".into(), "parca".into())]);
    store.ingest(&pprof, &options).unwrap();
    let otlp = std::fs::read(
        testdata.join("otlp/pyroscope__otel-ebpf-profile.ExportProfilesServiceRequest.pb"),
    )
    .unwrap();
    let request = frostdb_pprof::convert::otlp::parse(&otlp, &Default::default()).unwrap();
    let converted = frostdb_pprof::convert::otlp::convert(&request, store.limits()).unwrap();
    // The build ids of mappings whose frames have no names: what must be asked for.
    let mut wanted = std::collections::BTreeSet::new();
    let decoded = frostdb_pprof::decode(&pprof, store.limits()).unwrap();
    for c in converted.iter().map(|c| &c.profile).chain([&decoded]) {
        let p: &frostdb_pprof::proto::Profile = c;
        for l in p.location.iter().filter(|l| l.line.is_empty()) {
            if let Some(m) = p.mapping.iter().find(|m| m.id == l.mapping_id) {
                let id = &p.string_table[m.build_id as usize];
                if !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()) {
                    wanted.insert(id.clone());
                }
            }
        }
    }
    for c in &converted {
        let options = IngestOptions::default()
            .name(c.name.clone())
            .labels(c.labels.clone());
        store.ingest_profile(&c.profile, &options).unwrap();
    }
    assert!(wanted.len() >= 5, "libc, GLib and friends: {wanted:?}");
    let before = every_frame(&store);
    let pass = store.name_pending().await.unwrap();
    assert_eq!(pass.symbolized.resolved, 0, "{pass:?}");
    let missing: std::collections::BTreeSet<String> =
        pass.symbolized.missing.iter().cloned().collect();
    assert_eq!(missing, wanted, "each build id asked once and missed");
    assert_eq!(symbolizer.stats().resolved, 0);
    // Every report as before: the frames are addresses in their binaries.
    let after = every_frame(&store);
    assert_eq!(after, before);
    assert!(
        after
            .iter()
            .flat_map(|(_, stacks)| stacks.iter().flatten())
            .any(|name| name.starts_with("0x") && name.ends_with("[libc.so.6]")),
        "{after:?}"
    );
    // A query asks nothing again: the misses are remembered.
    let asked = symbolizer.stats().not_found;
    query_names(&store, &format!("{}{{}}", before[0].0)).await;
    assert_eq!(symbolizer.stats().not_found, asked);
}

/// What cannot be named is not asked again by every query: an address its debug file has
/// no symbol for (the ELF header), and a file larger than the whole cache (refused while it
/// streams in, then remembered as a miss, not fetched by every query).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_named_is_asked_once() {
    let dir = tempfile::tempdir().unwrap();
    let (built, offsets, _server, options) = served(dir.path()).await;
    let url = options.debuginfod_urls[0].clone();
    let query = async |store: &ProfileStore| query_names(store, CPU).await;

    let store = open_store(&dir.path().join("data"));
    store.attach_symbolizer(Arc::new(Symbolizer::new(options).unwrap()), None);
    ingest(&store, sampled(&built, &[offsets[0], 1], 0x5555_0000_0000));
    let first = query(&store).await;
    assert_eq!((first.unsymbolized, first.resolved), (2, 1), "{first:?}");
    let second = query(&store).await;
    assert_eq!(second.unsymbolized, 0, "{second:?}");

    let mut options = SymbolizerOptions::new(dir.path().join("small-cache"));
    options.debuginfod_urls = vec![url];
    options.cache_bytes = 1_000;
    let s = Arc::new(Symbolizer::new(options).unwrap());
    let store = open_store(&dir.path().join("data2"));
    store.attach_symbolizer(s.clone(), None);
    ingest(&store, sampled(&built, &offsets[..2], 0x5555_0000_0000));
    let first = query(&store).await;
    assert_eq!(first.resolved, 0, "{first:?}");
    assert_eq!(first.missing, vec![built.build_id.clone()]);
    let fetched = (s.stats().failed_fetches, s.stats().from_debuginfod);
    assert!(fetched.0 >= 1, "{:?}", s.stats());
    query(&store).await;
    assert_eq!(
        (s.stats().failed_fetches, s.stats().from_debuginfod),
        fetched,
        "asked once"
    );
    assert!(s.stats().remembered_misses >= 1);
}

/// A file one tenant uploaded never names another tenant's frames, though the symbolizer
/// and its cache are shared (a build id is a note anybody can write into an ELF file), and
/// one tenant's miss never hides another tenant's upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_upload_never_names_another_tenants_frames() {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    let offsets = hot_function_offsets(&built);
    let (a_uploads, b_uploads) = (uploads_in(dir.path(), "a"), uploads_in(dir.path(), "b"));
    assert_ne!(a_uploads.scope(), b_uploads.scope());
    upload(&a_uploads, &built.build_id, &built.unstripped, false).await;
    let mut options = SymbolizerOptions::new(dir.path().join("cache"));
    options.debuginfod_urls = Vec::new();
    let s = Arc::new(Symbolizer::new(options).unwrap());
    let (a, b) = (
        open_store(&dir.path().join("data-a")),
        open_store(&dir.path().join("data-b")),
    );
    a.attach_symbolizer(s.clone(), Some(a_uploads));
    b.attach_symbolizer(s.clone(), Some(b_uploads.clone()));
    for store in [&a, &b] {
        ingest(store, sampled(&built, &offsets[..4], 0x5555_0000_0000));
    }
    // B first: nothing of its own, a miss.
    assert_eq!(b.name_pending().await.unwrap().symbolized.resolved, 0);
    // A: named from its upload, which B's miss did not hide.
    assert_eq!(a.name_pending().await.unwrap().symbolized.resolved, 4);
    assert!(all_hot(&merged_frames(&a), true));
    // B again, by a query, with A's file in the cache: still addresses.
    let by_query = query_names(&b, CPU).await;
    assert_eq!(by_query.resolved, 0, "{by_query:?}");
    assert!(
        merged_frames(&b)
            .iter()
            .all(|(f, _)| f[0].0.starts_with("0x"))
    );
    // Until B uploads it too.
    upload(&b_uploads, &built.build_id, &built.unstripped, false).await;
    b.name_again(&built.build_id);
    assert_eq!(b.name_pending().await.unwrap().symbolized.resolved, 4);
    assert!(all_hot(&merged_frames(&b), true));
}

/// Reading a debug file reserves its size from the process's memory budget first: while
/// the budget cannot take it, the background pass leaves its frames addresses and walks
/// them again next pass, rather than reading past the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debug_file_is_read_only_within_the_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (built, offsets, _server, mut options) = served(dir.path()).await;
    let budget = frostdb_core::MemoryBudget::new(64 << 20);
    options.memory_budget = Some(budget.clone());
    let store = open_store(&dir.path().join("data"));
    store.attach_symbolizer(Arc::new(Symbolizer::new(options).unwrap()), None);
    ingest(&store, sampled(&built, &offsets[..4], 0x5555_0000_0000));
    // Something else holds all but a few bytes of the budget.
    let hog = budget.try_reserve((64 << 20) - 100, "the rest").unwrap();
    let refused = store.name_pending().await.unwrap();
    assert!(refused.symbolized.out_of_budget, "{refused:?}");
    assert_eq!(refused.symbolized.resolved, 0);
    assert!(
        merged_frames(&store)
            .iter()
            .all(|(f, _)| f[0].0.starts_with("0x"))
    );
    drop(hog);
    // The next pass walks them again.
    let named = store.name_pending().await.unwrap();
    assert_eq!(named.symbolized.resolved, 4, "{named:?}");
    assert!(all_hot(&merged_frames(&store), true));
}

/// A store with a budget of its own (a server's tenant, whose store holds its share of the
/// server's budget) is charged the debug files read for it there, not in the symbolizer's
/// whole budget: a tenant whose share is spent cannot have files read that take the room
/// every other tenant shares, while another tenant's files are still read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stores_debug_files_are_read_within_its_own_share_of_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (built, offsets, _server, mut options) = served(dir.path()).await;
    let budget = frostdb_core::MemoryBudget::new(64 << 20);
    options.memory_budget = Some(budget.clone());
    let symbolizer = Arc::new(Symbolizer::new(options).unwrap());
    let share = |tenant: &str| budget.share(tenant, || format!("tenant {tenant:?}"), 48 << 20);
    let open = |name: &str, share: &frostdb_core::MemoryBudget| {
        let store = ProfileStore::open(
            Db::open(dir.path().join(name), DbOptions::default()).unwrap(),
            StoreOptions::default().memory_budget(share.clone()),
        )
        .unwrap();
        store.attach_symbolizer(symbolizer.clone(), None);
        ingest(&store, sampled(&built, &offsets[..4], 0x5555_0000_0000));
        store
    };
    let (a_share, b_share) = (share("a"), share("b"));
    let (a, b) = (open("data-a", &a_share), open("data-b", &b_share));
    let selector = frostdb_profile::Selector::parse(CPU).unwrap();
    let a_merged = a.merge(&selector, frostdb_profile::TimeRange::ALL).unwrap();
    // Tenant a's other work holds all but a few bytes of its share; the whole budget has
    // 16 MiB free, more than the file needs.
    let hog = a_share
        .try_reserve((48 << 20) - 100, "a's other work")
        .unwrap();
    assert!(budget.free() >= 16 << 20);
    let refused = a.name_pending().await.unwrap();
    assert!(refused.symbolized.out_of_budget, "{refused:?}");
    assert_eq!(refused.symbolized.resolved, 0);
    let by_query = a
        .name_merged(&a_merged, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(by_query.out_of_budget, "{by_query:?}");
    assert_eq!(
        by_query.resolved, 0,
        "a query of a's is charged to a's share too"
    );
    // Tenant b's are read, in the room a's share left.
    let named = b.name_pending().await.unwrap();
    assert_eq!(named.symbolized.resolved, 4, "{named:?}");
    assert!(all_hot(&merged_frames(&b), true));
    drop(hog);
    assert!(
        merged_frames(&a)
            .iter()
            .all(|(f, _)| f[0].0.starts_with("0x")),
        "nothing of a's was named while its share was spent"
    );
    let named = a.name_pending().await.unwrap();
    assert_eq!(named.symbolized.resolved, 4, "{named:?}");
    assert!(all_hot(&merged_frames(&a), true));
}

/// A debug file that needs more memory to read than the whole budget holds is not waited
/// for: it would never fit, and waiting for it held up every build id after it, pass after
/// pass. It is reported as too large, its frames stay addresses, and the pass is not
/// left for later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debug_file_larger_than_the_whole_budget_is_reported_not_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let (built, offsets, _server, mut options) = served(dir.path()).await;
    let size = std::fs::metadata(&built.debug).unwrap().len() as usize;
    options.memory_budget = Some(frostdb_core::MemoryBudget::new(size / 2));
    let store = open_store(&dir.path().join("data"));
    store.attach_symbolizer(Arc::new(Symbolizer::new(options).unwrap()), None);
    ingest(&store, sampled(&built, &offsets[..4], 0x5555_0000_0000));
    let pass = store.name_pending().await.unwrap();
    assert!(!pass.symbolized.out_of_budget, "{pass:?}");
    assert_eq!(pass.symbolized.too_large, vec![built.build_id.clone()]);
    assert_eq!(pass.symbolized.resolved, 0);
    assert!(
        merged_frames(&store)
            .iter()
            .all(|(f, _)| f[0].0.starts_with("0x"))
    );
}

/// C++ names come back demangled: a stripped C++ program's member function, in a
/// namespace and overloaded, is named `shapes::Circle::area(int)`, not its symbol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpp_names_are_demangled() {
    let dir = tempfile::tempdir().unwrap();
    let built = frostdb_pprof::testing::stripped::build_cpp(dir.path());
    let offsets = frostdb_pprof::testing::stripped::function_offsets(
        &built,
        frostdb_pprof::testing::stripped::CPP_FUNCTION,
    );
    let (_server, url) = debuginfod(&built.served, &dir.path().join("db"), &built.build_id).await;
    let mut options = SymbolizerOptions::new(dir.path().join("cache"));
    options.debuginfod_urls = vec![url];
    let s = Arc::new(Symbolizer::new(options).unwrap());
    let mut p = profile_of(&built, &offsets[..4], 0x5555_0000_0000);
    let summary = s
        .symbolize_profile(&mut p, None, Duration::from_secs(60))
        .await;
    assert_eq!(summary.resolved, 4, "{summary:?}");
    for i in 0..4 {
        assert_eq!(
            names(&p, i).last().map(String::as_str),
            Some("shapes::Circle::area(int)")
        );
    }
}

/// A C program whose `entry` inlines a chain of `depth` always-inline functions, each
/// calling the next: its DWARF nests `depth` inlined subroutines in `entry`.
fn inlined_chain(depth: usize) -> String {
    let mut c = String::from(
        "volatile int sink;\n\
         static inline __attribute__((always_inline)) int f0(int x) { sink += x; return x * 3 + 1; }\n",
    );
    for k in 1..=depth {
        c.push_str(&format!(
            "static inline __attribute__((always_inline)) int f{k}(int x) \
             {{ int y = f{}(x + {k}); sink += y; return y ^ x; }}\n",
            k - 1
        ));
    }
    c.push_str(&format!(
        "__attribute__((noinline)) int entry(int x) {{ return f{depth}(x); }}\n\
         int main(int argc, char **argv) {{ (void)argv; return entry(argc) & 1; }}\n"
    ));
    c
}

/// A debug file whose inlined calls nest deeper than the reader's limit is not read (its
/// addresses stay unnamed: read, a hostile file nesting them a hundred thousand deep would
/// overflow the reading thread's stack and abort the server), and one within it is read
/// whole, every inlined frame named.
#[test]
fn a_debug_file_nesting_inlined_calls_too_deep_is_not_read() {
    for (depth, read) in [(40, true), (300, false)] {
        let dir = tempfile::tempdir().unwrap();
        let built = build_c(dir.path(), &inlined_chain(depth));
        let s = Symbolizer::new(SymbolizerOptions::new(dir.path().join("cache"))).unwrap();
        let frames = s.resolve(&built.unstripped, &function_offsets(&built, "entry"));
        let deepest = frames.iter().map(Vec::len).max().unwrap_or(0);
        if read {
            assert!(deepest > depth, "{depth} inlined calls, {deepest} frames");
            assert!(frames.iter().flatten().any(|f| f.function == "f0"));
        } else {
            assert_eq!(deepest, 0, "a file nesting {depth} inlined calls was read");
        }
    }
}

/// A C program whose `name`d function holds `code_bytes` of code (an address each), and
/// `aliases` more names for it.
fn one_long_function(name: &str, code_bytes: usize, aliases: usize) -> String {
    let mut c = format!(
        "__attribute__((noinline)) int {name}(int x) \
         {{ __asm__ volatile(\".fill {code_bytes}, 1, 0x90\"); return x + 1; }}\n"
    );
    for i in 0..aliases {
        c.push_str(&format!(
            "int alias{i}(int) __attribute__((alias(\"{name}\")));\n"
        ));
    }
    c.push_str(&format!(
        "int main(int argc, char **argv) {{ (void)argv; return {name}(argc) & 1; }}\n"
    ));
    c
}

/// A symbol's name is copied for every address named by it: one function of a 200 KB name
/// and 2,000 addresses in it made 400 MB of frames, and three times that in the store,
/// counted nowhere (an uploaded file of one 2 MiB name took a server to 5 GB from an
/// 18 KB profile). A name is cut to what a profile's frame may hold, and the frames are
/// charged to the budget as they are made: past it, the rest stay addresses for a later
/// pass, and the budget is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_symbol_name_is_cut_and_its_copies_are_charged() {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("f{}", "x".repeat(200_000));
    let built = build_c(dir.path(), &one_long_function(&name, 3_000, 0));
    let offsets = function_offsets(&built, &name);
    assert!(offsets.len() >= 2_000, "{} addresses", offsets.len());
    let most = frostdb_pprof::convert::trie::MAX_FRAME_BYTES;
    let s = Symbolizer::new(SymbolizerOptions::new(dir.path().join("direct"))).unwrap();
    let frames = s.resolve(&built.unstripped, &offsets[..3]);
    for f in frames.iter().flatten() {
        assert!(
            f.function.len() <= most && f.function.starts_with("fxxx"),
            "{}",
            f.function.len()
        );
    }
    assert_eq!(frames.iter().flatten().count(), 3);

    let (_server, url) = debuginfod(&built.served, &dir.path().join("db"), &built.build_id).await;
    let mut options = SymbolizerOptions::new(dir.path().join("cache"));
    options.debuginfod_urls = vec![url];
    let budget = frostdb_core::MemoryBudget::new(64 << 20);
    options.memory_budget = Some(budget.clone());
    let store = open_store(&dir.path().join("data"));
    store.attach_symbolizer(Arc::new(Symbolizer::new(options).unwrap()), None);
    ingest(&store, sampled(&built, &offsets[..2_000], 0x5555_0000_0000));
    let named = store.name_pending().await.unwrap().symbolized;
    assert!(named.out_of_budget, "{named:?}");
    assert!(
        named.resolved > 0 && named.resolved < 2_000,
        "{} of 2,000 addresses named under a 64 MiB budget",
        named.resolved
    );
    assert_eq!(
        budget.reserved(),
        0,
        "the frames' memory was not given back"
    );
    let frames = merged_frames(&store);
    let cut = frames
        .iter()
        .flat_map(|(f, _)| f)
        .filter(|(n, _)| n.starts_with("fxxx"));
    assert!(cut.clone().count() >= named.resolved);
    assert!(cut.clone().all(|(n, _)| n.len() <= most));
    // The others are still addresses, asked again later.
    assert!(frames.iter().any(|(f, _)| f[0].0.starts_with("0x")));
}

/// A C++ function taking nested templates, as g++ mangles it: 190 bytes whose back
/// references demangle to 6.5 GB at 14 levels of four arguments (`f(P<P<P<…>, …>, …>)`;
/// 408 MB in 48 s at 12), which blazesym's demangling wrote whole before the name was cut.
/// The demangling stops at the most a frame's name may hold. (Built without DWARF, which
/// would name the types whole: the symbol table names the function.) Ordinary C++ and Rust
/// names demangle as before.
#[test]
fn a_name_demangling_to_gigabytes_is_cut_as_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut program = String::from(
        "template<class A, class B, class C, class D> struct P {};\n\
         typedef P<int, int, int, int> T0;\n",
    );
    for i in 1..=14 {
        let t = format!("T{}", i - 1);
        program.push_str(&format!("typedef P<{t}, {t}, {t}, {t}> T{i};\n"));
    }
    program.push_str(
        "__attribute__((noinline)) int f(T14) { __asm__ volatile(\".fill 64, 1, 0x90\"); return 1; }\n\
         int main() { return f(T14()); }\n",
    );
    let source = dir.path().join("prog.cc");
    std::fs::write(&source, program).unwrap();
    let exe = dir.path().join("prog");
    let built = std::process::Command::new("g++")
        .args(["-O1", "-g0", "-o"])
        .arg(&exe)
        .arg(&source)
        .status()
        .unwrap();
    assert!(built.success());
    let symbols = std::process::Command::new("nm").arg(&exe).output().unwrap();
    let mangled = String::from_utf8_lossy(&symbols.stdout)
        .lines()
        .find_map(|l| {
            l.split_whitespace()
                .last()
                .filter(|n| n.starts_with("_Z1f"))
                .map(str::to_owned)
        })
        .expect("f's symbol");
    assert!(mangled.len() < 400, "{mangled}");
    let most = frostdb_pprof::symbolize::MAX_NAME_BYTES;
    let name = frostdb_pprof::symbolize::demangle(&mangled);
    assert!(
        name.starts_with("f(P<P<P<") && name.len() <= most,
        "{}",
        name.len()
    );
    let built = Built {
        binary: exe.clone(),
        debug: exe.clone(),
        unstripped: exe.clone(),
        build_id: String::new(),
        served: dir.path().to_path_buf(),
    };
    let s = Symbolizer::new(SymbolizerOptions::new(dir.path().join("cache"))).unwrap();
    let frames = s.resolve(&exe, &function_offsets(&built, &mangled)[..4]);
    let names: Vec<&str> = frames
        .iter()
        .flatten()
        .map(|f| f.function.as_str())
        .collect();
    assert_eq!(names.len(), 4, "{} frames", names.len());
    for name in names {
        assert!(
            name.starts_with("f(P<P<P<") && name.len() <= most,
            "{}",
            name.len()
        );
    }
    let demangle = frostdb_pprof::symbolize::demangle;
    assert_eq!(
        demangle("_ZN6shapes6Circle4areaEi"),
        "shapes::Circle::area(int)"
    );
    assert_eq!(
        demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
        "core::fmt::write"
    );
    assert_eq!(demangle("main"), "main");
}

/// blazesym looks an address up by walking every symbol at the address it lands on: a
/// file of a million symbols at one address took 4 ms an address, minutes a profile, on
/// one of the few workers every tenant shares. A file with more than
/// `MAX_SYMBOLS_AT_ONE_ADDRESS` symbols at one address is not read; one with a few aliases
/// is.
#[test]
fn a_file_of_many_symbols_at_one_address_is_not_read() {
    for (aliases, read) in [(20, true), (400, false)] {
        let dir = tempfile::tempdir().unwrap();
        let built = build_c(dir.path(), &one_long_function("entry", 64, aliases));
        let s = Symbolizer::new(SymbolizerOptions::new(dir.path().join("cache"))).unwrap();
        let frames = s.resolve(&built.unstripped, &function_offsets(&built, "entry"));
        let named = frames.iter().filter(|f| !f.is_empty()).count();
        assert_eq!(
            named > 0,
            read,
            "{aliases} aliases: {named} addresses named"
        );
    }
}

/// Uploads begun at once are checked against the quota one at a time: of eight begun
/// together, 1 MiB each under a 3 MiB quota, three begin and five are refused. Checked
/// together, each saw the others' uploads unrecorded, and all eight began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_begun_at_once_are_checked_against_the_quota_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(uploads_in(dir.path(), "t").with_quota(3 << 20));
    let begun = futures::future::join_all((0..8).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .initiate(&format!("aaaa000{i}"), 1 << 20, "h", false)
                .await
        })
    }))
    .await;
    let (begun, refused): (Vec<_>, Vec<_>) = begun
        .into_iter()
        .map(|r| r.unwrap())
        .partition(|r| r.is_ok());
    assert_eq!(begun.len(), 3, "{refused:?}");
    for r in refused {
        assert!(
            matches!(r, Err(frostdb_pprof::debuginfo::Error::Quota(_))),
            "{r:?}"
        );
    }
}

/// An object store that counts the multipart uploads aborted in it (S3 keeps, and bills,
/// the parts of an upload neither completed nor aborted), and fails or stalls them on
/// command ([`UploadFaults`]).
#[derive(Debug)]
struct CountsAborts {
    inner: Arc<dyn object_store::ObjectStore>,
    faults: Arc<UploadFaults>,
}

/// What the multipart uploads of a [`CountsAborts`] did, and are to do: the `fail_part`th
/// part sent fails (counted from 1; 0: none), and with `stall_completion` a completion
/// never returns, once `completing` is set.
#[derive(Debug, Default)]
struct UploadFaults {
    aborted: std::sync::atomic::AtomicUsize,
    fail_part: std::sync::atomic::AtomicUsize,
    stall_completion: std::sync::atomic::AtomicBool,
    completing: std::sync::atomic::AtomicBool,
}

impl CountsAborts {
    fn over(dir: &std::path::Path) -> Self {
        Self {
            inner: Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir).unwrap()),
            faults: Arc::default(),
        }
    }
}

impl std::fmt::Display for CountsAborts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CountsAborts({})", self.inner)
    }
}

#[derive(Debug)]
struct AbortCounted {
    inner: Box<dyn object_store::MultipartUpload>,
    faults: Arc<UploadFaults>,
    parts: usize,
}

#[async_trait::async_trait]
impl object_store::MultipartUpload for AbortCounted {
    fn put_part(&mut self, data: object_store::PutPayload) -> object_store::UploadPart {
        self.parts += 1;
        if self.parts
            == self
                .faults
                .fail_part
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Box::pin(async {
                Err(object_store::Error::Generic {
                    store: "CountsAborts",
                    source: "injected: a part failed".into(),
                })
            });
        }
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> object_store::Result<object_store::PutResult> {
        use std::sync::atomic::Ordering::SeqCst;
        self.faults.completing.store(true, SeqCst);
        if self.faults.stall_completion.load(SeqCst) {
            futures::future::pending::<()>().await;
        }
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.faults
            .aborted
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.abort().await
    }
}

#[async_trait::async_trait]
impl object_store::ObjectStore for CountsAborts {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        Ok(Box::new(AbortCounted {
            inner: self.inner.put_multipart_opts(location, opts).await?,
            faults: self.faults.clone(),
            parts: 0,
        }))
    }

    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<
            'static,
            object_store::Result<object_store::path::Path>,
        >,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A debug info store over `bucket`, and an upload of [`PARTS_BUILD_ID`] begun in it,
/// announced at 10 MiB: past one part of an upload.
async fn begun_past_a_part(
    dir: &std::path::Path,
    bucket: CountsAborts,
) -> (DebugInfoStore, String) {
    std::fs::create_dir_all(dir.join("t")).unwrap();
    let store = DebugInfoStore::new(
        Arc::new(bucket),
        object_store::path::Path::from("t"),
        1 << 30,
        Duration::from_secs(60),
    )
    .with_quota(32 << 20);
    let id = store
        .initiate(PARTS_BUILD_ID, 10 << 20, "h", false)
        .await
        .unwrap();
    (store, id)
}

const PARTS_BUILD_ID: &str = "aaaa0001";

/// The ELF magic, then 9 MiB: one part sent while the body streams, the rest at the end.
fn past_a_part()
-> impl futures::Stream<Item = Result<bytes::Bytes, frostdb_pprof::debuginfo::Error>> {
    futures::stream::iter([
        Ok(bytes::Bytes::from_static(b"\x7fELF\x02\x01\x01")),
        Ok(bytes::Bytes::from(vec![0u8; 9 << 20])),
    ])
}

/// Polls `upload`, which must not end, until `reached` says it got where it is to be
/// dropped, and drops it there (as a request's deadline drops it).
async fn dropped_once<T>(upload: impl std::future::Future<Output = T>, reached: impl Fn() -> bool) {
    let mut upload = std::pin::pin!(upload);
    while !reached() {
        assert!(
            futures::poll!(&mut upload).is_pending(),
            "the upload ended before it was to be dropped"
        );
        tokio::task::yield_now().await;
    }
}

/// Begins the upload of [`PARTS_BUILD_ID`] again, once the one before is forgotten (on
/// the runtime, after its request is dropped): without, a conflict until it is stale,
/// minutes later.
async fn begun_again(store: &DebugInfoStore) -> String {
    let mut tries = 0;
    loop {
        match store.initiate(PARTS_BUILD_ID, 10 << 20, "h", false).await {
            Ok(id) => return id,
            Err(e) => {
                tries += 1;
                assert!(tries < 1_000_000, "never forgotten: {e}");
                tokio::task::yield_now().await;
            }
        }
    }
}

/// An upload dropped before its body ends (its request cut by a deadline, its client
/// gone) is forgotten: the same build id begins again at once, rather than being "in
/// progress" until stale with its size held of the quota. The parts it wrote are aborted:
/// S3 keeps those of an upload left neither completed nor aborted, counted by no quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_dropped_unfinished_is_forgotten() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let bucket = CountsAborts::over(dir.path());
    let faults = bucket.faults.clone();
    let (store, id) = begun_past_a_part(dir.path(), bucket).await;
    // A part's worth, then a body that never comes: polled until the upload asks for
    // more (it is then receiving), and dropped there, as a request's deadline drops it.
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waiting = asked.clone();
    let body = past_a_part().chain(futures::stream::poll_fn(move |_| {
        waiting.store(true, std::sync::atomic::Ordering::Relaxed);
        std::task::Poll::Pending
    }));
    dropped_once(store.upload(PARTS_BUILD_ID, &id, Box::pin(body)), || {
        asked.load(std::sync::atomic::Ordering::Relaxed)
    })
    .await;
    assert_ne!(begun_again(&store).await, id);
    // Forgetting follows the abort, in the same task.
    assert_eq!(faults.aborted.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// An upload whose last part fails (sent as the body ends) fails, and its parts are
/// aborted: object_store's `WriteMultipart` returned the part's error from its `finish`
/// and left the upload open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_last_part_fails_is_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = CountsAborts::over(dir.path());
    let faults = bucket.faults.clone();
    faults
        .fail_part
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let (store, id) = begun_past_a_part(dir.path(), bucket).await;
    let failed = store
        .upload(PARTS_BUILD_ID, &id, Box::pin(past_a_part()))
        .await
        .expect_err("its last part failed");
    assert!(failed.to_string().contains("a part failed"), "{failed}");
    assert_eq!(
        faults.aborted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the failed upload's parts were left"
    );
    assert_ne!(begun_again(&store).await, id, "and it is forgotten");
}

/// An upload dropped while it completes (its request's deadline passing then) aborts its
/// parts: object_store's `WriteMultipart` was consumed by its `finish`, and dropped with
/// it, unaborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_dropped_while_completing_is_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = CountsAborts::over(dir.path());
    let faults = bucket.faults.clone();
    faults
        .stall_completion
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (store, id) = begun_past_a_part(dir.path(), bucket).await;
    dropped_once(
        store.upload(PARTS_BUILD_ID, &id, Box::pin(past_a_part())),
        || faults.completing.load(std::sync::atomic::Ordering::SeqCst),
    )
    .await;
    assert_ne!(begun_again(&store).await, id);
    // Aborted on the runtime, beside the forgetting.
    let mut tries = 0;
    while faults.aborted.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tries += 1;
        assert!(
            tries < 1_000_000,
            "the upload dropped while completing was never aborted"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(faults.aborted.load(std::sync::atomic::Ordering::SeqCst), 1);
}
