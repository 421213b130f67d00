//! Stopping scans whose answer nobody waits for any more.
//!
//! A server runs a profile merge for a request; when the request ends (its time limit
//! passed, or its client left) the merge is work for nobody, and it still holds a query
//! slot and memory. [`stop_scans_when`] runs a closure with a condition that every scan
//! *started on this thread* while it runs checks before each batch: once the condition
//! gives a reason, the scan's next item is [`Error::Stopped`] naming it, and the scan ends.
//! A scan carries its condition with it, so one started here and read on another thread (a
//! merge reads partitions in parallel) stops too.
//!
//! The condition is ambient (per thread, for the closure's duration) rather than a
//! parameter of every read, so that every read a job does under it (merges, ranges, symbol
//! tables, series) stops, including reads written later, without each threading it through.

use std::cell::RefCell;
use std::sync::Arc;

use crate::error::Error;

/// Why scans should stop, if they should: checked before every batch.
#[derive(Clone)]
pub(crate) struct Stop(Arc<dyn Fn() -> Option<String> + Send + Sync>);

impl std::fmt::Debug for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stop")
    }
}

impl Stop {
    /// The error to end a scan with, once the condition holds.
    pub(crate) fn check(&self) -> Option<Error> {
        (self.0)().map(|reason| Error::Stopped { reason })
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Stop>> = const { RefCell::new(None) };
}

/// A scan's condition, shared by the scan and every source it reads (so that one checks
/// it before each batch it reads, not only before each it yields: a filter that matches
/// nothing read a whole table inside one step), and settable once the scan has started
/// ([`crate::Scan::stop_when`]).
#[derive(Clone, Default)]
pub(crate) struct Shared(Arc<parking_lot::Mutex<Option<Stop>>>);

impl Shared {
    /// The condition scans started now on this thread check.
    pub(crate) fn current() -> Self {
        Self(Arc::new(parking_lot::Mutex::new(current())))
    }

    /// The condition is `stop` from now on.
    pub(crate) fn set(&self, stop: impl Fn() -> Option<String> + Send + Sync + 'static) {
        *self.0.lock() = Some(Stop(Arc::new(stop)));
    }

    /// The error to end with, once the condition holds.
    pub(crate) fn check(&self) -> Option<Error> {
        let stop = self.0.lock().clone();
        stop.as_ref().and_then(Stop::check)
    }
}

/// The condition scans started now on this thread check, if any.
pub(crate) fn current() -> Option<Stop> {
    CURRENT.with_borrow(Clone::clone)
}

/// Why work started now on this thread should stop, if it should: the condition of the
/// [`stop_scans_when`] around it (none: never), for work that is not a scan to check as it
/// goes (a merge waiting on other processes), as [`Error::Stopped`].
pub fn stopped_now() -> impl Fn() -> Option<Error> + Send + Sync + 'static {
    let stop = current();
    move || stop.as_ref().and_then(Stop::check)
}

/// Runs `f`; every scan it starts on this thread stops at its next batch once `stop`
/// returns a reason (the scan's item is then [`Error::Stopped`], the kind
/// [`Unavailable`](crate::ErrorKind::Unavailable)). Nested calls: the inner condition holds
/// inside, the outer one again after.
pub fn stop_scans_when<T>(
    stop: impl Fn() -> Option<String> + Send + Sync + 'static,
    f: impl FnOnce() -> T,
) -> T {
    /// Puts the outer condition back, even when `f` unwinds.
    struct Restore(Option<Stop>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            CURRENT.with_borrow_mut(|c| *c = outer);
        }
    }
    let outer = CURRENT.with_borrow_mut(|c| c.replace(Stop(Arc::new(stop))));
    let _restore = Restore(outer);
    f()
}
