//! SQL over frostdb tables: results checked against the rows the test inserted, pushdown
//! and pruning checked in the plans.

mod common;

use std::collections::BTreeMap;

use arrow::array::RecordBatch;
use arrow::util::display::array_value_to_string;
use common::*;
use datafusion::prelude::{SessionConfig, SessionContext};
use frostdb_core::{Db, DbOptions, TableOptions};

/// Rows of `batches` rendered as strings.
fn rendered(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for b in batches {
        for i in 0..b.num_rows() {
            out.push(
                b.columns()
                    .iter()
                    .map(|c| array_value_to_string(c, i).unwrap())
                    .collect(),
            );
        }
    }
    out
}

async fn sql(ctx: &SessionContext, q: &str) -> Vec<Vec<String>> {
    rendered(&ctx.sql(q).await.unwrap().collect().await.unwrap())
}

async fn plan(ctx: &SessionContext, q: &str) -> String {
    let rows = sql(ctx, &format!("EXPLAIN {q}")).await;
    rows.into_iter()
        .map(|r| r.join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

fn db_with(rows: &[Row]) -> Db {
    let db = Db::open_in_memory(DbOptions::default().background_compaction(false)).unwrap();
    let table = db
        .table(
            "samples",
            samples_schema(),
            TableOptions::default().granule_rows(256),
        )
        .unwrap();
    insert(&table, rows);
    table.compact().unwrap();
    db
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_sums_match_the_rows() {
    let data = rows(6, 30, 10_000, 8);
    let db = db_with(&data);
    let ctx = frostdb_query::session(&db).unwrap();
    let (from, to) = (START_MS + 50_000, START_MS + 200_000);
    let got = sql(
        &ctx,
        &format!(
            "SELECT \"labels.pod\", sum(value) FROM samples WHERE name = 'cpu' \
             AND timestamp BETWEEN {from} AND {to} GROUP BY 1 ORDER BY 2 DESC, 1"
        ),
    )
    .await;
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for r in data
        .iter()
        .filter(|r| r.name == "cpu" && (from..=to).contains(&r.timestamp))
    {
        *want.entry(r.pod.clone()).or_default() += r.value;
    }
    let mut want: Vec<(String, i64)> = want.into_iter().collect();
    want.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let want: Vec<Vec<String>> = want
        .into_iter()
        .map(|(p, v)| vec![p, v.to_string()])
        .collect();
    assert_eq!(got, want);

    let count = sql(&ctx, "SELECT count(*) FROM samples").await;
    assert_eq!(count, vec![vec![data.len().to_string()]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_the_engine_evaluates_are_pushed_down_exactly() {
    let db = db_with(&rows(4, 10, 10_000, 4));
    let ctx = frostdb_query::session(&db).unwrap();
    for q in [
        "SELECT value FROM samples WHERE name = 'cpu' AND \"labels.pod\" = 'p1'",
        "SELECT value FROM samples WHERE \"labels.pod\" IN ('p1', 'p2') OR \"labels.env\" IS NULL",
        "SELECT value FROM samples WHERE \"labels.pod\" ~ '^p[12]$' AND NOT (timestamp < 5)",
        "SELECT value FROM samples WHERE \"labels.job\" LIKE 'a%' AND stacktrace_id <> 7",
    ] {
        let p = plan(&ctx, q).await;
        assert!(p.contains("FrostScanExec"), "{p}");
        assert!(
            !p.contains("FilterExec"),
            "no filter left for DataFusion:\n{p}"
        );
    }
    // A function is DataFusion's to evaluate.
    let p = plan(
        &ctx,
        "SELECT value FROM samples WHERE length(\"labels.pod\") > 1",
    )
    .await;
    assert!(p.contains("FilterExec"), "{p}");
    // Exact pushdown gives the same answers as DataFusion's own evaluation would.
    let pushed = sql(
        &ctx,
        "SELECT count(*) FROM samples WHERE \"labels.pod\" ~ '^p[12]$'",
    )
    .await;
    let own = sql(
        &ctx,
        "SELECT count(*) FROM samples WHERE regexp_like(\"labels.pod\", '^p[12]$')",
    )
    .await;
    assert_eq!(pushed, own);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_columns_are_columns() {
    let db = db_with(&rows(3, 2, 10_000, 2));
    let ctx = frostdb_query::session(&db).unwrap();
    let df = ctx.sql("SELECT * FROM samples").await.unwrap();
    let names: Vec<String> = df
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    for l in ["labels.env", "labels.job", "labels.pod"] {
        assert!(names.contains(&l.to_owned()), "{names:?}");
    }
    let envs = sql(
        &ctx,
        "SELECT DISTINCT \"labels.pod\" FROM samples WHERE \"labels.env\" = 'prod' ORDER BY 1",
    )
    .await;
    assert_eq!(envs, vec![vec!["p0".to_owned()]]);
    let err = ctx
        .sql("SELECT \"labels.nope\" FROM samples")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("labels.nope"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_scans_return_the_same_rows() {
    let data = rows(8, 20, 10_000, 6);
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(
        dir.path(),
        DbOptions::default().background_compaction(false),
    )
    .unwrap();
    let table = db
        .table(
            "samples",
            samples_schema(),
            TableOptions::default()
                .granule_rows(128)
                .row_group_rows(256),
        )
        .unwrap();
    insert(&table, &data[..data.len() / 2]);
    table.persist().unwrap();
    insert(&table, &data[data.len() / 2..]);
    let q =
        "SELECT \"labels.pod\", stacktrace_id, sum(value) FROM samples GROUP BY 1, 2 ORDER BY 1, 2";
    let mut results = Vec::new();
    for partitions in [1, 2, 4] {
        let ctx = SessionContext::new_with_config(
            SessionConfig::new().with_target_partitions(partitions),
        );
        frostdb_query::register_db(&ctx, &db).unwrap();
        let p = plan(&ctx, q).await;
        assert!(p.contains(&format!("partitions={partitions}")), "{p}");
        results.push(sql(&ctx, q).await);
    }
    assert!(!results[0].is_empty());
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0], results[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_merge_over_a_day_reads_a_small_fraction_of_the_row_groups() {
    // A day of 10 s profiles of 8 series, persisted in blocks.
    let data = rows(8, 8640, 10_000, 2);
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(
        dir.path(),
        DbOptions::default().background_compaction(false),
    )
    .unwrap();
    let options = TableOptions::default()
        .granule_rows(2048)
        .row_group_rows(8192)
        .block_size(2 << 20);
    let table = db.table("samples", samples_schema(), options).unwrap();
    insert_bulk(&table, &data, 8192);
    db.flush().unwrap();
    let stats = table.stats();
    assert!(stats.blocks >= 2, "{stats:?}");

    let ctx = frostdb_query::session(&db).unwrap();
    let (from, to) = (
        START_MS + 12 * 3600 * 1000,
        START_MS + 12 * 3600 * 1000 + 15 * 60 * 1000,
    );
    let q = format!(
        "SELECT stacktrace_id, sum(value) FROM samples WHERE name = 'cpu' AND \"labels.pod\" = 'p5' \
         AND timestamp >= {from} AND timestamp < {to} GROUP BY 1"
    );
    let explain = plan(&ctx, &q).await;
    let pruned = |label: &str| -> (usize, usize) {
        let at = explain
            .find(label)
            .unwrap_or_else(|| panic!("{label} in {explain}"));
        let rest = &explain[at + label.len()..];
        let mut it = rest
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<usize>().unwrap());
        (it.next().unwrap(), it.next().unwrap())
    };
    let (rg_pruned, rg_opened) = pruned("row_groups ");
    let all_row_groups: u32 = table.blocks().iter().map(|b| b.row_groups).sum();
    assert!(all_row_groups >= 20, "{all_row_groups} row groups");
    let read = rg_opened - rg_pruned;
    assert!(
        read as u32 * 10 <= all_row_groups,
        "read {read} of {all_row_groups} row groups:\n{explain}"
    );
    let at = explain.find("rows to read ").unwrap();
    let rows_read: usize = explain[at + 13..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        rows_read * 20 <= data.len(),
        "read {rows_read} of {} rows",
        data.len()
    );

    let got = sql(&ctx, &q).await;
    let mut want: BTreeMap<u64, i64> = BTreeMap::new();
    for r in data
        .iter()
        .filter(|r| r.name == "cpu" && r.pod == "p5" && (from..to).contains(&r.timestamp))
    {
        *want.entry(r.stack).or_default() += r.value;
    }
    let mut got: Vec<(u64, i64)> = got
        .iter()
        .map(|r| (r[0].parse().unwrap(), r[1].parse().unwrap()))
        .collect();
    got.sort();
    assert_eq!(got, want.into_iter().collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_that_cannot_be_read_fails_the_query_unless_the_session_is_lenient() {
    let data = rows(4, 60, 10_000, 4);
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(
        dir.path(),
        DbOptions::default().background_compaction(false),
    )
    .unwrap();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    let third = data.len() / 3;
    let mut blocks = Vec::new();
    for part in [&data[..third], &data[third..2 * third], &data[2 * third..]] {
        insert(&table, part);
        blocks.push(table.persist().unwrap().remove(0));
    }
    let path = |b: &frostdb_core::BlockMeta| dir.path().join("blocks").join(&b.path);
    // The first block loses its footer (unreadable at planning); the second keeps its
    // footer and page index but the pages of its `value` column are overwritten (the read
    // fails midway).
    let len = std::fs::metadata(path(&blocks[0])).unwrap().len();
    std::fs::write(path(&blocks[0]), vec![7u8; len as usize / 2]).unwrap();
    let mut bytes = std::fs::read(path(&blocks[1])).unwrap();
    let footer = parquet::file::metadata::ParquetMetaDataReader::new()
        .parse_and_finish(&bytes::Bytes::from(bytes.clone()))
        .unwrap();
    let row_group = footer.row_group(0);
    let value = (0..row_group.num_columns())
        .map(|i| row_group.column(i))
        .find(|c| c.column_path().string() == "value")
        .unwrap();
    let (start, len) = value.byte_range();
    bytes[start as usize..(start + len) as usize].fill(0xEE);
    std::fs::write(path(&blocks[1]), bytes).unwrap();
    let q = "SELECT count(*), sum(value) FROM samples";

    let strict = frostdb_query::session(&db).unwrap();
    let err = strict.sql(q).await.unwrap().collect().await.unwrap_err();
    assert!(
        err.to_string().contains(&blocks[0].path),
        "the error names the block: {err}"
    );

    let (lenient, failed) = frostdb_query::lenient_session(&db).unwrap();
    let got = sql(&lenient, q).await;
    let left = &data[2 * third..];
    let want = vec![vec![
        left.len().to_string(),
        left.iter().map(|r| r.value).sum::<i64>().to_string(),
    ]];
    assert_eq!(got, want, "the answer holds the readable block only");
    assert_eq!(failed.get(), 2, "and says two blocks are missing");

    let (lenient, _) = frostdb_query::lenient_session(&db).unwrap();
    let explain = plan(&lenient, q).await;
    assert!(
        explain.contains("lenient: blocks failed 1"),
        "one block fails at planning: {explain}"
    );
    let analyzed = sql(&lenient, &format!("EXPLAIN ANALYZE {q}")).await;
    let analyzed: String = analyzed.into_iter().map(|r| r.join(" ")).collect();
    assert!(analyzed.contains("blocks_failed=2"), "{analyzed}");
}

/// A sort past the memory limit spills only where and as much as its `Spill` allows: past
/// the bound it fails naming it, with no spill it fails at the memory limit, and within
/// the bound it answers. What a killed process left in the directory is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sort_spills_only_where_and_as_much_as_allowed() {
    let db = db_with(&rows(2, 4, 1_000, 8));
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join("datafusion-left-by-a-killed-process");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("spill.arrow"), [0u8; 1024]).unwrap();
    // 2.5 million rows of 16 bytes: 40 MB to sort, under a 32 MiB pool (the sort keeps
    // 10 MB back for merging its spills).
    let q = "SELECT v, v * 7919 % 1000003 AS k FROM generate_series(1, 2500000) t(v) ORDER BY k, v";
    let run = |spill: frostdb_query::Spill| {
        let db = db.clone();
        async move {
            let pool = frostdb_query::memory_pool(Some(32 << 20));
            let ctx = frostdb_query::session_with(&db, pool, &spill).unwrap();
            // One partition: one sorter, spilling as it fills the pool (two could each
            // hold what the other needs to merge).
            let answer = async {
                for set in [
                    "target_partitions = 1",
                    "sort_spill_reservation_bytes = 20000000",
                ] {
                    ctx.sql(&format!("SET datafusion.execution.{set}"))
                        .await?
                        .collect()
                        .await?;
                }
                ctx.sql(q).await?.collect().await
            }
            .await;
            answer.map(|batches| batches.iter().map(|b| b.num_rows()).sum::<usize>())
        }
    };

    let small = frostdb_query::Spill::to(dir.path(), 1 << 20).unwrap();
    assert!(!stale.exists(), "a killed process's spill is deleted");
    let e = run(small.clone()).await.unwrap_err();
    // A limit (413, naming `limits.max_spill_bytes`), not the server's fault (500).
    assert_eq!(
        frostdb_query::datafusion_kind(&e),
        frostdb_core::ErrorKind::LimitExceeded,
        "{e}"
    );
    let e = e.to_string();
    assert!(
        e.contains("exceeded the allowable limit of 1024.0 KB"),
        "{e}"
    );
    assert_eq!(
        small.used_bytes(),
        0,
        "the failed sort's files are given back"
    );

    // With nowhere to spill the sort fails where its memory runs out: the pool's limit,
    // or the spill it would have needed.
    let e = run(frostdb_query::Spill::none())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("DiskManager is disabled") || e.contains("query memory limit"),
        "{e}"
    );

    let ample = frostdb_query::Spill::to(dir.path(), 1 << 30).unwrap();
    assert_eq!(run(ample.clone()).await.unwrap(), 2_500_000);
    assert_eq!(ample.used_bytes(), 0);

    // Shared by two sessions, each spills at most half: one holding all it may leaves the
    // other its own half, in which the sort answers. With one bound for all, the first
    // took the whole of it and the sort failed (one tenant's spill failing another's).
    let shared = frostdb_query::Spill::to(dir.path(), 200 << 20)
        .unwrap()
        .shared_by(2);
    assert_eq!(shared.session_bytes(), 100 << 20);
    let hog = frostdb_query::session_with(&db, frostdb_query::memory_pool(None), &shared).unwrap();
    let held = hog
        .runtime_env()
        .disk_manager
        .create_tmp_file("a spill held by another query")
        .unwrap();
    let mut writer = held.open_writer().unwrap();
    let chunk = vec![7u8; 1 << 20];
    let mut written = 0usize;
    let refused = loop {
        assert!(
            written <= 200 << 20,
            "the session spilled past the whole bound"
        );
        match std::io::Write::write_all(&mut writer, &chunk) {
            Ok(()) => written += chunk.len(),
            Err(e) => break e,
        }
    };
    assert!(
        refused.to_string().contains("allowable limit of 100.0 MB"),
        "{refused}"
    );
    assert!(written >= 99 << 20, "{written}");
    assert_eq!(run(shared.clone()).await.unwrap(), 2_500_000);
    drop(writer);
    drop(held);
}
