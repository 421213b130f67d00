//! Label selectors, as Prometheus and Parca write them:
//! `process_cpu:cpu:nanoseconds:cpu:nanoseconds{job="api", pod=~"a-.*", env!="dev"}`.
//!
//! Semantics are Prometheus's: a regex matches the whole value (it is anchored), and a label
//! a series lacks has the empty value, so `env=""` selects series without `env` and
//! `env!="dev"` selects them too.

use std::fmt;
use std::str::FromStr;

use crate::schema::column::{
    NAME, PERIOD_TYPE, PERIOD_UNIT, SAMPLE_TYPE, SAMPLE_UNIT, label_column,
};
use datafusion::arrow::datatypes::Schema as ArrowSchema;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use datafusion::prelude::{ident, lit};

/// The five parts of a profile type, Parca's `name:sample_type:sample_unit:period_type:period_unit`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProfileType {
    /// Profile name (`process_cpu`, `memory`, ...).
    pub name: String,
    /// Sample type (`cpu`, `alloc_space`, ...).
    pub sample_type: String,
    /// Sample unit (`nanoseconds`, `bytes`, ...).
    pub sample_unit: String,
    /// Period type.
    pub period_type: String,
    /// Period unit.
    pub period_unit: String,
    /// Parca's optional sixth part, `delta`: the values are deltas of a cumulative profile.
    pub delta: bool,
}

impl fmt::Display for ProfileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}:{}{}",
            self.name,
            self.sample_type,
            self.sample_unit,
            self.period_type,
            self.period_unit,
            if self.delta { ":delta" } else { "" }
        )
    }
}

impl ProfileType {
    /// Whether its values are a level at one moment (memory in use, goroutines), which
    /// adds up across series but not across one series' profiles over time: merges over a
    /// range average them ([`crate::Aggregation::default_for`]).
    pub fn is_gauge(&self) -> bool {
        self.sample_type.starts_with("inuse_")
            || self.sample_type.starts_with("goroutine")
            || self.name == "goroutines"
    }

    /// The engine predicate selecting this profile type's rows.
    pub fn to_predicate(&self) -> frostdb_core::Predicate {
        use frostdb_core::col;
        col(NAME)
            .eq(self.name.as_str())
            .and(col(SAMPLE_TYPE).eq(self.sample_type.as_str()))
            .and(col(SAMPLE_UNIT).eq(self.sample_unit.as_str()))
            .and(col(PERIOD_TYPE).eq(self.period_type.as_str()))
            .and(col(PERIOD_UNIT).eq(self.period_unit.as_str()))
    }

    /// The filter selecting this profile type's rows.
    pub fn to_expr(&self) -> Expr {
        ident(NAME)
            .eq(lit(self.name.as_str()))
            .and(ident(SAMPLE_TYPE).eq(lit(self.sample_type.as_str())))
            .and(ident(SAMPLE_UNIT).eq(lit(self.sample_unit.as_str())))
            .and(ident(PERIOD_TYPE).eq(lit(self.period_type.as_str())))
            .and(ident(PERIOD_UNIT).eq(lit(self.period_unit.as_str())))
    }
}

/// A label matcher's operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    /// `=`
    Equal,
    /// `!=`
    NotEqual,
    /// `=~`
    Regex,
    /// `!~`
    NotRegex,
}

impl fmt::Display for MatchOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MatchOp::Equal => "=",
            MatchOp::NotEqual => "!=",
            MatchOp::Regex => "=~",
            MatchOp::NotRegex => "!~",
        })
    }
}

/// One `label op "value"`.
#[derive(Debug, Clone)]
pub struct Matcher {
    /// Label name (`__name__` means the profile name).
    pub label: String,
    /// Operator.
    pub op: MatchOp,
    /// The value, or the regex for `=~` and `!~`.
    pub value: String,
    regex: Option<regex::Regex>,
    /// The values a regex lists when it is only literal values (`a|b|c`, as
    /// [`Matcher::any_of`] writes it), sorted: matched as a set rather than compiled, so a
    /// list of thousands (span ids) costs a lookup, not a regex too large to build.
    set: Option<std::sync::Arc<[String]>>,
}

impl PartialEq for Matcher {
    fn eq(&self, other: &Self) -> bool {
        (&self.label, self.op, &self.value) == (&other.label, other.op, &other.value)
    }
}

