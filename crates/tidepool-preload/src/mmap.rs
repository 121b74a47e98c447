//! The program's own memory calls, interposed: `mmap`, `munmap`, `mremap`, `mprotect`,
//! `madvise`, the `mlock` family, and `brk`/`sbrk`.
//!
//! Many programs get most of their memory straight from the kernel, not from malloc: CPython's
//! object allocator takes 1 MiB arenas with mmap, and so do JITs and allocators with arenas of
//! their own (jemalloc, tcmalloc, mimalloc). A private anonymous mapping with no address asked
//! for (read-write, read-only or inaccessible: a reservation to be opened later) is served from
//! the pager's large region instead, so it lives in far memory like the heap. Files, shared
//! memory, stacks, huge pages and executable memory go to the kernel unchanged, as do all calls
//! from pager threads and from before the pager starts.
//!
//! glibc's own mappings (thread stacks, the loader's) use its internal entry points and never
//! reach these. Inside the pager's regions every call keeps its meaning on Linux:
//!
//! | call | inside a paged region |
//! |---|---|
//! | munmap (whole or part) | the pages read as zero again, free for reuse |
//! | mremap | shrinks in place, grows in place or moves (MREMAP_MAYMOVE, MREMAP_FIXED, MREMAP_DONTUNMAP) by copying |
//! | mprotect | applied and remembered (an inaccessible page is not evicted) |
//! | MAP_FIXED anonymous over a paged range | fresh zeros there; MAP_FIXED_NOREPLACE fails with EEXIST on a range in use |
//! | MAP_FIXED of a file or shared memory | the kernel's mapping; the pager leaves those pages alone until they are unmapped |
//! | madvise DONTNEED, FREE | the pages read as zero |
//! | madvise REMOVE | EINVAL, as on private anonymous memory |
//! | madvise HUGEPAGE, NOHUGEPAGE | accepted, no effect (the pager maps 4 KiB pages) |
//! | madvise DONTFORK, WIPEONFORK (and their undoing) | applied and remembered for the child's pager |
//! | mlock, mlock2, munlock, mlockall, munlockall | accepted, no effect: far memory cannot be locked in (mlockall would fault in the whole reservation) |
//! | brk, sbrk | a break of its own in the large region, paged like the rest |

use crate::{owning, paged_region, paged_region_start_in, paging, Runtime};
use core::ffi::{c_int, c_long, c_void};
use libc::{off_t, MAP_FAILED};
use std::sync::Mutex;
use tidepool_pager::{ForkAdvice, PAGE};

/// The bits of the flags that say private or shared.
const MAP_TYPE: c_int = 0x0f;
/// Flags that make a private anonymous mapping something other than plain memory.
const NOT_PLAIN: c_int = libc::MAP_STACK | libc::MAP_GROWSDOWN | libc::MAP_HUGETLB;
const RW: c_int = libc::PROT_READ | libc::PROT_WRITE;

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

/// The kernel's mmap.
///
/// # Safety
/// The mmap(2) contract.
unsafe fn sys_mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    // SAFETY: the caller's arguments, passed to the system call unchanged.
    unsafe {
        tidepool_sys::syscall!(libc::SYS_mmap, addr, len, prot, flags, fd, offset) as *mut c_void
    }
}

