//! `frostdb-bench compare --store DIR [--minutes M] [--job J] [--runs N] [--min-increase X]`: what the
//! server's regression comparison costs on the fleet. One service (the job with the most
//! series, or `--job`) is compared as two versions would be: its first `M` minutes (60)
//! against the next `M` (or the two halves of a shorter fleet), each read profile by profile
//! (`ProfileStore::profiles`) and tested per function (`frostdb_pprof::regress::compare`).
//! Prints, as JSON, what each side held and the median time of the read and test together.

use std::collections::BTreeMap;
use std::time::Instant;

use frostdb_pprof::regress::{CompareOptions, compare as compare_sides};
use frostdb_pprof::{ReadOptions, Selector, TimeRange};

use crate::external::{BoxError, CPU, arg, number, open_store};

/// What one comparison read and found, and how long it took.
#[derive(Debug, Clone)]
pub struct Measured {
    /// The service compared.
    pub job: String,
    /// Its series.
    pub series: usize,
    /// The two ranges (ms).
    pub before: (i64, i64),
    /// See `before`.
    pub after: (i64, i64),
    /// Profiles and sample rows of each side.
    pub profiles: (usize, usize),
    /// See `profiles`.
    pub rows: (usize, usize),
    /// Functions seen, tested, and found to rise.
    pub functions: usize,
    /// See `functions`.
    pub tested: usize,
    /// See `functions`.
    pub regressions: usize,
    /// Each run's time (ms): both reads and the test.
    pub runs_ms: Vec<f64>,
    /// Their median.
    pub median_ms: f64,
}

/// `frostdb-bench compare`.
pub fn compare(args: &[String]) -> Result<Measured, BoxError> {
    let store = open_store(&arg(args, "--store")?)?;
    let minutes = number(args, "--minutes", 60)?.max(1) as i64;
    let runs = number(args, "--runs", 5)?.max(1);
    let (first, last) = store.time_span()?.ok_or("the store holds no profiles")?;
    let all = TimeRange {
        start_ms: first,
        end_ms: last + 1,
    };
    // Series per job.
    let series = store
        .series(
            &Selector::parse(&format!("{CPU}{{}}"))?,
            all,
            None,
            ReadOptions::STRICT,
        )?
        .value;
    let mut per_job: BTreeMap<String, usize> = BTreeMap::new();
    for s in &series {
        if let Some((_, job)) = s.labels.iter().find(|(k, _)| k == "job") {
            *per_job.entry(job.clone()).or_default() += 1;
        }
    }
    let job = match arg(args, "--job") {
        Ok(j) => j.display().to_string(),
        Err(_) => per_job
            .iter()
            .max_by_key(|(j, n)| (**n, std::cmp::Reverse((*j).clone())))
            .map(|(j, _)| j.clone())
            .ok_or("no series has a job label")?,
    };
    let side = (minutes * 60_000).min((all.end_ms - all.start_ms) / 2);
    let before = TimeRange {
        start_ms: first,
        end_ms: first + side,
    };
    let after = TimeRange {
        start_ms: first + side,
        end_ms: first + 2 * side,
    };
    let selector = Selector::parse(&format!("{CPU}{{job=\"{job}\"}}"))?;
    let mut options = CompareOptions::default();
    // A lower threshold tests more functions: the test's own cost.
    if let Ok(x) = arg(args, "--min-increase") {
        options.min_increase = x.display().to_string().parse()?;
    }
    let mut times = Vec::with_capacity(runs);
    let mut last_run = None;
    for _ in 0..runs {
        let started = Instant::now();
        let b = store.profiles(&selector, before, ReadOptions::STRICT)?;
        let a = store.profiles(&selector, after, ReadOptions::STRICT)?;
        let found = compare_sides(&b, &a, &options)?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        last_run = Some((
            b.stacks.profiles.len(),
            a.stacks.profiles.len(),
            b.stacks.rows,
            a.stacks.rows,
            found,
        ));
    }
    let (pb, pa, rb, ra, found) = last_run.expect("runs >= 1");
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let measured = Measured {
        series: per_job.get(&job).copied().unwrap_or(0),
        job,
        before: (before.start_ms, before.end_ms),
        after: (after.start_ms, after.end_ms),
        profiles: (pb, pa),
        rows: (rb, ra),
        functions: found.functions,
        tested: found.tested,
        regressions: found.regressions.len(),
        median_ms: sorted[sorted.len() / 2],
        runs_ms: times,
    };
    let m = &measured;
    let json = serde_json::json!({
        "job": m.job, "series": m.series, "before_ms": [m.before.0, m.before.1],
        "after_ms": [m.after.0, m.after.1], "profiles": [m.profiles.0, m.profiles.1],
        "rows": [m.rows.0, m.rows.1], "functions": m.functions, "tested": m.tested,
        "regressions": m.regressions, "runs_ms": m.runs_ms, "median_ms": m.median_ms,
    });
    println!("{}", serde_json::to_string_pretty(&json)?);
    Ok(measured)
}