impl Matcher {
    /// A matcher accepting exactly `values` for `label`: written `label=~"v1|v2|..."` (each
    /// value escaped), and matched as a set of them, not compiled. Bounded as a parsed list
    /// is: at most [`Selector::MAX_LIST_VALUES`] values, written
    /// in at most [`Selector::MAX_BYTES`] (a worker parses the text again), counted before
    /// anything is copied.
    pub fn any_of(label: &str, values: &[&str]) -> Result<Self, String> {
        if values.len() > Selector::MAX_LIST_VALUES {
            return Err(format!(
                "{} values, more than {} in one list",
                values.len(),
                Selector::MAX_LIST_VALUES
            ));
        }
        let mut value = String::new();
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                value.push('|');
            }
            value.push_str(&regex::escape(v));
            if value.len() > Selector::MAX_BYTES {
                return Err(format!(
                    "values of more than {} bytes written as a list",
                    Selector::MAX_BYTES
                ));
            }
        }
        Ok(Self {
            label: label.to_owned(),
            op: MatchOp::Regex,
            value,
            regex: None,
            set: Some(sorted_set(values.iter().map(|v| (*v).to_owned()).collect())),
        })
    }

    /// Whether this matcher holds a compiled regex (not a list of values matched as a
    /// set): what [`Selector::MAX_REGEXES`] counts, and callers holding many selectors
    /// bound in all.
    pub fn compiles_regex(&self) -> bool {
        self.regex.is_some()
    }

    /// Whether the matcher accepts `value` (the empty string for an absent label).
    pub fn matches(&self, value: &str) -> bool {
        if let Some(set) = &self.set {
            let found = set.binary_search_by(|v| v.as_str().cmp(value)).is_ok();
            return found == (self.op == MatchOp::Regex);
        }
        match (self.op, &self.regex) {
            (MatchOp::Equal, _) => value == self.value,
            (MatchOp::NotEqual, _) => value != self.value,
            (MatchOp::Regex, Some(re)) => re.is_match(value),
            (MatchOp::NotRegex, Some(re)) => !re.is_match(value),
            (_, None) => false,
        }
    }

    fn anchored(&self) -> String {
        format!("^(?:{})$", self.value)
    }

    /// The engine predicate of this matcher on a table that has the columns `has` says.
    fn to_predicate(&self, has: &dyn Fn(&str) -> bool) -> frostdb_core::Predicate {
        use frostdb_core::{Predicate, col};
        let column = if self.label == "__name__" {
            NAME.to_owned()
        } else {
            label_column(&self.label)
        };
        let empty_matches = self.matches("");
        if !has(&column) {
            // No row has the label: every row has the empty value.
            return Predicate::Const(empty_matches);
        }
        let c = || col(column.as_str());
        let values = || self.set.iter().flat_map(|s| s.iter().map(String::as_str));
        let test = match (self.op, &self.set) {
            (MatchOp::Regex, Some(_)) => c().in_list(values()),
            (MatchOp::NotRegex, Some(_)) => c().not_in_list(values()),
            (MatchOp::Equal, _) => c().eq(self.value.as_str()),
            (MatchOp::NotEqual, _) => c().not_eq(self.value.as_str()),
            (MatchOp::Regex, None) => c().regex_match(self.anchored()),
            (MatchOp::NotRegex, None) => c().regex_not_match(self.anchored()),
        };
        // Rows lacking the label (null) have the empty value.
        if empty_matches {
            c().is_null().or(test)
        } else {
            c().is_not_null().and(test)
        }
    }

    /// The filter for this matcher on a table of `schema`.
    fn to_expr(&self, schema: &ArrowSchema) -> Expr {
        let column = if self.label == "__name__" {
            NAME.to_owned()
        } else {
            label_column(&self.label)
        };
        let empty_matches = self.matches("");
        if schema.field_with_name(&column).is_err() {
            // No row has the label: every row has the empty value.
            return lit(empty_matches);
        }
        let c = || ident(column.as_str());
        let values = || {
            self.set
                .iter()
                .flat_map(|s| s.iter().map(|v| lit(v.as_str())))
                .collect::<Vec<_>>()
        };
        let test = match (self.op, &self.set) {
            (MatchOp::Regex, Some(_)) => c().in_list(values(), false),
            (MatchOp::NotRegex, Some(_)) => c().in_list(values(), true),
            (MatchOp::Equal, _) => c().eq(lit(self.value.as_str())),
            (MatchOp::NotEqual, _) => c().not_eq(lit(self.value.as_str())),
            (MatchOp::Regex, None) => regex(c(), Operator::RegexMatch, self.anchored()),
            (MatchOp::NotRegex, None) => regex(c(), Operator::RegexNotMatch, self.anchored()),
        };
        // Rows lacking the label (null) have the empty value.
        if empty_matches {
            c().is_null().or(test)
        } else {
            c().is_not_null().and(test)
        }
    }
}

/// `values` sorted, each once.
fn sorted_set(mut values: Vec<String>) -> std::sync::Arc<[String]> {
    values.sort_unstable();
    values.dedup();
    values.into()
}

/// The values a regex lists, when it lists only literal values (`a|b\\.c|`): every
/// alternative plain text, its special characters escaped as [`regex::escape`] escapes
/// them. `None` for any other regex.
fn literal_alternatives(pattern: &str) -> Option<Vec<String>> {
    const SPECIAL: &str = "\\.+*?()|[]{}^$#&-~";
    let mut out = vec![String::new()];
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '|' => out.push(String::new()),
            '\\' => match chars.next() {
                Some(e) if SPECIAL.contains(e) => out.last_mut()?.push(e),
                _ => return None,
            },
            '.' | '+' | '*' | '?' | '(' | ')' | '[' | ']' | '{' | '}' | '^' | '$' => return None,
            c => out.last_mut()?.push(c),
        }
    }
    Some(out)
}

fn regex(column: Expr, op: Operator, pattern: String) -> Expr {
    Expr::BinaryExpr(BinaryExpr::new(
        Box::new(column),
        op,
        Box::new(lit(pattern)),
    ))
}

/// A parsed selector: an optional profile type and label matchers. The default selects
/// everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    /// The profile type prefix, if given.
    pub profile_type: Option<ProfileType>,
    /// The matchers, all of which must hold.
    pub matchers: Vec<Matcher>,
}

/// A selector that names a profile type: what a merge, a series over time or a diff needs.
/// It is made only from a selector with a type ([`Selector::typed`]) or from a type
/// ([`TypedSelector::new`]), so its type is never missing; it reads as the [`Selector`] it
/// is (`Deref`).
#[derive(Debug, Clone, PartialEq)]
pub struct TypedSelector {
    selector: Selector,
    profile_type: ProfileType,
}

impl TypedSelector {
    /// Selects `matchers` of profile type `profile_type`.
    pub fn new(profile_type: ProfileType, matchers: Vec<Matcher>) -> Self {
        TypedSelector {
            selector: Selector {
                profile_type: Some(profile_type.clone()),
                matchers,
            },
            profile_type,
        }
    }

    /// The profile type it selects.
    pub fn profile_type(&self) -> &ProfileType {
        &self.profile_type
    }

    /// The selector with `matcher` added (all matchers must hold).
    pub fn with(mut self, matcher: Matcher) -> Self {
        self.selector.matchers.push(matcher);
        self
    }

    /// The selector, as any query takes it.
    pub fn into_selector(self) -> Selector {
        self.selector
    }
}

impl std::ops::Deref for TypedSelector {
    type Target = Selector;

    fn deref(&self) -> &Selector {
        &self.selector
    }
}

