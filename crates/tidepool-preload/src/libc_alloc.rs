//! The preload library's own Rust allocations go to glibc's malloc, never to the heap it pages:
//! pager threads must not touch memory the pager may evict (a fault there would wait for a
//! pager thread). glibc's functions are looked up in libc.so.6 itself: this library exports
//! `malloc`, and the next definition after it may be another allocator the program links
//! (redis-server links jemalloc), whose arenas come from the interposed mmap, so paged.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::{c_void, CStr};
use core::sync::atomic::{AtomicUsize, Ordering::*};

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type MemalignFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;

static MALLOC: AtomicUsize = AtomicUsize::new(0);
static FREE: AtomicUsize = AtomicUsize::new(0);
static MEMALIGN: AtomicUsize = AtomicUsize::new(0);
static REALLOC: AtomicUsize = AtomicUsize::new(0);

fn lookup(slot: &AtomicUsize, name: &CStr) -> usize {
    let f = slot.load(Relaxed);
    if f != 0 {
        return f;
    }
    // SAFETY: dlopen of the C library the process already has (RTLD_NOLOAD: nothing is loaded
    // or initialised), then dlsym in it alone with a NUL-terminated name.
    let f = unsafe {
        let libc_so = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if libc_so.is_null() {
            0
        } else {
            libc::dlsym(libc_so, name.as_ptr()) as usize
        }
    };
    if f == 0 {
        let msg = b"tidepool run: glibc's malloc not found; tidepool run needs a glibc system\n";
        // SAFETY: writing a static buffer to standard error, then aborting.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::abort();
        }
    }
    slot.store(f, Relaxed);
    f
}

/// Finds all four of glibc's functions now. The preload's constructor calls it before any
/// pager thread exists: looking one up later, from a pager thread, would run `dlopen`, which
/// walks the loader's list of libraries, and the entries of libraries the program opened were
/// allocated by the program's malloc, so may be paged out, and the pager would wait on itself
/// holding the loader's lock.
pub fn resolve() {
    lookup(&MALLOC, c"malloc");
    lookup(&FREE, c"free");
    lookup(&MEMALIGN, c"memalign");
    lookup(&REALLOC, c"realloc");
}

/// glibc's allocator, as Rust's global allocator for this library.
#[derive(Debug)]
pub struct LibcAlloc;

// SAFETY: glibc's malloc family returns memory of at least the requested size, aligned as
// asked through memalign, and takes back exactly what it returned.
unsafe impl GlobalAlloc for LibcAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let f = if layout.align() <= 16 {
            // SAFETY: the address is glibc's malloc, found by name.
            let m: MallocFn = unsafe { core::mem::transmute(lookup(&MALLOC, c"malloc")) };
            // SAFETY: C's malloc contract.
            unsafe { m(layout.size()) }
        } else {
            // SAFETY: the address is glibc's memalign, found by name.
            let m: MemalignFn = unsafe { core::mem::transmute(lookup(&MEMALIGN, c"memalign")) };
            // SAFETY: glibc's memalign contract.
            unsafe { m(layout.align(), layout.size()) }
        };
        f.cast()
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: the address is glibc's free, found by name.
        let f: FreeFn = unsafe { core::mem::transmute(lookup(&FREE, c"free")) };
        // SAFETY: `ptr` came from glibc's malloc or memalign above.
        unsafe { f(ptr.cast()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() > 16 {
            // SAFETY: GlobalAlloc's contract, passed on to the default copy-based realloc.
            let new =
                unsafe { self.alloc(Layout::from_size_align_unchecked(new_size, layout.align())) };
            if !new.is_null() {
                // SAFETY: both blocks are valid for the smaller size and do not overlap.
                unsafe {
                    core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
            }
            return new;
        }
        // SAFETY: the address is glibc's realloc, found by name.
        let f: ReallocFn = unsafe { core::mem::transmute(lookup(&REALLOC, c"realloc")) };
        // SAFETY: `ptr` came from glibc's malloc.
        unsafe { f(ptr.cast(), new_size).cast() }
    }
}
