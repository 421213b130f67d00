//! How a store is set up: [`StoreOptions`], and the options of the tables it makes.

use super::*;

/// How a [`ProfileStore`] stores and keeps profiles.
///
/// # Defaults
/// | option | default | meaning |
/// |---|---|---|
/// | `limits` | [`Limits::default`] | what a decoded profile may hold |
/// | `label_limits` | [`LabelLimits::default`] | labels per series (30), label name (1024 bytes) and value (2048 bytes) lengths |
/// | `max_series` | no limit | series the store may hold, counted across restarts |
/// | `max_label_names` | no limit | distinct label names (`labels.*` columns) the store may hold, counted across restarts |
/// | `symbols` | [`SymbolOptions::default`] | symbol partitions and their cache |
/// | `samples` | [`TableOptions::default`] with a level fanout of 8 | the samples table (block size, granules, ...) |
/// | `retention` | none | samples older than this are deleted, then the symbols only they used |
/// | `query_threads` | the machine's cores | threads a merge reads with |
/// | `rollups` | [`RollupOptions::default`] | hourly and daily rollups merges read |
/// | `block_merger` | none | where merges read persisted blocks: here, or spread over a cluster's workers |
/// | `group_wait` | 10 ms | longest a group commit waits for profiles still being decoded |
/// | `memory_budget` | none | a process-wide budget queries reserve from, besides `query_memory` |
/// | `query_spill` | [`frostdb_query::Spill::none`] | where SQL operators past `query_memory` may spill, and how much |
/// | `dedup_window` | 1 hour | how far behind the newest profile one pushed again is still recognised |
///
/// Set with the setters (`StoreOptions::default().retention(d).max_series(n)`): fields are
/// added as the store grows, which a struct literal outside this crate would not survive.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreOptions {
    /// Decoding limits.
    pub limits: Limits,
    /// Bounds on each series' labels; a profile over one is refused whole.
    pub label_limits: LabelLimits,
    /// Symbol partitions and cache.
    pub symbols: SymbolOptions,
    /// Options of the samples table when it is created.
    pub samples: TableOptions,
    /// How long samples are kept (`None`: forever).
    pub retention: Option<Duration>,
    /// Threads a merge reads with.
    pub query_threads: usize,
    /// Memory the store's queries may hold at once, merges and SQL together (`None`: no
    /// limit). Over it a SQL operator spills to `query_spill` where it can; otherwise the
    /// query fails with a "resources exhausted" error naming the limit.
    pub query_memory: Option<usize>,
    /// Where SQL operators past `query_memory` may spill (none by default: they fail).
    pub query_spill: frostdb_query::Spill,
    /// A process-wide memory budget (or a share of one) the store's queries also reserve
    /// from (`None`: only `query_memory` bounds them), and the debug files its attached
    /// symbolizer reads for it (`None`: the symbolizer's own budget).
    pub memory_budget: Option<frostdb_core::MemoryBudget>,
    /// Series the store may hold (profile name and every label, pprof sample labels
    /// included; [`crate::limits`]): those stored before it was opened count, read from
    /// the series keys when it opens; a profile that would add more is refused whole.
    /// Series whose samples have expired stop counting at the next open.
    pub max_series: usize,
    /// Distinct label names the store may hold: each is a `labels.*` column of the samples,
    /// series, totals and rollup tables, which every scan of a selector and every series
    /// listing projects, and every persisted block describes in its footer. Those stored
    /// before it was opened count (read from the samples table's columns); a profile or
    /// batch naming more is refused whole. A name of a profile refused for another reason
    /// after this check (its series over [`Self::max_series`]) stays counted.
    pub max_label_names: usize,
    /// Hourly and daily rollups ([`crate::rollup`]).
    pub rollups: RollupOptions,
    /// Where merges read persisted blocks (`None`: in this process). With a merger (the
    /// workers of a cluster reading the same bucket), what is in memory is read here and
    /// the blocks there; the sums are added, exactly.
    pub block_merger: Option<Arc<dyn frostdb_profile::native::BlockMerger>>,
    /// Longest a group commit's leader keeps the open group open, once the group before it
    /// is durable, for profiles already being decoded on other threads to join it (as
    /// PostgreSQL's `commit_delay` waits only while `commit_siblings` are active): each
    /// group costs a WAL record, an fsync and a part per table, whatever its size. It
    /// waits only while those on their way are more than a quarter of the group; with
    /// nothing on its way, a group commits at once.
    pub group_wait: Duration,
    /// How long a profile pushed again is recognised and stored once (see
    /// [`ProfileStore::ingest`]): profiles whose timestamps lie within this of the newest
    /// stored (or of now, if earlier). Their fingerprints are kept in memory, at most
    /// 262,144 of them (some 13 MiB), and read again when the store opens. Zero: profiles
    /// are not recognised, each push is stored.
    pub dedup_window: Duration,
}

