//! Giving memory back: retiring empty arenas, `malloc_trim`, the periodic trim; locking
//! every stack around `fork`; and the per-class figures `crate::stats` reads.

use super::lists::list_remove;
use super::remote::adopt;
use super::remote::collect;
use super::{
    arena_of, header_in, push, release_pages, retire_empty, ArenaHeader, ClassState, CLASS,
    DETACHED, LAST_TRIM_MS, PARTIAL, QUEUED, RESIDENT_EMPTY,
};
use crate::classes::ARENA_BYTES;
use crate::classes::CLASSES;
use crate::classes::PAGE;
use crate::os;
use crate::region;
use crate::region::RETAIN_BYTES;
use crate::tls::ThreadTable;
use core::sync::atomic::AtomicBool;
use core::sync::atomic::AtomicUsize;
use core::sync::atomic::Ordering::*;
use region::TRIM_TICK;

pub(super) fn maybe_trim(tbl: *mut ThreadTable) {
    let now = os::coarse_millis();
    let last = LAST_TRIM_MS.load(Relaxed);
    if now.saturating_sub(last) < region::TRIM_INTERVAL_MS.load(Relaxed) as u64
        || LAST_TRIM_MS
            .compare_exchange(last, now, Relaxed, Relaxed)
            .is_err()
    {
        return;
    }
    // SAFETY: the calling thread's table.
    unsafe { retire_own_empties(tbl, usize::MAX) };
    trim(tbl as usize, false);
    // Purge what has sat empty (or cached) since before the last tick.
    let tick = TRIM_TICK.fetch_add(1, Relaxed) + 1;
    for class in CLASS.iter() {
        if class.empty.load(Relaxed) != 0 {
            release_resident(class, usize::MAX, tick);
        }
    }
    crate::large::purge(tick - 1);
}

/// Runs the periodic trim if its period has passed, from a path that is not a refill.
pub fn tick(tbl: *mut ThreadTable) {
    // SAFETY: the calling thread's table (unpaged threads own no arenas).
    if unsafe { (*tbl).unpaged } == 0 {
        maybe_trim(tbl);
    }
}

/// Moves up to `limit` of this thread's empty partial arenas to the empty stacks; returns how
/// many it moved.
///
/// # Safety
/// `tbl` is the calling thread's table.
pub(super) unsafe fn retire_own_empties(tbl: *mut ThreadTable, limit: usize) -> usize {
    let mut moved = 0;
    // SAFETY: the calling thread's table and arenas.
    unsafe {
        for c in 0..CLASSES {
            let mut a = (*tbl).partial[c];
            while a != 0 && moved < limit {
                let next = (*header_in(a, c)).local_next;
                if (*header_in(a, c)).used == 0 {
                    list_remove(tbl, c, PARTIAL, a);
                    retire_empty(a);
                    moved += 1;
                }
                a = next;
            }
        }
    }
    moved
}

/// Adopts every queued arena, retires those that turned out empty and queues the rest again.
/// With `release_all` (malloc_trim), also gives back the pages of every retained empty arena.
pub fn trim(me: usize, release_all: bool) {
    if release_all {
        // SAFETY: `me` is the calling thread's table.
        unsafe { retire_own_empties(me as *mut ThreadTable, usize::MAX) };
    }
    for class in CLASS.iter() {
        trim_reusable(class, me);
        if release_all {
            release_resident(class, usize::MAX, u32::MAX);
        }
    }
    crate::medium::trim(if release_all {
        0
    } else {
        RETAIN_BYTES.load(Relaxed)
    });
}

/// Takes a whole stack (under its pop lock, so no single pop is in flight); 0 if the lock is
/// busy or the stack empty.
pub(super) fn take_all(stack: &AtomicUsize, lock: &AtomicBool) -> usize {
    if lock.swap(true, Acquire) {
        return 0;
    }
    let chain = stack.swap(0, Acquire);
    lock.store(false, Release);
    chain
}

/// Gives back the pages of up to `limit` resident arenas on the class's empty stack that were
/// retired before trim tick `before`; returns how many it released.
pub(super) fn release_resident(class: &ClassState, limit: usize, before: u32) -> usize {
    let mut chain = take_all(&class.empty, &class.empty_lock);
    let mut released = 0;
    while chain != 0 {
        let h = chain as *mut ArenaHeader;
        let arena = arena_of(chain);
        // SAFETY: the swap gave us the chain; each arena is empty and ours until pushed.
        unsafe {
            chain = (*h).next.load(Relaxed);
            if released < limit && (*h).resident != 0 && (*h).resident < before {
                release_pages(arena);
                released += 1;
            }
            push(&class.empty, h);
        }
    }
    released
}

pub(super) fn trim_reusable(class: &ClassState, me: usize) {
    let mut chain = take_all(&class.reusable, &class.reusable_lock);
    while chain != 0 {
        let h = chain as *mut ArenaHeader;
        let arena = arena_of(chain);
        // SAFETY: the swap gave us the whole chain; each arena in it is ours until pushed.
        unsafe {
            chain = (*h).next.load(Relaxed);
            adopt(arena, me);
            if (*h).used == 0 {
                retire_empty(arena);
                continue;
            }
            // Queue again: detached and queued at once, with an empty list.
            (*h).owner.store(0, Relaxed);
            loop {
                if (*h)
                    .remote
                    .compare_exchange(0, DETACHED | QUEUED, Release, Relaxed)
                    .is_ok()
                {
                    push(&class.reusable, h);
                    break;
                }
                collect(arena);
                if (*h).used == 0 {
                    retire_empty(arena);
                    break;
                }
            }
        }
    }
}

pub(super) fn lock_all() {
    for class in CLASS.iter() {
        for lock in [&class.reusable_lock, &class.empty_lock] {
            while lock.swap(true, Acquire) {
                os::yield_now();
            }
        }
    }
}

pub(super) fn unlock_all() {
    for class in CLASS.iter() {
        class.reusable_lock.store(false, Release);
        class.empty_lock.store(false, Release);
    }
}

pub(super) unsafe extern "C" fn fork_prepare() {
    super::debug::fork_lock();
    lock_all();
    crate::large::lock_cache();
    crate::medium::lock();
}

pub(super) unsafe extern "C" fn fork_release() {
    crate::medium::unlock();
    crate::large::unlock_cache();
    unlock_all();
    super::debug::fork_unlock();
}

/// Per-class counters for [`crate::stats`]: objects freed by threads other than their arena's
/// owner, and arenas taken from the class's span.
pub fn class_counters(c: usize) -> (u64, usize) {
    let class = &CLASS[c];
    let (_, span) = region::class_span(c);
    (
        class.remote_frees.load(Relaxed),
        class.bump.load(Relaxed).min(span) / ARENA_BYTES,
    )
}

/// Resident bytes of class `c`'s arenas (mincore over every arena the class has taken).
pub fn class_resident_bytes(c: usize) -> usize {
    let (start, span) = region::class_span(c);
    let arenas = CLASS[c].bump.load(Relaxed).min(span) / ARENA_BYTES;
    (0..arenas)
        .map(|i| os::resident_pages(start + i * ARENA_BYTES, ARENA_BYTES / PAGE) * PAGE)
        .sum()
}

/// Bytes of empty arenas currently kept resident.
pub fn resident_empty_bytes() -> usize {
    RESIDENT_EMPTY.load(Relaxed)
}
