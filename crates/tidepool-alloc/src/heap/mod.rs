//! Arenas, the per-thread arena table, and the paths between them.
//!
//! # The fast paths
//!
//! A thread's table holds, per class, its current arena and that arena's free list (Memento's
//! object table, caching the arena header's allocation state). `malloc` pops the list: one load
//! from the table, one from the slot. `free` finds the arena one mask away from the pointer and
//! its class from the pointer's offset in the region, reads the header's owner, and if it is
//! the calling thread (and the arena is not full) pushes the object: onto the table's list if
//! the arena is current, onto the header's list if not, picked without a branch. Everything
//! else is the slow path.
//!
//! # Arena states
//!
//! * **Owned** by one thread (its `owner` is that thread's table): the thread's *current* arena
//!   of the class, or on its *full* or *partial* list (links in the headers). Only the owner
//!   touches the free lists, `used`, the carving fields and the list links, with plain loads and
//!   stores, so its own frees into any of its arenas are plain pushes. Other threads free by
//!   pushing the object onto the arena's lock-free `remote` list; the owner takes that list
//!   ("collects") when it needs room.
//! * **Detached**: its owner exited. `owner` is zero, so every free goes through `remote`. The
//!   first free into it sets `QUEUED` and pushes the arena onto its class's *reusable* stack, so
//!   the next thread that needs an arena of the class takes it over and frees into it become
//!   local again (a thread that inherits another's objects, as larson's do, is usually that
//!   thread).
//! * **Reusable** (detached and queued): waiting to be adopted by any thread that needs an arena
//!   of the class; adoption takes the remote list and clears both flags in one swap.
//! * **Empty** (on its class's *empty* stack): no live objects. Up to `RETAIN_BYTES` of empty
//!   arenas stay resident; beyond that their pages past the header are given back to the OS, so
//!   RSS follows the live set.
//!
//! Slots are handed out from a free list, or *carved* from the never-used tail of the arena one
//! page at a time (Memento's lazy population): before a carve touches a new page, resident
//! memory is preferred (frees other threads sent back, a partial arena, a reusable or resident
//! empty one). Slots at or above `zero_from` have not been handed out since their pages were
//! last zero, so calloc skips clearing them.
//!
//! `remote` packs the list head (objects are 16-byte aligned), the uncollected count and the
//! `DETACHED` and `QUEUED` flags, so the exiting owner's detach (empty list, no flags ->
//! `DETACHED`), a free's push, its count and its decision to queue all hinge on one
//! compare-and-swap.
//!
//! # Stacks
//!
//! Both per-class stacks are Treiber stacks: pushes are lock-free from any thread; pops take a
//! per-class try-lock, which makes the single popper immune to ABA. A busy lock is skipped, never
//! waited on, so no malloc ever blocks on another thread.

use crate::block::Block;
use crate::classes::{
    bitmap_words, class_size, first_slot, header_offset, slots, ARENA_BYTES, CLASSES, PAGE,
};
use crate::os;
use crate::region::{self, RETAIN_BYTES};
use crate::tls::ThreadTable;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

const DETACHED: usize = 1;
const QUEUED: usize = 2;
const FLAGS: usize = DETACHED | QUEUED;
/// Remote-list head bits: objects are 16-byte aligned and user addresses fit in 47 bits.
const LIST: usize = 0x0000_ffff_ffff_fff0;
/// Uncollected remote frees, in the top 16 bits (an arena has at most 16 384 slots).
const COUNT_SHIFT: u32 = 48;

