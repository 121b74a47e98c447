//! tidepool-alloc: Memento's object allocator, in software.
//!
//! Memento (MICRO 2023) found that serverless functions spend up to a third of their time
//! managing memory: allocations are mostly under 512 bytes, 71% are freed within 16 further
//! allocations, the rest die together at exit, and the kernel's page management costs as much
//! as malloc itself. Its hardware keeps one arena per size class in an on-chip table, allocates
//! from a bitmap, and populates an arena's pages one at a time. This crate does the same with
//! ordinary instructions:
//!
//! * one reserved region, split evenly across size classes ([`classes`]), each class bumping
//!   256 KiB arenas out of its span; pages appear only when the program touches them;
//! * arenas aligned to their size, so a pointer's arena is one mask away (its header one cache
//!   line further per class, so headers of different classes do not share cache sets);
//! * a per-thread table of current arenas and their free lists (the object table) in
//!   initial-exec TLS, starting as zeroes that mean "no free slot", so the fast path has no
//!   initialisation branch: malloc pops the class's list, free of a pointer into the current
//!   arena pushes it, and neither reads an arena header;
//! * never-used slots carved a page at a time (pages appear only when touched), and before a
//!   new page is touched, room already resident is used first;
//! * frees from other threads pushed onto a lock-free list in the arena; full arenas detached
//!   and queued for reuse by whichever thread needs one; empty arenas given back to the OS
//!   beyond a small retained budget, so RSS follows the live set;
//! * objects over 32 KiB on their own mappings, with a small cache of freed ones;
//! * calloc trusts fresh zero pages: a slot never handed out since its pages were last zero is
//!   not cleared again.
//!
//! Two faces: [`TidepoolAlloc`], a Rust `GlobalAlloc`, and `libtidepool_malloc.so` (crate
//! `tidepool-malloc`), the whole C malloc family for LD_PRELOAD. Nothing on an allocation path
//! allocates, formats, logs or panics. `TIDEPOOL_ALLOC_DEBUG=1` turns on debug mode: slots kept
//! in a bitmap under one lock, and a double free or a foreign pointer writes a fixed message and
//! aborts, like glibc.
//!
//! A pager can supply the region's pages through [`PageSource`] before the first allocation.
//!
//! The crate is `no_std` (core and libc only; its unit tests use std), so the preload library
//! built on it can leave std out: see `tidepool-malloc`.

#![cfg_attr(not(test), no_std)]

pub mod api;
mod block;
pub mod classes;
mod heap;
mod large;
mod medium;
mod os;
mod region;
pub mod stats;
mod tls;

pub use os::{fatal, fatal_at};
pub use region::{
    parse_size, region, set_page_source, span_shift, AlreadyInitialized, PageSource, KERNEL_PAGES,
};
pub use stats::{snapshot as stats, ClassStats, Stats};

use core::alloc::{GlobalAlloc, Layout};

/// The allocator as Rust's global allocator:
///
/// ```ignore
/// #[global_allocator]
/// static ALLOC: tidepool_alloc::TidepoolAlloc = tidepool_alloc::TidepoolAlloc;
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct TidepoolAlloc;

