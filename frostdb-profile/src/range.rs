//! Time ranges, and how a merge over one combines a series' profiles.

use datafusion::logical_expr::Expr;
use datafusion::prelude::{ident, lit};

use crate::ProfileType;
use crate::schema::column::TIMESTAMP;

/// The latest time taken, in Unix ms: the last millisecond of the year 9999. Times are
/// checked against `0..=MAX_MS` where they enter, so no arithmetic on them can wrap.
pub const MAX_MS: i64 = 253_402_300_799_999;

/// `ms` if it is within `0..=`[`MAX_MS`], else an error naming `what`.
pub fn checked_ms(ms: i64, what: &str) -> Result<i64, String> {
    if (0..=MAX_MS).contains(&ms) {
        Ok(ms)
    } else {
        Err(format!(
            "{what}: {ms} ms is outside the times taken (0 to {MAX_MS}: 1970 to the year 9999)"
        ))
    }
}

/// A half-open time range `[start_ms, end_ms)` in milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeRange {
    /// First millisecond included.
    pub start_ms: i64,
    /// First millisecond excluded.
    pub end_ms: i64,
}

impl TimeRange {
    /// All of time.
    pub const ALL: TimeRange = TimeRange {
        start_ms: i64::MIN,
        end_ms: i64::MAX,
    };

    pub(crate) fn to_expr(self) -> Expr {
        let mut e = lit(true);
        if self.start_ms != i64::MIN {
            e = e.and(ident(TIMESTAMP).gt_eq(lit(self.start_ms)));
        }
        if self.end_ms != i64::MAX {
            e = e.and(ident(TIMESTAMP).lt(lit(self.end_ms)));
        }
        e
    }
}

/// How a merge over a range combines each series' profiles (series are always summed
/// together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Aggregation {
    /// Each series' profiles summed: CPU time, allocations, contentions.
    #[default]
    Sum,
    /// Each series' profiles averaged (summed, divided by its profile count): what memory
    /// in use looked like on average over the range.
    Average,
    /// Each series' latest profile in the range: memory in use now.
    Latest,
}

impl Aggregation {
    /// `sum`, `avg` or `average`, `latest` or `last`.
    pub fn parse(name: &str) -> std::result::Result<Self, String> {
        match name.trim().to_ascii_lowercase().as_str() {
            "sum" => Ok(Self::Sum),
            "avg" | "average" => Ok(Self::Average),
            "latest" | "last" => Ok(Self::Latest),
            other => Err(format!("aggregation {other:?} (sum, average or latest)")),
        }
    }

    /// Its name, as [`Aggregation::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Average => "average",
            Self::Latest => "latest",
        }
    }

    /// What a merge of `profile_type` does unless told: gauges average, the rest sum.
    pub fn default_for(profile_type: &ProfileType) -> Self {
        if profile_type.is_gauge() {
            Self::Average
        } else {
            Self::Sum
        }
    }
}
