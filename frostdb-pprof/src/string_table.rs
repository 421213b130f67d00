//! A pprof string table built as strings are used: each string once, `""` at index 0 as
//! the format requires.

use std::collections::HashMap;

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

    /// The index of `s`, added if new.
    pub(crate) fn get(&mut self, s: &str) -> i64 {
        if let Some(i) = self.index.get(s) {
            return *i;
        }
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
