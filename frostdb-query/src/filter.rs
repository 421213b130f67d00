//! DataFusion filter expressions turned into engine predicates.
//!
//! A filter converts when it is built from columns, literals, comparisons, `IN`, `IS [NOT]
//! NULL`, `NOT`, `AND`, `OR`, regex matches (`~` and its kin, `regexp_like` as SQL plans
//! them) and `LIKE`: the engine then evaluates it exactly (SQL three-valued logic, the same
//! Arrow kernels and regex engine DataFusion uses), so the provider answers `Exact` and
//! DataFusion drops its own filter. Anything else (other functions, arithmetic, casts that
//! change values, patterns the engine would not search in linear time) stays with
//! DataFusion.

use arrow::datatypes::{DataType, Schema as ArrowSchema};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{BinaryExpr, Expr, Like, Operator};
use frostdb_core::{CmpOp, Predicate, Scalar};

/// The engine predicate equivalent to `expr` over a table of `schema`, if there is one.
pub(crate) fn to_predicate(expr: &Expr, schema: &ArrowSchema) -> Option<Predicate> {
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => binary(left, *op, right, schema),
        Expr::Not(inner) => Some(!to_predicate(inner, schema)?),
        Expr::IsNull(inner) => Some(column(inner, schema)?.is_null()),
        Expr::IsNotNull(inner) => Some(column(inner, schema)?.is_not_null()),
        Expr::InList(list) => {
            let col = column(&list.expr, schema)?;
            let values = list.list.iter().map(literal).collect::<Option<Vec<_>>>()?;
            Some(if list.negated {
                col.not_in_list(values)
            } else {
                col.in_list(values)
            })
        }
        Expr::Between(between) => {
            let name = column_name(&between.expr, schema)?;
            let low = literal(&between.low)?;
            let high = literal(&between.high)?;
            let inside = frostdb_core::col(name.clone())
                .gt_eq(low)
                .and(frostdb_core::col(name).lt_eq(high));
            Some(if between.negated { !inside } else { inside })
        }
        Expr::Like(like) => like_to_regex(like, schema),
        // `~` and its kin, planned as `regexp_like` (`functions.rs`).
        Expr::ScalarFunction(f) if f.func.name() == "regexp_like" => {
            let flags = match f.args.get(2).map(literal) {
                None => "",
                Some(Some(Scalar::Utf8(flags))) if flags.is_empty() => "",
                Some(Some(Scalar::Utf8(flags))) if flags == "i" => "(?i)",
                Some(_) => return None,
            };
            let Scalar::Utf8(pattern) = literal(f.args.get(1)?)? else {
                return None;
            };
            regex(f.args.first()?, format!("{flags}{pattern}"), false, schema)
        }
        Expr::Literal(ScalarValue::Boolean(Some(b)), _) => Some(Predicate::Const(*b)),
        _ => None,
    }
}

fn binary(left: &Expr, op: Operator, right: &Expr, schema: &ArrowSchema) -> Option<Predicate> {
    match op {
        Operator::And => Some(to_predicate(left, schema)?.and(to_predicate(right, schema)?)),
        Operator::Or => Some(to_predicate(left, schema)?.or(to_predicate(right, schema)?)),
        Operator::RegexMatch
        | Operator::RegexIMatch
        | Operator::RegexNotMatch
        | Operator::RegexNotIMatch => {
            let Scalar::Utf8(pattern) = literal(right)? else {
                return None;
            };
            let pattern = match op {
                Operator::RegexIMatch | Operator::RegexNotIMatch => format!("(?i){pattern}"),
                _ => pattern,
            };
            let negated = matches!(op, Operator::RegexNotMatch | Operator::RegexNotIMatch);
            regex(left, pattern, negated, schema)
        }
        _ => {
            let cmp = match op {
                Operator::Eq => CmpOp::Eq,
                Operator::NotEq => CmpOp::NotEq,
                Operator::Lt => CmpOp::Lt,
                Operator::LtEq => CmpOp::LtEq,
                Operator::Gt => CmpOp::Gt,
                Operator::GtEq => CmpOp::GtEq,
                _ => return None,
            };
            // `column op literal`, or `literal op column` with the operator mirrored.
            let (name, value, cmp) = match (column_name(left, schema), literal(right)) {
                (Some(name), Some(value)) => (name, value, cmp),
                _ => {
                    let name = column_name(right, schema)?;
                    let value = literal(left)?;
                    let mirrored = match cmp {
                        CmpOp::Lt => CmpOp::Gt,
                        CmpOp::LtEq => CmpOp::GtEq,
                        CmpOp::Gt => CmpOp::Lt,
                        CmpOp::GtEq => CmpOp::LtEq,
                        other => other,
                    };
                    (name, value, mirrored)
                }
            };
            Some(Predicate::Compare {
                column: name,
                op: cmp,
                value,
            })
        }
    }
}

