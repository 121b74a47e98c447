//! Debug mode (`TIDEPOOL_ALLOC_DEBUG=1`): every small allocation and free takes one global lock
//! and the arena's allocation bitmap, the way the allocator kept its slots before free lists.
//! A double free, or a free of anything but the start of a live allocation, then aborts with a
//! message instead of corrupting a free list. Arenas belong to [`DEBUG_OWNER`], so no thread's
//! table ever names one and every free of theirs arrives here; nothing is ever given back.

use super::{acquire, header, header_in, ArenaHeader, DEBUG_OWNER};
use crate::block::Block;
use crate::classes::bitmap_words;
use crate::classes::class_size;
use crate::classes::first_slot;
use crate::classes::reciprocal;
use crate::classes::slots;
use crate::classes::CLASSES;
use crate::classes::HEADER_FIXED;
use crate::os;
use crate::tls::ThreadTable;
use core::sync::atomic::AtomicBool;
use core::sync::atomic::AtomicUsize;
use core::sync::atomic::Ordering::*;

static LOCK: AtomicBool = AtomicBool::new(false);
/// The arena each class allocates from.
static CURRENT_ARENA: [AtomicUsize; CLASSES] = [const { AtomicUsize::new(0) }; CLASSES];

fn lock() {
    while LOCK.swap(true, Acquire) {
        os::yield_now();
    }
}

fn unlock() {
    LOCK.store(false, Release);
}

/// Lock taken around `fork`, so the child finds it free.
pub(super) fn fork_lock() {
    lock();
}

pub(super) fn fork_unlock() {
    unlock();
}

#[inline]
fn bitmap_word(h: *mut ArenaHeader, word: usize) -> *mut u64 {
    (h as usize + HEADER_FIXED + word * 8) as *mut u64
}

/// Allocates one object of class `c`.
///
/// # Safety
/// `tbl` is the calling thread's table.
pub(super) unsafe fn alloc(tbl: *mut ThreadTable, c: usize) -> Block {
    lock();
    // SAFETY: under the lock, the debug arenas are ours to change.
    let b = unsafe {
        loop {
            let arena = CURRENT_ARENA[c].load(Relaxed);
            if arena != 0 {
                if let Some(b) = take_lowest(arena, c) {
                    break b;
                }
            }
            match acquire(c, tbl as usize) {
                Some(a) => {
                    mark_header_slots(a, c);
                    (*header_in(a, c)).owner.store(DEBUG_OWNER, Relaxed);
                    CURRENT_ARENA[c].store(a, Relaxed);
                }
                None => {
                    unlock();
                    return crate::large::alloc(class_size(c), 16);
                }
            }
        }
    };
    unlock();
    b
}

/// Sets the bits of the slots the header covers and of the tail past the last whole slot.
unsafe fn mark_header_slots(arena: usize, c: usize) {
    let h = header_in(arena, c);
    // SAFETY: a fresh arena of ours, under the lock.
    unsafe {
        for idx in (0..first_slot(c)).chain(slots(c)..bitmap_words(c) * 64) {
            *bitmap_word(h, idx / 64) |= 1u64 << (idx % 64);
        }
    }
}

/// Takes the lowest free slot; `None` when the arena is full.
unsafe fn take_lowest(arena: usize, c: usize) -> Option<Block> {
    let h = header_in(arena, c);
    // SAFETY: under the lock.
    unsafe {
        for wi in (*h).hint..(*h).words {
            let word = bitmap_word(h, wi as usize);
            let w = *word;
            if w != u64::MAX {
                let bit = (!w).trailing_zeros();
                *word = w | (1u64 << bit);
                (*h).hint = wi;
                let p = arena + (wi * 64 + bit) as usize * (*h).size as usize;
                let fresh = p >= (*h).zero_from;
                if fresh {
                    (*h).zero_from = p + (*h).size as usize;
                }
                return Some(Block {
                    ptr: p as *mut u8,
                    fresh,
                });
            }
        }
        (*h).hint = (*h).words;
        None
    }
}

/// Frees `p` in `arena` (a debug arena), checking that it is a live allocation's start.
///
/// # Safety
/// `arena` is a debug arena.
pub(super) unsafe fn free(arena: usize, p: usize) {
    let h = header(arena);
    lock();
    // SAFETY: under the lock.
    unsafe {
        let c = (*h).class as usize;
        let off = p - arena;
        let idx = ((off as u64 * reciprocal(c) as u64) >> 32) as usize;
        if idx * class_size(c) != off || idx < first_slot(c) || idx >= slots(c) {
            unlock();
            invalid_free();
        }
        let word = bitmap_word(h, idx / 64);
        let bit = 1u64 << (idx % 64);
        if *word & bit == 0 {
            unlock();
            double_free();
        }
        *word &= !bit;
        if ((idx / 64) as u32) < (*h).hint {
            (*h).hint = (idx / 64) as u32;
        }
    }
    unlock();
}

// Out of line and argument-free, so the callers do not set up their messages.
#[cold]
#[inline(never)]
fn invalid_free() -> ! {
    os::fatal(b"free(): invalid pointer (not the start of an allocation; TIDEPOOL_ALLOC_DEBUG)")
}

#[cold]
#[inline(never)]
fn double_free() -> ! {
    os::fatal(b"free(): double free detected (TIDEPOOL_ALLOC_DEBUG)")
}
