//! Regressions between two selections (a service's version and the one before it, or any
//! two selectors): per function, its share of the total, self (the leaf) and total
//! (anywhere in the stack), compared profile by profile. A function is a regression when
//! its share over all of a side's profiles rose by at least a threshold and a Mann-Whitney
//! U test over the per-profile shares says the rise is not noise, at a false discovery rate
//! kept over all the functions tested (Benjamini-Hochberg): one merged pair cannot tell a
//! real change from a noisy profile, a test over profiles can.

mod stats;

use std::collections::HashMap;

use serde::Serialize;

pub use stats::{benjamini_hochberg, mann_whitney_greater};

use crate::store::Profiles;
use crate::symbols::StackId;

/// How [`compare`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompareOptions {
    /// The rise of a function's share of the total (self or total) that counts, as a
    /// fraction: 0.01 is one percentage point.
    pub min_increase: f64,
    /// The false discovery rate over all the tests of a comparison (each function's self
    /// and total share).
    pub significance: f64,
    /// Profiles each side needs before it is compared.
    pub min_profiles: usize,
    /// Regressions listed at most (the largest rises).
    pub max_listed: usize,
    /// Most function ids the distinct stacks of one side may name in all
    /// ([`MAX_SIDE_FUNCTIONS`] by default): past it the comparison is refused.
    pub max_side_functions: usize,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            min_increase: 0.01,
            significance: 0.01,
            min_profiles: 10,
            max_listed: 50,
            max_side_functions: MAX_SIDE_FUNCTIONS,
        }
    }
}

impl CompareOptions {
    /// Checks the options' ranges, naming the one out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.min_increase > 0.0 && self.min_increase < 1.0) {
            return Err(format!(
                "min_increase {} must be above 0 and below 1 (a share: 0.01 is one percentage point)",
                self.min_increase
            ));
        }
        if !(self.significance > 0.0 && self.significance < 1.0) {
            return Err(format!(
                "significance {} must be above 0 and below 1",
                self.significance
            ));
        }
        if self.min_profiles < 2 {
            return Err(format!(
                "min_profiles {} must be at least 2",
                self.min_profiles
            ));
        }
        Ok(())
    }
}

/// One side of a comparison.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Side {
    /// Its profiles (a series at a time), those with a positive total.
    pub profiles: usize,
    /// The sum of their values.
    pub total: i64,
}

/// A function whose share rose.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Regression {
    /// The function, as a flame graph names it.
    pub function: String,
    /// Its share of the total as the leaf, before and after (0 to 1).
    pub self_before: f64,
    /// See `self_before`.
    pub self_after: f64,
    /// Its share anywhere in the stack, before and after.
    pub total_before: f64,
    /// See `total_before`.
    pub total_after: f64,
    /// The one-sided p-values of its self and total shares' rise (1 when not tested: the
    /// rise was under the threshold).
    pub p_self: f64,
    /// See `p_self`.
    pub p_total: f64,
    /// Which shares rose significantly: `self`, `total` or both.
    pub kind: &'static str,
}

impl Regression {
    /// The larger rise of its self and total shares.
    pub fn increase(&self) -> f64 {
        (self.self_after - self.self_before).max(self.total_after - self.total_before)
    }
}

/// What [`compare`] found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Comparison {
    /// The side compared with.
    pub before: Side,
    /// The side compared.
    pub after: Side,
    /// Functions seen on either side.
    pub functions: usize,
    /// Functions whose share rose by the threshold (those tested).
    pub tested: usize,
    /// The regressions, the largest rise first (at most `max_listed`).
    pub regressions: Vec<Regression>,
}

/// A comparison that could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompareError {
    /// A side has too few profiles for a test over profiles.
    #[error("the {side} side has {profiles} profiles; a comparison needs at least {min}")]
    TooFewProfiles {
        /// `before` or `after`.
        side: &'static str,
        /// Its profiles.
        profiles: usize,
        /// The options' `min_profiles`.
        min: usize,
    },
    /// The two sides are of different profile types.
    #[error("the sides are of different profile types: {0} and {1}")]
    Types(String, String),
    /// A side's distinct stacks name more functions in all than a comparison keeps.
    #[error(
        "the {side} side's distinct stacks name more than {limit} functions in all; it is not compared"
    )]
    TooLarge {
        /// `before` or `after`.
        side: &'static str,
        /// [`CompareOptions::max_side_functions`].
        limit: usize,
    },
}

