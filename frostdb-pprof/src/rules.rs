//! Recording rules: profiles turned into metrics as they are stored, not by rescanning.
//!
//! A [`RecordingRule`] names a profile type, label matchers, optionally a function (a frame
//! anywhere in a sample's stack, or only its leaf), and the labels its series keep. Each
//! profile a store stores (once: a profile stored again adds nothing) adds to every rule it
//! matches the sum of its samples' values whose stack has the function (all of them without
//! one), to the series of the kept labels' values: a counter, as Prometheus reads one
//! (`rate()` of a CPU rule is the function's CPU nanoseconds per second). A profile counts
//! when it is stored, whatever its own time: a backfill, or a client catching up, shows in
//! `rate()` when it arrives (profiles are refused more than an hour ahead of now, so none
//! counts early by more).
//!
//! The work per profile is bounded by what it holds, not by the rules: each rule is checked
//! against each of the profile's label sets once, and each stack walked once for all the
//! rules' functions together (a bit per function).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use frostdb_profile::{Matcher, ProfileType, Selector};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::decode::ValidProfile;

/// A recording rule, as the server's config and rules API spell it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordingRule {
    /// The metric's name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
    pub name: String,
    /// The profile type, `name:sample_type:sample_unit:period_type:period_unit`.
    pub profile_type: String,
    /// Label matchers, `{service_name="api"}`; empty for every series.
    #[serde(default)]
    pub selector: String,
    /// A function: only samples with a frame of it count (absent: every sample).
    #[serde(default)]
    pub function: Option<String>,
    /// With `function`, only samples whose leaf frame is it: its self value.
    #[serde(default)]
    pub leaf_only: bool,
    /// The labels the series keep; the others are summed away.
    #[serde(default)]
    pub keep_labels: Vec<String>,
}

/// How many rules and series a [`Recorder`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleLimits {
    /// Most rules.
    pub max_rules: usize,
    /// Most series, all rules together; a profile's value for a series past it is dropped
    /// (counted in [`RuleStatus::dropped`]). A series keeps at most [`MAX_KEPT_BYTES`] of
    /// label values.
    pub max_series: usize,
}

impl Default for RuleLimits {
    fn default() -> Self {
        Self {
            max_rules: 100,
            max_series: 10_000,
        }
    }
}

/// Why rules were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RuleError(pub String);

/// One series of a rule: the kept labels' values (in the rule's order) and its total.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSeries {
    /// The rule's name.
    pub rule: String,
    /// `(label, value)` of each kept label.
    pub labels: Vec<(String, String)>,
    /// The sum of the values recorded, since the recorder started.
    pub value: i64,
}

/// A rule and what it recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleStatus {
    /// The rule.
    pub rule: RecordingRule,
    /// Its series.
    pub series: usize,
    /// Profiles' values not recorded: past the series limit, or of a profile whose label
    /// values are more bytes than its regexes may test of one.
    pub dropped: u64,
}

/// Most regex matchers (compiled programs) a tenant's rules hold together.
pub const MAX_REGEXES: usize = 64;

struct Compiled {
    rule: RecordingRule,
    profile_type: ProfileType,
    matchers: Vec<Matcher>,
    /// Its function's bit among [`RuleSet::functions`] (0: no function).
    bit: u64,
}

/// The rules, and the distinct functions they name (a bit each, at most 64).
#[derive(Default)]
struct RuleSet {
    compiled: Vec<Compiled>,
    functions: Vec<String>,
}

impl std::ops::Deref for RuleSet {
    type Target = Vec<Compiled>;

    fn deref(&self) -> &Vec<Compiled> {
        &self.compiled
    }
}

/// Most distinct functions all of a tenant's rules may name (a bit each).
const MAX_FUNCTIONS: usize = 64;

/// Most stacks whose function bits are kept (a table slot of 33 bytes each, at most twice
/// as many slots: under 70 MB).
const MAX_CACHED_STACKS: usize = 1 << 20;

/// What a rule recorded: per kept labels' values, the total.
#[derive(Default)]
struct Recorded {
    values: hashbrown::HashMap<Vec<String>, i64, foldhash::fast::RandomState>,
    dropped: u64,
    /// About what `values` hold ([`series_bytes`]).
    bytes: usize,
}