impl From<TypedSelector> for Selector {
    fn from(typed: TypedSelector) -> Selector {
        typed.selector
    }
}

impl fmt::Display for TypedSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.selector.fmt(f)
    }
}

/// Why a selector did not parse: the message and the 1-based column where it went wrong.
/// Its text shows the selector around that column with a caret under it (at most
/// [`SelectorError::SHOWN`] characters each side, so that a selector of megabytes makes a
/// short error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad selector at column {column}: {message}\n  {}", self.excerpt())]
pub struct SelectorError {
    /// 1-based column (in characters) of the problem.
    pub column: usize,
    /// What is wrong.
    pub message: String,
    /// The selector.
    pub input: String,
}

impl ProfileType {
    /// Checks that `part` can be a part of a profile type a selector names (the name, a
    /// sample or period type, a unit): not empty, without `:` (which separates the parts),
    /// `{` (which starts the labels), white space or control characters. A part that fails
    /// would be stored and listed, but no query could ever select it.
    pub fn check_part(part: &str) -> Result<(), String> {
        if part.is_empty() {
            return Err("it is empty".into());
        }
        if let Some(c) = part
            .chars()
            .find(|c| *c == ':' || *c == '{' || c.is_whitespace() || c.is_control())
        {
            return Err(format!(
                "{part:?} has {c:?}, which no selector can name (':' separates the parts of a profile type, '{{' starts its labels)"
            ));
        }
        Ok(())
    }
}

impl SelectorError {
    /// Characters of the selector shown on each side of the column.
    pub const SHOWN: usize = 60;

    /// The selector around the column, and a caret under the column.
    fn excerpt(&self) -> String {
        let at = self.column.saturating_sub(1);
        let start = at.saturating_sub(Self::SHOWN);
        let chars: Vec<char> = self
            .input
            .chars()
            .skip(start)
            .take(2 * Self::SHOWN + 1)
            .collect();
        let (lead, tail) = (
            if start > 0 { "…" } else { "" },
            if start + chars.len() < self.input.chars().count() {
                "…"
            } else {
                ""
            },
        );
        let text: String = chars.iter().collect();
        let pad = lead.chars().count() + (at - start);
        format!("{lead}{text}{tail}\n  {}^", " ".repeat(pad))
    }
}

struct Parser<'a> {
    input: &'a str,
    chars: Vec<char>,
    pos: usize,
    /// Regexes compiled so far (at most [`Selector::MAX_REGEXES`]).
    regexes: usize,
}

impl<'a> Parser<'a> {
    fn error<T>(&self, at: usize, message: impl Into<String>) -> Result<T, SelectorError> {
        Err(SelectorError {
            column: at + 1,
            message: message.into(),
            input: self.input.to_owned(),
        })
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn profile_type(&mut self) -> Result<Option<ProfileType>, SelectorError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c != '{' && !c.is_whitespace()) {
            self.pos += 1;
        }
        if self.pos == start {
            return Ok(None);
        }
        let text: String = self.chars[start..self.pos].iter().collect();
        let parts: Vec<&str> = text.split(':').collect();
        let delta = match parts.len() {
            5 => false,
            6 if parts[5] == "delta" => true,
            6 => {
                let at = start + text.rfind(':').unwrap_or(0) + 1;
                return self.error(
                    at,
                    format!(
                        "the sixth part of a profile type can only be \"delta\", not {:?}",
                        parts[5]
                    ),
                );
            }
            n => {
                return self.error(
                    start,
                    format!(
                        "a profile type has 5 parts name:sample_type:sample_unit:period_type:period_unit, {text:?} has {n}"
                    ),
                );
            }
        };
        if let Some(i) = parts.iter().position(|p| p.is_empty()) {
            let at = start
                + parts[..i]
                    .iter()
                    .map(|p| p.chars().count() + 1)
                    .sum::<usize>();
            return self.error(at, "empty part in the profile type");
        }
        Ok(Some(ProfileType {
            name: parts[0].to_owned(),
            sample_type: parts[1].to_owned(),
            sample_unit: parts[2].to_owned(),
            period_type: parts[3].to_owned(),
            period_unit: parts[4].to_owned(),
            delta,
        }))
    }

    fn label(&mut self) -> Result<String, SelectorError> {
        let start = self.pos;
        match self.peek() {
            Some(c) if c.is_ascii_alphabetic() || c == '_' => self.pos += 1,
            Some(c) => return self.error(start, format!("expected a label name, found {c:?}")),
            None => return self.error(start, "expected a label name, found the end"),
        }
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            self.pos += 1;
        }
        Ok(self.chars[start..self.pos].iter().collect())
    }

    fn op(&mut self) -> Result<MatchOp, SelectorError> {
        let at = self.pos;
        let op = match (self.peek(), self.chars.get(self.pos + 1).copied()) {
            (Some('='), Some('~')) => (MatchOp::Regex, 2),
            (Some('!'), Some('=')) => (MatchOp::NotEqual, 2),
            (Some('!'), Some('~')) => (MatchOp::NotRegex, 2),
            (Some('='), _) => (MatchOp::Equal, 1),
            (Some(c), _) => {
                return self.error(at, format!("expected one of = != =~ !~, found {c:?}"));
            }
            (None, _) => return self.error(at, "expected one of = != =~ !~, found the end"),
        };
        self.pos += op.1;
        Ok(op.0)
    }

    fn string(&mut self) -> Result<String, SelectorError> {
        let start = self.pos;
        let quote = match self.peek() {
            Some(q @ ('"' | '\'' | '`')) => q,
            Some(c) => return self.error(start, format!("expected a quoted value, found {c:?}")),
            None => return self.error(start, "expected a quoted value, found the end"),
        };
        self.pos += 1;
        let mut out = String::new();
        loop {
            let at = self.pos;
            let Some(c) = self.peek() else {
                return self.error(start, "unterminated string");
            };
            self.pos += 1;
            if c == quote {
                return Ok(out);
            }
            if c != '\\' || quote == '`' {
                out.push(c);
                continue;
            }
            let Some(e) = self.peek() else {
                return self.error(at, "unterminated escape");
            };
            self.pos += 1;
            match e {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                '\\' | '"' | '\'' => out.push(e),
                'u' => {
                    let hex: String = self
                        .chars
                        .get(self.pos..self.pos + 4)
                        .unwrap_or_default()
                        .iter()
                        .collect();
                    let c = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                    match c {
                        Some(c) if hex.len() == 4 => {
                            out.push(c);
                            self.pos += 4;
                        }
                        _ => return self.error(at, "\\u needs four hex digits"),
                    }
                }
                other => return self.error(at, format!("unknown escape \\{other}")),
            }
        }
    }

    fn matcher(&mut self) -> Result<Matcher, SelectorError> {
        let label = self.label()?;
        self.skip_ws();
        let op = self.op()?;
        self.skip_ws();
        let value_at = self.pos;
        let value = self.string()?;
        let mut matcher = Matcher {
            label,
            op,
            value,
            regex: None,
            set: None,
        };
        if matches!(op, MatchOp::Regex | MatchOp::NotRegex) {
            // A list of values is matched as a set (exactly what the regex means).
            if let Some(values) = literal_alternatives(&matcher.value) {
                if values.len() > Selector::MAX_LIST_VALUES {
                    return self.error(
                        value_at,
                        format!(
                            "a list of {} values, more than {}",
                            values.len(),
                            Selector::MAX_LIST_VALUES
                        ),
                    );
                }
                matcher.set = Some(sorted_set(values));
                return Ok(matcher);
            }
            if self.regexes == Selector::MAX_REGEXES {
                return self.error(
                    value_at,
                    format!(
                        "more than {} regex matchers (a list of values, a|b|c, is not one)",
                        Selector::MAX_REGEXES
                    ),
                );
            }
            self.regexes += 1;
            if let Err(why) = check_steps_per_value(&matcher.anchored()) {
                return self.error(value_at, why);
            }
            // Each compiled program (forward, reverse, one-pass) is bounded by the size
            // limit, and the lazy DFA's cache by its own while matching.
            let compiled = regex::RegexBuilder::new(&matcher.anchored())
                .size_limit(REGEX_SIZE_LIMIT)
                .dfa_size_limit(REGEX_DFA_LIMIT)
                .build();
            match compiled {
                Ok(re) => matcher.regex = Some(re),
                Err(e) => return self.error(value_at, format!("bad regex: {e}")),
            }
        }
        Ok(matcher)
    }
}

