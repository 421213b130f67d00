//! What a regular expression costs to run, known before it runs. The `regex` crate is
//! never exponential, but its bound is the pattern's automaton times the bytes searched:
//! `[ -~]{50000}` compiles to 50,000 states, a lazy DFA of it thrashes and the search falls
//! back to a PikeVM stepping every state at every byte, 13 s for one 50 KB string (a day
//! for a batch of them), inside one call no deadline reaches. So a pattern is costed once
//! ([`cost`]): its automaton's states, and whether a DFA of it fits in
//! [`MAX_LINEAR_DFA_BYTES`], which makes its search a step per byte. Functions multiply
//! the bytes they search by it and refuse past their step bound (`functions.rs`);
//! operators, which no step bound reaches, must be linear (`sql_shape.rs`); a profile
//! selector's regex bounds the steps of matching one label value (frostdb-profile).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use regex_automata::dfa::dense;
use regex_automata::nfa::thompson;

/// Largest automaton (Thompson NFA) a pattern may compile to, in bytes: the `regex` crate
/// allows 10 MiB, a second's compiling for each batch.
pub(crate) const MAX_PATTERN_NFA_BYTES: usize = 1 << 20;

/// Largest DFA a pattern may determinise into and count as linear: well inside the lazy
/// DFA's cache (2 MiB), so its search never falls back to stepping every state.
pub(crate) const MAX_LINEAR_DFA_BYTES: usize = 1 << 20;

/// A function of regular expressions: the argument it compiles as a pattern, the one it
/// takes flags from, and whether it finds the spans of capture groups (which steps every
/// state of the pattern over a match, even where a DFA found the match).
#[derive(Debug)]
pub(crate) struct RegexFn {
    pub(crate) name: &'static str,
    pub(crate) pattern: usize,
    pub(crate) flags: usize,
    pub(crate) captures: bool,
}

/// `regexp_replace` counts as finding groups (a replacement may reference them), as does
/// `regexp_instr` (its sub-expression argument).
pub(crate) const REGEX_FUNCTIONS: [RegexFn; 5] = [
    RegexFn {
        name: "regexp_like",
        pattern: 1,
        flags: 2,
        captures: false,
    },
    RegexFn {
        name: "regexp_count",
        pattern: 1,
        flags: 3,
        captures: false,
    },
    RegexFn {
        name: "regexp_match",
        pattern: 1,
        flags: 2,
        captures: true,
    },
    RegexFn {
        name: "regexp_replace",
        pattern: 1,
        flags: 3,
        captures: true,
    },
    RegexFn {
        name: "regexp_instr",
        pattern: 1,
        flags: 4,
        captures: true,
    },
];

/// The function of regular expressions called `name`.
pub(crate) fn regex_fn(name: &str) -> Option<&'static RegexFn> {
    REGEX_FUNCTIONS.iter().find(|f| f.name == name)
}

/// What a compiled pattern costs a byte searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// States of its automaton: the most a search steps through at a byte.
    pub states: usize,
    /// Whether a DFA of it fits in the bytes it was probed with ([`MAX_LINEAR_DFA_BYTES`]
    /// for [`cost`]): a search is then a step a byte.
    pub linear: bool,
    /// That DFA's bytes (0 when it does not fit): a matcher whose lazy DFA's cache is
    /// smaller than this may fall back to stepping every state.
    pub dfa_bytes: usize,
    /// The most bytes a match can span (`None` when unbounded): a search anchored at both
    /// ends stops there, whatever the text's length.
    pub max_len: Option<usize>,
}

impl Cost {
    /// Whether a matcher whose lazy DFA grows a cache of `cache_bytes` searches it a step
    /// a byte: its DFA fits in half the cache, so the cache is never cleared and refilled
    /// often enough for the search to fall back to stepping every state.
    pub fn linear_in(&self, cache_bytes: usize) -> bool {
        self.linear && self.dfa_bytes <= cache_bytes / 2
    }

    /// Steps a byte searched takes at most: one for a linear pattern (unless groups'
    /// spans are found), else a step of every state.
    pub(crate) fn per_byte(&self, captures: bool) -> f64 {
        if self.linear && !captures {
            1.0
        } else {
            self.states as f64
        }
    }
}

/// The pattern as the functions compile it: `(?flags)pattern`, without the global flag
/// (`regexp_replace` takes it as "every match").
pub(crate) fn with_flags(pattern: &str, flags: Option<&str>) -> String {
    let flags: String = flags.unwrap_or("").chars().filter(|&c| c != 'g').collect();
    if flags.is_empty() {
        pattern.to_owned()
    } else {
        format!("(?{flags}){pattern}")
    }
}

/// A `LIKE` pattern as an anchored regular expression (`%` any run, `_` one character,
/// `escape` escaping what follows; `\` when none is given, as DataFusion and Arrow take
/// it), matching what Arrow's kernel matches; `None` for a pattern ending in its escape.
pub(crate) fn like_regex(pattern: &str, case_insensitive: bool, escape: char) -> Option<String> {
    let mut out = String::from(if case_insensitive { "(?is)^" } else { "(?s)^" });
    let mut chars = pattern.chars();
    let mut buf = [0u8; 4];
    while let Some(c) = chars.next() {
        match c {
            c if c == escape => out.push_str(&regex::escape(chars.next()?.encode_utf8(&mut buf))),
            '%' => out.push_str(".*"),
            '_' => out.push('.'),
            c => out.push_str(&regex::escape(c.encode_utf8(&mut buf))),
        }
    }
    out.push('$');
    Some(out)
}

