//! C++'s `operator new` and `operator delete`, every variant, straight onto the allocator.
//!
//! Without these, `new` in a C++ program goes to libstdc++'s operator, which calls `malloc`
//! through the PLT: two more indirect jumps and a dozen instructions on every allocation and
//! free (callgrind on mimalloc-bench's alloc-test: 1.25 G of 14.5 G instructions). mimalloc,
//! tcmalloc and jemalloc export these too.
//!
//! The throwing forms must throw `std::bad_alloc` when memory runs out, which Rust cannot do:
//! they then hand the request to the next definition in the process (libstdc++'s), which calls
//! `malloc` again, runs the program's new-handler and throws as C++ expects.

use core::ffi::{c_char, c_void, CStr};
use tidepool_alloc::api;

/// The next definition of `symbol` after this library's (libstdc++'s operator new).
fn next(symbol: &CStr) -> *mut c_void {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT searches the objects loaded after us.
    unsafe { libc::dlsym(libc::RTLD_NEXT, symbol.as_ptr() as *const c_char) }
}

#[cold]
fn new_failed(symbol: &CStr, n: usize) -> *mut c_void {
    let f = next(symbol);
    if f.is_null() {
        tidepool_alloc::fatal(b"operator new: out of memory, and no C++ runtime to throw");
    }
    // SAFETY: `symbol` names an `operator new(size_t)` of the same signature.
    let f: unsafe extern "C" fn(usize) -> *mut c_void = unsafe { core::mem::transmute(f) };
    // SAFETY: the C++ contract of operator new.
    unsafe { f(n) }
}

#[cold]
fn new_aligned_failed(symbol: &CStr, n: usize, align: usize) -> *mut c_void {
    let f = next(symbol);
    if f.is_null() {
        tidepool_alloc::fatal(b"operator new: out of memory, and no C++ runtime to throw");
    }
    // SAFETY: `symbol` names an `operator new(size_t, align_val_t)` of the same signature.
    let f: unsafe extern "C" fn(usize, usize) -> *mut c_void = unsafe { core::mem::transmute(f) };
    // SAFETY: the C++ contract of operator new.
    unsafe { f(n, align) }
}

#[inline(always)]
fn new(n: usize, symbol: &CStr) -> *mut c_void {
    let p = api::malloc(n);
    if p.is_null() {
        return new_failed(symbol, n);
    }
    p
}

#[inline(always)]
fn new_aligned(n: usize, align: usize, symbol: &CStr) -> *mut c_void {
    let p: *mut c_void = api::aligned_block(align, n).ptr.cast();
    if p.is_null() {
        return new_aligned_failed(symbol, n, align);
    }
    p
}

/// `operator new(size_t)`.
#[export_name = "_Znwm"]
pub extern "C" fn operator_new(n: usize) -> *mut c_void {
    new(n, c"_Znwm")
}

/// `operator new[](size_t)`.
#[export_name = "_Znam"]
pub extern "C" fn operator_new_array(n: usize) -> *mut c_void {
    new(n, c"_Znam")
}

/// `operator new(size_t, const nothrow_t&)`.
#[export_name = "_ZnwmRKSt9nothrow_t"]
pub extern "C" fn operator_new_nothrow(n: usize, _nothrow: *const c_void) -> *mut c_void {
    api::malloc(n)
}

/// `operator new[](size_t, const nothrow_t&)`.
#[export_name = "_ZnamRKSt9nothrow_t"]
pub extern "C" fn operator_new_array_nothrow(n: usize, _nothrow: *const c_void) -> *mut c_void {
    api::malloc(n)
}

/// `operator new(size_t, align_val_t)`.
#[export_name = "_ZnwmSt11align_val_t"]
pub extern "C" fn operator_new_aligned(n: usize, align: usize) -> *mut c_void {
    new_aligned(n, align, c"_ZnwmSt11align_val_t")
}

/// `operator new[](size_t, align_val_t)`.
#[export_name = "_ZnamSt11align_val_t"]
pub extern "C" fn operator_new_array_aligned(n: usize, align: usize) -> *mut c_void {
    new_aligned(n, align, c"_ZnamSt11align_val_t")
}

/// `operator new(size_t, align_val_t, const nothrow_t&)`.
#[export_name = "_ZnwmSt11align_val_tRKSt9nothrow_t"]
pub extern "C" fn operator_new_aligned_nothrow(
    n: usize,
    align: usize,
    _nothrow: *const c_void,
) -> *mut c_void {
    api::aligned_block(align, n).ptr.cast()
}

/// `operator new[](size_t, align_val_t, const nothrow_t&)`.
#[export_name = "_ZnamSt11align_val_tRKSt9nothrow_t"]
pub extern "C" fn operator_new_array_aligned_nothrow(
    n: usize,
    align: usize,
    _nothrow: *const c_void,
) -> *mut c_void {
    api::aligned_block(align, n).ptr.cast()
}

/// Every `operator delete` and `operator delete[]`: sized, aligned, nothrow or not, they all
/// free the block (sizes and alignments are known to the allocator).
macro_rules! deletes {
    ($($name:literal => $fn:ident($($arg:ident: $ty:ty),*);)*) => {$(
        /// # Safety
        /// `p` is null or a live allocation from this library (the C++ contract).
        #[export_name = $name]
        pub unsafe extern "C" fn $fn(p: *mut c_void $(, $arg: $ty)*) {
            $(let _ = $arg;)*
            // SAFETY: the C++ contract, passed on.
            unsafe { api::free(p) }
        }
    )*};
}

deletes! {
    "_ZdlPv" => operator_delete();
    "_ZdaPv" => operator_delete_array();
    "_ZdlPvm" => operator_delete_sized(size: usize);
    "_ZdaPvm" => operator_delete_array_sized(size: usize);
    "_ZdlPvRKSt9nothrow_t" => operator_delete_nothrow(nothrow: *const c_void);
    "_ZdaPvRKSt9nothrow_t" => operator_delete_array_nothrow(nothrow: *const c_void);
    "_ZdlPvSt11align_val_t" => operator_delete_aligned(align: usize);
    "_ZdaPvSt11align_val_t" => operator_delete_array_aligned(align: usize);
    "_ZdlPvmSt11align_val_t" => operator_delete_sized_aligned(size: usize, align: usize);
    "_ZdaPvmSt11align_val_t" => operator_delete_array_sized_aligned(size: usize, align: usize);
    "_ZdlPvSt11align_val_tRKSt9nothrow_t" =>
        operator_delete_aligned_nothrow(align: usize, nothrow: *const c_void);
    "_ZdaPvSt11align_val_tRKSt9nothrow_t" =>
        operator_delete_array_aligned_nothrow(align: usize, nothrow: *const c_void);
}