/// About what a recorded series of kept label values `key` holds: its strings, their
/// headers, and its table slot.
fn series_bytes(key: &[&str]) -> usize {
    key.iter().map(|v| v.len() + 24).sum::<usize>() + 64
}

/// Kept labels' values, borrowed: looks a series up without allocating its key (hashes as
/// the `Vec<String>` it stands for).
#[derive(Hash)]
struct Key<'a>(&'a [&'a str]);

impl hashbrown::Equivalent<Vec<String>> for Key<'_> {
    fn equivalent(&self, key: &Vec<String>) -> bool {
        self.0.len() == key.len() && self.0.iter().zip(key).all(|(a, b)| *a == b)
    }
}

/// The rules of one tenant and their series.
pub struct Recorder {
    limits: RuleLimits,
    rules: RwLock<Arc<RuleSet>>,
    /// Per stack (its content key, equal for equal stacks whichever profile sends them),
    /// the bits of the rules' functions it holds (anywhere, as its leaf): a stack seen
    /// before is not walked again. Valid for the current rule set; emptied with it, and when
    /// a stack not in it would take it past `max_cached_stacks`.
    stacks: Mutex<hashbrown::HashMap<u128, (u64, u64), foldhash::fast::RandomState>>,
    max_cached_stacks: usize,
    /// Per rule (by name), what it recorded.
    recorded: Mutex<HashMap<String, Recorded>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("limits", &self.limits)
            .field("rules", &self.rules.read().len())
            .finish_non_exhaustive()
    }
}

/// Per location of `profile` (by position), the bits of `functions` among its lines
/// (inlined frames included) and in its innermost line.
fn location_bits(profile: &ValidProfile, functions: &[String]) -> Vec<(u64, u64)> {
    let flat = profile.flat();
    // Names of another length than every wanted one are not compared.
    let mut lengths = [0u64; 4];
    for f in functions {
        lengths[(f.len() / 64) % 4] |= 1 << (f.len() % 64);
    }
    let function: Vec<u64> = flat
        .function
        .iter()
        .map(|f| {
            let n = flat.string(f.name);
            if lengths[(n.len() / 64) % 4] & (1 << (n.len() % 64)) == 0 {
                return 0;
            }
            functions
                .binary_search_by(|x| x.as_str().cmp(n))
                .map_or(0, |i| 1 << i)
        })
        .collect();
    let of_line = |l: &crate::proto::Line| {
        profile
            .ids
            .functions
            .get(l.function_id)
            .map_or(0, |i| function[i])
    };
    flat.locations()
        .map(|l| {
            let any = l.line.iter().fold(0, |m, line| m | of_line(line));
            (any, l.line.first().map_or(0, of_line))
        })
        .collect()
}

/// Whether `name` is a Prometheus metric or label name (`colon`: metric names may hold `:`).
fn valid_name(name: &str, colon: bool) -> bool {
    let ok = |c: char, first: bool| {
        c.is_ascii_alphabetic() || c == '_' || (colon && c == ':') || (!first && c.is_ascii_digit())
    };
    let mut chars = name.chars();
    chars.next().is_some_and(|c| ok(c, true)) && chars.all(|c| ok(c, false)) && name.len() <= 200
}

