//! The C side's raw pointers, turned into references and slices. Every function here trusts
//! what the header promises of the caller: pointers from this library's constructors, not yet
//! freed, and buffers of the lengths given.

use std::ffi::c_void;

/// `len` bytes at `p` (empty if `len` is 0, whatever `p` is).
///
/// # Safety
/// If `len > 0`, `p` points to `len` readable bytes that stay valid and unchanged for `'a`.
pub(crate) unsafe fn bytes<'a>(p: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null, and the caller promises `len` readable bytes for 'a.
    Some(unsafe { std::slice::from_raw_parts(p as *const u8, len) })
}

/// `len` writable bytes at `p`.
///
/// # Safety
/// If `len > 0`, `p` points to `len` writable bytes, not otherwise borrowed, for `'a`.
pub(crate) unsafe fn bytes_mut<'a>(p: *mut c_void, len: usize) -> Option<&'a mut [u8]> {
    if len == 0 {
        return Some(&mut []);
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null, and the caller promises `len` writable, unaliased bytes for 'a.
    Some(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) })
}

/// The object behind a handle.
///
/// # Safety
/// `p` is null or came from `into_raw` for a `T` and was not freed.
pub(crate) unsafe fn object<'a, T>(p: *const T) -> Option<&'a T> {
    // SAFETY: null is handled by `as_ref`; otherwise the caller promises a live `T`.
    unsafe { p.as_ref() }
}

/// A handle for the C side: the object moves to the heap and the caller owns it.
pub(crate) fn into_raw<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// Frees a handle (null is ignored).
///
/// # Safety
/// `p` is null or came from `into_raw` for a `T` and was not freed; it is not used after.
pub(crate) unsafe fn free<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: the caller promises `p` came from `Box::into_raw` and is freed once.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// Writes `v` to `p` if `p` is not null.
///
/// # Safety
/// `p` is null or points to a writable `T`.
pub(crate) unsafe fn put<T>(p: *mut T, v: T) {
    // SAFETY: null is skipped; otherwise the caller promises a writable `T`.
    if let Some(r) = unsafe { p.as_mut() } {
        *r = v;
    }
}

/// The user data a callback was registered with, to be passed back to it from any thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct User(pub *mut c_void);

impl User {
    /// The pointer (a method, so that closures capture the whole `User`, which is `Send`).
    pub(crate) fn ptr(&self) -> *mut c_void {
        self.0
    }
}

// SAFETY: the header requires callbacks and their user data to be callable from any thread
// (reconstruction runs in whichever thread reads); this library only passes the pointer back.
unsafe impl Send for User {}
// SAFETY: as above; the pointer is never dereferenced here.
unsafe impl Sync for User {}
