//! Far memory for C: a store, cache sections, far vectors of fixed-size elements and far
//! blocks of bytes (Mira's far data with its local cache split into sections).
//!
//! A section and the vectors and blocks cached in it belong to the thread that made the
//! section: their caches are single-threaded, for speed (no locks or atomics on the access
//! path). A call from another thread fails with `TP_EINVAL`. The store handle (`tp_far`) may be
//! shared by every thread.

use crate::ffi;
use crate::{construct, fail, guard, tp_status};
use std::ffi::{c_char, c_void, CStr};
use std::rc::Rc;
use std::sync::Arc;
use std::thread::ThreadId;
use tidepool_far::{Far, FarError, FarVec, Section, SectionConfig, SectionStats, Structure};
use tidepool_store::FarStore;

use tp_status::*;

/// A far store ("local:", "node://tenant:token@host:port", "redis://host:port",
/// "redis+cluster://h1:p1,h2:p2", "memcached://host:port") and the far data kept in it.
#[derive(Debug)]
pub struct tp_far(Far);

/// A local cache area for far lines, owned by the thread that made it.
#[derive(Debug)]
pub struct tp_section {
    section: Rc<Section>,
    owner: ThreadId,
}

/// A far vector of `len` elements of `elem_size` bytes each, cached in a section.
#[derive(Debug)]
pub struct tp_far_vec {
    v: FarVec<u8>,
    elem: usize,
    owner: ThreadId,
}

/// A far block of bytes, cached in a section: read and written in part, only the lines under
/// the part travel.
#[derive(Debug)]
pub struct tp_far_block {
    v: FarVec<u8>,
    owner: ThreadId,
}

/// How a section maps lines to its slots.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tp_structure {
    /// One slot per line: for sequential and strided access.
    TP_DIRECT = 0,
    /// Any of `ways` slots of a set.
    TP_SET_ASSOCIATIVE = 1,
    /// Any slot (CLOCK): for random access over a large working set.
    TP_FULLY_ASSOCIATIVE = 2,
}

/// What a section did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct tp_section_stats {
    /// Line lookups that found the line resident.
    pub hits: u64,
    /// Lines brought in on a miss or a prefetch.
    pub misses: u64,
    /// Of those, lines fetched from the store.
    pub fetched: u64,
    /// Lines brought in ahead of use.
    pub prefetched: u64,
    /// Dirty lines written back to the store.
    pub writebacks: u64,
    /// Round trips to the store for misses, and the nanoseconds they took.
    pub fetches: u64,
    pub fetch_nanos: u64,
}

impl From<SectionStats> for tp_section_stats {
    fn from(s: SectionStats) -> Self {
        tp_section_stats {
            hits: s.hits,
            misses: s.misses,
            fetched: s.fetched,
            prefetched: s.prefetched,
            writebacks: s.writebacks,
            fetches: s.fetches,
            fetch_nanos: s.fetch_nanos,
        }
    }
}

fn far_error(e: FarError) -> tp_status {
    let status = match e {
        FarError::OutOfBounds { .. } => TP_EINVAL,
        _ => TP_EFAR,
    };
    fail(status, e.to_string())
}

/// Refuses a handle used from a thread other than its owner's.
fn owned(owner: ThreadId, what: &str) -> Result<(), tp_status> {
    if std::thread::current().id() == owner {
        Ok(())
    } else {
        Err(fail(
            TP_EINVAL,
            format!(
                "this {what} belongs to the thread that made its section; \
                 use it there (make one section per thread)"
            ),
        ))
    }
}

/// The far store a C string names.
///
/// # Safety
/// `url` is null or a NUL-terminated string.
pub(crate) unsafe fn open_store(url: *const c_char) -> Result<Arc<dyn FarStore>, String> {
    if url.is_null() {
        return Err("null store URL (try \"local:\")".into());
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string.
    let url = unsafe { CStr::from_ptr(url) }
        .to_str()
        .map_err(|_| "the store URL is not UTF-8".to_string())?;
    tidepool_store::open(url).map_err(|e| e.to_string())
}

/// Opens the far store `url` (see `tp_far`). Null on failure (see `tp_last_error`).
///
/// # Safety
/// `url` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tp_far_open(url: *const c_char) -> *mut tp_far {
    // SAFETY: the caller promises a NUL-terminated string (or null, refused).
    construct(|| Ok(tp_far(Far::new(unsafe { open_store(url) }?))))
}