/// Memory the pager can serve: private, anonymous, plain, and not executable.
fn pageable(prot: c_int, flags: c_int) -> bool {
    flags & libc::MAP_ANONYMOUS != 0
        && flags & MAP_TYPE == libc::MAP_PRIVATE
        && flags & NOT_PLAIN == 0
        && prot & !RW == 0
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
    let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
    let Some(rt) = paging() else {
        // SAFETY: passed on.
        return unsafe { sys_mmap(addr, len, prot, flags, fd, offset) };
    };
    if len == 0 {
        return fail(libc::EINVAL);
    }
    if !fixed {
        if pageable(prot, flags) {
            if let Some(p) = rt.take(len, Some(crate::sites::caller_section(rt, "mmap"))) {
                if prot != RW {
                    if let Err(e) = rt.large.protect(p, len.next_multiple_of(PAGE), prot) {
                        // SAFETY: the range was just taken and nobody has seen it.
                        unsafe { rt.release(p, len) };
                        return fail(e.raw_os_error().unwrap_or(libc::ENOMEM));
                    }
                }
                return p as *mut c_void;
            }
        }
        // SAFETY: passed on (a hint inside a region is only a hint: the kernel places it
        // elsewhere, since the whole region is mapped).
        return unsafe { sys_mmap(addr, len, prot, flags, fd, offset) };
    }
    let at = addr as usize;
    let len = len.next_multiple_of(PAGE);
    if !at.is_multiple_of(PAGE) {
        return fail(libc::EINVAL);
    }
    if rt.holds(at, len) {
        if flags & libc::MAP_FIXED_NOREPLACE != 0
            && flags & libc::MAP_FIXED == 0
            && !rt.is_free(at, len)
        {
            return fail(libc::EEXIST);
        }
        if pageable(prot, flags) {
            // SAFETY: MAP_FIXED's contract: the program gives up what it had there.
            return match unsafe { rt.place(at, len, prot) } {
                Ok(()) => addr,
                Err(e) => fail(e),
            };
        }
        // A file, shared memory, executable memory: the kernel's, over ceded pages.
        // SAFETY: as above.
        if let Err(e) = unsafe { rt.cede(at, len) } {
            return fail(e);
        }
        // SAFETY: passed on.
        let p = unsafe { sys_mmap(addr, len, prot, flags, fd, offset) };
        if p == MAP_FAILED {
            // The kernel left the old mapping: the range is paged again, as zeros.
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            // SAFETY: the program gave the range up above.
            unsafe { rt.release(at, len) };
            return fail(errno);
        }
        return p;
    }
    // Elsewhere, or straddling a region's edge: the kernel's (a program placing a mapping over
    // the allocator's heap is breaking it on Linux too).
    // SAFETY: passed on.
    unsafe { sys_mmap(addr, len, prot, flags, fd, offset) }
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

/// A range: (address, length).
type Span = (usize, usize);

/// Splits `[addr, addr + len)` at the large region's edges: the part inside (if any) and the
/// parts outside, for calls that act on each part as the kernel would.
fn split(rt: &Runtime, addr: usize, len: usize) -> (Option<Span>, [Span; 2]) {
    let (base, end) = (rt.large.base(), rt.large.base() + rt.large.len());
    let stop = addr.saturating_add(len);
    let (lo, hi) = (addr.max(base), stop.min(end));
    let inside = (lo < hi).then(|| (lo, hi - lo));
    let below = (addr, stop.min(base).saturating_sub(addr));
    let above = (addr.max(end), stop.saturating_sub(addr.max(end)));
    (inside, [below, above])
}

/// # Safety
/// The munmap(2) contract.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    let Some(rt) = crate::RUNTIME.get() else {
        // SAFETY: passed on.
        return unsafe { tidepool_sys::syscall!(libc::SYS_munmap, addr, len) as c_int };
    };
    let at = addr as usize;
    if !at.is_multiple_of(PAGE) || len == 0 {
        return fail_int(libc::EINVAL);
    }
    let (inside, outside) = split(rt, at, len);
    let Some((a, l)) = inside else {
        // SAFETY: passed on.
        return unsafe { tidepool_sys::syscall!(libc::SYS_munmap, addr, len) as c_int };
    };
    // SAFETY: the program gives the range up (munmap's contract).
    unsafe { rt.release(a, l) };
    for (a, l) in outside {
        if l > 0 {
            // SAFETY: the program's own range outside the region, passed on.
            unsafe { tidepool_sys::syscall!(libc::SYS_munmap, a, l) };
        }
    }
    0
}

