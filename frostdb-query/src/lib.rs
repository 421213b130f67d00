//! DataFusion planning over frostdb-rs tables.
//!
//! What comes here: a `TableProvider` for a frostdb table (projection, filter and limit
//! pushdown, statistics from granules and block manifests, partitioned streaming scans), a
//! `SessionContext` helper that registers every table of a `Db`, a Prometheus-style label
//! selector parser, and the profile queries (merge, range, label names and values, profile
//! types, profile timestamps) as DataFusion plans.
//!
//! Until then the crate only pins the DataFusion version the workspace builds with.
