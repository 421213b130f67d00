//! Row group key ranges: the sort key of each row group's first and last row, written in a
//! block's footer (`frostdb.row_group_keys`), so a scan for a few exact series skips the row
//! groups whose key range cannot hold them.
//!
//! Column statistics bound each column alone. Rows sorted by (profile type, labels, time)
//! spread a late key column (a pod, after namespace and node) over its whole range in
//! almost every row group, so `pod = p` prunes little; the range of whole keys, compared
//! lexicographically, places a series exactly: the sparse primary index of ClickHouse's
//! MergeTree, at row group granularity.

use std::cmp::Ordering;

use arrow::array::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::predicate::CmpOp;
use crate::predicate::bound::Bound;
use crate::scalar::Scalar;

/// The footer key the ranges are stored under.
pub(crate) const FOOTER_KEY: &str = "frostdb.row_group_keys";

/// Alternatives (of the disjunctive form of a predicate) past which no range is checked.
const MAX_ALTERNATIVES: usize = 64;

/// A sort key column: its name, descending, nulls first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct KeyColumn {
    pub(crate) name: String,
    pub(crate) descending: bool,
    pub(crate) nulls_first: bool,
}

impl KeyColumn {
    /// Orders two values of this column as the sort does; `None` when they do not compare.
    fn cmp(&self, a: &Scalar, b: &Scalar) -> Option<Ordering> {
        let o = match (a, b) {
            (Scalar::Null, Scalar::Null) => Ordering::Equal,
            (Scalar::Null, _) if self.nulls_first => Ordering::Less,
            (Scalar::Null, _) => Ordering::Greater,
            (_, Scalar::Null) if self.nulls_first => Ordering::Greater,
            (_, Scalar::Null) => Ordering::Less,
            // Nulls aside, the sort's order is ascending or its reverse.
            (a, b) => {
                let o = a.partial_cmp_same(b)?;
                return Some(if self.descending { o.reverse() } else { o });
            }
        };
        Some(o)
    }
}

/// The key ranges of a block's row groups.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RowGroupKeys {
    pub(crate) columns: Vec<KeyColumn>,
    /// Per row group, the keys of its first and last rows.
    pub(crate) ranges: Vec<(Vec<Scalar>, Vec<Scalar>)>,
    /// Whether the ranges are in key order ([`Self::in_order`]), known once read.
    #[serde(skip)]
    pub(crate) ordered: bool,
}

impl RowGroupKeys {
    /// Reads the ranges from a footer's key-value metadata; `None` when absent or not
    /// understood (a block written before them: nothing is skipped by them).
    pub(crate) fn from_footer(
        kv: Option<&Vec<parquet::file::metadata::KeyValue>>,
        row_groups: usize,
    ) -> Option<Self> {
        let text = kv?.iter().find(|kv| kv.key == FOOTER_KEY)?.value.as_ref()?;
        let mut keys: RowGroupKeys = serde_json::from_str(text).ok()?;
        keys.ordered = keys.in_order();
        let width = keys.columns.len();
        (keys.ranges.len() == row_groups
            && keys
                .ranges
                .iter()
                .all(|(a, b)| a.len() == width && b.len() == width))
        .then_some(keys)
    }

    /// The constraints of `bound` these ranges can check, or `None` when there are too many
    /// alternatives or none constrains the key's first column (nothing would be skipped).
    pub(crate) fn checker(&self, bound: &Bound) -> Option<KeyCheck> {
        let alternatives = alternatives(bound)?;
        let first = &self.columns.first()?.name;
        let useful = alternatives.is_empty()
            || alternatives
                .iter()
                .all(|alt| alt.iter().any(|c| c.column() == first.as_str()));
        useful.then_some(KeyCheck { alternatives })
    }

    /// Whether the row groups' ranges follow one another in key order (each ends at or
    /// before the next begins), as a block written from one sorted stream's are: then the
    /// row groups a series may lie in are found by binary search.
    fn in_order(&self) -> bool {
        let full = |a: &[Scalar], b: &[Scalar]| self.compare_prefix(a, b);
        self.ranges
            .iter()
            .all(|(first, last)| full(first, last).is_some_and(|o| o != Ordering::Greater))
            && self
                .ranges
                .windows(2)
                .all(|w| full(&w[0].1, &w[1].0).is_some_and(|o| o != Ordering::Greater))
    }

