//! A memory budget a process keeps: one limit shared by everything that allocates in
//! proportion to what it is asked (decoding a request, a query's operators, a report),
//! each reserving what it is about to hold before it holds it, and by what the process
//! holds standing (tables' in-memory blocks), which its owner reports.
//!
//! Work that does not fit is refused ([`MemoryBudget::try_reserve`]), or waits for room
//! ([`MemoryBudget::reserve_within`]): never allocated first and found out later.
//!
//! A budget can be shared out ([`MemoryBudget::share`]): a share (one tenant's, say) is a
//! budget of its own limit whose reservations are the whole budget's too, so that one
//! party holding all it may still leaves room in the whole for the others.

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
    /// Waiters for room, woken when reservations end: one for a budget and its shares, as
    /// room in either may be what a waiter waits for.
    room: Arc<(Mutex<()>, Condvar)>,
    /// A share: whose it is, and the budget it is a share of.
    share: Option<(String, MemoryBudget)>,
    /// The shares in use, by name (a share lives while anything holds it).
    shares: Mutex<Shares>,
}

/// A budget's shares, by name, and when to forget those let go of.
#[derive(Default)]
struct Shares {
    by_name: std::collections::HashMap<String, std::sync::Weak<Inner>>,
    /// Names held when those let go of are next forgotten: twice as many as were held after
    /// the last time, so that each new name costs a constant amortised however many are
    /// in use (checked at every power of two, 127 held shares made every new name scan
    /// them all).
    prune_at: usize,
    /// Times they were forgotten (for tests).
    #[cfg(test)]
    prunes: usize,
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
    "{what} needs {asked} bytes of memory and {} has {free} free now",
    match share {
        Some(whose) => format!("{whose} share of the server's memory budget ({limit} bytes)"),
        None => format!("the server's budget (limits.memory, {limit} bytes)"),
    }
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
    /// Whose share refused it ([`MemoryBudget::share`]); `None`: the whole budget did.
    pub share: Option<String>,
}