/// The target of a MREMAP_FIXED move of `old_len` bytes at `addr` to `to`: made ready (given
/// back to the region, or mapped fresh outside it). The error is what mremap returns.
///
/// # Safety
/// The mremap(2) contract: the program gives up what it had at the target.
unsafe fn fixed_target(
    rt: &Runtime,
    addr: usize,
    old_len: usize,
    new_len: usize,
    to: usize,
) -> Result<usize, *mut c_void> {
    if to < addr + old_len && addr < to + new_len {
        return Err(fail(libc::EINVAL));
    }
    if rt.holds(to, new_len) {
        // SAFETY: the program gives up what it had at the target (mremap's contract).
        if let Err(e) = unsafe { rt.place(to, new_len, RW) } {
            return Err(fail(e));
        }
    } else {
        // Outside the region: fresh memory of the kernel's there.
        // SAFETY: as above; a private anonymous mapping at the program's address.
        let p = unsafe {
            sys_mmap(
                to as *mut c_void,
                new_len,
                RW,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == MAP_FAILED {
            return Err(MAP_FAILED);
        }
    }
    Ok(to)
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
    let fixed = flags & libc::MREMAP_FIXED != 0;
    let new_addr = if fixed {
        new_addr
    } else {
        core::ptr::null_mut()
    };
    let addr = old as usize;
    let Some(rt) = owning(addr) else {
        if let (true, Some(rt)) = (fixed, paging()) {
            // A mapping of the kernel's moved into the large region: those pages are its.
            let len = new_len.next_multiple_of(PAGE);
            if rt.holds(new_addr as usize, len) {
                // SAFETY: the program gives up the target range (mremap's contract).
                if let Err(e) = unsafe { rt.cede(new_addr as usize, len) } {
                    return fail(e);
                }
            }
        }
        // SAFETY: the caller's arguments, passed on.
        return unsafe {
            tidepool_sys::syscall!(libc::SYS_mremap, old, old_len, new_len, flags, new_addr)
                as *mut c_void
        };
    };
    let known = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
    let may_move = flags & libc::MREMAP_MAYMOVE != 0;
    let dont_unmap = flags & libc::MREMAP_DONTUNMAP != 0;
    if !addr.is_multiple_of(PAGE)
        || new_len == 0
        || old_len == 0
        || flags & !known != 0
        || ((fixed || dont_unmap) && !may_move)
        || (dont_unmap && old_len != new_len)
        || (fixed && !(new_addr as usize).is_multiple_of(PAGE))
    {
        return fail(libc::EINVAL);
    }
    let old_len = old_len.next_multiple_of(PAGE);
    let new_len = new_len.next_multiple_of(PAGE);
    if !rt.holds(addr, old_len) || rt.any_foreign(addr, old_len) {
        // Not one mapping of paged memory (Linux: EFAULT).
        return fail(libc::EFAULT);
    }
    if !fixed && !dont_unmap {
        if new_len <= old_len {
            // SAFETY: the program gives up the tail (mremap's contract).
            unsafe { rt.release(addr + new_len, old_len - new_len) };
            return old;
        }
        if rt.grow_in_place(addr, old_len, new_len) {
            return old;
        }
        if !may_move {
            return fail(libc::ENOMEM);
        }
    }
    // Moving: to the address given, else wherever there is room.
    let target = if fixed {
        // SAFETY: mremap's contract, passed on.
        match unsafe { fixed_target(rt, addr, old_len, new_len, new_addr as usize) } {
            Ok(to) => to,
            Err(failed) => return failed,
        }
    } else {
        match paging().and_then(|rt| rt.take(new_len, Some(rt.large.section_at(addr)))) {
            Some(p) => p,
            None => return fail(libc::ENOMEM),
        }
    };
    // SAFETY: both ranges are the program's for these lengths and distinct; the old one is
    // given up after the copy (mremap's contract).
    unsafe {
        core::ptr::copy_nonoverlapping(old as *const u8, target as *mut u8, old_len.min(new_len));
        if dont_unmap {
            // The old range stays mapped, empty: it reads as zero.
            rt.large.reset(addr, old_len);
        } else {
            rt.release(addr, old_len);
        }
    }
    target as *mut c_void
}

/// # Safety
/// The mprotect(2) contract.
#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe { protect(addr as usize, len, prot, None) }
}

/// # Safety
/// The pkey_mprotect(2) contract. glibc's wrapper makes the system call itself, so without
/// this the pager would not learn that a paged page became inaccessible.
#[no_mangle]
pub unsafe extern "C" fn pkey_mprotect(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    pkey: c_int,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe { protect(addr as usize, len, prot, Some(pkey)) }
}

/// mprotect(2), or pkey_mprotect(2) with a key: the pager records the protection of the
/// paged part (it must never read a page the program made inaccessible), the kernel sets it
/// everywhere, the key included.
///
/// # Safety
/// The mprotect(2) contract.
unsafe fn protect(at: usize, len: usize, prot: c_int, pkey: Option<c_int>) -> c_int {
    let kernel = |start: usize, len: usize| -> c_int {
        // SAFETY: the caller's range (or a part of it) and protection, passed on.
        unsafe {
            match pkey {
                None => tidepool_sys::syscall!(libc::SYS_mprotect, start, len, prot) as c_int,
                Some(k) => {
                    tidepool_sys::syscall!(libc::SYS_pkey_mprotect, start, len, prot, k) as c_int
                }
            }
        }
    };
    let end = at.saturating_add(len.next_multiple_of(PAGE));
    let Some(region) = paged_region(at) else {
        if let Some(base) = paged_region_start_in(at, end).filter(|_| at.is_multiple_of(PAGE)) {
            // From outside into a region: the part below it, then the region's.
            let r = kernel(at, base - at);
            if r != 0 {
                return r;
            }
            // SAFETY: the rest of the caller's range.
            return unsafe { protect(base, end - base, prot, pkey) };
        }
        return kernel(at, len);
    };
    if !at.is_multiple_of(PAGE) {
        return fail_int(libc::EINVAL);
    }
    let inside = end.min(region.base() + region.len()) - at;
    if let Err(e) = region.protect(at, inside, prot) {
        return fail_int(e.raw_os_error().unwrap_or(libc::EINVAL));
    }
    if pkey.is_some() {
        // The key, on top of the protection the pager set.
        let r = kernel(at, inside);
        if r != 0 {
            return r;
        }
    }
    if at + inside < end {
        // SAFETY: the part past the region, passed on (it may begin another region).
        return unsafe { protect(at + inside, end - at - inside, prot, pkey) };
    }
    0
}

/// # Safety
/// The madvise(2) contract.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    let at = addr as usize;
    let Some(region) = paged_region(at) else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { tidepool_sys::syscall!(libc::SYS_madvise, addr, len, advice) as c_int };
    };
    if !at.is_multiple_of(PAGE) {
        return fail_int(libc::EINVAL);
    }
    let whole = len;
    let len = len
        .next_multiple_of(PAGE)
        .min(region.base() + region.len() - at);
    match advice {
        // Memory the allocator handed out counts too: redis's forked child gives back the
        // pages of values it has saved with MADV_DONTNEED on malloc'd memory.
        libc::MADV_DONTNEED | libc::MADV_FREE => {
            // SAFETY: the program says it no longer needs the contents (madvise's contract);
            // private anonymous pages read as zero afterwards, as they do here.
            unsafe { region.discard(at, len) };
            0
        }
        // Only shared memory and files have holes to punch.
        libc::MADV_REMOVE => fail_int(libc::EINVAL),
        libc::MADV_HUGEPAGE | libc::MADV_NOHUGEPAGE => 0,
        a => match ForkAdvice::from_madvise(a) {
            Some(advice) => match region.advise_fork(at, len, advice) {
                Ok(()) => 0,
                Err(e) => fail_int(e.raw_os_error().unwrap_or(libc::EINVAL)),
            },
            // SAFETY: the caller's arguments, passed on: other advice changes no contents.
            None => unsafe {
                tidepool_sys::syscall!(libc::SYS_madvise, addr, whole, advice) as c_int
            },
        },
    }
}

