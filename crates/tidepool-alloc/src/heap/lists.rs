//! A thread's own lists of the arenas it owns but is not allocating from: full ones (where its
//! frees and other threads' may make room) and partial ones.

use super::remote::collect;
use super::{header, header_in, FULL, FULL_TAG, LIST, PARTIAL, UNLISTED};
use crate::tls::ThreadTable;
use core::sync::atomic::Ordering::*;

/// A free made room in one of this thread's full arenas: move it to the partial list.
#[cold]
#[inline(never)]
pub(super) unsafe fn unfull(tbl: *mut ThreadTable, arena: usize) {
    // SAFETY: the arena is owned by the calling thread, whose table this is.
    unsafe {
        let c = (*header(arena)).class as usize;
        list_remove(tbl, c, FULL, arena);
        list_push(tbl, c, PARTIAL, arena);
    }
}

/// The owner's list head for `state` in class `c`.
unsafe fn list_head(tbl: *mut ThreadTable, c: usize, state: u32) -> *mut usize {
    // SAFETY: the calling thread's table; `c < CLASSES`.
    unsafe {
        if state == FULL {
            &mut (*tbl).full[c]
        } else {
            &mut (*tbl).partial[c]
        }
    }
}

/// The first arena on the owner's list for `state` in class `c` (zero: none).
pub(super) unsafe fn list_first(tbl: *mut ThreadTable, c: usize, state: u32) -> usize {
    // SAFETY: the calling thread's table.
    unsafe { *list_head(tbl, c, state) }
}

/// Pushes an owned arena onto the front of its owner's full or partial list.
pub(super) unsafe fn list_push(tbl: *mut ThreadTable, c: usize, state: u32, arena: usize) {
    // SAFETY: owner-only fields of arenas the calling thread owns.
    unsafe {
        let head = list_head(tbl, c, state);
        let h = header_in(arena, c);
        (*h).state = state;
        if state == FULL {
            (*h).owner.store(tbl as usize | FULL_TAG, Relaxed);
        }
        (*h).local_prev = 0;
        (*h).local_next = *head;
        if *head != 0 {
            (*header_in(*head, c)).local_prev = arena;
        } else if state == PARTIAL {
            (*tbl).partial_tail[c] = arena;
        }
        *head = arena;
    }
}

/// Unlinks an owned arena from the list its state names.
pub(super) unsafe fn list_remove(tbl: *mut ThreadTable, c: usize, state: u32, arena: usize) {
    // SAFETY: owner-only fields of arenas the calling thread owns.
    unsafe {
        let head = list_head(tbl, c, state);
        let h = header_in(arena, c);
        let (prev, next) = ((*h).local_prev, (*h).local_next);
        if prev != 0 {
            (*header_in(prev, c)).local_next = next;
        } else {
            *head = next;
        }
        if next != 0 {
            (*header_in(next, c)).local_prev = prev;
        } else if state == PARTIAL {
            (*tbl).partial_tail[c] = prev;
        }
        if state == FULL {
            (*h).owner.store(tbl as usize, Relaxed);
            if (*tbl).full_cursor[c] == arena {
                (*tbl).full_cursor[c] = next;
            }
        }
        (*h).state = UNLISTED;
        (*h).local_next = 0;
        (*h).local_prev = 0;
    }
}

/// One of this thread's own arenas of class `c` with room: the partial list first (its oldest,
/// as mimalloc's page queues do: an arena that just got its first free back would otherwise be
/// taken with one free slot, and the next refill would come a slot later), then a few full
/// arenas (round robin) that other threads have freed into.
pub(super) unsafe fn take_owned(tbl: *mut ThreadTable, c: usize) -> Option<usize> {
    // SAFETY: the calling thread's table and arenas.
    unsafe {
        let p = (*tbl).partial_tail[c];
        if p != 0 {
            list_remove(tbl, c, PARTIAL, p);
            return Some(p);
        }
        take_freed_into(tbl, c, 8)
    }
}

/// Looks at up to `budget` of this thread's full arenas of class `c` (round robin) for frees
/// other threads sent back, and takes the first that has some (off the full list).
pub(super) unsafe fn take_freed_into(
    tbl: *mut ThreadTable,
    c: usize,
    budget: usize,
) -> Option<usize> {
    // SAFETY: the calling thread's table and arenas.
    unsafe {
        for _ in 0..budget {
            let mut f = (*tbl).full_cursor[c];
            if f == 0 {
                f = (*tbl).full[c];
                if f == 0 {
                    return None;
                }
            }
            let h = header_in(f, c);
            (*tbl).full_cursor[c] = (*h).local_next;
            if (*h).remote.load(Relaxed) & LIST != 0 {
                collect(f);
                if (*h).free != 0 {
                    list_remove(tbl, c, FULL, f);
                    return Some(f);
                }
            }
        }
        None
    }
}
