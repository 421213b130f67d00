//! Symbolization from real components: a C program built with a build id and stripped, its
//! debug file kept apart; a profile of its addresses only is named from Debian's
//! `debuginfod` serving that file, and from the same file uploaded instead; a build id
//! nobody has stays an address; a dead debuginfod costs its timeout, once.
//!
//! Needs gcc, binutils and `debuginfod` (`scripts/test.sh` installs them).

use std::time::{Duration, Instant};

use frostdb_pprof::proto::{Location, Mapping};
use frostdb_pprof::symbolize::{Origin, Symbolizer, SymbolizerOptions};
use frostdb_pprof::testing::stripped::{
    build, debuginfod, hot_function_offsets, names, profile_of,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_programs_addresses_are_named_from_debuginfod() {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    let offsets = hot_function_offsets(&built);
    let (_server, url) = debuginfod(&built.served, &dir.path().join("db"), &built.build_id).await;
    let mut options = SymbolizerOptions::new(dir.path().join("cache"));
    options.debuginfod_urls = vec![url];
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
        (2, 1),
        "the debug file and the executable; the unknown build id"
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
    // The tenant's uploads, in an object store on disk.
    let objects: std::sync::Arc<dyn object_store::ObjectStore> = std::sync::Arc::new(
        object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap(),
    );
    std::fs::create_dir_all(dir.path().join("objects")).unwrap();
    let uploads = frostdb_pprof::debuginfo::DebugInfoStore::new(
        objects,
        object_store::path::Path::from("objects"),
        1 << 30,
        Duration::from_secs(60),
    );
    // The program as linked, with its symbols and DWARF (what `frostdb debuginfo upload`
    // takes): its own segments place the file offsets.
    let file = std::fs::read(&built.unstripped).unwrap();
    let id = uploads
        .initiate(
            &built.build_id,
            file.len() as i64,
            "sha256-of-the-file",
            false,
        )
        .await
        .unwrap();
    uploads
        .upload(
            &built.build_id,
            &id,
            futures::stream::iter([Ok(bytes::Bytes::from(file))]),
        )
        .await
        .unwrap();
    uploads.finish(&built.build_id, &id).await.unwrap();

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
