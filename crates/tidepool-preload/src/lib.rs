//! `libtidepool_preload.so`: what `tidepool run` loads into an unmodified program.
//!
//! It is `libtidepool_malloc.so` (the whole malloc family) plus a pager: at load, before the
//! program's own constructors, it starts a [`tidepool_pager::Pager`] with the budget and far
//! store named by the environment `tidepool run` sets, registers the allocator's heap region
//! with it, and serves objects larger than the heap's classes from a second registered region.
//! So every byte the program allocates lives in far memory, with at most the budget mapped.
//!
//! | variable | meaning |
//! |---|---|
//! | `TIDEPOOL_RUN_LOCAL` | local budget in bytes (`256M` forms accepted); paging is off without it |
//! | `TIDEPOOL_RUN_BACKEND` | far store URL (default `local:`, the in-process store) |
//! | `TIDEPOOL_RUN_STATS` | `1`: print the pager's statistics to standard error at exit |
//!
//! The variables stay in the environment, so a wrapper script (a pyenv shim, say) passes them
//! on to the program it runs, and programs the program starts get pagers of their own.
//!
//! While the program runs, `tidepool resize PID SIZE` changes its budget through a Unix socket
//! in the abstract namespace, `tidepool-run-PID` (see `tidepool_pager::control`).

mod libc_alloc;

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::env::var as env_var;
use std::sync::OnceLock;
use tidepool_alloc::PageSource;
use tidepool_pager::{AdoptedRegion, Config, Pager, PAGE};

// The malloc family's C symbols.
use tidepool_malloc as _;

#[global_allocator]
static LIBC: libc_alloc::LibcAlloc = libc_alloc::LibcAlloc;

/// Address space for objects too large for the heap's classes (and reused after free).
const LARGE_SPAN: usize = 1 << 40;

struct Runtime {
    pager: Pager,
    heap: Option<AdoptedRegion>,
    large: AdoptedRegion,
    large_free: Mutex<LargeRanges>,
    stats_at_exit: bool,
}