// SAFETY: every method returns memory of at least the layout's size and alignment (or null) and
// accepts back exactly what it returned; the arena and large paths never hand out a block twice.
unsafe impl GlobalAlloc for TidepoolAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= 16 {
            api::malloc(layout.size()).cast()
        } else {
            api::aligned_block(layout.align(), layout.size()).ptr
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from `alloc` (GlobalAlloc contract).
        unsafe { api::free(ptr.cast()) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= 16 {
            api::calloc(1, layout.size()).cast()
        } else {
            let b = api::aligned_block(layout.align(), layout.size());
            if !b.ptr.is_null() && !b.fresh {
                // SAFETY: the block holds `layout.size()` writable bytes.
                unsafe { core::ptr::write_bytes(b.ptr, 0, layout.size()) };
            }
            b.ptr
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= 16 {
            // SAFETY: `ptr` came from `alloc`; new_size > 0 (GlobalAlloc contract).
            return unsafe { api::realloc(ptr.cast(), new_size) }.cast();
        }
        let new_layout = Layout::from_size_align(new_size, layout.align());
        let Ok(new_layout) = new_layout else {
            return core::ptr::null_mut();
        };
        // SAFETY: as GlobalAlloc::realloc's contract; the blocks are distinct.
        unsafe {
            let fresh = self.alloc(new_layout);
            if !fresh.is_null() {
                core::ptr::copy_nonoverlapping(ptr, fresh, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            fresh
        }
    }
}

/// Writes per-class statistics to standard error (no allocation).
pub fn print_stats() {
    stats::print();
}

/// Whether `TIDEPOOL_ALLOC_STATS` asked for statistics at exit (read at initialisation).
pub fn stats_requested() -> bool {
    region::STATS_AT_EXIT.load(core::sync::atomic::Ordering::Relaxed) != 0
}

/// Makes the calling thread allocate only from the kernel (`true`) or from the allocator's
/// region and page source again (`false`).
///
/// A pager that supplies the region's pages ([`PageSource`]) must not fault on memory it pages
/// itself: its threads would wait for themselves. Its threads call this first, so whatever
/// allocates on them (glibc's own thread bookkeeping, say) gets memory of its own from the
/// kernel: page-sized and slow, which such rare allocations can afford. Arenas the thread
/// already holds are given up.
pub fn set_thread_unpaged(on: bool) {
    let tbl = tls::table();
    // SAFETY: the calling thread's own table.
    unsafe {
        if on && (*tbl).registered != 0 {
            heap::release_thread(tbl);
        }
        (*tbl).unpaged = on as u32;
    }
}

/// Sets the calling thread's arenas aside (`true`) and makes it unpaged, without touching
/// the arenas' memory; `false` puts them back as they were. For a short stretch during which the
/// paged heap must not be touched at all (a forked child before its pager runs again: giving
/// arenas up would itself touch paged memory). One thread at a time: the arenas are kept in a
/// static, and a forked child has one thread.
pub fn set_arenas_aside(on: bool) {
    use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed};
    static ASIDE: [[AtomicUsize; 2]; classes::CLASSES] =
        [const { [AtomicUsize::new(0), AtomicUsize::new(0)] }; classes::CLASSES];
    static WAS_UNPAGED: AtomicU32 = AtomicU32::new(0);
    let tbl = tls::table();
    // SAFETY: the calling thread's own table; with no current arena named, every allocation
    // falls into the slow path, which sees the thread unpaged.
    unsafe {
        if on {
            for (hot, slot) in heap::set_aside(tbl).iter().zip(ASIDE.iter()) {
                slot[0].store(hot.arena, Relaxed);
                slot[1].store(hot.free, Relaxed);
            }
            WAS_UNPAGED.store((*tbl).unpaged, Relaxed);
            (*tbl).unpaged = 1;
        } else {
            let mut hot = [tls::Hot { arena: 0, free: 0 }; classes::CLASSES];
            for (h, slot) in hot.iter_mut().zip(ASIDE.iter()) {
                h.arena = slot[0].swap(0, Relaxed);
                h.free = slot[1].swap(0, Relaxed);
            }
            heap::set_back(tbl, hot);
            (*tbl).unpaged = WAS_UNPAGED.load(Relaxed);
        }
    }
}

/// Whether the calling thread is unpaged ([`set_thread_unpaged`]).
pub fn thread_unpaged() -> bool {
    tls::unpaged()
}

/// Gives up the calling thread's current arenas now, as its exit would.
pub fn release_thread_arenas() {
    // SAFETY: the calling thread's own table.
    unsafe { heap::release_thread(tls::table()) }
}
