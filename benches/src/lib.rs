//! Benchmarks of frostdb-rs and the deterministic, profile-shaped data they run on.
//!
//! The data model follows `shared/bench`'s fleet: a profile per series every 10 s, each a set
//! of (stack, value) samples drawn from a skewed distribution over the series' stacks, in the
//! product's samples table (`frostdb_pprof::schema::samples`): five profile-type columns, five
//! labels, a stack id and four integers per row.

pub mod cardinality;
pub mod external;
pub mod formats;
pub mod host_symbols;
pub mod scale;
pub mod versions;

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{Field, Schema as ArrowSchema};
use frostdb_core::Schema;
use frostdb_profile::schema::column::{
    DURATION, NAME, PERIOD, PERIOD_TYPE, PERIOD_UNIT, SAMPLE_TYPE, SAMPLE_UNIT, STACKTRACE_ID,
    TIMESTAMP, VALUE, label_column, label_of,
};

/// The product's samples table (one definition, in `frostdb_pprof::schema`).
pub fn samples_schema() -> Schema {
    frostdb_pprof::schema::samples()
}

/// The fleet's generator: SplitMix64, small, fast and deterministic (the tests' own).
pub use frostdb_core::testing::SplitMix;

/// An index in `0..n` skewed towards 0, as stack popularity is.
fn skewed(rng: &mut SplitMix, n: usize) -> usize {
    let u = rng.unit();
    ((u * u * u) * n as f64) as usize
}

/// One series: the labels of a process.
#[derive(Debug, Clone)]
pub struct Series {
    /// `namespace` label.
    pub namespace: String,
    /// `pod` label.
    pub pod: String,
    /// `container` label.
    pub container: String,
    /// `node` label.
    pub node: String,
    /// `job` label.
    pub job: String,
}

/// A deterministic fleet of series producing profile batches.
#[derive(Debug, Clone)]
pub struct Fleet {
    /// The series.
    pub series: Vec<Series>,
    stacks: usize,
    rng: SplitMix,
}

/// The kind of profile to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `cpu:cpu:nanoseconds:cpu:nanoseconds`, values in multiples of 10 ms.
    Cpu,
    /// `memory:alloc_space:bytes:space:bytes`, values in multiples of 512 KiB.
    Alloc,
}

impl Fleet {
    /// `series` series over `stacks` distinct stacks, seeded with `seed`.
    pub fn new(seed: u64, series: usize, stacks: usize) -> Self {
        let containers = ["app", "mesh-proxy", "log-agent"];
        let series = (0..series)
            .map(|i| {
                let pod = i / containers.len();
                let app = pod % 7;
                Series {
                    namespace: format!("ns-{}", app % 3),
                    pod: format!("app{app}-7d9f8b6c5d-{:05}", pod * 7919 % 100_000),
                    container: containers[i % containers.len()].to_owned(),
                    node: format!("node-{}", pod % 5),
                    job: format!("ns-{}/app{app}", app % 3),
                }
            })
            .collect();
        Self {
            series,
            stacks: stacks.max(1),
            rng: SplitMix(seed),
        }
    }

    /// The id of stack `index`, as the profile store numbers stacks (partition 1).
    pub fn stack_id(index: usize) -> u64 {
        frostdb_pprof::symbols::symbol_id(1, index as u32)
    }

    /// One profile of series `series` at `timestamp_ms`, with up to `samples` distinct
    /// stacks.
    pub fn profile(
        &mut self,
        series: usize,
        timestamp_ms: i64,
        samples: usize,
        kind: Kind,
    ) -> RecordBatch {
        let s = &self.series[series % self.series.len()];
        // Each series draws from its own rotation of the stack space.
        let offset = series * 7_919;
        let mut stacks: Vec<usize> = (0..samples)
            .map(|_| (skewed(&mut self.rng, self.stacks) + offset) % self.stacks)
            .collect();
        stacks.sort_unstable();
        stacks.dedup();
        let n = stacks.len();
        let (name, sample_type, sample_unit, period_type, period_unit, period) = match kind {
            Kind::Cpu => (
                "cpu",
                "cpu",
                "nanoseconds",
                "cpu",
                "nanoseconds",
                10_000_000,
            ),
            Kind::Alloc => ("memory", "alloc_space", "bytes", "space", "bytes", 524_288),
        };
        let values: Vec<i64> = (0..n)
            .map(|_| (1 + skewed(&mut self.rng, 50) as i64) * period)
            .collect();
        let ids = UInt64Array::from_iter_values(stacks.iter().map(|&i| Self::stack_id(i)));
        let text = |v: &str| -> ArrayRef { Arc::new(StringArray::from(vec![v; n])) };
        let int = |v: i64| -> ArrayRef { Arc::new(Int64Array::from(vec![v; n])) };
        let columns: Vec<(String, ArrayRef)> = vec![
            (NAME.into(), text(name)),
            (SAMPLE_TYPE.into(), text(sample_type)),
            (SAMPLE_UNIT.into(), text(sample_unit)),
            (PERIOD_TYPE.into(), text(period_type)),
            (PERIOD_UNIT.into(), text(period_unit)),
            (label_column("namespace"), text(&s.namespace)),
            (label_column("pod"), text(&s.pod)),
            (label_column("container"), text(&s.container)),
            (label_column("node"), text(&s.node)),
            (label_column("job"), text(&s.job)),
            (STACKTRACE_ID.into(), Arc::new(ids)),
            (TIMESTAMP.into(), int(timestamp_ms)),
            (DURATION.into(), int(10_000_000_000)),
            (PERIOD.into(), int(period)),
            (VALUE.into(), Arc::new(Int64Array::from(values))),
        ];
        let fields: Vec<Field> = columns
            .iter()
            .map(|(name, a)| Field::new(name, a.data_type().clone(), label_of(name).is_some()))
            .collect();
        RecordBatch::try_new(
            Arc::new(ArrowSchema::new(fields)),
            columns.into_iter().map(|(_, a)| a).collect(),
        )
        .expect("consistent columns")
    }

    /// Profiles of every series every 10 s for `steps` steps from `start_ms`, in arrival
    /// order (time-major), alternating CPU and allocation profiles per series.
    pub fn profiles(
        &mut self,
        start_ms: i64,
        steps: usize,
        samples: usize,
    ) -> impl Iterator<Item = RecordBatch> + '_ {
        let series = self.series.len();
        (0..steps)
            .flat_map(move |step| (0..series).map(move |s| (step, s)))
            .map(move |(step, s)| {
                let kind = if (step + s) % 4 == 3 {
                    Kind::Alloc
                } else {
                    Kind::Cpu
                };
                let ts = start_ms + step as i64 * 10_000 + (s as i64 * 37) % 10_000;
                self.profile(s, ts, samples, kind)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_is_deterministic_and_fits_the_schema() {
        let a: Vec<RecordBatch> = Fleet::new(7, 6, 500).profiles(0, 3, 100).collect();
        let b: Vec<RecordBatch> = Fleet::new(7, 6, 500).profiles(0, 3, 100).collect();
        assert_eq!(a, b);
        assert_eq!(a.len(), 18);
        let db = frostdb_core::Db::open_in_memory(frostdb_core::DbOptions::default()).unwrap();
        let table = db
            .table(
                "samples",
                samples_schema(),
                frostdb_core::TableOptions::default(),
            )
            .unwrap();
        for batch in &a {
            table.insert(batch).unwrap();
        }
        let rows: usize = a.iter().map(|b| b.num_rows()).sum();
        assert_eq!(table.stats().rows, rows);
    }
}
