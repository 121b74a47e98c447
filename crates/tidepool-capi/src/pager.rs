//! Pager regions for C: memory that is ordinary to the program (pointers, memcpy, any
//! library) while at most a local budget of it is mapped; the rest lives in a far store and
//! comes back through userfaultfd on the next touch.

use crate::ffi;
use crate::{construct, fail, guard, tp_status};
use std::ffi::{c_char, c_void};
use tidepool_pager::{Config, Pager, PagerStats, Region};

use tp_status::*;

/// A pager: a local-memory budget, fault handlers, and a far store behind its regions.
#[derive(Debug)]
pub struct tp_pager(Pager);

/// A range of memory served by a pager.
#[derive(Debug)]
pub struct tp_region(Region);

/// What a pager did, in pages unless named otherwise.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct tp_pager_stats {
    /// Faults on pages that were not mapped.
    pub missing_faults: u64,
    /// Of those, served with a zero page (first touch), and by a read from the store.
    pub zero_fills: u64,
    pub far_fetches: u64,
    /// Pages mapped ahead of use by the prefetcher.
    pub prefetched: u64,
    /// Pages evicted, and dirty pages written to the store.
    pub evicted: u64,
    pub written_back: u64,
    /// Bytes read from and written to the store.
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Pages mapped now, and the budget. A fault is served before the pager evicts to make
    /// room, so while eviction catches up `resident_pages` may run over the budget by a margin
    /// (a 32nd of the budget, at least 64 pages and at most 4096).
    pub resident_pages: u64,
    pub budget_pages: u64,
}

impl From<PagerStats> for tp_pager_stats {
    fn from(s: PagerStats) -> Self {
        tp_pager_stats {
            missing_faults: s.missing_faults,
            zero_fills: s.zero_fills,
            far_fetches: s.far_fetches,
            prefetched: s.prefetched,
            evicted: s.evicted,
            written_back: s.written_back,
            bytes_read: s.bytes_read,
            bytes_written: s.bytes_written,
            resident_pages: s.resident_pages,
            budget_pages: s.budget_pages,
        }
    }
}

/// Starts a pager keeping at most `local_budget` bytes of its regions mapped, the rest in the
/// far store `url` (as for `tp_far_open`; "local:" keeps it in this process, compressed;
/// "local:?compress=none" keeps it whole). Null on failure: userfaultfd must be open to this process
/// (root, or `sysctl vm.unprivileged_userfaultfd=1`, or access to /dev/userfaultfd).
///
/// # Safety
/// `url` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tp_pager_start(url: *const c_char, local_budget: usize) -> *mut tp_pager {
    construct(|| {
        // SAFETY: the caller promises a NUL-terminated string (or null, refused).
        let store = unsafe { crate::far::open_store(url) }?;
        let pager = Pager::start(Config::new(local_budget), store).map_err(|e| e.to_string())?;
        Ok(tp_pager(pager))
    })
}

/// Stops a pager (its threads end when its last region is freed too).
///
/// # Safety
/// `pager` is null or from `tp_pager_start`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_pager_free(pager: *mut tp_pager) {
    // SAFETY: the caller promises a handle from `tp_pager_start`, freed once.
    unsafe { ffi::free(pager) }
}

/// Changes the local budget (shrinking evicts at once).
///
/// # Safety
/// `pager` is from `tp_pager_start`, live.
#[no_mangle]
pub unsafe extern "C" fn tp_pager_set_budget(pager: *const tp_pager, bytes: usize) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let Some(p) = (unsafe { ffi::object(pager) }) else {
            return fail(TP_EINVAL, "null pager");
        };
        p.0.set_local_budget(bytes);
        TP_OK
    })
}

/// Copies the pager's counters to `out`.
///
/// # Safety
/// `pager` is from `tp_pager_start`; `out` points to a writable `tp_pager_stats`.
#[no_mangle]
pub unsafe extern "C" fn tp_pager_stats_get(
    pager: *const tp_pager,
    out: *mut tp_pager_stats,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let Some(p) = (unsafe { ffi::object(pager) }) else {
            return fail(TP_EINVAL, "null pager");
        };
        if out.is_null() {
            return fail(TP_EINVAL, "null output");
        }
        // SAFETY: non-null, and the caller promises a writable `tp_pager_stats`.
        unsafe { ffi::put(out, p.0.stats().into()) };
        TP_OK
    })
}

/// A region of `len` bytes (rounded up to whole pages), reading as zeros until written.
/// Null on failure.
///
/// # Safety
/// `pager` is from `tp_pager_start`, live.
#[no_mangle]
pub unsafe extern "C" fn tp_region_new(pager: *const tp_pager, len: usize) -> *mut tp_region {
    construct(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let p = unsafe { ffi::object(pager) }.ok_or("null pager")?;
        let region = Region::new(&p.0, len).map_err(|e| e.to_string())?;
        Ok(tp_region(region))
    })
}

/// Frees a region: its memory is unmapped and its far copies dropped. No pointer into it may
/// be used after.
///
/// # Safety
/// `region` is null or from `tp_region_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_region_free(region: *mut tp_region) {
    // SAFETY: the caller promises a handle from `tp_region_new`, freed once.
    unsafe { ffi::free(region) }
}

/// The region's first byte (null for a null region): read and write it as any memory, from
/// any thread, until `tp_region_free`.
///
/// # Safety
/// `region` is null or from `tp_region_new`, live.
#[no_mangle]
pub unsafe extern "C" fn tp_region_ptr(region: *const tp_region) -> *mut c_void {
    // SAFETY: the caller promises a live handle or null.
    unsafe { ffi::object(region) }.map_or(std::ptr::null_mut(), |r| r.0.as_ptr() as *mut c_void)
}

/// The region's length in bytes (whole pages; 0 for null).
///
/// # Safety
/// `region` is null or from `tp_region_new`, live.
#[no_mangle]
pub unsafe extern "C" fn tp_region_len(region: *const tp_region) -> usize {
    // SAFETY: the caller promises a live handle or null.
    unsafe { ffi::object(region) }.map_or(0, |r| r.0.len())
}

/// Forgets the contents of the whole pages within `[offset, offset + len)`: they read as
/// zeros after, and their far copies are freed (a `free` for far memory).
///
/// # Safety
/// `region` is from `tp_region_new`, live, and nothing else uses those pages meanwhile.
#[no_mangle]
pub unsafe extern "C" fn tp_region_discard(
    region: *mut tp_region,
    offset: usize,
    len: usize,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused) used by no one else.
        let Some(r) = (unsafe { region.as_mut() }) else {
            return fail(TP_EINVAL, "null region");
        };
        if offset.checked_add(len).is_none_or(|end| end > r.0.len()) {
            return fail(
                TP_EINVAL,
                format!(
                    "discard of {len} bytes at {offset} runs past the region's {} bytes",
                    r.0.len()
                ),
            );
        }
        r.0.discard(offset, len);
        TP_OK
    })
}
