//! Objects larger than the largest size class: one mapping each, from the page source.
//!
//! A 64-byte header just below the returned pointer records the mapping. Freed mappings up to
//! [`CACHE_ENTRY_MAX`] are kept in a small cache (at most [`CACHE_BYTES`] in all) and handed
//! out again, so a program that allocates and frees large buffers in a loop does not pay an
//! mmap, a munmap and a page fault per page each time: Memento's kernel-cost argument.
//! Growing a large object moves its pages with mremap instead of copying them.

use crate::block::Block;
use crate::classes::PAGE;
use crate::os;
use crate::region;
use crate::tls;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

const HEADER: usize = 64;
const MAGIC: u64 = 0x7469_6465_706f_6f6c; // "tidepool"
const CACHE_SLOTS: usize = 32;
const CACHE_ENTRY_MAX: usize = 32 << 20;
const CACHE_BYTES: usize = 128 << 20;

#[repr(C)]
struct LargeHeader {
    magic: u64,
    base: usize,
    map_len: usize,
    /// Non-zero: mapped from the kernel for an unpaged thread, whatever the page source.
    kernel: usize,
}

/// Where the pages of objects allocated by the calling thread come from.
fn thread_source() -> (&'static region::PageSource, bool) {
    if tls::unpaged() {
        (&region::KERNEL_PAGES, true)
    } else {
        (region::source(), false)
    }
}

fn source_of(h: *const LargeHeader) -> &'static region::PageSource {
    // SAFETY: the caller passes a checked header.
    if unsafe { (*h).kernel } != 0 {
        &region::KERNEL_PAGES
    } else {
        region::source()
    }
}

struct CacheSlot {
    base: AtomicUsize,
    len: AtomicUsize,
    /// The heap's trim tick when the mapping was cached: purged a whole tick later.
    tick: AtomicU32,
}

static CACHE: [CacheSlot; CACHE_SLOTS] = [const {
    CacheSlot {
        base: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        tick: AtomicU32::new(0),
    }
}; CACHE_SLOTS];
static CACHE_LOCK: AtomicBool = AtomicBool::new(false);
static CACHED_BYTES: AtomicUsize = AtomicUsize::new(0);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);
static MAPPED: AtomicUsize = AtomicUsize::new(0);

fn round_up(n: usize, to: usize) -> Option<usize> {
    Some(n.checked_add(to - 1)? & !(to - 1))
}

/// Takes the cached mapping that best fits `len` bytes: the smallest at least as large (its
/// tail given back if it is longer than the object), or else the largest at least half as
/// large, grown in place or moved by the page source. Reused pages are resident already: no
/// page faults, which is the point (Memento's kernel-cost finding).
fn cache_take(len: usize) -> Option<(usize, usize)> {
    if CACHED_BYTES.load(Relaxed) == 0 || CACHE_LOCK.swap(true, Acquire) {
        return None;
    }
    let mut fit: Option<(usize, usize)> = None; // (slot, len) smallest >= len
    let mut grow: Option<(usize, usize)> = None; // (slot, len) largest >= len / 2
    for (i, slot) in CACHE.iter().enumerate() {
        let l = slot.len.load(Relaxed);
        if l >= len {
            if fit.is_none_or(|(_, b)| l < b) {
                fit = Some((i, l));
            }
        } else if l >= len / 2 && grow.is_none_or(|(_, b)| l > b) {
            grow = Some((i, l));
        }
    }
    let src = region::source();
    let chosen = fit.or(grow.filter(|_| src.remap_large.is_some()));
    let found = chosen.map(|(i, _)| {
        let base = CACHE[i].base.swap(0, Relaxed);
        let l = CACHE[i].len.swap(0, Relaxed);
        CACHED_BYTES.fetch_sub(l, Relaxed);
        (base, l)
    });
    CACHE_LOCK.store(false, Release);
    let (base, l) = found?;
    // A mapping more than four times the object's size gives its tail back; a smaller one
    // serves it whole, so an object holds at most three times its size in pages that were
    // resident in the cache already. Tails are soon needed again by the next larger object,
    // and a tail given back is faulted in again page by page (figures in ARCHITECTURE.md).
    if l >= len && l / 4 > len {
        // SAFETY: the tail past `len` is part of a whole cached mapping that nobody references.
        unsafe { (src.unmap_large)(base + len, l - len) };
        MAPPED.fetch_sub(l - len, Relaxed);
        return Some((base, len));
    }
    if l < len {
        let remap = src.remap_large?;
        // SAFETY: a whole cached mapping; on success the old range is gone.
        return match unsafe { remap(base, l, len) } {
            Some(new_base) => {
                MAPPED.fetch_add(len - l, Relaxed);
                Some((new_base, len))
            }
            None => {
                MAPPED.fetch_sub(l, Relaxed);
                // SAFETY: still a whole mapping of ours that nobody references.
                unsafe { (src.unmap_large)(base, l) };
                None
            }
        };
    }
    Some((base, l))
}