/// Locking paged memory in is accepted and has no effect: far memory cannot be pinned local.
///
/// # Safety
/// The mlock(2) contract.
#[no_mangle]
pub unsafe extern "C" fn mlock(addr: *const c_void, len: usize) -> c_int {
    if paged_region(addr as usize).is_some() {
        return 0;
    }
    // SAFETY: passed on.
    unsafe { tidepool_sys::syscall!(libc::SYS_mlock, addr, len) as c_int }
}

/// # Safety
/// The mlock2(2) contract.
#[no_mangle]
pub unsafe extern "C" fn mlock2(addr: *const c_void, len: usize, flags: libc::c_uint) -> c_int {
    if paged_region(addr as usize).is_some() {
        return 0;
    }
    // SAFETY: passed on.
    unsafe { tidepool_sys::syscall!(libc::SYS_mlock2, addr, len, flags) as c_int }
}

/// # Safety
/// The munlock(2) contract.
#[no_mangle]
pub unsafe extern "C" fn munlock(addr: *const c_void, len: usize) -> c_int {
    if paged_region(addr as usize).is_some() {
        return 0;
    }
    // SAFETY: passed on.
    unsafe { tidepool_sys::syscall!(libc::SYS_munlock, addr, len) as c_int }
}

/// mlockall would fault in every page of the pager's reservations (a terabyte of address
/// space); under the pager it is accepted and has no effect.
///
/// # Safety
/// The mlockall(2) contract.
#[no_mangle]
pub unsafe extern "C" fn mlockall(flags: c_int) -> c_int {
    if crate::RUNTIME.get().is_some() {
        return 0;
    }
    // SAFETY: passed on.
    unsafe { tidepool_sys::syscall!(libc::SYS_mlockall, flags) as c_int }
}

