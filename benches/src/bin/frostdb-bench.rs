//! `frostdb-bench`: frostdb-rs as an external engine of `shared/bench` (see
//! `frostdb_benches::external`).

use frostdb_benches::external::{BoxError, ingest, ingest_pprof, query, worker};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The subcommand is the first argument that is not a flag, so that shared/bench can run
    // `frostdb-bench --pprof` as an engine of its own (`--external "NAME=frostdb-bench --pprof"`).
    let command = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(String::as_str);
    let result: Result<(), BoxError> = match command {
        // `--pprof`: ingest the fleet's pprof files (the realistic path) instead of
        // profiles rebuilt from its Parquet rows; both land in the same tables.
        Some("ingest") if args.iter().any(|a| a == "--pprof") => ingest_pprof(&args),
        Some("ingest") => ingest(&args),
        Some("formats") => frostdb_benches::formats::run(&args),
        Some("symbols") => frostdb_benches::scale::symbols(&args),
        Some("labels") => frostdb_benches::cardinality::labels(&args),
        Some("series") => frostdb_benches::cardinality::series(&args),
        Some("query") => query(&args),
        Some("worker") => worker(&args),
        Some("symbolize") => frostdb_benches::host_symbols::host(&args),
        Some("compare") => frostdb_benches::versions::compare(&args).map(|_| ()),
        _ => Err("usage: frostdb-bench ingest [--pprof | --per-profile] [--batch-rows N] --data DIR (--store DIR | --bucket s3://B/P) [--threads N] | query (--store DIR | --bucket s3://B/P [--workers URL,URL]) --queries Q --runs N --out DIR | worker --bucket s3://B/P --listen ADDR | formats --store DIR [--runs N] | symbols --store DIR --stacks N [--reopen] | labels --store DIR --names N [--wal] [--reopen] | series --store DIR --series N [--reopen] | symbolize --work DIR [--addresses N] [--cache-bytes N] [--workers N] | compare --store DIR [--minutes M] [--job J] [--runs N] [--min-increase X]".into()),
    };
    if let Err(e) = result {
        eprintln!("frostdb-bench: {e}");
        std::process::exit(1);
    }
}
