//! A thread's life with the heap: registration once the region exists, and every arena given
//! up when the thread exits.

use super::lists::list_first;
use super::lists::list_remove;
use super::remote::collect;
use super::remote::detach;
use super::trim::{fork_prepare, fork_release};
use super::{header, retire_empty, swap_out, FULL, PARTIAL, THREAD_KEY};
use crate::classes::CLASSES;
use crate::os;
use crate::region;
use crate::tls::ThreadTable;
use core::ffi::c_void;
use core::sync::atomic::Ordering::*;

pub fn on_region_ready() {
    if let Some(key) = os::thread_key(thread_exit) {
        THREAD_KEY.store(key as usize, Release);
    }
    // May allocate inside glibc; the allocator is ready by now.
    os::at_fork(fork_prepare, fork_release, fork_release);
}

pub(super) unsafe fn register_thread(tbl: *mut ThreadTable) {
    let key = THREAD_KEY.load(Acquire);
    // SAFETY: the calling thread's own table.
    unsafe {
        (*tbl).registered = 1;
        let (base, len) = region::small_region();
        (*tbl).span_shift = region::span_shift();
        (*tbl).region_base = base;
        (*tbl).region_len = len;
    }
    if key != usize::MAX {
        os::set_thread_value(key as libc::pthread_key_t, tbl.cast());
    }
}

/// Thread-exit destructor: hand every arena back (detached, or empty).
pub(super) unsafe extern "C" fn thread_exit(value: *mut c_void) {
    let tbl = value as *mut ThreadTable;
    // SAFETY: glibc passes back the exiting thread's own table, still mapped while key
    // destructors run.
    unsafe { release_thread(tbl) }
}

/// Gives up all of a thread's arenas.
///
/// # Safety
/// `tbl` is the calling thread's table.
pub unsafe fn release_thread(tbl: *mut ThreadTable) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        for c in 0..CLASSES {
            if (*tbl).hot[c].arena != 0 {
                let arena = swap_out(tbl, c);
                give_up(arena);
            }
            for state in [FULL, PARTIAL] {
                loop {
                    let a = list_first(tbl, c, state);
                    if a == 0 {
                        break;
                    }
                    list_remove(tbl, c, state, a);
                    give_up(a);
                }
            }
            (*tbl).full_cursor[c] = 0;
        }
        (*tbl).registered = 0;
    }
}

/// Hands an unlisted arena of ours to whoever needs it: empty ones to the empty stack, others
/// detached (queued for reuse by the first free into them).
pub(super) unsafe fn give_up(arena: usize) {
    // SAFETY: the calling thread owns the arena, which is on none of its lists.
    unsafe {
        collect(arena);
        let h = header(arena);
        if (*h).used == 0 {
            retire_empty(arena);
        } else {
            detach(arena);
        }
    }
}

/// Sets the calling thread's current arenas aside without touching their memory: the table
/// then names none, so every allocation takes the slow path. Returns what [`set_back`] takes.
///
/// # Safety
/// `tbl` is the calling thread's table.
pub unsafe fn set_aside(tbl: *mut ThreadTable) -> [crate::tls::Hot; CLASSES] {
    // SAFETY: guaranteed by the caller.
    unsafe {
        core::mem::replace(
            &mut (*tbl).hot,
            [crate::tls::Hot { arena: 0, free: 0 }; CLASSES],
        )
    }
}

/// Puts back what [`set_aside`] took.
///
/// # Safety
/// `tbl` is the calling thread's table, and `hot` came from `set_aside` on it, with no
/// allocation from the region on this thread since.
pub unsafe fn set_back(tbl: *mut ThreadTable, hot: [crate::tls::Hot; CLASSES]) {
    // SAFETY: guaranteed by the caller. No arena memory is touched here (a forked child calls
    // this before its pager serves faults again): frees made meanwhile into those arenas went
    // onto their headers' lists, which `swap_out` joins with the table's.
    unsafe { (*tbl).hot = hot };
}
