//! Charging what decoding makes to the caller's memory budget before it is made.
//!
//! A server holds a memory budget for each request; a pprof profile inside a request (a
//! push's raw profile, a form's part) may be gzipped by itself, and its flat arrays take
//! several times its raw bytes. [`charging`] runs a closure during which every decode on
//! this thread first asks `charge` for what it is about to make: the gunzipped bytes (as
//! the gzip trailer states them, and what is over once they are made) and the arrays (as
//! the first pass over the fields counts them). A refusal fails the decode with the
//! charge's error, before the memory is taken: [`Error::Unavailable`] for memory that is
//! not free now, [`Error::OverShare`] for a share of it (a tenant's) held by the caller's
//! own other work, [`Error::OverMemory`] for more than the whole budget.
//!
//! [`Error::Unavailable`]: crate::Error::Unavailable
//! [`Error::OverShare`]: crate::Error::OverShare
//! [`Error::OverMemory`]: crate::Error::OverMemory
//!
//! Ambient (per thread, for the closure) like [`frostdb_core::stop_scans_when`], so that
//! every decoder the closure reaches (pushes, forms, Parca, JFR's embedded parts) is
//! charged without each taking the budget as a parameter.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::error::Result;

type Charge = Rc<dyn Fn(usize, &'static str) -> Result<()>>;

thread_local! {
    static CHARGE: RefCell<Option<Charge>> = const { RefCell::new(None) };
    /// Bytes charged ahead by [`take`] and not yet taken, under the charge set now.
    static CREDIT: Cell<usize> = const { Cell::new(0) };
}

/// Runs `f`; every decode it does on this thread first charges what it will make to
/// `charge` (bytes, and what they are for), failing with `charge`'s error when it
/// refuses. Nested calls: the inner charge holds inside, the outer again after.
pub fn charging<T>(
    charge: impl Fn(usize, &'static str) -> Result<()> + 'static,
    f: impl FnOnce() -> T,
) -> T {
    struct Restore(Option<Charge>, usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            CHARGE.with_borrow_mut(|c| *c = outer);
            CREDIT.set(self.1);
        }
    }
    let outer = CHARGE.with_borrow_mut(|c| c.replace(Rc::new(charge)));
    let _restore = Restore(outer, CREDIT.replace(0));
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

/// What [`take`] charges at a time, at least: at most this much is charged and not made.
const SLAB: usize = 256 << 10;

/// Charges `bytes` that a conversion is about to copy (a string, a frame, a sample's stack)
/// for `what`, from bytes charged ahead a slab at a time: cheap enough to call for every
/// copy a converter makes, so that what it builds is charged however the body shares what
/// it names (one long string named by every profile, one stack by every row), not only in
/// proportion to the body's bytes.
pub(crate) fn take(bytes: usize, what: &'static str) -> Result<()> {
    let credit = CREDIT.get();
    if let Some(left) = credit.checked_sub(bytes) {
        CREDIT.set(left);
        return Ok(());
    }
    if CHARGE.with_borrow(Option::is_none) {
        return Ok(());
    }
    let need = bytes - credit;
    let slab = need.max(SLAB);
    charge(slab, what)?;
    CREDIT.set(slab - need);
    Ok(())
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

/// Runs `f` under a budget of `budget` bytes, as a server's request runs its decode: a
/// charge past it is refused ([`crate::Error::Unavailable`], naming what it was for).
/// Returns what `f` returned and the bytes it asked for, refused ones included.
#[cfg(test)]
pub(crate) fn under_budget<T>(budget: usize, f: impl FnOnce() -> T) -> (T, usize) {
    let asked = Rc::new(Cell::new(0usize));
    let held = Rc::new(Cell::new(0usize));
    let seen = asked.clone();
    let got = charging(
        move |bytes, what| {
            seen.set(seen.get().saturating_add(bytes));
            match held.get().saturating_add(bytes) {
                total if total > budget => Err(crate::Error::Unavailable(format!(
                    "{what}: {bytes} bytes more is over the budget of {budget}"
                ))),
                total => {
                    held.set(total);
                    Ok(())
                }
            }
        },
        f,
    );
    (got, asked.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_are_charged_ahead_a_slab_at_a_time_and_credit_stays_with_its_charge() {
        // No charge set: nothing to take from, nothing refused.
        take(usize::MAX, "anything").unwrap();
        let ((), asked) = under_budget(usize::MAX, || {
            for _ in 0..1000 {
                take(100, "small copies").unwrap();
            }
        });
        assert_eq!(asked, SLAB, "100 KB of small copies charge one slab");
        let ((), asked) = under_budget(usize::MAX, || {
            take(10, "a first copy").unwrap();
            // An inner charge starts with no credit, and the outer's is there after.
            let ((), inner) = under_budget(usize::MAX, || take(10, "inner").unwrap());
            assert_eq!(inner, SLAB);
            take(SLAB - 11, "the rest of the first slab but a byte").unwrap();
            // A copy larger than a slab is charged what the credit does not cover.
            take(3 * SLAB, "a large copy").unwrap();
        });
        assert_eq!(asked, SLAB + 3 * SLAB - 1);
        // A refused take is an error naming what it was for, and takes nothing.
        let (got, _) = under_budget(SLAB, || take(SLAB + 1, "one copy too large").unwrap_err());
        assert!(got.to_string().contains("one copy too large"), "{got}");
    }
}