fn compile(rule: &RecordingRule) -> Result<Compiled, RuleError> {
    let bad = |what: String| RuleError(format!("recording rule {:?}: {what}", rule.name));
    if !valid_name(&rule.name, true) {
        return Err(bad(
            "the name must be a Prometheus metric name, [a-zA-Z_:][a-zA-Z0-9_:]* (at most 200)"
                .into(),
        ));
    }
    if rule.profile_type.len() > 512 || rule.selector.len() > 4096 {
        return Err(bad(
            "the profile type may have at most 512 bytes, the selector 4096".into(),
        ));
    }
    let selector = match rule.selector.trim() {
        "" => "{}",
        s => s,
    };
    let parsed = Selector::parse(&format!("{}{selector}", rule.profile_type.trim()))
        .map_err(|e| bad(format!("{e}")))?;
    let profile_type = parsed.profile_type.clone().ok_or_else(|| {
        bad(format!(
            "{:?} is no profile type (name:sample_type:sample_unit:period_type:period_unit)",
            rule.profile_type
        ))
    })?;
    if let Some(label) = rule.keep_labels.iter().find(|l| !valid_name(l, false)) {
        return Err(bad(format!("{label:?} is no label name")));
    }
    // A series naming a label twice, or one of the names Prometheus reserves (`__name__`
    // would rename the series), is refused by whatever scrapes it: the scrape of every
    // other series with it.
    if let Some(label) = rule.keep_labels.iter().find(|l| l.starts_with("__")) {
        return Err(bad(format!(
            "{label:?}: label names starting with __ are reserved by Prometheus"
        )));
    }
    if let Some((i, label)) = rule
        .keep_labels
        .iter()
        .enumerate()
        .find(|(i, l)| rule.keep_labels[..*i].contains(l))
    {
        return Err(bad(format!("keep_labels names {label:?} twice (at {i})")));
    }
    if rule.keep_labels.len() > 16 {
        return Err(bad("at most 16 labels are kept".into()));
    }
    match &rule.function {
        Some(f) if f.is_empty() || f.len() > 1024 => {
            return Err(bad("the function name must have 1 to 1024 bytes".into()));
        }
        None if rule.leaf_only => return Err(bad("leaf_only needs a function".into())),
        _ => {}
    }
    Ok(Compiled {
        rule: rule.clone(),
        profile_type,
        matchers: parsed.matchers,
        bit: 0,
    })
}

impl Recorder {
    /// A recorder without rules, keeping at most `limits`.
    pub fn new(limits: RuleLimits) -> Self {
        Self {
            limits,
            rules: RwLock::new(Arc::new(RuleSet::default())),
            stacks: Mutex::new(Default::default()),
            max_cached_stacks: MAX_CACHED_STACKS,
            recorded: Mutex::new(HashMap::new()),
        }
    }

    /// This recorder, keeping the function bits of at most `stacks` stacks (a test's few).
    #[doc(hidden)]
    pub fn with_stack_cache(mut self, stacks: usize) -> Self {
        self.max_cached_stacks = stacks.max(1);
        self
    }

    /// About what it holds in memory: its stack cache's table (a slot of 33 bytes each),
    /// and its recorded series (kept for the server's life: counters).
    pub fn memory_bytes(&self) -> usize {
        self.stack_cache_bytes() + self.series_bytes()
    }

    /// What its recorded series hold.
    pub fn series_bytes(&self) -> usize {
        self.recorded.lock().values().map(|r| r.bytes).sum()
    }

    /// What its stack cache's table holds.
    pub fn stack_cache_bytes(&self) -> usize {
        self.stacks.lock().capacity() * 33
    }

    /// Forgets the stacks whose function bits are cached, giving their memory back (a
    /// tenant closing: they are found again as its profiles come). Its series stay.
    pub fn forget_stacks(&self) {
        *self.stacks.lock() = Default::default();
    }

    /// The stacks whose function bits are cached, and the room the cache holds.
    #[doc(hidden)]
    pub fn stack_cache(&self) -> (usize, usize) {
        let cache = self.stacks.lock();
        (cache.len(), cache.capacity())
    }

    /// Its limits.
    pub fn limits(&self) -> RuleLimits {
        self.limits
    }

    /// Checks `rules` as [`Recorder::set_rules`] would, changing nothing.
    pub fn check(&self, rules: &[RecordingRule]) -> Result<(), RuleError> {
        self.compile_all(rules).map(|_| ())
    }

