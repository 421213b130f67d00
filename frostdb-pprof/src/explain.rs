//! Why a selection is empty. A merge that selects nothing answers an empty profile, which is
//! right for a range with no data, but a selector that can never select anything (a profile
//! type or a label nobody stored, a reversed range) is a mistake its author wants named,
//! with what is stored instead: [`ProfileStore::check_selection`].

use frostdb_profile::TimeRange;
use frostdb_profile::{MatchOp, ProfileType, Selector};

use crate::{Error, ProfileStore, ReadOptions, Result};

/// Items listed in an explanation; the rest are counted.
const LISTED: usize = 20;

/// Labels kept per sample rather than per series: never in the series index.
const SAMPLE_LABELS: [&str; 2] = ["span_id", "trace_id"];

impl ProfileStore {
    /// Checks that `selector` over `range` can select something stored: a reversed or empty
    /// range, a profile type never stored, a label name no series of the type has, or a
    /// value (`=`) the label never had, is [`Error::Query`] naming it, listing what is
    /// stored (types, label names or values) and the nearest match. Reads only the series
    /// index; meant for when a merge came back empty, to tell "nothing there" from "nothing
    /// in that range". Labels of every time are listed, not only the range's.
    pub fn check_selection(&self, selector: &Selector, range: TimeRange) -> Result<()> {
        check_range(range)?;
        let Some(wanted) = &selector.profile_type else {
            return Ok(());
        };
        let types = self
            .profile_types(TimeRange::ALL, ReadOptions::STRICT)?
            .value;
        if !types.contains(wanted) {
            let names: Vec<String> = types.iter().map(ProfileType::to_string).collect();
            return Err(Error::Query(if names.is_empty() {
                format!("no profile type {wanted} is stored: nothing is stored yet")
            } else {
                format!(
                    "no profile type {wanted} is stored{}; stored: {}",
                    nearest(&wanted.to_string(), &names),
                    listed(&names)
                )
            }));
        }
        let typed = Selector {
            profile_type: Some(wanted.clone()),
            matchers: Vec::new(),
        };
        let mut names: Option<Vec<String>> = None;
        for m in &selector.matchers {
            if m.label.starts_with("__") || SAMPLE_LABELS.contains(&m.label.as_str()) {
                continue;
            }
            // `!=`, `!~` and a regex matching "" select series without the label too.
            let needs_label = match m.op {
                MatchOp::Equal => !m.value.is_empty(),
                MatchOp::Regex => !m.matches(""),
                MatchOp::NotEqual | MatchOp::NotRegex => false,
            };
            if !needs_label {
                continue;
            }
            let names = match &mut names {
                Some(names) => names,
                None => names.insert(
                    self.label_names(Some(&typed), TimeRange::ALL, ReadOptions::STRICT)?
                        .value,
                ),
            };
            if !names.contains(&m.label) {
                let shown: Vec<String> = names
                    .iter()
                    .filter(|n| !n.starts_with("__"))
                    .cloned()
                    .collect();
                return Err(Error::Query(format!(
                    "no series of {wanted} has a label {:?}{}; its labels: {}",
                    m.label,
                    nearest(&m.label, &shown),
                    listed(&shown)
                )));
            }
            if m.op != MatchOp::Equal {
                continue;
            }
            let values = self
                .label_values(&m.label, Some(&typed), TimeRange::ALL, ReadOptions::STRICT)?
                .value;
            if !values.contains(&m.value) {
                return Err(Error::Query(format!(
                    "no series of {wanted} has {}={:?}{}; its values: {}",
                    m.label,
                    m.value,
                    nearest(&m.value, &values),
                    listed(&values)
                )));
            }
        }
        Ok(())
    }
}

/// A range that can hold nothing (`from` not before `to`) is a mistake, never an empty
/// answer.
pub(crate) fn check_range(range: TimeRange) -> Result<()> {
    if range.start_ms >= range.end_ms {
        return Err(Error::Query(format!(
            "the range is empty: its start ({}) is not before its end ({}), in Unix ms; is it reversed?",
            range.start_ms, range.end_ms
        )));
    }
    Ok(())
}

/// `; did you mean "x"?` for the stored name nearest to `wanted` (fewest edits, a swap of
/// neighbours counting one), when it is near: at most a third of its characters away.
fn nearest(wanted: &str, stored: &[String]) -> String {
    nearest_within(wanted, stored, MAX_SUGGESTION_STEPS).0
}