/// The lazy DFA cache the engine matches a pattern with (frostdb-core's 256 KiB): it is
/// given only patterns whose DFA fits in half of it, so its search stays a step a byte.
/// Others stay with DataFusion, whose `regexp_like` counts its steps.
const ENGINE_DFA_CACHE: usize = 256 << 10;

/// `expr` (a column) matching `pattern`, if the engine searches it in linear time.
fn regex(expr: &Expr, pattern: String, negated: bool, schema: &ArrowSchema) -> Option<Predicate> {
    let col = column(expr, schema)?;
    let cost = crate::regex_cost::cost(&pattern).ok()??;
    if !cost.linear_in(ENGINE_DFA_CACHE) {
        return None;
    }
    Some(if negated {
        col.regex_not_match(pattern)
    } else {
        col.regex_match(pattern)
    })
}

fn column(expr: &Expr, schema: &ArrowSchema) -> Option<frostdb_core::Col> {
    column_name(expr, schema).map(frostdb_core::col)
}

/// The column `expr` reads unchanged: a column of the table, possibly behind a cast that only
/// changes representation (a dictionary to its values, or a string type to another).
fn column_name(expr: &Expr, schema: &ArrowSchema) -> Option<String> {
    match expr {
        Expr::Column(c) => schema
            .field_with_name(&c.name)
            .ok()
            .map(|f| f.name().clone()),
        Expr::Cast(cast) => {
            let name = column_name(&cast.expr, schema)?;
            let from = schema.field_with_name(&name).ok()?.data_type();
            representation_only(from, cast.field.data_type()).then_some(name)
        }
        _ => None,
    }
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn representation_only(from: &DataType, to: &DataType) -> bool {
    let values = match from {
        DataType::Dictionary(_, v) => v.as_ref(),
        other => other,
    };
    from == to || (is_string(values) && is_string(to))
}

/// A non-null literal.
fn literal(expr: &Expr) -> Option<Scalar> {
    match expr {
        Expr::Literal(value, _) => scalar(value),
        Expr::Cast(cast) => literal(&cast.expr),
        _ => None,
    }
}

pub(crate) fn scalar(value: &ScalarValue) -> Option<Scalar> {
    use ScalarValue as S;
    Some(match value {
        S::Utf8(Some(s)) | S::LargeUtf8(Some(s)) | S::Utf8View(Some(s)) => Scalar::Utf8(s.clone()),
        S::Boolean(Some(b)) => Scalar::Boolean(*b),
        S::Int8(Some(v)) => Scalar::Int((*v).into()),
        S::Int16(Some(v)) => Scalar::Int((*v).into()),
        S::Int32(Some(v)) => Scalar::Int((*v).into()),
        S::Int64(Some(v)) => Scalar::Int(*v),
        S::UInt8(Some(v)) => Scalar::UInt((*v).into()),
        S::UInt16(Some(v)) => Scalar::UInt((*v).into()),
        S::UInt32(Some(v)) => Scalar::UInt((*v).into()),
        S::UInt64(Some(v)) => Scalar::UInt(*v),
        S::Float32(Some(v)) => Scalar::Float((*v).into()),
        S::Float64(Some(v)) => Scalar::Float(*v),
        S::Binary(Some(b)) | S::LargeBinary(Some(b)) | S::BinaryView(Some(b)) => {
            Scalar::Binary(b.clone())
        }
        S::FixedSizeBinary(_, Some(b)) => Scalar::Binary(b.clone()),
        S::Dictionary(_, inner) => return scalar(inner),
        _ => return None,
    })
}

/// `LIKE` as an anchored regex (`%` any run, `_` one character, the escape character
/// escaping them: `\` when none is given, as DataFusion and Arrow take it; before, the
/// pushed filter matched `a\%b` as a backslash then anything, and answered other rows
/// than the same statement evaluated by DataFusion).
fn like_to_regex(like: &Like, schema: &ArrowSchema) -> Option<Predicate> {
    let Scalar::Utf8(pattern) = literal(&like.pattern)? else {
        return None;
    };
    let escape = like.escape_char.unwrap_or('\\');
    // A pattern ending in its escape is left to DataFusion.
    let regex = crate::regex_cost::like_regex(&pattern, like.case_insensitive, escape)?;
    self::regex(&like.expr, regex, like.negated, schema)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::Field;
    use datafusion::prelude::{Expr, ident, lit};

    use super::*;

    fn schema() -> ArrowSchema {
        ArrowSchema::new(vec![
            Field::new(
                "labels.pod",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                true,
            ),
            Field::new("timestamp", DataType::Int64, false),
        ])
    }

    fn convert(e: Expr) -> Option<Predicate> {
        to_predicate(&e, &schema())
    }

    #[test]
    fn converts_what_the_engine_evaluates_exactly() {
        let pod = || ident("labels.pod");
        let ts = || ident("timestamp");
        assert_eq!(
            convert(pod().eq(lit("a"))),
            Some(frostdb_core::col("labels.pod").eq("a"))
        );
        assert_eq!(
            convert(lit(5i64).lt(ts())),
            Some(frostdb_core::col("timestamp").gt(5i64))
        );
        assert!(convert(ts().between(lit(1i64), lit(2i64))).is_some());
        assert!(convert(pod().in_list(vec![lit("a"), lit("b")], true)).is_some());
        assert!(convert(pod().is_null().or(ts().gt_eq(lit(3i64)))).is_some());
        assert!(convert(pod().like(lit("a%_b"))).is_some());
        assert!(
            convert(Expr::BinaryExpr(BinaryExpr::new(
                Box::new(pod()),
                Operator::RegexMatch,
                Box::new(lit("^a"))
            )))
            .is_some()
        );
        let cast = Expr::Cast(datafusion::logical_expr::Cast::new(
            Box::new(pod()),
            DataType::Utf8,
        ));
        assert!(
            convert(cast.eq(lit("x"))).is_some(),
            "dictionary to values is transparent"
        );
    }

    /// A regular expression goes to the engine only when its search is a step a byte
    /// there (its DFA fits half the engine's lazy cache); `regexp_like`, as `~` is
    /// planned, converts with its flags.
    #[test]
    fn regexes_go_to_the_engine_only_when_it_searches_them_linearly() {
        let pod = || ident("labels.pod");
        let like = |args: Vec<Expr>| datafusion::functions::regex::regexp_like().call(args);
        assert_eq!(
            convert(like(vec![pod(), lit("^a"), lit("i")])),
            Some(frostdb_core::col("labels.pod").regex_match("(?i)^a"))
        );
        assert_eq!(
            convert(!like(vec![pod(), lit("^a")])),
            Some(!frostdb_core::col("labels.pod").regex_match("^a"))
        );
        assert!(convert(like(vec![pod(), lit("^a"), lit("x")])).is_none());
        let matches = |pattern: &str| {
            Expr::BinaryExpr(BinaryExpr::new(
                Box::new(pod()),
                Operator::RegexMatch,
                Box::new(lit(pattern)),
            ))
        };
        assert!(convert(matches("-[0-9a-z]+$")).is_some());
        assert!(convert(matches("[ -~]{5000}")).is_none());
        assert!(convert(like(vec![pod(), lit("[ -~]{5000}")])).is_none());
        assert!(convert(pod().like(lit(format!("%{}", "_".repeat(1500))))).is_none());
    }

    #[test]
    fn leaves_the_rest_to_datafusion() {
        let ts = || ident("timestamp");
        assert!(convert((ts() + lit(1i64)).eq(lit(2i64))).is_none());
        assert!(convert(ident("missing").eq(lit(2i64))).is_none());
        assert!(convert(ts().eq(lit(ScalarValue::Int64(None)))).is_none());
        let widen = Expr::Cast(datafusion::logical_expr::Cast::new(
            Box::new(ts()),
            DataType::Float64,
        ));
        assert!(convert(widen.eq(lit(1.5))).is_none());
        let _ = Arc::new(());
    }

    #[test]
    fn like_becomes_an_anchored_regex() {
        let like = Like::new(
            false,
            Box::new(ident("labels.pod")),
            Box::new(lit("a.b%")),
            None,
            false,
        );
        match like_to_regex(&like, &schema()) {
            Some(Predicate::Regex { pattern, .. }) => assert_eq!(pattern, "(?s)^a\\.b.*$"),
            other => panic!("{other:?}"),
        }
        // A backslash escapes what follows when no escape character is given.
        let escaped = Like::new(
            false,
            Box::new(ident("labels.pod")),
            Box::new(lit("a\\%b_")),
            None,
            false,
        );
        match like_to_regex(&escaped, &schema()) {
            Some(Predicate::Regex { pattern, .. }) => assert_eq!(pattern, "(?s)^a%b.$"),
            other => panic!("{other:?}"),
        }
        let trailing = Like::new(
            false,
            Box::new(ident("labels.pod")),
            Box::new(lit("a\\")),
            None,
            false,
        );
        assert!(like_to_regex(&trailing, &schema()).is_none());
    }
}
