//! Arenas, the per-thread arena table, and the paths between them.
//!
//! # Arena states
//!
//! * **Owned** by one thread (its `owner` is that thread's table): the thread's *current* arena
//!   of the class, or on its *full* or *partial* list (links in the headers). Only the owner
//!   touches the bitmap, `used`, `hint`, `hwm` and the list links, with plain loads and stores,
//!   so its own frees into any of its arenas are plain bit clears. Other threads free by pushing
//!   the object onto the arena's lock-free `remote` list; the owner folds that list into the
//!   bitmap ("collects") when it needs room.
//! * **Detached**: its owner exited. `owner` is zero, so every free goes through `remote`. The
//!   free that brings the uncollected count to the arena's queue threshold sets `QUEUED` and
//!   pushes the arena onto its class's *reusable* stack.
//! * **Reusable** (detached and queued): waiting to be adopted by any thread that needs an arena
//!   of the class; adoption takes the remote list and clears both flags in one swap.
//! * **Empty** (on its class's *empty* stack): no live objects. Up to `RETAIN_BYTES` of empty
//!   arenas stay resident; beyond that their pages past the header are given back to the OS, so
//!   RSS follows the live set.
//!
//! `remote` packs the list head (objects are 16-byte aligned), the uncollected count and the
//! `DETACHED` and `QUEUED` flags, so the exiting owner's detach (empty list, no flags ->
//! `DETACHED`), a free's push, its count and its decision to queue all hinge on one
//! compare-and-swap.
//!
//! # The empty table
//!
//! A thread's table starts as zeroes; a zero entry means the thread's own empty sentinel arena
//! (right after the table in TLS, see `shim/thread_table.c`), whose only bitmap word is full.
//! The fast path therefore needs no "initialised?" branch: a new thread's first allocation in a
//! class finds a full arena and takes the slow path like any other refill.
//!
//! # Stacks
//!
//! Both per-class stacks are Treiber stacks: pushes are lock-free from any thread; pops take a
//! per-class try-lock, which makes the single popper immune to ABA. A busy lock is skipped, never
//! waited on, so no malloc ever blocks on another thread.

use crate::block::Block;
use crate::classes::{
    bitmap_words, capacity, class_size, first_slot, reciprocal, slots, slots_in_header_page,
    ARENA_BYTES, CLASSES, HEADER_FIXED, PAGE,
};
use crate::os;
use crate::region::{self, RETAIN_BYTES};
use crate::tls::{sentinel, ThreadTable};
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

const DETACHED: usize = 1;
const QUEUED: usize = 2;
const FLAGS: usize = DETACHED | QUEUED;
/// Remote-list head bits: objects are 16-byte aligned and user addresses fit in 47 bits.
const LIST: usize = 0x0000_ffff_ffff_fff0;
/// Uncollected remote frees, in the top 16 bits (an arena has at most 16 384 slots).
const COUNT_SHIFT: u32 = 48;

/// Header at the start of every arena; the allocation bitmap follows at [`HEADER_FIXED`].
#[repr(C)]
#[derive(Debug)]
pub struct ArenaHeader {
    // First cache line: the owner's.
    /// Lowest bitmap word that may have a free bit.
    hint: u32,
    /// Objects handed out and not yet collected back.
    used: u32,
    /// Slots at or above this index have not been handed out since the arena's pages were last
    /// zero, so they read as zero (calloc skips clearing them).
    hwm: u32,
    size: u32,
    recip: u32,
    class: u32,
    words: u32,
    first_slot: u32,
    capacity: u32,
    /// On the empty stack: its pages are still resident (counted in `RESIDENT_EMPTY`).
    resident: u32,
    /// Where its owner keeps it: [`CURRENT`], [`FULL`], [`PARTIAL`] or [`UNLISTED`].
    state: u32,
    _pad0: u32,
    /// Address of the owning thread's table; zero when detached.
    owner: AtomicUsize,
    /// Links in the owner's full or partial list of the class.
    local_next: usize,
    // Second cache line: shared with freeing threads.
    /// Uncollected remote frees (top 16 bits) | list head | `DETACHED` | `QUEUED`.
    remote: AtomicUsize,
    _pad_count: u32,
    /// Uncollected frees at which a detached arena is worth queueing for reuse.
    queue_threshold: AtomicU32,
    /// Link in the reusable or empty stack.
    next: AtomicUsize,
    local_prev: usize,
    _pad2: [u64; 4],
}

