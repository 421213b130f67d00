//! Charging what decoding makes to the caller's memory budget before it is made.
//!
//! A server holds a memory budget for each request; a pprof profile inside a request (a
//! push's raw profile, a form's part) may be gzipped by itself, and its flat arrays take
//! several times its raw bytes. [`charging`] runs a closure during which every decode on
//! this thread first asks `charge` for what it is about to make: the gunzipped bytes (as
//! the gzip trailer states them, and what is over once they are made) and the arrays (as
//! the first pass over the fields counts them). A refusal fails the decode with the
//! charge's error, before the memory is taken: [`Error::Unavailable`] for memory that is
//! not free now, [`Error::OverMemory`] for more than the whole budget.
//!
//! [`Error::Unavailable`]: crate::Error::Unavailable
//! [`Error::OverMemory`]: crate::Error::OverMemory
//!
//! Ambient (per thread, for the closure) like [`frostdb_core::stop_scans_when`], so that
//! every decoder the closure reaches (pushes, forms, Parca, JFR's embedded parts) is
//! charged without each taking the budget as a parameter.

use std::cell::RefCell;
use std::rc::Rc;

use crate::error::Result;

type Charge = Rc<dyn Fn(usize, &'static str) -> Result<()>>;

thread_local! {
    static CHARGE: RefCell<Option<Charge>> = const { RefCell::new(None) };
}

/// Runs `f`; every decode it does on this thread first charges what it will make to
/// `charge` (bytes, and what they are for), failing with `charge`'s error when it
/// refuses. Nested calls: the inner charge holds inside, the outer again after.
pub fn charging<T>(
    charge: impl Fn(usize, &'static str) -> Result<()> + 'static,
    f: impl FnOnce() -> T,
) -> T {
    struct Restore(Option<Charge>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            CHARGE.with_borrow_mut(|c| *c = outer);
        }
    }
    let outer = CHARGE.with_borrow_mut(|c| c.replace(Rc::new(charge)));
    let _restore = Restore(outer);
    f()
}

/// Charges `bytes` for `what`, if a charge is set on this thread.
pub(crate) fn charge(bytes: usize, what: &'static str) -> Result<()> {
    let Some(charge) = CHARGE.with_borrow(Clone::clone) else {
        return Ok(());
    };
    if bytes == 0 {
        return Ok(());
    }
    charge(bytes, what)
}

/// Keeps long conversions answerable to the request they are for: [`Pace::tick`], once per
/// unit of work (a sample, a frame, an event), fails every [`Pace::EVERY`] ticks with the
/// reason work on this thread should stop, when it should ([`frostdb_core::stop_scans_when`]
/// around it: the request ended, its client left or its time ran out). A decode the server
/// gave up on then ends within a thousand units, rather than holding its slot in the
/// ingest lane and its memory until the whole body is converted for nobody.
pub(crate) struct Pace {
    left: u32,
}

impl Pace {
    /// Ticks between checks: a check clones the condition (an `Arc`) and asks it.
    pub(crate) const EVERY: u32 = 1024;

    pub(crate) fn new() -> Self {
        Self { left: Self::EVERY }
    }

    /// One unit of work more; every [`Pace::EVERY`]th asks whether to stop.
    #[inline]
    pub(crate) fn tick(&mut self) -> Result<()> {
        self.left -= 1;
        if self.left > 0 {
            return Ok(());
        }
        self.left = Self::EVERY;
        match frostdb_core::stopped_now()() {
            Some(stopped) => Err(stopped.into()),
            None => Ok(()),
        }
    }
}
