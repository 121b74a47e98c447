//! `libtidepool_malloc.so`: tidepool-alloc as the whole C malloc family.
//!
//! ```text
//! LD_PRELOAD=target/release/libtidepool_malloc.so python3 script.py
//! TIDEPOOL_ALLOC_STATS=1 LD_PRELOAD=... ./program     # per-class statistics at exit
//! ```
//!
//! Exports malloc, free, calloc, realloc, reallocarray, posix_memalign, aligned_alloc, memalign,
//! valloc, pvalloc, malloc_usable_size, free_sized, free_aligned_sized, malloc_trim, glibc's
//! `__libc_*` aliases (which some programs and glibc's own hooks call directly), and C++'s
//! `operator new` and `operator delete` in every form ([`cxx`]). Every export is a
//! thin shell over [`tidepool_alloc::api`]; the per-thread table lives in the crate's C shim.
//!
//! The allocator initialises itself on the first call, whoever makes it (a constructor of
//! another library included), and again nothing here allocates, so it is safe however early
//! it is called.
//!
//! Built in the workspace's `malloc` profile (`cargo build --profile malloc -p tidepool-malloc`,
//! which is `release` with `panic = "abort"`), the library is `no_std`: its panic handler
//! aborts, and neither std's panic and backtrace code (300 KiB of text) nor libgcc_s is loaded
//! into the program. Most of that text would be mapped in by the kernel's fault-around next to
//! the code that runs, which cost every process about 0.3 MiB of RSS. Built in any other
//! profile (unwinding panics need std), it is an ordinary std library, which is what
//! `tidepool-preload` links and what the tests' own builds of this crate are.

#![cfg_attr(panic = "abort", no_std)]

use core::ffi::c_void;
use tidepool_alloc::api;

pub mod cxx;

/// # Safety
/// C's malloc contract.
#[no_mangle]
pub unsafe extern "C" fn malloc(n: usize) -> *mut c_void {
    api::malloc(n)
}

/// # Safety
/// `p` is null or a live allocation from this library.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    // SAFETY: the C contract, passed on.
    unsafe { api::free(p) }
}

/// # Safety
/// C's calloc contract.
#[no_mangle]
pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    api::calloc(count, size)
}

/// # Safety
/// `p` is null or a live allocation from this library.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, n: usize) -> *mut c_void {
    // SAFETY: the C contract, passed on.
    unsafe { api::realloc(p, n) }
}

/// # Safety
/// `p` is null or a live allocation from this library.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, count: usize, size: usize) -> *mut c_void {
    // SAFETY: the C contract, passed on.
    unsafe { api::reallocarray(p, count, size) }
}

/// # Safety
/// `out` is valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, n: usize) -> i32 {
    // SAFETY: the C contract, passed on.
    unsafe { api::posix_memalign(out, align, n) }
}

/// # Safety
/// C's aligned_alloc contract.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, n: usize) -> *mut c_void {
    api::aligned_alloc(align, n)
}

/// # Safety
/// glibc's memalign contract.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, n: usize) -> *mut c_void {
    api::memalign(align, n)
}

/// # Safety
/// glibc's valloc contract.
#[no_mangle]
pub unsafe extern "C" fn valloc(n: usize) -> *mut c_void {
    api::valloc(n)
}

/// # Safety
/// glibc's pvalloc contract.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(n: usize) -> *mut c_void {
    api::pvalloc(n)
}

/// # Safety
/// `p` is null or a live allocation from this library.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    // SAFETY: the C contract, passed on.
    unsafe { api::usable_size(p) }
}

/// # Safety
/// `p` is null or a live allocation from this library (C23).
#[no_mangle]
pub unsafe extern "C" fn free_sized(p: *mut c_void, _size: usize) {
    // SAFETY: the C contract, passed on.
    unsafe { api::free(p) }
}

