//! The C malloc family's semantics (glibc's where C leaves room), over the arena and large paths.
//! `libtidepool_malloc.so` exports these under their C names; the Rust face uses them too.

use crate::block::Block;
use crate::classes::{aligned_class, class_of, CLASS_LUT, LUT_MAX, MAX_SMALL, PAGE};
use crate::heap;
use crate::large;
use crate::medium::{self, MEDIUM_MIN};
use crate::os;
use crate::region;
use crate::tls;
use core::ffi::c_void;

/// Allocates `n` bytes, 16-byte aligned, and says whether they are known zero.
#[inline(always)]
fn alloc_block(n: usize) -> Block {
    let tbl = tls::table();
    let Some(c) = small_class(n) else {
        return alloc_big(n);
    };
    // SAFETY: `tbl` is this thread's table and `c` a valid class.
    unsafe { heap::alloc(tbl, c) }
}

/// `malloc`.
#[inline(always)]
pub fn malloc(n: usize) -> *mut c_void {
    let tbl = tls::table();
    let Some(c) = small_class(n) else {
        return alloc_big(n).ptr.cast();
    };
    // SAFETY: `tbl` is this thread's table and `c` a valid class.
    unsafe { heap::alloc(tbl, c) }.ptr.cast()
}

/// The class of a request for the arenas; `None` for the medium and large paths.
#[inline(always)]
fn small_class(n: usize) -> Option<usize> {
    Some(if n <= LUT_MAX {
        // One load for every size up to 1 KiB: programs whose sizes straddle 128 bytes
        // (larson's 8-1000) mispredicted a branch there on one request in eight.
        // SAFETY: (n + 15) >> 4 <= LUT_MAX / 16 for n <= LUT_MAX.
        unsafe { *CLASS_LUT.get_unchecked((n + 15) >> 4) as usize }
    } else if n <= MEDIUM_MIN {
        class_of(n)
    } else {
        return None;
    })
}

/// Requests above [`MEDIUM_MIN`]: the medium heap up to [`MAX_SMALL`] (its class if the medium
/// span is exhausted), their own mapping beyond.
#[inline(never)]
fn alloc_big(n: usize) -> Block {
    if n <= MAX_SMALL && !tls::unpaged() {
        if region::ensure_init(heap::on_region_ready) {
            if let Some((ptr, fresh)) = medium::alloc(n) {
                return Block { ptr, fresh };
            }
        }
        // SAFETY: this thread's table and a valid class.
        return unsafe { heap::alloc(tls::table(), class_of(n)) };
    }
    // A program that allocates only large objects runs the periodic trim here.
    heap::tick(tls::table());
    large::alloc(n, 16)
}

/// `free`.
///
/// # Safety
/// `p` is null or a live allocation from this allocator.
#[inline(always)]
pub unsafe fn free(p: *mut c_void) {
    let addr = p as usize;
    let tbl = tls::table();
    // SAFETY: the calling thread's table; its region copy is zero until the thread registers.
    let (base, len, shift) = unsafe { ((*tbl).region_base, (*tbl).region_len, (*tbl).span_shift) };
    let off = addr.wrapping_sub(base);
    if off < len {
        // SAFETY: a pointer into class `off >> shift`'s span, per the caller live.
        unsafe { heap::free(tbl, addr, off >> shift) }
    } else {
        // SAFETY: per the caller.
        unsafe { free_elsewhere(tbl, addr) }
    }
}

/// Frees what the thread's copy of the region bounds does not cover: medium and large objects,
/// null, and region pointers freed by a thread that has not registered.
#[inline(never)]
unsafe fn free_elsewhere(tbl: *mut tls::ThreadTable, addr: usize) {
    // SAFETY: per the caller.
    unsafe {
        if region::in_region(addr) {
            heap::free_unregistered(tbl, addr)
        } else if addr != 0 {
            free_big(addr)
        }
    }
}

unsafe fn free_big(addr: usize) {
    // SAFETY: per the caller.
    unsafe {
        if medium::contains(addr) {
            medium::free(addr)
        } else {
            large::free(addr)
        }
    }
}

/// `calloc`: fresh slots and fresh mappings are already zero, so only reused memory is cleared.
pub fn calloc(count: usize, size: usize) -> *mut c_void {
    let Some(n) = count.checked_mul(size) else {
        os::set_errno(libc::ENOMEM);
        return core::ptr::null_mut();
    };
    let b = alloc_block(n);
    if !b.ptr.is_null() && !b.fresh {
        // SAFETY: the block holds at least `n` writable bytes.
        unsafe { core::ptr::write_bytes(b.ptr, 0, n) };
    }
    b.ptr.cast()
}