impl OverBudget {
    /// Whether what asked needs more than the whole budget, or the whole share, that refused
    /// it (with what its reservation held already): it never fits, however long it waits,
    /// as against fitting once other work has let go.
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
            room: Arc::new((Mutex::new(()), Condvar::new())),
            share: None,
            shares: Mutex::default(),
        }))
    }

    /// The share of this budget named `name` (a tenant's id): a budget of at most `limit`
    /// bytes (and never more than this one's), every reservation from it a reservation
    /// from this budget too. Asked again while the share is in use (anything holds it),
    /// the same share. A refusal of the share names it as `whose` says (`tenant "a"'s`).
    pub fn share(&self, name: &str, whose: impl FnOnce() -> String, limit: usize) -> MemoryBudget {
        let mut shares = self.0.shares.lock();
        if let Some(share) = shares.by_name.get(name).and_then(std::sync::Weak::upgrade) {
            return Self(share);
        }
        // Shares let go of are forgotten, lest names never used again pile up.
        if shares.by_name.len() >= shares.prune_at {
            shares.by_name.retain(|_, share| share.strong_count() > 0);
            shares.prune_at = (shares.by_name.len() * 2).max(64);
            #[cfg(test)]
            {
                shares.prunes += 1;
            }
        }
        let share = Self(Arc::new(Inner {
            limit: limit.min(self.0.limit),
            reserved: AtomicUsize::new(0),
            standing: AtomicUsize::new(0),
            room: self.0.room.clone(),
            share: Some((whose(), self.clone())),
            shares: Mutex::default(),
        }));
        shares
            .by_name
            .insert(name.to_owned(), Arc::downgrade(&share.0));
        share
    }

    /// The shares in use, by name, with the bytes each holds now.
    pub fn shares(&self) -> Vec<(String, usize)> {
        let mut shares: Vec<(String, usize)> = self
            .0
            .shares
            .lock()
            .by_name
            .iter()
            .filter_map(|(name, share)| {
                let share = share.upgrade()?;
                Some((name.clone(), share.reserved.load(Ordering::Acquire)))
            })
            .collect();
        shares.sort_unstable();
        shares
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
        let (lock, room) = &*self.0.room;
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
        let (lock, room) = &*self.0.room;
        let _held = lock.lock();
        room.notify_all();
    }

    /// Takes `more` bytes from this budget and those it is a share of, or none of them:
    /// the refusal, of the first that has no room (`held`: what the asking reservation
    /// holds already).
    fn take(&self, more: usize, what: &str, held: usize) -> Result<(), OverBudget> {
        let inner = &self.0;
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
                    held,
                    share: inner.share.as_ref().map(|(whose, _)| whose.clone()),
                });
            }
            match inner.reserved.compare_exchange_weak(
                reserved,
                reserved + more,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => reserved = now,
            }
        }
        if let Some((_, whole)) = &inner.share
            && let Err(e) = whole.take(more, what, held)
        {
            inner.reserved.fetch_sub(more, Ordering::AcqRel);
            return Err(e);
        }
        Ok(())
    }

    /// Counts `more` bytes held here and in the budgets this is a share of.
    fn add(&self, more: usize) {
        self.0.reserved.fetch_add(more, Ordering::AcqRel);
        if let Some((_, whole)) = &self.0.share {
            whole.add(more);
        }
    }

    /// Gives back `less` bytes here and in the budgets this is a share of.
    fn sub(&self, less: usize) {
        self.0.reserved.fetch_sub(less, Ordering::AcqRel);
        if let Some((_, whole)) = &self.0.share {
            whole.sub(less);
        }
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
        self.budget.take(more, what, self.bytes)?;
        self.bytes += more;
        Ok(())
    }

    /// Holds `more` bytes besides whether or not they fit (memory already held, counted so
    /// that other work sees it).
    pub fn grow(&mut self, more: usize) {
        self.budget.add(more);
        self.bytes += more;
    }

    /// Gives back `less` bytes (at most what is held).
    pub fn shrink(&mut self, less: usize) {
        let less = less.min(self.bytes);
        if less == 0 {
            return;
        }
        self.budget.sub(less);
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
    fn a_share_refuses_past_its_limit_and_counts_in_the_whole() {
        let budget = MemoryBudget::new(100);
        let a = budget.share("a", || "tenant \"a\"'s".into(), 75);
        let mut held = a.try_reserve(70, "a body").unwrap();
        assert_eq!((a.reserved(), budget.reserved()), (70, 70));
        // The share is full; the whole still has room for the others.
        let e = held.try_grow(10, "a body").unwrap_err();
        assert_eq!(e.share.as_deref(), Some("tenant \"a\"'s"));
        assert_eq!((e.free, e.limit), (5, 75));
        assert!(
            e.never_fits(),
            "70 held and 10 more never fit a share of 75"
        );
        assert!(e.to_string().contains("tenant \"a\"'s share"), "{e}");
        assert!(a.try_reserve(10, "another").is_err_and(|e| !e.never_fits()));
        let b = budget.share("b", || "tenant \"b\"'s".into(), 75);
        let other = b.try_reserve(30, "b body").unwrap();
        // The whole refuses what the share has room for: nothing of it is held.
        let e = a.try_reserve(1, "a more").unwrap_err();
        assert_eq!(e.share, None, "refused by the whole budget: {e}");
        assert_eq!((a.reserved(), budget.reserved()), (70, 100));
        // Asked again while held, the same share.
        assert_eq!(budget.share("a", String::new, 75).reserved(), 70);
        assert_eq!(budget.shares(), [("a".into(), 70), ("b".into(), 30)]);
        held.shrink(20);
        drop(other);
        assert_eq!((a.reserved(), b.reserved(), budget.reserved()), (50, 0, 50));
        let mut grown = a.empty();
        grown.grow(40);
        assert_eq!((a.reserved(), budget.reserved()), (90, 90));
        drop((held, grown));
        assert_eq!((a.reserved(), budget.reserved()), (0, 0));
        // A share is never larger than the whole.
        assert_eq!(budget.share("big", String::new, 1 << 40).limit(), 100);
    }

    #[test]
    fn shares_let_go_are_forgotten() {
        let budget = MemoryBudget::new(100);
        for i in 0..10_000 {
            let share = budget.share(&format!("caller {i}"), String::new, 10);
            drop(share.try_reserve(5, "x").unwrap());
        }
        assert!(
            budget.0.shares.lock().by_name.len() <= 64,
            "names never used again piled up"
        );
        // Many held: forgetting is tried again only once as many more have come, not for
        // every new name (127 held made each new one scan them all).
        let held: Vec<MemoryBudget> = (0..127)
            .map(|i| budget.share(&format!("held {i}"), String::new, 10))
            .collect();
        let before = budget.0.shares.lock().prunes;
        for i in 0..1_000 {
            drop(budget.share(&format!("passing {i}"), String::new, 10));
        }
        let prunes = budget.0.shares.lock().prunes - before;
        assert!(
            prunes <= 1_000 / held.len() + 1,
            "{prunes} scans for 1,000 names"
        );
        drop(held);
        let kept = budget.share("kept", String::new, 10);
        let _held = kept.try_reserve(5, "x").unwrap();
        for i in 0..1_000 {
            drop(budget.share(&format!("other {i}"), String::new, 10));
        }
        assert_eq!(
            budget.share("kept", String::new, 10).reserved(),
            5,
            "a share in use is kept"
        );
        assert_eq!(budget.shares(), [("kept".into(), 5)]);
    }

    #[test]
    fn a_waiter_on_a_share_gets_room_when_another_share_lets_go() {
        let budget = MemoryBudget::new(100);
        let held = budget
            .share("b", String::new, 90)
            .try_reserve(80, "held")
            .unwrap();
        // Long enough that a waiter left to its deadline is told apart from one woken.
        let wait = Duration::from_secs(120);
        let waiter = {
            let a = budget.share("a", String::new, 90);
            std::thread::spawn(move || {
                let started = Instant::now();
                let got = a.reserve_within(50, "waiter", wait).map(|r| r.bytes());
                (got, started.elapsed())
            })
        };
        drop(held);
        let (got, waited) = waiter.join().unwrap();
        assert_eq!(got, Ok(50));
        assert!(waited < wait / 2, "the waiter was not woken: {waited:?}");
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
