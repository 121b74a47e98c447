//! The program's own anonymous memory: `mmap`, `munmap`, `mremap` and `madvise`, interposed.
//!
//! Many programs get most of their memory straight from the kernel, not from malloc: CPython's
//! object allocator takes 1 MiB arenas with mmap, and so do JITs and custom allocators. A private
//! anonymous read-write mapping with no address asked for is served from the pager's large
//! region instead, so it lives in far memory like the heap. Everything else (files, shared
//! memory, stacks, fixed addresses, other protections) goes to the kernel unchanged, as do all
//! calls from pager threads, from forked children and from before the pager starts.
//!
//! glibc's own mappings (malloc's, thread stacks) use its internal entry points and never reach
//! these. Calls within the large region keep their meaning: munmap and madvise(DONTNEED/FREE)
//! drop the pages (they read as zero after), mremap grows in place or moves with a copy.
//!
//! Known limit: mapping over part of a served range with MAP_FIXED is passed to the kernel, and
//! the pager still believes it owns those pages; programs that do this should not run under
//! `tidepool run`.

use crate::{owning, paged_region, paging};
use core::ffi::{c_int, c_void};
use libc::{off_t, MAP_FAILED};
use tidepool_pager::PAGE;

/// The bits of the flags that say private or shared.
const MAP_TYPE: c_int = 0x0f;
/// Flags that make a private anonymous mapping something other than plain memory.
const NOT_PLAIN: c_int = libc::MAP_FIXED
    | libc::MAP_FIXED_NOREPLACE
    | libc::MAP_STACK
    | libc::MAP_GROWSDOWN
    | libc::MAP_HUGETLB;

fn set_errno(errno: c_int) {
    // SAFETY: errno is thread-local and always writable.
    unsafe { *libc::__errno_location() = errno };
}

fn fail(errno: c_int) -> *mut c_void {
    set_errno(errno);
    MAP_FAILED
}

fn fail_int(errno: c_int) -> c_int {
    set_errno(errno);
    -1
}

/// # Safety
/// The mmap(2) contract.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    let plain = addr.is_null()
        && len != 0
        && prot == libc::PROT_READ | libc::PROT_WRITE
        && flags & libc::MAP_ANONYMOUS != 0
        && flags & MAP_TYPE == libc::MAP_PRIVATE
        && flags & NOT_PLAIN == 0;
    if plain {
        if let Some(p) = paging().and_then(|rt| rt.take(len)) {
            return p as *mut c_void;
        }
    }
    // SAFETY: the caller's arguments, passed to the system call unchanged.
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, offset) as *mut c_void }
}

/// # Safety
/// As `mmap`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    // SAFETY: the same contract.
    unsafe { mmap(addr, len, prot, flags, fd, offset) }
}

/// # Safety
/// The munmap(2) contract.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    if let Some(rt) = owning(addr as usize) {
        if !(addr as usize).is_multiple_of(PAGE) || len == 0 {
            return fail_int(libc::EINVAL);
        }
        // SAFETY: the program gives the range up (munmap's contract).
        unsafe { rt.release(addr as usize, len) };
        return 0;
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int }
}

/// mremap is variadic in C (the fifth argument exists only with MREMAP_FIXED). On x86-64 a
/// variadic call passes its arguments exactly as a call with a fixed fifth one would, so it is
/// declared with the fifth argument and reads it only when the flag says it is there.
///
/// # Safety
/// The mremap(2) contract.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let Some(rt) = owning(old as usize) else {
        let new_addr = if flags & libc::MREMAP_FIXED != 0 {
            new_addr
        } else {
            core::ptr::null_mut()
        };
        // SAFETY: the caller's arguments, passed on.
        return unsafe {
            libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void
        };
    };
    let addr = old as usize;
    if !addr.is_multiple_of(PAGE)
        || old_len == 0
        || new_len == 0
        || flags & !libc::MREMAP_MAYMOVE != 0
    {
        // Moving to a fixed address or keeping the old mapping is not supported in the region.
        return fail(libc::EINVAL);
    }
    let old_len = old_len.next_multiple_of(PAGE);
    let new_len = new_len.next_multiple_of(PAGE);
    if new_len <= old_len {
        // SAFETY: the program gives up the tail (mremap's contract).
        unsafe { rt.release(addr + new_len, old_len - new_len) };
        return old;
    }
    if rt.grow_in_place(addr, old_len, new_len) {
        return old;
    }
    if flags & libc::MREMAP_MAYMOVE == 0 {
        return fail(libc::ENOMEM);
    }
    let Some(new) = paging().and_then(|rt| rt.take(new_len)) else {
        return fail(libc::ENOMEM);
    };
    // SAFETY: both ranges are in the region, taken, and distinct; the old one is the program's
    // for `old_len` bytes and is given up after the copy (mremap's contract).
    unsafe {
        core::ptr::copy_nonoverlapping(old as *const u8, new as *mut u8, old_len);
        rt.release(addr, old_len);
    }
    new as *mut c_void
}

/// # Safety
/// The madvise(2) contract.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    let drops = matches!(
        advice,
        libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE
    );
    if matches!(advice, libc::MADV_HUGEPAGE | libc::MADV_NOHUGEPAGE)
        && owning(addr as usize).is_some()
    {
        return 0;
    }
    if drops {
        // Memory the allocator handed out counts too: redis's forked child gives back the
        // pages of values it has saved with MADV_DONTNEED on malloc'd memory.
        if let Some(region) = paged_region(addr as usize) {
            if !(addr as usize).is_multiple_of(PAGE) {
                return fail_int(libc::EINVAL);
            }
            let len = len.next_multiple_of(PAGE);
            // SAFETY: the program says it no longer needs the contents (madvise's contract);
            // private anonymous pages read as zero afterwards, as they do here.
            unsafe { region.discard(addr as usize, len) };
            return 0;
        }
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) as c_int }
}
