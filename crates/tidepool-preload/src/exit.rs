//! Leaving: `_exit` and `_Exit`, interposed so that the pager's threads leave SCHED_IDLE
//! first (`tidepool_pager::Pager::before_exit`), as the exit handler does for `exit`.
//!
//! A thread that exits at SCHED_IDLE clears its /proc entries at that priority while the
//! parent reaping the process spins in the kernel over the same entries at normal priority.
//! stress-ng's vm workers, each reaping a paged child that leaves with `_exit`, spun so for
//! seconds to minutes when two ran side by side (`scripts/stress-ng-pairs`: 5 of 30 pairs over
//! 4 s, two killed at 120 s; with this, none). A program that leaves with a raw `exit_group`
//! (Go) or is killed by a signal still exits with them at SCHED_IDLE.

use core::ffi::c_int;
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};

/// The process the pager serves: a vfork child (sharing its parent's memory, and so its
/// pager's thread ids) that calls `_exit` must leave the parent's threads alone.
static OWNER: AtomicI32 = AtomicI32::new(0);

/// Records the calling process as the pager's (at start, and in a forked child).
pub(crate) fn owned_by_this_process() {
    OWNER.store(std::process::id() as i32, Relaxed);
}

/// Lets the pager's threads leave SCHED_IDLE if they are this process's.
pub(crate) fn before_exit() {
    if let Some(pager) = crate::pager() {
        if OWNER.load(Relaxed) == std::process::id() as i32 {
            pager.before_exit();
        }
    }
}

/// # Safety
/// The _exit(2) contract.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    before_exit();
    loop {
        // SAFETY: exit_group ends every thread of the process; it does not return.
        unsafe { tidepool_sys::syscall!(libc::SYS_exit_group, status) };
    }
}

/// # Safety
/// The _Exit(3) contract.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // SAFETY: passed on.
    unsafe { _exit(status) }
}
