//! The gate that fork(2) closes (see `fork.rs`): pager work that changes shared state runs
//! inside a [`Section`]; closing the gate waits for the sections in flight and holds new ones
//! back, except those entered regardless, which are counted so that a child forked during one
//! knows its copy of the pager is torn.

use crate::sys::{futex_wait, futex_wake_all, gettid};
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

/// Sections in flight, and who holds new ones back.
struct Gate {
    active: AtomicUsize,
    /// Of those, the ones entered regardless (`Entry::Regardless`): the only sections that may
    /// be doing work when the clone happens. `active` alone cannot tell the child: a thread
    /// that found the gate closed counts itself there for an instant before it backs out, and
    /// a fork in that instant is not torn.
    regardless: AtomicUsize,
    /// 0 while the gate is open; else the kernel id of the thread that closed it to fork (its
    /// *owner*). A futex word: sections wait on it.
    owner: AtomicU32,
}

static GATE: Gate = Gate {
    active: AtomicUsize::new(0),
    regardless: AtomicUsize::new(0),
    owner: AtomicU32::new(0),
};

thread_local! {
    /// Sections this thread is inside (they nest: an eviction inside a fault, say).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Pager work that a fork must not cut in half; see the module documentation.
#[must_use]
pub(crate) struct Section {
    /// Whether this section counted itself in [`Gate::regardless`].
    regardless: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

/// How a section treats a closed gate.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// Wait until the fork is over.
    Wait,
    /// Give up at once.
    Try,
    /// Go in anyway (counted, so that a torn child can tell): work the forking thread waits for.
    Regardless,
}

fn enter(how: Entry) -> Option<Section> {
    DEPTH.with(|d| {
        let outermost = d.get() == 0;
        if outermost {
            if how == Entry::Regardless {
                GATE.regardless.fetch_add(1, SeqCst);
            }
            loop {
                // A closed gate seen before counting costs the forking thread nothing (a
                // handler holding faults through a fork tries again and again).
                let owner = GATE.owner.load(SeqCst);
                if how == Entry::Try && owner != 0 && owner != gettid() {
                    return None;
                }
                GATE.active.fetch_add(1, SeqCst);
                let owner = GATE.owner.load(SeqCst);
                // The forking thread itself may do pager work (its own faults are served while
                // it forks): waiting for itself would never end.
                if owner == 0 || how == Entry::Regardless || owner == gettid() {
                    break;
                }
                GATE.active.fetch_sub(1, SeqCst);
                if how == Entry::Try {
                    return None;
                }
                futex_wait(&GATE.owner, owner, Duration::from_millis(10));
            }
        }
        d.set(d.get() + 1);
        Some(Section {
            regardless: outermost && how == Entry::Regardless,
            _not_send: std::marker::PhantomData,
        })
    })
}

/// Enters a section, waiting while a fork is under way.
pub(crate) fn section() -> Section {
    enter(Entry::Wait).expect("a waiting entry always enters")
}

/// Enters a section unless a fork is under way.
pub(crate) fn try_section() -> Option<Section> {
    enter(Entry::Try)
}

/// Enters a section even while a fork is under way: for work the forking thread waits for
/// (its own page faults), which therefore cannot overlap the fork itself, and for faults of
/// other threads held so long that the forking thread may be waiting for them (see
/// `fault.rs`). Counted like any section, so that a child forked in the middle of one knows
/// its copy of the pager is torn.
pub(crate) fn section_regardless() -> Section {
    enter(Entry::Regardless).expect("entered regardless")
}

/// The thread forking now, if one is: faults it raises are served while the gate is closed.
pub(crate) fn forking_thread() -> Option<u32> {
    match GATE.owner.load(SeqCst) {
        0 => None,
        tid => Some(tid),
    }
}

impl Drop for Section {
    fn drop(&mut self) {
        DEPTH.with(|d| {
            d.set(d.get() - 1);
            if d.get() == 0 {
                GATE.active.fetch_sub(1, SeqCst);
            }
        });
        if self.regardless {
            GATE.regardless.fetch_sub(1, SeqCst);
        }
    }
}

/// Closes the gate for the calling thread: waits for any other thread's fork to finish, then
/// for the sections in flight.
pub(crate) fn close_gate() {
    let me = gettid();
    loop {
        match GATE.owner.compare_exchange(0, me, SeqCst, SeqCst) {
            Ok(_) => break,
            Err(other) => futex_wait(&GATE.owner, other, Duration::from_millis(10)),
        }
    }
    let mut spins = 0u32;
    while GATE.active.load(SeqCst) != 0 {
        spins += 1;
        if spins < 100 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

pub(crate) fn open_gate() {
    GATE.owner.store(0, SeqCst);
    futex_wake_all(&GATE.owner);
}

/// Whether a section entered regardless is under way (see [`section_regardless`]).
pub(crate) fn regardless_in_flight() -> bool {
    GATE.regardless.load(SeqCst) != 0
}

/// In a forked child (no thread of the parent exists): forgets the sections the parent's
/// threads were in and gives the gate to the calling thread, which keeps it closed until
/// [`open_gate`]. Whether the child's copy is torn: only a section entered regardless can have
/// been doing work at the clone; the others were waited for, or backed out without doing any.
pub(crate) fn take_over_in_child() -> bool {
    GATE.active.store(0, SeqCst);
    let torn = GATE.regardless.swap(0, SeqCst) != 0;
    GATE.owner.store(gettid(), SeqCst);
    torn
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_gate_waits_for_sections_in_flight_and_holds_new_ones() {
        let inside = section();
        let nested = section();
        drop(nested);
        let (tx, rx) = std::sync::mpsc::channel();
        let closer = std::thread::spawn(move || {
            close_gate();
            tx.send(()).unwrap();
        });
        // The closer waits for our section.
        assert!(rx
            .recv_timeout(std::time::Duration::from_millis(100))
            .is_err());
        drop(inside);
        rx.recv().unwrap();
        closer.join().unwrap();
        // A thread that may not wait backs out, and leaves nothing a child would take for a
        // torn copy; a section entered regardless is counted until it ends.
        std::thread::spawn(|| {
            assert!(try_section().is_none());
            assert_eq!(GATE.regardless.load(SeqCst), 0);
            let late = section_regardless();
            assert_eq!(GATE.regardless.load(SeqCst), 1);
            drop(late);
            assert_eq!(GATE.regardless.load(SeqCst), 0);
        })
        .join()
        .unwrap();
        // Now a new section waits until the gate opens.
        let (tx, rx) = std::sync::mpsc::channel();
        let entrant = std::thread::spawn(move || {
            let _s = section();
            tx.send(()).unwrap();
        });
        assert!(rx
            .recv_timeout(std::time::Duration::from_millis(100))
            .is_err());
        open_gate();
        rx.recv().unwrap();
        entrant.join().unwrap();
    }
}
