//! A memory budget a process keeps: one limit shared by everything that allocates in
//! proportion to what it is asked (decoding a request, a query's operators, a report),
//! each reserving what it is about to hold before it holds it, and by what the process
//! holds standing (tables' in-memory blocks), which its owner reports.
//!
//! Work that does not fit is refused ([`MemoryBudget::try_reserve`]), or waits for room
//! ([`MemoryBudget::reserve_within`]): never allocated first and found out later.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// The budget: cheap to clone, every clone the same budget.
#[derive(Clone)]
pub struct MemoryBudget(Arc<Inner>);

struct Inner {
    limit: usize,
    /// Bytes reserved by work in progress.
    reserved: AtomicUsize,
    /// Bytes held standing, as last reported ([`MemoryBudget::set_standing`]).
    standing: AtomicUsize,
    /// Waiters for room, woken when reservations end.
    room: (Mutex<()>, Condvar),
}

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("limit", &self.0.limit)
            .field("reserved", &self.reserved())
            .field("standing", &self.standing())
            .finish()
    }
}

/// A reservation that does not fit the budget: what was asked and what was left.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} needs {asked} bytes of memory and the server's budget (limits.memory, {limit} bytes) has {free} free now"
)]
pub struct OverBudget {
    /// What asked.
    pub what: String,
    /// Bytes asked.
    pub asked: usize,
    /// Bytes free when asked.
    pub free: usize,
    /// The budget.
    pub limit: usize,
    /// Bytes the asking reservation held already.
    pub held: usize,
}

impl OverBudget {
    /// Whether what asked needs more than the whole budget (with what its reservation held
    /// already): it never fits, however long it waits, as against fitting once other work
    /// has let go.
    pub fn never_fits(&self) -> bool {
        self.held.saturating_add(self.asked) > self.limit
    }
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self(Arc::new(Inner {
            limit,
            reserved: AtomicUsize::new(0),
            standing: AtomicUsize::new(0),
            room: (Mutex::new(()), Condvar::new()),
        }))
    }

    /// A budget that never refuses (it still counts).
    pub fn unlimited() -> Self {
        Self::new(usize::MAX)
    }

    /// The limit, bytes.
    pub fn limit(&self) -> usize {
        self.0.limit
    }

    /// Bytes reserved by work in progress.
    pub fn reserved(&self) -> usize {
        self.0.reserved.load(Ordering::Acquire)
    }

    /// Bytes held standing, as last reported.
    pub fn standing(&self) -> usize {
        self.0.standing.load(Ordering::Acquire)
    }

    /// Bytes free: the limit less what is reserved and standing.
    pub fn free(&self) -> usize {
        self.0
            .limit
            .saturating_sub(self.reserved().saturating_add(self.standing()))
    }

    /// Reports what the process holds standing now (replacing the last report).
    pub fn set_standing(&self, bytes: usize) {
        let before = self.0.standing.swap(bytes, Ordering::AcqRel);
        if bytes < before {
            self.wake();
        }
    }

    /// Reserves `bytes` for `what` if they fit now.
    pub fn try_reserve(&self, bytes: usize, what: &str) -> Result<Reservation, OverBudget> {
        let mut reservation = self.empty();
        reservation.try_grow(bytes, what)?;
        Ok(reservation)
    }

    /// Reserves `bytes` for `what`, waiting up to `wait` for room. A reservation larger
    /// than the whole budget is refused at once.
    pub fn reserve_within(
        &self,
        bytes: usize,
        what: &str,
        wait: Duration,
    ) -> Result<Reservation, OverBudget> {
        let deadline = Instant::now() + wait;
        let (lock, room) = &self.0.room;
        let mut guard = lock.lock();
        loop {
            match self.try_reserve(bytes, what) {
                Ok(r) => return Ok(r),
                Err(e) if bytes > self.0.limit || Instant::now() >= deadline => return Err(e),
                Err(_) => {
                    room.wait_until(&mut guard, deadline);
                }
            }
        }
    }

    /// A reservation of nothing yet, to grow.
    pub fn empty(&self) -> Reservation {
        Reservation {
            budget: self.clone(),
            bytes: 0,
        }
    }

    fn wake(&self) {
        let (lock, room) = &self.0.room;
        let _held = lock.lock();
        room.notify_all();
    }
}

