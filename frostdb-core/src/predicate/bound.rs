//! A predicate bound to a snapshot's schema: literals coerced to column types, regexes
//! compiled, negations pushed down to the leaves. Evaluates on batches (vectorised, with
//! three-valued logic) and on chunk statistics (pruning).

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::buffer::NullBuffer;
use arrow::compute::kernels::cmp;
use arrow::compute::{and_kleene, not, or_kleene, take};
use arrow::datatypes::DataType;
use regex::{Regex, RegexBuilder};

use super::expr::{CmpOp, Predicate};
use super::stats::ColumnStats;
use crate::error::{Error, Result};
use crate::scalar::Scalar;
use crate::schema::{ColumnName, TableSchema, field_for};

/// Largest compiled regex program accepted, to bound memory on hostile patterns: the limit
/// a profile selector's regexes are compiled under (frostdb-profile's `REGEX_SIZE_LIMIT`),
/// so a pattern a selector accepts binds here too.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Largest lazy-DFA cache each thread matching a regex grows (the default is 2 MiB), as
/// the selector's (frostdb-profile's `REGEX_DFA_LIMIT`).
const REGEX_DFA_LIMIT: usize = 256 << 10;

#[derive(Debug, Clone)]
pub(crate) enum Bound {
    Const(bool),
    Compare {
        column: String,
        op: CmpOp,
        value: Scalar,
        array: ArrayRef,
    },
    InList {
        column: String,
        values: Vec<(Scalar, ArrayRef)>,
        negated: bool,
        /// The values as a set, for a long list of text: evaluated with one lookup a row
        /// rather than one comparison kernel a value (thousands of span ids).
        set: Option<std::sync::Arc<std::collections::HashSet<String>>>,
    },
    IsNull {
        column: String,
        negated: bool,
    },
    Regex {
        column: String,
        regex: Regex,
        negated: bool,
    },
    And(Vec<Bound>),
    Or(Vec<Bound>),
}

/// The logical value type of `column` in `schema`. Columns the snapshot has not seen resolve
/// through the definition (a dynamic label nobody sent yet is valid and all null).
fn column_type(schema: &TableSchema, column: &str) -> Result<DataType> {
    let storage = match schema.index_of(column) {
        Some(i) => schema.arrow_schema().field(i).data_type().clone(),
        None => {
            let name = ColumnName::resolve(schema.definition(), column)?;
            field_for(schema.definition(), &name).data_type().clone()
        }
    };
    Ok(match storage {
        DataType::Dictionary(_, v) => *v,
        other => other,
    })
}

fn invalid(column: &str, reason: impl Into<String>) -> Error {
    Error::InvalidPredicate {
        column: column.to_owned(),
        reason: reason.into(),
    }
}

/// Binds `predicate` to `schema`.
pub(crate) fn bind(predicate: &Predicate, schema: &TableSchema) -> Result<Bound> {
    bind_inner(predicate, schema, false)
}

fn bind_inner(p: &Predicate, schema: &TableSchema, negate: bool) -> Result<Bound> {
    Ok(match p {
        Predicate::Const(b) => Bound::Const(*b != negate),
        Predicate::Not(inner) => bind_inner(inner, schema, !negate)?,
        Predicate::And(children) | Predicate::Or(children) => {
            let children = children
                .iter()
                .map(|c| bind_inner(c, schema, negate))
                .collect::<Result<Vec<_>>>()?;
            // De Morgan holds in Kleene logic, so negation flips the connective.
            let is_and = matches!(p, Predicate::And(_)) != negate;
            simplify(is_and, children)
        }
        Predicate::Compare { column, op, value } => {
            let t = column_type(schema, column)?;
            let value = value.coerce_to(&t).map_err(|r| invalid(column, r))?;
            Bound::Compare {
                column: column.clone(),
                op: if negate { op.negate() } else { *op },
                array: value.to_array(&t),
                value,
            }
        }
        Predicate::InList {
            column,
            values,
            negated,
        } => {
            let t = column_type(schema, column)?;
            let values = values
                .iter()
                .map(|v| {
                    let v = v.coerce_to(&t).map_err(|r| invalid(column, r))?;
                    let a = v.to_array(&t);
                    Ok((v, a))
                })
                .collect::<Result<Vec<_>>>()?;
            // Past a few values, a lookup a row beats a kernel a value.
            let set = (t == DataType::Utf8 && values.len() > 8).then(|| {
                let texts = values.iter().filter_map(|(v, _)| match v {
                    Scalar::Utf8(s) => Some(s.clone()),
                    _ => None,
                });
                std::sync::Arc::new(texts.collect())
            });
            Bound::InList {
                column: column.clone(),
                values,
                negated: *negated != negate,
                set,
            }
        }
        Predicate::IsNull { column, negated } => {
            column_type(schema, column)?;
            Bound::IsNull {
                column: column.clone(),
                negated: *negated != negate,
            }
        }
        Predicate::Regex {
            column,
            pattern,
            negated,
        } => {
            let t = column_type(schema, column)?;
            if t != DataType::Utf8 {
                return Err(invalid(column, format!("regex match on a {t} column")));
            }
            let regex = RegexBuilder::new(pattern)
                .size_limit(REGEX_SIZE_LIMIT)
                .dfa_size_limit(REGEX_DFA_LIMIT)
                .build()
                .map_err(|e| invalid(column, format!("bad regex {pattern:?}: {e}")))?;
            Bound::Regex {
                column: column.clone(),
                regex,
                negated: *negated != negate,
            }
        }
    })
}

