//! The reserved region, where arena pages come from, and one-time initialisation.
//!
//! At first use the allocator reserves one span of address space per size class (64 GiB each
//! by default; smaller if the address space is limited), backed by nothing until touched. Each
//! class then hands out arenas from its own span with a bump pointer: Memento's page allocator.
//! Pages appear one at a time as the program first touches them. One more span of the same size
//! follows the class spans: the medium heap's (`medium.rs`).
//!
//! Where those pages come from is a [`PageSource`] hook, so that a pager can back the region
//! with far memory (register it with userfaultfd, serve its faults) instead of the kernel's
//! anonymous memory. It must be installed before the first allocation.

use crate::classes::{ARENA_BYTES, CLASSES};
use crate::os;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU8, AtomicUsize, Ordering::*};

/// Grows or moves a large mapping: `(addr, old_len, new_len) -> new address`.
pub type RemapFn = unsafe fn(addr: usize, old_len: usize, new_len: usize) -> Option<usize>;

/// Where the allocator's memory comes from.
#[derive(Debug, Clone, Copy)]
pub struct PageSource {
    /// Reserves `len` bytes of readable, writable address space whose untouched pages read as
    /// zero. Called once, for the whole region (the class spans and the medium heap's span).
    pub reserve: fn(len: usize) -> Option<usize>,
    /// Gives back the pages of `[addr, addr + len)` inside the region; the next touch of any of
    /// them must read zero.
    ///
    /// # Safety
    /// Callers pass only ranges of the region that hold no live objects.
    pub discard: unsafe fn(addr: usize, len: usize),
    /// Maps `len` fresh zeroed bytes for one large object.
    pub map_large: fn(len: usize) -> Option<usize>,
    /// Unmaps a range `map_large` returned.
    ///
    /// # Safety
    /// Callers pass only whole ranges from `map_large` that nothing references any more.
    pub unmap_large: unsafe fn(addr: usize, len: usize),
    /// Grows or moves a range from `map_large`, keeping its contents; `None` where the source
    /// cannot, in which case the allocator copies.
    pub remap_large: Option<RemapFn>,
}

/// The default: anonymous memory from the kernel.
pub static KERNEL_PAGES: PageSource = PageSource {
    reserve: os::reserve,
    discard: os::discard,
    map_large: os::map,
    unmap_large: os::unmap,
    remap_large: Some(os::remap),
};

static SOURCE: AtomicPtr<PageSource> = AtomicPtr::new(core::ptr::null_mut());

/// The page source in use.
#[inline]
pub fn source() -> &'static PageSource {
    let p = SOURCE.load(Acquire);
    if p.is_null() {
        &KERNEL_PAGES
    } else {
        // SAFETY: only `set_page_source` stores here, and only `&'static` references.
        unsafe { &*p }
    }
}

/// The allocator was already in use, so its memory can no longer change hands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlreadyInitialized;

impl core::fmt::Display for AlreadyInitialized {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(
            "the allocator has already reserved its region; install the page source before the first allocation",
        )
    }
}

/// Installs where arenas and large objects get their memory. Fails once the allocator has
/// served its first allocation.
pub fn set_page_source(source: &'static PageSource) -> Result<(), AlreadyInitialized> {
    if STATE.load(Acquire) != UNINIT {
        return Err(AlreadyInitialized);
    }
    SOURCE.store(source as *const PageSource as *mut PageSource, Release);
    Ok(())
}

const UNINIT: u32 = 0;
const BUSY: u32 = 1;
const READY: u32 = 2;
const FAILED: u32 = 3;

static STATE: AtomicU32 = AtomicU32::new(UNINIT);
static BASE: AtomicUsize = AtomicUsize::new(0);
static LEN: AtomicUsize = AtomicUsize::new(0);
static SPAN_SHIFT: AtomicU32 = AtomicU32::new(0);
/// Empty arenas kept resident (not given back) up to this many bytes.
pub static RETAIN_BYTES: AtomicUsize = AtomicUsize::new(4 << 20);
/// Empty arenas beyond the retained budget are given back at most this often
/// (`TIDEPOOL_ALLOC_TRIM_MS`).
pub static TRIM_INTERVAL_MS: AtomicU32 = AtomicU32::new(50);
/// Whether `TIDEPOOL_ALLOC_STATS` asked for statistics at exit: 0 no, 1 to standard error,
/// 2 appended to the file named in [`STATS_PATH`].
pub static STATS_AT_EXIT: AtomicU32 = AtomicU32::new(0);
/// Longest statistics path accepted.
pub const STATS_PATH_MAX: usize = 256;
/// NUL-terminated statistics file path.
pub static STATS_PATH: [AtomicU8; STATS_PATH_MAX] = [const { AtomicU8::new(0) }; STATS_PATH_MAX];

/// Debug mode (`TIDEPOOL_ALLOC_DEBUG=1`): every small allocation and free goes through one lock
/// and the arena's allocation bitmap, so double frees and pointers that are not the start of an
/// allocation abort with a message instead of corrupting a free list.
pub static DEBUG: AtomicBool = AtomicBool::new(false);

/// Whether debug mode is on (settled before the first allocation returns).
#[inline]
pub fn debug() -> bool {
    DEBUG.load(Relaxed)
}

/// Periodic trims so far: an empty arena or a cached large mapping still unused a whole tick
/// after it was set aside is given back, as mimalloc purges after a delay.
pub static TRIM_TICK: AtomicU32 = AtomicU32::new(0);

