//! The LSM index of a table: L0 parts, sorted runs of granules in deeper levels, and the
//! compaction that moves data down.

pub(crate) mod chunk;
pub(crate) mod compaction;
pub(crate) mod merge;
pub(crate) mod version;