fn simplify(is_and: bool, children: Vec<Bound>) -> Bound {
    let mut out = Vec::with_capacity(children.len());
    for c in children {
        match c {
            // AND(true, x) = x; AND(false, x) = false; dually for OR.
            Bound::Const(b) if b == is_and => {}
            Bound::Const(b) => return Bound::Const(b),
            Bound::And(inner) if is_and => out.extend(inner),
            Bound::Or(inner) if !is_and => out.extend(inner),
            other => out.push(other),
        }
    }
    match out.len() {
        0 => Bound::Const(is_and),
        1 => out.pop().expect("one child"),
        _ if is_and => Bound::And(out),
        _ => Bound::Or(out),
    }
}

/// `n` rows all `value`, set a word at a time (`BooleanArray::from(Vec<bool>)` packs bit by
/// bit, which showed in profiles of scans of many small batches).
fn constant(value: bool, n: usize) -> BooleanArray {
    let bits = if value {
        arrow::buffer::BooleanBuffer::new_set(n)
    } else {
        arrow::buffer::BooleanBuffer::new_unset(n)
    };
    BooleanArray::new(bits, None)
}

impl Bound {
    /// Whether the predicate is a constant true.
    pub(crate) fn is_true(&self) -> bool {
        matches!(self, Bound::Const(true))
    }

    /// Names of the columns the predicate reads (with repeats).
    pub(crate) fn columns(&self, out: &mut Vec<String>) {
        match self {
            Bound::Const(_) => {}
            Bound::Compare { column, .. }
            | Bound::InList { column, .. }
            | Bound::IsNull { column, .. }
            | Bound::Regex { column, .. } => out.push(column.clone()),
            Bound::And(c) | Bound::Or(c) => c.iter().for_each(|c| c.columns(out)),
        }
    }

    /// Evaluates the predicate on every row of `batch`; null means unknown.
    pub(crate) fn evaluate(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        let n = batch.num_rows();
        Ok(match self {
            Bound::Const(b) => constant(*b, n),
            Bound::And(children) | Bound::Or(children) => {
                let mut acc = children[0].evaluate(batch)?;
                for c in &children[1..] {
                    let next = c.evaluate(batch)?;
                    acc = if matches!(self, Bound::And(_)) {
                        and_kleene(&acc, &next)?
                    } else {
                        or_kleene(&acc, &next)?
                    };
                }
                acc
            }
            Bound::IsNull { column, negated } => {
                let nulls = batch
                    .column_by_name(column)
                    .map(|c| c.logical_nulls())
                    .unwrap_or_else(|| Some(NullBuffer::new_null(n)));
                let is_valid = match nulls {
                    Some(nulls) => nulls.inner().clone(),
                    None => arrow::buffer::BooleanBuffer::new_set(n),
                };
                if *negated {
                    BooleanArray::new(is_valid, None)
                } else {
                    BooleanArray::new(!&is_valid, None)
                }
            }
            Bound::Compare { column, .. }
            | Bound::InList { column, .. }
            | Bound::Regex { column, .. } => match batch.column_by_name(column) {
                None => BooleanArray::new_null(n),
                Some(c) => match c.as_any_dictionary_opt() {
                    // Evaluate once per distinct value, then map the keys onto the results.
                    Some(dict) => {
                        let per_value = self.evaluate_values(dict.values())?;
                        // Every value decides the same way (one namespace in the batch):
                        // no key needs mapping.
                        if dict.keys().null_count() == 0 && per_value.null_count() == 0 {
                            let hits = per_value.true_count();
                            if hits == per_value.len() || hits == 0 {
                                return Ok(constant(hits > 0, n));
                            }
                        }
                        let mapped = take(&per_value, dict.keys(), None)?;
                        mapped.as_boolean().clone()
                    }
                    None => self.evaluate_values(c)?,
                },
            },
        })
    }