/// # Safety
/// `p` is null or a live allocation from this library (C23).
#[no_mangle]
pub unsafe extern "C" fn free_aligned_sized(p: *mut c_void, _align: usize, _size: usize) {
    // SAFETY: the C contract, passed on.
    unsafe { api::free(p) }
}

/// # Safety
/// None beyond glibc's.
#[no_mangle]
pub unsafe extern "C" fn malloc_trim(_pad: usize) -> i32 {
    api::trim()
}

/// # Safety
/// As `malloc`.
#[no_mangle]
pub unsafe extern "C" fn __libc_malloc(n: usize) -> *mut c_void {
    api::malloc(n)
}

/// # Safety
/// As `free`.
#[no_mangle]
pub unsafe extern "C" fn __libc_free(p: *mut c_void) {
    // SAFETY: the C contract, passed on.
    unsafe { api::free(p) }
}

/// # Safety
/// As `calloc`.
#[no_mangle]
pub unsafe extern "C" fn __libc_calloc(count: usize, size: usize) -> *mut c_void {
    api::calloc(count, size)
}

/// # Safety
/// As `realloc`.
#[no_mangle]
pub unsafe extern "C" fn __libc_realloc(p: *mut c_void, n: usize) -> *mut c_void {
    // SAFETY: the C contract, passed on.
    unsafe { api::realloc(p, n) }
}

/// # Safety
/// As `memalign`.
#[no_mangle]
pub unsafe extern "C" fn __libc_memalign(align: usize, n: usize) -> *mut c_void {
    api::memalign(align, n)
}

/// # Safety
/// As `valloc`.
#[no_mangle]
pub unsafe extern "C" fn __libc_valloc(n: usize) -> *mut c_void {
    api::valloc(n)
}

/// # Safety
/// As `pvalloc`.
#[no_mangle]
pub unsafe extern "C" fn __libc_pvalloc(n: usize) -> *mut c_void {
    api::pvalloc(n)
}

/// # Safety
/// As `posix_memalign`.
#[no_mangle]
pub unsafe extern "C" fn __posix_memalign(out: *mut *mut c_void, align: usize, n: usize) -> i32 {
    // SAFETY: the C contract, passed on.
    unsafe { api::posix_memalign(out, align, n) }
}

/// Runs at unload (normal exit): the statistics report when `TIDEPOOL_ALLOC_STATS` is set.
extern "C" fn report_at_exit() {
    if tidepool_alloc::stats_requested() {
        tidepool_alloc::print_stats();
    }
}

/// Initialises before ordinary constructors (101 is the first priority not reserved for the C
/// implementation); the allocator would also initialise itself on first use.
extern "C" fn initialise_early() {
    // SAFETY: a zero-byte malloc and its free; this reserves the region and reads the
    // environment while the process is still single-threaded.
    unsafe { free(malloc(0)) };
}

#[used]
#[link_section = ".init_array.00101"]
static INIT: extern "C" fn() = initialise_early;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = report_at_exit;

/// Under `panic = "abort"` (the `malloc` profile) there is no std to handle a panic. None is
/// expected (nothing on an allocation path panics); if one happens, say so and abort.
#[cfg(panic = "abort")]
#[panic_handler]
fn on_panic(info: &core::panic::PanicInfo) -> ! {
    match info.location() {
        Some(at) => tidepool_alloc::fatal_at(b"internal error (a panic)", at.file(), at.line()),
        None => tidepool_alloc::fatal(b"internal error (a panic)"),
    }
}

/// Nothing unwinds here, but `core` is precompiled with unwinding and its unwind tables name
/// this personality routine, which std would have defined; without it the dynamic linker
/// refuses the library. It is never called.
#[cfg(panic = "abort")]
#[no_mangle]
extern "C" fn rust_eh_personality() {}

// Without std nothing asks for libc by name; ask, so the library records it as NEEDED and its
// symbols bind to libc's versions.
#[cfg(panic = "abort")]
#[link(name = "c")]
extern "C" {}