/// Most function ids the distinct stacks of one side may name in all, each stack's
/// distinct functions counted (64 MiB of ids): a comparison keeps them for every distinct
/// stack of both sides. Stacks of thousands of distinct inlined functions, a few hundred
/// thousand of them, were gigabytes per pass, uncharged, in the background.
pub const MAX_SIDE_FUNCTIONS: usize = 1 << 24;

/// Function names interned across both sides.
#[derive(Default)]
struct Names {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

impl Names {
    fn id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), id);
        id
    }
}

/// One side, read for a comparison: per profile its total and stacks; per distinct stack
/// its leaf function and its distinct functions.
struct SideData<'a> {
    profiles: &'a Profiles,
    /// Per stack id: (leaf function, distinct functions).
    stacks: HashMap<u64, (u32, Vec<u32>)>,
    /// Per profile kept (positive total): its index in `profiles` and its total.
    totals: Vec<(usize, i64)>,
    /// Per function: (self sum, total sum) over all profiles kept.
    sums: HashMap<u32, (i64, i64)>,
    total: i64,
}

impl<'a> SideData<'a> {
    fn read(
        profiles: &'a Profiles,
        names: &mut Names,
        which: &'static str,
        most: usize,
    ) -> Result<Self, CompareError> {
        let mut kept = 0usize;
        let mut side = SideData {
            profiles,
            stacks: HashMap::new(),
            totals: Vec::new(),
            sums: HashMap::new(),
            total: 0,
        };
        for (i, p) in profiles.stacks.profiles.iter().enumerate() {
            let total = p.stacks.iter().fold(0i64, |t, (_, v)| t.saturating_add(*v));
            if total <= 0 {
                continue;
            }
            side.totals.push((i, total));
            side.total = side.total.saturating_add(total);
            for &(id, v) in &p.stacks {
                let (leaf, all) = match side.stacks.entry(id) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        let of = functions_of(&profiles.symbols, id, names);
                        kept = kept.saturating_add(of.1.len());
                        if kept > most {
                            return Err(CompareError::TooLarge {
                                side: which,
                                limit: most,
                            });
                        }
                        e.insert(of)
                    }
                };
                let sums = side.sums.entry(*leaf).or_default();
                sums.0 = sums.0.saturating_add(v);
                for f in all.iter() {
                    let sums = side.sums.entry(*f).or_default();
                    sums.1 = sums.1.saturating_add(v);
                }
            }
        }
        Ok(side)
    }

    /// The share of the side's total of function `f`: (self, total).
    fn share(&self, f: u32) -> (f64, f64) {
        let (s, t) = self.sums.get(&f).copied().unwrap_or_default();
        let total = self.total.max(1) as f64;
        (s as f64 / total, t as f64 / total)
    }

    /// Per tested function (by its position in `tested`), its shares in each profile where
    /// it is not zero: (self shares, total shares).
    fn profile_shares(&self, tested: &HashMap<u32, usize>) -> Vec<(Vec<f32>, Vec<f32>)> {
        let mut out = vec![(Vec::new(), Vec::new()); tested.len()];
        // Per stack, its tested functions: (position, is the leaf).
        let mut of_stack: HashMap<u64, Vec<(usize, bool)>> = HashMap::new();
        let mut sums: HashMap<usize, (i64, i64)> = HashMap::new();
        for &(i, total) in &self.totals {
            sums.clear();
            for &(id, v) in &self.profiles.stacks.profiles[i].stacks {
                let hits = of_stack.entry(id).or_insert_with(|| {
                    let (leaf, all) = &self.stacks[&id];
                    all.iter()
                        .filter_map(|f| tested.get(f).map(|&at| (at, f == leaf)))
                        .collect()
                });
                for &(at, leaf) in hits.iter() {
                    let s = sums.entry(at).or_default();
                    if leaf {
                        s.0 = s.0.saturating_add(v);
                    }
                    s.1 = s.1.saturating_add(v);
                }
            }
            for (&at, &(s, t)) in &sums {
                if s != 0 {
                    out[at].0.push((s as f64 / total as f64) as f32);
                }
                if t != 0 {
                    out[at].1.push((t as f64 / total as f64) as f32);
                }
            }
        }
        out
    }
}