    /// Evaluates a leaf on a plain (non-dictionary) array.
    fn evaluate_values(&self, values: &ArrayRef) -> Result<BooleanArray> {
        Ok(match self {
            Bound::Compare { op, array, .. } => {
                let lit = arrow::array::Scalar::new(array.clone());
                match op {
                    CmpOp::Eq => cmp::eq(values, &lit)?,
                    CmpOp::NotEq => cmp::neq(values, &lit)?,
                    CmpOp::Lt => cmp::lt(values, &lit)?,
                    CmpOp::LtEq => cmp::lt_eq(values, &lit)?,
                    CmpOp::Gt => cmp::gt(values, &lit)?,
                    CmpOp::GtEq => cmp::gt_eq(values, &lit)?,
                }
            }
            Bound::InList {
                set: Some(set),
                negated,
                ..
            } if values.data_type() == &DataType::Utf8 => values
                .as_string::<i32>()
                .iter()
                .map(|v| v.map(|s| set.contains(s) != *negated))
                .collect(),
            Bound::InList {
                values: list,
                negated,
                ..
            } => {
                let mut acc = constant(false, values.len());
                // Keep nulls unknown: start from the column's null mask.
                if let Some(nulls) = values.logical_nulls() {
                    acc = BooleanArray::new(acc.values().clone(), Some(nulls));
                }
                for (_, a) in list {
                    let hit = cmp::eq(values, &arrow::array::Scalar::new(a.clone()))?;
                    acc = or_kleene(&acc, &hit)?;
                }
                if *negated { not(&acc)? } else { acc }
            }
            Bound::Regex { regex, negated, .. } => {
                let strings = values.as_string::<i32>();
                strings
                    .iter()
                    .map(|v| v.map(|s| regex.is_match(s) != *negated))
                    .collect()
            }
            _ => unreachable!("only leaves evaluate on values"),
        })
    }

    /// Whether every row of a chunk with these statistics satisfies the predicate: `true` is
    /// a proof (the rows need no evaluation, nor their filter columns reading). `stats` must
    /// give only exact bounds, and `None` where it has none; that proves nothing.
    pub(crate) fn must_match(
        &self,
        stats: &dyn Fn(&str) -> Option<ColumnStats>,
        rows: usize,
    ) -> bool {
        use std::cmp::Ordering::*;
        // A comparison holds for no null, so only columns without nulls prove anything.
        let bounds = |column: &str| {
            stats(column)
                .filter(|s| s.null_count == 0)
                .and_then(|s| Some((s.min?, s.max?)))
        };
        match self {
            Bound::Const(b) => *b,
            Bound::And(c) => c.iter().all(|c| c.must_match(stats, rows)),
            Bound::Or(c) => c.iter().any(|c| c.must_match(stats, rows)),
            Bound::IsNull { column, negated } => stats(column).is_some_and(|s| {
                if *negated {
                    s.null_count == 0
                } else {
                    s.null_count == rows
                }
            }),
            Bound::Regex {
                column,
                regex,
                negated,
            } => match bounds(column) {
                Some((Scalar::Utf8(min), Scalar::Utf8(max))) if min == max => {
                    regex.is_match(&min) != *negated
                }
                _ => false,
            },
            Bound::Compare {
                column, op, value, ..
            } => {
                let Some((min, max)) = bounds(column) else {
                    return false;
                };
                let (Some(vmin), Some(vmax)) =
                    (value.partial_cmp_same(&min), value.partial_cmp_same(&max))
                else {
                    return false;
                };
                match op {
                    CmpOp::Eq => vmin == Equal && vmax == Equal,
                    CmpOp::NotEq => vmin == Less || vmax == Greater,
                    CmpOp::Lt => vmax == Greater,
                    CmpOp::LtEq => vmax != Less,
                    CmpOp::Gt => vmin == Less,
                    CmpOp::GtEq => vmin != Greater,
                }
            }
            Bound::InList {
                column,
                values,
                negated,
                ..
            } => {
                let Some((min, max)) = bounds(column) else {
                    return false;
                };
                if *negated {
                    // Every listed value lies outside the chunk's range.
                    values.iter().all(|(v, _)| {
                        v.partial_cmp_same(&min) == Some(Less)
                            || v.partial_cmp_same(&max) == Some(Greater)
                    })
                } else {
                    min == max && values.iter().any(|(v, _)| *v == min)
                }
            }
        }
    }