/// An arena's header, [`header_offset`] bytes into it; the debug bitmap follows.
#[repr(C)]
#[derive(Debug)]
pub struct ArenaHeader {
    // First cache line: the owner's.
    /// Free slots, while the arena is not current (a current arena's list is in the table).
    free: usize,
    /// Next never-carved slot.
    bump: usize,
    /// End of the last whole slot.
    end: usize,
    /// Slots at or above this address read as zero.
    zero_from: usize,
    /// Objects handed out and not collected back; exact only while the arena is not current.
    used: u32,
    size: u32,
    class: u32,
    /// Where its owner keeps it: [`CURRENT`], [`FULL`], [`PARTIAL`] or [`UNLISTED`].
    state: u32,
    /// Address of the owning thread's table (plus [`FULL_TAG`] while on its full list); zero
    /// when detached, [`DEBUG_OWNER`] in debug mode.
    owner: AtomicUsize,
    /// Links in the owner's full or partial list of the class.
    local_next: usize,
    // Second cache line: shared with freeing threads.
    /// Uncollected remote frees (top 16 bits) | list head | `DETACHED` | `QUEUED`.
    remote: AtomicUsize,
    /// On the empty stack with its pages still resident (counted in `RESIDENT_EMPTY`): the trim
    /// tick it was retired in, plus one. Zero: not resident.
    resident: u32,
    /// Link in the reusable or empty stack.
    next: AtomicUsize,
    local_prev: usize,
    /// End of the pages carving has touched.
    touched: usize,
    /// Slots carved since the arena was last empty.
    carved: u32,
    /// Unused: keeps the header at two cache lines (slot geometry comes from the class).
    _reserved: [u32; 3],
    /// Debug mode: lowest bitmap word that may have a free bit, and the bitmap's length.
    hint: u32,
    words: u32,
}

/// Not in any of its owner's lists (detached, on a stack, or being moved).
const UNLISTED: u32 = 0;
/// Its owner's current arena of the class.
const CURRENT: u32 = 1;
/// Owned, full when last looked at, on the owner's full list.
const FULL: u32 = 2;
/// Owned, with free slots, on the owner's partial list.
const PARTIAL: u32 = 3;

/// Added to the owner's address while the arena is on its full list, so that a free into it
/// fails the fast path's owner test (tables are 64-byte aligned, so the bit is free).
const FULL_TAG: usize = 2;

/// The owner of every arena in debug mode: no thread's table, so every free takes the path
/// that checks it.
const DEBUG_OWNER: usize = 1;

const _: () = assert!(core::mem::size_of::<ArenaHeader>() == crate::classes::HEADER_FIXED);

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
    /// Objects other threads freed into the class's arenas (collected).
    remote_frees: AtomicU64,
}

impl ClassState {
    const fn new() -> Self {
        ClassState {
            bump: AtomicUsize::new(0),
            reusable: AtomicUsize::new(0),
            reusable_lock: AtomicBool::new(false),
            empty: AtomicUsize::new(0),
            empty_lock: AtomicBool::new(false),
            remote_frees: AtomicU64::new(0),
        }
    }
}

static CLASS: [ClassState; CLASSES] = [const { ClassState::new() }; CLASSES];
/// Bytes of empty arenas kept resident.
static RESIDENT_EMPTY: AtomicUsize = AtomicUsize::new(0);
static LAST_TRIM_MS: AtomicU64 = AtomicU64::new(0);
use region::TRIM_TICK;
mod debug;
mod lists;
mod remote;
mod thread;
mod trim;

use lists::{list_push, list_remove, take_freed_into, take_owned, unfull};
use remote::{adopt, free_remote, take_remote};
use thread::register_thread;
pub use thread::{on_region_ready, release_thread, set_aside, set_back};
pub use trim::{class_counters, class_resident_bytes, resident_empty_bytes, tick, trim};
use trim::{maybe_trim, release_resident, retire_own_empties, trim_reusable};

static THREAD_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The header of class `c`'s arena at `arena`.
#[inline(always)]
fn header_in(arena: usize, c: usize) -> *mut ArenaHeader {
    (arena + header_offset(c)) as *mut ArenaHeader
}

/// The header of the arena at `arena`, its class read off its address.
#[inline]
fn header(arena: usize) -> *mut ArenaHeader {
    header_in(arena, region::class_index(arena))
}

/// The arena holding region pointer `p`.
#[inline(always)]
fn arena_of(p: usize) -> usize {
    p & !(ARENA_BYTES - 1)
}