/// The default options of the samples, spans and totals tables: the engine's, with a level
/// fanout of 8 instead of 4. At fleet rates compaction is a tenth of the ingest CPU, and
/// every sample row is rewritten once per level it passes; with 8 runs merged at a time a
/// block of four million rows passes three levels instead of four (the measurement is in
/// the README's benchmark notes). Queries of the block being written merge up to seven
/// runs a level, where they merged three.
pub(super) fn samples_table_options() -> TableOptions {
    TableOptions::default().level_fanout(8)
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            label_limits: LabelLimits::default(),
            symbols: SymbolOptions::default(),
            samples: samples_table_options(),
            retention: None,
            query_memory: None,
            query_spill: frostdb_query::Spill::none(),
            memory_budget: None,
            query_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            max_series: usize::MAX,
            max_label_names: usize::MAX,
            rollups: RollupOptions::default(),
            block_merger: None,
            group_wait: Duration::from_millis(10),
            dedup_window: Duration::from_secs(3600),
        }
    }
}

impl StoreOptions {
    /// Sets [`Self::limits`].
    pub fn limits(mut self, value: Limits) -> Self {
        self.limits = value;
        self
    }

    /// Sets [`Self::label_limits`].
    pub fn label_limits(mut self, value: LabelLimits) -> Self {
        self.label_limits = value;
        self
    }

    /// Sets [`Self::symbols`].
    pub fn symbols(mut self, value: SymbolOptions) -> Self {
        self.symbols = value;
        self
    }

    /// Sets [`Self::samples`].
    pub fn samples(mut self, value: TableOptions) -> Self {
        self.samples = value;
        self
    }

    /// Sets [`Self::retention`] (`None`: forever).
    pub fn retention(mut self, value: impl Into<Option<Duration>>) -> Self {
        self.retention = value.into();
        self
    }

    /// Sets [`Self::query_threads`].
    pub fn query_threads(mut self, value: usize) -> Self {
        self.query_threads = value;
        self
    }

    /// Sets [`Self::query_memory`] (`None`: no limit).
    pub fn query_memory(mut self, value: impl Into<Option<usize>>) -> Self {
        self.query_memory = value.into();
        self
    }

    /// Sets [`Self::query_spill`].
    pub fn query_spill(mut self, value: frostdb_query::Spill) -> Self {
        self.query_spill = value;
        self
    }

    /// Sets [`Self::memory_budget`].
    pub fn memory_budget(mut self, value: impl Into<Option<frostdb_core::MemoryBudget>>) -> Self {
        self.memory_budget = value.into();
        self
    }

    /// Sets [`Self::max_series`].
    pub fn max_series(mut self, value: usize) -> Self {
        self.max_series = value;
        self
    }

    /// Sets [`Self::max_label_names`].
    pub fn max_label_names(mut self, value: usize) -> Self {
        self.max_label_names = value;
        self
    }

    /// Sets [`Self::rollups`].
    pub fn rollups(mut self, value: RollupOptions) -> Self {
        self.rollups = value;
        self
    }

    /// Sets [`Self::block_merger`].
    pub fn block_merger(
        mut self,
        value: impl Into<Option<Arc<dyn frostdb_profile::native::BlockMerger>>>,
    ) -> Self {
        self.block_merger = value.into();
        self
    }

    /// Sets [`Self::group_wait`].
    pub fn group_wait(mut self, value: Duration) -> Self {
        self.group_wait = value;
        self
    }

    /// Sets [`Self::dedup_window`].
    pub fn dedup_window(mut self, value: Duration) -> Self {
        self.dedup_window = value;
        self
    }
}

/// Options of the symbol tables: smaller blocks than samples', so that symbols persist (and
/// leave memory) steadily.
pub(super) fn symbol_table_options() -> TableOptions {
    TableOptions::default().block_size(32 << 20)
}