    fn compile_all(&self, rules: &[RecordingRule]) -> Result<RuleSet, RuleError> {
        if rules.len() > self.limits.max_rules {
            return Err(RuleError(format!(
                "{} recording rules, over the limit of {} a tenant (limits.max_recording_rules)",
                rules.len(),
                self.limits.max_rules
            )));
        }
        let mut names = std::collections::HashSet::new();
        let mut compiled = Vec::with_capacity(rules.len());
        // Each regex holds its compiled programs for as long as the rules stand (and is
        // built again whenever the tenant opens): bounded for all rules together, counted
        // as each rule compiles, so that a request past the bound stops compiling there.
        let mut regexes = 0usize;
        for rule in rules {
            if !names.insert(rule.name.as_str()) {
                return Err(RuleError(format!(
                    "two recording rules are named {:?}",
                    rule.name
                )));
            }
            let rule = compile(rule)?;
            regexes += rule.matchers.iter().filter(|m| m.compiles_regex()).count();
            if regexes > MAX_REGEXES {
                return Err(RuleError(format!(
                    "the recording rules hold more than {MAX_REGEXES} regex matchers, the most \
                     a tenant's rules may hold together (a list of values, a|b|c, is not one)"
                )));
            }
            compiled.push(rule);
        }
        let mut functions: Vec<String> = rules.iter().filter_map(|r| r.function.clone()).collect();
        functions.sort_unstable();
        functions.dedup();
        if functions.len() > MAX_FUNCTIONS {
            return Err(RuleError(format!(
                "the recording rules name {} distinct functions, over the {MAX_FUNCTIONS} a \
                 tenant's rules may name together",
                functions.len()
            )));
        }
        for c in &mut compiled {
            if let Some(f) = &c.rule.function {
                let i = functions.binary_search(f).expect("listed above");
                c.bit = 1 << i;
            }
        }
        Ok(RuleSet {
            compiled,
            functions,
        })
    }

    /// Replaces the rules with `rules` (all or none: an error changes nothing). A rule kept
    /// unchanged keeps its series; a changed or removed one's series are let go (a counter
    /// reset, to Prometheus).
    pub fn set_rules(&self, rules: &[RecordingRule]) -> Result<(), RuleError> {
        let compiled = self.compile_all(rules)?;
        let mut recorded = self.recorded.lock();
        let mut current = self.rules.write();
        *self.stacks.lock() = Default::default();
        recorded.retain(|name, _| {
            let old = current.iter().find(|c| &c.rule.name == name);
            let new = compiled.iter().find(|c| &c.rule.name == name);
            matches!((old, new), (Some(o), Some(n)) if o.rule == n.rule)
        });
        *current = Arc::new(compiled);
        Ok(())
    }

    /// The rules, and what each recorded.
    pub fn status(&self) -> Vec<RuleStatus> {
        let rules = self.rules.read().clone();
        let recorded = self.recorded.lock();
        rules
            .iter()
            .map(|c| {
                let r = recorded.get(&c.rule.name);
                RuleStatus {
                    rule: c.rule.clone(),
                    series: r.map_or(0, |r| r.values.len()),
                    dropped: r.map_or(0, |r| r.dropped),
                }
            })
            .collect()
    }

    /// Every series, by rule name and labels.
    pub fn series(&self) -> Vec<RuleSeries> {
        let rules = self.rules.read().clone();
        let recorded = self.recorded.lock();
        let mut out = Vec::new();
        for c in rules.iter() {
            let Some(r) = recorded.get(&c.rule.name) else {
                continue;
            };
            for (values, &value) in &r.values {
                out.push(RuleSeries {
                    rule: c.rule.name.clone(),
                    labels: c
                        .rule
                        .keep_labels
                        .iter()
                        .cloned()
                        .zip(values.iter().cloned())
                        .collect(),
                    value,
                });
            }
        }
        out.sort_by(|a, b| (&a.rule, &a.labels).cmp(&(&b.rule, &b.labels)));
        out
    }

    /// Whether any rule is set: a store asks before doing any work for them.
    pub(crate) fn active(&self) -> bool {
        !self.rules.read().is_empty()
    }