/// Allocates one object of class `c` for the thread owning `tbl`.
///
/// # Safety
/// `tbl` is the calling thread's table and `c < CLASSES`.
#[inline(always)]
pub unsafe fn alloc(tbl: *mut ThreadTable, c: usize) -> Block {
    // SAFETY: `c < CLASSES` (caller); a non-zero list head is a free slot of the thread's
    // current arena, whose first word links the next.
    unsafe {
        let hot = (*tbl).hot.get_unchecked_mut(c);
        let p = hot.free;
        if p == 0 {
            return alloc_slow(tbl, c);
        }
        hot.free = *(p as *const usize);
        Block {
            ptr: p as *mut u8,
            fresh: false,
        }
    }
}

/// Frees a pointer inside the class spans; `c` is its class.
///
/// A free into any arena this thread owns and has not filled takes the same path, with one
/// branch that depends on the program's data (the owner test, which a thread's own frees pass):
/// the object goes onto the table's list if the arena is current, onto its header's list if
/// not, chosen without a branch. Testing "is it the current arena?" with a branch, as this path
/// once did, mispredicted on about a third of larson's frees, whose victims are random.
///
/// # Safety
/// `p` is a live allocation of class `c` and `tbl` is the calling thread's table.
#[inline(always)]
pub unsafe fn free(tbl: *mut ThreadTable, p: usize, c: usize) {
    // SAFETY: `c < CLASSES`; per the caller `p` is dead from now on, so its first word may
    // carry the list link; an owner equal to our table means we own the arena and it is
    // current or partial (a full one carries `FULL_TAG`), so both lists are ours.
    unsafe {
        let arena = arena_of(p);
        let h = header_in(arena, c);
        if (*h).owner.load(Relaxed) != tbl as usize {
            return free_other(tbl, p, c);
        }
        let hot = (*tbl).hot.get_unchecked_mut(c);
        let list = select(
            hot.arena == arena,
            &raw mut hot.free as usize,
            &raw mut (*h).free as usize,
        ) as *mut usize;
        *(p as *mut usize) = *list;
        *list = p;
        // Exact for a partial arena; a current one's `used` is settled by `swap_out`, and
        // reaching zero on the way only costs `freed_last` a look at its state.
        (*h).used = (*h).used.wrapping_sub(1);
        if (*h).used == 0 {
            freed_last(tbl, arena, c);
        }
    }
}

/// `if cond { a } else { b }` without a branch: the condition is data the predictor can't
/// learn (whether a random victim lies in the current arena).
#[inline(always)]
fn select(cond: bool, a: usize, b: usize) -> usize {
    let mask = (cond as usize).wrapping_neg();
    b ^ ((a ^ b) & mask)
}

/// A free into an arena that is not the thread's current one of the class.
#[inline(never)]
unsafe fn free_other(tbl: *mut ThreadTable, p: usize, c: usize) {
    let arena = arena_of(p);
    let h = header_in(arena, c);
    // SAFETY: every region address below a bumped arena's end lies in an initialised arena.
    unsafe {
        let owner = (*h).owner.load(Relaxed);
        if owner == tbl as usize | FULL_TAG {
            // One of our full arenas: it has room again.
            *(p as *mut usize) = (*h).free;
            (*h).free = p;
            (*h).used -= 1;
            unfull(tbl, arena);
            if (*h).used == 0 {
                retire_partial(tbl, arena, c);
            }
            return;
        }
        if owner == tbl as usize {
            // Not reached from `free`, which took this case; `free_unregistered` comes here
            // for any arena, and an arena of our own takes the fast path's push.
            return free(tbl, p, c);
        }
        if owner == DEBUG_OWNER {
            return debug::free(arena, p);
        }
        free_remote(h, p)
    }
}

/// An owned arena's `used` reached zero on a free: a partial arena goes to the empty stack; a
/// current one stays (its count is not exact while current).
#[cold]
#[inline(never)]
unsafe fn freed_last(tbl: *mut ThreadTable, arena: usize, c: usize) {
    // SAFETY: the calling thread owns the arena.
    unsafe {
        if (*header_in(arena, c)).state == PARTIAL {
            retire_partial(tbl, arena, c);
        }
    }
}

/// A partial arena of ours lost its last object: it goes to the empty stack now, for any
/// thread's use (a thread that took over an exited one's arenas would otherwise sit on them).
#[cold]
#[inline(never)]
unsafe fn retire_partial(tbl: *mut ThreadTable, arena: usize, c: usize) {
    // SAFETY: the calling thread owns the arena, on its partial list, with no live objects.
    unsafe {
        list_remove(tbl, c, PARTIAL, arena);
        retire_empty(arena);
    }
}

