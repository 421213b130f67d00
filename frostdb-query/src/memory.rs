//! Query memory: one pool per store, shared by its SQL sessions (DataFusion's operators
//! reserve from it, and spill where they can) and its native profile merges, so a limit
//! holds for everything the store answers at once. A pool may also draw on a process-wide
//! [`MemoryBudget`], so that what every store's queries hold counts against one limit.

use std::path::Path;
use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::disk_manager::{DiskManager, DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
    TrackConsumersPool, UnboundedMemoryPool,
};
use frostdb_core::{MemoryBudget, Reservation};

/// A store's query memory pool: unbounded, or a limit whose refusals name it.
pub fn memory_pool(limit: Option<usize>) -> Arc<dyn MemoryPool> {
    budgeted_memory_pool(limit, None)
}

/// [`memory_pool`] whose reservations are also reserved from `budget` (when given): a
/// query is refused when either its store's limit or the process's budget is reached.
pub fn budgeted_memory_pool(
    limit: Option<usize>,
    budget: Option<&MemoryBudget>,
) -> Arc<dyn MemoryPool> {
    match (limit, budget) {
        (None, None) => Arc::new(UnboundedMemoryPool::default()),
        (limit, budget) => {
            let limit = limit.unwrap_or(usize::MAX);
            Arc::new(Limited {
                inner: TrackConsumersPool::new(
                    GreedyMemoryPool::new(limit),
                    std::num::NonZeroUsize::new(3).expect("3 is not zero"),
                ),
                limit,
                budget: budget.map(|b| parking_lot::Mutex::new(b.empty())),
            })
        }
    }
}

/// A greedy pool of `limit` bytes whose "resources exhausted" errors say the limit and how
/// to raise it, drawing on a process budget when it has one.
#[derive(Debug)]
struct Limited {
    inner: TrackConsumersPool<GreedyMemoryPool>,
    limit: usize,
    /// What this pool holds of the process's budget.
    budget: Option<parking_lot::Mutex<Reservation>>,
}

impl std::fmt::Display for Limited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "query memory limit of {} bytes", self.limit)
    }
}

impl MemoryPool for Limited {
    fn name(&self) -> &str {
        "frostdb query memory limit"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.inner.register(consumer)
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.inner.unregister(consumer)
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        if let Some(budget) = &self.budget {
            budget.lock().grow(additional);
        }
        self.inner.grow(reservation, additional)
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        if let Some(budget) = &self.budget {
            budget.lock().shrink(shrink);
        }
        self.inner.shrink(reservation, shrink)
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        if let Some(budget) = &self.budget {
            budget
                .lock()
                .try_grow(additional, "a query")
                // The server's budget, not the query: unavailable for now (503, retry),
                // where the query's own limit is a limit it exceeds (413).
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
        }
        self.inner.try_grow(reservation, additional).map_err(|e| {
            if let Some(budget) = &self.budget {
                budget.lock().shrink(additional);
            }
            DataFusionError::ResourcesExhausted(format!(
                "the query memory limit of {} bytes ({:.1} MiB) is reached: {}",
                self.limit,
                self.limit as f64 / (1 << 20) as f64,
                e.find_root()
            ))
        })
    }

    fn reserved(&self) -> usize {
        self.inner.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
}

/// Where a session's operators may write what does not fit in memory (a sort or join past
/// its pool's limit): nowhere, or files in one directory, at most a bound. Each session
/// has a disk manager of its own, with its share of the bound ([`Spill::shared_by`]): one
/// manager for all let one tenant's spilling queries take the whole bound, failing every
/// other tenant's spill meanwhile.
///
/// Without it, DataFusion spills to the OS temporary directory, up to 100 GB a session:
/// outside every limit the store keeps, and on a tmpfs `/tmp` that is memory.
#[derive(Debug, Clone, Default)]
pub struct Spill(Option<Arc<SpillDir>>);

#[derive(Debug)]
struct SpillDir {
    dir: std::path::PathBuf,
    /// All sessions' spills together.
    max_bytes: u64,
    /// What one session may spill.
    session_bytes: u64,
    /// The sessions' managers, while they live (for [`Spill::used_bytes`]).
    managers: parking_lot::Mutex<Vec<std::sync::Weak<DiskManager>>>,
}

impl Spill {
    /// No spilling: an operator past its pool's limit fails, naming the limit.
    pub fn none() -> Self {
        Self(None)
    }