/// Not in any of its owner's lists (detached, on a stack, or being moved).
const UNLISTED: u32 = 0;
/// Its owner's current arena of the class.
const CURRENT: u32 = 1;
/// Owned, full when last looked at, on the owner's full list.
const FULL: u32 = 2;
/// Owned, with free slots, on the owner's partial list.
const PARTIAL: u32 = 3;

const _: () = assert!(core::mem::size_of::<ArenaHeader>() == HEADER_FIXED);

/// Per-class shared state.
#[repr(C, align(64))]
#[derive(Debug)]
struct ClassState {
    /// Offset of the next never-used arena in the class's span.
    bump: AtomicUsize,
    reusable: AtomicUsize,
    reusable_lock: AtomicBool,
    empty: AtomicUsize,
    empty_lock: AtomicBool,
    allocs: AtomicU64,
    frees: AtomicU64,
}

impl ClassState {
    const fn new() -> Self {
        ClassState {
            bump: AtomicUsize::new(0),
            reusable: AtomicUsize::new(0),
            reusable_lock: AtomicBool::new(false),
            empty: AtomicUsize::new(0),
            empty_lock: AtomicBool::new(false),
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
        }
    }
}

static CLASS: [ClassState; CLASSES] = [const { ClassState::new() }; CLASSES];
/// Bytes of empty arenas kept resident.
static RESIDENT_EMPTY: AtomicUsize = AtomicUsize::new(0);
static LAST_TRIM_MS: AtomicU64 = AtomicU64::new(0);
mod remote;
mod thread;
mod trim;

use remote::{adopt, collect, detach, free_remote};
use thread::{flush_class, register_thread};
pub use thread::{flush_counters, on_region_ready, release_thread};
pub use trim::{class_counters, class_resident_bytes, resident_empty_bytes, trim};
use trim::{maybe_trim, release_resident, retire_own_empties, trim_reusable};

static THREAD_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);

#[inline(always)]
fn header(arena: usize) -> *mut ArenaHeader {
    arena as *mut ArenaHeader
}

#[inline(always)]
fn bitmap_word(arena: usize, word: usize) -> *mut u64 {
    (arena + HEADER_FIXED + word * 8) as *mut u64
}

/// Allocates one object of class `c` for the thread owning `tbl`.
///
/// # Safety
/// `tbl` is the calling thread's table and `c < CLASSES`.
#[inline(always)]
pub unsafe fn alloc(tbl: *mut ThreadTable, c: usize) -> Block {
    // SAFETY: `c < CLASSES` (caller); table entries are offsets of live arenas or zero, and
    // arena memory is ours for the life of the process.
    unsafe {
        let arena = sentinel(tbl).wrapping_add(*(*tbl).cur.get_unchecked(c));
        let h = header(arena);
        let wi = (*h).hint as usize;
        let word = bitmap_word(arena, wi);
        let w = *word;
        if w == u64::MAX {
            return alloc_slow(tbl, c);
        }
        let bit = (!w).trailing_zeros() as usize;
        let idx = (wi * 64 + bit) as u32;
        if idx >= (*h).hwm {
            return alloc_fresh(tbl, c);
        }
        *word = w | (1u64 << bit);
        (*h).used += 1;
        let count = (*tbl).allocs.get_unchecked_mut(c);
        *count = count.wrapping_add(1);
        Block {
            ptr: (arena + idx as usize * (*h).size as usize) as *mut u8,
            fresh: false,
        }
    }
}

