//! Merges spread over workers (gRPC on loopback, datafusion-distributed) answer exactly
//! what the merge answers in one process, and a worker gone mid-way fails the merge with an
//! error naming the workers, never a partial answer.

// The small profile table of frostdb-query's tests, shared rather than copied.
use crate::common;

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

/// A table of one persisted block of row groups of 40 rows: enough row groups that a
/// merge of it is spread over workers.
fn spread_table(dir: &std::path::Path) -> Table {
    let db = Db::open(dir, DbOptions::default()).unwrap();
    let table = db
        .table(
            "samples",
            samples_schema_with_period(),
            frostdb_core::TableOptions::default().row_group_rows(40),
        )
        .unwrap();
    common::insert(&table, &rows(6, 24, 10_000, 5));
    table.persist().unwrap();
    table
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Two workers on loopback serving `source` as `options` say, and their URLs.
fn two_workers(
    runtime: &tokio::runtime::Runtime,
    source: &Arc<dyn StackSource>,
    options: ClusterOptions,
) -> (Vec<Node>, Vec<String>) {
    let mut workers = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..2 {
        let options = options.clone().listen("127.0.0.1:0".parse().ok());
        let node = runtime
            .block_on(Node::start(&options, source.clone()))
            .unwrap();
        urls.push(format!("http://{}", node.listening().unwrap()));
        workers.push(node);
    }
    (workers, urls)
}

/// `snapshot` merged in this process and over `cluster`'s workers, in that order.
fn merged_both_ways(
    cluster: &Cluster,
    snapshot: &frostdb_core::Snapshot,
    selector: &Selector,
    range: TimeRange,
    pool: &Arc<dyn datafusion::execution::memory_pool::MemoryPool>,
) -> (
    frostdb_profile::native::StackTotals,
    frostdb_profile::native::StackTotals,
) {
    let here = merge_stacks(snapshot, selector, range, 2, false, pool, None).unwrap();
    let spread = cluster
        .merge_stacks(
            "t",
            "samples",
            snapshot.blocks(),
            selector,
            range,
            false,
            None,
            pool,
        )
        .unwrap();
    (here, spread)
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

    let runtime = runtime();
    let source: Arc<dyn StackSource> = Arc::new(Local(table.clone()));
    let (mut workers, urls) = two_workers(&runtime, &source, ClusterOptions::default());
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
        let (here, spread) = merged_both_ways(&cluster, &snapshot, &selector, range, &pool);
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
    // What the coordinator holds of the answer is reserved from the store's query memory,
    // as a merge on one node is: past its limit the merge is refused, naming it (the
    // coordinator's session had DataFusion's pool without a limit).
    let selector = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap();
    let small = frostdb_query::memory_pool(Some(16));
    assert!(merge_stacks(&snapshot, &selector, all, 2, false, &small, None).is_err());
    let refused = cluster
        .merge_stacks(
            "t",
            "samples",
            snapshot.blocks(),
            &selector,
            all,
            false,
            None,
            &small,
        )
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("query memory limit of 16 bytes"),
        "{refused}"
    );
    assert_eq!(
        small.reserved(),
        0,
        "the refused merge gave back what it held"
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
            &frostdb_query::memory_pool(None),
        )
        .unwrap_err();
    assert!(
        matches!(failed, frostdb_query::Error::Cluster(_)),
        "{failed}"
    );
    assert!(failed.to_string().contains(&urls[1]), "{failed}");
    assert_eq!(failed.kind(), frostdb_core::ErrorKind::Unavailable);
}

/// A small block before a big one is still spread over every task (one run for two tasks
/// failed the merge's second task), and a stack whose values pass i64's range saturates on
/// the cluster as in one process (the cluster's sum of two tasks' 2^62 wrapped negative).
#[test]
fn a_small_block_first_and_sums_past_i64_merge_as_in_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), DbOptions::default()).unwrap();
    let table = db
        .table(
            "samples",
            samples_schema_with_period(),
            frostdb_core::TableOptions::default().row_group_rows(1 << 20),
        )
        .unwrap();
    let mut data = rows(6, 24, 10_000, 5);
    for row in &mut data {
        if row.name == "cpu" && row.stack == 0 {
            row.value = 1 << 61;
        }
    }
    let (big, small) = data.split_at(data.len() - 10);
    for chunk in [small, big] {
        common::insert(&table, chunk);
        table.persist().unwrap();
    }
    let snapshot = table.snapshot();
    assert_eq!(snapshot.blocks().len(), 2);
    assert!(snapshot.blocks()[0].rows < snapshot.blocks()[1].rows / 100);
    let runtime = runtime();
    let source: Arc<dyn StackSource> = Arc::new(Local(table.clone()));
    let (_workers, urls) = two_workers(&runtime, &source, ClusterOptions::default());
    let cluster = Cluster::new(&urls, None).unwrap();
    let pool = frostdb_query::memory_pool(None);
    let selector = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap();
    let (here, spread) = merged_both_ways(&cluster, &snapshot, &selector, TimeRange::ALL, &pool);
    assert!(
        here.stacks.iter().any(|&(_, v)| v == i64::MAX),
        "a stack saturates"
    );
    assert_eq!(spread.stacks, here.stacks);
    assert_eq!((spread.total, spread.rows), (here.total, here.rows));
}

