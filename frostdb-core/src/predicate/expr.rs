//! Predicates: what a scan filters by, built with [`col`].
//!
//! Semantics are SQL's three-valued logic: a comparison with a null value is unknown, unknown
//! rows are filtered out, `NOT unknown` is unknown. A column the table has never seen (a
//! dynamic label nobody sent) is null in every row.

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CmpOp {
    /// `=`
    Eq,
    /// `!=`
    NotEq,
    /// `<`
    Lt,
    /// `<=`
    LtEq,
    /// `>`
    Gt,
    /// `>=`
    GtEq,
}

impl CmpOp {
    /// The operator `NOT (a op b)` equals, under three-valued logic.
    pub(crate) fn negate(self) -> Self {
        match self {
            CmpOp::Eq => CmpOp::NotEq,
            CmpOp::NotEq => CmpOp::Eq,
            CmpOp::Lt => CmpOp::GtEq,
            CmpOp::LtEq => CmpOp::Gt,
            CmpOp::Gt => CmpOp::LtEq,
            CmpOp::GtEq => CmpOp::Lt,
        }
    }
}

/// A filter over a table's rows (serialisable: a query spread over processes sends it).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum Predicate {
    /// Always true or always false.
    Const(bool),
    /// `column op value`.
    Compare {
        /// Concrete column name.
        column: String,
        /// Operator.
        op: CmpOp,
        /// The literal.
        value: crate::Scalar,
    },
    /// `column [NOT] IN (values)`.
    InList {
        /// Concrete column name.
        column: String,
        /// The literals.
        values: Vec<crate::Scalar>,
        /// `NOT IN`.
        negated: bool,
    },
    /// `column IS [NOT] NULL`.
    IsNull {
        /// Concrete column name.
        column: String,
        /// `IS NOT NULL`.
        negated: bool,
    },
    /// Regular expression match on a string column, unanchored (wrap the pattern in `^(?:…)$`
    /// for a full match).
    Regex {
        /// Concrete column name.
        column: String,
        /// The pattern, in the syntax of the `regex` crate.
        pattern: String,
        /// Match rows that do *not* match.
        negated: bool,
    },
    /// All of these.
    And(Vec<Predicate>),
    /// Any of these.
    Or(Vec<Predicate>),
    /// Not this.
    Not(Box<Predicate>),
}

impl Predicate {
    /// `self AND other`.
    pub fn and(self, other: Predicate) -> Predicate {
        match self {
            Predicate::And(mut v) => {
                v.push(other);
                Predicate::And(v)
            }
            p => Predicate::And(vec![p, other]),
        }
    }

    /// `self OR other`.
    pub fn or(self, other: Predicate) -> Predicate {
        match self {
            Predicate::Or(mut v) => {
                v.push(other);
                Predicate::Or(v)
            }
            p => Predicate::Or(vec![p, other]),
        }
    }
}

impl std::ops::Not for Predicate {
    type Output = Predicate;

    fn not(self) -> Predicate {
        Predicate::Not(Box::new(self))
    }
}

/// A column reference to build predicates from.
#[derive(Debug, Clone)]
pub struct Col(String);

/// Refers to the column `name` (`timestamp`, `labels.pod`).
///
/// ```
/// use frostdb_core::col;
/// let p = col("name").eq("cpu").and(col("labels.pod").regex_match("^api-.*"));
/// # let _ = p;
/// ```
pub fn col(name: impl Into<String>) -> Col {
    Col(name.into())
}

macro_rules! compare {
    ($($(#[$doc:meta])* $method:ident => $op:ident),*) => {$(
        $(#[$doc])*
        pub fn $method(self, value: impl Into<crate::Scalar>) -> Predicate {
            Predicate::Compare { column: self.0, op: CmpOp::$op, value: value.into() }
        }
    )*};
}

impl Col {
    compare! {
        /// `= value`
        eq => Eq,
        /// `!= value`
        not_eq => NotEq,
        /// `< value`
        lt => Lt,
        /// `<= value`
        lt_eq => LtEq,
        /// `> value`
        gt => Gt,
        /// `>= value`
        gt_eq => GtEq
    }

    /// `IN (values)`
    pub fn in_list<V: Into<crate::Scalar>>(self, values: impl IntoIterator<Item = V>) -> Predicate {
        Predicate::InList {
            column: self.0,
            values: values.into_iter().map(Into::into).collect(),
            negated: false,
        }
    }

    /// `NOT IN (values)`
    pub fn not_in_list<V: Into<crate::Scalar>>(
        self,
        values: impl IntoIterator<Item = V>,
    ) -> Predicate {
        Predicate::InList {
            column: self.0,
            values: values.into_iter().map(Into::into).collect(),
            negated: true,
        }
    }

    /// `IS NULL`
    pub fn is_null(self) -> Predicate {
        Predicate::IsNull {
            column: self.0,
            negated: false,
        }
    }

    /// `IS NOT NULL`
    pub fn is_not_null(self) -> Predicate {
        Predicate::IsNull {
            column: self.0,
            negated: true,
        }
    }

    /// Matches the (unanchored) regular expression `pattern`.
    pub fn regex_match(self, pattern: impl Into<String>) -> Predicate {
        Predicate::Regex {
            column: self.0,
            pattern: pattern.into(),
            negated: false,
        }
    }

    /// Does not match the (unanchored) regular expression `pattern`; nulls stay unknown.
    pub fn regex_not_match(self, pattern: impl Into<String>) -> Predicate {
        Predicate::Regex {
            column: self.0,
            pattern: pattern.into(),
            negated: true,
        }
    }
}