/// Closes a far store (vectors and blocks in it keep it open until they are freed).
///
/// # Safety
/// `far` is null or from `tp_far_open`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_far_free(far: *mut tp_far) {
    // SAFETY: the caller promises a handle from `tp_far_open`, freed once.
    unsafe { ffi::free(far) }
}

/// A section of `capacity` bytes in lines of `line_bytes` (a multiple of 8), mapping lines to
/// slots as `structure` says (`ways`: slots per set, for `TP_SET_ASSOCIATIVE`). Null on
/// failure.
#[no_mangle]
pub extern "C" fn tp_section_new(
    structure: tp_structure,
    ways: usize,
    line_bytes: usize,
    capacity: usize,
) -> *mut tp_section {
    construct(|| {
        let structure = match structure {
            tp_structure::TP_DIRECT => Structure::Direct,
            tp_structure::TP_SET_ASSOCIATIVE => Structure::SetAssociative(ways),
            tp_structure::TP_FULLY_ASSOCIATIVE => Structure::Full,
        };
        let section = Section::new(SectionConfig::new(structure, line_bytes, capacity))
            .map_err(|e| e.to_string())?;
        Ok(tp_section {
            section,
            owner: std::thread::current().id(),
        })
    })
}

/// Frees a section (its vectors and blocks keep it until they are freed). Must be called
/// from the section's thread; from another one, the section is leaked rather than freed.
///
/// # Safety
/// `section` is null or from `tp_section_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_section_free(section: *mut tp_section) {
    // SAFETY: the caller promises a live handle or null.
    if let Some(s) = unsafe { ffi::object(section) } {
        if owned(s.owner, "section").is_err() {
            return;
        }
    }
    // SAFETY: as above; freed once.
    unsafe { ffi::free(section) }
}

/// Copies the section's counters to `out`.
///
/// # Safety
/// `section` is from `tp_section_new`; `out` points to a writable `tp_section_stats`.
#[no_mangle]
pub unsafe extern "C" fn tp_section_stats_get(
    section: *const tp_section,
    out: *mut tp_section_stats,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let Some(s) = (unsafe { ffi::object(section) }) else {
            return fail(TP_EINVAL, "null section");
        };
        if let Err(e) = owned(s.owner, "section") {
            return e;
        }
        if out.is_null() {
            return fail(TP_EINVAL, "null output");
        }
        // SAFETY: non-null, and the caller promises a writable `tp_section_stats`.
        unsafe { ffi::put(out, s.section.stats().into()) };
        TP_OK
    })
}

/// A byte vector of `bytes` bytes in `far`, cached in `section`.
///
/// # Safety
/// `far` and `section` are live handles (or null, refused).
unsafe fn new_bytes(
    far: *const tp_far,
    section: *const tp_section,
    bytes: usize,
    name: &str,
) -> Result<(FarVec<u8>, ThreadId), String> {
    // SAFETY: the caller promises live handles or null.
    let (Some(f), Some(s)) = (unsafe { ffi::object(far) }, unsafe { ffi::object(section) }) else {
        return Err("null store or section".into());
    };
    owned(s.owner, "section").map_err(|_| {
        "the section belongs to another thread; make one section per thread".to_string()
    })?;
    let v = FarVec::named(&f.0, &s.section, bytes, name).map_err(|e| e.to_string())?;
    Ok((v, s.owner))
}

/// A far vector of `len` elements of `elem_size` bytes each, reading as zeros until written,
/// in `far` and cached in `section`. Null on failure.
///
/// # Safety
/// `far` is from `tp_far_open` and `section` from `tp_section_new`, both live.
#[no_mangle]
pub unsafe extern "C" fn tp_far_vec_new(
    far: *const tp_far,
    section: *const tp_section,
    elem_size: usize,
    len: usize,
) -> *mut tp_far_vec {
    construct(|| {
        if elem_size == 0 {
            return Err("elem_size must be at least 1".into());
        }
        let bytes = elem_size
            .checked_mul(len)
            .ok_or_else(|| format!("{len} elements of {elem_size} bytes overflow"))?;
        // SAFETY: the caller promises live handles.
        let (v, owner) = unsafe { new_bytes(far, section, bytes, "C tp_far_vec") }?;
        Ok(tp_far_vec {
            v,
            elem: elem_size,
            owner,
        })
    })
}