/// Refuses `anchored` when matching it against one label value may take more than
/// [`Selector::MAX_VALUE_STEPS`] steps. A search steps once a byte when the pattern's DFA fits
/// its lazy DFA's cache, else once a byte for every state of its automaton (the `regex`
/// crate falls back to that when the cache thrashes: `.*[ -~]{2000}x` took 29 ms a value of
/// 2 KB). The bytes searched are a value's, [`Selector::SEARCHED_VALUE_BYTES`], or fewer
/// when no match can be that long (the search, anchored at both ends, gives up there).
fn check_steps_per_value(anchored: &str) -> Result<(), String> {
    use frostdb_query::regex_cost;
    // Not a regex (`None`): compiling it names why. Linear when its DFA fits in half the
    // lazy DFA's cache (see `Cost::linear_in`), which the probe's bound says alone.
    let Some(cost) = regex_cost::probe(anchored, REGEX_DFA_LIMIT / 2)? else {
        return Ok(());
    };
    let per_byte = if cost.linear { 1 } else { cost.states as u64 };
    let bytes = cost.max_len.map_or(Selector::SEARCHED_VALUE_BYTES, |m| {
        m.min(Selector::SEARCHED_VALUE_BYTES)
    });
    let steps = per_byte.saturating_mul(bytes as u64);
    if steps > Selector::MAX_VALUE_STEPS {
        return Err(format!(
            "the regex `{}` may take {steps} steps to match one label value ({per_byte} \
             states of its automaton stepped at each of up to {bytes} bytes), over the {} a \
             matcher may take; a counted repetition `{{n}}` after an unbounded one (`.*`) \
             costs this, a list of values (a|b|c) or a shorter pattern does not",
            regex_cost::cut(anchored),
            Selector::MAX_VALUE_STEPS
        ));
    }
    Ok(())
}

/// Most bytes of each program a regex matcher compiles to: room for `api-\w{20}` or
/// alternations of hundreds of patterns (Unicode classes are large: `\w{8}` alone is
/// over 256 KiB), not for `\w{1000}`. The engine binds a selector's regexes under the
/// same limits (frostdb-core's `bound.rs`).
pub(crate) const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Most bytes of the lazy DFA's cache a regex matcher grows in each thread matching it
/// (the default is 2 MiB): past it the cache is cleared and refilled, slower but bounded.
pub(crate) const REGEX_DFA_LIMIT: usize = 256 << 10;

/// The label Pyroscope's clients name a profile type with in matchers
/// (`{__profile_type__="process_cpu:cpu:nanoseconds:cpu:nanoseconds", service_name="api"}`).
pub const PROFILE_TYPE_LABEL: &str = "__profile_type__";

/// Writes `value` as a selector's double-quoted string, escaped as [`Selector::parse`]
/// reads it.
fn quoted(f: &mut fmt::Formatter<'_>, value: &str) -> fmt::Result {
    f.write_str("\"")?;
    for c in value.chars() {
        match c {
            '\\' => f.write_str("\\\\")?,
            '"' => f.write_str("\\\"")?,
            '\n' => f.write_str("\\n")?,
            '\t' => f.write_str("\\t")?,
            '\r' => f.write_str("\\r")?,
            c if (c as u32) < 0x20 || c == '\u{7f}' => write!(f, "\\u{:04x}", c as u32)?,
            c => write!(f, "{c}")?,
        }
    }
    f.write_str("\"")
}

