//! The medium heap: requests above [`MEDIUM_MIN`] up to [`MAX_SMALL`], packed at 16-byte
//! granularity in one shared span with boundary tags, best fit and coalescing.
//!
//! Why not size classes here: a class of this size holds only a handful of objects per arena,
//! so every class keeps its own high-water mark of resident pages, and a phased program pays the
//! sum of those peaks, plus up to 25% rounding per object. Measured on `serverless-burst`, that
//! made RSS 1.13x glibc's, whose single heap pays the peak of the sum. These objects are 1% of a
//! serverless function's allocations but nearly half its bytes, so they get glibc's layout
//! (exact sizes, free neighbours merged, one shared wilderness) under one lock, while the 99%
//! keep the lock-free per-thread arenas. The lock is what limits it under threads, so only
//! requests above 8 KiB come here (see [`MEDIUM_MIN`]).
//!
//! Layout: every chunk starts with a 16-byte tag, `[prev_size, size | flags | MAGIC]`; the user
//! pointer follows it. `prev_size` is valid only when the previous chunk is free
//! ([`PREV_FREE`]). Free chunks keep their bin links in their first body words. The span above
//! `top` is the wilderness: chunks next to it merge into it when freed. Pages below `dirty` have
//! been handed out since they were last zero; above it the span reads as zero, so calloc
//! trusts chunks carved there.

use crate::classes::{MAX_SMALL, PAGE};
use crate::os;
use crate::region;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

/// Requests above this many bytes (and up to [`MAX_SMALL`]) use the medium heap. At 2 KiB,
/// mimalloc-bench's rptest (sizes 8 to 16000 bytes, two threads) spent its time on this heap's
/// lock and ran at 0.41x mimalloc's rate; at 8 KiB it runs at 1.4x (8.7 M against 6.1-6.3 M
/// memory ops per CPU second), for 3% more peak RSS on serverless-burst and -threads.
pub const MEDIUM_MIN: usize = 8192;
/// Bytes of the tag before each chunk's user memory.
const TAG: usize = 16;
/// Smallest chunk: a tag and two links.
const MIN_CHUNK: usize = 32;
/// This chunk is free.
const FREE: u64 = 1;
/// The chunk before this one is free, and `prev_size` holds its size.
const PREV_FREE: u64 = 2;
/// High half of every tag's size word: catches frees of pointers that are not chunk starts.
const MAGIC: u64 = 0x7470_6d68 << 32;
const SIZE_MASK: u64 = 0xffff_fff0;
/// Bins of free chunks: 0 for those too small for any request, then 256-byte steps from
/// `MEDIUM_MIN`, then one bin for everything past the last step.
const BIN_STEP: usize = 256;
const BINS: usize = 2 + (MAX_SMALL + TAG - MEDIUM_MIN) / BIN_STEP + 1;
const BIN_WORDS: usize = BINS.div_ceil(64);

struct Heap {
    /// Start of the wilderness.
    top: usize,
    /// Bytes below this address may be dirty; the span above reads as zero.
    dirty: usize,
    bins: [usize; BINS],
    nonempty: [u64; BIN_WORDS],
}

struct Locked {
    lock: AtomicBool,
    heap: core::cell::UnsafeCell<Heap>,
}

// SAFETY: `heap` is only touched with `lock` held (see `with_heap`).
unsafe impl Sync for Locked {}

static HEAP: Locked = Locked {
    lock: AtomicBool::new(false),
    heap: core::cell::UnsafeCell::new(Heap {
        top: 0,
        dirty: 0,
        bins: [0; BINS],
        nonempty: [0; BIN_WORDS],
    }),
};
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);
/// Bytes in live chunks, tags included (changed under the heap lock).
static IN_USE: AtomicUsize = AtomicUsize::new(0);
/// Bytes of the span ever carved (high-water mark of `top`).
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// Takes the heap lock (also held across fork, so the child's heap is consistent).
pub(crate) fn lock() {
    let mut spins = 0u32;
    while HEAP.lock.swap(true, Acquire) {
        while HEAP.lock.load(Relaxed) {
            spins += 1;
            if spins < 64 {
                core::hint::spin_loop();
            } else {
                os::yield_now();
            }
        }
    }
}

pub(crate) fn unlock() {
    HEAP.lock.store(false, Release);
}