/// Usable bytes of a region pointer.
///
/// # Safety
/// `p` is a live allocation in the region.
#[inline]
pub unsafe fn usable_size(p: usize) -> usize {
    // SAFETY: guaranteed by the caller.
    unsafe { (*header(arena_of(p))).size as usize }
}

/// The slow path: the current arena of class `c` has no free slot in the table.
#[cold]
#[inline(never)]
unsafe fn alloc_slow(tbl: *mut ThreadTable, c: usize) -> Block {
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
    if region::debug() {
        // SAFETY: the calling thread's table.
        return unsafe { debug::alloc(tbl, c) };
    }
    // SAFETY: `tbl` is the calling thread's table; arenas it names are owned by this thread.
    unsafe {
        // The clock is read once every 64 slow paths: often enough for a 50 ms period.
        (*tbl).refills = (*tbl).refills.wrapping_add(1);
        if (*tbl).refills.is_multiple_of(64) {
            maybe_trim(tbl);
        }
        let current = (*tbl).hot[c].arena;
        if current != 0 {
            if let Some(b) = refill_current(tbl, c, current) {
                return b;
            }
            // Full: it stays ours, on the full list, so our own frees into it stay local.
            swap_out(tbl, c);
            list_push(tbl, c, FULL, current);
        }
        if (*tbl).registered == 0 {
            register_thread(tbl);
        }
        let arena = match take_owned(tbl, c) {
            Some(a) => a,
            None => match acquire(c, tbl as usize) {
                Some(a) => a,
                // The class's span is exhausted: serve this one from the large-object path.
                None => return crate::large::alloc(class_size(c), 16),
            },
        };
        make_current(tbl, c, arena);
        match refill_current(tbl, c, arena) {
            Some(b) => b,
            None => os::fatal(b"internal error: a newly acquired arena is full"),
        }
    }
}

/// Finds room in the current arena of class `c` (whose table list is empty): frees other
/// threads sent back, then the never-used tail. Before carving touches a new page, memory that
/// is already resident elsewhere is preferred: a partial arena of ours with free slots, an arena
/// queued for reuse, a resident empty one (the current arena then waits on the partial list).
/// This is what keeps RSS at the live set when a class has a half-used current arena and others
/// with room, and keeps a producer from filling whole arenas before it looks at what its
/// consumers freed. `None`: the arena is full.
unsafe fn refill_current(tbl: *mut ThreadTable, c: usize, arena: usize) -> Option<Block> {
    let h = header_in(arena, c);
    // SAFETY: the calling thread owns `arena`, its current arena of class `c`.
    unsafe {
        let hot = &mut (*tbl).hot[c];
        if hot.free == 0 {
            hot.free = take_remote(h);
        }
        if hot.free != 0 {
            let p = hot.free;
            hot.free = *(p as *const usize);
            return Some(Block {
                ptr: p as *mut u8,
                fresh: false,
            });
        }
        if (*h).bump >= (*h).end {
            return None;
        }
        if (*h).bump + (*h).size as usize > (*h).touched {
            if let Some(other) = resident_elsewhere(tbl, c) {
                swap_out(tbl, c);
                list_push(tbl, c, PARTIAL, arena);
                make_current(tbl, c, other);
                return refill_current(tbl, c, other);
            }
        }
        Some(carve(tbl, c, h))
    }
}

