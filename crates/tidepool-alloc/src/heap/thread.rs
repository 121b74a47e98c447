//! A thread's life with the heap: registration once the region exists, counters flushed into
//! the global statistics, and every current arena given up when the thread exits.

use super::trim::{fork_prepare, fork_release};
use super::*;

pub(super) fn flush_class(tbl: *mut ThreadTable, c: usize) {
    // SAFETY: the calling thread's own table.
    unsafe {
        let a = core::mem::take(&mut (*tbl).allocs[c]);
        let f = core::mem::take(&mut (*tbl).frees[c]);
        if a != 0 {
            CLASS[c].allocs.fetch_add(a as u64, Relaxed);
        }
        if f != 0 {
            CLASS[c].frees.fetch_add(f as u64, Relaxed);
        }
    }
}

/// Flushes all of the calling thread's counters into the global statistics.
pub fn flush_counters(tbl: *mut ThreadTable) {
    for c in 0..CLASSES {
        flush_class(tbl, c);
    }
}

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
        (*tbl).region_base = base;
        (*tbl).region_len = len;
    }
    if key != usize::MAX {
        os::set_thread_value(key as libc::pthread_key_t, tbl.cast());
    }
}

/// Thread-exit destructor: hand every current arena back (detached, or empty).
pub(super) unsafe extern "C" fn thread_exit(value: *mut c_void) {
    let tbl = value as *mut ThreadTable;
    // SAFETY: glibc passes back the exiting thread's own table, still mapped while key
    // destructors run.
    unsafe { release_thread(tbl) }
}

/// Gives up all of a thread's current arenas.
///
/// # Safety
/// `tbl` is the calling thread's table.
pub unsafe fn release_thread(tbl: *mut ThreadTable) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        for c in 0..CLASSES {
            let arena = sentinel(tbl).wrapping_add((*tbl).cur[c]);
            if arena != sentinel(tbl) {
                (*tbl).cur[c] = 0;
                (*header(arena)).state = UNLISTED;
                give_up(arena);
            }
            for state in [FULL, PARTIAL] {
                loop {
                    let a = *list_head(tbl, c, state);
                    if a == 0 {
                        break;
                    }
                    list_remove(tbl, c, state, a);
                    give_up(a);
                }
            }
            (*tbl).full_cursor[c] = 0;
        }
        flush_counters(tbl);
        (*tbl).registered = 0;
    }
}

/// Hands an unlisted arena of ours to whoever needs it: empty ones to the empty stack, others
/// detached (queued for reuse once enough of their objects are freed).
pub(super) unsafe fn give_up(arena: usize) {
    // SAFETY: the calling thread owns the arena, which is on none of its lists.
    unsafe {
        collect(arena);
        let h = header(arena);
        if (*h).used == 0 {
            retire_empty(arena);
        } else {
            let threshold = (capacity((*h).class as usize) as u32 / 8).min((*h).used);
            detach(arena, threshold);
        }
    }
}