/// Runs `f` on the heap with the lock held. `f` must not allocate.
fn with_heap<R>(f: impl FnOnce(&mut Heap, usize, usize) -> R) -> R {
    let (start, len) = region::medium_span();
    lock();
    // SAFETY: the lock gives us the heap exclusively until `unlock`.
    let r = f(unsafe { &mut *HEAP.heap.get() }, start, len);
    unlock();
    r
}

/// Whether `addr` lies in the medium span.
#[inline]
pub fn contains(addr: usize) -> bool {
    let (start, len) = region::medium_span();
    addr.wrapping_sub(start) < len
}

fn bin_of(size: usize) -> usize {
    if size < MEDIUM_MIN {
        0
    } else {
        (1 + (size - MEDIUM_MIN) / BIN_STEP).min(BINS - 1)
    }
}

/// The two tag words of the chunk at `c`.
///
/// # Safety
/// `c` is a chunk start inside the carved part of the span.
unsafe fn tag(c: usize) -> (*mut u64, *mut u64) {
    (c as *mut u64, (c + 8) as *mut u64)
}

unsafe fn size_of(c: usize) -> usize {
    // SAFETY: per the caller, a chunk.
    unsafe { (*tag(c).1 & SIZE_MASK) as usize }
}

unsafe fn set_tag(c: usize, size: usize, flags: u64) {
    // SAFETY: per the caller, a chunk.
    unsafe { *tag(c).1 = MAGIC | size as u64 | flags };
}

/// Links a free chunk into its bin and marks it free (and its successor's `PREV_FREE`).
unsafe fn insert(h: &mut Heap, c: usize, size: usize) {
    // SAFETY: `c` is a free chunk of `size` bytes below `top`, owned by the locked heap.
    unsafe {
        let prev_flag = *tag(c).1 & PREV_FREE;
        set_tag(c, size, FREE | prev_flag);
        let next = c + size;
        if next < h.top {
            *tag(next).0 = size as u64;
            *tag(next).1 |= PREV_FREE;
        }
        let b = bin_of(size);
        let head = h.bins[b];
        *((c + TAG) as *mut usize) = head;
        *((c + TAG + 8) as *mut usize) = 0;
        if head != 0 {
            *((head + TAG + 8) as *mut usize) = c;
        }
        h.bins[b] = c;
        h.nonempty[b / 64] |= 1 << (b % 64);
    }
}

/// Unlinks a free chunk from its bin (its tags stay as they are).
unsafe fn unlink(h: &mut Heap, c: usize, size: usize) {
    // SAFETY: `c` is on the bin of `size`.
    unsafe {
        let next = *((c + TAG) as *const usize);
        let prev = *((c + TAG + 8) as *const usize);
        let b = bin_of(size);
        if prev != 0 {
            *((prev + TAG) as *mut usize) = next;
        } else {
            h.bins[b] = next;
            if next == 0 {
                h.nonempty[b / 64] &= !(1 << (b % 64));
            }
        }
        if next != 0 {
            *((next + TAG + 8) as *mut usize) = prev;
        }
    }
}

/// A free chunk of at least `need` bytes, unlinked: first fit in `need`'s own bin, else the
/// first chunk of the next bin that has one (all of whose chunks fit).
unsafe fn take_fit(h: &mut Heap, need: usize) -> Option<(usize, usize)> {
    let b = bin_of(need);
    // SAFETY: bin lists hold free chunks of the locked heap.
    unsafe {
        let mut c = h.bins[b];
        while c != 0 {
            let size = size_of(c);
            if size >= need {
                unlink(h, c, size);
                return Some((c, size));
            }
            c = *((c + TAG) as *const usize);
        }
        for w in (b + 1) / 64..BIN_WORDS {
            let mut bits = h.nonempty[w];
            if w == (b + 1) / 64 {
                bits &= !0u64 << ((b + 1) % 64);
            }
            if bits != 0 {
                let nb = w * 64 + bits.trailing_zeros() as usize;
                let c = h.bins[nb];
                let size = size_of(c);
                unlink(h, c, size);
                return Some((c, size));
            }
        }
    }
    None
}

