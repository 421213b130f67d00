//! `frostdb-bench`: frostdb-rs as an external engine of `shared/bench` (see
//! `frostdb_benches::external`).

use frostdb_benches::external::{BoxError, ingest, query};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result: Result<(), BoxError> = match args.first().map(String::as_str) {
        Some("ingest") => ingest(&args),
        Some("query") => query(&args),
        _ => Err("usage: frostdb-bench ingest|query --data DIR --store DIR [--queries Q --runs N --out DIR]".into()),
    };
    if let Err(e) = result {
        eprintln!("frostdb-bench: {e}");
        std::process::exit(1);
    }
}