/// Keeps a freed mapping for reuse; false if the cache is busy or full.
fn cache_put(base: usize, len: usize) -> bool {
    let tick = region::trim_tick();
    if len > CACHE_ENTRY_MAX
        || CACHED_BYTES.load(Relaxed) + len > CACHE_BYTES
        || CACHE_LOCK.swap(true, Acquire)
    {
        return false;
    }
    let mut stored = false;
    for slot in CACHE.iter() {
        if slot.len.load(Relaxed) == 0 {
            slot.base.store(base, Relaxed);
            slot.tick.store(tick, Relaxed);
            slot.len.store(len, Relaxed);
            CACHED_BYTES.fetch_add(len, Relaxed);
            stored = true;
            break;
        }
    }
    CACHE_LOCK.store(false, Release);
    stored
}

/// Allocates `n` bytes aligned to `align` (a power of two) on their own mapping.
pub fn alloc(n: usize, align: usize) -> Block {
    let align = align.max(16);
    let offset = align.max(HEADER);
    let extra = if align > PAGE { align } else { 0 };
    let Some(len) = n
        .checked_add(offset + extra)
        .and_then(|l| round_up(l, PAGE))
    else {
        os::set_errno(libc::ENOMEM);
        return Block::NULL_BLOCK;
    };
    let (src, kernel) = thread_source();
    // The cache holds the page source's mappings: not for unpaged threads.
    let cacheable = extra == 0 && !kernel;
    let (base, map_len, fresh) = match cacheable.then(|| cache_take(len)).flatten() {
        Some((base, l)) => (base, l, false),
        None => match (src.map_large)(len) {
            Some(base) => {
                MAPPED.fetch_add(len, Relaxed);
                (base, len, true)
            }
            None => {
                os::set_errno(libc::ENOMEM);
                return Block::NULL_BLOCK;
            }
        },
    };
    let ptr = if extra == 0 {
        base + offset
    } else {
        (base + HEADER + align - 1) & !(align - 1)
    };
    let h = (ptr - HEADER) as *mut LargeHeader;
    // SAFETY: `ptr - HEADER` lies inside the mapping we just obtained.
    unsafe {
        h.write(LargeHeader {
            magic: MAGIC,
            base,
            map_len,
            kernel: kernel as usize,
        })
    };
    ALLOCS.fetch_add(1, Relaxed);
    Block {
        ptr: ptr as *mut u8,
        fresh,
    }
}

/// The header of a large pointer, after checking that it is one.
///
/// # Safety
/// `p` is non-null, outside the region, and was returned by [`alloc`] (a foreign pointer is
/// detected only if the word below it is readable).
unsafe fn header_of(p: usize) -> *mut LargeHeader {
    let in_page = p & (PAGE - 1);
    if p & 15 != 0 || (in_page != 0 && (in_page < HEADER || !in_page.is_power_of_two())) {
        os::fatal(b"free(): invalid pointer (not allocated by tidepool-alloc)");
    }
    let h = (p - HEADER) as *mut LargeHeader;
    // SAFETY: per the caller, the header is readable.
    if unsafe { (*h).magic } != MAGIC {
        os::fatal(b"free(): invalid pointer or double free of a large object");
    }
    h
}