/// Allocates `n` bytes (`MEDIUM_MIN < n <= MAX_SMALL`): the pointer and whether it reads zero.
/// `None` when the span is exhausted. The caller has made sure the region exists
/// ([`region::ensure_init`]).
pub fn alloc(n: usize) -> Option<(*mut u8, bool)> {
    let need = (n + TAG).next_multiple_of(16);
    let r = with_heap(|h, start, len| {
        if h.top == 0 {
            h.top = start;
            h.dirty = start;
        }
        // SAFETY: chunks handled below are ours under the lock.
        unsafe {
            let (c, size, fresh) = match take_fit(h, need) {
                Some((c, size)) => (c, size, false),
                None => {
                    if h.top + need > start + len {
                        return None;
                    }
                    let c = h.top;
                    h.top += need;
                    HIGH.fetch_max(h.top - start, Relaxed);
                    // The tag is ours to write; the user bytes after it are zero if above
                    // `dirty`.
                    let fresh = c + TAG >= h.dirty;
                    h.dirty = h.dirty.max(h.top);
                    *tag(c).1 = 0;
                    (c, need, fresh)
                }
            };
            let prev_flag = *tag(c).1 & PREV_FREE;
            let used = if size - need >= MIN_CHUNK {
                // Split: the remainder stays free (its successor's PREV_FREE stays set).
                set_tag(c, need, prev_flag);
                let rest = c + need;
                *tag(rest).1 = 0;
                insert(h, rest, size - need);
                need
            } else {
                set_tag(c, size, prev_flag);
                let next = c + size;
                if next < h.top {
                    *tag(next).1 &= !PREV_FREE;
                }
                size
            };
            IN_USE.fetch_add(used, Relaxed);
            Some(((c + TAG) as *mut u8, fresh))
        }
    });
    if r.is_some() {
        ALLOCS.fetch_add(1, Relaxed);
    }
    r
}

/// The chunk of a user pointer, after the checks that catch frees of anything else.
///
/// # Safety
/// `p` lies in the medium span.
unsafe fn chunk_of(h: &Heap, start: usize, p: usize) -> usize {
    let c = p.wrapping_sub(TAG);
    if !p.is_multiple_of(16) || c < start || c >= h.top {
        os::fatal(b"free(): invalid pointer (not the start of an allocation)");
    }
    // SAFETY: `c` is 16-aligned and below `top`, so its tag words are carved memory.
    let word = unsafe { *tag(c).1 };
    if word & !0xffff_ffff != MAGIC {
        os::fatal(b"free(): invalid pointer (not the start of an allocation)");
    }
    if word & FREE != 0 {
        os::fatal(b"free(): double free detected");
    }
    c
}

/// Frees a medium pointer.
///
/// # Safety
/// `p` is a live allocation from [`alloc`].
pub unsafe fn free(p: usize) {
    with_heap(|h, start, _| {
        // SAFETY: checked by `chunk_of`; neighbours are found through valid tags.
        unsafe {
            let mut c = chunk_of(h, start, p);
            let mut size = size_of(c);
            IN_USE.fetch_sub(size, Relaxed);
            // Merge with a free successor, then a free predecessor.
            // An absorbed chunk's tag keeps saying "freed", so freeing it again still aborts.
            let next = c + size;
            if next < h.top && *tag(next).1 & FREE != 0 {
                let ns = size_of(next);
                unlink(h, next, ns);
                *tag(next).1 = MAGIC | FREE;
                size += ns;
            }
            if *tag(c).1 & PREV_FREE != 0 {
                let ps = *tag(c).0 as usize;
                let prev = c - ps;
                unlink(h, prev, ps);
                *tag(c).1 = MAGIC | FREE;
                c = prev;
                size += ps;
            }
            if c + size == h.top {
                // Back into the wilderness.
                h.top = c;
            } else {
                insert(h, c, size);
            }
        }
    });
    FREES.fetch_add(1, Relaxed);
}

/// Usable bytes of a medium pointer.
///
/// # Safety
/// `p` is a live allocation from [`alloc`].
pub unsafe fn usable_size(p: usize) -> usize {
    // SAFETY: a live chunk's size word is written once at allocation and read-only until freed.
    unsafe { size_of(p - TAG) - TAG }
}

/// Gives back the wilderness pages beyond `keep` bytes past `top`.
pub fn trim(keep: usize) {
    with_heap(|h, _, _| {
        if h.top == 0 {
            return;
        }
        let from = (h.top + keep).next_multiple_of(PAGE);
        let to = h.dirty.next_multiple_of(PAGE);
        if to > from {
            // SAFETY: the wilderness holds no objects; the lock keeps carving out.
            unsafe { (region::source().discard)(from, to - from) };
            h.dirty = from;
        }
    });
}

/// `(allocations, frees, bytes in live chunks, bytes ever carved)`.
pub fn counters() -> (u64, u64, usize, usize) {
    (
        ALLOCS.load(Relaxed),
        FREES.load(Relaxed),
        IN_USE.load(Relaxed),
        HIGH.load(Relaxed),
    )
}
