//! A pprof string table built as strings are used: each string once, `""` at index 0 as
//! the format requires.

use std::collections::HashMap;

use crate::error::Result;

/// What a string's entries take besides its bytes: two `String`s, a map slot and an index.
const STRING_SLOTS: usize = 80;

pub(crate) struct StringTable {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl StringTable {
    pub(crate) fn new() -> Self {
        Self {
            table: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }

    /// The index of `s`, added if new: a new string's two copies and their slots are
    /// charged first ([`take`](crate::decode::charge::take)), since a converter may copy
    /// one string its body names once into every profile it makes.
    pub(crate) fn get(&mut self, s: &str) -> Result<i64> {
        if let Some(&i) = self.index.get(s) {
            return Ok(i);
        }
        crate::decode::charge::take(
            s.len().saturating_mul(2).saturating_add(STRING_SLOTS),
            "copying a profile's strings",
        )?;
        Ok(self.add(s))
    }

    /// The index of `s`, added if new, charged to nothing: for a profile the server writes
    /// (a query's answer, bounded where it is merged), not one it reads.
    pub(crate) fn uncharged(&mut self, s: &str) -> i64 {
        match self.index.get(s) {
            Some(&i) => i,
            None => self.add(s),
        }
    }

    fn add(&mut self, s: &str) -> i64 {
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }

    /// The table, for `Profile::string_table`.
    pub(crate) fn into_table(self) -> Vec<String> {
        self.table
    }
}