    /// The row groups `check` may not exclude, in order, found by binary search on the key
    /// prefix each alternative fixes; `None` when the ranges are not in order or an
    /// alternative fixes no prefix (every row group is a candidate). Each candidate is still
    /// to be checked with [`Self::excludes`].
    pub(crate) fn candidates(&self, check: &KeyCheck) -> Option<Vec<usize>> {
        if !self.ordered {
            return None;
        }
        let mut out: Vec<usize> = Vec::new();
        for alt in &check.alternatives {
            let prefix = self.prefix(alt);
            if prefix.is_empty() {
                return None;
            }
            let compare = |row: &[Scalar]| self.compare_prefix(prefix.iter().copied(), row);
            // Row groups wholly before the prefix, then those not wholly after it.
            let start = self
                .ranges
                .partition_point(|(_, last)| compare(last) == Some(Ordering::Greater));
            let end = self
                .ranges
                .partition_point(|(first, _)| compare(first) != Some(Ordering::Less));
            out.extend(start..end.max(start));
        }
        out.sort_unstable();
        out.dedup();
        Some(out)
    }

    /// The longest prefix of the key that `alt` fixes to one value each.
    fn prefix<'a>(&self, alt: &'a [Constraint]) -> Vec<&'a Scalar> {
        let mut prefix = Vec::new();
        for column in &self.columns {
            match alt.iter().find_map(|c| c.equal(&column.name)) {
                Some(v) => prefix.push(v),
                None => break,
            }
        }
        prefix
    }

    /// `prefix` against a row's first key values, lexicographically.
    fn compare_prefix<'a>(
        &self,
        prefix: impl IntoIterator<Item = &'a Scalar>,
        row: &[Scalar],
    ) -> Option<Ordering> {
        for ((column, v), r) in self.columns.iter().zip(prefix).zip(row) {
            match column.cmp(v, r)? {
                Ordering::Equal => continue,
                o => return Some(o),
            }
        }
        Some(Ordering::Equal)
    }

    /// Whether no row of row group `i` can satisfy the predicate `check` was made from.
    pub(crate) fn excludes(&self, check: &KeyCheck, i: usize) -> bool {
        let Some((first, last)) = self.ranges.get(i) else {
            return false;
        };
        check
            .alternatives
            .iter()
            .all(|alt| self.excluded(alt, first, last))
    }

    /// Whether no row between `first` and `last` satisfies every constraint of `alt`.
    fn excluded(&self, alt: &[Constraint], first: &[Scalar], last: &[Scalar]) -> bool {
        let prefix = self.prefix(alt);
        let k = prefix.len();
        let compare = |row: &[Scalar]| self.compare_prefix(prefix.iter().copied(), row);
        let (Some(to_first), Some(to_last)) = (compare(first), compare(last)) else {
            return false;
        };
        if k > 0 && (to_first == Ordering::Less || to_last == Ordering::Greater) {
            return true;
        }
        // Rows sharing the prefix run from the first row's value of the next column (when
        // the first row has the prefix) to the last row's (when the last has it).
        let Some(next) = self.columns.get(k).filter(|c| !c.descending) else {
            return false;
        };
        let bounds = |row: &[Scalar], op_holds: &dyn Fn(CmpOp, Ordering) -> bool| {
            let value = &row[k];
            if matches!(value, Scalar::Null) {
                return false;
            }
            alt.iter().any(|c| match c {
                Constraint::Compare(column, op, v) if column == &next.name => {
                    next.cmp(value, v).is_some_and(|o| op_holds(*op, o))
                }
                _ => false,
            })
        };
        // The first row with the prefix already lies past an upper bound...
        (to_first == Ordering::Equal
            && bounds(first, &|op, o| match op {
                CmpOp::Lt => o != Ordering::Less,
                CmpOp::LtEq => o == Ordering::Greater,
                _ => false,
            }))
            // ...or the last row with it still lies before a lower bound.
            || (to_last == Ordering::Equal
                && bounds(last, &|op, o| match op {
                    CmpOp::Gt => o != Ordering::Greater,
                    CmpOp::GtEq => o == Ordering::Less,
                    _ => false,
                }))
    }
}

/// A predicate in disjunctive form, as far as key ranges can check it.
#[derive(Debug, Clone)]
pub(crate) struct KeyCheck {
    /// Rows may satisfy the predicate only if they satisfy every constraint of one of these
    /// (none: no row does).
    alternatives: Vec<Vec<Constraint>>,
}

