//! Every real profile of shared/testdata, stored and merged back: `go tool pprof -top` prints
//! the same per-function flat and cum for our merged pprof as for the original, and our top
//! table prints what `go tool pprof -top` prints for the original.

use crate::common;

use std::collections::BTreeSet;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::report::{pprof, top, top::TopTable, tree};
use frostdb_pprof::{IngestOptions, Limits, ProfileStore, StoreOptions, decode};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;

type Rows = BTreeSet<(String, String, String)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_profiles_agree_with_go_tool_pprof() {
    if !common::have_go() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open_in_memory(DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    let mut compared = 0;
    let mut failures = Vec::new();
    for (i, (name, bytes)) in common::testdata().into_iter().enumerate() {
        let mut original = dir.path().join(&name);
        std::fs::write(&original, &bytes).unwrap();
        let profile = decode(&bytes, &Limits::default()).unwrap();
        if common::try_pprof_top(&original, 0).is_err() {
            // pprof refuses a few writers' bugs we repair on decode (.NET's function ids
            // of 0): compare against the repaired profile.
            original = dir.path().join(format!("{name}.repaired.pb"));
            std::fs::write(&original, prost::Message::encode_to_vec(&*profile)).unwrap();
        }
        let profile_name = format!("f{i}");
        let summary = store
            .ingest(&bytes, &IngestOptions::default().name(profile_name.clone()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for (index, vt) in profile.sample_type.iter().enumerate() {
            let s = |i: i64| profile.string_table[i as usize].as_str();
            let (t, u) = (s(vt.r#type), s(vt.unit));
            let (t, u) = (
                if t.is_empty() { "samples" } else { t },
                if u.is_empty() { "count" } else { u },
            );
            let Some(profile_type) = summary
                .profile_types
                .iter()
                .find(|p| p.split(':').nth(1) == Some(t) && p.split(':').nth(2) == Some(u))
            else {
                continue; // every value of this type is zero
            };
            let selector = Selector::parse(profile_type).unwrap();
            let merged = store.merge(&selector, TimeRange::ALL).unwrap();
            let exported = dir.path().join(format!("{name}.{index}.merged.pb.gz"));
            let profile = pprof::to_profile(&merged).unwrap();
            std::fs::write(&exported, pprof::encode_gzip(&profile).unwrap()).unwrap();

            let want: Rows = common::pprof_top(&original, index).into_iter().collect();
            let got: Rows = common::pprof_top(&exported, 0).into_iter().collect();
            if want != got {
                failures.push(format!(
                    "{name} [{t}/{u}]: go tool pprof differs\n  original only: {:?}\n  merged only: {:?}",
                    want.difference(&got).take(5).collect::<Vec<_>>(),
                    got.difference(&want).take(5).collect::<Vec<_>>()
                ));
                continue;
            }
            let table = TopTable::build_with(&merged, 0.0, 0.0);
            let ours: Rows = table
                .rows
                .iter()
                .map(|r| {
                    let name = match r.inline {
                        Some(i) => format!("{} {i}", r.name),
                        None => r.name.clone(),
                    };
                    // pprof's output is read back split on whitespace.
                    let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
                    (name, table.format(r.flat), table.format(r.cum))
                })
                .collect();
            if ours != want {
                failures.push(format!(
                    "{name} [{t}/{u}]: our top table differs\n  pprof only: {:?}\n  ours only: {:?}",
                    want.difference(&ours).take(5).collect::<Vec<_>>(),
                    ours.difference(&want).take(5).collect::<Vec<_>>()
                ));
                continue;
            }
            // The flat column alone, read from the stacks' leaves, is the table's.
            let nonzero = |rows: Vec<(String, i64)>| -> Vec<(String, i64)> {
                rows.into_iter().filter(|r| r.1 != 0).collect()
            };
            let table_flat = table.rows.iter().map(|r| (r.name.clone(), r.flat));
            assert_eq!(
                nonzero(top::flat_by_function(&merged)),
                nonzero(table_flat.collect()),
                "{name} [{t}/{u}]: flat_by_function"
            );
            // The flame graph and folded stacks add up to the same total.
            let graph = tree::FlameGraph::build(&merged);
            assert_eq!(graph.root().total(), merged.total(), "{name}");
            let folded_total: i64 = tree::folded(&merged)
                .lines()
                .map(|l| l.rsplit(' ').next().unwrap().parse::<i64>().unwrap())
                .sum();
            assert_eq!(folded_total, merged.total(), "{name}");
            compared += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(compared >= 60, "compared {compared} profile types");
}