impl fmt::Display for Selector {
    /// The selector as [`Selector::parse`] reads it back: `type{label="value",...}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(t) = &self.profile_type {
            write!(f, "{t}")?;
        }
        f.write_str("{")?;
        for (i, m) in self.matchers.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}{}", m.label, m.op)?;
            quoted(f, &m.value)?;
        }
        f.write_str("}")
    }
}

impl Selector {
    /// This selector as a [`TypedSelector`], if it names a profile type.
    pub fn typed(self) -> Option<TypedSelector> {
        let profile_type = self.profile_type.clone()?;
        Some(TypedSelector {
            selector: self,
            profile_type,
        })
    }

    /// A selector from the parts Pyroscope's query API sends: a profile type id (empty for
    /// none) and a label selector (`{service_name="api"}`, empty for all). A
    /// `__profile_type__="…"` matcher names the profile type too.
    pub fn from_parts(profile_type: &str, label_selector: &str) -> Result<Self, SelectorError> {
        let labels = match label_selector.trim() {
            "" => "{}",
            l => l,
        };
        let profile_type = profile_type.trim();
        // The type is a bare id: matchers, and regexes above all, come in the label
        // selector only (where callers look for them before parsing).
        if !profile_type.is_empty()
            && (profile_type.len() > Self::MAX_PROFILE_TYPE_BYTES
                || Self::bare_profile_type(profile_type).is_none())
        {
            return Err(SelectorError {
                column: 1,
                message: format!(
                    "a profile type is name:sample_type:sample_unit:period_type:period_unit \
                     alone, in at most {} bytes",
                    Self::MAX_PROFILE_TYPE_BYTES
                ),
                input: head(profile_type, 256).to_owned(),
            });
        }
        if labels.len() > Self::MAX_BYTES {
            // Refused by its length, before the two are copied into one text.
            return Selector::parse(labels);
        }
        let mut selector = Selector::parse(&format!("{profile_type}{labels}"))?;
        selector.lift_profile_type()?;
        Ok(selector)
    }

    /// Moves equality matchers on [`PROFILE_TYPE_LABEL`] into the profile type: an error when
    /// they name another type than the selector's, or when such a matcher is not `=`.
    pub fn lift_profile_type(&mut self) -> Result<(), SelectorError> {
        let error = |m: &Matcher, message: String| SelectorError {
            column: 1,
            message,
            input: format!("{}{}{:?}", m.label, m.op, m.value),
        };
        let mut kept = Vec::with_capacity(self.matchers.len());
        for m in std::mem::take(&mut self.matchers) {
            if m.label != PROFILE_TYPE_LABEL {
                kept.push(m);
                continue;
            }
            if m.op != MatchOp::Equal {
                let e = error(
                    &m,
                    format!("{PROFILE_TYPE_LABEL} takes only =, to name one profile type"),
                );
                kept.push(m);
                self.matchers = kept;
                return Err(e);
            }
            // A profile type id alone: parsed as a whole selector, each value could carry
            // matchers (regexes) of its own, compiled and counted against nothing.
            let parsed = Self::bare_profile_type(&m.value)
                .ok_or_else(|| error(&m, format!("{:?} is no profile type", m.value)))?;
            match &self.profile_type {
                Some(t) if *t != parsed => {
                    return Err(error(
                        &m,
                        format!("{parsed} contradicts the profile type {t}"),
                    ));
                }
                _ => self.profile_type = Some(parsed),
            }
        }
        self.matchers = kept;
        Ok(())
    }

    /// A profile type id (`process_cpu:cpu:nanoseconds:cpu:nanoseconds`) and nothing else.
    fn bare_profile_type(text: &str) -> Option<ProfileType> {
        let mut p = Parser {
            input: text,
            chars: text.trim().chars().collect(),
            pos: 0,
            regexes: 0,
        };
        let parsed = p.profile_type().ok()??;
        (p.pos == p.chars.len()).then_some(parsed)
    }

    /// Most bytes of a profile type id given apart from its selector: five parts, each
    /// bounded at ingest as a label value is (2 KiB by default), and far more than any
    /// profiler names.
    pub const MAX_PROFILE_TYPE_BYTES: usize = 16 << 10;

    /// Most label matchers one selector may hold: every series is tested against every
    /// matcher. Far more than a person or a dashboard writes (a list of values is one
    /// matcher, of any length), and room for the matchers a query adds (span ids) when a
    /// worker parses it again.
    pub const MAX_MATCHERS: usize = 256;

    /// Most of its matchers that compile a regex: each holds up to a few times
    /// [`REGEX_SIZE_LIMIT`] of programs, built when it is parsed. A list of values
    /// (`a|b|c`) is a set, not a regex, and does not count.
    pub const MAX_REGEXES: usize = 16;

    /// Most steps matching one label value against one regex matcher may take (see
    /// [`Selector::SEARCHED_VALUE_BYTES`]): 5 ms at the slowest rate measured (5 ns a
    /// step), against 0.5 s for the largest automaton the size limit allows. Room for
    /// `\w+` (322 states), `api-\w{20}` (6,332 states over at most 84 bytes) and every
    /// pattern whose DFA fits its matcher's cache, whatever its length.
    pub const MAX_VALUE_STEPS: u64 = 1 << 20;

    /// The bytes of a label value a regex matcher is costed as searching: the longest a
    /// store takes by default (frostdb-pprof's `max_label_value_length`).
    pub const SEARCHED_VALUE_BYTES: usize = 2048;

    /// Most bytes of a selector's text: far more than a person or a dashboard writes, and
    /// room for a query's own list of span or profile ids (10,000 by default) when a
    /// worker parses it again.
    pub const MAX_BYTES: usize = 1 << 20;

    /// Most values of one list matcher (`l=~"a|b|c"`). Each becomes a string when parsed,
    /// and a scalar and a one-value array each time a scan binds it: a 16 MiB list of
    /// short values cost about 1.5 GB; this many cost about 30 MB.
    pub const MAX_LIST_VALUES: usize = 65_536;