#[test]
fn a_worker_with_a_secret_refuses_plans_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let table = spread_table(dir.path());
    let snapshot = table.snapshot();
    let runtime = runtime();
    let source: Arc<dyn StackSource> = Arc::new(Local(table.clone()));
    let secret = ClusterOptions::default().secret("s3cret".to_owned());
    let (_workers, urls) = two_workers(&runtime, &source, secret);
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
            &frostdb_query::memory_pool(None),
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

/// A plan of DataFusion's own nodes sent to a worker (by a cluster node that holds the
/// secret, or by anyone where there is none) reads no file: a worker's plans read only
/// through its codec's nodes. Without that, this plan would answer the file's rows, read
/// by the worker from its own disk.
#[test]
fn a_plan_naming_files_reads_nothing_on_a_worker() {
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
    use datafusion_distributed::{DistributedExt, SessionStateBuilderExt};
    use frostdb_query::distributed::{Channels, WorkerUrls};

    let dir = tempfile::tempdir().unwrap();
    // Files on the worker's disk that no request may read (two: two tasks to spread).
    let schema = Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("s", arrow::datatypes::DataType::Utf8, false),
    ]));
    for name in ["a.parquet", "b.parquet"] {
        let batch = arrow::array::RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(arrow::array::StringArray::from(vec![
                "another tenant's secret";
                1000
            ]))],
        )
        .unwrap();
        let file = std::fs::File::create(dir.path().join(name)).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema.clone(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }
    let db = Db::open(dir.path().join("db"), DbOptions::default()).unwrap();
    let table = db
        .table(
            "samples",
            samples_schema_with_period(),
            frostdb_core::TableOptions::default(),
        )
        .unwrap();
    let runtime = runtime();
    let source: Arc<dyn StackSource> = Arc::new(Local(table));
    let (_workers, urls) = two_workers(&runtime, &source, ClusterOptions::default());
    // A coordinator of plain DataFusion plans over those workers.
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(SessionConfig::new().with_target_partitions(2))
        .with_distributed_worker_resolver(WorkerUrls::parse(&urls).unwrap())
        .with_distributed_channel_resolver(Channels::new(None).unwrap())
        .with_distributed_planner()
        .with_distributed_file_scan_config_bytes_per_partition(1)
        .unwrap()
        .build();
    let ctx = SessionContext::from(state);
    let answer = runtime.block_on(async {
        ctx.register_parquet(
            "files",
            dir.path().to_str().unwrap(),
            ParquetReadOptions::default(),
        )
        .await
        .unwrap();
        ctx.sql("SELECT s, count(*) FROM files GROUP BY s")
            .await
            .unwrap()
            .collect()
            .await
    });
    let e = match answer {
        Ok(batches) => panic!(
            "a worker read files for a plan: {} rows",
            batches.iter().map(|b| b.num_rows()).sum::<usize>()
        ),
        Err(e) => e.to_string(),
    };
    // Refused as it is decoded (no object store to read the files from), or as it is
    // registered (it reads through a node other than the merge's).
    assert!(
        e.contains("a worker runs only plans that read through StackScanExec")
            || e.contains("a worker reads no object store"),
        "{e}"
    );
}

/// The tasks a worker serves reserve from the memory budget it is given: past it a merge
/// fails (memory exhausted: nothing spills on a worker), within it the merge answers.
#[test]
fn a_workers_tasks_reserve_from_its_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let table = spread_table(dir.path());
    let snapshot = table.snapshot();
    let runtime = runtime();
    let source: Arc<dyn StackSource> = Arc::new(Local(table.clone()));
    let selector = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap();
    let pool = frostdb_query::memory_pool(None);
    let here = merge_stacks(&snapshot, &selector, TimeRange::ALL, 2, false, &pool, None).unwrap();
    for (budget, fits) in [(1024, false), (1 << 30, true)] {
        let budgeted =
            ClusterOptions::default().memory_budget(frostdb_core::MemoryBudget::new(budget));
        let (_workers, urls) = two_workers(&runtime, &source, budgeted);
        let merged = Cluster::new(&urls, None).unwrap().merge_stacks(
            "t",
            "samples",
            snapshot.blocks(),
            &selector,
            TimeRange::ALL,
            false,
            None,
            &frostdb_query::memory_pool(None),
        );
        match (merged, fits) {
            (Ok(spread), true) => assert_eq!(spread.stacks, here.stacks),
            // The budget's refusal, or an operator's that could not spill for it.
            (Err(e), false) => {
                let e = e.to_string();
                assert!(
                    e.contains("budget") || e.contains("Memory Exhausted"),
                    "{e}"
                );
            }
            (merged, _) => panic!("a budget of {budget} bytes: {merged:?}"),
        }
    }
}