/// Usable bytes of an allocation (0 for null).
///
/// # Safety
/// As [`free`].
pub unsafe fn usable_size(p: *const c_void) -> usize {
    let addr = p as usize;
    if region::in_region(addr) {
        // SAFETY: per the caller.
        unsafe { heap::usable_size(addr) }
    } else if addr == 0 {
        0
    } else if medium::contains(addr) {
        // SAFETY: per the caller.
        unsafe { medium::usable_size(addr) }
    } else {
        // SAFETY: per the caller.
        unsafe { large::usable_size(addr) }
    }
}

/// `realloc`: null acts as malloc; size 0 frees and returns null (glibc's choice); a small object
/// stays in place while the new size still fits its class without wasting half of it.
///
/// # Safety
/// As [`free`].
pub unsafe fn realloc(p: *mut c_void, n: usize) -> *mut c_void {
    if p.is_null() {
        return malloc(n);
    }
    if n == 0 {
        // SAFETY: per the caller.
        unsafe { free(p) };
        return core::ptr::null_mut();
    }
    let addr = p as usize;
    let small = region::in_region(addr) || medium::contains(addr);
    // SAFETY: per the caller.
    let usable = unsafe { usable_size(p) };
    if small && n <= usable && (n > usable / 2 || usable <= 64) {
        return p;
    }
    if !small && n > MAX_SMALL {
        // SAFETY: per the caller, a live large object.
        return unsafe { large::realloc(addr, n) }.cast();
    }
    let fresh = malloc(n);
    if !fresh.is_null() {
        // SAFETY: both blocks hold at least min(usable, n) bytes and are distinct.
        unsafe {
            core::ptr::copy_nonoverlapping(p as *const u8, fresh as *mut u8, usable.min(n));
            free(p);
        }
    }
    fresh
}

/// `reallocarray`: realloc with an overflow check.
///
/// # Safety
/// As [`free`].
pub unsafe fn reallocarray(p: *mut c_void, count: usize, size: usize) -> *mut c_void {
    match count.checked_mul(size) {
        // SAFETY: per the caller.
        Some(n) => unsafe { realloc(p, n) },
        None => {
            os::set_errno(libc::ENOMEM);
            core::ptr::null_mut()
        }
    }
}

/// Allocates `n` bytes aligned to `align`, a power of two.
pub fn aligned_block(align: usize, n: usize) -> Block {
    if align <= 16 {
        return alloc_block(n);
    }
    if n <= MAX_SMALL && align <= MAX_SMALL {
        if let Some(c) = aligned_class(class_of(n), align) {
            // SAFETY: this thread's table and a valid class.
            return unsafe { heap::alloc(tls::table(), c) };
        }
    }
    large::alloc(n, align)
}

/// `posix_memalign`.
///
/// # Safety
/// `out` is valid for a pointer write.
pub unsafe fn posix_memalign(out: *mut *mut c_void, align: usize, n: usize) -> i32 {
    if !align.is_power_of_two() || !align.is_multiple_of(core::mem::size_of::<usize>()) {
        return libc::EINVAL;
    }
    let p = aligned_block(align, n).ptr;
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: per the caller.
    unsafe { *out = p.cast() };
    0
}

/// `aligned_alloc`: the alignment must be a power of two (C17 leaves others undefined; we fail
/// them with EINVAL, as glibc 2.38 does).
pub fn aligned_alloc(align: usize, n: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        os::set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    aligned_block(align, n).ptr.cast()
}

/// `memalign`: like glibc, rounds an alignment that is not a power of two up to one.
pub fn memalign(align: usize, n: usize) -> *mut c_void {
    let Some(align) = align.max(1).checked_next_power_of_two() else {
        os::set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    };
    aligned_block(align, n).ptr.cast()
}

/// `valloc`: page-aligned.
pub fn valloc(n: usize) -> *mut c_void {
    aligned_block(PAGE, n).ptr.cast()
}

/// `pvalloc`: page-aligned, size rounded up to whole pages (at least one).
pub fn pvalloc(n: usize) -> *mut c_void {
    let Some(rounded) = n.max(1).checked_add(PAGE - 1).map(|r| r & !(PAGE - 1)) else {
        os::set_errno(libc::ENOMEM);
        return core::ptr::null_mut();
    };
    aligned_block(PAGE, rounded).ptr.cast()
}

/// `malloc_trim`: gives back empty arenas beyond the retained budget and the large-object cache.
pub fn trim() -> i32 {
    heap::trim(tls::table() as usize, true);
    large::trim();
    1
}
