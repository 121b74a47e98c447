//! Frees from threads that do not own the arena (pushed on its remote list and taken back by
//! the owner), and handing arenas between owners (detach and adopt).

use super::{
    header, push, retire_empty, ArenaHeader, CLASS, COUNT_SHIFT, DETACHED, FLAGS, LIST, QUEUED,
};
use core::sync::atomic::Ordering::*;

/// A free into an arena this thread does not own: push onto its remote list. One CAS pushes the
/// object, counts it, and (for a detached arena not yet queued) marks the arena queued; the free
/// that queued it then pushes it onto the class's reusable stack.
#[inline(never)]
pub(super) unsafe fn free_remote(h: *mut ArenaHeader, p: usize) {
    // SAFETY: `h` is an initialised arena header; `p` is a dead object of at least 16 bytes in
    // it, so its first word can carry the list link.
    unsafe {
        let mut old = (*h).remote.load(Acquire);
        loop {
            *(p as *mut usize) = old & LIST;
            let count = (old >> COUNT_SHIFT) + 1;
            let mut flags = old & FLAGS;
            let queue = flags == DETACHED;
            if queue {
                flags |= QUEUED;
            }
            match (*h).remote.compare_exchange_weak(
                old,
                p | (count << COUNT_SHIFT) | flags,
                AcqRel,
                Acquire,
            ) {
                Ok(_) => {
                    if queue {
                        push(&CLASS[(*h).class as usize].reusable, h);
                    }
                    return;
                }
                Err(now) => old = now,
            }
        }
    }
}

/// Takes the remote list of an arena the caller owns (so its flags are clear) as a list of free
/// slots, without counting them back in `used` (right for a current arena, whose `used` is
/// settled when it stops being current).
pub(super) unsafe fn take_remote(h: *mut ArenaHeader) -> usize {
    // SAFETY: as `take_remote_word`.
    unsafe { take_remote_word(h) & LIST }
}

/// Swaps out the remote word of an arena the caller owns: list head and count.
unsafe fn take_remote_word(h: *mut ArenaHeader) -> usize {
    // SAFETY: the Acquire swap pairs with the Release CAS of every `free_remote` that pushed.
    unsafe {
        if (*h).remote.load(Relaxed) == 0 {
            return 0;
        }
        let old = (*h).remote.swap(0, Acquire);
        CLASS[(*h).class as usize]
            .remote_frees
            .fetch_add((old >> COUNT_SHIFT) as u64, Relaxed);
        old
    }
}

/// Moves the remote list of an arena the caller owns and that is not current onto its free
/// list; returns how many objects came back.
pub(super) unsafe fn collect(arena: usize) -> u32 {
    let h = header(arena);
    // SAFETY: as `take_remote_word`; the caller owns the arena.
    unsafe {
        let word = take_remote_word(h);
        fold(h, word)
    }
}

/// Puts a taken remote list (a remote word: head and count) in front of the arena's free list.
/// The count says how many came back, so the list is walked (each node a miss: another thread
/// wrote it last) only to append it to a free list that is not empty.
unsafe fn fold(h: *mut ArenaHeader, word: usize) -> u32 {
    let list = word & LIST;
    if list == 0 {
        return 0;
    }
    let n = (word >> COUNT_SHIFT) as u32;
    // SAFETY: the caller owns the arena; list nodes are dead objects whose first word links
    // to the next.
    unsafe {
        if (*h).free != 0 {
            let mut tail = list;
            loop {
                let next = *(tail as *const usize);
                if next == 0 {
                    break;
                }
                tail = next;
            }
            *(tail as *mut usize) = (*h).free;
        }
        (*h).free = list;
        (*h).used -= n;
        n
    }
}

/// Gives up ownership of an arena that is not current (its owner is exiting). The first free
/// into it afterwards queues it for reuse. Frees racing with the detach are collected; if they
/// empty the arena, it goes to the empty stack instead.
pub(super) unsafe fn detach(arena: usize) {
    let h = header(arena);
    // SAFETY: the caller owns the arena until the CAS below succeeds.
    unsafe {
        (*h).owner.store(0, Relaxed);
        loop {
            if (*h)
                .remote
                .compare_exchange(0, DETACHED, Release, Relaxed)
                .is_ok()
            {
                return;
            }
            collect(arena);
            if (*h).used == 0 {
                retire_empty(arena);
                return;
            }
        }
    }
}

/// Takes ownership of an arena popped from the reusable stack.
pub(super) unsafe fn adopt(arena: usize, tbl: usize) {
    let h = header(arena);
    // SAFETY: popping gave us the arena exclusively; the swap takes the list and clears
    // DETACHED|QUEUED at once, after which frees see an owned arena and only push.
    unsafe {
        (*h).owner.store(tbl, Relaxed);
        let old = (*h).remote.swap(0, Acquire);
        CLASS[(*h).class as usize]
            .remote_frees
            .fetch_add((old >> COUNT_SHIFT) as u64, Relaxed);
        fold(h, old);
    }
}