/// One constraint a key range is checked against.
#[derive(Debug, Clone)]
enum Constraint {
    /// The column compares so with the value (ascending order; `Eq` fixes it).
    Compare(String, CmpOp, Scalar),
    /// The column is null.
    Null(String),
}

impl Constraint {
    fn column(&self) -> &str {
        match self {
            Constraint::Compare(c, ..) | Constraint::Null(c) => c,
        }
    }

    /// The one value this constraint fixes `column` to.
    fn equal(&self, column: &str) -> Option<&Scalar> {
        match self {
            Constraint::Compare(c, CmpOp::Eq, v) if c == column => Some(v),
            Constraint::Null(c) if c == column => Some(&Scalar::Null),
            _ => None,
        }
    }
}

/// `bound` as alternatives of conjunctions of constraints, leaving out what cannot be
/// checked (which only loosens them); `None` past [`MAX_ALTERNATIVES`].
fn alternatives(bound: &Bound) -> Option<Vec<Vec<Constraint>>> {
    let one = |c: Constraint| Some(vec![vec![c]]);
    match bound {
        Bound::Const(true) => Some(vec![Vec::new()]),
        Bound::Const(false) => Some(Vec::new()),
        Bound::Compare {
            column, op, value, ..
        } if *op != CmpOp::NotEq && !matches!(value, Scalar::Null) => {
            one(Constraint::Compare(column.clone(), *op, value.clone()))
        }
        Bound::IsNull {
            column,
            negated: false,
        } => one(Constraint::Null(column.clone())),
        Bound::InList {
            column,
            values,
            negated: false,
            ..
        } if values.len() <= MAX_ALTERNATIVES => Some(
            values
                .iter()
                .map(|(v, _)| vec![Constraint::Compare(column.clone(), CmpOp::Eq, v.clone())])
                .collect(),
        ),
        Bound::Or(children) => {
            let mut out = Vec::new();
            for child in children {
                out.extend(alternatives(child)?);
                if out.len() > MAX_ALTERNATIVES {
                    return None;
                }
            }
            Some(out)
        }
        Bound::And(children) => {
            let mut out: Vec<Vec<Constraint>> = vec![Vec::new()];
            for child in children {
                let child = alternatives(child)?;
                if out.len() * child.len() > MAX_ALTERNATIVES {
                    return None;
                }
                out = out
                    .iter()
                    .flat_map(|a| {
                        child.iter().map(move |b| {
                            let mut both = a.clone();
                            both.extend(b.iter().cloned());
                            both
                        })
                    })
                    .collect();
            }
            Some(out)
        }
        _ => Some(vec![Vec::new()]),
    }
}

/// Records the key ranges of row groups as a block is written: batches in sort order go
/// through [`Recorder::batch`] before the writer takes them, and [`Recorder::flushed`]
/// learns where the writer cut row groups.
pub(crate) struct Recorder {
    columns: Vec<KeyColumn>,
    /// Rows given so far.
    rows: u64,
    /// Row groups cut so far, and the rows they hold.
    groups: usize,
    cut_rows: u64,
    ranges: Vec<(Vec<Scalar>, Vec<Scalar>)>,
    /// The current batch: rows before it and the batch itself.
    batch: Option<(u64, RecordBatch)>,
    /// The first row's key of the row group in progress.
    open: Option<Vec<Scalar>>,
    /// The key of the last row given.
    last: Option<Vec<Scalar>>,
}

impl Recorder {
    pub(crate) fn new(columns: Vec<KeyColumn>) -> Self {
        Self {
            columns,
            rows: 0,
            groups: 0,
            cut_rows: 0,
            ranges: Vec::new(),
            batch: None,
            open: None,
            last: None,
        }
    }

    fn key(&self, batch: &RecordBatch, row: usize) -> Vec<Scalar> {
        let columns = crate::schema::Columns::new(batch);
        self.columns
            .iter()
            .map(|c| match columns.get(&c.name) {
                Some(a) => Scalar::from_array(a.as_ref(), row),
                None => Scalar::Null,
            })
            .collect()
    }