/// Bytes held from a [`MemoryBudget`] until dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: MemoryBudget,
    bytes: usize,
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `more` bytes besides, for `what`, if they fit now.
    pub fn try_grow(&mut self, more: usize, what: &str) -> Result<(), OverBudget> {
        let inner = &self.budget.0;
        let standing = inner.standing.load(Ordering::Acquire);
        let mut reserved = inner.reserved.load(Ordering::Acquire);
        loop {
            let after = reserved.saturating_add(more).saturating_add(standing);
            if after > inner.limit {
                return Err(OverBudget {
                    what: what.to_owned(),
                    asked: more,
                    free: inner
                        .limit
                        .saturating_sub(reserved.saturating_add(standing)),
                    limit: inner.limit,
                    held: self.bytes,
                });
            }
            match inner.reserved.compare_exchange_weak(
                reserved,
                reserved + more,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.bytes += more;
                    return Ok(());
                }
                Err(now) => reserved = now,
            }
        }
    }

    /// Holds `more` bytes besides whether or not they fit (memory already held, counted so
    /// that other work sees it).
    pub fn grow(&mut self, more: usize) {
        self.budget.0.reserved.fetch_add(more, Ordering::AcqRel);
        self.bytes += more;
    }

    /// Gives back `less` bytes (at most what is held).
    pub fn shrink(&mut self, less: usize) {
        let less = less.min(self.bytes);
        if less == 0 {
            return;
        }
        self.budget.0.reserved.fetch_sub(less, Ordering::AcqRel);
        self.bytes -= less;
        self.budget.wake();
    }

    /// Holds exactly `bytes`, whether or not they fit (memory already held, as [`grow`]).
    ///
    /// [`grow`]: Reservation::grow
    pub fn resize(&mut self, bytes: usize) {
        if bytes > self.bytes {
            self.grow(bytes - self.bytes);
        } else {
            self.shrink(self.bytes - bytes);
        }
    }

    /// Holds exactly `bytes`: grows (if they fit) or shrinks to it.
    pub fn try_resize(&mut self, bytes: usize, what: &str) -> Result<(), OverBudget> {
        if bytes > self.bytes {
            self.try_grow(bytes - self.bytes, what)
        } else {
            self.shrink(self.bytes - bytes);
            Ok(())
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let bytes = self.bytes;
        self.shrink(bytes);
    }
}

/// The memory this process may use: the cgroup's limit when it has one (v2, then v1),
/// else the machine's memory.
pub fn available_memory() -> Option<usize> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let cgroup = read("/sys/fs/cgroup/memory.max")
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
        .and_then(|s| s.trim().parse::<u64>().ok())
        // "max", or v1's way of saying no limit (a page-rounded i64::MAX).
        .filter(|&b| b < (1 << 60));
    let machine = read("/proc/meminfo").and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    let bytes = match (cgroup, machine) {
        (Some(c), Some(m)) => c.min(m),
        (c, m) => c.or(m)?,
    };
    usize::try_from(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_count_until_dropped_and_refuse_past_the_limit() {
        let budget = MemoryBudget::new(100);
        let a = budget.try_reserve(60, "a").unwrap();
        let e = budget.try_reserve(50, "b").unwrap_err();
        assert_eq!((e.asked, e.free, e.limit), (50, 40, 100));
        assert!(!e.never_fits(), "50 bytes fit once the 60 are let go");
        let mut c = budget.try_reserve(30, "c").unwrap();
        let e = c.try_grow(80, "c").unwrap_err();
        assert!(e.never_fits(), "30 held and 80 more never fit 100");
        drop(c);
        assert!(e.to_string().contains("limits.memory"), "{e}");
        let mut b = budget.try_reserve(40, "b").unwrap();
        assert_eq!(budget.free(), 0);
        b.shrink(15);
        assert_eq!(budget.reserved(), 85);
        drop(a);
        assert_eq!(budget.reserved(), 25);
        b.try_resize(90, "b").unwrap();
        assert!(b.try_grow(11, "b").is_err());
        drop(b);
        assert_eq!(budget.reserved(), 0);
    }

    #[test]
    fn standing_memory_leaves_less_to_reserve() {
        let budget = MemoryBudget::new(100);
        budget.set_standing(70);
        assert!(budget.try_reserve(31, "x").is_err());
        let r = budget.try_reserve(30, "x").unwrap();
        budget.set_standing(0);
        assert_eq!(budget.free(), 70);
        drop(r);
    }

    #[test]
    fn a_waiter_gets_room_when_a_reservation_ends() {
        let budget = MemoryBudget::new(100);
        let held = budget.try_reserve(80, "held").unwrap();
        let waiter = {
            let budget = budget.clone();
            std::thread::spawn(move || {
                budget
                    .reserve_within(50, "waiter", Duration::from_secs(60))
                    .map(|r| r.bytes())
            })
        };
        drop(held);
        assert_eq!(waiter.join().unwrap(), Ok(50));
        // More than the whole budget never waits.
        assert!(
            budget
                .reserve_within(101, "huge", Duration::from_secs(60))
                .is_err()
        );
    }
}
