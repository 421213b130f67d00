//! Merges spread over workers (gRPC on loopback, datafusion-distributed) answer exactly
//! what the merge answers in one process, and a worker gone mid-way fails the merge with an
//! error naming the workers, never a partial answer.

// The small profile table of frostdb-query's tests, shared rather than copied.
#[path = "../../frostdb-query/tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use common::{START_MS, rows, samples_schema_with_period};
use frostdb_core::{Db, DbOptions, Table};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;
use frostdb_profile::distributed::{Cluster, ClusterOptions, Node, StackSource};
use frostdb_profile::native::merge_stacks;

/// The one table every task reads (all "processes" here share it).
#[derive(Debug)]
struct Local(Table);

impl StackSource for Local {
    fn table(&self, tenant: &str, table: &str) -> frostdb_query::Result<Table> {
        assert_eq!((tenant, table), ("t", "samples"));
        Ok(self.0.clone())
    }
}

#[test]
fn merges_over_workers_answer_as_one_process_and_fail_whole_when_a_worker_goes() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), DbOptions::default()).unwrap();
    // Row groups of 40 rows: the workers get runs of row groups, not only whole blocks.
    let options = frostdb_core::TableOptions::default().row_group_rows(40);
    let table = db
        .table("samples", samples_schema_with_period(), options)
        .unwrap();
    // One block of many row groups, and a small one: the big one is cut between row groups.
    let data = rows(6, 24, 10_000, 5);
    let (big, small) = data.split_at(data.len() - 40);
    for chunk in [big, small] {
        common::insert(&table, chunk);
        table.persist().unwrap();
    }
    let snapshot = table.snapshot();
    assert_eq!(snapshot.blocks().len(), 2);
    assert!(snapshot.blocks()[0].row_groups > 10);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let source: Arc<dyn StackSource> = Arc::new(Local(table.clone()));
    let mut workers = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..2 {
        let worker = ClusterOptions::default().listen("127.0.0.1:0".parse().ok());
        let node = runtime
            .block_on(Node::start(&worker, source.clone()))
            .unwrap();
        urls.push(format!("http://{}", node.listening().unwrap()));
        workers.push(node);
    }
    let cluster = Cluster::new(&urls, None).unwrap();
    let pool = frostdb_query::memory_pool(None);
    let all = TimeRange::ALL;
    let window = TimeRange {
        start_ms: START_MS + 30_000,
        end_ms: START_MS + 150_000,
    };
    for (selector, range) in [
        ("cpu:cpu:nanoseconds:cpu:nanoseconds", all),
        ("cpu:cpu:nanoseconds:cpu:nanoseconds{job=\"api\"}", all),
        (
            "cpu:cpu:nanoseconds:cpu:nanoseconds{pod=~\"p[01]\"}",
            window,
        ),
        ("memory:cpu:nanoseconds:cpu:nanoseconds{env=\"\"}", all),
    ] {
        let selector = Selector::parse(selector).unwrap();
        let here = merge_stacks(&snapshot, &selector, range, 2, false, &pool, None).unwrap();
        let spread = cluster
            .merge_stacks(
                "t",
                "samples",
                snapshot.blocks(),
                &selector,
                range,
                false,
                None,
            )
            .unwrap();
        assert_eq!(spread.stacks, here.stacks, "{selector}");
        assert_eq!(
            (spread.total, spread.period, spread.rows),
            (here.total, here.period, here.rows),
            "{selector}"
        );
    }
    assert!(
        cluster.bytes_moved() > 0,
        "the workers' sums crossed the network"
    );

    // A worker goes: the next merge fails, naming the workers; nothing partial.
    runtime.block_on(workers[1].stop());
    let selector = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap();
    let failed = cluster
        .merge_stacks(
            "t",
            "samples",
            snapshot.blocks(),
            &selector,
            all,
            false,
            None,
        )
        .unwrap_err();
    assert!(
        matches!(failed, frostdb_query::Error::Cluster(_)),
        "{failed}"
    );
    assert!(failed.to_string().contains(&urls[1]), "{failed}");
    assert_eq!(failed.kind(), frostdb_core::ErrorKind::Unavailable);
}

#[test]
fn a_worker_with_a_secret_refuses_plans_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), DbOptions::default()).unwrap();
    let table = db
        .table(
            "samples",
            samples_schema_with_period(),
            frostdb_core::TableOptions::default().row_group_rows(40),
        )
        .unwrap();
    // As in the test above: enough row groups that the merge is spread.
    common::insert(&table, &rows(6, 24, 10_000, 5));
    table.persist().unwrap();
    let snapshot = table.snapshot();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let source: Arc<dyn StackSource> = Arc::new(Local(table.clone()));
    let mut urls = Vec::new();
    let mut workers = Vec::new();
    for _ in 0..2 {
        let worker = ClusterOptions::default()
            .listen("127.0.0.1:0".parse().ok())
            .secret("s3cret".to_owned());
        let node = runtime
            .block_on(Node::start(&worker, source.clone()))
            .unwrap();
        urls.push(format!("http://{}", node.listening().unwrap()));
        workers.push(node);
    }
    let selector = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap();
    let merge = |cluster: &Cluster| {
        cluster.merge_stacks(
            "t",
            "samples",
            snapshot.blocks(),
            &selector,
            TimeRange::ALL,
            false,
            None,
        )
    };
    for wrong in [None, Some("guess")] {
        let cluster = Cluster::new(&urls, None)
            .unwrap()
            .with_secret(wrong)
            .unwrap();
        let e = merge(&cluster).unwrap_err();
        assert!(e.to_string().contains("secret"), "{wrong:?}: {e}");
    }
    let cluster = Cluster::new(&urls, None)
        .unwrap()
        .with_secret(Some("s3cret"))
        .unwrap();
    let pool = frostdb_query::memory_pool(None);
    let here = merge_stacks(&snapshot, &selector, TimeRange::ALL, 2, false, &pool, None).unwrap();
    assert_eq!(merge(&cluster).unwrap().stacks, here.stacks);
}
