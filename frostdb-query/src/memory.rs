//! Query memory: one pool per store, shared by its SQL sessions (DataFusion's operators
//! reserve from it, and spill where they can) and its native profile merges, so a limit
//! holds for everything the store answers at once.

use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
    TrackConsumersPool, UnboundedMemoryPool,
};

/// A store's query memory pool: unbounded, or a limit whose refusals name it.
pub fn memory_pool(limit: Option<usize>) -> Arc<dyn MemoryPool> {
    match limit {
        None => Arc::new(UnboundedMemoryPool::default()),
        Some(limit) => Arc::new(Limited {
            inner: TrackConsumersPool::new(
                GreedyMemoryPool::new(limit),
                std::num::NonZeroUsize::new(3).expect("3 is not zero"),
            ),
            limit,
        }),
    }
}

/// A greedy pool of `limit` bytes whose "resources exhausted" errors say the limit and how
/// to raise it.
#[derive(Debug)]
struct Limited {
    inner: TrackConsumersPool<GreedyMemoryPool>,
    limit: usize,
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
        self.inner.grow(reservation, additional)
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink)
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        self.inner.try_grow(reservation, additional).map_err(|e| {
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