/// The lowest free slot of the current arena has never been handed out. Before it touches a
/// new page, prefer memory that is already resident: frees other threads sent back to this
/// arena, then an arena of the class queued for reuse. Only then touch the fresh page. This is
/// what keeps RSS at the live set when a class has a half-used current arena and reusable ones
/// (each would otherwise be filled to the end), and a producer from filling whole arenas before
/// it looks at what its consumers freed.
#[cold]
#[inline(never)]
unsafe fn alloc_fresh(tbl: *mut ThreadTable, c: usize) -> Block {
    // SAFETY: the current arena of class `c` is a real arena owned by this thread (the empty
    // sentinel never gets here: its only word is full).
    unsafe {
        let arena = sentinel(tbl).wrapping_add((*tbl).cur[c]);
        let h = header(arena);
        let size = (*h).size as usize;
        let touched_end = ((*h).hwm as usize * size).next_multiple_of(PAGE);
        let next_end = ((*h).hwm as usize + 1) * size;
        if next_end > touched_end {
            if (*h).remote.load(Relaxed) & LIST != 0 {
                collect(arena);
                return counted(tbl, c, take_scanning(arena));
            }
            // A partial arena of ours with a hole in touched memory.
            let mut p = (*tbl).partial[c];
            for _ in 0..4 {
                if p == 0 {
                    break;
                }
                if lowest_free(p).is_some_and(|idx| idx < (*header(p)).hwm) {
                    list_remove(tbl, c, PARTIAL, p);
                    return switch_current(tbl, c, arena, p);
                }
                p = (*header(p)).local_next;
            }
            let class = &CLASS[c];
            // An arena other threads queued for reuse.
            if class.reusable.load(Relaxed) != 0 {
                if let Some(other) = pop(&class.reusable, &class.reusable_lock) {
                    adopt(other, tbl as usize);
                    return switch_current(tbl, c, arena, other);
                }
            }
            // An empty arena of the class whose pages are still resident.
            if class.empty.load(Relaxed) != 0 {
                if let Some(other) = pop(&class.empty, &class.empty_lock) {
                    if (*header(other)).resident == 1 {
                        take_empty(other, tbl as usize);
                        return switch_current(tbl, c, arena, other);
                    }
                    push(&class.empty, header(other));
                }
            }
        }
        let b = counted(tbl, c, take_scanning(arena));
        // The rest of the slots in pages now touched take the fast path: it treats them as
        // used before (calloc clears them), so this runs once per page, not once per slot.
        let touched = ((*h).hwm as usize * size).next_multiple_of(PAGE);
        (*h).hwm = (*h).hwm.max((touched / size) as u32);
        b
    }
}

/// Parks the current arena (it has room, in its fresh tail) on the partial list and makes
/// `next`, which this thread owns, current.
unsafe fn switch_current(tbl: *mut ThreadTable, c: usize, current: usize, next: usize) -> Block {
    // SAFETY: both arenas are owned by the calling thread.
    unsafe {
        list_push(tbl, c, PARTIAL, current);
        make_current(tbl, c, next);
        counted(tbl, c, take_scanning(next))
    }
}

unsafe fn make_current(tbl: *mut ThreadTable, c: usize, arena: usize) {
    // SAFETY: the calling thread's table and an arena it owns.
    unsafe {
        (*header(arena)).state = CURRENT;
        (*tbl).cur[c] = arena.wrapping_sub(sentinel(tbl));
    }
}

/// Counts a slow-path allocation.
unsafe fn counted(tbl: *mut ThreadTable, c: usize, b: Option<Block>) -> Block {
    match b {
        // SAFETY: the calling thread's table.
        Some(b) => unsafe {
            (*tbl).allocs[c] = (*tbl).allocs[c].wrapping_add(1);
            b
        },
        None => os::fatal(b"internal error: an arena with a free slot has none"),
    }
}

/// Frees a pointer inside the region.
///
/// # Safety
/// `p` is in the region and `tbl` is the calling thread's table.
#[inline(always)]
pub unsafe fn free(tbl: *mut ThreadTable, p: usize) {
    let arena = p & !(ARENA_BYTES - 1);
    let h = header(arena);
    // SAFETY: every region address below a bumped arena's end lies in an initialised arena;
    // a foreign pointer fails the checks in `clear_bit` before anything is written.
    unsafe {
        if (*h).owner.load(Relaxed) != tbl as usize {
            return free_remote(h, p);
        }
        clear_bit(arena, p);
        let count = (*tbl).frees.get_unchecked_mut((*h).class as usize);
        *count = count.wrapping_add(1);
        if (*h).state == FULL {
            unfull(tbl, arena);
        }
    }
}