    /// Spill files in `dir` (created if missing), at most `max_bytes` of them at once; an
    /// operator whose spill would pass it fails, naming the bound. `dir` must be this
    /// process's own: what earlier processes left there (`datafusion-*` directories, a
    /// process killed mid-spill) is deleted now. A bound of 0 is [`Spill::none`]. One
    /// session may spill all of it; see [`Spill::shared_by`].
    pub fn to(dir: &Path, max_bytes: u64) -> std::io::Result<Self> {
        if max_bytes == 0 {
            return Ok(Self::none());
        }
        std::fs::create_dir_all(dir)?;
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with("datafusion-")
            {
                std::fs::remove_dir_all(entry.path())?;
            }
        }
        Ok(Self(Some(Arc::new(SpillDir {
            dir: dir.to_path_buf(),
            max_bytes,
            session_bytes: max_bytes,
            managers: parking_lot::Mutex::default(),
        }))))
    }

    /// The same directory and bound, each session spilling at most its `sessions`-th
    /// part: with at most `sessions` queries running at once (the server's query slots),
    /// all together stay within the bound, and no query's spill takes another's room.
    pub fn shared_by(self, sessions: usize) -> Self {
        match self.0 {
            None => self,
            Some(dir) => Self(Some(Arc::new(SpillDir {
                dir: dir.dir.clone(),
                max_bytes: dir.max_bytes,
                session_bytes: (dir.max_bytes / sessions.max(1) as u64).max(1),
                managers: parking_lot::Mutex::default(),
            }))),
        }
    }

    /// What one session may spill (0: no spilling).
    pub fn session_bytes(&self) -> u64 {
        self.0.as_ref().map_or(0, |d| d.session_bytes)
    }

    /// Bytes spilled now, by every session of this `Spill`.
    pub fn used_bytes(&self) -> u64 {
        let Some(dir) = &self.0 else { return 0 };
        let mut managers = dir.managers.lock();
        managers.retain(|m| m.strong_count() > 0);
        managers
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .map(|m| m.used_disk_space())
            .sum()
    }

    /// A disk manager for one session: its share of the bound, in the directory.
    pub(crate) fn manager(&self) -> Result<Arc<DiskManager>> {
        let Some(dir) = &self.0 else {
            return Ok(Arc::new(
                DiskManagerBuilder::default()
                    .with_mode(DiskManagerMode::Disabled)
                    .build()?,
            ));
        };
        let manager = Arc::new(
            DiskManagerBuilder::default()
                .with_mode(DiskManagerMode::Directories(vec![dir.dir.clone()]))
                .with_max_temp_directory_size(dir.session_bytes)
                .build()?,
        );
        let mut managers = dir.managers.lock();
        managers.retain(|m| m.strong_count() > 0);
        managers.push(Arc::downgrade(&manager));
        Ok(manager)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use frostdb_core::ErrorKind;

    /// The query's own limit is a limit it exceeds (413); the server's budget spent by
    /// others is a refusal for now (503, retry); more than the server's whole budget is a
    /// limit again (413: no retry fits it).
    #[test]
    fn a_query_over_its_limit_and_one_over_the_servers_budget_are_told_apart() {
        let budget = MemoryBudget::new(4 << 20);
        let others = budget.try_reserve(3 << 20, "others").unwrap();
        let pool = budgeted_memory_pool(Some(64 << 20), Some(&budget));
        let reservation = MemoryConsumer::new("test").register(&pool);
        let e = reservation.try_grow(2 << 20).unwrap_err();
        assert_eq!(crate::datafusion_kind(&e), ErrorKind::Unavailable, "{e}");
        assert!(e.to_string().contains("limits.memory"), "{e}");
        assert_eq!(
            budget.reserved(),
            3 << 20,
            "nothing kept of a refused reservation"
        );
        drop(others);
        let e = reservation.try_grow(5 << 20).unwrap_err();
        assert_eq!(crate::datafusion_kind(&e), ErrorKind::LimitExceeded, "{e}");
        assert!(e.to_string().contains("limits.memory"), "{e}");

        let budget = MemoryBudget::new(64 << 20);
        let pool = budgeted_memory_pool(Some(1 << 20), Some(&budget));
        let reservation = MemoryConsumer::new("test").register(&pool);
        let e = reservation.try_grow(2 << 20).unwrap_err();
        assert_eq!(crate::datafusion_kind(&e), ErrorKind::LimitExceeded, "{e}");
        assert_eq!(budget.reserved(), 0, "the budget's share given back");
    }
}