    /// Records a stored profile: `name` its profile name, `series` its request labels,
    /// `label_sets` its sample label sets, `rows` its `(type, group, value)` rows and
    /// `group` each row group's sample and label set.
    pub(crate) fn observe(
        &self,
        profile: &ValidProfile,
        name: &str,
        series: &BTreeMap<String, String>,
        label_sets: &[Vec<(String, String)>],
        group: impl Fn(u32) -> (usize, u32, u128),
        rows: &[(u16, u32, i64)],
    ) {
        let rules = self.rules.read().clone();
        if rules.is_empty() || rows.is_empty() {
            return;
        }
        let flat = profile.flat();
        let text = |i: i64, fallback: &'static str| match flat.string(i) {
            "" => fallback,
            s => s,
        };
        let (period_type, period_unit) = flat
            .period_type
            .as_ref()
            .map_or(("unknown", "unknown"), |t| {
                (text(t.r#type, "unknown"), text(t.unit, "unknown"))
            });
        // The rules the profile's types match, and per sample type (by index) those of
        // `matching` its values count for. A rule is one entry however many of the
        // profile's sample types it matches (a profile may repeat one): what a row costs
        // and what is kept per label set grow with the rules, never with the types.
        let mut matching: Vec<usize> = Vec::new();
        let mut by_type: Vec<Vec<usize>> = Vec::new();
        for (r, c) in rules.iter().enumerate() {
            let t = &c.profile_type;
            if t.name != name || t.period_type != period_type || t.period_unit != period_unit {
                continue;
            }
            let m = matching.len();
            for (i, st) in flat.sample_type.iter().enumerate() {
                if text(st.r#type, "samples") == t.sample_type
                    && text(st.unit, "count") == t.sample_unit
                {
                    if by_type.len() <= i {
                        by_type.resize_with(i + 1, Vec::new);
                    }
                    by_type[i].push(m);
                    if matching.len() == m {
                        matching.push(r);
                    }
                }
            }
        }
        if matching.is_empty() {
            return;
        }
        // Which label sets each matching rule selects, and the kept labels' values.
        let value_of = |set: usize, label: &str| -> &str {
            if label == "__name__" {
                return name;
            }
            label_sets[set]
                .iter()
                .find(|(k, _)| k == label)
                .map(|(_, v)| v.as_str())
                .or_else(|| series.get(label).map(String::as_str))
                .unwrap_or("")
        };
        // Only the label sets rows use (a set whose samples are all 0 stores nothing): a
        // profile of a million such sets had each tested by every rule's every matcher,
        // minutes of a stored profile's time, and used up a regex's bytes before the one
        // set that counted. `used[d]` is a used set, `dense[set]` its place there.
        let mut dense = vec![u32::MAX; label_sets.len()];
        let mut used: Vec<usize> = Vec::new();
        for &(_, g, _) in rows {
            let set = group(g).1 as usize;
            if dense[set] == u32::MAX {
                dense[set] = used.len() as u32;
                used.push(set);
            }
        }
        let sets = used.len();
        let mut selects: Vec<bool> = Vec::with_capacity(matching.len() * sets);
        // The label value bytes the rules' regexes test, bounded a profile: a regex's time
        // grows with the bytes it reads and its size, and this runs for a stored profile,
        // where nothing stops it. A rule past the bound does not count this profile, and
        // says so (`dropped`).
        let mut tested = 0usize;
        let mut skipped = Vec::new();
        for &r in &matching {
            let from = selects.len();
            for &set in &used {
                match matches_all(&rules[r].matchers, &mut tested, |l| value_of(set, l)) {
                    Some(selected) => selects.push(selected),
                    None => {
                        skipped.push(r);
                        selects.truncate(from);
                        selects.extend(std::iter::repeat_n(false, sets));
                        break;
                    }
                }
            }
        }
        if !skipped.is_empty() {
            let mut adding = self.adding();
            for r in skipped {
                adding.skip(&rules[r].rule, tested);
            }
        }
        // Per (matching rule, label set): the sum of its rows.
        let mut sums = vec![0i64; matching.len() * sets];
        let mut counted = vec![false; matching.len() * sets];
        // The bits of the matching rules' functions together (none: no rule names one).
        let wanted = matching.iter().fold(0, |b, &r| b | rules[r].bit);
        // Each distinct stack's function bits are found once (the cache, by its content
        // key) or by walking it with this profile's location bits, made on the first
        // stack not cached.
        let masks: std::cell::OnceCell<Vec<(u64, u64)>> = std::cell::OnceCell::new();
        let mut cache = (wanted != 0).then(|| self.stacks.lock());
        for &(t, g, v) in rows {
            let (sample, set, key) = group(g);
            let set = dense[set as usize] as usize;
            let counting = by_type.get(usize::from(t)).map_or(&[][..], Vec::as_slice);
            for &m in counting {
                let at = m * sets + set;
                if rules[matching[m]].bit == 0 && selects[at] {
                    sums[at] = sums[at].saturating_add(v);
                    counted[at] = true;
                }
            }
            let Some(cache) = &mut cache else {
                continue;
            };
            // Full, the cache starts again, its memory given back (a profile of millions
            // of stacks grew it four times past its bound, and a cleared table keeps its
            // room for the server's life).
            if cache.len() >= self.max_cached_stacks && !cache.contains_key(&key) {
                **cache = Default::default();
            }
            let (any, leaf) = *cache.entry(key).or_insert_with(|| {
                let masks = masks.get_or_init(|| location_bits(profile, &rules.functions));
                let stack = profile.flat().sample(sample).location_id;
                let at = |id: &u64| profile.ids.locations.get(*id).map_or((0, 0), |i| masks[i]);
                (
                    stack.iter().fold(0, |m, id| m | at(id).0),
                    stack.first().map_or(0, |id| at(id).1),
                )
            });
            // Most stacks hold none of the rules' functions: nothing more to look at.
            if (any | leaf) & wanted == 0 {
                continue;
            }
            for &m in counting {
                let rule = &rules[matching[m]];
                let held = if rule.rule.leaf_only { leaf } else { any };
                let at = m * sets + set;
                if held & rule.bit != 0 && selects[at] {
                    sums[at] = sums[at].saturating_add(v);
                    counted[at] = true;
                }
            }
        }
        drop(cache);
        if !counted.contains(&true) {
            return;
        }
        let mut adding = self.adding();
        let mut key: Vec<&str> = Vec::new();
        for (at, _) in counted.iter().enumerate().filter(|(_, c)| **c) {
            let (m, set) = (at / sets, used[at % sets]);
            let rule = &rules[matching[m]].rule;
            key.clear();
            key.extend(rule.keep_labels.iter().map(|l| value_of(set, l)));
            adding.add(rule, &key, sums[at]);
        }
    }

    /// Records rows stored through the Arrow samples API: `batch` as the samples table
    /// holds them (profile type and `labels.*` columns, `stacktrace_id`, `value`), their
    /// stacks in `symbols`. Each row adds its value to every rule whose profile type and
    /// matchers its columns match and whose function its stack holds, as a profile's
    /// samples do ([`Recorder::observe`]). Rows of one series are adjacent (the table's
    /// order): the rules are matched once a run, each stack walked once a call.
    pub(crate) fn observe_batch(
        &self,
        batch: &arrow::array::RecordBatch,
        symbols: &crate::Symbols,
    ) {
        use arrow::array::{Array, AsArray};
        use arrow::datatypes::{Int64Type, UInt64Type};
        use frostdb_profile::native::Strings;
        use frostdb_profile::schema::column::{
            NAME, PERIOD_TYPE, PERIOD_UNIT, SAMPLE_TYPE, SAMPLE_UNIT, STACKTRACE_ID, VALUE,
            label_column,
        };
        let rules = self.rules.read().clone();
        if rules.is_empty() || batch.num_rows() == 0 {
            return;
        }
        let texts = |name: &str| {
            batch
                .column_by_name(name)
                .and_then(|c| Strings::of(c.as_ref()).ok())
        };
        let [Some(name), Some(st), Some(su), Some(pt), Some(pu)] =
            [NAME, SAMPLE_TYPE, SAMPLE_UNIT, PERIOD_TYPE, PERIOD_UNIT].map(texts)
        else {
            tracing::warn!("recording rules: a samples batch without its profile type columns");
            return;
        };
        let (Some(ids), Some(values)) = (
            batch
                .column_by_name(STACKTRACE_ID)
                .and_then(|c| c.as_primitive_opt::<UInt64Type>()),
            batch
                .column_by_name(VALUE)
                .and_then(|c| c.as_primitive_opt::<Int64Type>()),
        ) else {
            tracing::warn!("recording rules: a samples batch without stack ids or values");
            return;
        };
        // The labels any rule looks at, and their columns (absent: every value empty).
        let mut wanted: Vec<&str> = rules
            .iter()
            .flat_map(|c| {
                c.matchers
                    .iter()
                    .map(|m| m.label.as_str())
                    .chain(c.rule.keep_labels.iter().map(String::as_str))
            })
            .filter(|l| *l != "__name__")
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let columns: Vec<Option<Strings<'_>>> =
            wanted.iter().map(|l| texts(&label_column(l))).collect();
        let label = |i: usize, l: &str| -> &str {
            if l == "__name__" {
                return name.get(i);
            }
            wanted
                .binary_search(&l)
                .ok()
                .and_then(|c| columns[c].as_ref())
                .map_or("", |t| t.get(i))
        };
        // Per (rule, kept labels' values): the sum; and the current run's (rule, sum).
        let mut sums: Vec<(usize, Vec<&str>, Option<i64>)> = Vec::new();
        let mut index: HashMap<(usize, Vec<&str>), usize> = HashMap::new();
        let mut run: Vec<(usize, usize)> = Vec::new();
        let mut run_key: Vec<&str> = Vec::new();
        let mut key: Vec<&str> = Vec::new();
        let mut bits: HashMap<u64, (u64, u64)> = HashMap::new();
        // The label value bytes the rules' regexes test, bounded a call as a profile's are
        // ([`MAX_TESTED_BYTES`]): a rule past it counts none of the call's rows, and says
        // so (`dropped`).
        let mut tested = 0usize;
        let mut skipped: Vec<usize> = Vec::new();
        for i in 0..batch.num_rows() {
            if !ids.is_valid(i) || !values.is_valid(i) {
                continue;
            }
            key.clear();
            key.extend([name.get(i), st.get(i), su.get(i), pt.get(i), pu.get(i)]);
            key.extend(wanted.iter().map(|l| label(i, l)));
            if key != run_key {
                std::mem::swap(&mut run_key, &mut key);
                run.clear();
                for (r, c) in rules.iter().enumerate() {
                    let t = &c.profile_type;
                    let same_type = [
                        &t.name,
                        &t.sample_type,
                        &t.sample_unit,
                        &t.period_type,
                        &t.period_unit,
                    ]
                    .iter()
                    .zip(&run_key)
                    .all(|(a, b)| a.as_str() == *b);
                    if !same_type || skipped.contains(&r) {
                        continue;
                    }
                    match matches_all(&c.matchers, &mut tested, |l| label(i, l)) {
                        Some(true) => {}
                        Some(false) => continue,
                        None => {
                            skipped.push(r);
                            continue;
                        }
                    }
                    let kept: Vec<&str> = c.rule.keep_labels.iter().map(|l| label(i, l)).collect();
                    let next = sums.len();
                    let at = *index.entry((r, kept.clone())).or_insert(next);
                    if at == next {
                        sums.push((r, kept, None));
                    }
                    run.push((r, at));
                }
            }
            let (id, v) = (ids.value(i), values.value(i));
            for &(r, at) in &run {
                let c = &rules[r];
                if c.bit != 0 {
                    let (any, leaf) = *bits.entry(id).or_insert_with(|| {
                        let mut found = (0u64, 0u64);
                        let mut first = true;
                        symbols.for_each_frame(crate::StackId(id), |frame| {
                            let bit = frame.function_name().map_or(0, |n| {
                                rules
                                    .functions
                                    .binary_search_by(|f| f.as_str().cmp(n))
                                    .map_or(0, |b| 1 << b)
                            });
                            found.0 |= bit;
                            if first {
                                found.1 = bit;
                                first = false;
                            }
                        });
                        found
                    });
                    let held = if c.rule.leaf_only { leaf } else { any };
                    if held & c.bit == 0 {
                        continue;
                    }
                }
                let sum = sums[at].2.get_or_insert(0);
                *sum = sum.saturating_add(v);
            }
        }
        let mut adding = self.adding();
        for &r in &skipped {
            adding.skip(&rules[r].rule, tested);
        }
        for (r, kept, sum) in &sums {
            if let Some(sum) = sum
                && !skipped.contains(r)
            {
                adding.add(&rules[*r].rule, kept, *sum);
            }
        }
    }

    /// The recorded series, locked for adding to.
    fn adding(&self) -> Adding<'_> {
        let recorded = self.recorded.lock();
        let total = recorded.values().map(|r| r.values.len()).sum();
        Adding {
            recorded,
            total,
            max_series: self.limits.max_series,
        }
    }
}

/// The recorded series, locked, and how many there are.
/// Whether `matchers` all match the label values `value_of` gives, adding the bytes their
/// regexes test to `tested`: `None` once that passes [`MAX_TESTED_BYTES`].
fn matches_all<'v>(
    matchers: &[Matcher],
    tested: &mut usize,
    value_of: impl Fn(&str) -> &'v str,
) -> Option<bool> {
    for m in matchers {
        let value = value_of(&m.label);
        if m.compiles_regex() {
            *tested = tested.saturating_add(value.len());
            if *tested > MAX_TESTED_BYTES {
                return None;
            }
        }
        if !m.matches(value) {
            return Some(false);
        }
    }
    Some(true)
}

