//! Symbol ids: how a sample names its stack, and a stack its locations, functions and
//! mappings. Symbols are stored in partitions, each holding its stacks, locations,
//! functions and mappings once, indexed densely from 0; a symbol's id is its partition in
//! the high 32 bits and its index in the low 32. Merges sum values into a dense array per
//! partition by it, with no key hashed.

/// The id of a symbol: its partition in the high 32 bits, its index in the low 32.
pub fn symbol_id(partition: u32, index: u32) -> u64 {
    (u64::from(partition) << 32) | u64::from(index)
}

/// The partition and index of a symbol id.
pub fn split_id(id: u64) -> (u32, u32) {
    ((id >> 32) as u32, id as u32)
}

/// A stored stack: `partition << 32 | index` (see [`symbol_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub u64);

impl StackId {
    /// The stack's partition.
    pub fn partition(self) -> u32 {
        split_id(self.0).0
    }

    /// Its index in the partition.
    pub fn index(self) -> u32 {
        split_id(self.0).1
    }
}
