//! The system calls the allocator makes, each behind a small function. Nothing here allocates,
//! formats or panics: these run inside malloc.

use core::ffi::{c_char, c_void, CStr};
use core::ptr;

/// Reserves `len` bytes of address space, readable and writable, backed by nothing until touched
/// (`MAP_NORESERVE`: untouched pages are not charged against overcommit).
pub fn reserve(len: usize) -> Option<usize> {
    map_anonymous(len, libc::MAP_NORESERVE)
}

/// Maps `len` fresh zeroed bytes.
pub fn map(len: usize) -> Option<usize> {
    map_anonymous(len, 0)
}

fn map_anonymous(len: usize, extra_flags: i32) -> Option<usize> {
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
    // existing memory.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

/// Unmaps a range this allocator mapped.
///
/// # Safety
/// `[addr, addr + len)` must be a mapping of ours that nothing references any more.
pub unsafe fn unmap(addr: usize, len: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { libc::munmap(addr as *mut c_void, len) };
}

/// Moves or grows a mapping of ours, keeping its contents.
///
/// # Safety
/// `[addr, addr + old_len)` must be a whole mapping of ours; on success the old range is gone.
pub unsafe fn remap(addr: usize, old_len: usize, new_len: usize) -> Option<usize> {
    // SAFETY: guaranteed by the caller; MREMAP_MAYMOVE never overwrites other mappings.
    let p = unsafe { libc::mremap(addr as *mut c_void, old_len, new_len, libc::MREMAP_MAYMOVE) };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

/// Gives the pages of a range back to the kernel; the next touch sees zeroes.
///
/// # Safety
/// The range must be ours and hold nothing anyone still needs.
pub unsafe fn discard(addr: usize, len: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { libc::madvise(addr as *mut c_void, len, libc::MADV_DONTNEED) };
}

/// Pages of `[addr, addr + pages * PAGE)` that are resident, for up to 64 pages.
pub fn resident_pages(addr: usize, pages: usize) -> usize {
    let mut vec = [0u8; 64];
    let pages = pages.min(vec.len());
    // SAFETY: `vec` has room for one byte per page asked about; mincore only reads the mapping.
    let rc = unsafe { libc::mincore(addr as *mut c_void, pages * 4096, vec.as_mut_ptr()) };
    if rc != 0 {
        return 0;
    }
    vec[..pages].iter().filter(|&&b| b & 1 != 0).count()
}

/// Writes all of `bytes` to standard error, ignoring failures (there is nowhere to report them).
pub fn write_stderr(bytes: &[u8]) {
    write_all(2, bytes)
}

/// Opens a file for appending (creating it), without allocating.
pub fn open_append(path: &CStr) -> Option<i32> {
    // SAFETY: a NUL-terminated path; open allocates nothing in user space.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC,
            0o644,
        )
    };
    (fd >= 0).then_some(fd)
}

/// Closes a descriptor from [`open_append`].
pub fn close(fd: i32) {
    // SAFETY: closing a descriptor we opened.
    unsafe { libc::close(fd) };
}

/// Writes all of `bytes` to `fd`, ignoring failures.
pub fn write_all(fd: i32, bytes: &[u8]) {
    let mut rest = bytes;
    while !rest.is_empty() {
        // SAFETY: `rest` is a valid readable slice.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            return;
        }
        rest = &rest[n as usize..];
    }
}

/// Reports a broken heap invariant (double free, foreign pointer) and aborts, as glibc does.
pub fn fatal(message: &[u8]) -> ! {
    write_stderr(b"tidepool-alloc: ");
    write_stderr(message);
    write_stderr(b"\n");
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}

/// `v` in decimal, written at the end of `digits`; what an allocator prints without formatting
/// machinery (which could allocate).
pub fn decimal(mut v: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &digits[at..]
}

/// [`fatal`] with the source location it was raised at (`message at FILE:LINE`): a panic in a
/// library built without std, whose handler cannot format.
pub fn fatal_at(message: &[u8], file: &str, line: u32) -> ! {
    let mut digits = [0u8; 20];
    write_stderr(b"tidepool-alloc: ");
    write_stderr(message);
    write_stderr(b" at ");
    write_stderr(file.as_bytes());
    write_stderr(b":");
    write_stderr(decimal(line.into(), &mut digits));
    write_stderr(b"\n");
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}

/// Sets the calling thread's errno.
pub fn set_errno(code: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = code };
}

/// Reads an environment variable without allocating. Call only during initialisation: the
/// returned bytes live in the environment block, which `setenv` may later replace.
pub fn getenv(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: getenv reads the environment; the name is NUL-terminated.
    let p: *const c_char = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: getenv returned a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// Milliseconds of a coarse monotonic clock (vDSO, no system call).
pub fn coarse_millis() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Yields the CPU while another thread finishes initialising the allocator.
pub fn yield_now() {
    // SAFETY: sched_yield has no preconditions.
    unsafe { libc::sched_yield() };
}

/// A pthread key whose destructor runs at thread exit with the value the thread stored.
pub fn thread_key(destructor: unsafe extern "C" fn(*mut c_void)) -> Option<libc::pthread_key_t> {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is a valid out-parameter and the destructor has the required signature.
    let rc = unsafe { libc::pthread_key_create(&mut key, Some(destructor)) };
    (rc == 0).then_some(key)
}

/// Stores the calling thread's value for `key`, arming its destructor for this thread.
pub fn set_thread_value(key: libc::pthread_key_t, value: *mut c_void) {
    // SAFETY: `key` came from pthread_key_create. For the first 32 keys glibc stores the value
    // in the thread descriptor without allocating.
    unsafe { libc::pthread_setspecific(key, value) };
}

/// Registers fork handlers.
pub fn at_fork(
    prepare: unsafe extern "C" fn(),
    parent: unsafe extern "C" fn(),
    child: unsafe extern "C" fn(),
) {
    // SAFETY: the handlers have the required signature and live as long as the process.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}