/// An arena of class `c` with room in memory already resident, taken for the calling thread.
unsafe fn resident_elsewhere(tbl: *mut ThreadTable, c: usize) -> Option<usize> {
    // SAFETY: the calling thread's table and arenas; popped arenas are ours.
    unsafe {
        // A partial arena of ours with free slots.
        let mut p = (*tbl).partial[c];
        for _ in 0..4 {
            if p == 0 {
                break;
            }
            let ph = header_in(p, c);
            if (*ph).free != 0 {
                list_remove(tbl, c, PARTIAL, p);
                return Some(p);
            }
            p = (*ph).local_next;
        }
        // A full arena of ours that other threads have freed into (a producer whose consumers
        // free what it made would otherwise keep carving while its old arenas empty out).
        if let Some(f) = take_freed_into(tbl, c, 16) {
            return Some(f);
        }
        let class = &CLASS[c];
        // An arena other threads queued for reuse.
        if class.reusable.load(Relaxed) != 0 {
            if let Some(other) = pop(&class.reusable, &class.reusable_lock) {
                adopt(other, tbl as usize);
                return Some(other);
            }
        }
        // An empty arena of the class whose pages are still resident.
        if class.empty.load(Relaxed) != 0 {
            if let Some(other) = pop(&class.empty, &class.empty_lock) {
                if (*header_in(other, c)).resident != 0 {
                    take_empty(other, tbl as usize);
                    return Some(other);
                }
                push(&class.empty, header_in(other, c));
            }
        }
        None
    }
}

/// Carves the never-used slots up to the end of the next page (at least one) and returns the
/// first; the rest become the table's free list.
unsafe fn carve(tbl: *mut ThreadTable, c: usize, h: *mut ArenaHeader) -> Block {
    // SAFETY: the calling thread owns the arena; slots at or above `bump` are nobody's.
    unsafe {
        let size = (*h).size as usize;
        let start = (*h).bump;
        let limit = (start + size)
            .next_multiple_of(PAGE)
            .max((*h).touched)
            .min((*h).end);
        let n = ((limit - start) / size).max(1);
        let mut slot = start + size;
        let last = start + (n - 1) * size;
        while slot < last {
            *(slot as *mut usize) = slot + size;
            slot += size;
        }
        let hot = &mut (*tbl).hot[c];
        if n > 1 {
            *(last as *mut usize) = 0;
            hot.free = start + size;
        }
        (*h).bump = start + n * size;
        (*h).carved += n as u32;
        (*h).touched = (*h).touched.max((*h).bump.next_multiple_of(PAGE));
        Block {
            ptr: start as *mut u8,
            fresh: start >= (*h).zero_from,
        }
    }
}

/// Makes `arena`, which this thread owns and has on none of its lists, current for class `c`.
unsafe fn make_current(tbl: *mut ThreadTable, c: usize, arena: usize) {
    let h = header_in(arena, c);
    // SAFETY: the calling thread's table and an arena it owns.
    unsafe {
        (*h).state = CURRENT;
        let hot = &mut (*tbl).hot[c];
        hot.arena = arena;
        hot.free = core::mem::take(&mut (*h).free);
    }
}

/// The current arena of class `c` stops being current: its table list goes back to its header
/// and `used` becomes exact again. The caller lists it (or gives it up).
unsafe fn swap_out(tbl: *mut ThreadTable, c: usize) -> usize {
    // SAFETY: the calling thread's table and its current arena.
    unsafe {
        let hot = &mut (*tbl).hot[c];
        let arena = core::mem::take(&mut hot.arena);
        let list = core::mem::take(&mut hot.free);
        let h = header_in(arena, c);
        // The header's own list is empty, unless the arena was set aside and freed into
        // meanwhile (`set_arenas_aside`): both lists are joined and counted. Bounded walks: a
        // list a double free made circular must not hang the thread's exit.
        let own = (*h).free;
        let mut free = 0u32;
        let mut tail = 0;
        let mut node = list;
        while node != 0 && free < (*h).carved {
            free += 1;
            tail = node;
            node = *(node as *const usize);
        }
        node = own;
        while node != 0 && free < (*h).carved {
            free += 1;
            node = *(node as *const usize);
        }
        if tail != 0 {
            *(tail as *mut usize) = own;
            (*h).free = list;
        }
        (*h).used = (*h).carved - free;
        (*h).state = UNLISTED;
        arena
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
        // Start carving from the first slot again: slots already handed out are not zero.
        (*h).zero_from = (*h).zero_from.max((*h).bump);
        (*h).free = 0;
        (*h).bump = arena + first_slot(c) * (*h).size as usize;
        (*h).carved = 0;
        let kept = RESIDENT_EMPTY.fetch_add(ARENA_BYTES, Relaxed) + ARENA_BYTES;
        if kept <= RETAIN_BYTES.load(Relaxed) {
            (*h).resident = TRIM_TICK.load(Relaxed) + 1;
        } else {
            RESIDENT_EMPTY.fetch_sub(ARENA_BYTES, Relaxed);
            discard_body(arena);
        }
        push(&CLASS[c].empty, h);
    }
}