/// Most bytes of label values the rules' regex matchers test for one stored profile (or
/// one call of the Arrow samples API), all rules together: real profiles test kilobytes (a few rules, a few label sets of short
/// values); thousands of label sets of long values under many regexes took minutes.
const MAX_TESTED_BYTES: usize = 16 << 20;

/// Most bytes of kept label values one series of a rule may hold, all its kept labels
/// together. Series are kept for the server's life and copied by every exposition and
/// remote write: a series is a few short values (a service, a pod), and 16 kept labels of
/// 2 KiB values (the label limits) made 330 MB per tenant at the series limit. Past it, the
/// profile's value for that series is dropped and counted.
pub const MAX_KEPT_BYTES: usize = 1024;

struct Adding<'a> {
    recorded: parking_lot::MutexGuard<'a, HashMap<String, Recorded>>,
    total: usize,
    max_series: usize,
}

impl Adding<'_> {
    /// `rule` does not count a profile: its regexes would have tested more label value
    /// bytes than [`MAX_TESTED_BYTES`] (`tested` when it was stopped).
    fn skip(&mut self, rule: &RecordingRule, tested: usize) {
        let r = self.recorded.entry(rule.name.clone()).or_default();
        if r.dropped == 0 {
            tracing::warn!(
                rule = %rule.name,
                tested,
                limit = MAX_TESTED_BYTES,
                "a recording rule's regexes would test more label value bytes of one profile \
                 than the limit: the profile is not counted by it, and counted as dropped"
            );
        }
        r.dropped += 1;
    }

    /// Adds `sum` to `rule`'s series of the kept labels' values `key`: a new series past the
    /// limit, or keeping more than [`MAX_KEPT_BYTES`] of values, is dropped and counted.
    fn add(&mut self, rule: &RecordingRule, key: &[&str], sum: i64) {
        let r = match self.recorded.get_mut(rule.name.as_str()) {
            Some(r) => r,
            None => self.recorded.entry(rule.name.clone()).or_default(),
        };
        match r.values.get_mut(&Key(key)) {
            Some(value) => *value = value.wrapping_add(sum),
            None if key.iter().map(|v| v.len()).sum::<usize>() > MAX_KEPT_BYTES => {
                if r.dropped == 0 {
                    tracing::warn!(
                        rule = %rule.name,
                        limit = MAX_KEPT_BYTES,
                        "a recording rule's kept label values of a series pass the limit of \
                         bytes a series may keep: its values are dropped and counted"
                    );
                }
                r.dropped += 1;
            }
            None if self.total < self.max_series => {
                r.values
                    .insert(key.iter().map(|s| (*s).to_owned()).collect(), sum);
                r.bytes += series_bytes(key);
                self.total += 1;
            }
            None => {
                if r.dropped == 0 {
                    tracing::warn!(
                        rule = %rule.name,
                        limit = self.max_series,
                        "recording rule series past the limit (limits.max_recording_rule_series): \
                         their values are dropped and counted"
                    );
                }
                r.dropped += 1;
            }
        }
    }
}