    /// A batch about to be written.
    pub(crate) fn batch(&mut self, batch: &RecordBatch) {
        if batch.num_rows() == 0 {
            return;
        }
        if self.open.is_none() {
            self.open = Some(self.key(batch, 0));
        }
        self.last = Some(self.key(batch, batch.num_rows() - 1));
        self.batch = Some((self.rows, batch.clone()));
        self.rows += batch.num_rows() as u64;
    }

    /// The row counts of every row group the writer has cut so far (after a write).
    pub(crate) fn flushed(&mut self, row_groups: impl Iterator<Item = u64>) {
        let counts: Vec<u64> = row_groups.skip(self.groups).collect();
        for rows in counts {
            self.cut(rows);
        }
    }

    /// The writer cut a row group of `rows` rows after the ones before.
    fn cut(&mut self, rows: u64) {
        let end = self.cut_rows + rows;
        self.groups += 1;
        self.cut_rows = end;
        let Some((offset, batch)) = &self.batch else {
            return;
        };
        let in_batch = |row: u64| -> Option<usize> {
            (row >= *offset && row < offset + batch.num_rows() as u64)
                .then(|| (row - offset) as usize)
        };
        let last = match in_batch(end - 1) {
            Some(i) => self.key(batch, i),
            None => self.last.clone().unwrap_or_default(),
        };
        let first = self.open.take().unwrap_or_default();
        self.ranges.push((first, last));
        self.open = in_batch(end).map(|i| self.key(batch, i));
    }