/// Gives back the pages of an empty arena we hold, past its header page; they read as zero
/// again.
unsafe fn discard_body(arena: usize) {
    let h = header(arena);
    // SAFETY: the caller holds the arena, which has no live objects.
    unsafe {
        (region::source().discard)(arena + PAGE, ARENA_BYTES - PAGE);
        (*h).resident = 0;
        (*h).zero_from = arena + PAGE;
        (*h).touched = arena + PAGE;
    }
}

/// Prepares a never-used arena (its memory reads as zero).
unsafe fn init_fresh(arena: usize, c: usize, tbl: usize) {
    let h = header_in(arena, c);
    let first = first_slot(c);
    let size = class_size(c);
    // SAFETY: the arena was just bumped out of the class span: ours alone, zero-filled.
    unsafe {
        (*h).size = size as u32;
        (*h).class = c as u32;
        (*h).words = bitmap_words(c) as u32;
        (*h).bump = arena + first * size;
        (*h).end = arena + slots(c) * size;
        (*h).zero_from = (*h).bump;
        (*h).touched = (h as usize + 1).next_multiple_of(PAGE);
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

/// Pops an arena (the stacks hold headers; this returns the arena's address).
fn pop(stack: &AtomicUsize, lock: &AtomicBool) -> Option<usize> {
    if lock.swap(true, Acquire) {
        return None;
    }
    let mut top = stack.load(Acquire);
    let popped = loop {
        if top == 0 {
            break None;
        }
        // SAFETY: `top` is on the stack, so it is an initialised header; only we pop.
        let next = unsafe { (*(top as *mut ArenaHeader)).next.load(Relaxed) };
        match stack.compare_exchange_weak(top, next, Acquire, Acquire) {
            Ok(_) => break Some(arena_of(top)),
            Err(now) => top = now,
        }
    };
    lock.store(false, Release);
    popped
}

/// Finds a new arena for class `c`: reusable first, then empty, then a fresh one.
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
            if (*header_in(arena, c)).resident == 0 {
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
        if (*h).resident != 0 {
            RESIDENT_EMPTY.fetch_sub(ARENA_BYTES, Relaxed);
            (*h).resident = 0;
        }
        (*h).used = 0;
        (*h).owner.store(tbl, Relaxed);
    }
}

/// A class is about to take a never-used arena, whose pages will add to RSS: give back the
/// pages of one empty arena of any class first. Size classes keep their arenas apart, so
/// without this the peak RSS of a phased program would be the sum of every class's own peak
/// rather than the peak of the sum. Empty arenas still queued for reuse are retired first.
fn offset_new_arena(me: usize) {
    if me > DEBUG_OWNER && RESIDENT_EMPTY.load(Relaxed) < ARENA_BYTES {
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
        if class.empty.load(Relaxed) != 0 && release_resident(class, 1, u32::MAX) > 0 {
            return;
        }
    }
}

/// Gives back the pages of a resident empty arena we hold, past its header page.
unsafe fn release_pages(arena: usize) {
    // SAFETY: the caller holds the arena, which has no live objects.
    unsafe {
        RESIDENT_EMPTY.fetch_sub(ARENA_BYTES, Relaxed);
        discard_body(arena);
    }
}

/// Frees from a thread that has not registered, into any arena. The thread registers, so that
/// its next frees (a consumer that never allocates frees nothing else) take the fast path.
///
/// # Safety
/// `p` is a live allocation in the class spans; `tbl` is the calling thread's table.
#[inline(never)]
pub unsafe fn free_unregistered(tbl: *mut ThreadTable, p: usize) {
    // SAFETY: per the caller; the region exists, since `p` is in it.
    unsafe {
        if (*tbl).registered == 0 {
            register_thread(tbl);
        }
        free_other(tbl, p, region::class_index(p))
    }
}