/// The current trim tick.
#[inline]
pub fn trim_tick() -> u32 {
    TRIM_TICK.load(Relaxed)
}

/// log2 of a class span's length (zero before the reservation).
#[inline]
pub fn span_shift() -> u32 {
    SPAN_SHIFT.load(Relaxed)
}

/// The class whose span holds `addr`, a pointer into the class spans.
#[inline]
pub fn class_index(addr: usize) -> usize {
    (addr - BASE.load(Relaxed)) >> SPAN_SHIFT.load(Relaxed)
}

/// Whether `addr` lies in the small-object region (false before initialisation).
#[inline(always)]
pub fn in_region(addr: usize) -> bool {
    addr.wrapping_sub(BASE.load(Relaxed)) < LEN.load(Relaxed)
}

/// The whole reservation as `(base, len)`, class spans and medium span, once reserved: what a
/// pager registers.
pub fn region() -> Option<(usize, usize)> {
    (STATE.load(Acquire) == READY).then(|| {
        let (medium, span) = medium_span();
        (BASE.load(Relaxed), medium + span - BASE.load(Relaxed))
    })
}

/// The class spans as `(base, len)`: where small pointers live (zero length before the
/// reservation).
pub fn small_region() -> (usize, usize) {
    (BASE.load(Relaxed), LEN.load(Relaxed))
}

/// The medium heap's span, right after the class spans (zero length before the reservation).
#[inline]
pub fn medium_span() -> (usize, usize) {
    let shift = SPAN_SHIFT.load(Relaxed);
    if shift == 0 {
        return (0, 0);
    }
    (BASE.load(Relaxed) + LEN.load(Relaxed), 1usize << shift)
}

/// Start of class `c`'s span and its length.
#[inline]
pub fn class_span(c: usize) -> (usize, usize) {
    let shift = SPAN_SHIFT.load(Relaxed);
    (BASE.load(Relaxed) + (c << shift), 1usize << shift)
}

/// Makes sure the region exists; false if it could not be reserved.
#[inline]
pub fn ensure_init(on_ready: fn()) -> bool {
    match STATE.load(Acquire) {
        READY => true,
        FAILED => false,
        _ => init_slow(on_ready),
    }
}

#[cold]
fn init_slow(on_ready: fn()) -> bool {
    if STATE
        .compare_exchange(UNINIT, BUSY, Acquire, Acquire)
        .is_err()
    {
        // Another thread is reserving; nothing it calls can re-enter malloc on this thread.
        while STATE.load(Acquire) == BUSY {
            os::yield_now();
        }
        return STATE.load(Acquire) == READY;
    }
    read_environment();
    let src = source();
    // Largest span the address space allows, down to 1 GiB per class.
    for shift in [36u32, 34, 32, 30] {
        let len = CLASSES << shift;
        // One more span past the classes' for the medium heap.
        if let Some(raw) = (src.reserve)(len + (1 << shift) + ARENA_BYTES) {
            let base = (raw + ARENA_BYTES - 1) & !(ARENA_BYTES - 1);
            BASE.store(base, Relaxed);
            SPAN_SHIFT.store(shift, Relaxed);
            LEN.store(len, Relaxed);
            STATE.store(READY, Release);
            on_ready();
            return true;
        }
    }
    STATE.store(FAILED, Release);
    false
}

fn read_environment() {
    if let Some(v) = os::getenv(c"TIDEPOOL_ALLOC_RETAIN").and_then(parse_size) {
        RETAIN_BYTES.store(v, Relaxed);
    }
    if let Some(v) = os::getenv(c"TIDEPOOL_ALLOC_TRIM_MS").and_then(parse_size) {
        TRIM_INTERVAL_MS.store(v.min(u32::MAX as usize) as u32, Relaxed);
    }
    if let Some(v) = os::getenv(c"TIDEPOOL_ALLOC_DEBUG") {
        DEBUG.store(!v.is_empty() && v != b"0", Relaxed);
    }
    if let Some(v) = os::getenv(c"TIDEPOOL_ALLOC_STATS") {
        if v.contains(&b'/') && v.len() < STATS_PATH_MAX {
            // A path: keep a NUL-terminated copy (the environment block may be replaced later).
            for (i, &b) in v.iter().enumerate() {
                STATS_PATH[i].store(b, Relaxed);
            }
            STATS_AT_EXIT.store(2, Relaxed);
        } else if !v.is_empty() && v != b"0" {
            STATS_AT_EXIT.store(1, Relaxed);
        }
    }
}

/// Parses `123`, `64K`, `16M`, `1G` (binary units). No allocation.
pub fn parse_size(s: &[u8]) -> Option<usize> {
    let (digits, unit) = match s.last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1usize << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        b'g' | b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: usize = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add((d - b'0') as usize)?;
    }
    n.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size(b"0"), Some(0));
        assert_eq!(parse_size(b"64K"), Some(64 << 10));
        assert_eq!(parse_size(b"16m"), Some(16 << 20));
        assert_eq!(parse_size(b"2G"), Some(2 << 30));
        assert_eq!(parse_size(b""), None);
        assert_eq!(parse_size(b"M"), None);
        assert_eq!(parse_size(b"1x"), None);
        assert_eq!(parse_size(b"99999999999999999999999"), None);
    }
}
