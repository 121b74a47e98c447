//! fork(2) without exec: the child gets a pager of its own.
//!
//! A forked child has a copy of the address space but none of the pager's threads, and the
//! kernel drops userfaultfd registrations in it: left alone, a page that lived in far memory
//! would read as zeros. So, from `pthread_atfork` handlers:
//!
//! - **prepare** (in the forking thread, last of the prepare handlers): close the *gate*, which the
//!   forking thread then *owns*. Every piece of pager work that changes shared state (serving a
//!   fault, an eviction batch, a write-back job, a discard, adding or removing a region) runs
//!   inside a [`Section`](crate::gate::Section); closing the gate waits for the sections in flight
//!   to end and holds new ones back. So at the fork no page is BUSY, no pager lock is held and no
//!   far-store call is half done: the child's copy of the page tables, the write-back buffer and
//!   (for the in-process store) the store itself is consistent. For a store on a server each pager
//!   also makes the pipe its child will hold (`tags.rs`), and runs [`crate::Config::before_fork`]
//!   (the preload touches glibc's stdio locks there).
//! - **Between prepare and the fork itself** glibc reads the program's memory (its NSS state, its
//!   stream list). The forking thread's faults are therefore served with the gate closed: it cannot
//!   reach the fork while it waits for them, and each is installed and accounted for before it is
//!   woken (`Uffd::deferring_wakes`), with nothing evicted. A signal would end that wait early (the
//!   kernel lets a thread out of a page fault to run its handler, and back from the handler it
//!   finds the page mapped, perhaps before the service accounted for it), so the forking thread
//!   blocks every signal it can from prepare to the fork's end but the park signal below; the
//!   others stay pending and run after the fork, as if sent then. Handlers never wait at the gate
//!   holding faults: they hold other threads' faults and keep reading. A held fault whose thread
//!   may own a lock that glibc's fork takes after the handlers ran (the NSS lock, the stream
//!   list's, the malloc arenas') is served anyway while the forking thread waits on a lock, with
//!   the forking thread *parked* in a signal handler so that it cannot clone meanwhile (`late.rs`
//!   says which faults and when, `park.rs` how). Such a late section is counted all the same, so a
//!   child forked during one would know its copy is torn and stop (exit 70) rather than risk a
//!   wrong byte; that can happen only where the forking thread cannot be parked (it blocks the
//!   signal, or the program handles it).
//! - **child** (first of the child handlers, before anything touches paged memory): each pager
//!   opens a userfaultfd object of its own in place of the parent's, registers its regions and
//!   their shadows again, write-protects every mapped page again (the kernel dropped the
//!   write-protect bits with the registration, and a page the table calls clean must fault on its
//!   first write), re-tags pages on their way to the store, and tells the store to open connections
//!   of its own. Only when every pager has done so are threads started (glibc's thread start-up
//!   reads the program's locale data, wherever it lies), and the thread starting them serves faults
//!   itself until each runs: nobody else could. The child then pages on its own: its memory is
//!   exactly the parent's at the fork, far pages included, and each side's later writes are its own
//!   (the in-process store and the frames are copied with the address space; copies on a server are
//!   shared and frozen, see `tags.rs`). Its budget is for what it brings in or writes
//!   ([`crate::Config::child_local_budget`]): the pages it still shares with the parent are counted
//!   there ([`crate::table::INHERITED`]).
//! - **parent**: freeze the tag (shared stores) and open the gate.
//!
//! vfork and posix_spawn share the parent's memory until exec and run no fork handlers: the
//! parent's pager serves their faults. A child made by a raw `clone` system call without
//! `CLONE_VM` bypasses the handlers and is not supported.

use crate::gate::{close_gate, open_gate, section, take_over_in_child};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Mutex, Weak};