/// A merge waiting on its workers stops once its request no longer wants it (the ambient
/// stop condition a server sets for a request's reads), with the reason as the error,
/// rather than holding the request's thread for as long as the workers take: here
/// forever, a "worker" that takes connections and never answers.
#[test]
fn a_merge_waiting_on_its_workers_stops_when_its_request_ends() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = spread_table(dir.path()).snapshot();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = silent.local_addr().unwrap();
    let held = std::thread::spawn(move || {
        // Takes connections and holds them, unanswered, until the test ends.
        let mut open = Vec::new();
        for c in silent.incoming().take(8) {
            open.push(c);
        }
    });
    let cluster = Cluster::new(&[format!("http://{at}"), format!("http://{at}")], None).unwrap();
    let selector = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap();
    // Wanted for the first checks, then not (the request's time limit passed).
    let checks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = checks.clone();
    let ended = move || {
        (counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 3)
            .then(|| "the request's time limit passed".to_owned())
    };
    let e = frostdb_core::stop_scans_when(ended, || {
        cluster.merge_stacks(
            "t",
            "samples",
            snapshot.blocks(),
            &selector,
            TimeRange::ALL,
            false,
            None,
            &frostdb_query::memory_pool(None),
        )
    })
    .unwrap_err();
    assert!(e.to_string().contains("time limit passed"), "{e}");
    assert_eq!(e.kind(), frostdb_core::ErrorKind::Unavailable);
    assert!(checks.load(std::sync::atomic::Ordering::SeqCst) >= 4);
    drop(held);
}

/// Whether the peer closed `socket` (end of stream or reset) within 30 s.
fn closed_by_peer(socket: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    socket
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 256];
    loop {
        match socket.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // e.g. the server's own HTTP/2 settings
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// The worker port bounds its connections before reading a request (whoever can reach it
/// can connect, secret or not): a connection that says nothing is closed once the preface
/// timeout is over, one that says anything but HTTP/2 at once, and past `max_connections`
/// new ones are closed as they arrive. Merges through the port (every other test here)
/// pass the same bounds.
#[test]
fn a_workers_port_closes_connections_that_do_not_start_http2() {
    use frostdb_profile::distributed::WorkerConnections;
    use std::io::Write;
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let table = spread_table(dir.path());
    let runtime = runtime();
    let source: Arc<dyn StackSource> = Arc::new(Local(table));
    let start = |max_connections: usize, preface_timeout: Duration| {
        let options = ClusterOptions::default()
            .listen("127.0.0.1:0".parse().ok())
            .connections(WorkerConnections {
                max_connections,
                preface_timeout,
                ..Default::default()
            });
        runtime
            .block_on(Node::start(&options, source.clone()))
            .unwrap()
    };

    // Silent: closed at the preface timeout, not before.
    let quick = start(8, Duration::from_millis(300));
    let connected = Instant::now();
    let mut silent = TcpStream::connect(quick.listening().unwrap()).unwrap();
    assert!(
        closed_by_peer(&mut silent),
        "a silent connection stays open"
    );
    assert!(connected.elapsed() >= Duration::from_millis(300));

    // With a preface timeout far past the 30 s the client waits, a close is not the
    // timeout's: not HTTP/2 is closed on sight, and connections past the limit on arrival.
    let slow = start(2, Duration::from_secs(600));
    let at = slow.listening().unwrap();
    let mut garbage = TcpStream::connect(at).unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(
        closed_by_peer(&mut garbage),
        "HTTP/1 on the worker port stays open"
    );
    let held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(at).unwrap()).collect();
    let mut third = TcpStream::connect(at).unwrap();
    assert!(
        closed_by_peer(&mut third),
        "a third connection past a limit of 2 stays open"
    );
    // The two within the limit are still open, waiting for their preface.
    for mut h in held {
        h.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 1];
        let e = std::io::Read::read(&mut h, &mut buf).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
    }
}