/// A free made room in one of this thread's full arenas: move it to the partial list.
#[cold]
#[inline(never)]
unsafe fn unfull(tbl: *mut ThreadTable, arena: usize) {
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

/// Pushes an owned arena onto the front of its owner's full or partial list.
unsafe fn list_push(tbl: *mut ThreadTable, c: usize, state: u32, arena: usize) {
    // SAFETY: owner-only fields of arenas the calling thread owns.
    unsafe {
        let head = list_head(tbl, c, state);
        let h = header(arena);
        (*h).state = state;
        (*h).local_prev = 0;
        (*h).local_next = *head;
        if *head != 0 {
            (*header(*head)).local_prev = arena;
        }
        *head = arena;
    }
}

/// Unlinks an owned arena from the list its state names.
unsafe fn list_remove(tbl: *mut ThreadTable, c: usize, state: u32, arena: usize) {
    // SAFETY: owner-only fields of arenas the calling thread owns.
    unsafe {
        let head = list_head(tbl, c, state);
        let h = header(arena);
        let (prev, next) = ((*h).local_prev, (*h).local_next);
        if prev != 0 {
            (*header(prev)).local_next = next;
        } else {
            *head = next;
        }
        if next != 0 {
            (*header(next)).local_prev = prev;
        }
        if state == FULL && (*tbl).full_cursor[c] == arena {
            (*tbl).full_cursor[c] = next;
        }
        (*h).state = UNLISTED;
        (*h).local_next = 0;
        (*h).local_prev = 0;
    }
}

/// Lowest free slot of an owned arena, without taking it.
unsafe fn lowest_free(arena: usize) -> Option<u32> {
    let h = header(arena);
    // SAFETY: the caller owns the arena.
    unsafe {
        for wi in (*h).hint..(*h).words {
            let w = *bitmap_word(arena, wi as usize);
            if w != u64::MAX {
                return Some(wi * 64 + (!w).trailing_zeros());
            }
        }
    }
    None
}

/// One of this thread's own arenas of class `c` with room: the partial list first, then a few
/// full arenas (round robin) that other threads have freed into.
unsafe fn take_owned(tbl: *mut ThreadTable, c: usize) -> Option<usize> {
    // SAFETY: the calling thread's table and arenas.
    unsafe {
        let p = (*tbl).partial[c];
        if p != 0 {
            list_remove(tbl, c, PARTIAL, p);
            return Some(p);
        }
        for _ in 0..8 {
            let mut f = (*tbl).full_cursor[c];
            if f == 0 {
                f = (*tbl).full[c];
                if f == 0 {
                    return None;
                }
            }
            (*tbl).full_cursor[c] = (*header(f)).local_next;
            if (*header(f)).remote.load(Relaxed) & LIST != 0 {
                collect(f);
                if (*header(f)).used < (*header(f)).capacity {
                    list_remove(tbl, c, FULL, f);
                    return Some(f);
                }
            }
        }
        None
    }
}

/// Usable bytes of a region pointer.
///
/// # Safety
/// `p` is a live allocation in the region.
#[inline]
pub unsafe fn usable_size(p: usize) -> usize {
    // SAFETY: guaranteed by the caller.
    unsafe { (*header(p & !(ARENA_BYTES - 1))).size as usize }
}

/// Marks `p`'s slot free in the bitmap of the arena at `arena`, which the caller owns.
#[inline(always)]
unsafe fn clear_bit(arena: usize, p: usize) {
    let h = header(arena);
    // SAFETY: the caller owns the arena, so nobody else writes its bitmap or counters.
    unsafe {
        let off = p - arena;
        let idx = ((off as u64 * (*h).recip as u64) >> 32) as usize;
        let wi = idx >> 6;
        let bit = 1u64 << (idx & 63);
        if idx * (*h).size as usize != off || idx < (*h).first_slot as usize {
            invalid_free();
        }
        let word = bitmap_word(arena, wi);
        let w = *word;
        if w & bit == 0 {
            double_free();
        }
        *word = w & !bit;
        (*h).used -= 1;
        if (wi as u32) < (*h).hint {
            (*h).hint = wi as u32;
        }
    }
}

// Out of line and argument-free, so the fast path does not set up their messages.
#[cold]
#[inline(never)]
fn invalid_free() -> ! {
    os::fatal(b"free(): invalid pointer (not the start of an allocation)")
}

#[cold]
#[inline(never)]
fn double_free() -> ! {
    os::fatal(b"free(): double free detected")
}

/// Takes the lowest free slot at or after the hint; `None` when the arena is full.
unsafe fn take_scanning(arena: usize) -> Option<Block> {
    let h = header(arena);
    // SAFETY: the caller owns the arena.
    unsafe {
        let words = (*h).words;
        let mut wi = (*h).hint;
        while wi < words {
            let word = bitmap_word(arena, wi as usize);
            let w = *word;
            if w != u64::MAX {
                let bit = (!w).trailing_zeros();
                *word = w | (1u64 << bit);
                (*h).hint = wi;
                (*h).used += 1;
                let idx = wi * 64 + bit;
                let fresh = idx >= (*h).hwm;
                if fresh {
                    (*h).hwm = idx + 1;
                }
                return Some(Block {
                    ptr: (arena + idx as usize * (*h).size as usize) as *mut u8,
                    fresh,
                });
            }
            wi += 1;
        }
        // Park the hint on a full word so the fast path misses until a free lowers it.
        (*h).hint = words - 1;
        None
    }
}

/// Moves an arena with no live objects to its class's empty stack, giving its pages back to the
/// OS once more than `RETAIN_BYTES` of empty arenas are resident.
unsafe fn retire_empty(arena: usize) {
    let h = header(arena);
    // SAFETY: the arena has no live objects and we own it.
    unsafe {
        let c = (*h).class as usize;
        (*h).owner.store(0, Relaxed);
        (*h).hint = first_slot(c) as u32 / 64;
        let kept = RESIDENT_EMPTY.fetch_add(ARENA_BYTES, Relaxed) + ARENA_BYTES;
        if kept <= RETAIN_BYTES.load(Relaxed) {
            (*h).resident = 1;
        } else {
            RESIDENT_EMPTY.fetch_sub(ARENA_BYTES, Relaxed);
            (region::source().discard)(arena + PAGE, ARENA_BYTES - PAGE);
            (*h).resident = 0;
            (*h).hwm = slots_in_header_page(c) as u32;
        }
        push(&CLASS[c].empty, h);
    }
}

/// Prepares a never-used arena (its memory reads as zero).
unsafe fn init_fresh(arena: usize, c: usize, tbl: usize) {
    let h = header(arena);
    let first = first_slot(c);
    // SAFETY: the arena was just bumped out of the class span: ours alone, zero-filled.
    unsafe {
        (*h).size = class_size(c) as u32;
        (*h).recip = reciprocal(c);
        (*h).class = c as u32;
        (*h).words = bitmap_words(c) as u32;
        (*h).first_slot = first as u32;
        (*h).capacity = capacity(c) as u32;
        (*h).hint = (first / 64) as u32;
        (*h).hwm = first as u32;
        // Header slots and the tail beyond the last whole slot are permanently "allocated".
        for idx in (0..first).chain(slots(c)..bitmap_words(c) * 64) {
            *bitmap_word(arena, idx / 64) |= 1u64 << (idx % 64);
        }
        (*h).owner.store(tbl, Relaxed);
    }
}

fn push(stack: &AtomicUsize, h: *mut ArenaHeader) {
    let mut old = stack.load(Relaxed);
    loop {
        // SAFETY: `h` is an arena we hold exclusively until the CAS publishes it.
        unsafe { (*h).next.store(old, Relaxed) };
        match stack.compare_exchange_weak(old, h as usize, Release, Relaxed) {
            Ok(_) => return,
            Err(now) => old = now,
        }
    }
}

fn pop(stack: &AtomicUsize, lock: &AtomicBool) -> Option<usize> {
    if lock.swap(true, Acquire) {
        return None;
    }
    let mut top = stack.load(Acquire);
    let popped = loop {
        if top == 0 {
            break None;
        }
        // SAFETY: `top` is on the stack, so it is an initialised arena; only we pop.
        let next = unsafe { (*header(top)).next.load(Relaxed) };
        match stack.compare_exchange_weak(top, next, Acquire, Acquire) {
            Ok(_) => break Some(top),
            Err(now) => top = now,
        }
    };
    lock.store(false, Release);
    popped
}

/// Finds a new current arena for class `c`: reusable first, then empty, then a fresh one.
unsafe fn acquire(c: usize, tbl: usize) -> Option<usize> {
    let class = &CLASS[c];
    if let Some(arena) = pop(&class.reusable, &class.reusable_lock) {
        // SAFETY: popped, so ours.
        unsafe { adopt(arena, tbl) };
        return Some(arena);
    }
    if let Some(arena) = pop(&class.empty, &class.empty_lock) {
        // SAFETY: popped, so ours.
        unsafe {
            if (*header(arena)).resident == 0 {
                // Its pages were given back: taking it grows RSS like a new arena.
                offset_new_arena(tbl);
            }
            take_empty(arena, tbl);
        }
        return Some(arena);
    }
    offset_new_arena(tbl);
    let (span_start, span_len) = region::class_span(c);
    let offset = class.bump.fetch_add(ARENA_BYTES, Relaxed);
    if offset + ARENA_BYTES > span_len {
        return None;
    }
    let arena = span_start + offset;
    // SAFETY: fresh from the bump pointer.
    unsafe { init_fresh(arena, c, tbl) };
    Some(arena)
}

/// Takes ownership of an arena popped from the empty stack.
unsafe fn take_empty(arena: usize, tbl: usize) {
    let h = header(arena);
    // SAFETY: popping gave us the arena exclusively.
    unsafe {
        if (*h).resident == 1 {
            RESIDENT_EMPTY.fetch_sub(ARENA_BYTES, Relaxed);
            (*h).resident = 0;
        }
        (*h).owner.store(tbl, Relaxed);
    }
}

/// A class is about to take a never-used arena, whose pages will add to RSS: give back the
/// pages of one empty arena of any class first. Size classes keep their arenas apart, so
/// without this the peak RSS of a phased program would be the sum of every class's own peak
/// rather than the peak of the sum. Empty arenas still queued for reuse are retired first.
fn offset_new_arena(me: usize) {
    if RESIDENT_EMPTY.load(Relaxed) < ARENA_BYTES {
        // SAFETY: `me` is the calling thread's table.
        if unsafe { retire_own_empties(me as *mut ThreadTable, 1) } == 0 {
            for class in CLASS.iter() {
                trim_reusable(class, me);
            }
        }
    }
    if RESIDENT_EMPTY.load(Relaxed) < ARENA_BYTES {
        return;
    }
    for class in CLASS.iter() {
        if class.empty.load(Relaxed) != 0 && release_resident(class, 1) > 0 {
            return;
        }
    }
}

/// Gives back the pages of a resident empty arena we hold, past its header page.
unsafe fn release_pages(arena: usize) {
    let h = header(arena);
    // SAFETY: the caller holds the arena, which has no live objects.
    unsafe {
        RESIDENT_EMPTY.fetch_sub(ARENA_BYTES, Relaxed);
        (region::source().discard)(arena + PAGE, ARENA_BYTES - PAGE);
        (*h).resident = 0;
        (*h).hwm = slots_in_header_page((*h).class as usize) as u32;
    }
}

/// The slow path: the current arena's hint word is full.
#[cold]
#[inline(never)]
unsafe fn alloc_slow(tbl: *mut ThreadTable, c: usize) -> Block {
    // SAFETY: as `refill`; the table is the calling thread's.
    unsafe {
        let b = refill(tbl, c);
        if !b.ptr.is_null() {
            (*tbl).allocs[c] = (*tbl).allocs[c].wrapping_add(1);
        }
        b
    }
}

/// Finds room in class `c`: further along the current arena, in frees other threads sent
/// back, or in another arena.
unsafe fn refill(tbl: *mut ThreadTable, c: usize) -> Block {
    // SAFETY: the calling thread's table.
    if unsafe { (*tbl).unpaged } != 0 {
        // Aligned as the class is, so that aligned requests served by it stay aligned.
        let size = class_size(c);
        return crate::large::alloc(size, 1 << size.trailing_zeros());
    }
    if !region::ensure_init(on_region_ready) {
        os::set_errno(libc::ENOMEM);
        return Block::NULL_BLOCK;
    }
    // SAFETY: `tbl` is the calling thread's table; arenas it names are owned by this thread.
    unsafe {
        let me = tbl as usize;
        let current = sentinel(tbl).wrapping_add((*tbl).cur[c]);
        if current != sentinel(tbl) {
            // The common case, once per 64 slots: the next bitmap word has room.
            loop {
                if let Some(b) = take_scanning(current) {
                    return b;
                }
                if collect(current) == 0 {
                    break;
                }
            }
            // Full: it stays ours, on the full list, so our own frees into it stay local.
            (*tbl).cur[c] = 0;
            list_push(tbl, c, FULL, current);
        }
        if (*tbl).registered == 0 {
            register_thread(tbl);
        }
        flush_class(tbl, c);
        maybe_trim(tbl);
        let arena = match take_owned(tbl, c) {
            Some(a) => a,
            None => match acquire(c, me) {
                Some(a) => a,
                // The class's span is exhausted: serve this one from the large-object path.
                None => return crate::large::alloc(class_size(c), 16),
            },
        };
        make_current(tbl, c, arena);
        match take_scanning(arena) {
            Some(b) => b,
            None => os::fatal(b"internal error: a newly acquired arena is full"),
        }
    }
}