/// First-fit ranges of the large-object region, coalesced on free.
#[derive(Default)]
struct LargeRanges {
    free: BTreeMap<usize, usize>,
    top: usize,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

static SOURCE: PageSource = PageSource {
    reserve: tidepool_alloc::KERNEL_PAGES.reserve,
    discard: discard_pages,
    map_large,
    unmap_large,
    remap_large: None,
};

unsafe fn discard_pages(addr: usize, len: usize) {
    match RUNTIME.get().and_then(|r| r.heap.as_ref()) {
        // SAFETY: the allocator passes only ranges that hold no live objects.
        Some(heap) if heap.contains(addr) => unsafe { heap.discard(addr, len) },
        // SAFETY: as above, for pages outside the pager's regions.
        _ => unsafe { (tidepool_alloc::KERNEL_PAGES.discard)(addr, len) },
    }
}

fn map_large(len: usize) -> Option<usize> {
    let rt = match RUNTIME.get() {
        // A forked child has no pager (and the parent's locks may be held by threads that
        // were not copied): ordinary memory.
        Some(rt) if !tidepool_pager::in_forked_child() => rt,
        _ => return (tidepool_alloc::KERNEL_PAGES.map_large)(len),
    };
    let len = len.div_ceil(PAGE) * PAGE;
    let mut ranges = rt.large_free.lock();
    let fit = ranges
        .free
        .iter()
        .find(|(_, &l)| l >= len)
        .map(|(&a, &l)| (a, l));
    let offset = match fit {
        Some((a, l)) => {
            ranges.free.remove(&a);
            if l > len {
                ranges.free.insert(a + len, l - len);
            }
            a
        }
        None => {
            if ranges.top + len > rt.large.len() {
                return None;
            }
            ranges.top += len;
            ranges.top - len
        }
    };
    Some(rt.large.base() + offset)
}

unsafe fn unmap_large(addr: usize, len: usize) {
    let rt = match RUNTIME.get() {
        Some(rt) if rt.large.contains(addr) => rt,
        // SAFETY: a whole mapping from the kernel source (made before the pager started).
        _ => return unsafe { (tidepool_alloc::KERNEL_PAGES.unmap_large)(addr, len) },
    };
    let len = len.div_ceil(PAGE) * PAGE;
    // SAFETY: the allocator unmaps only objects nobody references any more.
    unsafe { rt.large.discard(addr, len) };
    if tidepool_pager::in_forked_child() {
        return; // the range stays reserved; the free list belongs to the parent
    }
    let mut ranges = rt.large_free.lock();
    let mut start = addr - rt.large.base();
    let mut len = len;
    if let Some((&a, &l)) = ranges.free.range(..start).next_back() {
        if a + l == start {
            ranges.free.remove(&a);
            start = a;
            len += l;
        }
    }
    if let Some(&l) = ranges.free.get(&(start + len)) {
        ranges.free.remove(&(start + len));
        len += l;
    }
    if start + len == ranges.top {
        ranges.top = start;
    } else {
        ranges.free.insert(start, len);
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("tidepool run: {msg}");
    // SAFETY: ending the process before the program starts; nothing of it has run.
    unsafe { libc::_exit(tidepool_pager::FATAL_EXIT_CODE) }
}

/// Starts the pager and hands it the allocator's heap. Runs before ordinary constructors.
extern "C" fn start() {
    let Some(local) = env_var("TIDEPOOL_RUN_LOCAL").ok() else {
        return;
    };
    let backend = env_var("TIDEPOOL_RUN_BACKEND").unwrap_or_else(|_| "local:".into());
    let stats_at_exit = env_var("TIDEPOOL_RUN_STATS").is_ok_and(|v| !v.is_empty() && v != "0");
    let Some(budget) = tidepool_alloc::parse_size(local.as_bytes()) else {
        fail(&format!(
            "TIDEPOOL_RUN_LOCAL={local} is not a size (use e.g. 256M or 2G)"
        ));
    };
    // Fails only if something allocated before this constructor; the heap is adopted anyway
    // and large objects made before now stay ordinary memory.
    let _ = tidepool_alloc::set_page_source(&SOURCE);
    // Make sure the heap is reserved.
    // SAFETY: a zero-byte allocation and its release.
    unsafe { tidepool_alloc::api::free(tidepool_alloc::api::malloc(0)) };
    // What glibc allocates while the pager starts (the DTVs of the threads it creates, for
    // one) is read by pager threads, so it must not be paged: this thread allocates from the
    // kernel until the pager runs, and pager threads always do.
    tidepool_alloc::set_thread_unpaged(true);
    let store = tidepool_store::open(&backend)
        .unwrap_or_else(|e| fail(&format!("cannot open far store {backend}: {e}")));
    let mut config = Config::new(budget);
    config.thread_start = Some(|| tidepool_alloc::set_thread_unpaged(true));
    let pager = Pager::start(config, store)
        .unwrap_or_else(|e| fail(&format!("cannot start the pager: {e}")));
    let heap = tidepool_alloc::region().map(|(base, len)| {
        // SAFETY: the allocator's reservation: private, anonymous, read-write, never unmapped,
        // and registered nowhere else.
        unsafe { pager.adopt(base, len) }
            .unwrap_or_else(|e| fail(&format!("cannot register the heap: {e}")))
    });
    let large_base = (tidepool_alloc::KERNEL_PAGES.reserve)(LARGE_SPAN)
        .unwrap_or_else(|| fail("cannot reserve address space for large objects"));
    // SAFETY: a fresh private anonymous reservation that stays mapped for the process's life.
    let large = unsafe { pager.adopt(large_base, LARGE_SPAN) }
        .unwrap_or_else(|e| fail(&format!("cannot register the large-object region: {e}")));
    let rt = Runtime {
        pager,
        heap,
        large,
        large_free: Mutex::new(LargeRanges::default()),
        stats_at_exit,
    };
    if RUNTIME.set(rt).is_ok() {
        if let Some(rt) = RUNTIME.get() {
            if let Err(e) = tidepool_pager::control::serve(&rt.pager, std::process::id()) {
                eprintln!("tidepool run: live resizing is unavailable: {e}");
            }
        }
    }
    tidepool_alloc::set_thread_unpaged(false);
}

/// The pager of this process, once started.
pub fn pager() -> Option<&'static Pager> {
    RUNTIME.get().map(|r| &r.pager)
}

extern "C" fn at_exit() {
    if let Some(rt) = RUNTIME.get() {
        if rt.stats_at_exit && !tidepool_pager::in_forked_child() {
            let name = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
            eprintln!(
                "tidepool run: process {} ({}), far store {}\n{}",
                std::process::id(),
                name.trim(),
                rt.pager.store_description(),
                rt.pager.stats()
            );
        }
    }
}

#[used]
#[link_section = ".init_array.00100"]
static INIT: extern "C" fn() = start;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = at_exit;