/// Patterns costed, kept for the next batch and query (a DFA of a large class takes
/// milliseconds to build); forgotten all at once past this many.
const REMEMBERED: usize = 256;

/// What [`cost`] answers: the cost, `None` for a pattern that does not parse, or why it
/// is refused.
type Costed = Result<Option<Cost>, String>;

static COSTS: LazyLock<Mutex<HashMap<String, Costed>>> = LazyLock::new(Default::default);

/// What `pattern` (flags included, [`with_flags`]) costs a byte searched: `None` when it
/// does not parse (the function compiling it reports that), an error naming the limit
/// when its automaton is over [`MAX_PATTERN_NFA_BYTES`].
pub(crate) fn cost(pattern: &str) -> Costed {
    if let Some(known) = COSTS.lock().ok().and_then(|c| c.get(pattern).cloned()) {
        return known;
    }
    let cost = probe(pattern, MAX_LINEAR_DFA_BYTES);
    if let Ok(mut costs) = COSTS.lock() {
        if costs.len() >= REMEMBERED {
            costs.clear();
        }
        costs.insert(pattern.to_owned(), cost.clone());
    }
    cost
}

/// What `pattern` costs, uncached, counted linear only when its DFA fits in `dfa_bytes`
/// (determinising takes time in proportion: about 20 ms for 128 KiB, 120 ms for 1 MiB).
/// Errors as [`cost`].
pub fn probe(pattern: &str, dfa_bytes: usize) -> Result<Option<Cost>, String> {
    let Ok(hir) = regex_automata::util::syntax::parse(pattern) else {
        return Ok(None);
    };
    let nfa = match thompson::Compiler::new()
        .configure(thompson::Config::new().nfa_size_limit(Some(MAX_PATTERN_NFA_BYTES)))
        .build_from_hir(&hir)
    {
        Ok(nfa) => nfa,
        Err(e) if e.size_limit().is_some() => {
            return Err(format!(
                "the regular expression `{}` compiles to an automaton over the \
                 {MAX_PATTERN_NFA_BYTES} bytes a pattern may take (each copy a counted \
                 repetition `{{n}}` makes, each `_` of a LIKE, adds to it); make it smaller",
                cut(pattern)
            ));
        }
        Err(_) => return Ok(None),
    };
    let dfa = dense::Builder::new()
        .configure(
            dense::Config::new()
                .dfa_size_limit(Some(dfa_bytes))
                .determinize_size_limit(Some(dfa_bytes)),
        )
        .build_from_nfa(&nfa)
        .ok();
    Ok(Some(Cost {
        states: nfa.states().len(),
        linear: dfa.is_some(),
        dfa_bytes: dfa.map_or(0, |d| d.memory_usage()),
        max_len: hir.properties().maximum_len(),
    }))
}

/// The start of `pattern`, for an error: at most 80 bytes, cut at a character.
pub fn cut(pattern: &str) -> &str {
    let mut end = pattern.len().min(80);
    while !pattern.is_char_boundary(end) {
        end -= 1;
    }
    &pattern[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Patterns of every day are linear; a counted repetition of a class is not, and one
    /// whose automaton is too large is refused naming the limit.
    #[test]
    fn patterns_are_costed_by_their_automaton() {
        for linear in [
            "^runtime\\.",
            "-[0-9a-z]+-[0-9a-z]+$",
            "(?i)malloc|free",
            "\\w+",
            "\\(.*\\)",
        ] {
            let cost = cost(linear).unwrap().unwrap();
            assert!(cost.linear, "{linear}: {cost:?}");
            assert_eq!(cost.per_byte(false), 1.0, "{linear}");
            assert!(
                cost.per_byte(true) >= 2.0,
                "{linear}: groups step every state"
            );
        }
        let wide = cost("[ -~]{5000}").unwrap().unwrap();
        assert!(!wide.linear && wide.states > 5000, "{wide:?}");
        assert_eq!(wide.per_byte(false), wide.states as f64);
        let e = cost("[ -~]{50000}{20}").unwrap_err();
        assert!(e.contains("over the 1048576 bytes"), "{e}");
        assert_eq!(cost("(unclosed").unwrap(), None);
    }

    /// LIKE patterns become anchored expressions: `%` and `_` as wildcards, the rest
    /// literal, the escape escaping them; one ending in its escape is not converted.
    #[test]
    fn like_patterns_become_anchored_expressions() {
        assert_eq!(like_regex("pod-%", false, '\\').unwrap(), "(?s)^pod\\-.*$");
        assert_eq!(like_regex("%a_b%", true, '\\').unwrap(), "(?is)^.*a.b.*$");
        assert_eq!(like_regex("100\\%", false, '\\').unwrap(), "(?s)^100%$");
        assert_eq!(like_regex("a!_", false, '!').unwrap(), "(?s)^a_$");
        assert_eq!(like_regex("a\\", false, '\\'), None);
        let re = regex::Regex::new(&like_regex("%x_y%", false, '\\').unwrap()).unwrap();
        assert!(re.is_match("..x\ny..") && !re.is_match("xy"));
    }
}