/// The leaf function of `stack` and its distinct functions (inlined frames included), by
/// the names a flame graph shows.
/// A stack deeper than [`crate::report::MAX_STACK_DEPTH`] frames counts its first ones, as
/// the reports show it.
fn functions_of(symbols: &crate::Symbols, stack: u64, names: &mut Names) -> (u32, Vec<u32>) {
    let mut all = Vec::new();
    let mut frames = 0usize;
    symbols.for_each_frame(StackId(stack), |frame| {
        frames += 1;
        if frames <= crate::report::MAX_STACK_DEPTH {
            all.push(names.id(&frame.display_name()));
        }
    });
    let leaf = all
        .first()
        .copied()
        .unwrap_or_else(|| names.id("<unknown>"));
    all.sort_unstable();
    all.dedup();
    if all.is_empty() {
        all.push(leaf);
    }
    (leaf, all)
}

/// Compares `after` with `before` (two reads of [`crate::ProfileStore::profiles`] of one
/// profile type): the functions whose self or total share rose by `min_increase` or more,
/// significantly over the profiles (see the module's text).
pub fn compare(
    before: &Profiles,
    after: &Profiles,
    options: &CompareOptions,
) -> Result<Comparison, CompareError> {
    if before.profile_type != after.profile_type {
        return Err(CompareError::Types(
            before.profile_type.to_string(),
            after.profile_type.to_string(),
        ));
    }
    let mut names = Names::default();
    let most = options.max_side_functions;
    let b = SideData::read(before, &mut names, "before", most)?;
    let a = SideData::read(after, &mut names, "after", most)?;
    for (side, data) in [("before", &b), ("after", &a)] {
        if data.totals.len() < options.min_profiles {
            return Err(CompareError::TooFewProfiles {
                side,
                profiles: data.totals.len(),
                min: options.min_profiles,
            });
        }
    }
    let mut seen: Vec<u32> = b.sums.keys().chain(a.sums.keys()).copied().collect();
    seen.sort_unstable();
    seen.dedup();
    // Only a function whose share rose by the threshold can be a regression: only those
    // are tested, the others counting as tests that found nothing.
    let candidates: Vec<u32> = seen
        .iter()
        .copied()
        .filter(|&f| {
            let (sb, tb) = b.share(f);
            let (sa, ta) = a.share(f);
            sa - sb >= options.min_increase || ta - tb >= options.min_increase
        })
        .collect();
    let tested: HashMap<u32, usize> = candidates
        .iter()
        .enumerate()
        .map(|(i, &f)| (f, i))
        .collect();
    let shares_b = b.profile_shares(&tested);
    let shares_a = a.profile_shares(&tested);
    let (nb, na) = (b.totals.len(), a.totals.len());
    let mut p_values = Vec::with_capacity(candidates.len() * 2);
    for (i, &f) in candidates.iter().enumerate() {
        let (sb, tb) = b.share(f);
        let (sa, ta) = a.share(f);
        let p_self = if sa - sb >= options.min_increase {
            mann_whitney_greater(&shares_b[i].0, nb, &shares_a[i].0, na)
        } else {
            1.0
        };
        let p_total = if ta - tb >= options.min_increase {
            mann_whitney_greater(&shares_b[i].1, nb, &shares_a[i].1, na)
        } else {
            1.0
        };
        p_values.push(p_self);
        p_values.push(p_total);
    }
    let rejected = benjamini_hochberg(&p_values, seen.len() * 2, options.significance);
    let mut regressions: Vec<Regression> = candidates
        .iter()
        .enumerate()
        .filter_map(|(i, &f)| {
            let (self_rose, total_rose) = (rejected[2 * i], rejected[2 * i + 1]);
            if !self_rose && !total_rose {
                return None;
            }
            let (self_before, total_before) = b.share(f);
            let (self_after, total_after) = a.share(f);
            Some(Regression {
                function: names.names[f as usize].clone(),
                self_before,
                self_after,
                total_before,
                total_after,
                p_self: p_values[2 * i],
                p_total: p_values[2 * i + 1],
                kind: match (self_rose, total_rose) {
                    (true, true) => "self and total",
                    (true, false) => "self",
                    _ => "total",
                },
            })
        })
        .collect();
    regressions.sort_by(|x, y| {
        y.increase()
            .total_cmp(&x.increase())
            .then_with(|| x.function.cmp(&y.function))
    });
    regressions.truncate(options.max_listed);
    Ok(Comparison {
        before: Side {
            profiles: nb,
            total: b.total,
        },
        after: Side {
            profiles: na,
            total: a.total,
        },
        functions: seen.len(),
        tested: candidates.len(),
        regressions,
    })
}