    /// The ranges, given the row groups the writer cut before closing (the rows after them
    /// are the last row group, cut at close); `None` if what was recorded does not add up to
    /// the rows written (nothing is then stored, nothing skipped).
    pub(crate) fn finish(mut self, row_groups: impl Iterator<Item = u64>) -> Option<String> {
        self.flushed(row_groups);
        if self.rows > self.cut_rows {
            self.cut(self.rows - self.cut_rows);
        }
        let width = self.columns.len();
        let whole = self.cut_rows == self.rows
            && self
                .ranges
                .iter()
                .all(|(a, b)| a.len() == width && b.len() == width);
        if !whole || self.columns.is_empty() {
            return None;
        }
        serde_json::to_string(&RowGroupKeys {
            columns: self.columns,
            ranges: self.ranges,
            ordered: false,
        })
        .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predicate::bound::bind;
    use crate::predicate::col;

    fn keys() -> RowGroupKeys {
        let column = |name: &str| KeyColumn {
            name: name.into(),
            descending: false,
            nulls_first: false,
        };
        let s = |v: &str| Scalar::Utf8(v.into());
        RowGroupKeys {
            columns: vec![column("ns"), column("pod"), column("ts")],
            ranges: vec![
                // ns a, pods a..z: then ns b up to pod c at 50.
                (
                    vec![s("a"), s("a"), Scalar::Int(0)],
                    vec![s("b"), s("c"), Scalar::Int(50)],
                ),
                // ns b: pod c from 60 to pod m.
                (
                    vec![s("b"), s("c"), Scalar::Int(60)],
                    vec![s("b"), s("m"), Scalar::Int(10)],
                ),
            ],
            ordered: true,
        }
    }

    fn schema() -> crate::schema::TableSchema {
        use crate::schema::{ColumnDef, Schema, SortingColumn};
        use arrow::datatypes::DataType;
        let definition = Schema::builder("t")
            .column(ColumnDef::new("ns", DataType::Utf8))
            .column(ColumnDef::new("pod", DataType::Utf8))
            .column(ColumnDef::new("ts", DataType::Int64))
            .sort_by(SortingColumn::asc("ns"))
            .build()
            .unwrap();
        crate::schema::TableSchema::new(std::sync::Arc::new(definition))
    }

    fn excluded(p: crate::Predicate) -> Vec<bool> {
        let keys = keys();
        let bound = bind(&p, &schema()).unwrap();
        assert!(keys.in_order());
        match keys.checker(&bound) {
            Some(check) => {
                let excluded: Vec<bool> = (0..2).map(|i| keys.excludes(&check, i)).collect();
                // The binary search keeps every row group the check does not exclude.
                if let Some(candidates) = keys.candidates(&check) {
                    for (i, out) in excluded.iter().enumerate() {
                        assert!(*out || candidates.contains(&i), "{i} {candidates:?}");
                    }
                }
                excluded
            }
            None => vec![false, false],
        }
    }

    proptest::proptest! {
        /// Over random sorted blocks cut into random row groups and random series
        /// selections, the binary search finds exactly the row groups a linear pass over
        /// the key prefixes keeps, so no row group the check would read is skipped.
        #[test]
        fn candidates_are_the_row_groups_the_prefix_keeps(
            mut rows in proptest::collection::vec((0u8..3, 0u8..5, 0i64..100), 1..60),
            cuts in proptest::collection::vec(1usize..8, 1..20),
            alts in proptest::collection::vec((0u8..4, proptest::option::of(0u8..6), proptest::option::of(0i64..100)), 1..4),
        ) {
            rows.sort();
            let key = |(ns, pod, ts): (u8, u8, i64)| vec![
                Scalar::Utf8(format!("{}", (b'a' + ns) as char)),
                Scalar::Utf8(format!("{}", (b'a' + pod) as char)),
                Scalar::Int(ts),
            ];
            let mut ranges = Vec::new();
            let (mut at, mut cut) = (0, cuts.iter().cycle());
            while at < rows.len() {
                let end = (at + cut.next().unwrap()).min(rows.len());
                ranges.push((key(rows[at]), key(rows[end - 1])));
                at = end;
            }
            let mut keys = RowGroupKeys { ranges, ..keys() };
            keys.ordered = keys.in_order();
            proptest::prop_assert!(keys.ordered);
            let mut predicate: Option<crate::Predicate> = None;
            for (ns, pod, ts) in alts {
                let mut p = col("ns").eq(format!("{}", (b'a' + ns) as char));
                if let Some(pod) = pod {
                    p = p.and(col("pod").eq(format!("{}", (b'a' + pod) as char)));
                }
                if let Some(ts) = ts {
                    p = p.and(col("ts").gt_eq(ts));
                }
                predicate = Some(match predicate {
                    None => p,
                    Some(q) => q.or(p),
                });
            }
            let bound = bind(&predicate.unwrap(), &schema()).unwrap();
            let check = keys.checker(&bound).unwrap();
            let candidates = keys.candidates(&check).unwrap();
            let linear: Vec<usize> = (0..keys.ranges.len())
                .filter(|i| {
                    let (first, last) = &keys.ranges[*i];
                    check.alternatives.iter().any(|alt| {
                        let prefix = keys.prefix(alt);
                        keys.compare_prefix(prefix.iter().copied(), first) != Some(Ordering::Less)
                            && keys.compare_prefix(prefix.iter().copied(), last) != Some(Ordering::Greater)
                    })
                })
                .collect();
            proptest::prop_assert_eq!(&candidates, &linear);
            for i in 0..keys.ranges.len() {
                proptest::prop_assert!(candidates.contains(&i) || keys.excludes(&check, i));
            }
        }
    }

    #[test]
    fn key_ranges_place_exact_keys_and_time_bounds() {
        // b/c lies in both: its rows up to 50 in the first, from 60 in the second.
        assert_eq!(
            excluded(col("ns").eq("b").and(col("pod").eq("c"))),
            [false, false]
        );
        assert_eq!(
            excluded(
                col("ns")
                    .eq("b")
                    .and(col("pod").eq("c"))
                    .and(col("ts").gt_eq(55i64))
            ),
            [true, false]
        );
        assert_eq!(
            excluded(
                col("ns")
                    .eq("b")
                    .and(col("pod").eq("c"))
                    .and(col("ts").lt(60i64))
            ),
            [false, true]
        );
        // b/d is only in the second; b/a only in the first; a/x only in the first.
        assert_eq!(
            excluded(col("ns").eq("b").and(col("pod").eq("d"))),
            [true, false]
        );
        assert_eq!(
            excluded(col("pod").eq("a").and(col("ns").eq("b"))),
            [false, true]
        );
        assert_eq!(
            excluded(col("ns").eq("a").and(col("pod").eq("x"))),
            [false, true]
        );
        // Past the last key; an alternative in each; a pod alone fixes no prefix.
        assert_eq!(excluded(col("ns").eq("c")), [true, true]);
        assert_eq!(
            excluded(
                col("ns")
                    .eq("a")
                    .or(col("ns").eq("b").and(col("pod").eq("z")))
            ),
            [false, true]
        );
        assert_eq!(excluded(col("pod").eq("zz")), [false, false]);
        assert_eq!(
            excluded(col("ns").in_list(["a", "c"])),
            [false, true],
            "an IN list is one alternative per value"
        );
    }
}