/// Frees a large object.
///
/// # Safety
/// As [`header_of`].
pub unsafe fn free(p: usize) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let h = header_of(p);
        let base = (*h).base;
        let len = (*h).map_len;
        let src = source_of(h);
        (*h).magic = 0;
        FREES.fetch_add(1, Relaxed);
        if p - base == HEADER && (*h).kernel == 0 && cache_put(base, len) {
            return;
        }
        MAPPED.fetch_sub(len, Relaxed);
        (src.unmap_large)(base, len);
    }
}

/// Usable bytes of a large object.
///
/// # Safety
/// As [`header_of`].
pub unsafe fn usable_size(p: usize) -> usize {
    // SAFETY: as the caller guarantees.
    unsafe {
        let h = header_of(p);
        (*h).base + (*h).map_len - p
    }
}

/// Resizes a large object to `n` bytes (still large): in place when it fits, by moving pages
/// when the source can, by copying otherwise. Null (old object intact) on failure.
///
/// # Safety
/// As [`header_of`].
pub unsafe fn realloc(p: usize, n: usize) -> *mut u8 {
    // SAFETY: as the caller guarantees.
    unsafe {
        let h = header_of(p);
        let (base, map_len) = ((*h).base, (*h).map_len);
        let usable = base + map_len - p;
        if n <= usable && n >= usable / 2 {
            return p as *mut u8;
        }
        let src = source_of(h);
        if let (Some(remap), true) = (src.remap_large, p - base == HEADER) {
            let Some(len) = n.checked_add(HEADER).and_then(|l| round_up(l, PAGE)) else {
                os::set_errno(libc::ENOMEM);
                return core::ptr::null_mut();
            };
            // Grow with slack so that a buffer growing step by step moves rarely.
            let len = if len > map_len {
                round_up(len + len / 4, PAGE).unwrap_or(len)
            } else {
                len
            };
            return match remap(base, map_len, len) {
                Some(new_base) => {
                    MAPPED.fetch_add(len, Relaxed);
                    MAPPED.fetch_sub(map_len, Relaxed);
                    let nh = new_base as *mut LargeHeader;
                    (*nh).base = new_base;
                    (*nh).map_len = len;
                    (new_base + HEADER) as *mut u8
                }
                None => {
                    os::set_errno(libc::ENOMEM);
                    core::ptr::null_mut()
                }
            };
        }
        let fresh = alloc(n, 16);
        if fresh.ptr.is_null() {
            return fresh.ptr;
        }
        core::ptr::copy_nonoverlapping(p as *const u8, fresh.ptr, usable.min(n));
        free(p);
        fresh.ptr
    }
}

/// Unmaps every cached mapping.
pub fn trim() {
    purge(u32::MAX);
}

/// Unmaps the cached mappings cached before trim tick `before` (they sat unused a whole
/// period).
pub fn purge(before: u32) {
    if CACHED_BYTES.load(Relaxed) == 0 || CACHE_LOCK.swap(true, Acquire) {
        return;
    }
    for slot in CACHE.iter() {
        if slot.len.load(Relaxed) == 0 || slot.tick.load(Relaxed) >= before {
            continue;
        }
        let len = slot.len.swap(0, Relaxed);
        let base = slot.base.swap(0, Relaxed);
        CACHED_BYTES.fetch_sub(len, Relaxed);
        MAPPED.fetch_sub(len, Relaxed);
        // SAFETY: cached mappings are whole, ours, and referenced by nobody.
        unsafe { (region::source().unmap_large)(base, len) };
    }
    CACHE_LOCK.store(false, Release);
}

pub fn lock_cache() {
    while CACHE_LOCK.swap(true, Acquire) {
        os::yield_now();
    }
}

pub fn unlock_cache() {
    CACHE_LOCK.store(false, Release);
}

/// (allocations, frees, bytes mapped including the cache, bytes cached).
pub fn counters() -> (u64, u64, usize, usize) {
    (
        ALLOCS.load(Relaxed),
        FREES.load(Relaxed),
        MAPPED.load(Relaxed),
        CACHED_BYTES.load(Relaxed),
    )
}