/// # Safety
/// The munlockall(2) contract.
#[no_mangle]
pub unsafe extern "C" fn munlockall() -> c_int {
    if crate::RUNTIME.get().is_some() {
        return 0;
    }
    // SAFETY: no arguments.
    unsafe { tidepool_sys::syscall!(libc::SYS_munlockall) as c_int }
}

/// The program's break, kept in the large region: (start, current break, limit). Programs and
/// allocators that grow their heap with sbrk (tcmalloc first tries it) get paged memory.
static BREAK: Mutex<Option<(usize, usize, usize)>> = Mutex::new(None);
/// Address space a break may grow into.
const BREAK_SPAN: usize = 64 << 30;

/// Moves the break to `want` (`None`: leave it), as brk(2) does; returns the break after.
fn move_break(want: impl FnOnce(usize) -> Option<usize>) -> Result<(usize, usize), c_int> {
    let rt = paging().ok_or(libc::ENOMEM)?;
    let mut b = BREAK.lock().unwrap_or_else(|e| e.into_inner());
    let (start, cur, limit) = match *b {
        Some(v) => v,
        None => {
            let start = rt.take(BREAK_SPAN, None).ok_or(libc::ENOMEM)?;
            *b = Some((start, start, start + BREAK_SPAN));
            (start, start, start + BREAK_SPAN)
        }
    };
    let Some(new) = want(cur) else {
        return Ok((cur, cur));
    };
    if new < start || new > limit {
        return Err(libc::ENOMEM);
    }
    if new < cur {
        // The kernel frees the pages above a lowered break; grown again they read as zero.
        let from = new.next_multiple_of(PAGE);
        let to = cur.next_multiple_of(PAGE);
        if from < to {
            // SAFETY: above the new break: the program gave those bytes up (brk's contract).
            unsafe { rt.large.reset(from, to - from) };
        }
    }
    if new > cur {
        let from = cur & !(PAGE - 1);
        let _ = rt
            .large
            .set_section(from, new - from, rt.pager.section("brk"));
    }
    *b = Some((start, new, limit));
    Ok((cur, new))
}

/// The brk system call's own convention, for `syscall(SYS_brk, addr)`: the break after the
/// call (unchanged if it could not move; `addr` 0 asks for it).
///
/// # Safety
/// The brk(2) contract.
pub(crate) unsafe fn brk_syscall(addr: usize) -> c_long {
    if paging().is_none() {
        // SAFETY: passed on.
        return unsafe { tidepool_sys::syscall!(libc::SYS_brk, addr) };
    }
    match move_break(|_| (addr != 0).then_some(addr)) {
        Ok((_, now)) => now as c_long,
        Err(_) => move_break(|_| None).map_or(0, |(now, _)| now as c_long),
    }
}

/// # Safety
/// The brk(2) contract.
#[no_mangle]
pub unsafe extern "C" fn brk(addr: *mut c_void) -> c_int {
    if paging().is_none() {
        // SAFETY: passed on.
        let now = unsafe { tidepool_sys::syscall!(libc::SYS_brk, addr) } as usize;
        return if now == addr as usize {
            0
        } else {
            fail_int(libc::ENOMEM)
        };
    }
    match move_break(|_| Some(addr as usize)) {
        Ok(_) => 0,
        Err(e) => fail_int(e),
    }
}

/// # Safety
/// The sbrk(2) contract.
#[no_mangle]
pub unsafe extern "C" fn sbrk(increment: libc::intptr_t) -> *mut c_void {
    if paging().is_none() {
        // SAFETY: the kernel's brk, as glibc's sbrk does it.
        unsafe {
            let cur = tidepool_sys::syscall!(libc::SYS_brk, 0) as usize;
            if increment == 0 {
                return cur as *mut c_void;
            }
            let want = cur.wrapping_add_signed(increment);
            let now = tidepool_sys::syscall!(libc::SYS_brk, want) as usize;
            return if now == want {
                cur as *mut c_void
            } else {
                set_errno(libc::ENOMEM);
                usize::MAX as *mut c_void
            };
        }
    }
    match move_break(|cur| (increment != 0).then(|| cur.wrapping_add_signed(increment))) {
        Ok((old, _)) => old as *mut c_void,
        Err(e) => {
            set_errno(e);
            usize::MAX as *mut c_void
        }
    }
}