/// Frees a far vector and its far copies. Must be called from its section's thread; from
/// another one, it is leaked rather than freed.
///
/// # Safety
/// `vec` is null or from `tp_far_vec_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_far_vec_free(vec: *mut tp_far_vec) {
    // SAFETY: the caller promises a live handle or null.
    if let Some(v) = unsafe { ffi::object(vec) } {
        if owned(v.owner, "far vector").is_err() {
            return;
        }
    }
    // SAFETY: as above; freed once.
    unsafe { ffi::free(vec) }
}

/// The vector's handle, checked for its thread.
///
/// # Safety
/// `vec` is null or a live handle.
unsafe fn vec_of<'a>(vec: *const tp_far_vec) -> Result<&'a tp_far_vec, tp_status> {
    // SAFETY: the caller promises a live handle or null.
    let v = unsafe { ffi::object(vec) }.ok_or_else(|| fail(TP_EINVAL, "null far vector"))?;
    owned(v.owner, "far vector")?;
    Ok(v)
}

/// Elements in the vector (0 for null).
///
/// # Safety
/// `vec` is null or from `tp_far_vec_new`, live.
#[no_mangle]
pub unsafe extern "C" fn tp_far_vec_len(vec: *const tp_far_vec) -> usize {
    // SAFETY: the caller promises a live handle or null.
    unsafe { ffi::object(vec) }.map_or(0, |v| v.v.len() / v.elem)
}

/// Copies `count` elements from index `first` into `out` (`count * elem_size` bytes).
///
/// # Safety
/// `vec` is from `tp_far_vec_new`; `out` has room for `count` elements.
#[no_mangle]
pub unsafe extern "C" fn tp_far_vec_read(
    vec: *const tp_far_vec,
    first: usize,
    count: usize,
    out: *mut c_void,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle.
        let v = match unsafe { vec_of(vec) } {
            Ok(v) => v,
            Err(e) => return e,
        };
        let Some((at, n)) = span(v, first, count) else {
            return fail(TP_EINVAL, "the range overflows");
        };
        // SAFETY: the caller promises room for `count` elements at `out`.
        unsafe { read_bytes(&v.v, at, out, n) }
    })
}

/// Copies `count` elements from `src` over the vector's from index `first`.
///
/// # Safety
/// `vec` is from `tp_far_vec_new`; `src` holds `count` elements.
#[no_mangle]
pub unsafe extern "C" fn tp_far_vec_write(
    vec: *const tp_far_vec,
    first: usize,
    count: usize,
    src: *const c_void,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle.
        let v = match unsafe { vec_of(vec) } {
            Ok(v) => v,
            Err(e) => return e,
        };
        let Some((at, n)) = span(v, first, count) else {
            return fail(TP_EINVAL, "the range overflows");
        };
        // SAFETY: the caller promises `count` elements at `src`.
        unsafe { write_bytes(&v.v, at, src, n) }
    })
}

/// Copies `len` bytes from byte `at` of `v` to `out`.
///
/// # Safety
/// `out` has room for `len` bytes.
unsafe fn read_bytes(v: &FarVec<u8>, at: usize, out: *mut c_void, len: usize) -> tp_status {
    // SAFETY: the caller's promise.
    let Some(out) = (unsafe { ffi::bytes_mut(out, len) }) else {
        return fail(TP_EINVAL, "null output");
    };
    v.read_into(at, out).map_or_else(far_error, |()| TP_OK)
}

/// Copies `len` bytes from `src` to byte `at` of `v`.
///
/// # Safety
/// `src` holds `len` bytes.
unsafe fn write_bytes(v: &FarVec<u8>, at: usize, src: *const c_void, len: usize) -> tp_status {
    // SAFETY: the caller's promise.
    let Some(src) = (unsafe { ffi::bytes(src, len) }) else {
        return fail(TP_EINVAL, "null source");
    };
    v.write_from(at, src).map_or_else(far_error, |()| TP_OK)
}