    /// The predicate less the conjuncts statistics prove (as [`Bound::must_match`], `stats`
    /// giving only exact bounds): what rows of a chunk with these statistics still need
    /// evaluated against; `Const(true)` when the whole predicate is proven. Pushes, per
    /// conjunct visited, whether it was proven: a signature equal for chunks whose residuals
    /// are equal.
    pub(crate) fn residual(
        &self,
        stats: &dyn Fn(&str) -> Option<ColumnStats>,
        rows: usize,
        proven: &mut Vec<bool>,
    ) -> Bound {
        match self {
            Bound::And(children) => {
                let mut rest: Vec<Bound> = children
                    .iter()
                    .map(|c| c.residual(stats, rows, proven))
                    .filter(|c| !c.is_true())
                    .collect();
                match rest.len() {
                    0 => Bound::Const(true),
                    1 => rest.pop().expect("one left"),
                    _ => Bound::And(rest),
                }
            }
            leaf => {
                let holds = leaf.must_match(stats, rows);
                proven.push(holds);
                if holds {
                    Bound::Const(true)
                } else {
                    leaf.clone()
                }
            }
        }
    }

    /// Whether any row of a chunk with these statistics may satisfy the predicate. `false`
    /// is a proof that none does. `stats` gives `None` for a column whose statistics are
    /// unknown, which then prunes nothing.
    pub(crate) fn may_match(
        &self,
        stats: &dyn Fn(&str) -> Option<ColumnStats>,
        rows: usize,
    ) -> bool {
        use std::cmp::Ordering::*;
        match self {
            Bound::Const(b) => *b,
            Bound::And(c) => c.iter().all(|c| c.may_match(stats, rows)),
            Bound::Or(c) => c.iter().any(|c| c.may_match(stats, rows)),
            Bound::IsNull { column, negated } => {
                let Some(s) = stats(column) else {
                    return true;
                };
                if *negated {
                    s.null_count < rows
                } else {
                    s.null_count > 0
                }
            }
            Bound::Regex { column, .. } => stats(column).is_none_or(|s| s.min.is_some()),
            Bound::Compare {
                column, op, value, ..
            } => {
                let Some(s) = stats(column) else {
                    return true;
                };
                let (Some(min), Some(max)) = (&s.min, &s.max) else {
                    return false;
                };
                let (Some(vmin), Some(vmax)) =
                    (value.partial_cmp_same(min), value.partial_cmp_same(max))
                else {
                    return true;
                };
                match op {
                    CmpOp::Eq => vmin != Less && vmax != Greater,
                    CmpOp::NotEq => !(vmin == Equal && vmax == Equal),
                    CmpOp::Lt => vmin == Greater,
                    CmpOp::LtEq => vmin != Less,
                    CmpOp::Gt => vmax == Less,
                    CmpOp::GtEq => vmax != Greater,
                }
            }
            Bound::InList {
                column,
                values,
                negated,
                ..
            } => {
                let Some(s) = stats(column) else {
                    return true;
                };
                let (Some(min), Some(max)) = (&s.min, &s.max) else {
                    return false;
                };
                let inside = |v: &Scalar| {
                    v.partial_cmp_same(min).is_none_or(|o| o != Less)
                        && v.partial_cmp_same(max).is_none_or(|o| o != Greater)
                };
                if *negated {
                    // Only a chunk whose every non-null value is one listed value is excluded.
                    !(min == max && values.iter().any(|(v, _)| v == min))
                } else {
                    values.iter().any(|(v, _)| inside(v))
                }
            }
        }
    }
}