    /// Parses a selector.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        if input.len() > Self::MAX_BYTES {
            // Checked before anything is copied; the error keeps only the selector's start.
            return Err(SelectorError {
                column: 1,
                message: format!(
                    "a selector of {} bytes, more than {} (a list of values may hold up to {})",
                    input.len(),
                    Self::MAX_BYTES,
                    Self::MAX_LIST_VALUES
                ),
                input: format!("{}…", head(input, 256)),
            });
        }
        let mut p = Parser {
            input,
            chars: input.chars().collect(),
            pos: 0,
            regexes: 0,
        };
        p.skip_ws();
        let profile_type = p.profile_type()?;
        p.skip_ws();
        let mut matchers = Vec::new();
        if p.eat('{') {
            loop {
                p.skip_ws();
                if p.eat('}') {
                    break;
                }
                if matchers.len() == Self::MAX_MATCHERS {
                    let at = p.pos;
                    return p.error(
                        at,
                        format!("more than {} label matchers", Self::MAX_MATCHERS),
                    );
                }
                matchers.push(p.matcher()?);
                p.skip_ws();
                if p.eat(',') {
                    continue;
                }
                if p.eat('}') {
                    break;
                }
                let at = p.pos;
                return match p.peek() {
                    Some(c) => p.error(at, format!("expected ',' or '}}', found {c:?}")),
                    None => p.error(at, "expected ',' or '}', found the end"),
                };
            }
        } else if profile_type.is_none() {
            let at = p.pos;
            return p.error(at, "expected a profile type or '{'");
        }
        p.skip_ws();
        if let Some(c) = p.peek() {
            let at = p.pos;
            return p.error(at, format!("unexpected {c:?} after the selector"));
        }
        Ok(Self {
            profile_type,
            matchers,
        })
    }

    /// The engine predicate selecting the rows of this selector, for a table that has the
    /// columns `has` says (a label no row has reads as empty).
    pub fn to_predicate(&self, has: &dyn Fn(&str) -> bool) -> frostdb_core::Predicate {
        let mut p = self.profile_type.as_ref().map_or(
            frostdb_core::Predicate::Const(true),
            ProfileType::to_predicate,
        );
        for m in &self.matchers {
            p = p.and(m.to_predicate(has));
        }
        p
    }

    /// The filter selecting the rows of this selector, for a table of `schema`.
    pub fn to_expr(&self, schema: &ArrowSchema) -> Expr {
        let mut expr = self
            .profile_type
            .as_ref()
            .map_or(lit(true), ProfileType::to_expr);
        for m in &self.matchers {
            expr = expr.and(m.to_expr(schema));
        }
        expr
    }
}

