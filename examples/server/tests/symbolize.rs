//! Frames stored as addresses named at query time: a stripped C program's profile of
//! addresses only (its mapping's build id, no names), pushed to the server, comes back
//! from `/api/v1/query?format=pprof` with its functions, inlined frames and lines, from
//! Debian's debuginfod serving the debug file (`[symbolizer] debuginfod_urls`).
//!
//! Needs gcc, binutils and debuginfod (`scripts/test.sh` installs them).

mod common;

use common::{Server, enc, get_json};
use frostdb_pprof::proto::{Sample, ValueType};
use frostdb_pprof::testing::stripped::{
    build, debuginfod, hot_function_offsets, names, profile_of,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_programs_addresses_come_back_named_from_debuginfod() {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    let offsets = hot_function_offsets(&built);
    let (_debuginfod, url) =
        debuginfod(&built.served, &dir.path().join("db"), &built.build_id).await;
    let s = Server::start(
        &dir.path().join("data"),
        Some(&format!("[symbolizer]\ndebuginfod_urls = [\"{url}\"]\n")),
    );

    // A CPU profile of the program, as an eBPF profiler without its symbols takes it: a
    // sample per address of hot_function.
    let mut p = profile_of(&built, &offsets, 0x5555_0000_0000);
    p.string_table.extend(["cpu".into(), "nanoseconds".into()]);
    let (cpu, ns) = (
        p.string_table.len() as i64 - 2,
        p.string_table.len() as i64 - 1,
    );
    p.sample_type = vec![ValueType {
        r#type: cpu,
        unit: ns,
    }];
    p.period_type = Some(ValueType {
        r#type: cpu,
        unit: ns,
    });
    p.period = 10_000_000;
    p.sample = p
        .location
        .iter()
        .map(|l| Sample {
            location_id: vec![l.id],
            value: vec![10_000_000],
            ..Sample::default()
        })
        .collect();
    let body = frostdb_pprof::report::pprof::encode_gzip(&p).unwrap();
    let pushed = reqwest::Client::new()
        .post(format!("{}/ingest?name=prog.cpu&format=pprof", s.url))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(
        pushed.status().as_u16(),
        200,
        "{}",
        pushed.text().await.unwrap()
    );

    let types = get_json(&format!("{}/api/v1/profile_types", s.url), None).await;
    let cpu_type = types
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .find(|t| t.contains(":cpu:nanoseconds"))
        .unwrap_or_else(|| panic!("a CPU type: {types}"))
        .to_owned();
    let answer = reqwest::get(format!(
        "{}/api/v1/query?format=pprof&selector={}",
        s.url,
        enc(&format!("{cpu_type}{{service_name=\"prog\"}}"))
    ))
    .await
    .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    let merged = frostdb_pprof::decode(&answer.bytes().await.unwrap(), &Default::default())
        .expect("a pprof answer")
        .into_inner();
    assert_eq!(merged.location.len(), offsets.len());
    for i in 0..merged.location.len() {
        let n = names(&merged, i);
        assert_eq!(
            n.last().map(String::as_str),
            Some("hot_function"),
            "location {i}: {n:?}"
        );
        assert!(merged.location[i].line.last().unwrap().line > 0);
    }
    assert!(
        (0..merged.location.len()).any(|i| names(&merged, i) == ["inlined_helper", "hot_function"]),
        "the inlined helper is a frame of its own"
    );
    // The mapping still says where the names came from.
    assert!(
        merged
            .mapping
            .iter()
            .any(|m| merged.string_table[m.build_id as usize] == built.build_id)
    );
}