/// What a pager does around a fork; see the module documentation. Implemented by the pager
/// (`restart.rs`), so that this module knows nothing of its insides.
pub(crate) trait ForkHooks: Send + Sync {
    /// In the forking thread, with the gate closed.
    fn prepare(&self);
    /// In the parent, before the gate opens again.
    fn parent(&self);
    /// In the child, with the gate still closed: take over this process's memory (register
    /// it again, with a userfaultfd object of this process's own).
    fn child_prepare(&self);
    /// In the child, once every pager took over its memory: start serving it.
    fn child_start(&self);
}

/// Every running pager of this process, for the fork handlers. Changed only inside sections.
static PAGERS: Mutex<Vec<Weak<dyn ForkHooks>>> = Mutex::new(Vec::new());

pub(crate) fn register(pager: Weak<dyn ForkHooks>) {
    let _s = section();
    let mut list = PAGERS.lock().unwrap_or_else(|e| e.into_inner());
    list.retain(|w| w.strong_count() > 0);
    list.push(pager);
}

/// Forgets pagers that are gone (called as one stops).
pub(crate) fn forget_stopped() {
    let _s = section();
    PAGERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|w| w.strong_count() > 0);
}

fn pagers() -> Vec<Arc<dyn ForkHooks>> {
    PAGERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect()
}

static FORKED: AtomicBool = AtomicBool::new(false);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Whether this process is a forked child of a process that had a pager when it forked.
pub fn in_forked_child() -> bool {
    FORKED.load(Relaxed)
}

/// Installs the fork handlers, once per process. A program that registers fork handlers of its
/// own that touch paged memory should call this first: the pager's child handler must run
/// before anything in the child touches paged memory (child handlers run in the order they
/// were registered; prepare handlers in the reverse order, so the gate closes last).
pub fn install() {
    if INSTALLED.swap(true, AcqRel) {
        return;
    }
    // SAFETY: registering functions with no preconditions; glibc keeps the first 48
    // registrations in static storage, so this allocates nothing.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

thread_local! {
    /// The forking thread's signal mask before the fork, while the fork is under way.
    static MASK_BEFORE: Cell<Option<crate::sys::SignalMask>> = const { Cell::new(None) };
}

extern "C" fn prepare() {
    // From here to the clone, a signal would take the forking thread out of a page fault that
    // a handler is serving regardless: back from the signal handler it finds the page already
    // mapped (installed, not yet accounted for) and could clone while the service still runs,
    // which tears the child. So no signal but the park signal (whose handler waits for such
    // services to end) reaches it until the fork is over; the rest wait, pending.
    let mask = crate::sys::block_asynchronous_signals(crate::park::signal());
    MASK_BEFORE.with(|m| m.set(Some(mask)));
    // Pagers start and stop inside sections: with the gate closed the list holds still.
    close_gate();
    for p in pagers() {
        p.prepare();
    }
}

extern "C" fn parent() {
    for p in pagers() {
        p.parent();
    }
    open_gate();
    restore_mask();
}

/// Gives the forking thread back the signal mask it had before [`prepare`].
fn restore_mask() {
    if let Some(mask) = MASK_BEFORE.with(|m| m.take()) {
        crate::sys::restore_signals(mask);
    }
}

extern "C" fn child() {
    FORKED.store(true, Relaxed);
    // No thread of the parent exists here; whatever they had entered is over, but if one was
    // inside a section at the moment of the fork (a fault held so long that it was served
    // while the gate was closed), this copy of the pager's state may be half changed.
    // The gate stays closed, owned by this thread (its id is new in the child), while every
    // pager registers its memory again; no other thread exists to wait at it.
    if take_over_in_child() {
        crate::sys::die(
            "tidepool pager: this process was forked while a page was being moved for another \
             thread, so its copy of the pager is inconsistent; stopping it rather than risk \
             wrong bytes\n",
            crate::FATAL_EXIT_CODE,
        );
    }
    let pagers = pagers();
    for p in &pagers {
        p.child_prepare();
    }
    // Only then may any thread start: glibc's thread start-up touches the program's memory
    // (its locale data), which must be registered, whichever pager's it is, to be served.
    open_gate();
    for p in &pagers {
        p.child_start();
    }
    restore_mask();
}