/// The first `most` bytes of `text`, cut back to a character boundary: what an error keeps
/// of a long input.
fn head(text: &str, most: usize) -> &str {
    let mut end = text.len().min(most);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl FromStr for Selector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::{DataType, Field};

    use super::*;

    #[test]
    fn a_selector_prints_as_it_parses() {
        for text in [
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds{}",
            "memory:alloc_space:bytes:space:bytes:delta{job=\"api\",pod=~\"a-.*\"}",
            r#"{namespace!="kube-system",env!~"dev|test",q="a\"b\\c\nd\u0001é"}"#,
            "{}",
        ] {
            let parsed = Selector::parse(text).unwrap();
            let printed = parsed.to_string();
            assert_eq!(
                Selector::parse(&printed).unwrap(),
                parsed,
                "{text} -> {printed}"
            );
        }
        assert_eq!(
            Selector::parse(r#"{a="x\"y"}"#).unwrap().to_string(),
            r#"{a="x\"y"}"#
        );
    }

    /// A profile type id given apart is a bare id: one carrying matchers (a regex above
    /// all, which callers look for only in the label selector) is refused, as is one too
    /// long to be a type, and a label selector too long is refused before it is copied.
    #[test]
    fn a_profile_type_given_apart_may_not_carry_matchers() {
        let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
        for (profile_type, labels) in [
            (format!(r#"{cpu}{{a=~"\w{{60}}""#), "}".to_owned()),
            (format!("{cpu}{{}}"), String::new()),
            (format!("{cpu} x"), String::new()),
            ("a:".repeat(Selector::MAX_PROFILE_TYPE_BYTES), String::new()),
        ] {
            let e = Selector::from_parts(&profile_type, &labels).unwrap_err();
            assert!(e.message.contains("a profile type is"), "{e}");
        }
        let labels = format!("{{a=\"{}\"}}", "x".repeat(Selector::MAX_BYTES));
        let e = Selector::from_parts(cpu, &labels).unwrap_err();
        assert!(e.message.contains("more than"), "{e}");
        assert!(Selector::from_parts(&format!("{cpu}:delta"), "{a=\"b\"}").is_ok());
    }

    /// A list built from a request's values (span ids) is bounded as a parsed one: by its
    /// count and by its written bytes.
    #[test]
    fn a_list_of_values_is_bounded_as_a_parsed_one() {
        let long = "s".repeat(13_000);
        let ids: Vec<String> = (0..100).map(|i| format!("{long}{i}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let e = Matcher::any_of("span_id", &refs).unwrap_err();
        assert!(e.contains("bytes"), "{e}");
        // Escapes count: 600 KB of dots write 1.2 MB.
        let dots = ".".repeat(600_000);
        let e = Matcher::any_of("span_id", &[dots.as_str()]).unwrap_err();
        assert!(e.contains("bytes"), "{e}");
        let many: Vec<&str> = vec!["a"; Selector::MAX_LIST_VALUES + 1];
        let e = Matcher::any_of("span_id", &many).unwrap_err();
        assert!(e.contains("values"), "{e}");
        let m = Matcher::any_of("span_id", &many[1..]).unwrap();
        assert!(m.matches("a") && !m.matches("b"));
    }

    #[test]
    fn pyroscope_parts_and_profile_type_matchers_make_one_selector() {
        let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
        let s = Selector::from_parts(cpu, r#"{service_name="api"}"#).unwrap();
        assert_eq!(s.profile_type.as_ref().unwrap().to_string(), cpu);
        assert_eq!(s.matchers.len(), 1);
        assert_eq!(Selector::from_parts(cpu, "").unwrap().matchers, []);
        assert_eq!(Selector::from_parts("", "").unwrap(), Selector::default());
        // The matcher form names the type and leaves the other matchers.
        let s = Selector::from_parts("", &format!(r#"{{__profile_type__="{cpu}", pod=~"a.*"}}"#))
            .unwrap();
        assert_eq!(s.profile_type.as_ref().unwrap().to_string(), cpu);
        assert_eq!(s.matchers.len(), 1);
        assert_eq!(s.matchers[0].label, "pod");
        let same = Selector::from_parts(cpu, &format!(r#"{{__profile_type__="{cpu}"}}"#)).unwrap();
        assert_eq!(same.matchers, []);
        let errors = [
            (
                cpu,
                r#"{__profile_type__="memory:alloc_space:bytes:space:bytes"}"#,
                "contradicts",
            ),
            ("", r#"{__profile_type__=~"process.*"}"#, "takes only ="),
            ("", r#"{__profile_type__="cpu"}"#, "no profile type"),
            (cpu, r#"{service_name="api""#, "expected"),
            // A profile type id alone: a value holding matchers of its own (regexes,
            // compiled and counted against no limit) is none.
            (
                "",
                r#"{__profile_type__=`process_cpu:cpu:nanoseconds:cpu:nanoseconds{x=~"a.*"}`}"#,
                "no profile type",
            ),
            (
                "",
                r#"{__profile_type__="process_cpu:cpu:nanoseconds:cpu:nanoseconds{}"}"#,
                "no profile type",
            ),
        ];
        for (t, l, what) in errors {
            let e = Selector::from_parts(t, l).unwrap_err();
            assert!(e.message.contains(what), "{t}{l}: {e}");
        }
    }

    #[test]
    fn parses_parca_selectors() {
        let s = Selector::parse(
            r#"process_cpu:cpu:nanoseconds:cpu:nanoseconds{job="api", pod=~"a-.*", env!="dev",zone!~'eu.*',}"#,
        )
        .unwrap();
        let t = s.profile_type.as_ref().unwrap();
        assert_eq!(t.to_string(), "process_cpu:cpu:nanoseconds:cpu:nanoseconds");
        assert_eq!(s.matchers.len(), 4);
        assert_eq!(s.matchers[1].op, MatchOp::Regex);
        assert_eq!(s.matchers[3].value, "eu.*");
        let only = Selector::parse(r#"{ job = "a\"b\u00e9" }"#).unwrap();
        assert!(only.profile_type.is_none());
        assert_eq!(only.matchers[0].value, "a\"bé");
        assert!(
            Selector::parse("memory:alloc_space:bytes:space:bytes:delta")
                .unwrap()
                .profile_type
                .unwrap()
                .delta
        );
        assert!(Selector::parse("{}").unwrap().matchers.is_empty());
    }

    #[test]
    fn regexes_are_anchored_and_absent_labels_are_empty() {
        let s = Selector::parse(r#"{pod=~"a-.*", env!="dev", x="", y!~".+"}"#).unwrap();
        assert!(s.matchers[0].matches("a-1"));
        assert!(!s.matchers[0].matches("xa-1"), "anchored at the start");
        assert!(s.matchers[1].matches(""), "absent env is not dev");
        assert!(s.matchers[2].matches(""));
        assert!(s.matchers[3].matches(""));
    }

    #[test]
    fn regexes_are_refused_for_the_steps_matching_a_value_takes() {
        // Stepped at each byte of a value by its 2,015 states: 4 million steps.
        let e = Selector::parse(r#"{pod=~".*[ -~]{2000}x"}"#).unwrap_err();
        assert!(
            e.message.contains("steps to match one label value"),
            "{e:?}"
        );
        assert!(e.message.contains("2015 states") && e.message.contains("2048 bytes"));
        assert!(e.message.contains("over the 1048576"), "{e:?}");
        // Unicode classes have many states, but `api-\w{20}` matches at most 84 bytes
        // (6,332 states over them); patterns whose DFA fits the cache step once a byte.
        for ok in [
            r#"{pod=~"api-\\w{20}"}"#,
            r#"{pod=~"\\w+"}"#,
            r#"{pod=~".*[ -~]{200}x"}"#,
            r#"{pod=~"(?i).*(error|warn).*"}"#,
            r#"{pod=~".*a.{12}"}"#,
        ] {
            let s = Selector::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e:?}"));
            assert!(s.matchers[0].compiles_regex(), "{ok}");
        }
    }

    #[test]
    fn a_selector_of_too_many_matchers_is_refused_before_their_regexes_compile() {
        let selector = |n: usize, op: &str| {
            let matchers: Vec<String> = (0..n).map(|i| format!("l{i}{op}\"a.+b\"")).collect();
            format!("{{{}}}", matchers.join(","))
        };
        let most = Selector::parse(&selector(Selector::MAX_MATCHERS, "=")).unwrap();
        assert_eq!(most.matchers.len(), Selector::MAX_MATCHERS);
        let e = Selector::parse(&selector(Selector::MAX_MATCHERS + 1, "=")).unwrap_err();
        assert!(e.message.contains("more than 256 label matchers"), "{e:?}");
        // Regexes are fewer: each holds compiled programs from the moment it is parsed.
        let most = Selector::parse(&selector(Selector::MAX_REGEXES, "=~")).unwrap();
        assert!(most.matchers.iter().all(|m| m.regex.is_some()));
        let e = Selector::parse(&selector(Selector::MAX_REGEXES + 1, "=~")).unwrap_err();
        assert!(e.message.contains("more than 16 regex matchers"), "{e:?}");
        // A list of values is a set, not a regex: any number of them.
        let lists: Vec<String> = (0..100).map(|i| format!("l{i}=~\"a|b|c\"")).collect();
        assert!(Selector::parse(&format!("{{{}}}", lists.join(","))).is_ok());
        // Each list holds at most MAX_LIST_VALUES values, and the text at most MAX_BYTES.
        let list = |n: usize| {
            let values: Vec<String> = (0..n).map(|i| format!("{i:x}")).collect();
            format!("{{service_name=~\"{}\"}}", values.join("|"))
        };
        let most = Selector::parse(&list(Selector::MAX_LIST_VALUES)).unwrap();
        assert_eq!(
            most.matchers[0].set.as_ref().unwrap().len(),
            Selector::MAX_LIST_VALUES
        );
        let e = Selector::parse(&list(Selector::MAX_LIST_VALUES + 1)).unwrap_err();
        assert!(
            e.message
                .contains("a list of 65537 values, more than 65536"),
            "{e:?}"
        );
        let huge = format!("{{a=\"{}\"}}", "é".repeat(Selector::MAX_BYTES));
        let e = Selector::parse(&huge).unwrap_err();
        assert!(e.message.contains("more than 1048576"), "{e:?}");
        assert!(e.input.len() < 300 && e.to_string().len() < 1000, "{e}");
        // Counted repetitions of a Unicode class within reason compile; a program over the
        // size limit is refused naming it.
        assert!(Selector::parse(r#"{pod=~"api-\\w{20}"}"#).is_ok());
        let e = Selector::parse(r#"{a=~"\\w{1000}\\w{1000}"}"#).unwrap_err();
        assert!(
            e.message
                .contains("compiles to an automaton over the 1048576 bytes"),
            "{e:?}"
        );
    }

    #[test]
    fn a_list_of_values_matches_as_a_set_of_any_size() {
        let ids: Vec<String> = (0..20_000).map(|i| format!("{i:016x}")).collect();
        let mut refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        refs.push("a.b|(c)");
        let m = Matcher::any_of("span_id", &refs).unwrap();
        assert!(m.matches("0000000000004e1f") && m.matches("a.b|(c)"));
        assert!(!m.matches("0000000000004e20") && !m.matches("axb|(c)") && !m.matches(""));
        // Written as a regex, it reads back as the same set (as a worker parses it).
        let s = Selector {
            profile_type: None,
            matchers: vec![m],
        };
        let back = Selector::parse(&s.to_string()).unwrap();
        assert_eq!(back, s);
        assert!(back.matchers[0].matches("a.b|(c)") && !back.matchers[0].matches("axb|(c)"));
        let schema = ArrowSchema::new(vec![Field::new("labels.span_id", DataType::Utf8, true)]);
        let expr = back.to_expr(&schema).to_string();
        assert!(expr.contains("IN ("), "{}", &expr[..200]);
        // A regex listing literal values matches as one; negated too; others stay regexes.
        let s = Selector::parse(r#"{a=~"x|y\\.z|", b!~"x|y", c=~"x|y.*"}"#).unwrap();
        let [a, b, c] = &s.matchers[..] else {
            panic!("{s}")
        };
        assert!(a.set.is_some() && b.set.is_some() && c.set.is_none());
        assert!(a.matches("y.z") && a.matches("") && !a.matches("yxz") && !a.matches("x|y"));
        assert!(!b.matches("x") && b.matches("z") && b.matches(""));
        assert!(c.matches("yzz"));
    }

    #[test]
    fn errors_point_at_the_column() {
        let cases = [
            ("{job=\"a\" pod=\"b\"}", 10, "expected ',' or '}'"),
            ("{job~\"a\"}", 5, "expected one of"),
            ("{9job=\"a\"}", 2, "label name"),
            ("{job=\"a}", 6, "unterminated"),
            ("{job=~\"(\"}", 7, "bad regex"),
            ("cpu:cpu{}", 1, "5 parts"),
            ("a:b:c:d:e:f{}", 11, "delta"),
            ("a:b::d:e", 5, "empty part"),
            ("{job=a}", 6, "quoted value"),
            ("{job=\"a\"} x", 11, "unexpected"),
        ];
        for (input, column, needle) in cases {
            let err = Selector::parse(input).unwrap_err();
            assert_eq!(err.column, column, "{input}: {err}");
            assert!(err.message.contains(needle), "{input}: {err}");
            // The caret stands under the column.
            let text = err.to_string();
            let lines: Vec<&str> = text.lines().collect();
            let (shown, caret) = (lines[lines.len() - 2], lines[lines.len() - 1]);
            assert_eq!(shown.trim_start(), input);
            assert_eq!(caret.find('^'), Some(2 + column - 1), "{text}");
        }
    }

    #[test]
    fn an_error_in_a_selector_of_megabytes_is_short() {
        // Past the 65,535 columns a format width may have, and far too long to echo.
        let input = format!("{{job=\"{}\" x}}", "a".repeat(900_000));
        let err = Selector::parse(&input).unwrap_err();
        assert_eq!(err.column, 900_000 + 9);
        let text = err.to_string();
        assert!(text.len() < 400, "{} bytes", text.len());
        let lines: Vec<&str> = text.lines().collect();
        let (shown_line, caret_line) = (lines[lines.len() - 2], lines[lines.len() - 1]);
        let at = caret_line.find('^').unwrap();
        assert_eq!(shown_line.chars().nth(at), Some('x'), "{text}");
    }

    #[test]
    fn absent_columns_become_constants() {
        let schema = ArrowSchema::new(vec![Field::new("labels.job", DataType::Utf8, true)]);
        let never = Selector::parse(r#"{missing="x"}"#)
            .unwrap()
            .to_expr(&schema);
        assert_eq!(never, lit(true).and(lit(false)));
        let always = Selector::parse(r#"{missing!="x"}"#)
            .unwrap()
            .to_expr(&schema);
        assert_eq!(always, lit(true).and(lit(true)));
    }
}