/// The longest name or value (characters) a suggestion is looked for: a longer one is no
/// typo of a label.
const MAX_SUGGESTED_CHARS: usize = 256;

/// Most steps (characters of `wanted` times characters of a stored string, summed over
/// the strings compared) a suggestion may take: about 0.1 s. Each comparison is quadratic
/// and runs in a query slot where no deadline reaches: a 16 KB value against 10,000
/// stored values of 2 KB was 3×10¹¹ steps, minutes of a core for one GET.
const MAX_SUGGESTION_STEPS: usize = 1 << 26;

/// [`nearest`], comparing only stored strings whose length is within the distance allowed
/// of `wanted`'s (no other can be near enough), and no more than `budget` steps in all
/// (the best found by then). Also returns the steps taken.
fn nearest_within(wanted: &str, stored: &[String], budget: usize) -> (String, usize) {
    let n = wanted.chars().count();
    if n > MAX_SUGGESTED_CHARS {
        return (String::new(), 0);
    }
    let allowed = (n / 3).max(1);
    let (mut best, mut steps) = (None::<(usize, &String)>, 0usize);
    for s in stored {
        // A string has at most as many characters as bytes and at least a quarter as many:
        // one far too long is passed over without counting them.
        if s.len() / 4 > n + allowed {
            continue;
        }
        let m = s.chars().count();
        if m > n + allowed || m + allowed < n {
            continue;
        }
        steps += n.max(1) * m.max(1);
        if steps > budget {
            break;
        }
        let d = strsim::damerau_levenshtein(wanted, s);
        if d <= allowed && best.is_none_or(|(b, _)| d < b) {
            best = Some((d, s));
        }
    }
    let suggestion = best.map_or_else(String::new, |(_, s)| format!(" (did you mean {s:?}?)"));
    (suggestion, steps)
}

/// The first [`LISTED`] of `items`, and how many more.
fn listed(items: &[String]) -> String {
    if items.is_empty() {
        return "none".to_owned();
    }
    let mut out = items[..items.len().min(LISTED)].join(", ");
    if items.len() > LISTED {
        out.push_str(&format!(" and {} more", items.len() - LISTED));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_names_a_close_match_only() {
        let stored = vec!["process_cpu".to_owned(), "memory".to_owned()];
        assert_eq!(
            nearest("process_cpuu", &stored),
            " (did you mean \"process_cpu\"?)"
        );
        assert_eq!(
            nearest("jbo", &["job".to_owned()]),
            " (did you mean \"job\"?)"
        );
        assert_eq!(nearest("zzz", &stored), "");
    }

    /// A long value suggests nothing at once; values too long or short to be near are
    /// not compared; and the comparisons stop at the budget. Before, a 16 KB value against
    /// stored values of 2 KB cost their product per value, for every value.
    #[test]
    fn suggestions_are_bounded_by_length_and_steps() {
        let long = "a".repeat(16_200);
        let stored: Vec<String> = (0..2_000).map(|i| format!("{:a>2040}{i:08}", "")).collect();
        assert_eq!(
            nearest_within(&long, &stored, usize::MAX),
            (String::new(), 0)
        );
        // 200 characters: the 2 KB values are never compared, nor are short ones.
        let wanted = "b".repeat(200);
        let mut stored = stored;
        stored.extend(["b".repeat(10), "b".repeat(199) + "c"]);
        assert_eq!(
            nearest_within(&wanted, &stored, usize::MAX),
            (
                format!(" (did you mean {:?}?)", "b".repeat(199) + "c"),
                200 * 200
            )
        );
        // Within length, many values: the steps stop at the budget.
        let many: Vec<String> = (0..10_000).map(|i| format!("{i:0200}")).collect();
        let (_, steps) = nearest_within(&wanted, &many, 1 << 20);
        assert!(steps <= (1 << 20) + 200 * 200, "{steps}");
    }

    #[test]
    fn listed_counts_what_it_leaves_out() {
        let items: Vec<String> = (0..25).map(|i| i.to_string()).collect();
        assert!(listed(&items).ends_with("19 and 5 more"));
        assert_eq!(listed(&[]), "none");
    }

    #[test]
    fn an_empty_or_reversed_range_is_an_error() {
        for (start_ms, end_ms) in [(10, 10), (10, 5)] {
            let e = check_range(TimeRange { start_ms, end_ms }).unwrap_err();
            assert!(e.to_string().contains("range is empty"), "{e}");
        }
        check_range(TimeRange {
            start_ms: 1,
            end_ms: 2,
        })
        .unwrap();
    }
}