/// Byte offset and length of `count` elements from `first`.
fn span(v: &tp_far_vec, first: usize, count: usize) -> Option<(usize, usize)> {
    Some((first.checked_mul(v.elem)?, count.checked_mul(v.elem)?))
}

/// Writes the vector's changed lines back to the store (they stay cached).
///
/// # Safety
/// `vec` is from `tp_far_vec_new`, live.
#[no_mangle]
pub unsafe extern "C" fn tp_far_vec_flush(vec: *const tp_far_vec) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle.
        match unsafe { vec_of(vec) } {
            Ok(v) => v.v.flush().map_or_else(far_error, |()| TP_OK),
            Err(e) => e,
        }
    })
}

/// A far block of `size` bytes, reading as zeros until written. Null on failure.
///
/// # Safety
/// `far` is from `tp_far_open` and `section` from `tp_section_new`, both live.
#[no_mangle]
pub unsafe extern "C" fn tp_far_block_new(
    far: *const tp_far,
    section: *const tp_section,
    size: usize,
) -> *mut tp_far_block {
    construct(|| {
        // SAFETY: the caller promises live handles.
        let (v, owner) = unsafe { new_bytes(far, section, size, "C tp_far_block") }?;
        Ok(tp_far_block { v, owner })
    })
}

/// Frees a far block and its far copy. Must be called from its section's thread; from
/// another one, it is leaked rather than freed.
///
/// # Safety
/// `block` is null or from `tp_far_block_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_far_block_free(block: *mut tp_far_block) {
    // SAFETY: the caller promises a live handle or null.
    if let Some(b) = unsafe { ffi::object(block) } {
        if owned(b.owner, "far block").is_err() {
            return;
        }
    }
    // SAFETY: as above; freed once.
    unsafe { ffi::free(block) }
}

/// The block's size in bytes (0 for null).
///
/// # Safety
/// `block` is null or from `tp_far_block_new`, live.
#[no_mangle]
pub unsafe extern "C" fn tp_far_block_size(block: *const tp_far_block) -> usize {
    // SAFETY: the caller promises a live handle or null.
    unsafe { ffi::object(block) }.map_or(0, |b| b.v.len())
}

/// The block's handle, checked for its thread.
///
/// # Safety
/// `block` is null or a live handle.
unsafe fn block_of<'a>(block: *const tp_far_block) -> Result<&'a tp_far_block, tp_status> {
    // SAFETY: the caller promises a live handle or null.
    let b = unsafe { ffi::object(block) }.ok_or_else(|| fail(TP_EINVAL, "null far block"))?;
    owned(b.owner, "far block")?;
    Ok(b)
}

/// Copies `len` bytes from `offset` of the block into `out` (only their lines are fetched).
///
/// # Safety
/// `block` is from `tp_far_block_new`; `out` has room for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn tp_far_block_read(
    block: *const tp_far_block,
    offset: usize,
    out: *mut c_void,
    len: usize,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle.
        let b = match unsafe { block_of(block) } {
            Ok(b) => b,
            Err(e) => return e,
        };
        // SAFETY: the caller promises room for `len` bytes at `out`.
        unsafe { read_bytes(&b.v, offset, out, len) }
    })
}

/// Copies `len` bytes from `src` to `offset` of the block.
///
/// # Safety
/// `block` is from `tp_far_block_new`; `src` holds `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn tp_far_block_write(
    block: *const tp_far_block,
    offset: usize,
    src: *const c_void,
    len: usize,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle.
        let b = match unsafe { block_of(block) } {
            Ok(b) => b,
            Err(e) => return e,
        };
        // SAFETY: the caller promises `len` bytes at `src`.
        unsafe { write_bytes(&b.v, offset, src, len) }
    })
}

/// Writes the block's changed lines back to the store (they stay cached).
///
/// # Safety
/// `block` is from `tp_far_block_new`, live.
#[no_mangle]
pub unsafe extern "C" fn tp_far_block_flush(block: *const tp_far_block) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle.
        match unsafe { block_of(block) } {
            Ok(b) => b.v.flush().map_or_else(far_error, |()| TP_OK),
            Err(e) => e,
        }
    })
}
